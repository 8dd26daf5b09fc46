#!/usr/bin/env bash
# Data loading against the training step it feeds (issue: data at scale).
# Makes a blend of 3 datasets of 1,000 Megatron shards each (random GPT-2
# ids, about 20,000 tokens a shard, 120 MB in all, under $TMPDIR), trains
# GPT-2 124M shapes on the CPU (12 layers, hidden 768, batch 4 x seq 64, as
# bench/cpu.sh) from it, and reports from metrics.jsonl the time rank 0
# spent reading and assembling its samples (data_ms) against the step
# (step_ms); the same run on the one-file Brown Corpus dataset is the
# reference.  Goal: under 1% of the step.  (Debian's python3 with numpy writes the shards.)
#   bench/data.sh [--steps N] [--shards N]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=4 shards=1000
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --shards) shards=$2; shift 2 ;;
        *) echo "usage: bench/data.sh [--steps N] [--shards N]" >&2; exit 2 ;;
    esac
done
scripts/build.sh >/dev/null
[ -f data/brown/gpt2.idx ] || TRIDENT=build/trident scripts/get_corpus.sh >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" "$shards" <<'PY'
import numpy as np, sys
out, shards = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
for name in "abc":
    for i in range(shards):
        lens = rng.integers(100, 900, size=40).astype(np.int32)
        toks = rng.integers(0, 50257, size=int(lens.sum())).astype(np.uint16)
        prefix = f"{out}/{name}-{i:05d}"
        toks.tofile(prefix + ".bin")
        ptr = np.concatenate([[0], np.cumsum(lens[:-1], dtype=np.int64) * 2]).astype(np.int64)
        with open(prefix + ".idx", "wb") as f:
            f.write(b"MMIDIDX\0\0")
            f.write(np.array([1], np.uint64).tobytes())
            f.write(np.array([8], np.uint8).tobytes())
            f.write(np.array([len(lens), len(lens) + 1], np.uint64).tobytes())
            f.write(lens.tobytes()); f.write(ptr.tobytes())
            f.write(np.arange(len(lens) + 1, dtype=np.int64).tobytes())
PY
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "blend: 3 datasets x $shards shards ($(du -sh "$work" | cut -f1)); GPT-2 124M shapes, batch 4 x 64, $steps steps"
model=(--set model.layers=12 --set model.hidden=768 --set model.heads=12 --set model.seq_len=64
       --set training.global_batch=4 --set training.micro_batch=4 --set training.precision=fp32
       --set training.steps="$steps" --set data.val_path= --set checkpoint.dir=
       --set run.log_every=1000 --set run.tensorboard=false)
train() { # name, --set ...
    local name=$1; shift
    build/trident train configs/tiny.yaml "${model[@]}" --set run.dir="$work/$name" "$@" \
        > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
report() { # name, label
    python3 - "$work/$1/metrics.jsonl" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first, rest = rows[0], rows[1:]
data = sum(r["data_ms"] for r in rest) / len(rest)
step = sum(r["step_ms"] for r in rest) / len(rest)
print(f"{sys.argv[2]:<28} data {data:8.3f} ms of a {step:8.1f} ms step = {100 * data / step:7.4f}%"
      f"  (first step: {first['data_ms']:.3f} ms of {first['step_ms']:.1f})")
PY
}
train blend --set data.path= --set "data.blend=0.5 $work/a-* 0.3 $work/b-* 0.2 $work/c-*"
train one --set data.path=data/brown/gpt2
report blend "blend of 3 x $shards shards"
report one "one dataset (Brown)"
# The loader alone at the GPU configuration's batch (configs/gpt2_124m.yaml:
# 512 sequences of 1024 per step, all read by one process here; a data-
# parallel rank reads its share).
build/bench/bench_data --blend "0.5 $work/a-* 0.3 $work/b-* 0.2 $work/c-*" --seq 1024 --batch 512 --steps 10
