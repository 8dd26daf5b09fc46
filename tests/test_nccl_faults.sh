#!/usr/bin/env bash
# NCCL's faults (docs/reliability.md, "NCCL"), played by the emulated NCCL
# (kernels/emu/nccl.h, TRIDENT_EMU_NCCL_FAULT) in a 2-rank dp run with
# backend cuda and topology.comm nccl:
#   - an asynchronous error (ncclRemoteError after rank 1's first all-reduce
#     was launched): the job ends with exit 1 at once, rank 1 naming the
#     communicator, NCCL's reason and the operation;
#   - a collective that never returns (rank 1's first all-reduce): the
#     watchdog ends the job (training.hang_timeout 3 s) and a rank names
#     the NCCL operation and its group, which under NCCL the open wait
#     cannot (either rank may fire first: both wait);
#   - a rank that never finishes NCCL's initialisation: the watchdog, which
#     now starts before start-up, names it (before the first step).
. "$(dirname "$0")/e2e.sh"

ok() { # what, condition...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

# fault NAME FAULT: the run's log in $out/NAME.log, its exit status in $rc,
# its duration in $took.
fault() {
    local t0=$SECONDS
    TRIDENT_EMU_NCCL_FAULT=$2 timeout 120 mpiexec -n 2 "$TRIDENT" train configs/tiny.yaml \
        --set backend=cuda --set topology.comm=nccl --set topology.dp=2 --set checkpoint.dir= \
        --set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32 \
        --set training.global_batch=2 --set training.micro_batch=1 --set training.steps=3 \
        --set data.val_every=0 --set run.log_every=1 --set training.hang_timeout=3 \
        --set run.dir="$out/$1" > "$out/$1.log" 2>&1
    rc=$? took=$((SECONDS - t0))
}
# has NAME REGEX: the log has a line matching REGEX
has() { grep -qE "$2" "$out/$1.log" || { echo "     not in $1.log: $2"; tail -n 8 "$out/$1.log" | sed 's/^/     | /'; return 1; }; }

fault error error:ncclAllReduce:1:1
ok "asynchronous error: exit $rc (want 1), within ${took} s" test "$rc" -eq 1
ok "asynchronous error: the emulated NCCL played it" has error "emu: ncclAllReduce: fault: an asynchronous error"
ok "asynchronous error: rank 1 names the communicator, the reason and the operation" has error \
    "NCCL reports an asynchronous error on group [a-z]+ \(ranks 0,1\): remote process exited or there was a network error \(emulated NCCL\); its last operation: all-reduce"

fault hang hang:ncclAllReduce:1:1
ok "hung collective: the job ends with an error (exit $rc; 124 = the test's timeout)" \
    test "$rc" -ne 0 -a "$rc" -ne 124
ok "hung collective: the emulated NCCL played it" has hang "emu: ncclAllReduce: fault: hangs until ncclCommAbort"
ok "hung collective: the watchdog fired" has hang "rank [01]: no progress for [0-9]+ s"
ok "hung collective: the watchdog names the NCCL operation and its group" has hang \
    "rank [01]: NCCL all-reduce on group [a-z]+ \(ranks 0,1\) has not returned"

fault init hang:ncclCommInitRank:1:1
ok "NCCL initialisation that never ends: the job ends with an error (exit $rc)" \
    test "$rc" -ne 0 -a "$rc" -ne 124
ok "NCCL initialisation: the emulated NCCL played it" has init "emu: ncclCommInitRank: fault: never returns"
ok "NCCL initialisation: the watchdog covers start-up and names it" has init \
    "rank [01]: no progress for [0-9]+ s in NCCL initialisation on group world \(ranks 0,1\) before the first step"

[ "$fails" -eq 0 ] && echo "nccl_faults: all checks passed"
exit $((fails > 0))
