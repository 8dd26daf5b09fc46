#!/usr/bin/env bash
# start.sh — a real Slurm cluster on this one machine, for tests and demos:
# a private munged, slurmctld and one slurmd per node name (node1, node2),
# all running as root on 127.0.0.1, no systemd needed.  Idempotent: a daemon
# that is already running (ours, by pid file) is left alone.  Installs
# Debian's slurm-wlm and munge when they are missing.
#
#   slurm/cluster/start.sh            # then: export SLURM_CONF=/tmp/trident-slurm/etc/slurm.conf
#   slurm/cluster/stop.sh             # stops only what start.sh started
#
# Environment: TRIDENT_SLURM_DIR (state, default /tmp/trident-slurm),
# TRIDENT_SLURM_PORT (slurmctld port, default 16817; nodes use the next ones),
# TRIDENT_SLURM_NODES (default 2), TRIDENT_SLURM_CPUS (CPUs per node, default 4).
# Facts this relies on (Debian 12, Slurm 22.05): `slurmd -N NAME` runs the
# daemon of one node name; each node needs its own Port, and per-node
# (%n) pid file, spool directory and log, or the second slurmd kills the
# first; SlurmdParameters=config_overrides lets a node declare more CPUs than
# the machine has; proctrack/linuxproc and task/none need no cgroups.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"

install_packages() {
    local missing=() c
    for c in munged:munge slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client; do
        command -v "${c%%:*}" >/dev/null || missing+=("${c#*:}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || { ts_log "need root to install ${missing[*]}" >&2; exit 1; }
    ts_log "installing ${missing[*]}"
    apt-get update -qq
    # policy-rc.d may refuse to start Debian's own services; we start ours.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
}

make_dirs() {
    local d
    mkdir -p "$TRIDENT_SLURM_DIR"/{etc,munge,munge-key,ctld,run,log}
    for d in $(ts_nodes); do mkdir -p "$TRIDENT_SLURM_DIR/spool/$d"; done
    # munged checks permissions: the socket's directory must be searchable
    # by everyone, the key readable by its owner only.
    chmod 755 "$TRIDENT_SLURM_DIR" "$TRIDENT_SLURM_DIR/munge"
    chmod 700 "$TRIDENT_SLURM_DIR/munge-key"
    local key=$TRIDENT_SLURM_DIR/munge-key/munge.key
    if [ ! -s "$key" ]; then
        dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
        chmod 600 "$key"
    fi
}

write_conf() {
    local host tmp n=0 d
    host=$(hostname -s)
    tmp=$(mktemp "$ts_conf.XXXX")
    cat > "$tmp" <<EOF
# Written by slurm/cluster/start.sh: a local test cluster, $TRIDENT_SLURM_NODES nodes on one host.
ClusterName=trident
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$TRIDENT_SLURM_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: also how long a requeued job waits before it may start again
# (default 120 s); short here so that the preemption test takes seconds.
AuthInfo=socket=$ts_munge_socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$TRIDENT_SLURM_DIR/ctld
SlurmctldPidFile=$ts_run/slurmctld.pid
SlurmctldLogFile=$TRIDENT_SLURM_DIR/log/slurmctld.log
# Per node (%n), or the second slurmd would take over the first one's files.
SlurmdPidFile=$ts_run/slurmd-%n.pid
SlurmdSpoolDir=$TRIDENT_SLURM_DIR/spool/%n
SlurmdLogFile=$TRIDENT_SLURM_DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmi2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# A task that dies takes its step down at once (no MPI hang until the time limit).
KillOnBadExit=1
KillWait=5
ReturnToService=2
JobRequeue=1
MinJobAge=600
MailProg=/bin/true
InactiveLimit=0
# Generous: 8 busy-polling MPI ranks on 2 cores can starve slurmd for tens
# of seconds, and a node marked DOWN for that requeues a healthy job.
SlurmdTimeout=300
SlurmctldTimeout=30
MessageTimeout=60
SlurmctldDebug=info
SlurmdDebug=info
EOF
    for d in $(ts_nodes); do
        n=$((n + 1))
        echo "NodeName=$d NodeHostname=$host NodeAddr=127.0.0.1 Port=$((TRIDENT_SLURM_PORT + n)) CPUs=$TRIDENT_SLURM_CPUS State=UNKNOWN" >> "$tmp"
    done
    echo "PartitionName=debug Nodes=node[1-$TRIDENT_SLURM_NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >> "$tmp"
    # Rewrite only on a change: running daemons keep the file they read.
    if [ -f "$ts_conf" ] && cmp -s "$tmp" "$ts_conf"; then rm -f "$tmp"; else mv "$tmp" "$ts_conf"; fi
    chmod 644 "$ts_conf"
}

start_munged() {
    ts_pid munged >/dev/null && return 0
    munged --socket="$ts_munge_socket" --key-file="$TRIDENT_SLURM_DIR/munge-key/munge.key" \
        --log-file="$TRIDENT_SLURM_DIR/log/munged.log" --pid-file="$ts_run/munged.pid" \
        --seed-file="$TRIDENT_SLURM_DIR/munge/munged.seed" 9>&-
    ts_log "munged started (pid $(cat "$ts_run/munged.pid"))"
}

start_slurmctld() {
    ts_pid slurmctld >/dev/null && return 0
    # -c: start without the saved jobs of an earlier run of this cluster.
    slurmctld -c -f "$ts_conf" 9>&-   # the daemons must not hold our lock
    wait_for "slurmctld to answer" ts_ctld_up
    ts_log "slurmctld started (pid $(cat "$ts_run/slurmctld.pid"), port $TRIDENT_SLURM_PORT)"
}

start_slurmd() { # node
    ts_pid "slurmd-$1" >/dev/null && return 0
    slurmd -N "$1" -f "$ts_conf" 9>&-
    wait_for "slurmd $1 to write its pid file" ts_pid "slurmd-$1"
    ts_log "slurmd $1 started (pid $(ts_pid "slurmd-$1"))"
}

wait_for() { # what, command...
    local what=$1 i; shift
    for ((i = 0; i < 300; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    ts_log "timed out waiting for $what; logs in $TRIDENT_SLURM_DIR/log" >&2
    exit 1
}

nodes_idle() {
    local n
    n=$(SLURM_CONF=$ts_conf sinfo -h -N -o '%N %t' | grep -cE ' (idle|mix|alloc)$' || true)
    [ "$n" -eq "$TRIDENT_SLURM_NODES" ]
}

[ "$(id -u)" -eq 0 ] || { ts_log "run as root (the daemons run as root)" >&2; exit 1; }
install_packages
ts_lock
make_dirs
write_conf
start_munged
start_slurmctld
for node in $(ts_nodes); do start_slurmd "$node"; done
wait_for "all nodes to be idle" nodes_idle
ts_log "up: $(SLURM_CONF=$ts_conf sinfo -h -o '%P %D nodes %t %N' | tr '\n' ' ')"
echo "export SLURM_CONF=$ts_conf"
