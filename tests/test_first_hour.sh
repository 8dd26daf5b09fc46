#!/usr/bin/env bash
# What a new user meets in the first hour (docs/design.md, invariants 2 and 3):
#   - a fresh run never overwrites an earlier run's metrics (exit 2, both fixes
#     named); a run that resumes from its checkpoint continues them;
#   - the quickstart, interrupted with Ctrl-C (SIGINT), saves, and run again
#     resumes and ends with every step recorded once;
#   - `trident run` exits 2 on bad input with only trident's message, and 1
#     on a runtime failure (a rank's error, a rank killed);
#   - a bad value in a YAML file is reported at its file:line:column;
#   - prepare-data takes directories with --ext and quoted patterns, warns
#     about an empty validation split, and finds the GPT-2 files from any
#     directory.
set -uo pipefail
: "${TRIDENT:?TRIDENT must point at the built binary}"
cd "${TRIDENT_SOURCE_ROOT:-.}"
TRIDENT=$(realpath "$TRIDENT")
[ -f data/brown/gpt2.idx ] || { echo "FAIL: data/brown missing: run scripts/get_corpus.sh"; exit 1; }
tmp=$(mktemp -d)
qs_pid=
trap '[ -n "$qs_pid" ] && kill -9 "$qs_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0 checks=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
check() { checks=$((checks + 1)); }

small=(--set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set data.val_sequences=8 --set run.log_every=1)

# 1. No run overwritten.
check
"$TRIDENT" train configs/tiny.yaml "${small[@]}" --set training.steps=3 --set run.dir="$tmp/a" \
    --set checkpoint.dir= > "$tmp/a1.log" 2>&1 || fail "first run into $tmp/a exited $?"
before=$(md5sum < "$tmp/a/metrics.jsonl")
"$TRIDENT" train configs/tiny.yaml "${small[@]}" --set training.steps=3 --set run.dir="$tmp/a" \
    --set checkpoint.dir= > "$tmp/a2.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "a fresh run into a used run.dir exited $rc, want 2"
grep -q "holds the metrics of an earlier run" "$tmp/a2.log" && grep -q -- "--set run.dir=" "$tmp/a2.log" &&
    grep -q -- "--set checkpoint.resume=" "$tmp/a2.log" ||
    fail "the refusal does not say why and how: $(cat "$tmp/a2.log")"
[ "$(md5sum < "$tmp/a/metrics.jsonl")" = "$before" ] || fail "the earlier run's metrics changed"

# ... unless Slurm requeued the same job before its first checkpoint: then
# the run starts over and the earlier attempt's metrics are kept beside.
check
SLURM_RESTART_COUNT=1 "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set training.steps=3 \
    --set run.dir="$tmp/a" --set checkpoint.dir= > "$tmp/a3.log" 2>&1 || fail "a Slurm restart exited $?"
[ "$(md5sum < "$tmp/a/metrics.jsonl.restart-1")" = "$before" ] ||
    fail "the requeued run did not keep the earlier attempt's metrics: $(ls "$tmp/a")"
grep -q "Slurm restart 1" "$tmp/a3.log" || fail "the requeued run does not say what it did"

# ... while a run that resumes from its checkpoint (checkpoint.dir auto =
# <run.dir>/ckpt) continues them: steps 1..6, each once.
check
"$TRIDENT" train configs/tiny.yaml "${small[@]}" --set training.steps=4 --set run.dir="$tmp/b" \
    --set checkpoint.every=2 > "$tmp/b1.log" 2>&1 || fail "run b exited $?"
[ -f "$tmp/b/ckpt/latest" ] || fail "checkpoint.dir auto did not write $tmp/b/ckpt"
"$TRIDENT" train configs/tiny.yaml "${small[@]}" --set training.steps=6 --set run.dir="$tmp/b" \
    --set checkpoint.every=2 > "$tmp/b2.log" 2>&1 || fail "the resumed run b exited $?"
grep -q "resumed from" "$tmp/b2.log" || fail "run b did not resume: $(tail -3 "$tmp/b2.log")"
steps=$(python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$tmp/b/metrics.jsonl")
[ "$steps" = "1 2 3 4 5 6" ] || fail "resumed metrics steps: $steps"

# 2. The quickstart, interrupted and run again.
check
scripts/quickstart.sh "${small[@]}" --set training.steps=200 --set checkpoint.every=1000 \
    --set run.dir="$tmp/qs" > "$tmp/qs1.log" 2>&1 &
qs_pid=$!
for _ in $(seq 600); do
    grep -q "^step  *8/200" "$tmp/qs1.log" && break
    kill -0 "$qs_pid" 2>/dev/null || break
    sleep 0.2
done
kill -INT "$qs_pid" 2>/dev/null
wait "$qs_pid"
rc=$?
qs_pid=
[ "$rc" -eq 75 ] || fail "the interrupted quickstart exited $rc, want 75 (saved and stopped)"
grep -q "checkpoint saved" "$tmp/qs1.log" || fail "no checkpoint on Ctrl-C: $(tail -3 "$tmp/qs1.log")"
grep -q "elapsed, eta" "$tmp/qs1.log" || fail "the step line has no elapsed time and ETA"
grep -q "^quickstart: 4/4 training configs/tiny.yaml (metrics in $tmp/qs/metrics.jsonl)" "$tmp/qs1.log" ||
    fail "the quickstart shows no progress of its phases, or not its run.dir"
grep -q "^build: " "$tmp/qs1.log" || fail "the quickstart's build step says nothing"
grep -q "^output: $tmp/qs/metrics.jsonl.* | checkpoints: $tmp/qs/ckpt every 1000 steps" "$tmp/qs1.log" ||
    fail "the run does not say where its metrics and checkpoints go"
stopped=$(sed -n 's/.*stopped after step \([0-9]*\).*/\1/p' "$tmp/qs1.log")
scripts/quickstart.sh "${small[@]}" --set training.steps=200 --set checkpoint.every=1000 \
    --set run.dir="$tmp/qs" > "$tmp/qs2.log" 2>&1 || fail "the second quickstart exited $?"
grep -q "resumed from .*step $stopped" "$tmp/qs2.log" ||
    fail "the second quickstart did not resume at step '$stopped': $(grep -m3 -i 'resum\|step ' "$tmp/qs2.log")"
n=$(python3 -c 'import json,sys; s=[json.loads(l)["step"] for l in open(sys.argv[1])]; print(len(s) if s == list(range(1, 201)) else -1)' "$tmp/qs/metrics.jsonl")
[ "$n" = 200 ] || fail "the quickstart's metrics are not steps 1..200 once each"
echo "quickstart: stopped after step $stopped, resumed, 200 steps recorded"

# A quickstart whose earlier run saved no checkpoint moves that run aside
# (its own run.dir, not runs/tiny) instead of being refused.
check
mkdir -p "$tmp/qs0" && echo '{"step": 1}' > "$tmp/qs0/metrics.jsonl"
scripts/quickstart.sh "${small[@]}" --set training.steps=2 --set run.dir="$tmp/qs0" > "$tmp/qs0.log" 2>&1 ||
    fail "the quickstart after a run without checkpoint exited $?: $(tail -3 "$tmp/qs0.log")"
[ "$(cat "$tmp/qs0.1/metrics.jsonl" 2>/dev/null)" = '{"step": 1}' ] && grep -q "moved it to $tmp/qs0.1" "$tmp/qs0.log" ||
    fail "the earlier run was not moved to $tmp/qs0.1: $(ls "$tmp")"

# 3. trident run: exit 2 and trident's message only.
expect2() { # what, want_substring, cmd...
    local what=$1 want=$2 out rc; shift 2
    check
    out=$("$@" 2>&1); rc=$?
    [ "$rc" -eq 2 ] || fail "$what: exit $rc, want 2: $out"
    grep -qF -- "$want" <<<"$out" || fail "$what: no '$want' in: $out"
    ! grep -q "internal_Finalize\|BAD TERMINATION\|Attempting to use an MPI routine" <<<"$out" ||
        fail "$what: MPI noise after trident's message: $out"
}
expect2 "run, bad value" "--set training.lr=-1: training.lr (-1) must be > 0" \
    "$TRIDENT" run configs/tiny.yaml -n 2 --set training.lr=-1
expect2 "run, world mismatch" "launch 2 ranks" \
    "$TRIDENT" run configs/tiny.yaml -n 3 --set topology.dp=2
expect2 "run, missing data" "nodata.idx" \
    "$TRIDENT" run configs/tiny.yaml -n 2 --set data.path="$tmp/nodata" --set run.dir="$tmp/r"

# ... and exit 1 for a runtime failure, whatever the launcher returns: a
# run stopped by a non-finite loss (the ranks exit 1), and a rank killed by
# SIGKILL (MPICH's mpiexec returns 9).
check
"$TRIDENT" run configs/tiny.yaml -n 2 "${small[@]}" --set training.lr=1e6 --set training.steps=20 \
    --set checkpoint.dir= --set data.val_every=0 --set run.dir="$tmp/nan" > "$tmp/nan.log" 2>&1
rc=$?
[ "$rc" -eq 1 ] && grep -q "not finite" "$tmp/nan.log" || fail "run, non-finite loss: exit $rc, want 1: $(tail -2 "$tmp/nan.log")"
check
"$TRIDENT" run configs/tiny.yaml -n 2 "${small[@]}" --set training.steps=100000 --set checkpoint.dir= \
    --set data.val_every=0 --set run.dir="$tmp/kill" > "$tmp/kill.log" 2>&1 &
run_pid=$!
for _ in $(seq 600); do grep -q "^step " "$tmp/kill.log" && break; sleep 0.2; done
victim=$(pgrep -f "^[^ ]*trident train configs/tiny.yaml .*run.dir=$tmp/kill" | tail -1)
[ -n "$victim" ] && kill -9 "$victim"
timeout 60 tail --pid="$run_pid" -f /dev/null ||
    { fail "run, a rank killed: the job did not end"; pkill -9 -f "run.dir=$tmp/kill"; }
wait "$run_pid"
rc=$?
[ "$rc" -eq 1 ] && grep -q "mpiexec exited with status" "$tmp/kill.log" ||
    fail "run, a rank killed: exit $rc, want 1: $(tail -2 "$tmp/kill.log")"

# 4. A value error in a file names its place.
sed 's/^  lr: 1.0e-3/  lr: -1/' configs/tiny.yaml > "$tmp/bad_lr.yaml"
line=$(grep -n '^  lr: -1' "$tmp/bad_lr.yaml" | cut -d: -f1)
expect2 "yaml value" "$tmp/bad_lr.yaml:$line:7: training.lr (-1) must be > 0" \
    "$TRIDENT" train "$tmp/bad_lr.yaml"

# 5. prepare-data: directories with --ext, quoted patterns, an empty split.
check
mkdir -p "$tmp/corpus/sub" "$tmp/elsewhere"
cp data/brown/txt/ca01 "$tmp/corpus/a.txt"; cp data/brown/txt/ca02 "$tmp/corpus/sub/b.txt"
cp data/brown/txt/ca03 "$tmp/corpus/notes.md"
(cd "$tmp/elsewhere" && "$TRIDENT" prepare-data --input "$tmp/corpus" --ext txt --tokenizer gpt2 \
    --out "$tmp/dir" --val-every 5) > "$tmp/p1.log" 2>&1 || fail "prepare-data of a directory: $(cat "$tmp/p1.log")"
grep -q "read 2 files" "$tmp/p1.log" || fail "--input DIR --ext txt did not take exactly the 2 .txt files: $(cat "$tmp/p1.log")"
grep -q "warning: the validation split .* is empty" "$tmp/p1.log" || fail "no warning for an empty validation split"
"$TRIDENT" prepare-data --input "$tmp/corpus/*.md" --tokenizer gpt2 --out "$tmp/glob" > "$tmp/p2.log" 2>&1 &&
    grep -q "read 1 files" "$tmp/p2.log" || fail "a quoted pattern: $(cat "$tmp/p2.log")"
check
"$TRIDENT" prepare-data --input "$tmp/corpus" --ext rst --tokenizer byte --out "$tmp/none" > "$tmp/p3.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "no file with extension rst" "$tmp/p3.log" || fail "--ext that matches nothing: exit $rc: $(cat "$tmp/p3.log")"

echo "first_hour: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
