#!/usr/bin/env bash
# Pipeline parallelism on the CPU backend: the measured idle fraction of a
# step (pp_idle, the slowest rank's step minus a rank's compute) against
# (p-1)/(m+p-1) and, for interleaved 1F1B with v chunks a rank, against
# (p-1)/(v*m+p-1), and the activation memory each stage holds, for pp 2 and
# 4, 1F1B, interleaved (v 2) and GPipe, several micro-batch counts.  Model
# stages are balanced by FLOPs: the LM head costs about four 1024-wide
# layers, so the last model stage gets four layers fewer.  One OpenMP
# thread per rank.
#   bench/pp.sh [STEPS]        (default 3; the first step is not counted)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
steps=${1:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
printf "%-3s %-12s %-4s %6s %7s %7s %8s  %-23s %s\n" pp sched m idle "(p-1)/" "(p-1)/" \
    step_ms "idle per stage" "activation MiB"
printf "%-3s %-12s %-4s %6s %7s %7s %8s  %-23s %s\n" "" "" "" "" "(m+p-1)" "(vm+p-1)" "" "" \
    "per stage"
for pp in 2 4; do
    for sched in 1f1b interleaved gpipe; do
        v=1; [ "$sched" = interleaved ] && v=2
        # 5 layers a model stage, the last one 1 layer and the head.
        stages=$((pp * v)); layers=$((5 * (stages - 1) + 1))
        split=$(python3 -c "print([5] * ($stages - 1) + [1])" | tr -d ' ')
        for m in "$pp" $((2 * pp)) $((4 * pp)); do
            mpiexec -n "$pp" build/trident train configs/tiny.yaml --set model.hidden=1024 \
                --set model.heads=8 --set model.layers="$layers" \
                --set model.seq_len=32 --set topology.pp="$pp" --set topology.schedule="$sched" \
                --set topology.virtual_stages="$v" --set "topology.stage_layers=$split" \
                --set training.micro_batch=1 \
                --set training.global_batch="$m" --set training.steps="$steps" \
                --set data.val_every=0 --set data.val_sequences=1 --set run.log_every=1000 \
                --set training.trace=true \
                --set run.dir="$out/r" > "$out/log" 2>&1 || { tail -20 "$out/log"; exit 1; }
            python3 - "$out/r" "$pp" "$sched" "$m" "$v" <<'PY'
import json, sys
from collections import defaultdict
run, pp, sched, m, v = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
steady = rows[1:] or rows
idle = sum(r["pp_idle"] for r in steady) / len(steady)
step = sum(r["step_ms"] for r in steady) / len(steady)
acts = " ".join(f"{b / 2**20:.0f}" for b in rows[0]["stage_activation_bytes"])
# Idle per stage from the trace: in each steady step, a rank's compute (fwd,
# bwd, reduce) against the longest pipeline span of the step over all ranks.
ev = [e for e in json.load(open(f"{run}/trace.json"))["traceEvents"] if e["ph"] == "X"]
steps = {(e["pid"], int(e["name"].split()[1])): (e["ts"], e["ts"] + e["dur"])
         for e in ev if e["name"].startswith("step ")}
busy, span = defaultdict(float), defaultdict(lambda: [1e30, -1e30])
for e in ev:
    if e["name"] not in ("fwd", "bwd", "reduce", "send-act", "recv-act", "send-grad", "recv-grad"):
        continue
    for (pid, k), (a, b) in steps.items():
        if pid == e["pid"] and k > 1 and a <= e["ts"] <= b:
            if e["name"] in ("fwd", "bwd", "reduce"):
                busy[pid, k] += e["dur"]
            sp = span[k]
            sp[0], sp[1] = min(sp[0], e["ts"]), max(sp[1], e["ts"] + e["dur"])
ks = sorted(span)
per = [sum(1 - busy[r, k] / (span[k][1] - span[k][0]) for k in ks) / len(ks) for r in range(pp)]
il = f"{(pp - 1) / (v * m + pp - 1):7.3f}" if v > 1 else f"{'-':>7}"
stages = " ".join(f"{x:.2f}" for x in per)
print(f"{pp:<3} {sched:<12} {m:<4} {idle:6.3f} {(pp - 1) / (m + pp - 1):7.3f} {il} {step:8.0f}  "
      f"{stages:<23} {acts}")
PY
        done
    done
done
