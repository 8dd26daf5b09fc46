#!/usr/bin/env bash
# Training through the CUDA backend against the CPU reference (docs/design.md,
# invariant 4).  Without a GPU it runs in the emulated build
# (-Demulate_cuda=true, suite emu): the kernels' code on the CPU, device
# memory that host code cannot touch, copies checked for direction.  So it
# checks the wiring (every buffer of the model, the optimizer and ZeRO in
# device memory; MPI through host staging; checkpoints through host copies),
# not GPU speed or GPU arithmetic.  On a GPU (suite gpu) the same script runs
# the real kernels.
#
# Per-step loss against the CPU run of the same config and seed, 8 steps:
#   a mixture of experts (GPT-2, 4 experts, a shared one, capacity 1.0; 4 steps),
#   its grouped GEMMs also in bf16 and the per-expert fallback (2 steps each),
#   also at dp 2 with ep 2 (ZeRO 0, and ZeRO 1 saved and resumed on the CPU),
#   and at dp 4 with ep 2 and ZeRO 0 and 3 (the experts reduced per layer
#   over their group; at ZeRO 3 from slots of their own, gathered too),
#   and at tp 2 with sequence parallelism (2 steps);
#   GPT-2 and Llama (GQA) on 1 rank, fp32 and bf16 (bf16 GEMMs on both
#   sides, within 1e-4), selective and full recompute;
#   dp 2 with ZeRO 1 and ZeRO 3, and pp 2 with tied embeddings (staged
#   collectives and point-to-point);
#   tp 2 with sequence parallelism (GPT-2) and with split kv heads (Llama),
#   and tp 2 x pp 2;
# packed documents (data.document_mask), Llama, also with context
# parallelism (cp 2: the K/V all-gather and gradient reduce-scatter of
# device buffers, merged attention blocks);
# LoRA adapters on a frozen Llama (model.lora), 1 rank and pp 2, with
# adapter dropout (the masks drawn on the device);
# a checkpoint saved by a CUDA run resumes bit for bit on CUDA and on the
# CPU within the same tolerance; the device memory peak equals the report
# (one rank, and rank 0 of an interleaved pipeline);
# the pooled staging buffers are all allocated in the first step; greedy
# generation (trident generate) gives the CPU's tokens and logits, from
# checkpoints saved on 1 rank, tp 2 and tp 2 x pp 2 and from a Hugging Face
# export; trident eval gives the CPU's loss; a model
# too big for the device's memory is refused before allocating.
# With topology.comm nccl (played by MPI in the emulation): dp 2 ZeRO 3,
# tp 2 x pp 2 with sequence parallelism, an interleaved pp 2 whose
# activations wrap around from the last rank to the first, bf16 at dp 2
# ZeRO 2 (the GEMMs reading the step's bf16 weight copy), and the MoE at
# dp 2 with ep 2 at ZeRO 3 (the all-to-alls as NCCL groups, the experts'
# gathers and reductions on the expert-data-parallel communicator) and dp 4
# with ep 2 at ZeRO 1 (the experts reduced per layer on that communicator's
# stream during backward), each against the
# CPU, with no host staging at all (NCCL carried every device buffer).
. "$(dirname "$0")/e2e.sh"

# Brown in bytes (vocab 257): GPT-2's 50257 made the emulated classifier
# two thirds of the test's time.
byte_data
small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=8 --set training.warmup_steps=2 --set training.lr=1e-3
       --set training.global_batch=4 --set training.micro_batch=2 --set data.val_every=4
       --set data.val_sequences=2 --set run.log_every=100 "${bytes[@]}")
cuda=(--set backend=cuda)
# fp32 sums in another order (block reductions, cuBLAS) drift apart by ~1e-6
# relative per step; a wrong index, a missed copy or a stale buffer moves the
# loss by 1e-3 or more.
TOL=${TRIDENT_CUDA_TOL:-2e-5}
# bf16 GEMMs round their operands: an fp32 difference of one ulp in an
# activation (another sum order) can move its bf16 value by 2^-9, so two
# correct bf16 runs drift apart faster (6.5e-6 after 8 steps in the
# emulation, against 0 for fp32); a wrong operand still moves the loss by
# 1e-3 or more.
BF16_TOL=${TRIDENT_CUDA_BF16_TOL:-1e-4}

compare() { # reference, name, tolerance
    curves "$1" "$2" --to 8 --common --rtol "$3" --norm-rtol "$(python3 -c "print(100 * $3)")" \
        --val-min 1
}

same() { # name1, name2: identical losses and final weights
    if cmp -s "$out/$1.weights" "$out/$2.weights" &&
       python3 -c "import json,sys; a,b=[[json.loads(l)['loss'] for l in open(f) if 'loss' in l] for f in sys.argv[1:]]; sys.exit(a[-4:]!=b[-4:])" \
           "$out/$1/metrics.jsonl" "$out/$2/metrics.jsonl"; then
        echo "ok   $2 equals $1 bit for bit (last 4 losses, final weights)"
    else
        echo "FAIL $2 differs from $1"; fails=$((fails + 1))
    fi
}

staged() { # name: staging buffers were allocated in the first step only
    local line
    line=$(grep -o "host staging: [0-9]* buffers allocated.*first step" "$out/$1.log")
    case "$line" in
    *"buffers allocated (busiest rank), 0 of them after the first step")
        echo "ok   $1: $line" ;;
    *) echo "FAIL $1: staging buffers not reused: ${line:-no report}"; fails=$((fails + 1)) ;;
    esac
}

nccl_used() { # name: the run said comm nccl and staged nothing through the host
    if grep -q "| comm nccl" "$out/$1.log" &&
       grep -q "host staging: 0 buffers allocated" "$out/$1.log"; then
        echo "ok   $1: comm nccl, no host staging buffer"
    else
        echo "FAIL $1: not carried by NCCL: $(grep -o "comm [a-z]*\|host staging: [0-9]* buffers" \
            "$out/$1.log" | tr '\n' ' ')"
        fails=$((fails + 1))
    fi
}

llama=(--set model.arch=llama --set model.kv_heads=2)
run gpt2_cuda 1 "${cuda[@]}"
if grep -q "no CUDA device is visible" "$out/gpt2_cuda.log"; then
    echo "SKIP: no CUDA device (a -Dcuda=enabled build on a machine without a GPU)"
    exit 77
fi
run gpt2 1
compare gpt2 gpt2_cuda "$TOL"
# A mixture of experts (model.moe: router, dispatch and combine kernels,
# the plan made on the host from the device's choices), 4 steps.
moe=(--set model.moe.experts=4 --set model.moe.shared_experts=1 --set training.steps=4
     --set model.moe.capacity_factor=1.0)
run moe 1 "${moe[@]}"
run moe_cuda 1 "${moe[@]}" "${cuda[@]}"
curves moe moe_cuda --to 4 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"
# The experts' GEMMs are grouped (one cuBLAS grouped GEMM per product over
# all experts, kernels/matmul.cu): in bf16 too (2 steps, against the CPU's
# bf16 twin), and the per-expert fallback where cuBLAS refuses them
# (TRIDENT_EMU_NO_GROUPED=1: the emulated cuBLAS answers NOT_SUPPORTED;
# on a GPU it changes nothing), 2 steps.
run moe_bf16 1 "${moe[@]}" --set training.precision=bf16 --set training.steps=2
run moe_bf16_cuda 1 "${moe[@]}" "${cuda[@]}" --set training.precision=bf16 --set training.steps=2
curves moe_bf16 moe_bf16_cuda --to 2 --rtol "$BF16_TOL" \
    --norm-rtol "$(python3 -c "print(100 * $BF16_TOL)")"
TRIDENT_EMU_NO_GROUPED=1 run moe_cuda_per_expert 1 "${moe[@]}" "${cuda[@]}" --set training.steps=2
curves moe moe_cuda_per_expert --to 2 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"
if grep -q "CPU emulation" "$out/moe_cuda.log"; then
    n=$(grep -c "grouped GEMM not supported for fp32.*per-expert GEMMs" "$out/moe_cuda_per_expert.log")
    if [ "$n" = 1 ] && ! grep -q "grouped GEMM not supported" "$out/moe_cuda.log"; then
        echo "ok   moe_cuda_per_expert: the refusal said once, the per-expert fallback trained"
    else
        echo "FAIL moe_cuda_per_expert: $n refusal lines (want 1, and none in moe_cuda)"
        fails=$((fails + 1))
    fi
fi
# Expert parallelism: the all-to-all of device rows (staged through the host).
# ep divides the experts' memory (docs/moe.md): at ZeRO 0, and at ZeRO 1
# with the optimizer's second block on the device, saved through the host
# copies and resumed on the CPU (steps 3-4 follow from the Adam state).
run moe_cuda_ep2 2 "${moe[@]}" "${cuda[@]}" --set topology.dp=2 --set topology.ep=2
curves moe moe_cuda_ep2 --to 4 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"
RUN_CKPT=1 run moe_cuda_ep2_zero1 2 "${moe[@]}" "${cuda[@]}" --set topology.dp=2 \
    --set topology.ep=2 --set topology.zero=1 --set checkpoint.every=2
curves moe moe_cuda_ep2_zero1 --to 4 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"
cp -r "$out/moe_cuda_ep2_zero1/ckpt" "$out/moe_zero1.ckpt"
rm -rf "$out/moe_zero1.ckpt"/step_00000004
echo step_00000002 > "$out/moe_zero1.ckpt/latest"
run moe_zero1_cpu 1 "${moe[@]}" --set checkpoint.dir="$out/moe_zero1.ckpt"
grep -q "resumed from .*step_00000002" "$out/moe_zero1_cpu.log" \
    || { echo "FAIL: moe_zero1_cpu did not resume"; fails=$((fails + 1)); }
curves moe moe_zero1_cpu --from 3 --to 4 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"
# ZeRO 3 at dp 4 x ep 2: each layer's experts gathered into device slots
# of their own and reduce-scattered from them over the expert-data-parallel
# pairs (micro-batch 1: its own reference, as the capacity depends on it).
mb1=(--set training.micro_batch=1)
run moe_mb1 1 "${moe[@]}" "${mb1[@]}"
run moe_cuda_dp4_ep2_zero3 4 "${moe[@]}" "${mb1[@]}" "${cuda[@]}" --set topology.dp=4 \
    --set topology.ep=2 --set topology.zero=3
curves moe_mb1 moe_cuda_dp4_ep2_zero3 --to 4 --rtol "$TOL" \
    --norm-rtol "$(python3 -c "print(100 * $TOL)")"
# ZeRO 0 at dp 4 x ep 2: each layer's experts all-reduced over their pair
# as its backward ends (device buffers staged through the host).
run moe_cuda_dp4_ep2 4 "${moe[@]}" "${mb1[@]}" "${cuda[@]}" --set topology.dp=4 --set topology.ep=2
curves moe_mb1 moe_cuda_dp4_ep2 --to 4 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"
# Tensor parallelism with sequence parallelism: each expert split over tp
# 2, the branch reduce-scattered, the routing weights' gradient all-reduced
# (device buffers); 2 steps (within the warmup, so the 4-step run's first
# two are the reference).
run moe_cuda_tp2_sp 2 "${moe[@]}" "${cuda[@]}" --set topology.tp=2 \
    --set topology.sequence_parallel=true --set training.steps=2
curves moe moe_cuda_tp2_sp --to 2 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"

# A model whose state outgrows the device's memory is refused before any
# allocation, naming the device and the planner's bytes (the emulated
# device's memory is the host's RAM; an H100 has 80 GB: 2000 layers of
# hidden 4096 need about 6 TB either way).
timeout 120 "$TRIDENT" train configs/tiny.yaml "${small[@]}" "${cuda[@]}" --set model.layers=2000 \
    --set model.hidden=4096 --set model.heads=32 --set run.dir="$out/too_big" > "$out/too_big.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "needs [0-9.]* GiB (parameters .*); 1 rank(s) share .*, more than its" "$out/too_big.log" &&
   [ ! -e "$out/too_big" ]; then
    echo "ok   too big for the device: refused, exit 2: $(grep -o 'share .*GiB$' "$out/too_big.log" | head -1)"
else
    echo "FAIL: too big for the device: exit $rc: $(tail -2 "$out/too_big.log")"; fails=$((fails + 1))
fi
# training.nonfinite decided on the device (one rank: trainer.c
# device_step; AdamW reads the skip flag there): lr 1e6 blows the weights
# up, steps 3-5 have a NaN gradient norm (with a finite loss) and are
# skipped, and the third skip in a row ends the run with exit 1, as on the
# CPU (tests/test_ckpt_faults.sh).  Shorter rows, one micro-batch, no
# validation: about 4 s of CPU for the emulated run.  GPT-2's vocabulary,
# whose blow-up these steps are.
gpt2_data=(--set model.vocab=50257 --set data.path=data/brown/gpt2 --set data.val_path=data/brown/gpt2_val)
for be in cpu cuda; do
    timeout 120 "$TRIDENT" train configs/tiny.yaml "${small[@]}" "${gpt2_data[@]}" --set backend=$be \
        --set training.lr=1e6 --set training.nonfinite=skip --set training.max_skipped=3 \
        --set model.seq_len=16 --set training.global_batch=2 --set data.val_every=1000 \
        --set run.dir="$out/skip_$be" > "$out/skip_$be.log" 2>&1
    echo "$? $(grep -c "update skipped" "$out/skip_$be.log") $(grep -o "step [0-9]*: 3 steps in a row" \
        "$out/skip_$be.log")" > "$out/skip_$be.result"
done
if [ "$(cat "$out/skip_cuda.result")" = "1 3 step 5: 3 steps in a row" ] &&
   cmp -s "$out/skip_cpu.result" "$out/skip_cuda.result"; then
    echo "ok   nonfinite skip on the device: 3 updates skipped, exit 1 at step 5, as on the CPU"
else
    echo "FAIL: nonfinite skip: cuda '$(cat "$out/skip_cuda.result")', cpu '$(cat "$out/skip_cpu.result")'"
    fails=$((fails + 1))
fi
grep -q "backend: cuda on" "$out/gpt2_cuda.log" ||
    { echo "FAIL: the cuda run does not report its device"; fails=$((fails + 1)); }
# Every device buffer is one of the memory report's categories: rank 0's
# peak as the backend counted it equals the sum of rank 0's report.
peak_is_report() { # name
    python3 - "$out" "$1" <<'PY' || fails=$((fails + 1))
import json, re, sys
out, name = sys.argv[1], sys.argv[2]
first = json.loads(open(f"{out}/{name}/metrics.jsonl").readline())
cats = first["memory_bytes"]
m = re.search(r"device memory: peak \d+ bytes .*\(rank 0: (\d+) bytes\)",
              open(f"{out}/{name}.log").read())
total = sum(cats.values())
ok = m is not None and int(m.group(1)) == total
print(f"{'ok  ' if ok else 'FAIL'} {name}: rank 0's device memory peak {m and m.group(1)} bytes, "
      f"report categories sum to {total} ({cats})")
sys.exit(0 if ok else 1)
PY
}
peak_is_report gpt2_cuda

run llama 1 "${llama[@]}"
run llama_cuda 1 "${llama[@]}" "${cuda[@]}"
compare llama llama_cuda "$TOL"

run gpt2_bf16 1 --set training.precision=bf16
run gpt2_bf16_cuda 1 --set training.precision=bf16 "${cuda[@]}"
compare gpt2_bf16 gpt2_bf16_cuda "$BF16_TOL"
# bf16 stores the norms' outputs and the MLP projection's input in bf16
# (docs/design.md, "bf16 activation storage"): RMSNorm and SwiGLU into bf16,
# full recompute (the shared slots), tp 2 (the norms' outputs replicated)
# and tp 2 with sequence parallelism (refused: fp32 activations there).
# The report's activations: bf16 halves ln1, ln2 and fc_act of each layer,
# the final norm's output and the logits (one tp rank: the head writes bf16
# logits, the cross-entropy bf16 dlogits in place), and adds the attention
# output's bf16 copy (N H hs = N C bf16 values a layer, beside the fp32 one
# the attention's backward reads): (2 layers x (2 N C + N F - N C) + N C +
# N Vp) x 2 bytes fewer than fp32's, N = 64 rows, C = 64, F = 256, Vp = 384
# (vocab 257 padded to a multiple of 128).
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
act = {n: json.loads(open(f"{sys.argv[1]}/{n}/metrics.jsonl").readline())["memory_bytes"]["activations"]
       for n in ("gpt2_cuda", "gpt2_bf16_cuda")}
N, C, F, Vp = 64, 64, 256, 384
want = (2 * (2 * N * C + N * F - N * C) + N * C + N * Vp) * 2
got = act["gpt2_cuda"] - act["gpt2_bf16_cuda"]
print(f"{'ok  ' if got == want else 'FAIL'} bf16 activation storage: {got} bytes fewer "
      f"activations than fp32 ({act}), want {want}")
sys.exit(got != want)
PY
run llama_bf16 1 "${llama[@]}" --set training.precision=bf16
run llama_bf16_cuda 1 "${llama[@]}" --set training.precision=bf16 "${cuda[@]}"
compare llama_bf16 llama_bf16_cuda "$BF16_TOL"
run gpt2_bf16_full_cuda 1 --set training.precision=bf16 --set training.recompute=full "${cuda[@]}"
compare gpt2_bf16 gpt2_bf16_full_cuda "$BF16_TOL"
run llama_bf16_tp2_cuda 2 "${llama[@]}" --set training.precision=bf16 --set topology.tp=2 "${cuda[@]}"
compare llama_bf16 llama_bf16_tp2_cuda "$BF16_TOL"
run gpt2_bf16_tp2_sp_cuda 2 --set training.precision=bf16 --set topology.tp=2 \
    --set topology.sequence_parallel=true "${cuda[@]}"
compare gpt2_bf16 gpt2_bf16_tp2_sp_cuda "$BF16_TOL"

run gpt2_sel_cuda 1 --set training.recompute=selective "${cuda[@]}"
compare gpt2 gpt2_sel_cuda "$TOL"

# Packed documents (data.document_mask): the space (byte 32) taken as the
# end of a document, so every 32-token window holds several; the
# kernels' document masks and RoPE positions against the CPU's (learned
# positions: cuda_ops' embedding with positions).
docs=(--set data.document_mask=true --set data.eot=32)
run llama_docs 1 "${llama[@]}" "${docs[@]}"
run llama_docs_cuda 1 "${llama[@]}" "${docs[@]}" "${cuda[@]}"
compare llama_docs llama_docs_cuda "$TOL"
run llama_docs_cp2_cuda 2 "${llama[@]}" "${docs[@]}" --set topology.cp=2 "${cuda[@]}"
compare llama_docs llama_docs_cp2_cuda "$TOL"

# LoRA (model.lora): the frozen base in device memory, adapters on every
# linear layer, the base's weight gradients skipped (docs/finetune.md);
# with adapter dropout (model.lora.dropout), its masks drawn on the device
# by dropout_philox from the rows' places in the token stream (the CPU's
# masks: a mask off by one element moves the loss by ~1e-3), the rows'
# buffer counted in the report.
lora=(--set model.lora.rank=4 --set model.lora.targets=qkv,proj,fc,up,fcproj)
drop=(--set model.lora.dropout=0.1)
run llama_lora 1 "${llama[@]}" "${lora[@]}" "${drop[@]}"
run llama_lora_cuda 1 "${llama[@]}" "${lora[@]}" "${drop[@]}" "${cuda[@]}"
compare llama_lora llama_lora_cuda "$TOL"
peak_is_report llama_lora_cuda
# pp 2: each in-flight micro-batch's activation set keeps its own rows on
# the device, read again by its backward.
run llama_lora_pp2_cuda 2 "${llama[@]}" "${lora[@]}" "${drop[@]}" "${cuda[@]}" --set topology.pp=2
compare llama_lora llama_lora_pp2_cuda "$TOL"
# The frozen base stored in bf16 (model.lora.base_dtype), one layer at a
# time widened to fp32 by the device's widen_bf16: the CPU's curve, and the
# device's peak is the report's (the bf16 base plus its widening scratch).
run llama_lora16 1 "${llama[@]}" "${lora[@]}" --set model.lora.base_dtype=bf16
run llama_lora16_cuda 1 "${llama[@]}" "${lora[@]}" --set model.lora.base_dtype=bf16 "${cuda[@]}"
compare llama_lora16 llama_lora16_cuda "$TOL"
peak_is_report llama_lora16_cuda

run llama_full 1 "${llama[@]}" --set training.recompute=full
run llama_full_cuda 1 "${llama[@]}" --set training.recompute=full "${cuda[@]}"
compare llama_full llama_full_cuda "$TOL"

# Several ranks, each with its (emulated) device: the collectives and the
# pipeline's sends and receives go through host staging buffers.
run gpt2_dp2_z1_cuda 2 --set topology.dp=2 --set topology.zero=1 "${cuda[@]}"
compare gpt2 gpt2_dp2_z1_cuda "$TOL"
run gpt2_dp2_z3_cuda 2 --set topology.dp=2 --set topology.zero=3 "${cuda[@]}"
compare gpt2 gpt2_dp2_z3_cuda "$TOL"
run gpt2_pp2_cuda 2 --set topology.pp=2 --set training.global_batch=8 "${cuda[@]}"
run gpt2_gb8 1 --set training.global_batch=8
compare gpt2_gb8 gpt2_pp2_cuda "$TOL"
for r in gpt2_dp2_z1_cuda gpt2_dp2_z3_cuda gpt2_pp2_cuda; do staged $r; done

# Checkpoints: saved at step 4 from device memory, resumed on the device
# (bit for bit) and on the CPU.
run gpt2_ck_cuda 1 "${cuda[@]}" --set checkpoint.every=4 --set checkpoint.dir="$out/ck"
from="$out/ck/step_00000004"
run gpt2_ck_cuda_resumed 1 "${cuda[@]}" --set checkpoint.resume="$from"
if grep -q "resumed from .*step_00000004" "$out/gpt2_ck_cuda_resumed.log"; then
    same gpt2_ck_cuda gpt2_ck_cuda_resumed
else
    echo "FAIL: gpt2_ck_cuda_resumed did not resume"; fails=$((fails + 1))
fi
run gpt2_ck_cpu_resumed 1 --set checkpoint.resume="$from"
compare gpt2_ck_cuda gpt2_ck_cpu_resumed "$TOL"

# Tensor parallelism: the vocabulary-parallel loss, the replicated biases and
# the boundary collectives on device buffers; with sequence parallelism, and
# in a tp 2 x pp 2 mesh.
run gpt2_tp2_sp_cuda 2 --set topology.tp=2 --set topology.sequence_parallel=true "${cuda[@]}"
compare gpt2 gpt2_tp2_sp_cuda "$TOL"
run llama_tp2_cuda 2 "${llama[@]}" --set topology.tp=2 "${cuda[@]}" \
    --set checkpoint.dir="$out/llama_tp2_ck"
compare llama llama_tp2_cuda "$TOL"
run gpt2_tp2_pp2_cuda 4 --set topology.tp=2 --set topology.pp=2 --set training.global_batch=8 \
    --set topology.zero=1 "${cuda[@]}" --set checkpoint.dir="$out/tp2pp2_ck"
compare gpt2_gb8 gpt2_tp2_pp2_cuda "$TOL"
for r in gpt2_tp2_sp_cuda llama_tp2_cuda gpt2_tp2_pp2_cuda; do staged $r; done

# Generation (trident generate, docs/generate.md) on the device: the key /
# value cache in device memory, rope_decode and attention_decode kernels.
# The same greedy tokens as the CPU and logits within the tolerance, for
# GPT-2 and for Llama (GQA, RoPE from a position offset), from checkpoints
# saved on 1 rank, on tp 2 (Llama) and on tp 2 x pp 2 (GPT-2), and from the
# Hugging Face export of the 1-rank one.
"$TRIDENT" ckpt export --format hf --out "$out/hf" "$out/ck" > "$out/hf_export.log" 2>&1 ||
    { echo "FAIL: ckpt export --format hf: $(tail -2 "$out/hf_export.log")"; fails=$((fails + 1)); }
for m in "gpt2 $out/ck" "gpt2_hf $out/hf" "gpt2_tp2pp2 $out/tp2pp2_ck" "llama_tp2 $out/llama_tp2_ck"; do
    set -- $m
    for b in cpu cuda; do
        timeout 300 "$TRIDENT" generate "$2" --prompt "The jury said that" --max-new-tokens 10 \
            --greedy --ids --backend $b --dump-logits "$out/gen_$1_$b.logits" \
            > "$out/gen_$1_$b.ids" 2> "$out/gen_$1_$b.log" ||
            { echo "FAIL: generate $1 on $b: $(tail -2 "$out/gen_$1_$b.log")"; fails=$((fails + 1)); }
    done
    python3 - "$out/gen_$1" "$1" "$TOL" <<'PY' || fails=$((fails + 1))
import struct, sys
base, name, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
ids = [open(f"{base}_{b}.ids").read() for b in ("cpu", "cuda")]
def floats(b):
    raw = open(f"{base}_{b}.logits", "rb").read()
    return struct.unpack(f"{len(raw) // 4}f", raw)
a, c = floats("cpu"), floats("cuda")
rel = max(abs(x - y) for x, y in zip(a, c)) / max(abs(x) for x in a) if a and len(a) == len(c) else 1
ok = ids[0] == ids[1] and ids[0].strip() and rel <= tol
print(f"{'ok  ' if ok else 'FAIL'} generate {name}: cuda tokens {'=' if ids[0] == ids[1] else '!='} cpu, "
      f"logits {rel:.2e} relative (tolerance {tol:g})")
sys.exit(0 if ok else 1)
PY
done

# Evaluation (trident eval) on the device: the same loss as the CPU within
# the tolerance, for the 1-rank checkpoint and, on 2 ranks (tp 2), for the
# Llama one.
for e in "gpt2 1 $out/ck" "llama_tp2 2 $out/llama_tp2_ck --set topology.tp=2"; do
    set -- $e
    name=$1 n=$2 src=$3; shift 3
    for b in cpu cuda; do
        timeout 300 mpiexec -n "$n" "$TRIDENT" eval "$src" --data "$out/bytes" --sequences 8 \
            --set backend=$b "$@" > "$out/eval_${name}_$b.log" 2>&1 ||
            { echo "FAIL: eval $name on $b: $(tail -2 "$out/eval_${name}_$b.log")"; fails=$((fails + 1)); }
    done
    python3 - "$out/eval_$name" "$name" "$TOL" <<'PY' || fails=$((fails + 1))
import re, sys
base, name, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
loss = []
for b in ("cpu", "cuda"):
    m = re.search(r"^eval: .* (\d+) tokens \| loss ([0-9.]+)", open(f"{base}_{b}.log").read(), re.M)
    loss.append(float(m.group(2)) if m else None)
ok = None not in loss and abs(loss[0] - loss[1]) <= tol * abs(loss[0])
print(f"{'ok  ' if ok else 'FAIL'} eval {name}: cpu {loss[0]}, cuda {loss[1]} (tolerance {tol:g} relative)")
sys.exit(0 if ok else 1)
PY
done

# NCCL for the device buffers (src/comm/nccl.h): collectives on the
# groups' own streams, pipeline messages on one-way channels.  Real NCCL
# needs a GPU per rank (4 here); the emulation's needs none.
nccl=(--set topology.comm=nccl)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
if grep -q "CPU emulation" "$out/gpt2_cuda.log" || [ "${gpus:-0}" -ge 4 ]; then
    run gpt2_dp2_z3_nccl 2 --set topology.dp=2 --set topology.zero=3 "${cuda[@]}" "${nccl[@]}"
    compare gpt2 gpt2_dp2_z3_nccl "$TOL"
    run gpt2_tp2_pp2_nccl 4 --set topology.tp=2 --set topology.pp=2 \
        --set training.global_batch=8 --set topology.sequence_parallel=true \
        --set topology.zero=1 "${cuda[@]}" "${nccl[@]}"
    compare gpt2_gb8 gpt2_tp2_pp2_nccl "$TOL"
    l4=(--set model.layers=4 --set training.global_batch=8)
    run gpt2_l4 1 "${l4[@]}"
    run gpt2_pp2v2_nccl 2 "${l4[@]}" --set topology.pp=2 --set topology.schedule=interleaved \
        --set topology.virtual_stages=2 "${cuda[@]}" "${nccl[@]}"
    compare gpt2_l4 gpt2_pp2v2_nccl "$TOL"
    # bf16 at ZeRO 2: the GEMMs read the step's bf16 weight copy, made
    # from the weights the previous step's all-gather made whole
    run gpt2_bf16_dp2_z2_nccl 2 --set training.precision=bf16 --set topology.dp=2 \
        --set topology.zero=2 "${cuda[@]}" "${nccl[@]}"
    compare gpt2_bf16 gpt2_bf16_dp2_z2_nccl "$BF16_TOL"
    # expert parallelism: the tokens' all-to-alls as one group of NCCL
    # sends and receives each, device to device; at ZeRO 3 the experts'
    # slots go through the expert-data-parallel NCCL communicator
    run moe_cuda_ep2_nccl 2 "${moe[@]}" "${cuda[@]}" "${nccl[@]}" --set topology.dp=2 \
        --set topology.ep=2 --set topology.zero=3
    curves moe moe_cuda_ep2_nccl --to 4 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"
    # ZeRO 1 at dp 4 x ep 2: each layer's experts reduce-scattered over
    # their pair on its NCCL stream as the layer's backward ends, after it
    run moe_cuda_dp4_ep2_zero1_nccl 4 "${moe[@]}" "${mb1[@]}" "${cuda[@]}" "${nccl[@]}" \
        --set topology.dp=4 --set topology.ep=2 --set topology.zero=1
    curves moe_mb1 moe_cuda_dp4_ep2_zero1_nccl --to 4 --rtol "$TOL" \
        --norm-rtol "$(python3 -c "print(100 * $TOL)")"
    for r in gpt2_dp2_z3_nccl gpt2_tp2_pp2_nccl gpt2_pp2v2_nccl gpt2_bf16_dp2_z2_nccl \
        moe_cuda_ep2_nccl moe_cuda_dp4_ep2_zero1_nccl; do
        nccl_used $r
    done
    # rank 0 holds chunk 1 (model stage 2), which sends gradients back: the
    # report counts those buffers too
    peak_is_report gpt2_pp2v2_nccl
else
    echo "NOT RUN: the NCCL runs need 4 GPUs (${gpus:-0} here); the checks above passed or failed on their own"
fi

[ "$fails" -eq 0 ] && echo "cuda_train: all passed" || { echo "cuda_train: $fails failed"; exit 1; }
