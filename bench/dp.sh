#!/usr/bin/env bash
# Data parallelism and ZeRO on the CPU backend: per-step time split into
# compute and exposed (not overlapped) communication, and the bytes each
# rank sends per step against theory: 2 P (dp-1)/dp for all-reduce, ZeRO-1
# and ZeRO-2 (one micro-batch per step), 3 P (dp-1)/dp for ZeRO-3.
#   bench/dp.sh [STEPS]        (default 6; the first step is not counted)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
steps=${1:-6}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# A model whose step is compute-bound on 2 cores; one micro-batch per rank.
model=(--set model.layers=4 --set model.hidden=256 --set model.heads=4 --set model.seq_len=64
       --set training.steps="$steps" --set data.val_every=0 --set data.val_sequences=1
       --set run.log_every=1000 --set topology.bucket_mb=4)
printf "%-4s %-5s %10s %10s %10s %12s %12s %7s\n" dp zero step_ms compute_ms exposed_ms \
    "MB/rank/step" "theory MB" ratio
for dp in 1 2 4; do
    for zero in 0 1 2 3; do
        [ "$dp" -eq 1 ] && [ "$zero" -gt 0 ] && continue
        mpiexec -n "$dp" build/trident train configs/tiny.yaml "${model[@]}" \
            --set topology.dp="$dp" --set topology.zero="$zero" \
            --set training.global_batch="$dp" --set training.micro_batch=1 \
            --set run.dir="$out/r" > "$out/log" 2>&1 || { cat "$out/log"; exit 1; }
        python3 - "$out/r/metrics.jsonl" "$dp" "$zero" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
dp, zero = int(sys.argv[2]), int(sys.argv[3])
first = json.loads(open(sys.argv[1]).readline())
P = first["memory_bytes"]["params"] // 4 if zero < 3 else first["memory_bytes"]["params"] // 4 * dp
step = sum(r["step_ms"] for r in rows) / len(rows)
comm = sum(r["comm_ms"] for r in rows) / len(rows)
sent = sum(r["comm_bytes"] for r in rows) / len(rows) / 1e6
theory = (3 if zero == 3 else 2) * 4 * P * (dp - 1) / dp / 1e6
ratio = f"{sent / theory:7.3f}" if theory else "      -"
print(f"{dp:<4} {zero:<5} {step:10.1f} {step - comm:10.1f} {comm:10.1f} {sent:12.2f} {theory:12.2f} {ratio}")
PY
    done
done
echo "P = parameters of the model; bytes are per rank under the ring algorithms (src/comm);"
echo "ZeRO-3 re-gathers less than 3P: the last two layers' gathered parameters are reused by backward."
