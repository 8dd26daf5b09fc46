#!/usr/bin/env bash
# Context parallelism (topology.cp, docs/context_parallel.md): every
# sequence of 1024 tokens is cut into 2cp chunks over the cp ranks.  Every
# layout trains the same curve as one rank (fp32, per-step loss within
# relative 1e-5): cp 2 and 4 alone, cp 2 x tp 2 with sequence parallelism,
# cp 2 x pp 2, cp 2 x dp 2 with ZeRO 1 and 3 (GPT-2); Llama with GQA and
# packed documents at cp 4 and cp 2 x tp 2.  A checkpoint saved at cp 2
# resumes at cp 1 and one saved at cp 1 resumes at cp 2, the curve going on.
# eval and generate are cp-free: from the cp 2 run's checkpoint they give
# what they give from the 1-rank run's (eval also on cp 2 itself).
# A seq_len the chunks do not divide is refused at the key, exit 2.
# The Brown texts in bytes (vocab 257): at 1024 tokens a sequence, GPT-2's
# vocabulary would make the classifier 99 % of the test's time.
. "$(dirname "$0")/e2e.sh"

byte_data

small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=64 --set model.heads=4
       --set model.vocab=257 --set model.seq_len=1024 --set training.steps=4
       --set training.warmup_steps=2 --set training.lr=1e-3 --set training.global_batch=2
       --set training.micro_batch=1 --set data.path="$out/bytes" --set data.val_path=
       --set run.log_every=100)
compare() { curves "$1" "$2" --steps 4 --norm-rtol 1e-4; } # reference, name

RUN_CKPT=1 run gpt2 1 --set checkpoint.every=2
RUN_CKPT=1 run gpt2_cp2 2 --set topology.cp=2 --set checkpoint.every=2
compare gpt2 gpt2_cp2
run gpt2_cp4 4 --set topology.cp=4
compare gpt2 gpt2_cp4
run gpt2_cp2_tp2_sp 4 --set topology.cp=2 --set topology.tp=2 --set topology.sequence_parallel=true
compare gpt2 gpt2_cp2_tp2_sp
run gpt2_cp2_pp2 4 --set topology.cp=2 --set topology.pp=2
compare gpt2 gpt2_cp2_pp2
run gpt2_cp2_dp2_zero1 4 --set topology.cp=2 --set topology.dp=2 --set topology.zero=1
compare gpt2 gpt2_cp2_dp2_zero1
run gpt2_cp2_dp2_zero3 4 --set topology.cp=2 --set topology.dp=2 --set topology.zero=3
compare gpt2 gpt2_cp2_dp2_zero3

# Resumes across cp: step 2 of the cp 2 run on 1 rank, step 2 of the 1-rank
# run on cp 2; both go on as the 1-rank run did.
resume() { # name ranks from_run [--set ...]
    local name=$1 n=$2 from=$3; shift 3
    cp -r "$out/$from/ckpt" "$out/$name.ckpt"
    rm -rf "$out/$name.ckpt"/step_00000004
    echo step_00000002 > "$out/$name.ckpt/latest"
    run "$name" "$n" --set checkpoint.dir="$out/$name.ckpt" "$@"
    grep -q "resumed from .*step_00000002" "$out/$name.log" \
        || { echo "FAIL: $name did not resume"; fails=$((fails + 1)); }
    curves gpt2 "$name" --from 3 --to 4
}
resume resume_cp2_on_1 1 gpt2_cp2
resume resume_1_on_cp2 2 gpt2 --set topology.cp=2

# eval (mean loss of 8 validation sequences) and greedy generation from
# step 4 of the 1-rank and the cp 2 runs: the same numbers and tokens.
ev() { # name ranks ckpt [--set ...]
    local name=$1 n=$2 ck=$3; shift 3
    timeout 300 mpiexec -n "$n" "$TRIDENT" eval "$ck" --data "$out/bytes" --sequences 8 \
        --micro-batch 1 "$@" > "$out/$name.eval" 2>&1 ||
        { echo "FAIL: eval $name: $(tail -2 "$out/$name.eval")"; fails=$((fails + 1)); }
}
ev ev_1 1 "$out/gpt2/ckpt"
ev ev_cp2 1 "$out/gpt2_cp2/ckpt"
ev ev_cp2_on_cp2 2 "$out/gpt2_cp2/ckpt" --set topology.cp=2
for name in gpt2 gpt2_cp2; do
    timeout 300 "$TRIDENT" generate "$out/$name/ckpt" --prompt "The jury said" --greedy --ids \
        --max-new-tokens 16 > "$out/$name.gen" 2> "$out/$name.gen.log" ||
        { echo "FAIL: generate $name: $(tail -2 "$out/$name.gen.log")"; fails=$((fails + 1)); }
done
python3 - "$out" <<'PY' || fails=$((fails + 1))
import re, sys
out = sys.argv[1]
def loss(name):
    m = re.search(r"loss ([0-9.]+)", open(f"{out}/{name}.eval").read())
    return float(m.group(1)) if m else None
a, b, c = loss("ev_1"), loss("ev_cp2"), loss("ev_cp2_on_cp2")
g1, g2 = (open(f"{out}/{n}.gen").read().strip() for n in ("gpt2", "gpt2_cp2"))
ok = None not in (a, b, c) and abs(a - b) <= 1e-5 * a and abs(a - c) <= 1e-5 * a
ok = ok and g1 != "" and g1 == g2
print(f"{'ok  ' if ok else 'FAIL'} eval from the cp 2 checkpoint {b} (on cp 2: {c}) vs {a} "
      f"from the 1-rank one; greedy tokens {'equal' if g1 == g2 else 'differ'}: {g2}")
sys.exit(0 if ok else 1)
PY

llama=(--set model.arch=llama --set model.kv_heads=2 --set data.document_mask=true
       --set data.eot=256)
run llama 1 "${llama[@]}"
run llama_cp4 4 "${llama[@]}" --set topology.cp=4
compare llama llama_cp4
run llama_cp2_tp2_sp 4 "${llama[@]}" --set topology.cp=2 --set topology.tp=2 \
    --set topology.sequence_parallel=true
compare llama llama_cp2_tp2_sp

# The layout rule, at the key of a config file.
sed 's/^topology:/topology:\n  cp: 4/' configs/tiny.yaml > "$out/bad.yaml"
grep -q "^  cp: 4" "$out/bad.yaml" || { echo "FAIL: no topology section in tiny.yaml"; exit 1; }
"$TRIDENT" train "$out/bad.yaml" --set model.seq_len=1020 --set run.dir="$out/bad" \
    > "$out/bad.log" 2>&1
rc=$?
line=$(grep -n "^  cp: 4" "$out/bad.yaml" | cut -d: -f1)
if [ "$rc" -eq 2 ] && grep -q "bad.yaml:$line:7: .*divisible by 2 x topology.cp (4)" "$out/bad.log"; then
    echo "ok   seq_len 1020 with cp 4: exit 2 at the key"
else
    echo "FAIL: seq_len 1020 with cp 4: exit $rc"; cat "$out/bad.log"; fails=$((fails + 1))
fi

echo "cp_train: $fails failed"
[ "$fails" -eq 0 ]
