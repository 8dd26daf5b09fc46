#!/usr/bin/env bash
# Tensor-parallel communication per transformer layer against theory (issue:
# tensor and sequence parallelism): tp 2 and 4, sequence parallelism off and
# on, GPT-2 shapes (layers 4, hidden 256, heads 8, seq 64, batch 4, vocab
# 50257), then Llama-style with kv_heads 2 (split over tp 2, replicated over
# tp 4).  Calls and elements are per rank; a layer row is per layer, the
# embedding and head rows per step.  bench_tp exits 1 when a measurement is
# not theory plus the extras it lists.
#   bench/tp.sh                       both models
#   bench/tp.sh --set model.hidden=512 ...   GPT-2 only, with these overrides
#   BUILD_DIR=dir bench/tp.sh         build and run from dir (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log" >&2; exit 1; }
fi
ninja -C "$dir" bench/bench_tp >"$dir.ninja.log" 2>&1 || { tail -50 "$dir.ninja.log" >&2; exit 1; }
cores=$(nproc)
echo "machine: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
     "OpenMP threads per rank = cores / tp (at least 1)"

models=("gpt2:" "llama:--set model.arch=llama --set model.kv_heads=2")
[ $# -gt 0 ] && models=("gpt2:$*")
header=--header
for model in "${models[@]}"; do
    read -r -a extra <<<"${model#*:}"
    for tp in 2 4; do
        for sp in false true; do
            threads=$((cores / tp)); [ "$threads" -ge 1 ] || threads=1
            OMP_NUM_THREADS=$threads mpiexec -n "$tp" "$dir/bench/bench_tp" $header \
                --set topology.sequence_parallel="$sp" "${extra[@]}"
            header=
        done
    done
done
echo "theory per layer (n = b*s*h): no SP 2 all-reduces forward + 2 backward, each 2n(p-1)/p"
echo "per rank; SP 2 all-gathers + 2 reduce-scatters each way, each n(p-1)/p.  ratio ="
echo "measured / theory elements; 'exact' = measured equals theory plus the listed extras."
echo "ms: the slowest rank's time per layer (layer rows) or per step (others)."
