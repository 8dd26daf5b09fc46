# job.sh — sourced by the sbatch templates (train_cpu.sbatch, train_gpu.sbatch):
# finds the trident binary, names the job's log after the run, and runs the
# training step with signal forwarding, requeue on preemption and a clear
# verdict on failure.  See docs/slurm.md.
#
#   trident_job_init CONFIG [--set k=v ...]   binary, log, header
#   trident_job_run srun ... "$TRIDENT" train CONFIG [--set ...]
#
# Environment read: TRIDENT (binary; default TRIDENT_BUILD/trident, where a
# template sets TRIDENT_BUILD: <repo>/build for the CPU template,
# <repo>/build-cuda for the GPU one),
# TRIDENT_LOG_DIR (default $SLURM_SUBMIT_DIR/logs), TRIDENT_REQUEUE (1: requeue
# the job when trident stops on a signal, the default; 0: just exit).

TRIDENT_EXIT_PREEMPTED=75   # TRD_EXIT_PREEMPTED in src/core/error.h

tj_say() { echo "trident-job: $*"; }

# run.name of CONFIG with its --set overrides: the last --set run.name=...,
# else the name in the file's run: section (flow {name: x} or block style),
# else trident's default, "trident" (docs/config.md).
trident_run_name() { # config, args...
    local cfg=$1 name="" prev="" a
    shift
    for a in "$@"; do
        [ "$prev" = --set ] && [[ $a == run.name=* ]] && name=${a#run.name=}
        prev=$a
    done
    if [ -z "$name" ] && [ -r "$cfg" ]; then
        name=$(awk '
            /^run:[ \t]*\{/ { if (match($0, /name:[ \t]*[^,}]+/)) { v = substr($0, RSTART, RLENGTH);
                                sub(/name:[ \t]*/, "", v); print v; exit } }
            /^run:[ \t]*(#.*)?$/ { inrun = 1; next }
            /^[^ \t#]/ { inrun = 0 }
            inrun && /^[ \t]+name:/ { v = $0; sub(/^[ \t]+name:[ \t]*/, "", v); sub(/[ \t]*#.*$/, "", v);
                                       print v; exit }' "$cfg")
        name=${name//\"/}
        name=${name//\'/}
        name=${name%"${name##*[![:space:]]}"}
    fi
    [ -n "$name" ] || name=trident
    echo "${name//\//_}"
}

trident_job_init() { # config, args...
    : "${SLURM_JOB_ID:?run this through sbatch (SLURM_JOB_ID is not set)}"
    [ $# -ge 1 ] || { tj_say "usage: sbatch $0 CONFIG [--set key=value ...]" >&2; exit 2; }
    local build=${TRIDENT_BUILD:-$TRIDENT_HOME/build}
    TRIDENT=${TRIDENT:-$build/trident}
    local how="scripts/build.sh"
    [ "${build##*/}" = build-cuda ] && how="BUILD_DIR=build-cuda scripts/build.sh -Dcuda=enabled, docs/cuda.md"
    [ -x "$TRIDENT" ] || { tj_say "no trident binary at $TRIDENT: build it ($how) or set TRIDENT" >&2; exit 2; }
    [ -r "$1" ] || { tj_say "config $1 not found (relative paths are from $PWD)" >&2; exit 2; }
    TRIDENT_RUN_NAME=$(trident_run_name "$@")
    local dir=${TRIDENT_LOG_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/logs}
    mkdir -p "$dir"
    TRIDENT_LOG=$dir/$TRIDENT_RUN_NAME-$SLURM_JOB_ID.log
    tj_say "log: $TRIDENT_LOG"
    # One log per job, appended to by every (re)start of it.
    exec >>"$TRIDENT_LOG" 2>&1
    tj_say "job $SLURM_JOB_ID (${SLURM_JOB_NAME:-}) start $(date '+%F %T'), restart ${SLURM_RESTART_COUNT:-0}," \
        "nodes ${SLURM_JOB_NUM_NODES:-?} (${SLURM_JOB_NODELIST:-?}), tasks ${SLURM_NTASKS:-?}"
    tj_say "run $TRIDENT_RUN_NAME: $TRIDENT train $*"
}

# Forward a signal to the job step: srun passes it on to every task, and
# trident stops after the step all ranks agree on (src/train/preempt.h).
tj_forward() { # signal
    tj_signal=$1
    tj_say "got SIG$1 at $(date '+%T'): asking trident to checkpoint and stop"
    [ -n "${tj_pid:-}" ] && kill -"$1" "$tj_pid" 2>/dev/null
}

# Whether this run of trident stopped on a signal with a checkpoint saved:
# exit 75, or its "preempted:" line in this run's part of the log.  The line
# covers a race: the ranks exit 75 one by one, and --kill-on-bad-exit may
# kill a rank that has finished but not yet exited, so srun reports a signal.
tj_preempted() { # rc, log offset of this run
    [ "$1" -eq "$TRIDENT_EXIT_PREEMPTED" ] && return 0
    [ "$1" -ne 0 ] && tail -c +"$(($2 + 1))" "$TRIDENT_LOG" | grep -q '^preempted: '
}

trident_job_run() { # command...
    local offset
    offset=$(stat -c %s "$TRIDENT_LOG")
    tj_signal=
    trap 'tj_forward USR1' USR1
    trap 'tj_forward TERM' TERM
    "$@" &
    tj_pid=$!
    local rc=0
    wait "$tj_pid" || rc=$?
    # A trapped signal interrupts wait (status > 128) while srun runs on.
    while [ "$rc" -gt 128 ] && kill -0 "$tj_pid" 2>/dev/null; do
        rc=0
        wait "$tj_pid" || rc=$?
    done
    trap - USR1 TERM
    if [ "$rc" -ne 0 ] && tj_preempted "$rc" "$offset"; then
        rc=$TRIDENT_EXIT_PREEMPTED
    fi
    case $rc in
    0) tj_say "done: trident finished ($(date '+%F %T'))" ;;
    "$TRIDENT_EXIT_PREEMPTED")
        # SIGTERM is scancel, a preemption or the time limit itself: Slurm
        # decides (it requeues preempted jobs under PreemptMode=REQUEUE), and
        # a cancelled job must stay cancelled.  SIGUSR1 (--signal, or
        # scancel --signal=USR1) asks for a requeue.
        if [ "${tj_signal:-}" = TERM ]; then
            tj_say "trident saved a checkpoint and stopped on SIGTERM (scancel, preemption or" \
                "time limit): not requeued by this script; resubmit the same command to resume"
        elif [ "${TRIDENT_REQUEUE:-1}" = 1 ]; then
            tj_say "trident saved a checkpoint and stopped on a signal: requeueing job $SLURM_JOB_ID" \
                "(it resumes from checkpoint.dir/latest)"
            scontrol requeue "$SLURM_JOB_ID" || tj_say "scontrol requeue failed: resubmit to resume"
        else
            tj_say "trident saved a checkpoint and stopped on a signal; TRIDENT_REQUEUE=0: not requeued"
        fi ;;
    2) tj_say "failed: bad input (exit 2), see the error above; fix it and resubmit" ;;
    *) tj_say "failed: the training step exited $rc$( ((rc > 128)) && echo " (signal $((rc - 128)))")" \
           "at $(date '+%T'); a task that dies ends the whole step (--kill-on-bad-exit);" \
           "the last complete checkpoint is kept: resubmit the same command to resume from it" ;;
    esac
    return "$rc"
}
