#!/usr/bin/env bash
# Preemption under Slurm: a job of slurm/train_cpu.sbatch (2 nodes x 1 task,
# dp 2) gets `scancel --signal=USR1 --batch` after its second step; the
# ranks agree on a step, save a checkpoint and exit 75, the job requeues
# itself and resumes from checkpoint.dir/latest.  Its loss curve and final
# weights equal an uninterrupted mpiexec run's bit for bit (same topology,
# docs/design.md invariant 2).  A plain scancel checkpoints too but stays
# cancelled.  Then, under mpiexec, SIGTERM to one rank alone:
# all ranks stop after the same step; with a peer that never gets there,
# the signalled rank still exits in bounded time (TRIDENT_PREEMPT_GRACE).
. "$(dirname "$0")/e2e.sh"
. "$TRIDENT_SOURCE_ROOT/slurm/cluster/testing.sh"
slurm_test_cluster preempt 17830

small=(--set model.layers=4 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=30 --set training.warmup_steps=2 --set training.lr=1e-3
       --set training.global_batch=8 --set training.micro_batch=1 --set data.val_every=0
       --set data.val_sequences=2 --set run.log_every=10 --set topology.dp=2)

run ref 2

TRIDENT=$TRIDENT TRIDENT_LOG_DIR="$out/logs" TRIDENT_DUMP_WEIGHTS="$out/pre.weights" \
    sbatch --parsable -N 2 --ntasks-per-node 1 --output="$out/slurm-%j.out" slurm/train_cpu.sbatch configs/tiny.yaml \
    "${small[@]}" --set run.name=pre --set run.dir="$out/pre" \
    --set checkpoint.dir="$out/pre/ckpt" > "$out/job.txt" 2>&1 \
    || { echo "FAIL: sbatch: $(cat "$out/job.txt")"; exit 1; }
job=$(cat "$out/job.txt")
log="$out/logs/pre-$job.log"
# Deterministic enough: the signal comes once two steps are on record, and
# the agreed stop step may be any later one.
for ((i = 0; i < 1200; i++)); do
    [ "$(cat "$out/pre/metrics.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break
    sleep 0.25
done
scancel --signal=USR1 --batch "$job" || { echo "FAIL: scancel --signal=USR1 --batch $job"; exit 1; }
state=$(slurm_wait_job "$job" 400)
if [ "$state" != COMPLETED ]; then
    echo "FAIL: job $job ended $state"; tail -40 "$log"; exit 1
fi
echo "ok   job $job: signalled, requeued, COMPLETED"

for want in "got SIGUSR1" "^preempted: .*stopped after step [0-9]* of 30, checkpoint saved; exit 75" \
    "requeueing job $job" "restart 1," "^resumed from .*/step_[0-9]*: step [0-9]*" \
    "done: trident finished"; do
    if grep -q -- "$want" "$log"; then echo "ok   log: $want"
    else echo "FAIL: log lacks '$want'"; fails=$((fails + 1)); fi
done
stop=$(sed -n 's/^preempted: .*stopped after step \([0-9]*\) of.*/\1/p' "$log" | head -1)
[ -n "$stop" ] && [ "$stop" -lt 30 ] && grep -q "^resumed from .*step_$(printf %08d "$stop")" "$log" \
    && echo "ok   stopped after step $stop, resumed from it" \
    || { echo "FAIL: stop step '$stop' and resume do not match"; fails=$((fails + 1)); }

python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
def losses(d):
    by_step = {}
    for l in open(f"{out}/{d}/metrics.jsonl"):
        r = json.loads(l)
        by_step[r["step"]] = r["loss"]
    return by_step
r, g = losses("ref"), losses("pre")
ok = sorted(g) == sorted(r) == list(range(1, 31)) and all(g[s] == r[s] for s in r)
print(f"{'ok  ' if ok else 'FAIL'} loss curve of the preempted job equals the uninterrupted "
      f"run's, steps 1-30 bit for bit" + ("" if ok else f": steps {sorted(g)}"))
sys.exit(0 if ok else 1)
PY
cmp -s "$out/ref.weights" "$out/pre.weights" && echo "ok   final weights bit-identical" \
    || { echo "FAIL: final weights differ"; fails=$((fails + 1)); }

# A plain scancel (SIGTERM to every process of the job) also stops at a
# checkpoint, but the job stays cancelled: only SIGUSR1 requeues.
TRIDENT=$TRIDENT TRIDENT_LOG_DIR="$out/logs" sbatch --parsable -N 2 --ntasks-per-node 1 \
    --output="$out/slurm-%j.out" \
    slurm/train_cpu.sbatch configs/tiny.yaml "${small[@]}" --set training.steps=3000 \
    --set run.name=cancel --set run.dir="$out/cancel" --set checkpoint.dir="$out/cancel/ckpt" \
    > "$out/job.txt" 2>&1 || { echo "FAIL: sbatch: $(cat "$out/job.txt")"; exit 1; }
job=$(cat "$out/job.txt")
for ((i = 0; i < 1200; i++)); do
    [ "$(cat "$out/cancel/metrics.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break
    sleep 0.25
done
scancel "$job"
state=$(slurm_wait_job "$job" 120)
sleep 2   # a requeue, if the script wrongly asked for one, shows as PENDING
state2=$(slurm_job_state "$job")
if [ "$state" = CANCELLED ] && [ "$state2" = CANCELLED ] && [ -s "$out/cancel/ckpt/latest" ] \
    && grep -q "stopped on SIGTERM .*not requeued" "$out/logs/cancel-$job.log"; then
    echo "ok   scancel: checkpoint $(cat "$out/cancel/ckpt/latest") saved, job CANCELLED, not requeued"
else
    echo "FAIL: scancel: job $state then $state2, latest '$(cat "$out/cancel/ckpt/latest" 2>/dev/null)'"
    grep "trident-job\|preempted" "$out/logs/cancel-$job.log" | tail -5; fails=$((fails + 1))
fi

# Without Slurm: SIGTERM to rank 1 alone under mpiexec.  Rank 0 never sees a
# signal, yet both stop after the same step (the all-reduced flag), exit 75
# with the checkpoint of that step, and `checkpoint.resume: auto` finishes the
# same curve.
TRIDENT_TEST_TAG=$$ timeout 300 mpiexec -n 2 "$TRIDENT" train configs/tiny.yaml "${small[@]}" \
    --set run.dir="$out/term" --set checkpoint.dir="$out/term/ckpt" > "$out/term1.log" 2>&1 &
mpi=$!
for ((i = 0; i < 1200; i++)); do
    [ "$(cat "$out/term/metrics.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break
    sleep 0.25
done
for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = trident ] || continue
    env=$(tr '\0' '\n' < "$p/environ" 2>/dev/null)
    grep -qx "TRIDENT_TEST_TAG=$$" <<<"$env" && grep -qx "PMI_RANK=1" <<<"$env" && kill -TERM "${p#/proc/}"
done
wait "$mpi"
rc=$?
stop=$(sed -n 's/^preempted: .*stopped after step \([0-9]*\) of.*/\1/p' "$out/term1.log")
if [ "$rc" -eq 75 ] && [ -n "$stop" ] && [ "$(cat "$out/term/ckpt/latest")" = "step_$(printf %08d "$stop")" ]; then
    echo "ok   SIGTERM to rank 1 only: both ranks stopped after step $stop, exit 75, checkpoint saved"
else
    echo "FAIL: SIGTERM to rank 1: exit $rc, stop step '$stop'"; tail -5 "$out/term1.log"; fails=$((fails + 1))
fi
run term 2 --set checkpoint.dir="$out/term/ckpt"
grep -q "^resumed from .*/step_$(printf %08d "${stop:-0}"):" "$out/term.log" \
    || { echo "FAIL: the mpiexec rerun did not resume from step ${stop:-?}"; fails=$((fails + 1)); }
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/{d}/metrics.jsonl"))}
r, g = losses("ref"), losses("term")
ok = sorted(g) == sorted(r) and all(g[s] == r[s] for s in r)
print(f"{'ok  ' if ok else 'FAIL'} SIGTERM, then resume: the uninterrupted curve bit for bit")
sys.exit(0 if ok else 1)
PY

# A rank that cannot reach the end of its step (rank 1 stopped with SIGSTOP)
# must not make SIGTERM useless: rank 0 exits 1 with a message after
# TRIDENT_PREEMPT_GRACE seconds instead of waiting in the all-reduce forever.
TRIDENT_TEST_TAG=$$-stuck TRIDENT_PREEMPT_GRACE=2 timeout 120 mpiexec -n 2 "$TRIDENT" train \
    configs/tiny.yaml "${small[@]}" --set run.dir="$out/stuck" > "$out/stuck.log" 2>&1 &
mpi=$!
for ((i = 0; i < 1200; i++)); do
    [ "$(cat "$out/stuck/metrics.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break
    sleep 0.25
done
declare -A rank_pid=()
for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = trident ] || continue
    env=$(tr '\0' '\n' < "$p/environ" 2>/dev/null)
    grep -qx "TRIDENT_TEST_TAG=$$-stuck" <<<"$env" || continue
    rank_pid[$(sed -n 's/^PMI_RANK=//p' <<<"$env")]=${p#/proc/}
done
kill -STOP "${rank_pid[1]}"
t0=$(date +%s)
kill -TERM "${rank_pid[0]}"
wait "$mpi"
rc=$?
took=$(($(date +%s) - t0))
kill -KILL "${rank_pid[1]}" 2>/dev/null
if [ "$rc" -ne 0 ] && [ "$took" -le 30 ] && grep -q "still running TRIDENT_PREEMPT_GRACE seconds" "$out/stuck.log"; then
    echo "ok   SIGTERM with a stuck peer: exit $rc after $took s with the reason (grace 2 s)"
else
    echo "FAIL: SIGTERM with a stuck peer: exit $rc after $took s"; tail -3 "$out/stuck.log"
    fails=$((fails + 1))
fi

echo "slurm_preempt: $fails failed"
[ "$fails" -eq 0 ]
