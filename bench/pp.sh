#!/usr/bin/env bash
# Pipeline parallelism on the CPU backend: the measured idle fraction of a
# step (pp_idle, the slowest rank's step minus a rank's compute) against
# (p-1)/(m+p-1), and the activation memory each stage holds, for pp 2 and
# 4, 1F1B and GPipe, several micro-batch counts.  Stages are balanced by
# FLOPs: the LM head costs about four 1024-wide layers, so the last stage
# gets four layers fewer.  One OpenMP thread per rank.
#   bench/pp.sh [STEPS]        (default 3; the first step is not counted)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
steps=${1:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
printf "%-3s %-6s %-4s %9s %9s %9s   %s\n" pp sched m idle formula step_ms "activation MiB per stage"
for pp in 2 4; do
    if [ "$pp" -eq 2 ]; then layers="[5,1]"; else layers="[5,5,5,1]"; fi
    for sched in 1f1b gpipe; do
        for m in "$pp" $((2 * pp)) $((4 * pp)); do
            mpiexec -n "$pp" build/trident train configs/tiny.yaml --set model.hidden=1024 \
                --set model.heads=8 --set model.layers=$(( pp == 2 ? 6 : 16 )) \
                --set model.seq_len=32 --set topology.pp="$pp" --set topology.schedule="$sched" \
                --set "topology.stage_layers=$layers" --set training.micro_batch=1 \
                --set training.global_batch="$m" --set training.steps="$steps" \
                --set data.val_every=0 --set data.val_batches=1 --set run.log_every=1000 \
                --set run.dir="$out/r" > "$out/log" 2>&1 || { tail -20 "$out/log"; exit 1; }
            python3 - "$out/r/metrics.jsonl" "$pp" "$sched" "$m" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pp, sched, m = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
steady = rows[1:] or rows
idle = sum(r["pp_idle"] for r in steady) / len(steady)
step = sum(r["step_ms"] for r in steady) / len(steady)
acts = " ".join(f"{b / 2**20:.0f}" for b in rows[0]["stage_activation_bytes"])
print(f"{pp:<3} {sched:<6} {m:<4} {idle:9.3f} {(pp - 1) / (m + pp - 1):9.3f} {step:9.0f}   {acts}")
PY
        done
    done
done
