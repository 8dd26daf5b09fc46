#!/usr/bin/env bash
# Checkpoints in training (docs/design.md, invariant 2): a run killed after a
# checkpoint and resumed continues bit for bit (losses and weights); the
# 8-rank mesh tp 2 x pp 2 x dp 2 (zero 1) resumes bit for bit too; a
# checkpoint saved on one topology resumes on others (1 rank, tp 1 x pp 4 x
# dp 2, tp 4 x dp 2 with zero 2, 1 rank -> the 8-rank mesh, and to and
# from interleaved stages) within relative 1e-5; a corrupted file is refused with its name, exit 2, and the
# inspect tool lists the tensors.
RUN_CKPT=1
. "$(dirname "$0")/e2e.sh"

small=(--set model.layers=4 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=8 --set training.warmup_steps=2 --set training.lr=1e-3
       --set training.global_batch=8 --set training.micro_batch=1 --set data.val_every=0
       --set data.val_sequences=1 --set run.log_every=100 --set checkpoint.every=4)


compare() { curves "$1" "$2" --from 5 --to 8 --rtol "$3"; } # reference, name, tolerance

# Uninterrupted references; every=4 keeps step 4 and step 8.
run ref 1
run ref3d 8 --set topology.tp=2 --set topology.pp=2 --set topology.dp=2 --set topology.zero=1

# Killed after its step-4 checkpoint, then resumed (checkpoint.resume: auto).
timeout 300 "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set run.dir="$out/killed" \
    --set checkpoint.dir="$out/killed/ckpt" > "$out/killed1.log" 2>&1 &
job=$!
for _ in $(seq 1 6000); do [ -e "$out/killed/ckpt/latest" ] && break; sleep 0.05; done
# The trainer itself, not only `timeout`: an orphaned trainer would go on
# writing run.dir and checkpoint.dir beside the resumed run (whose run lock
# then refuses to start, docs/reliability.md).
kill -9 $(pgrep -P "$job") "$job" 2>/dev/null; wait "$job" 2>/dev/null
run killed 1
grep -q "resumed from .*step_00000004" "$out/killed.log" \
    || { echo "FAIL: the killed run did not resume from step 4"; fails=$((fails + 1)); }
compare ref killed 0
cmp -s "$out/ref.weights" "$out/killed.weights" && echo "ok   killed: final weights bit-identical" \
    || { echo "FAIL: killed: final weights differ"; fails=$((fails + 1)); }

# Same topology, 8 ranks: bit for bit.
run same3d 8 --set topology.tp=2 --set topology.pp=2 --set topology.dp=2 --set topology.zero=1 \
    --set checkpoint.resume="$out/ref3d/ckpt/step_00000004"
compare ref3d same3d 0

# Other topologies: the same curve within 1e-5.
from3d="$out/ref3d/ckpt/step_00000004"
run to1 1 --set checkpoint.resume="$from3d"
compare ref to1 1e-5
run to_pp4 8 --set topology.pp=4 --set topology.dp=2 --set checkpoint.resume="$from3d"
compare ref to_pp4 1e-5
run to_tp4 8 --set topology.tp=4 --set topology.dp=2 --set topology.zero=2 \
    --set checkpoint.resume="$from3d"
compare ref to_tp4 1e-5
run to3d 8 --set topology.tp=2 --set topology.pp=2 --set topology.dp=2 --set topology.zero=1 \
    --set checkpoint.resume="$out/ref/ckpt/step_00000004"
compare ref to3d 1e-5

# Interleaved stages (pp 2, 2 chunks a rank: rank 0 holds layers 0 and 2):
# from the mesh, bit for bit on the same layout, and back to one rank.
il=(--set topology.pp=2 --set topology.dp=2 --set topology.schedule=interleaved
    --set topology.virtual_stages=2)
run to_il 4 "${il[@]}" --set checkpoint.resume="$from3d"
compare ref to_il 1e-5
run il_ref 4 "${il[@]}"
run il_same 4 "${il[@]}" --set checkpoint.resume="$out/il_ref/ckpt/step_00000004"
compare il_ref il_same 0
run il_to1 1 --set checkpoint.resume="$out/il_ref/ckpt/step_00000004"
compare ref il_to1 1e-5

# A corrupted checkpoint: refused with the file named, exit 2, nothing written.
cp -r "$out/ref/ckpt/step_00000004" "$out/bad"
python3 - "$out/bad/stage_0.h5" <<'PY'
import os, sys
p = sys.argv[1]; n = os.path.getsize(p)
with open(p, "r+b") as f:          # flip bytes well inside the data, past the metadata
    f.seek(n // 2); b = f.read(64); f.seek(n // 2); f.write(bytes(x ^ 0x5A for x in b))
PY
timeout 120 "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set run.dir="$out/badrun" \
    --set checkpoint.dir="$out/badrun/ckpt" --set checkpoint.resume="$out/bad" > "$out/bad.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "stage_0.h5" "$out/bad.log" && [ ! -e "$out/badrun/ckpt/latest" ]; then
    echo "ok   corrupted checkpoint refused: $(grep -m1 error "$out/bad.log" | cut -c1-150)"
else
    echo "FAIL: corrupted checkpoint: exit $rc"; tail -3 "$out/bad.log"; fails=$((fails + 1))
fi

# A rank killed during a save: latest still names the previous checkpoint,
# which loads.  A wider model makes each save long enough to be caught with
# its step_X.tmp directory in place.
big=(--set model.hidden=256 --set checkpoint.every=1 --set training.steps=1000)
timeout 300 mpiexec -n 2 "$TRIDENT" train configs/tiny.yaml "${small[@]}" "${big[@]}" \
    --set topology.dp=2 --set run.dir="$out/midsave" --set checkpoint.dir="$out/midsave/ckpt" \
    > "$out/midsave1.log" 2>&1 &
job=$!
caught=""
for _ in $(seq 1 3000); do
    if [ -e "$out/midsave/ckpt/latest" ] && compgen -G "$out/midsave/ckpt/step_*.tmp" >/dev/null; then
        caught=$(cat "$out/midsave/ckpt/latest")
        for p in $(pgrep -f "run.dir=$out/midsave"); do
            tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'PMI_RANK=1' && kill -9 "$p"
        done
        break
    fi
    sleep 0.01
done
wait "$job" 2>/dev/null
latest=$(cat "$out/midsave/ckpt/latest" 2>/dev/null)
if [ -z "$caught" ]; then
    echo "FAIL: never saw a save in progress"; fails=$((fails + 1))
elif [ "$latest" != "$caught" ] || [ ! -d "$out/midsave/ckpt/$latest" ]; then
    echo "FAIL: killed mid-save: latest was $caught, is now '$latest'"; fails=$((fails + 1))
else
    timeout 300 mpiexec -n 2 "$TRIDENT" train configs/tiny.yaml "${small[@]}" "${big[@]}" \
        --set topology.dp=2 --set training.steps=$(( 10#${latest#step_} + 1 )) \
        --set run.dir="$out/midsave" --set checkpoint.dir="$out/midsave/ckpt" \
        > "$out/midsave2.log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q "resumed from .*$latest" "$out/midsave2.log"; then
        echo "ok   killed during the save after $latest: latest unchanged, it loads and training continues"
    else
        echo "FAIL: resume after a killed save: exit $rc"; tail -5 "$out/midsave2.log"; fails=$((fails + 1))
    fi
fi

# The inspect tool.
"$TRIDENT" ckpt inspect "$out/ref3d/ckpt/step_00000008" > "$out/inspect.txt" 2>&1 \
    && grep -q "layers.3.attn.qkv.weight" "$out/inspect.txt" \
    && echo "ok   ckpt inspect lists the tensors" \
    || { echo "FAIL: ckpt inspect"; head "$out/inspect.txt"; fails=$((fails + 1)); }

echo "ckpt_train: $fails failed"
[ "$fails" -eq 0 ]
