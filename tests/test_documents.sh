#!/usr/bin/env bash
# Packed documents (data.document_mask): a dataset of short documents (each
# sentence of a few Brown texts one document, 10-40 tokens, so every
# 64-token window holds several), trained with each document attending only
# within itself and positions restarting at each.  Every layout trains the
# same curve as one rank (docs/design.md, invariant 1): tp 2 with sequence
# parallelism, pp 2, dp 2 with ZeRO 1 and 3, for GPT-2 (learned positions)
# and Llama (RoPE, GQA), per-step loss within relative 1e-5 for 8 steps.
# With data.eod_mask_loss the same holds while micro-batches count different
# numbers of targets.  The mask changes the curve (the key is not ignored),
# and a mask without its end-of-document token is refused.  (Each document's tokens against
# the document alone: tests/test_model.c.)
. "$(dirname "$0")/e2e.sh"

python3 - "$out/docs.jsonl" <<'PY'
import glob, json, re, sys
with open(sys.argv[1], "w") as f:
    for path in sorted(glob.glob("data/brown/txt/c*"))[:12]:
        for s in re.split(r"(?<=[.!?])\s+", open(path).read()):
            if 3 <= len(s.split()) <= 30:
                f.write(json.dumps({"text": s}) + "\n")
PY
"$TRIDENT" prepare-data --input "$out/docs.jsonl" --tokenizer gpt2 --out "$out/docs" \
    > "$out/prepare.log" 2>&1 || { echo "FAIL: prepare-data"; cat "$out/prepare.log"; exit 1; }

small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=64 --set model.heads=4
       --set model.seq_len=64 --set training.steps=8 --set training.warmup_steps=2
       --set training.lr=1e-3 --set training.global_batch=4 --set training.micro_batch=1
       --set data.path="$out/docs" --set data.val_path= --set run.log_every=100
       --set data.document_mask=true --set data.eot=50256)
llama=(--set model.arch=llama --set model.kv_heads=2)
compare() { curves "$1" "$2" --steps 8 --norm-rtol 1e-4; } # reference, name

run gpt2 1
run gpt2_tp2_sp 2 --set topology.tp=2 --set topology.sequence_parallel=true
compare gpt2 gpt2_tp2_sp
run gpt2_pp2 2 --set topology.pp=2
compare gpt2 gpt2_pp2
run gpt2_dp2_zero3 2 --set topology.dp=2 --set topology.zero=3
compare gpt2 gpt2_dp2_zero3
run llama 1 "${llama[@]}"
run llama_tp2_pp2 4 "${llama[@]}" --set topology.tp=2 --set topology.pp=2
compare llama llama_tp2_pp2
run llama_dp2_zero1 2 "${llama[@]}" --set topology.dp=2 --set topology.zero=1
compare llama llama_dp2_zero1
run llama_recompute 1 "${llama[@]}" --set training.recompute=full
compare llama llama_recompute

# data.eod_mask_loss: the targets that end a document count no loss, so
# micro-batches count different numbers of targets; the step's loss and
# gradient are the mean over every counted token of the global batch
# whatever the split (1 rank with 4 micro-batches or 1, dp 2 x pp 2).
eod=(--set data.eod_mask_loss=true)
run gpt2_eod 1 "${eod[@]}"
run gpt2_eod_mb4 1 "${eod[@]}" --set training.micro_batch=4
compare gpt2_eod gpt2_eod_mb4
run gpt2_eod_dp2_pp2 4 "${eod[@]}" --set topology.dp=2 --set topology.pp=2
compare gpt2_eod gpt2_eod_dp2_pp2

# Without the mask the same data trains another curve.
run gpt2_nomask 1 --set data.document_mask=false
python3 - "$out/gpt2/metrics.jsonl" "$out/gpt2_nomask/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
differ = len(a) == len(b) == 8 and a[0] != b[0]
print(f"{'ok  ' if differ else 'FAIL'} the mask changes the first loss: {a[0]:.6f} vs {b[0]:.6f} without")
sys.exit(0 if differ else 1)
PY

"$TRIDENT" train configs/tiny.yaml "${small[@]}" --set run.dir="$out/bad" --set data.eot=-1 \
    > "$out/bad.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "data.document_mask needs data.eot" "$out/bad.log"; then
    echo "ok   document_mask without data.eot: exit 2"
else
    echo "FAIL: document_mask without data.eot: exit $rc"; cat "$out/bad.log"; fails=$((fails + 1))
fi

echo "documents: $fails failed"
[ "$fails" -eq 0 ]
