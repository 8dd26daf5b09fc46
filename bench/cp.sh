#!/usr/bin/env bash
# Context parallelism (topology.cp, docs/context_parallel.md), measured:
#  1. bytes each rank sends in the K/V exchange per step (metrics' cp_bytes)
#     against the scheme's formula: per layer and micro-batch an all-gather
#     of the rank's qkv rows forward, an all-gather and a reduce-scatter of
#     their gradients backward, 3 (cp-1) n floats for n = B x seq/cp x
#     (H + 2 KVH) x head size, less one all-gather per micro-batch: the
#     last layer's backward finds its rows still gathered, so (3L-1) (cp-1) n
#     for L layers without recompute (the ratio must be 1.000);
#  2. activation (+ scratch) memory per rank at cp 1, 2, 4 against cp 1's,
#     measured by the trainer's report (ideal ~ 1/cp; the K/V buffers of
#     the exchange are cp x one layer's qkv rows, which does not shrink);
#  3. the exchange's time as a share of the step (it is blocking today, so
#     all of it is exposed);
#  4. from the planner: the longest sequence (a power of 2) Llama 7B trains
#     with tp 8 on one node of H100s times cp 1, 2, 4, 8 nodes (recompute
#     full, ZeRO 3).
# A tiny Llama with GQA on the Brown texts in bytes (vocab 257), on this
# machine's cores.
#   bench/cp.sh [SEQ]              sequence length (default 4096)
#   BUILD_DIR=dir bench/cp.sh      the build to use (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
seq=${1:-4096}
trident=$dir/trident
[ -x "$trident" ] || { echo "build first: scripts/build.sh (no $trident)"; exit 1; }
[ -d data/brown/txt ] || { echo "fetch the corpus first: scripts/get_corpus.sh"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 - "$out/bytes.jsonl" <<'PY'
import glob, json, sys
with open(sys.argv[1], "w") as f:
    for path in sorted(glob.glob("data/brown/txt/c*"))[:40]:
        f.write(json.dumps({"text": " ".join(open(path).read().split())}) + "\n")
PY
"$trident" prepare-data --input "$out/bytes.jsonl" --tokenizer byte --out "$out/bytes" \
    > "$out/prepare.log" 2>&1 || { cat "$out/prepare.log"; exit 1; }

L=2 C=128 H=8 KVH=2
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u +%F)"
echo "model: llama, $L layers, hidden $C, heads $H (kv $KVH), vocab 257, seq $seq, micro_batch 1, 3 steps"
printf "%3s %14s %14s %7s %12s %8s %8s\n" cp "cp bytes/step" formula ratio "act+scr MiB" "vs cp1" "cp/step"
for cp in 1 2 4; do
    OMP_NUM_THREADS=1 mpiexec -n "$cp" "$trident" train configs/tiny.yaml \
        --set model.arch=llama --set model.layers=$L --set model.hidden=$C --set model.heads=$H \
        --set model.kv_heads=$KVH --set model.vocab=257 --set model.seq_len="$seq" \
        --set training.steps=3 --set training.global_batch=1 --set training.micro_batch=1 \
        --set data.path="$out/bytes" --set data.val_path= --set checkpoint.dir= \
        --set run.dir="$out/cp$cp" --set run.log_every=100 --set topology.cp=$cp \
        > "$out/cp$cp.log" 2>&1 || { tail -20 "$out/cp$cp.log"; exit 1; }
    python3 - "$out" "$cp" "$seq" $L $C $H $KVH <<'PY'
import json, sys
out, cp, seq, L, C, H, KVH = sys.argv[1], *map(int, sys.argv[2:])
rows = [json.loads(l) for l in open(f"{out}/cp{cp}/metrics.jsonl")]
mem = lambda r: (r["memory_bytes"]["activations"] + r["memory_bytes"]["scratch"]) / 2**20
if cp == 1:
    json.dump(mem(rows[0]), open(f"{out}/cp1.mem", "w"))
    print(f"{cp:3d} {'-':>14} {'-':>14} {'-':>7} {mem(rows[0]):12.1f} {1:8.3f} {'-':>8}")
    sys.exit(0)
last = rows[-1]
n = 1 * seq // cp * (H + 2 * KVH) * (C // H)
formula = (3 * L - 1) * (cp - 1) * n * 4
ratio = last["cp_bytes"] / formula
base = json.load(open(f"{out}/cp1.mem"))
print(f"{cp:3d} {last['cp_bytes']:14d} {formula:14d} {ratio:7.3f} {mem(rows[0]):12.1f} "
      f"{mem(rows[0]) / base:8.3f} {last['cp_ms'] / last['step_ms']:8.3f}")
sys.exit(0 if abs(ratio - 1) < 1e-9 else 1)
PY
done

echo
echo "planner: the longest sequence (a power of 2) Llama 7B trains with tp 8 (one node of"
echo "8 H100s, 80 GiB) x cp nodes, sequence parallelism, ZeRO 3, recompute full, micro_batch 1:"
for cp in 1 2 4 8; do
    best=none
    for s in 16384 32768 65536 131072 262144 524288 1048576 2097152; do
        args=(--set topology.tp=8 --set topology.cp=$cp --set topology.dp=1 --set topology.pp=1
              --set topology.zero=3 --set topology.sequence_parallel=true
              --set training.recompute=full --set training.global_batch=1
              --set training.micro_batch=1 --set model.seq_len=$s)
        if "$trident" plan configs/llama_7b.yaml --cluster h100-sxm:${cp}x8 "${args[@]}" \
            2>/dev/null | grep -q "^fits:"; then best=$s; else break; fi
    done
    echo "  cp $cp ($((8 * cp)) GPUs): seq_len $best"
done
