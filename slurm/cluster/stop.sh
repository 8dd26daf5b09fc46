#!/usr/bin/env bash
# stop.sh — stop the local test cluster of start.sh: cancel its jobs, then
# stop the slurmd, slurmctld and munged processes whose pid files start.sh's
# daemons wrote under $TRIDENT_SLURM_DIR, and nothing else (a pid whose
# command line does not name that directory is not ours and is left alone).
# Stopping a cluster that is not running is not an error.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"

stop_daemon() { # name
    local pid i
    pid=$(ts_pid "$1") || { rm -f "$ts_run/$1.pid"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        [ -d "/proc/$pid" ] || break
        sleep 0.1
    done
    if [ -d "/proc/$pid" ]; then
        ts_log "$1 (pid $pid) did not stop in 10 s: killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$ts_run/$1.pid"
    ts_log "$1 stopped (pid $pid)"
}

[ -d "$TRIDENT_SLURM_DIR" ] || { ts_log "not running (no $TRIDENT_SLURM_DIR)"; exit 0; }
ts_lock

# Jobs first, while slurmctld can still end their steps: a slurmstepd whose
# slurmd is gone would otherwise keep its tasks running.
if ts_pid slurmctld >/dev/null && ts_ctld_up; then
    jobs=$(SLURM_CONF=$ts_conf squeue -h -o %i || true)
    if [ -n "$jobs" ]; then
        ts_log "cancelling jobs: $(echo $jobs)"
        # shellcheck disable=SC2086
        SLURM_CONF=$ts_conf scancel $jobs || true
        for ((i = 0; i < 150; i++)); do
            [ -z "$(SLURM_CONF=$ts_conf squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
fi
for node in $(ts_nodes); do stop_daemon "slurmd-$node"; done
stop_daemon slurmctld
stop_daemon munged
ts_log "down"
