#!/usr/bin/env bash
# A rank killed under Slurm: one task of a running slurm/train_cpu.sbatch job
# (2 nodes x 1 task, dp 2, a checkpoint every 3 steps) gets SIGKILL.  The job
# must end FAILED within a bounded time (no hang until its time limit) with
# the reason in its log; the same command submitted again resumes from the
# last complete checkpoint and finishes on the uninterrupted run's curve
# (bit for bit: same topology).
. "$(dirname "$0")/e2e.sh"
. "$TRIDENT_SOURCE_ROOT/slurm/cluster/testing.sh"
slurm_test_cluster fail 17840
bound=60   # seconds from the kill to the end of the job

small=(--set model.layers=4 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=30 --set training.warmup_steps=2 --set training.lr=1e-3
       --set training.global_batch=8 --set training.micro_batch=1 --set data.val_every=0
       --set data.val_sequences=2 --set run.log_every=10 --set topology.dp=2
       --set checkpoint.every=3)

run ref 2

submit() {
    TRIDENT=$TRIDENT TRIDENT_LOG_DIR="$out/logs" TRIDENT_DUMP_WEIGHTS="$out/fail.weights" \
        sbatch --parsable -N 2 --ntasks-per-node 1 --time 10 --output="$out/slurm-%j.out" slurm/train_cpu.sbatch \
        configs/tiny.yaml "${small[@]}" --set run.name=fail --set run.dir="$out/fail" \
        --set checkpoint.dir="$out/fail/ckpt" 2>&1
}

# The trident process of task $2 of job $1 (all "nodes" are this machine).
task_pid() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = trident ] || continue
        tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qx "SLURM_JOB_ID=$1" || continue
        tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=$2" || continue
        echo "${p#/proc/}"
        return 0
    done
    return 1
}

job=$(submit) || { echo "FAIL: sbatch: $job"; exit 1; }
log="$out/logs/fail-$job.log"
# Kill rank 1 after the first checkpoint, a few steps into the run.
for ((i = 0; i < 1200; i++)); do
    [ -e "$out/fail/ckpt/latest" ] && [ "$(cat "$out/fail/metrics.jsonl" 2>/dev/null | wc -l)" -ge 5 ] \
        && break
    sleep 0.25
done
pid=$(task_pid "$job" 1) || { echo "FAIL: no trident process of task 1 of job $job"; tail -20 "$log"; exit 1; }
t0=$(date +%s)
kill -KILL "$pid"
state=$(slurm_wait_job "$job" 300)
took=$(($(date +%s) - t0))
if [ "$state" = FAILED ] && [ "$took" -le "$bound" ]; then
    echo "ok   task 1 (pid $pid) killed: job $job FAILED after $took s (bound $bound s)"
else
    echo "FAIL: job $job: $state $took s after the kill (want FAILED within $bound s)"
    tail -20 "$log"; exit 1
fi
for want in "node2: task 1: Killed" "trident-job: failed: the training step exited" \
    "resubmit the same command to resume"; do
    if grep -q -- "$want" "$log"; then echo "ok   log: $want"
    else echo "FAIL: log lacks '$want'"; fails=$((fails + 1)); tail -8 "$log"; fi
done

grep -E "^srun: error: |^trident-job: failed" "$log" | sed 's/^/     | /'

# The last complete checkpoint, then the resubmission resumes from it.
last=$(head -1 "$out/fail/ckpt/latest")
job2=$(submit) || { echo "FAIL: sbatch: $job2"; exit 1; }
state=$(slurm_wait_job "$job2" 400)
log2="$out/logs/fail-$job2.log"
[ "$state" = COMPLETED ] && grep -q "^resumed from .*/$last:" "$log2" \
    && echo "ok   resubmitted job $job2 resumed from $last and COMPLETED" \
    || { echo "FAIL: resubmitted job $job2: $state, resume from $last?"; tail -20 "$log2"; fails=$((fails + 1)); }

python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
def losses(d):
    by_step = {}
    for l in open(f"{out}/{d}/metrics.jsonl"):
        try:
            r = json.loads(l)
        except json.JSONDecodeError:
            continue          # a record torn by the kill
        by_step[r["step"]] = r["loss"]   # the resumed run's record of a step wins
    return by_step
r, g = losses("ref"), losses("fail")
ok = sorted(g) == sorted(r) == list(range(1, 31)) and all(g[s] == r[s] for s in r)
print(f"{'ok  ' if ok else 'FAIL'} loss curve after kill + resubmit equals the uninterrupted run's "
      f"bit for bit")
sys.exit(0 if ok else 1)
PY
cmp -s "$out/ref.weights" "$out/fail.weights" && echo "ok   final weights bit-identical" \
    || { echo "FAIL: final weights differ"; fails=$((fails + 1)); }

echo "slurm_fail: $fails failed"
[ "$fails" -eq 0 ]
