#!/usr/bin/env bash
# Asynchronous checkpoints (checkpoint.async, docs/checkpoint.md):
#   - the same runs with synchronous and asynchronous saves (1 rank; pp2 x dp2
#     ZeRO 1; dp2 ZeRO 3 in bf16) give checkpoints whose every dataset and
#     attribute are equal (h5py), and the same loss at every step;
#   - SIGUSR1 while a write is in flight: exit 75, the write in flight and
#     the step of the stop both published, no step_X.tmp left; the resumed
#     run ends with weights bit-identical to an uninterrupted run;
#   - kill -9 of the whole job while a write is in flight: latest on a
#     complete step; the resumed run ends bit-identical too;
#   - checkpoint.async: true where it cannot be kept (MPI without threads is
#     not reproducible here; a snapshot larger than RAM) exits 2.
# A rank killed during a write and a full disk during one are in
# test_ckpt_train.sh and test_ckpt_faults.sh, which run with the default
# (auto: asynchronous here).
. "$(dirname "$0")/e2e.sh"
PY=/usr/bin/python3

small=(--set model.layers=2 --set model.hidden=64 --set model.seq_len=32 --set training.steps=6
       --set data.val_every=0 --set data.val_sequences=8 --set run.log_every=1
       --set checkpoint.every=2 --set checkpoint.keep=10)

ok() {
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

# same_ckpt A B: every step directory of A and B, every dataset and
# attribute of every file, equal (HDF5 stores object times, so not cmp).
same_ckpt() {
    "$PY" - "$1" "$2" <<'PY'
import sys, os, h5py, numpy as np
a, b = sys.argv[1], sys.argv[2]
steps = sorted(d for d in os.listdir(a) if d.startswith("step_"))
if not steps or steps != sorted(d for d in os.listdir(b) if d.startswith("step_")):
    sys.exit(f"step directories differ: {steps} vs {sorted(os.listdir(b))}")
n = 0
def same(x, y, where):
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.array_equal(np.asarray(x), np.asarray(y))
    return x == y
for s in steps:
    files = sorted(f for f in os.listdir(f"{a}/{s}") if f.endswith(".h5"))
    for f in files:
        fa, fb = h5py.File(f"{a}/{s}/{f}", "r"), h5py.File(f"{b}/{s}/{f}", "r")
        items = []
        fa.visititems(lambda name, o: items.append(name))
        other = []
        fb.visititems(lambda name, o: other.append(name))
        if items != other:
            sys.exit(f"{s}/{f}: objects differ")
        for name in [""] + items:
            oa, ob = fa[name] if name else fa, fb[name] if name else fb
            if sorted(oa.attrs) != sorted(ob.attrs):
                sys.exit(f"{s}/{f}:{name}: attributes differ")
            for k in oa.attrs:
                x, y = oa.attrs[k], ob.attrs[k]
                if k == "config":  # the YAML text names checkpoint.async itself
                    drop = lambda t: [l for l in str(t).splitlines() if "async:" not in l]
                    x, y = drop(x), drop(y)
                if not same(x, y, name):
                    sys.exit(f"{s}/{f}:{name}: attribute {k} differs")
            if isinstance(oa, h5py.Dataset):
                if not np.array_equal(oa[()], ob[()]):
                    sys.exit(f"{s}/{f}:{name}: values differ")
                n += 1
print(f"{len(steps)} steps, {n} datasets equal")
PY
}

same_losses() {
    "$PY" - "$1" "$2" <<'PY'
import sys, json
def losses(p):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(p)) if "loss" in r]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
sys.exit(0 if a and a == b else f"loss curves differ: {a} vs {b}")
PY
}

# pair NAME RANKS [--set ...]: the run with synchronous, then asynchronous
# saves, in the same paths (the config text in the index names them).
pair() {
    local name=$1 n=$2; shift 2
    for mode in false true; do
        rm -rf "$out/$name"
        timeout 300 mpiexec -n "$n" "$TRIDENT" train configs/tiny.yaml "${small[@]}" \
            --set run.dir="$out/$name" --set checkpoint.dir="$out/$name/ckpt" \
            --set checkpoint.async=$mode "$@" > "$out/$name.$mode.log" 2>&1 \
            || { echo "FAIL: $name async=$mode exited $?"; tail -5 "$out/$name.$mode.log"; fails=$((fails + 1)); }
        mv "$out/$name" "$out/$name.$mode"
    done
    ok "$name: async saves say they ran in the background" \
        grep -q "step 4 saved to .* (in the background; training blocked" "$out/$name.true.log"
    ok "$name: checkpoints equal to synchronous saves ($(same_ckpt "$out/$name.false/ckpt" "$out/$name.true/ckpt" 2>&1))" \
        same_ckpt "$out/$name.false/ckpt" "$out/$name.true/ckpt"
    ok "$name: the loss curve equals the synchronous run's" \
        same_losses "$out/$name.false/metrics.jsonl" "$out/$name.true/metrics.jsonl"
}

pair one 1
ok "one: the memory table counts the snapshot" \
    grep -q "checkpoint snapshot [1-9]" "$out/one.true.log"
pair pp2dp2 4 --set topology.pp=2 --set topology.dp=2 --set topology.zero=1 --set training.micro_batch=2
pair bf16z3 2 --set topology.dp=2 --set topology.zero=3 --set training.precision=bf16 --set training.micro_batch=4

# The reference for the faults: 12 uninterrupted steps on 2 ranks.  A wider
# model makes each write long enough to be caught in flight.
wide=(--set model.hidden=256 --set topology.dp=2 --set training.micro_batch=4
      --set checkpoint.every=1 --set training.steps=12)
TRIDENT_DUMP_WEIGHTS="$out/ref.weights" timeout 300 mpiexec -n 2 "$TRIDENT" train configs/tiny.yaml \
    "${small[@]}" "${wide[@]}" --set run.dir="$out/ref" --set checkpoint.dir= > "$out/ref.log" 2>&1 \
    || { echo "FAIL: reference run"; fails=$((fails + 1)); }

# in_flight DIR: a step_X.tmp exists (a write is under way).
in_flight() { compgen -G "$1/step_*.tmp" > /dev/null; }

# ranks NAME: the pids of the job's ranks (they have PMI_RANK set).
ranks() {
    for p in $(pgrep -f "run.dir=$out/$1"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -q '^PMI_RANK=' && echo "$p"
    done
}

# fault NAME SIGNAL: start the wide run in its own process group, wait for
# a write in flight after the first published step, then send SIGUSR1 to
# the ranks (as Slurm's --signal does), or SIGKILL to the whole job.
fault() {
    local name=$1 sig=$2
    setsid timeout 300 mpiexec -n 2 "$TRIDENT" train configs/tiny.yaml "${small[@]}" "${wide[@]}" \
        --set run.dir="$out/$name" --set checkpoint.dir="$out/$name/ckpt" > "$out/$name.log" 2>&1 &
    local job=$! caught=0
    for _ in $(seq 1 6000); do
        if [ -e "$out/$name/ckpt/latest" ] && in_flight "$out/$name/ckpt"; then
            caught=1
            if [ "$sig" = 9 ]; then
                kill -9 -- -"$job" 2>/dev/null
            else
                kill -USR1 $(ranks "$name")
            fi
            break
        fi
        sleep 0.01
    done
    wait "$job" 2>/dev/null
    rc=$?
    [ "$caught" = 1 ] || { echo "FAIL: $name: never saw a write in flight"; fails=$((fails + 1)); }
}

# resume NAME: train to the end from NAME's checkpoint; final weights
# must equal the reference's.
resume() {
    local name=$1 from
    from=$(cat "$out/$name/ckpt/latest" 2>/dev/null)
    TRIDENT_DUMP_WEIGHTS="$out/$name.weights" timeout 300 mpiexec -n 2 "$TRIDENT" train \
        configs/tiny.yaml "${small[@]}" "${wide[@]}" --set run.dir="$out/$name" \
        --set checkpoint.dir="$out/$name/ckpt" > "$out/$name.resume.log" 2>&1
    ok "$name: resumed from $from to the end, weights bit-identical to an uninterrupted run" \
        bash -c "[ $? -eq 0 ] && cmp -s '$out/ref.weights' '$out/$name.weights'"
}

fault usr1 USR1
stop=$(sed -n 's/.*stopped after step \([0-9]*\) .*/\1/p' "$out/usr1.log" | head -1)
ok "SIGUSR1 during a write: exit 75 ($rc), stopped after step ${stop:-?}" \
    bash -c "[ $rc -eq 75 ] && [ -n '$stop' ]"
ok "SIGUSR1 during a write: latest is the stop step, every step up to it published, no .tmp" \
    bash -c "[ \"\$(cat '$out/usr1/ckpt/latest')\" = \"\$(printf 'step_%08d' '${stop:-0}')\" ] && ! compgen -G '$out/usr1/ckpt/*.tmp' > /dev/null && '$TRIDENT' ckpt verify '$out/usr1/ckpt' > /dev/null"
resume usr1

fault kill9 9
latest=$(cat "$out/kill9/ckpt/latest" 2>/dev/null)
ok "kill -9 of the job during a write: latest ($latest) names a complete step that verifies" \
    bash -c "[ -n '$latest' ] && '$TRIDENT' ckpt verify '$out/kill9/ckpt/$latest' > /dev/null"
resume kill9

# checkpoint.async: true is a promise: refused (exit 2), before anything is
# allocated, where the snapshot does not fit.  A model whose state takes
# 0.7 of this machine's RAM: its snapshot (12 of the 16 bytes a parameter)
# does not fit beside it.
ram=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
layers=$(( (ram * 7 / 10 / 16 - 105000000) / 50400000 ))
big=(--set model.hidden=2048 --set model.heads=16 --set model.kv_heads=16
     --set model.layers=$layers --set training.steps=1)
timeout 300 "$TRIDENT" train configs/tiny.yaml "${big[@]}" --set run.dir="$out/big" \
    --set checkpoint.dir="$out/big/ckpt" --set checkpoint.async=true > "$out/big.log" 2>&1
rc=$?
ok "checkpoint.async: true, $layers layers of 2048 (state 0.7 of RAM): exit 2 ($rc), the snapshot does not fit" \
    bash -c "[ $rc -eq 2 ] && grep -q 'checkpoint.async: true: the snapshot does not fit in RAM' '$out/big.log'"
grep -m1 "error" "$out/big.log" | cut -c1-240 | sed 's/^/     /'
"$TRIDENT" plan configs/tiny.yaml "${big[@]}" --set checkpoint.dir="$out/big/ckpt" > "$out/plan.log" 2>&1
ok "trident plan counts the snapshot in host memory" \
    grep -q "host memory per rank, beside the table: checkpoint snapshot [1-9]" "$out/plan.log"

echo "ckpt_async: $fails failed"
[ "$fails" -eq 0 ]
