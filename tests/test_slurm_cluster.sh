#!/usr/bin/env bash
# The local Slurm cluster (slurm/cluster/start.sh, stop.sh), on a private
# state directory and ports: started and stopped cleanly twice in a row;
# a second start while it runs changes nothing (same pids); both nodes run
# tasks (srun across node1 and node2 with PMI2); stop leaves no daemon of
# ours behind and does not touch a process that is not ours, even when a
# stale pid file names it.
set -uo pipefail
cd "${TRIDENT_SOURCE_ROOT:-.}" || exit 1
[ "$(id -u)" -eq 0 ] || { echo "FAIL: the local Slurm cluster needs root"; exit 1; }
export TRIDENT_SLURM_DIR=/tmp/trident-slurm-cluster-$$ TRIDENT_SLURM_PORT=17810
export SLURM_CONF=$TRIDENT_SLURM_DIR/etc/slurm.conf
fails=0
sleep 600 &
decoy=$!
trap 'slurm/cluster/stop.sh >/dev/null 2>&1; kill "$decoy" 2>/dev/null; rm -rf "$TRIDENT_SLURM_DIR"' EXIT
check() { # what, command...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}
daemons() { # pids of processes whose command line names our state directory
    local p
    for p in /proc/[0-9]*; do
        tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$TRIDENT_SLURM_DIR" && echo "${p#/proc/}"
    done | sort -n | tr '\n' ' '
}
pidfiles() { cat "$TRIDENT_SLURM_DIR"/run/*.pid 2>/dev/null | sort -n | tr '\n' ' '; }

for round in 1 2; do
    t0=$(date +%s.%N)
    if ! slurm/cluster/start.sh > "/tmp/trident-slurm-cluster-$$.log" 2>&1; then
        echo "FAIL: round $round: start.sh failed"; cat "/tmp/trident-slurm-cluster-$$.log"; exit 1
    fi
    echo "ok   round $round: started in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
    first=$(pidfiles)
    check "round $round: 4 daemons (munged, slurmctld, 2 slurmd): $first" \
        test "$(wc -w <<<"$first")" -eq 4
    check "round $round: sinfo shows node1 and node2 idle" \
        test "$(sinfo -h -N -o '%N %t' | sort | tr '\n' ' ')" = "node1 idle node2 idle "
    tasks=$(timeout 60 srun -N 2 --ntasks-per-node 2 --mpi=pmi2 bash -c \
        'echo $SLURMD_NODENAME/$SLURM_PROCID' 2>&1 | sort | tr '\n' ' ')
    check "round $round: srun on both nodes: $tasks" \
        test "$tasks" = "node1/0 node1/1 node2/2 node2/3 "
    slurm/cluster/start.sh > /dev/null 2>&1
    check "round $round: a second start.sh keeps the same daemons" test "$(pidfiles)" = "$first"
    # A stale pid file naming someone else's process: neither ours to stop nor to keep.
    if [ "$round" = 2 ]; then
        echo "$decoy" > "$TRIDENT_SLURM_DIR/run/slurmd-node3.pid"
        TRIDENT_SLURM_NODES=3 slurm/cluster/stop.sh > /dev/null 2>&1
        check "round $round: a stale pid file's process (pid $decoy) was left alone" kill -0 "$decoy"
    else
        slurm/cluster/stop.sh > /dev/null 2>&1
    fi
    left=$(daemons)
    check "round $round: stop.sh left no daemon of ours running${left:+ (left: $left)}" test -z "$left"
    check "round $round: no pid file left" test -z "$(pidfiles)"
done
slurm/cluster/stop.sh > /dev/null 2>&1
check "stop.sh on a stopped cluster succeeds" test $? -eq 0
rm -f "/tmp/trident-slurm-cluster-$$.log"
echo "slurm_cluster: $fails failed"
[ "$fails" -eq 0 ]
