#!/usr/bin/env bash
# The binary's contract on bad input: one clear message, exit code 2, nothing
# written.  And on good input with --help: exit 0.
set -uo pipefail
: "${TRIDENT:?TRIDENT must point at the built binary}"
cd "${TRIDENT_SOURCE_ROOT:-.}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 checks=0

expect() { # want_rc, want_substring, cmd...
    local want_rc=$1 want=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    checks=$((checks + 1))
    if [ "$rc" -ne "$want_rc" ] || ! grep -qF -- "$want" <<<"$out"; then
        fails=$((fails + 1))
        echo "FAIL: $* -> exit $rc (want $want_rc), output:"; echo "$out" | head -5
        echo "      expected to contain: $want"
    fi
}

expect 0 "usage: trident COMMAND" "$TRIDENT" --help
expect 2 "unknown command 'trian'" "$TRIDENT" trian
expect 0 "--set key.path=value" "$TRIDENT" train --help
expect 0 "--input" "$TRIDENT" prepare-data --help
expect 2 "missing CONFIG" "$TRIDENT" train

# --help on every command and sub-form: usage on stdout, exit 0, nothing run.
for cmd in train run prepare-data tokenize data "data inspect" ckpt "ckpt inspect" \
    "ckpt verify" "ckpt export" "ckpt import" topology plan eval generate report; do
    # shellcheck disable=SC2086  # the sub-form is its own word
    expect 0 "usage: trident ${cmd%% *}" "$TRIDENT" $cmd --help
done
for form in inspect verify export import; do
    expect 0 "usage: trident ckpt $form" "$TRIDENT" ckpt "$form" --help
    expect 0 "usage: trident ckpt $form" "$TRIDENT" ckpt "$form" -h
    expect 0 "usage: trident ckpt $form" "$TRIDENT" ckpt "$form" "$tmp/nowhere" --help
    # Only its own usage, no error after it.
    out=$("$TRIDENT" ckpt "$form" --help 2>&1)
    checks=$((checks + 1))
    if grep -q "error" <<<"$out"; then
        fails=$((fails + 1)); echo "FAIL: ckpt $form --help printed an error"
    fi
done
# Errors name the command's own arguments, not training keys.
expect 2 "ckpt inspect: the checkpoint (DIR) is required" "$TRIDENT" ckpt inspect
expect 2 "ckpt verify: the checkpoint (DIR) is required" "$TRIDENT" ckpt verify
expect 2 "ckpt inspect: DIR $tmp/nowhere: no such checkpoint directory" \
    "$TRIDENT" ckpt inspect "$tmp/nowhere"
expect 2 "ckpt verify: DIR $tmp/nowhere: no such checkpoint directory" \
    "$TRIDENT" ckpt verify "$tmp/nowhere"
expect 2 "ckpt export: DIR $tmp/nowhere: no such checkpoint directory" \
    "$TRIDENT" ckpt export "$tmp/nowhere" --out "$tmp/x.h5"
expect 2 "ckpt inspect: unknown or extra argument '--bogus'" "$TRIDENT" ckpt inspect "$tmp" --bogus
expect 2 "ckpt: unknown sub-form 'inpsect'" "$TRIDENT" ckpt inpsect "$tmp"
expect 2 "ckpt: a sub-form is required" "$TRIDENT" ckpt
for form in inspect verify export; do
    out=$("$TRIDENT" ckpt "$form" "$tmp/nowhere" 2>&1)
    checks=$((checks + 1))
    if grep -q "checkpoint\.resume\|checkpoint\.init_from" <<<"$out"; then
        fails=$((fails + 1)); echo "FAIL: ckpt $form names a training key: $out"
    fi
done
# Help lists every exit code and every sub-form.
for cmd in train run prepare-data tokenize data topology plan eval generate report ckpt; do
    expect 0 "Exit codes: 0" "$TRIDENT" "$cmd" --help
done
for code in "0 success" "2 bad input" "1 runtime" "75 stopped"; do
    expect 0 "$code" "$TRIDENT" --help
    expect 0 "$code" "$TRIDENT" train --help
    expect 0 "$code" "$TRIDENT" run --help
done
for form in inspect verify export import; do
    expect 0 "trident ckpt $form" "$TRIDENT" ckpt --help
    expect 0 "$form" "$TRIDENT" --help
done

cat > "$tmp/bad_key.yaml" <<'Y'
model:
  layers: 2
  hiden: 64
Y
expect 2 "$tmp/bad_key.yaml:3:3" "$TRIDENT" train "$tmp/bad_key.yaml"
expect 2 "hiden" "$TRIDENT" train "$tmp/bad_key.yaml"

# backend: cuda in a build without the CUDA backend: refused before anything runs.
if [ "${TRIDENT_BUILD_CUDA:-0}" = 0 ]; then
    expect 2 "built without the CUDA backend" "$TRIDENT" train configs/tiny.yaml \
        --set backend=cuda --set run.dir="$tmp/cuda_run"
    [ ! -e "$tmp/cuda_run" ] || { echo "FAIL: the refused cuda run wrote $tmp/cuda_run"; fails=$((fails + 1)); }
fi

printf 'model:\n  layers: [1\n' > "$tmp/broken.yaml"
expect 2 "$tmp/broken.yaml:" "$TRIDENT" train "$tmp/broken.yaml"
expect 2 "No such file" "$TRIDENT" train "$tmp/missing.yaml"

# A valid config, broken by --set values.
sed "s#runs/tiny#$tmp/run#" configs/tiny.yaml > "$tmp/ok.yaml"
expect 2 "training.steps" "$TRIDENT" train "$tmp/ok.yaml" --set training.steps=abc
expect 2 "model.arch" "$TRIDENT" train "$tmp/ok.yaml" --set model.arch=bert
expect 2 "model.nope" "$TRIDENT" train "$tmp/ok.yaml" --set model.nope=1
expect 2 "model.heads" "$TRIDENT" train "$tmp/ok.yaml" --set model.heads=5
expect 2 "global_batch" "$TRIDENT" train "$tmp/ok.yaml" --set training.global_batch=7 --set training.micro_batch=2
# Data that is not there: bad input, exit 2, with the hint.
expect 2 "prepare-data" "$TRIDENT" train "$tmp/ok.yaml" --set data.path="$tmp/nodata"
[ ! -e "$tmp/run" ] || { echo "FAIL: a failed start wrote $tmp/run"; fails=$((fails + 1)); }
checks=$((checks + 1))
# A layout trident refuses: a clear message, exit 2, on every rank.
expect 2 "ZeRO-3 re-gathers" mpiexec -n 2 "$TRIDENT" train "$tmp/ok.yaml" --set topology.pp=2 --set topology.zero=3 --set topology.dp=1

# The GPU template runs the CUDA build (build-cuda/trident) unless TRIDENT
# says otherwise; the CPU template runs build/.  (No Slurm needed: the
# binary check comes first.)
mkdir -p "$tmp/home" && ln -s "$PWD/slurm" "$tmp/home/slurm"
expect 2 "no trident binary at $tmp/home/build-cuda/trident" \
    env -u TRIDENT SLURM_JOB_ID=1 TRIDENT_HOME="$tmp/home" bash slurm/train_gpu.sbatch configs/tiny.yaml
expect 2 "no trident binary at $tmp/home/build/trident" \
    env -u TRIDENT SLURM_JOB_ID=1 TRIDENT_HOME="$tmp/home" bash slurm/train_cpu.sbatch configs/tiny.yaml
expect 2 "no trident binary at $tmp/elsewhere" \
    env TRIDENT="$tmp/elsewhere" SLURM_JOB_ID=1 TRIDENT_HOME="$tmp/home" bash slurm/train_gpu.sbatch configs/tiny.yaml

# Statements in the docs, not only commands: the ckpt synopses quoted in
# docs/checkpoint.md are the help's, and the error texts quoted in
# docs/tensor_parallel.md are what the program prints.
help=$("$TRIDENT" ckpt --help | tr '\n' ' ' | tr -s ' ')
while IFS= read -r line; do
    line=$(sed 's/ *#.*//' <<<"$line" | tr -s ' ')
    checks=$((checks + 1))
    grep -qF -- "$line" <<<"$help" ||
        { fails=$((fails + 1)); echo "FAIL: docs/checkpoint.md quotes '$line', not in trident ckpt --help"; }
done < <(grep '^trident ckpt ' docs/checkpoint.md)
tp_quote() { # the backquoted message of docs/tensor_parallel.md that starts with $1
    grep -o "\`$1[^\`]*\`" docs/tensor_parallel.md | head -1 | tr -d '`'
}
for q in "model.heads (4) must|--world 3 --set topology.tp=3" \
    "model.kv_heads (6) and|--world 4 --set topology.tp=4 --set model.arch=llama --set model.heads=12 --set model.hidden=384 --set model.kv_heads=6" \
    "model.ffn_hidden (500)|--world 8 --set topology.tp=8 --set model.heads=8 --set model.ffn_hidden=500" \
    "model.seq_len (20)|--world 8 --set topology.tp=8 --set model.heads=8 --set model.seq_len=20 --set topology.sequence_parallel=true" \
    "topology.tp 8 does not fit|--world 8 --ranks-per-node 4 --set topology.tp=8 --set model.heads=8"; do
    msg=$(tp_quote "${q%%|*}")
    [ -n "$msg" ] || { fails=$((fails + 1)); echo "FAIL: docs/tensor_parallel.md no longer quotes '${q%%|*}'"; continue; }
    # shellcheck disable=SC2086  # the options are words
    expect 2 "$msg" "$TRIDENT" topology configs/tiny.yaml ${q#*|}
done

# README's config walk-through quotes its error texts in a `text expect`
# block after the commands that print them: the docs test compares them.

echo "cli: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
