# testing.sh — sourced by tests/test_slurm_*.sh: a private local cluster per
# test (its own state directory and ports, so tests never share or stop
# another's daemons), and waiting for a job without sbatch --wait's slow
# back-off.
#
#   slurm_test_cluster NAME PORT   start one under /tmp/trident-slurm-NAME-$$,
#                                  export SLURM_CONF; stopped and removed at exit
#   slurm_wait_job ID SECONDS      print the job's final state (COMPLETED,
#                                  FAILED, ...; TIMEOUT-WAITING if it took too long)

slurm_test_cluster() { # name, port
    [ "$(id -u)" -eq 0 ] || { echo "FAIL: the local Slurm cluster needs root"; exit 1; }
    export TRIDENT_SLURM_DIR=/tmp/trident-slurm-$1-$$ TRIDENT_SLURM_PORT=$2
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    SLURM_TEST_STOP="$root/stop.sh"
    # Chain with an EXIT trap set before (e2e.sh removes its directory).
    local prev
    prev=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
    # shellcheck disable=SC2064
    trap "slurm_test_cluster_stop; $prev" EXIT
    "$root/start.sh" > "/tmp/trident-slurm-$1-$$.start.log" 2>&1 \
        || { echo "FAIL: slurm/cluster/start.sh failed:"; cat "/tmp/trident-slurm-$1-$$.start.log"; exit 1; }
    rm -f "/tmp/trident-slurm-$1-$$.start.log"
    export SLURM_CONF=$TRIDENT_SLURM_DIR/etc/slurm.conf
}

slurm_test_cluster_stop() {
    "$SLURM_TEST_STOP" > /dev/null 2>&1 || echo "warning: stopping the test cluster failed"
    rm -rf "$TRIDENT_SLURM_DIR"
}

slurm_job_state() { # id
    scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'
}

slurm_wait_job() { # id, seconds
    local i st
    for ((i = 0; i < $2 * 4; i++)); do
        st=$(slurm_job_state "$1")
        case $st in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
            echo "$st"; return 0 ;;
        esac
        sleep 0.25
    done
    echo "TIMEOUT-WAITING($st)"
}
