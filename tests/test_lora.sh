#!/usr/bin/env bash
# LoRA (model.lora, docs/finetune.md) end to end, on a tiny Llama:
#   - gradients and two AdamW steps against an independent numpy reference
#     (tests/lora_ref.py, finite differences of a float64 HF Llama);
#   - a plain base trained and saved, then adapters on every linear layer
#     (qkv, proj, fc, up, fcproj) from it: tp 2 (with and without sequence
#     parallelism), tp 4 above kv_heads 2 (replicated kv rows), pp 2, dp 2
#     with ZeRO 1 and 3, cp 2 train the curve of
#     one rank (fp32, loss within relative 1e-5 per step, gradient norm 1e-3);
#   - the memory record: gradients and optimizer state are the adapters'
#     (4 and 8 bytes each), the frozen base is reported apart; the 7B LoRA
#     plan (configs/llama_7b_lora.yaml, base in bf16) fits one 24 GB GPU;
#   - `ckpt export --format hf` (merged, at the run's step) read by an
#     independent numpy forward gives the greedy tokens and logits of
#     `trident generate` on the LoRA checkpoint (tests/generate_check.py);
#     the HF directory generates the same tokens; `trident eval` gives the
#     merged export's loss;
#   - `ckpt export --format peft` read back by tests/peft_check.py (its own
#     safetensors parser): PEFT names and shapes, merged = base + (a/r) B A;
#     the same for a tiny GPT-2 (Conv1D: fan_in_fan_out, (B A) transposed,
#     c_attn's [Q | K | V] rows), on all four targets and on proj and fc
#     alone (attn.c_proj named apart from mlp.c_proj), its merged export
#     giving `trident generate`'s tokens and logits;
#   - the frozen base in bf16 (model.lora.base_dtype): equal to an fp32
#     base rounded to bf16 beforehand, bit for bit; tp 2 equals one rank;
#     the frozen base's bytes drop; its eval and merged export use the
#     base rounded as trained; the 7B plan fits with it;
#   - adapter dropout (model.lora.dropout): the layouts above run with it
#     (the same masks on every layout), validation drops nothing (= eval of
#     the checkpoint), and a second reference run with dropout 0.25 on every
#     target against lora_ref.py drawing the documented masks itself;
#   - bad input exits 2: an unknown target (file:line:column), up on gpt2,
#     dropout out of [0, 1), a missing base, --format peft of a
#     plain checkpoint and of a gpt2 with kv_heads < heads.
. "$(dirname "$0")/e2e.sh"
py=/usr/bin/python3

# Bytes (vocab 257): with GPT-2's vocabulary the frozen classifier would be
# most of a tiny model's time.
"$TRIDENT" prepare-data --input $(ls data/brown/txt/* | head -4) --tokenizer byte \
    --out "$out/bytes" > "$out/bytes.log" 2>&1 ||
    { echo "FAIL: prepare-data: $(tail -2 "$out/bytes.log")"; exit 1; }
small=(--set model.vocab=257 --set data.path="$out/bytes" --set data.val_path="$out/bytes"
       --set model.arch=llama --set model.kv_heads=2 --set model.layers=2 --set model.hidden=64
       --set model.heads=4 --set model.seq_len=32 --set training.warmup_steps=0
       --set training.lr=1e-2 --set training.global_batch=4 --set training.micro_batch=1
       --set data.val_every=0 --set data.val_sequences=2 --set run.log_every=100
       --set topology.bucket_mb=1)
ok() { # what, condition...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

RUN_CKPT=1 run base 1 --set training.steps=3
# With adapter dropout (model.lora.dropout): every layout draws the masks
# of one rank (keyed by the token's place in the stream, the layer, the
# target and the global column), so the curves still agree.
lora=(--set model.lora.rank=4 --set model.lora.alpha=8 --set training.steps=4
      --set model.lora.targets=qkv,proj,fc,up,fcproj --set model.lora.base="$out/base/ckpt"
      --set model.lora.dropout=0.1 --set data.val_every=4)
RUN_CKPT=1 run ref 1 "${lora[@]}"
run tp2 2 "${lora[@]}" --set topology.tp=2
run sp2 2 "${lora[@]}" --set topology.tp=2 --set topology.sequence_parallel=true
run pp2 2 "${lora[@]}" --set topology.pp=2
run dp2_zero1 2 "${lora[@]}" --set topology.dp=2 --set topology.zero=1
run dp2_zero3 2 "${lora[@]}" --set topology.dp=2 --set topology.zero=3
run cp2 2 "${lora[@]}" --set topology.cp=2 --set training.micro_batch=2
# tp 4 above kv_heads 2: each kv head's k and v rows (of the base and of
# the qkv adapter's B) replicated on two ranks, their B gradient summed
# over those two (without it the copies drift apart and the curve leaves
# the reference's).
run tp4 4 "${lora[@]}" --set topology.tp=4
for l in tp2 sp2 pp2 dp2_zero1 dp2_zero3 cp2 tp4; do
    curves ref "$l" --steps 4 --norm-rtol 1e-3 # the gradient norm: a missed TP sum of dA moves it by 3e-2
done

# The frozen base stored in bf16 (model.lora.base_dtype): the same run as
# an fp32 base whose weights were rounded to bf16 beforehand (the base's
# HF export in bf16), bit for bit; on tp 2 the curve of one rank; the
# frozen base's bytes drop (2 per weight plus one group widened to fp32).
"$TRIDENT" ckpt export --format hf --dtype bf16 --out "$out/base16.hf" "$out/base/ckpt" \
    > "$out/base16.log" 2>&1 || { echo "FAIL: export --dtype bf16"; fails=$((fails + 1)); }
run b32 1 "${lora[@]}" --set model.lora.base="$out/base16.hf"
RUN_CKPT=1 run b16 1 "${lora[@]}" --set model.lora.base_dtype=bf16
run b16_tp2 2 "${lora[@]}" --set model.lora.base_dtype=bf16 --set topology.tp=2
curves b32 b16 --steps 4 --rtol 1e-7 --norm-rtol 1e-6
curves b16 b16_tp2 --steps 4 --norm-rtol 1e-3
"$py" - "$out/ref/metrics.jsonl" "$out/b16/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
f32, f16 = (json.loads(open(f).readline())["memory_bytes"]["frozen_base"] for f in sys.argv[1:])
good = f32 / 2 < f16 < f32
print(f"{'ok  ' if good else 'FAIL'} frozen base in bf16: {f16} bytes, in fp32 {f32} "
      f"(half of it plus one group's fp32 scratch)")
sys.exit(0 if good else 1)
PY
ok "the start-up line says bf16" grep -q "frozen base per rank .* (bf16, one part" "$out/b16.log"
# eval of its checkpoint (base_dtype bf16 from its config) gives the run's
# last validation loss; its merged export is the bf16-rounded base plus
# (alpha/r) B A (the base of an fp32 inference model read rounded as trained).
"$TRIDENT" eval "$out/b16/ckpt" --data "$out/bytes" --sequences 2 > "$out/eval.b16" 2>&1 ||
    { echo "FAIL: eval of b16: $(tail -2 "$out/eval.b16")"; fails=$((fails + 1)); }
"$py" - "$out/eval.b16" "$out/b16/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, re, sys
a = float(re.search(r"loss ([0-9.]+)", open(sys.argv[1]).read()).group(1))
b = [json.loads(l) for l in open(sys.argv[2])][-1].get("val_loss", float("nan"))
good = abs(a - b) <= 1e-5 * abs(a)
print(f"{'ok  ' if good else 'FAIL'} eval of a bf16-base checkpoint {a} = its run's validation {b}")
sys.exit(0 if good else 1)
PY
for x in "hf m16.hf" "peft p16"; do
    set -- $x
    "$TRIDENT" ckpt export --format "$1" --out "$out/$2" "$out/b16/ckpt" > "$out/$2.log" 2>&1 ||
        { echo "FAIL: export --format $1 of b16: $(tail -2 "$out/$2.log")"; fails=$((fails + 1)); }
done
"$py" tests/peft_check.py "$out/p16" "$out/base16.hf" "$out/m16.hf" || fails=$((fails + 1))

# Memory: the adapters' gradients and Adam state, not the model's.
n=$(sed -n 's/.*| adapters \([0-9]*\) params.*/\1/p' "$out/ref.log")
"$py" - "$out/ref/metrics.jsonl" "${n:-0}" <<'PY' || fails=$((fails + 1))
import json, sys
mem = json.loads(open(sys.argv[1]).readline())["memory_bytes"]
n = int(sys.argv[2])
good = n > 0 and mem["grads"] == 4 * n and mem["optimizer"] == 8 * n and mem["params"] == 4 * n
print(f"{'ok  ' if good else 'FAIL'} memory of {n} adapter params: grads {mem['grads']}, "
      f"optimizer {mem['optimizer']}, params {mem['params']} bytes (4, 8, 4 per adapter param)")
sys.exit(0 if good else 1)
PY
ok "the start-up line reports the frozen base" grep -q "frozen base per rank" "$out/ref.log"
# The planner: a 7B LoRA plan fits one 24 GB GPU, its base in bf16
# (model.lora.base_dtype: 2 bytes x 6.74 B = 12.55 GiB, plus an fp32
# scratch the size of the largest part widened at once: a layer, 202.4 M
# weights, 0.75 GiB, the embedding and the head being widened one at a time
# (0.49 GiB each, 0.98 together)), its gradients and optimizer state the
# adapters' (36 M parameters: 0.13 and 0.40 GiB).
"$TRIDENT" plan configs/llama_7b_lora.yaml --cluster rtx3090:1x1 > "$out/plan.txt" 2>&1
ok "plan: 7B LoRA fits one rtx3090" grep -q "^fits: " "$out/plan.txt"
ok "plan: grads and optimizer of the adapters, the base in params" \
    grep -qE "^      0     32         1    13\.44     0\.13      0\.40 " "$out/plan.txt"
ok "plan: the bf16 base (2 bytes a weight) and its fp32 scratch" \
    grep -q "frozen base (13\.31 GiB" "$out/plan.txt"

# Exports: the base, the merged model, the PEFT adapters.
for x in "hf base.hf base/ckpt" "hf merged.hf ref/ckpt" "peft peft ref/ckpt"; do
    set -- $x
    "$TRIDENT" ckpt export --format "$1" --out "$out/$2" "$out/$3" > "$out/$2.log" 2>&1 ||
        { echo "FAIL: export --format $1 of $3: $(tail -2 "$out/$2.log")"; fails=$((fails + 1)); }
done
"$py" tests/peft_check.py "$out/peft" "$out/base.hf" "$out/merged.hf" || fails=$((fails + 1))
ok "the merged export is of the run's step (4), not step 0" \
    grep -q "^exported .* tensors of step 4 " "$out/merged.hf.log"

prompt="The jury said that the city"
"$TRIDENT" generate "$out/ref/ckpt" --prompt "$prompt" --max-new-tokens 12 --greedy --ids \
    --dump-logits "$out/g.logits" > "$out/g.ids" 2> "$out/g.log"
ok "generate on the LoRA checkpoint exits 0" test $? -eq 0
"$py" tests/generate_check.py "$out/merged.hf" "$(cat "$out/g.ids")" "$out/g.logits" ||
    fails=$((fails + 1))
"$TRIDENT" generate "$out/merged.hf" --prompt "$prompt" --max-new-tokens 12 --greedy --ids \
    > "$out/hf.ids" 2>/dev/null
ok "the merged export generates the LoRA checkpoint's tokens" cmp -s "$out/g.ids" "$out/hf.ids"
"$TRIDENT" generate "$out/base/ckpt" --prompt "$prompt" --max-new-tokens 12 --greedy --ids \
    > "$out/base.ids" 2>/dev/null
ok "the adapters change the base's tokens" bash -c "! cmp -s '$out/g.ids' '$out/base.ids'"
for src in ref/ckpt merged.hf; do
    "$TRIDENT" eval "$out/$src" --data "$out/bytes" --sequences 4 > "$out/eval.${src%%/*}" 2>&1 ||
        { echo "FAIL: eval $src: $(tail -2 "$out/eval.${src%%/*}")"; fails=$((fails + 1)); }
done
"$py" - "$out/eval.ref" "$out/eval.merged.hf" <<'PY' || fails=$((fails + 1))
import re, sys
a, b = (float(re.search(r"loss ([0-9.]+)", open(f).read()).group(1)) for f in sys.argv[1:])
good = abs(a - b) <= 1e-5 * abs(b)
print(f"{'ok  ' if good else 'FAIL'} eval with the adapters {a} = eval of the merged export {b}")
sys.exit(0 if good else 1)
PY
# Validation during training drops nothing: the run's last val_loss is
# `trident eval`'s loss of its checkpoint (the same 2 sequences).
"$TRIDENT" eval "$out/ref/ckpt" --data "$out/bytes" --sequences 2 > "$out/eval.val" 2>&1 ||
    { echo "FAIL: eval --sequences 2: $(tail -2 "$out/eval.val")"; fails=$((fails + 1)); }
"$py" - "$out/eval.val" "$out/ref/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, re, sys
a = float(re.search(r"loss ([0-9.]+)", open(sys.argv[1]).read()).group(1))
b = [json.loads(l) for l in open(sys.argv[2])][-1].get("val_loss", float("nan"))
good = abs(a - b) <= 1e-5 * abs(a)
print(f"{'ok  ' if good else 'FAIL'} validation of a dropout run {b} = eval of its checkpoint {a}")
sys.exit(0 if good else 1)
PY

# GPT-2: adapters on its four Conv1D layers (c_attn, attn.c_proj, c_fc,
# mlp.c_proj), then on attn.c_proj and c_fc alone, exported as PEFT with
# fan_in_fan_out and B's c_attn rows in [Q | K | V] order; peft_check.py merges them Conv1D's way and compares
# with the merged export, which tests/generate_check.py ties to `trident
# generate` on the LoRA checkpoint.
small_llama=("${small[@]}")
small=("${small[@]/model.arch=llama/model.arch=gpt2}")
small=("${small[@]/model.kv_heads=2/model.kv_heads=4}")
RUN_CKPT=1 run g2base 1 --set training.steps=2
RUN_CKPT=1 run g2lora 1 --set model.lora.rank=4 --set model.lora.alpha=8 --set training.steps=3 \
    --set model.lora.targets=qkv,proj,fc,fcproj --set model.lora.base="$out/g2base/ckpt"
for x in "hf g2base.hf g2base/ckpt" "hf g2merged.hf g2lora/ckpt" "peft g2peft g2lora/ckpt"; do
    set -- $x
    "$TRIDENT" ckpt export --format "$1" --out "$out/$2" "$out/$3" > "$out/$2.log" 2>&1 ||
        { echo "FAIL: export --format $1 of $3: $(tail -2 "$out/$2.log")"; fails=$((fails + 1)); }
done
"$py" tests/peft_check.py "$out/g2peft" "$out/g2base.hf" "$out/g2merged.hf" || fails=$((fails + 1))
# The attention's c_proj without the MLP's: target_modules must name it by
# its parent (a bare "c_proj" would adapt mlp.c_proj too).
RUN_CKPT=1 run g2proj 1 --set model.lora.rank=2 --set model.lora.alpha=2 --set training.steps=3 \
    --set model.lora.targets=proj,fc --set model.lora.base="$out/g2base/ckpt"
for x in "hf g2pm.hf" "peft g2pp"; do
    set -- $x
    "$TRIDENT" ckpt export --format "$1" --out "$out/$2" "$out/g2proj/ckpt" > "$out/$2.log" 2>&1 ||
        { echo "FAIL: export --format $1 of g2proj: $(tail -2 "$out/$2.log")"; fails=$((fails + 1)); }
done
"$py" tests/peft_check.py "$out/g2pp" "$out/g2base.hf" "$out/g2pm.hf" || fails=$((fails + 1))
# Grouped-query attention has no GPT2LMHeadModel form: refused below.
small=("${small[@]/model.kv_heads=4/model.kv_heads=2}")
RUN_CKPT=1 run g2gqa 1 --set model.lora.rank=2 --set training.steps=1 --set model.lora.targets=qkv
"$TRIDENT" generate "$out/g2lora/ckpt" --prompt "$prompt" --max-new-tokens 8 --greedy --ids \
    --dump-logits "$out/g2.logits" > "$out/g2.ids" 2> "$out/g2.log"
ok "generate on the gpt2 LoRA checkpoint exits 0" test $? -eq 0
"$py" tests/generate_check.py "$out/g2merged.hf" "$(cat "$out/g2.ids")" "$out/g2.logits" ||
    fails=$((fails + 1))
small=("${small_llama[@]}")

# Gradients and steps against an independent numpy reference
# (tests/lora_ref.py: HF Llama in float64, finite differences, AdamW): a
# byte-level model trained on one 16-token sequence, adapters on qkv
# (column-parallel) and fcproj (row-parallel).
printf 'The jury said it' > "$out/one.txt"
"$TRIDENT" prepare-data --input "$out/one.txt" --tokenizer byte --out "$out/one" > "$out/one.log" 2>&1 ||
    { echo "FAIL: prepare-data: $(tail -2 "$out/one.log")"; fails=$((fails + 1)); }
small=(--set model.arch=llama --set model.vocab=257 --set model.kv_heads=2 --set model.layers=2
       --set model.hidden=32 --set model.heads=4 --set model.ffn_hidden=64 --set model.seq_len=16
       --set data.path="$out/one" --set data.val_path= --set data.val_every=0
       --set training.global_batch=1 --set training.micro_batch=1 --set training.warmup_steps=0
       --set training.decay=constant --set training.weight_decay=0 --set training.grad_clip=0
       --set run.log_every=100)
RUN_CKPT=1 run bbase 1 --set training.steps=1
RUN_CKPT=1 run bft 1 --set training.steps=2 --set training.lr=1e-3 --set checkpoint.every=1 \
    --set checkpoint.keep=3 --set model.lora.rank=2 --set model.lora.alpha=4 \
    --set model.lora.targets=qkv,fcproj --set model.lora.base="$out/bbase/ckpt"
for x in "hf bbase.hf bbase/ckpt" "peft p1 bft/ckpt/step_00000001" "peft p2 bft/ckpt/step_00000002"; do
    set -- $x
    "$TRIDENT" ckpt export --format "$1" --out "$out/$2" "$out/$3" > "$out/$2.log" 2>&1 ||
        { echo "FAIL: export --format $1 of $3: $(tail -2 "$out/$2.log")"; fails=$((fails + 1)); }
done
"$py" tests/lora_ref.py "$out/bbase.hf" "$out/p1" "$out/p2" "$out/bft/metrics.jsonl" \
    "$(od -An -tu1 -v "$out/one.txt" | tr -s ' \n' ' ') 256" 1e-3 || fails=$((fails + 1))
# The same with dropout 0.25 on every target, the reference drawing the
# documented masks itself (run.seed 1234 of configs/tiny.yaml).
RUN_CKPT=1 run bdrop 1 --set training.steps=2 --set training.lr=1e-3 --set checkpoint.every=1 \
    --set checkpoint.keep=3 --set model.lora.rank=2 --set model.lora.alpha=4 \
    --set model.lora.targets=qkv,proj,fc,up,fcproj --set model.lora.dropout=0.25 \
    --set model.lora.base="$out/bbase/ckpt"
for x in "d1 bdrop/ckpt/step_00000001" "d2 bdrop/ckpt/step_00000002"; do
    set -- $x
    "$TRIDENT" ckpt export --format peft --out "$out/$1" "$out/$2" > "$out/$1.log" 2>&1 ||
        { echo "FAIL: export --format peft of $2: $(tail -2 "$out/$1.log")"; fails=$((fails + 1)); }
done
"$py" tests/lora_ref.py "$out/bbase.hf" "$out/d1" "$out/d2" "$out/bdrop/metrics.jsonl" \
    "$(od -An -tu1 -v "$out/one.txt" | tr -s ' \n' ' ') 256" 1e-3 0.25 1234 || fails=$((fails + 1))

# Bad input: exit 2 with the reason.
bad() { # what, expected text, trident args...
    local what=$1 want=$2; shift 2
    "$TRIDENT" "$@" > "$out/bad.log" 2>&1
    local rc=$?
    if [ "$rc" -eq 2 ] && grep -q -- "$want" "$out/bad.log"; then echo "ok   $what: exit 2"
    else echo "FAIL: $what: exit $rc, $(tail -2 "$out/bad.log")"; fails=$((fails + 1)); fi
}
sed 's/^  seq_len: 128/  seq_len: 128\n  lora:\n    rank: 4\n    targets: [qkv, attn]/' \
    configs/tiny.yaml > "$out/bad.yaml"
bad "an unknown target" "bad.yaml:23:14: model.lora.targets: 'attn' is not a linear layer" \
    train "$out/bad.yaml" --set training.steps=1
bad "up on gpt2" "'up' is not a linear layer of a gpt2" train configs/tiny.yaml \
    --set model.lora.rank=4 --set model.lora.targets=qkv,up
bad "dropout 1" "model.lora.dropout (1) must be in \[0, 1)" train configs/tiny.yaml \
    --set model.lora.rank=4 --set model.lora.dropout=1
bad "a missing base" "model.lora.base" train configs/tiny.yaml "${small[@]}" \
    --set run.dir="$out/nobase" --set checkpoint.dir= --set model.lora.rank=4 \
    --set model.lora.base="$out/nothing"
bad "--format peft of a plain checkpoint" "not a LoRA checkpoint" \
    ckpt export --format peft --out "$out/p2" "$out/base/ckpt"
bad "--format peft of a gpt2 with kv_heads < heads" "no GPT2LMHeadModel equivalent" \
    ckpt export --format peft --out "$out/pg" "$out/g2gqa/ckpt"

echo "lora: $fails failed"
[ "$fails" -eq 0 ]
