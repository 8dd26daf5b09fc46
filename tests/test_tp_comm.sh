#!/usr/bin/env bash
# Tensor-parallel communication per layer equals theory (two all-reduces of
# b*s*h forward and backward; with sequence parallelism the same volume as
# all-gathers and reduce-scatters) plus the extras bench_tp lists: bench_tp
# exits 1 on any other count or volume.  Small shapes, tp 2.
set -uo pipefail
: "${TRIDENT:?TRIDENT must point at the built binary}"
bench="$(dirname "$TRIDENT")/bench/bench_tp"
[ -x "$bench" ] || { echo "FAIL: $bench not built"; exit 1; }
fails=0
for sp in false true; do
    for arch in gpt2 llama; do
        out=$(OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 "$bench" --set model.layers=2 \
              --set model.hidden=64 --set model.heads=4 --set model.kv_heads=2 \
              --set model.arch=$arch --set model.seq_len=16 \
              --set topology.sequence_parallel=$sp 2>&1)
        rc=$?
        if [ "$rc" -ne 0 ]; then
            echo "FAIL: $arch sp $sp: bench_tp exit $rc"; echo "$out" | tail -15; fails=$((fails + 1))
        else
            echo "ok   $arch sp $sp"
        fi
    done
done
echo "tp_comm: $fails failed"
[ "$fails" -eq 0 ]
