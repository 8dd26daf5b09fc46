#!/usr/bin/env bash
# Checkpoints by default (issue 35): a config with no checkpoint section
# saves into <run.dir>/ckpt (checkpoint.dir auto, checkpoint.every auto:
# by time, and at the end), says so at start, records `every: auto` in the
# resolved config, and a second run with more steps resumes from it (with
# a note that the LR schedule is recomputed over the new training.steps).
. "$(dirname "$0")/e2e.sh"

# configs/tiny.yaml without its checkpoint section: every key at its default.
sed '/^checkpoint:/,/^$/d' configs/tiny.yaml > "$out/nockpt.yaml"
grep -q "^checkpoint:" "$out/nockpt.yaml" && { echo "FAIL: the checkpoint section is still there"; exit 1; }
small=(--set model.layers=2 --set model.hidden=32 --set model.heads=2 --set model.seq_len=16
       --set training.global_batch=2 --set training.micro_batch=1 --set data.val_every=0
       --set data.val_sequences=1 --set run.log_every=100 --set run.dir="$out/run")

check() { # description, command...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

timeout 300 "$TRIDENT" train "$out/nockpt.yaml" "${small[@]}" --set training.steps=3 \
    > "$out/first.log" 2>&1 || { echo "FAIL: first run exited $?"; tail -20 "$out/first.log"; exit 1; }
check "start-up line names the default checkpoints" \
    grep -q "checkpoints: $out/run/ckpt every 30 min of training (checkpoint.every auto)" "$out/first.log"
check "saved at the end into <run.dir>/ckpt" test -e "$out/run/ckpt/latest"
check "step 3 saved" test -d "$out/run/ckpt/step_00000003"
check "resolved config says every: auto" grep -q "^  every: auto" "$out/run/config.yaml"
check "resolved config says dir: <run.dir>/ckpt" grep -q "^  dir: \"$out/run/ckpt\"" "$out/run/config.yaml"

timeout 300 "$TRIDENT" train "$out/nockpt.yaml" "${small[@]}" --set training.steps=5 \
    > "$out/second.log" 2>&1 || { echo "FAIL: second run exited $?"; tail -20 "$out/second.log"; exit 1; }
check "the second run resumes from step 3" grep -q "resumed from .*step_00000003" "$out/second.log"
# It had 3 steps, this one 5: the LR schedule changes shape, and says so.
check "raising training.steps on resume is said" \
    grep -q "note: training.steps 5, the checkpoint's run had 3: the learning-rate schedule is recomputed" "$out/second.log"

# checkpoint.dir "" still turns them off.
timeout 300 "$TRIDENT" train "$out/nockpt.yaml" "${small[@]}" --set training.steps=1 \
    --set run.dir="$out/off" --set checkpoint.dir= > "$out/off.log" 2>&1 \
    || { echo "FAIL: the run without checkpoints exited $?"; fails=$((fails + 1)); }
check "checkpoint.dir empty: none saved" test ! -e "$out/off/ckpt"

echo "ckpt_default: $fails failed"
[ "$fails" -eq 0 ]
