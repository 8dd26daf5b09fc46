#!/usr/bin/env bash
# Asynchronous checkpoints in training (checkpoint.async, docs/checkpoint.md):
# the time a save blocks training, asynchronous against synchronous, and the
# step time while a write runs against a step without one, for GPT-2 124M
# shapes on the CPU (batch 4 x 64) with a checkpoint every few steps.
# Goals (issue 20): blocked time <= 0.10 of the synchronous save time; step
# time during a write within 10% of a step without one.
#   bench/ckpt_async.sh [--rounds N] [--steps N] [--every N]
# Env: BUILD (default build), DIR (scratch directory on the disk to
# measure, default .cache/bench_ckpt_async).  Rounds alternate synchronous
# and asynchronous runs; medians over all saves of a mode.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=${DIR:-.cache/bench_ckpt_async}
ROUNDS=2 STEPS=13 EVERY=4
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --every) EVERY="$2"; shift 2 ;;
        *) echo "bench/ckpt_async.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x "$BUILD/trident" ] || { echo "bench/ckpt_async.sh: no $BUILD/trident (set BUILD=)" >&2; exit 1; }
mkdir -p "$DIR"
model=(--set model.layers=12 --set model.hidden=768 --set model.heads=12 --set model.kv_heads=12
       --set model.seq_len=64 --set training.global_batch=4 --set training.micro_batch=4
       --set training.steps="$STEPS" --set data.val_every=0 --set run.log_every=1
       --set training.warmup_steps=1 --set checkpoint.every="$EVERY" --set checkpoint.keep=1)

echo "machine: $(nproc) cores; disk: $(df -h "$DIR" | awk 'NR==2 {print $1, $2}');" \
     "GPT-2 124M shapes, batch 4 x 64, $STEPS steps, a checkpoint every $EVERY; $ROUNDS rounds"
: > "$DIR/sync.txt"; : > "$DIR/async.txt"
for round in $(seq "$ROUNDS"); do
    for mode in false true; do
        rm -rf "$DIR/run"
        "$BUILD/trident" train configs/tiny.yaml "${model[@]}" --set run.dir="$DIR/run" \
            --set checkpoint.dir="$DIR/run/ckpt" --set checkpoint.async=$mode > "$DIR/run.log" 2>&1 \
            || { echo "bench/ckpt_async.sh: the run failed:"; tail -5 "$DIR/run.log"; exit 1; }
        # One record per save (the last one excluded: it waits for its
        # write, as the end of a run must): its cost to training, and the
        # step times of the steps during and after its write.
        /usr/bin/python3 - "$DIR/run.log" "$DIR/run/metrics.jsonl" "$mode" "$EVERY" \
            >> "$DIR/$([ $mode = true ] && echo async || echo sync).txt" <<'PY'
import sys, json, re
log, metrics, mode, every = sys.argv[1], sys.argv[2], sys.argv[3] == "true", int(sys.argv[4])
ms = {r["step"]: r["step_ms"] for r in map(json.loads, open(metrics)) if "step_ms" in r}
last = max(ms)
step = 0
during = {}      # save step -> the steps that ran while its write did
for line in open(log):
    m = re.match(r"step\s+(\d+)/", line)
    if m:
        step = int(m.group(1))
    m = re.match(r"checkpoint: step (\d+) saved to \S+ in ([0-9.]+) s(?: \(in the background; training blocked ([0-9.]+) s\))?", line)
    if m and int(m.group(1)) < last:
        s = int(m.group(1))
        write, blocked = float(m.group(2)), float(m.group(3) or m.group(2))
        # Async: steps s+1 .. step (the step at whose end it was found done).
        steps = list(range(s + 1, step + 1)) if mode else []
        clean = [k for k in range(step + 1, s + every) if k in ms] if mode else \
                [k for k in range(s + 1, s + every) if k in ms]
        print(json.dumps({"save": s, "write_s": write, "blocked_s": blocked,
                          "during_ms": [ms[k] for k in steps if k in ms],
                          "clean_ms": [ms[k] for k in clean]}))
PY
    done
done

/usr/bin/python3 - "$DIR/sync.txt" "$DIR/async.txt" <<'PY'
import sys, json, statistics as st
sync = [json.loads(l) for l in open(sys.argv[1])]
asy = [json.loads(l) for l in open(sys.argv[2])]
med = lambda xs: st.median(xs) if xs else float("nan")
save = med([r["blocked_s"] for r in sync])
blocked = med([r["blocked_s"] for r in asy])
write = med([r["write_s"] for r in asy])
during = med([x for r in asy for x in r["during_ms"]])
clean = med([x for r in asy for x in r["clean_ms"]] + [x for r in sync for x in r["clean_ms"]])
print(f"synchronous save: {save:.2f} s blocked ({len(sync)} saves)")
print(f"asynchronous save: {blocked:.3f} s blocked, written in {write:.2f} s in the background ({len(asy)} saves)")
print(f"blocked / synchronous save time: {blocked / save:.3f}  (goal <= 0.10)")
print(f"step during a write: {during:.0f} ms; without one: {clean:.0f} ms; ratio {during / clean:.2f}  (goal <= 1.10)")
PY
