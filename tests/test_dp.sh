#!/usr/bin/env bash
# Data parallelism and ZeRO against the single-rank run (docs/design.md, invariant 1):
# dp 2 and 4, each with zero 0, 1, 2, 3, several micro-batches per step:
# per-step loss within relative 1e-5 for 12 steps and final weights within
# 1e-5.  Then the measured per-rank memory against the ZeRO formulas, and a
# rank killed mid-run ends the job in bounded time.
#
# Why lr 1e-3: Adam moves an element by about lr * m / sqrt(v) whatever the
# gradient's size, so for rarely seen embedding rows (gradients near zero)
# fp32 reduction-order noise becomes a weight difference of order
# lr * 1e-2.  The losses agree to 1e-7 either way.
. "$(dirname "$0")/e2e.sh"

small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=12 --set training.warmup_steps=2 --set training.lr=1e-3
       --set training.global_batch=16 --set training.micro_batch=2 --set data.val_every=0
       --set data.val_sequences=2 --set run.log_every=100 --set topology.bucket_mb=1)


compare() { curves ref "$1" --steps 12 --weights-atol 1e-5; } # name

run ref 1
for n in 2 4; do
    for z in 0 1 2 3; do
        run "dp${n}_zero$z" "$n" --set topology.dp="$n" --set topology.zero="$z"
        compare "dp${n}_zero$z"
    done
done

# Memory per rank against the ZeRO formulas, with bf16 (fp32 master + m + v
# = 12 bytes per owned parameter).
for z in 0 1 2 3; do
    run "mem$z" 4 --set topology.dp=4 --set topology.zero="$z" --set training.precision=bf16 \
        --set training.steps=1
done
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
mem = {z: json.loads(open(f"{out}/mem{z}/metrics.jsonl").readline())["memory_bytes"] for z in range(4)}
P = mem[0]["params"] // 4          # zero 0 keeps every parameter in fp32
dp = 4
S = -(-P // dp)                     # this rank's (rank 0's) share, rounded up
def near(got, want, what):
    ok = abs(got - want) <= 0.05 * want + 16 * dp
    print(f"{'ok  ' if ok else 'FAIL'} {what}: {got} bytes, formula {want:.0f}")
    return ok
good = all([
    near(mem[0]["optimizer"], 12 * P, "zero 0 optimizer = 12 P"),
    near(mem[1]["optimizer"], 12 * P / dp, "zero 1 optimizer = 12 P / dp"),
    near(mem[1]["params"], 4 * P, "zero 1 params = 4 P"),
    near(mem[2]["optimizer"], 12 * P / dp, "zero 2 optimizer = 12 P / dp"),
    near(mem[2]["grads"], 4 * P / dp, "zero 2 grads = 4 P / dp"),
    near(mem[3]["optimizer"], 12 * P / dp, "zero 3 optimizer = 12 P / dp"),
    near(mem[3]["grads"], 4 * P / dp, "zero 3 grads = 4 P / dp"),
    near(mem[3]["params"], 4 * P / dp, "zero 3 params = 4 P / dp"),
])
sys.exit(0 if good else 1)
PY

# A rank killed mid-run: the job ends with an error, in bounded time.
timeout 120 mpiexec -n 2 "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set topology.dp=2 \
    --set training.steps=100000 --set run.dir="$out/kill" > "$out/kill.log" 2>&1 &
job=$!
for _ in $(seq 1 100); do
    [ -s "$out/kill/metrics.jsonl" ] && break
    sleep 0.2
done
victim=""
# (this job's ranks only: their command line names its run.dir, so a
# trident of another test running beside this one is never the victim)
for p in $(pgrep -f -- "run.dir=$out/kill"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'PMI_RANK=1' && victim=$p
done
start=$SECONDS
if [ -z "$victim" ]; then
    echo "FAIL: could not find rank 1 to kill"; fails=$((fails + 1)); kill "$job"
else
    kill -9 "$victim"
fi
wait "$job"; rc=$?
took=$((SECONDS - start))
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$took" -gt 60 ]; then
    echo "FAIL: killed rank: exit $rc after ${took}s"; tail -5 "$out/kill.log"; fails=$((fails + 1))
else
    echo "ok   killed rank 1: job ended with exit $rc after ${took}s"
    grep -m2 -iE "terminat|killed|signal" "$out/kill.log" || true
fi

echo "dp: $fails failed"
[ "$fails" -eq 0 ]
