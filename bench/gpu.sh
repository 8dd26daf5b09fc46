#!/usr/bin/env bash
# One GPU, bf16: trident's training throughput (tokens/s, MFU against the
# GPU's dense bf16 peak) on GPT-2 124M or 1.5B, and, given an llm.c checkout,
# llm.c's train_gpt2cu on the same model size, batch, sequence length and
# corpus in the same run, with the ratio (issue 8's goal: >= 1).
#
#   bench/gpu.sh                        124M, micro-batch 8 x 1024, 30 steps
#   bench/gpu.sh --model 1.5b --batch 4
#   bench/gpu.sh --llmc ~/llm.c         also build and run llm.c (make train_gpt2cu;
#                                       USE_CUDNN=0 where no cuDNN frontend is installed)
#   bench/gpu.sh --trident BIN          a trident built elsewhere (-Dcuda=enabled)
#   bench/gpu.sh --seq 64 --steps 4 --config configs/tiny.yaml   (a quick check)
#
# Both train from scratch on the Brown corpus (scripts/get_corpus.sh; llm.c
# reads it as an llm.c shard written by `trident prepare-data --format
# llmc`).  The figure is the median over the steps after the first three
# (start-up, allocation and autotuning excluded).  Results go to
# .cache/bench-gpu/; nothing here is a pass/fail test.
set -euo pipefail
cd "$(dirname "$0")/.."
model=124m batch=8 seq=1024 steps=30 llmc="" trident=build-cuda/trident config=""
while [ $# -gt 0 ]; do
    case $1 in
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --llmc) llmc=$2; shift 2 ;;
    --trident) trident=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    *) echo "bench/gpu.sh: unknown argument $1 (see the top of this file)" >&2; exit 2 ;;
    esac
done
case $model in
124m) cfg=configs/gpt2_124m.yaml depth=d12 ;;
1.5b) cfg=configs/gpt2_1.5b.yaml depth=d48 ;;
*) echo "bench/gpu.sh: --model 124m or 1.5b" >&2; exit 2 ;;
esac
[ -n "$config" ] && cfg=$config
if [ ! -x "$trident" ]; then
    [ "$trident" = build-cuda/trident ] || { echo "bench/gpu.sh: no $trident" >&2; exit 2; }
    BUILD_DIR=build-cuda scripts/build.sh -Dcuda=enabled >/dev/null
fi
[ -f data/brown/gpt2.idx ] || TRIDENT=$trident scripts/get_corpus.sh >/dev/null
out=.cache/bench-gpu
mkdir -p "$out"

# The median of a column over steps > 3 (after start-up).
median() { python3 -c '
import statistics, sys
v = [float(x) for x in sys.stdin.read().split()]
print(f"{statistics.median(v):.1f}" if v else "nan")'; }

# The ops against the CPU first, on this GPU (tests/test_cuda_ops.c; among
# them the tensor-core product of kernels/mma.cuh and the bf16 attention of
# kernels/attention_tc.cu, which the emulation checks but no GPU has yet):
# its summary line, and the failures if any (the figures below then come
# from a wrong kernel).
ops=$(dirname "$trident")/tests/test_cuda_ops
if [ -x "$ops" ]; then
    "$ops" > "$out/cuda_ops.log" 2>&1 || grep -m 10 FAIL "$out/cuda_ops.log" || true
    tail -1 "$out/cuda_ops.log"
fi

rm -rf "$out/trident"
"$trident" train "$cfg" --set backend=cuda --set training.precision=bf16 \
    --set training.steps="$steps" --set training.warmup_steps=1 \
    --set training.micro_batch="$batch" --set training.global_batch="$batch" \
    --set model.seq_len="$seq" --set topology.dp=1 --set topology.tp=1 --set topology.pp=1 \
    --set data.path=data/brown/gpt2 --set data.format=megatron --set data.val_path= \
    --set checkpoint.dir= --set run.dir="$out/trident" --set run.log_every=1 \
    > "$out/trident.log" 2>&1 || { tail -20 "$out/trident.log"; exit 1; }
# (one rank: the step's loss, gradient norm, clip factor and skip decision
# stay on the device, one host wait a step, and the classifier is the fused
# cross-entropy; the backend line says "host waits a step: 1")
grep -m1 "^backend:" "$out/trident.log"
col() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["step"] > 3:
        print(r[sys.argv[2]])' "$out/trident/metrics.jsonl" "$1"; }
tps=$(col tokens_per_s | median)
mfu=$(col mfu | python3 -c 'import statistics,sys; v=[float(x) for x in sys.stdin.read().split()]; print(f"{100*statistics.median(v):.1f}" if v else "nan")')
echo "trident: $(basename "$cfg" .yaml), batch $batch x $seq, bf16: $tps tokens/s, MFU $mfu%"

if [ -n "$llmc" ]; then
    shard=$out/brown_llmc
    [ -f "$shard.bin" ] || "$trident" prepare-data --input data/brown/txt --tokenizer gpt2 \
        --format llmc --out "$shard" >/dev/null
    make -C "$llmc" train_gpt2cu USE_CUDNN="${USE_CUDNN:-1}" >/dev/null
    "$llmc/train_gpt2cu" -i "$shard.bin" -j "$shard.bin" -e "$depth" -b "$batch" -t "$seq" \
        -d $((batch * seq)) -x "$steps" -v $((steps + 1)) -m 1 -s 0 -n 0 -y 0 -l 1e-4 \
        > "$out/llmc.log" 2>&1 || { tail -20 "$out/llmc.log"; exit 1; }
    ltps=$(awk '/^step/ { split($0, f, "|"); n++; if (n > 3) { s = f[length(f)];
            gsub(/[^0-9.]/, "", s); print s } }' "$out/llmc.log" | median)
    echo "llm.c train_gpt2cu ($depth, same batch): $ltps tokens/s"
    python3 -c "import sys; a,b=map(float,sys.argv[1:]); print(f'ratio trident / llm.c: {a/b:.2f}')" \
        "$tps" "$ltps"
fi
