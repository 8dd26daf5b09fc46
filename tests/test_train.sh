#!/usr/bin/env bash
# End-to-end training on the Brown Corpus: the loss falls, a validation loss
# is reported, metrics.jsonl has the documented fields, and the same seed
# gives the same loss curve twice (GPT-2 and Llama-style).
set -euo pipefail
: "${TRIDENT:?TRIDENT must point at the built binary}"
cd "${TRIDENT_SOURCE_ROOT:-.}"
[ -f data/brown/gpt2.idx ] && [ -f data/brown/gpt2_val.idx ] || {
    echo "FAIL: data/brown/gpt2 missing: run scripts/get_corpus.sh (the test command does)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=64
       --set training.steps=40 --set training.warmup_steps=5 --set training.lr=4e-3 --set training.min_lr=4e-4 --set training.global_batch=8
       --set training.micro_batch=4 --set data.val_every=20 --set data.val_sequences=8
       --set run.log_every=20)

run() { # name, extra args...
    local name=$1; shift
    "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set run.dir="$out/$name" "$@" \
        > "$out/$name.log" 2>&1 || { echo "FAIL: $name exited $?"; cat "$out/$name.log"; exit 1; }
}

check_metrics() { # name
    python3 - "$out/$1/metrics.jsonl" "$1" <<'PY'
import json, sys, math
rows = [json.loads(l) for l in open(sys.argv[1])]
name = sys.argv[2]
need = {"step", "loss", "lr", "grad_norm", "tokens", "step_ms", "tokens_per_s", "mfu"}
assert len(rows) == 40, f"{name}: {len(rows)} rows, expected 40"
for r in rows:
    assert need <= r.keys(), f"{name}: missing {need - r.keys()} in {r}"
    assert math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["mfu"] > 0, r
assert [r["step"] for r in rows] == list(range(1, 41))
assert rows[-1]["tokens"] == 40 * 8 * 64
first = sum(r["loss"] for r in rows[:3]) / 3
last = sum(r["loss"] for r in rows[-3:]) / 3
# starts near ln(50257) = 10.8 and must clearly fall within 40 small steps
assert first > 10.0, f"{name}: initial loss {first}"
assert last < first - 2.0, f"{name}: loss did not fall enough: {first:.3f} -> {last:.3f}"
vals = [r["val_loss"] for r in rows if "val_loss" in r]
assert len(vals) == 2 and all(math.isfinite(v) for v in vals), f"{name}: val losses {vals}"
assert "memory_bytes" in rows[0] and rows[0]["memory_bytes"]["params"] > 0
print(f"{name}: loss {first:.3f} -> {last:.3f}, val {vals[-1]:.3f}")
PY
}

run gpt2_a
run gpt2_b
check_metrics gpt2_a
cmp <(python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1])]' "$out/gpt2_a/metrics.jsonl") \
    <(python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1])]' "$out/gpt2_b/metrics.jsonl") \
    || { echo "FAIL: same seed, different loss curves"; exit 1; }
echo "same seed: identical loss curves over 40 steps"

run llama --set model.arch=llama --set model.kv_heads=2
check_metrics llama

run seed2 --set run.seed=99
if cmp -s <(head -1 "$out/gpt2_a/metrics.jsonl" | cut -d, -f2) <(head -1 "$out/seed2/metrics.jsonl" | cut -d, -f2); then
    echo "FAIL: a different seed gave the same first loss"; exit 1
fi
grep -q "^parameters: " "$out/gpt2_a.log" && grep -q "^memory per rank (MiB): " "$out/gpt2_a.log" \
    || { echo "FAIL: start-up report missing"; cat "$out/gpt2_a.log"; exit 1; }
[ -f "$out/gpt2_a/config.yaml" ] || { echo "FAIL: config.yaml not saved"; exit 1; }
echo "PASS train"
