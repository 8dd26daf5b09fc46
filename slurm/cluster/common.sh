# common.sh — sourced by start.sh and stop.sh: where the local
# test cluster keeps its state, and how to tell our daemons from others.
#
# Everything lives under $TRIDENT_SLURM_DIR (default /tmp/trident-slurm):
#   etc/slurm.conf      the cluster's config (clients: export SLURM_CONF=...)
#   munge/, munge-key/  a private munged: its socket, log, pid; its key
#   ctld/               slurmctld state; spool/<node>/ slurmd spool
#   run/                pid files of the daemons this script started
#   log/                slurmctld.log, slurmd-node1.log, slurmd-node2.log
# Ports default to 16817 (slurmctld) and 16818.. (one per node), away from
# Slurm's defaults (6817/6818) so a real Slurm on the same host is untouched.

TRIDENT_SLURM_DIR=${TRIDENT_SLURM_DIR:-/tmp/trident-slurm}
TRIDENT_SLURM_PORT=${TRIDENT_SLURM_PORT:-16817}
TRIDENT_SLURM_NODES=${TRIDENT_SLURM_NODES:-2}
TRIDENT_SLURM_CPUS=${TRIDENT_SLURM_CPUS:-4}     # CPUs declared per node (config_overrides)

ts_conf=$TRIDENT_SLURM_DIR/etc/slurm.conf
ts_munge_socket=$TRIDENT_SLURM_DIR/munge/munge.socket
ts_run=$TRIDENT_SLURM_DIR/run

ts_log() { echo "slurm-cluster: $*"; }

ts_nodes() { # node1 node2 ...
    local i
    for ((i = 1; i <= TRIDENT_SLURM_NODES; i++)); do echo "node$i"; done
}

# The pid in run/NAME.pid when that process is alive and is the daemon we
# started (its command line names our state directory); else nothing.  A
# stale pid file, or a pid reused by another process, is never ours.
ts_pid() { # name: munged | slurmctld | slurmd-node1 ...
    local f=$ts_run/$1.pid pid
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$TRIDENT_SLURM_DIR" || return 1
    echo "$pid"
}

# One start.sh or stop.sh at a time per state directory (tests may run in
# parallel); the lock goes with the file descriptor when the script exits.
ts_lock() {
    mkdir -p "$TRIDENT_SLURM_DIR"
    exec 9>"$TRIDENT_SLURM_DIR/.lock"
    flock 9
}

# Whether slurmctld answers on our config.
ts_ctld_up() {
    SLURM_CONF=$ts_conf scontrol ping 2>/dev/null | grep -q "is UP"
}
