#!/usr/bin/env bash
# Checkpoint faults (issue 17, "nothing lost, nothing silent"), each one
# reproduced with tiny runs and checked by exit code, message and files:
#   - a diverging run (training.lr=1e6, checkpoint.every=1) stops before the
#     update that would make the weights NaN, once on 2 ranks, and every
#     published step verifies; an update that overflows the weights with a
#     finite loss (lr 3e38, weight_decay 100; published step 1 with 2 M Infs
#     before) is refused by the save; training.nonfinite: skip drops updates
#     and stops after training.max_skipped in a row;
#   - a flipped bit in index.h5's training state (seed, sampler_position,
#     adam_t): exit 2 naming the file and the attribute; `ckpt verify` exit 1;
#   - the resume says what it resumes; at or past training.steps it exits 0;
#   - resume auto without `latest`: the newest complete step, steps it did
#     not write kept; none complete: exit 2 listing them;
#   - hyper-parameters, run.seed, data.path compared (checkpoint.allow_changes);
#   - `ckpt verify` / `inspect --verify` on a good and a corrupted checkpoint,
#     and on one holding a NaN with consistent checksums; plain `inspect`
#     says 'not verified';
#   - a full disk (tmpfs) during a save on 1 and 2 ranks: exit 1 with the path,
#     once, no crash, latest on the previous step.
. "$(dirname "$0")/e2e.sh"

small=(--set model.layers=2 --set model.hidden=64 --set model.seq_len=32 --set training.steps=4
       --set data.val_every=0 --set data.val_sequences=8 --set run.log_every=1)

# t NAME RANKS [--set ...]: train into $out/NAME with checkpoints in
# $out/NAME.ckpt (unless the arguments name another); exit status in $rc.
t() {
    local name=$1 n=$2; shift 2
    timeout 300 mpiexec -n "$n" "$TRIDENT" train configs/tiny.yaml "${small[@]}" \
        --set run.dir="$out/$name" --set checkpoint.dir="$out/$name.ckpt" "$@" \
        > "$out/$name.log" 2>&1
    rc=$?
}

# ok WHAT CONDITION...: count a failure when the command fails.
ok() {
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}
has() { grep -q -- "$2" "$out/$1.log"; }
latest_is() { [ "$(cat "$1/latest" 2>/dev/null)" = "$2" ]; }
# Two ranks printing at once can share a line: count occurrences, not lines.
errors_once() { [ "$(grep -o 'trident: error' "$out/$1.log" | wc -l)" -eq 1 ]; }
show() { echo "     $(grep -m1 -- "$2" "$out/$1.log" | cut -c1-170)"; }

# 1. Non-finite values.  The reproducer: loss and weights blow up, and a
# NaN used to reach a published checkpoint.  Two ranks (dp 2).
dp2=(--set topology.dp=2 --set training.micro_batch=4)
t diverge 2 "${dp2[@]}" --set training.lr=1e6 --set checkpoint.every=1
ok "diverging run: exit 1 ($rc) before the update, naming step and value" \
    bash -c "[ $rc -eq 1 ] && grep -q 'step [0-9]*: loss is .*not finite.*stopped before the update' '$out/diverge.log'"
show diverge "trident: error"
ok "diverging run: the error is printed once on 2 ranks" errors_once diverge
verified=0 published=0
for d in "$out"/diverge.ckpt/step_*; do
    published=$((published + 1))
    "$TRIDENT" ckpt verify "$d" > "$out/v.log" 2>&1 && grep -q verified "$out/v.log" \
        && verified=$((verified + 1))
done
ok "diverging run: all $published published steps verify (finite values)" \
    test "$published" -gt 0 -a "$verified" -eq "$published"

# An update that overflows the weights while the step's loss and gradient
# norm are finite: the save finds the Inf/NaN and refuses to publish.
t overflow 1 --set training.lr=3e38 --set training.weight_decay=100 --set training.min_lr=0 \
    --set training.warmup_steps=0 --set checkpoint.every=1
ok "weights overflowed by the update: the save refuses (exit $rc), naming the tensor" \
    bash -c "[ $rc -eq 1 ] && grep -q \"\\(step_00000001.tmp/stage_0.h5\\|step 1\\): tensor 'embed.wte.weight' (params) holds [0-9]* non-finite values.*not published\" '$out/overflow.log'"
show overflow "trident: error"
ok "weights overflowed: nothing published, no latest, no .tmp" \
    bash -c "[ -z \"\$(ls '$out/overflow.ckpt')\" ]"

t skip 1 --set training.lr=1e6 --set training.nonfinite=skip --set training.max_skipped=3 \
    --set training.steps=12
skips=$(grep -c "update skipped" "$out/skip.log")
ok "nonfinite skip: 3 updates skipped, then exit 1 ($rc) naming max_skipped" \
    bash -c "[ $rc -eq 1 ] && [ $skips -eq 3 ] && grep -q '3 steps in a row' '$out/skip.log'"
show skip "update skipped"
# The skipped steps' NaN loss is recorded as JSON null: every line parses.
ok "nonfinite skip: metrics.jsonl stays JSON (null for the NaN loss)" \
    python3 -c 'import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert any(r["loss"] is None for r in rows), rows' "$out/skip/metrics.jsonl"

# 2. The training state in index.h5: a flipped bit in run.seed's value.
t base 1 --set run.seed=987654321 --set checkpoint.every=2 --set checkpoint.keep=5
ok "base run" test "$rc" -eq 0
cp -r "$out/base.ckpt" "$out/flip.ckpt"
python3 - "$out/flip.ckpt/step_00000004/index.h5" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
i = b.find(struct.pack("<Q", 987654321)); assert i > 0 and b.find(struct.pack("<Q", 987654321), i + 1) < 0
b[i] ^= 0x10; open(p, "wb").write(b)
PY
t flip 1 --set run.seed=987654321 --set training.steps=6
ok "flipped bit in /state/seed: exit 2 ($rc) naming index.h5 and the attribute" \
    bash -c "[ $rc -eq 2 ] && grep -q \"flip.ckpt/step_00000004/index.h5: attribute '/state/seed' does not match its checksum\" '$out/flip.log'"
"$TRIDENT" ckpt verify "$out/flip.ckpt/step_00000004" > "$out/vflip.log" 2>&1
ok "ckpt verify of the flipped index: exit 1 ($?)" bash -c "[ $? -eq 1 ]"

# The issue's own reproducers: one flipped bit of sampler_position (used to
# resume on other data without a word) and one flipped byte of adam_t (used
# to be read as a huge count, NaN a step later), each changed with h5py.
flip_attr() { # CKPT_STEP_DIR ATTRIBUTE XOR_MASK
    /usr/bin/python3 - "$1/index.h5" "$2" "$3" <<'PY'
import sys, h5py, numpy as np
path, name, mask = sys.argv[1], sys.argv[2], int(sys.argv[3], 0)
with h5py.File(path, "r+") as f:
    a = f["state"].attrs
    v = a[name]
    a.modify(name, np.array(v ^ np.array(mask, dtype=v.dtype), dtype=v.dtype))
PY
}
for attr in "sampler_position 0x1" "adam_t 0x7f00000000000000"; do
    set -- $attr
    rm -rf "$out/flip_$1.ckpt"; cp -r "$out/base.ckpt" "$out/flip_$1.ckpt"
    flip_attr "$out/flip_$1.ckpt/step_00000004" "$1" "$2"
    t "flip_$1" 1 --set run.seed=987654321 --set training.steps=6 \
        --set checkpoint.resume="$out/flip_$1.ckpt"
    ok "flipped $1 in index.h5: exit 2 ($rc) naming the attribute, nothing trained" \
        bash -c "[ $rc -eq 2 ] && grep -q \"attribute '/state/$1' does not match its checksum\" '$out/flip_$1.log' && ! grep -q '^step ' '$out/flip_$1.log'"
    show "flip_$1" "trident: error"
done

# 3. What a resume says; nothing to train.
cp -r "$out/base.ckpt" "$out/more.ckpt"
t more 1 --set run.seed=987654321 --set training.steps=5
ok "resume prints step, sample position, tokens seen" \
    has more "resumed from .*step_00000004: step 4, sample position 32, tokens seen 1024"
t done 1 --set run.seed=987654321 --set checkpoint.dir="$out/base.ckpt"
ok "checkpoint at training.steps: exit 0 ($rc), nothing to train" \
    bash -c "[ $rc -eq 0 ] && grep -q 'checkpoint at step 4 >= training.steps 4: nothing to train' '$out/done.log'"

# 4. resume auto without latest: step 4 is incomplete, step 2 is taken;
# the steps this job did not write are kept, whatever checkpoint.keep says.
cp -r "$out/base.ckpt" "$out/nolatest.ckpt"
rm "$out/nolatest.ckpt/latest" "$out/nolatest.ckpt/step_00000004/stage_0.h5"
mkdir "$out/nolatest.ckpt/step_00000006.tmp"
t nolatest 1 --set run.seed=987654321 --set training.steps=6 --set checkpoint.every=2 \
    --set checkpoint.keep=1
ok "no latest: resumes from step 2, saying why not step 4" \
    bash -c "[ $rc -eq 0 ] && grep -q 'latest is missing: resuming from .*step_00000002; skipped: step_00000004' '$out/nolatest.log' && grep -q 'resumed from .*step_00000002' '$out/nolatest.log'"
ok "no latest: foreign steps kept (step_2, step_4.kept), latest step 6" \
    bash -c "[ -d '$out/nolatest.ckpt/step_00000002' ] && [ -d '$out/nolatest.ckpt/step_00000004.kept' ] && [ ! -e '$out/nolatest.ckpt/step_00000004' ] && [ \"\$(cat '$out/nolatest.ckpt/latest')\" = step_00000006 ]"
mkdir -p "$out/broken.ckpt/step_00000003"
echo garbage > "$out/broken.ckpt/step_00000003/index.h5"
t broken 1
ok "no latest and nothing complete: exit 2 ($rc) saying what it found, nothing written" \
    bash -c "[ $rc -eq 2 ] && grep -q 'no step directory there is a complete checkpoint: step_00000003' '$out/broken.log' && [ ! -e '$out/broken.ckpt/latest' ]"

# 5. Hyper-parameters and run identity at resume (base: step 4 of 6).
resume=(--set run.seed=987654321 --set training.steps=6 --set checkpoint.resume="$out/base.ckpt")
t heads 2 "${dp2[@]}" "${resume[@]}" --set model.heads=2
ok "model.heads changed (same shapes), 2 ranks: exit 2 ($rc) naming both values" \
    bash -c "[ $rc -eq 2 ] && grep -q 'model.heads is 4 in the checkpoint, 2 in the config' '$out/heads.log'"
ok "model.heads changed: the error is printed once on 2 ranks" errors_once heads
t theta 1 "${resume[@]}" --set model.rope_theta=500000
ok "model.rope_theta changed: exit 2 ($rc)" \
    bash -c "[ $rc -eq 2 ] && grep -q 'model.rope_theta is 10000 in the checkpoint, 500000 in the config' '$out/theta.log'"
t seed 1 "${resume[@]}" --set run.seed=5
ok "run.seed changed: exit 2 ($rc)" \
    bash -c "[ $rc -eq 2 ] && grep -q 'run.seed is 987654321 in the checkpoint, 5 in the config' '$out/seed.log'"
t data 1 "${resume[@]}" --set data.path=data/brown/gpt2_val
ok "data.path changed: exit 2 ($rc)" \
    bash -c "[ $rc -eq 2 ] && grep -q \"data.path is 'data/brown/gpt2' in the checkpoint, 'data/brown/gpt2_val'\" '$out/data.log'"
t allowed 1 "${resume[@]}" --set run.seed=5 --set data.path=data/brown/gpt2_val \
    --set checkpoint.allow_changes=seed,data
ok "both allowed by checkpoint.allow_changes: exit 0 ($rc) with two warnings" \
    bash -c "[ $rc -eq 0 ] && [ \$(grep -c 'warning: .*changed from' '$out/allowed.log') -eq 2 ]"

# 6. ckpt verify and inspect.
good="$out/base.ckpt/step_00000004"
"$TRIDENT" ckpt verify "$good" > "$out/vgood.log" 2>&1
ok "ckpt verify of a good checkpoint: exit 0 ($?), verified" \
    bash -c "[ $? -eq 0 ] && grep -q ': verified: step 4' '$out/vgood.log'"
"$TRIDENT" ckpt inspect "$good" > "$out/inspect.log" 2>&1
ok "ckpt inspect says 'not verified'" grep -q "^data: not verified" "$out/inspect.log"
cp -r "$good" "$out/corrupt"
python3 - "$out/corrupt/stage_0.h5" <<'PY'
import os, sys
p = sys.argv[1]; n = os.path.getsize(p)
with open(p, "r+b") as f:
    f.seek(n // 2); b = f.read(16); f.seek(n // 2); f.write(bytes(x ^ 0x01 for x in b))
PY
"$TRIDENT" ckpt verify "$out/corrupt" > "$out/vbad.log" 2>&1
ok "ckpt verify of a corrupted stage file: exit 1 ($?) naming file and tensor" \
    bash -c "[ $? -eq 1 ] && grep -q \"corrupt/stage_0.h5: tensor '.*checksum mismatch\" '$out/vbad.log'"
echo "     $(head -c 170 "$out/vbad.log")"
"$TRIDENT" ckpt inspect "$out/corrupt" > "$out/iplain.log" 2>&1
ok "plain ckpt inspect of it: exit 0 ($?) and it says 'not verified', never 'verified'" \
    bash -c "[ $? -eq 0 ] && grep -q '^data: not verified' '$out/iplain.log' && ! grep -q '^data: verified' '$out/iplain.log'"
"$TRIDENT" ckpt inspect "$out/corrupt" --verify > "$out/ibad.log" 2>&1
ok "ckpt inspect --verify of it: exit 1 ($?), NOT VERIFIED" \
    bash -c "[ $? -eq 1 ] && grep -q 'NOT VERIFIED' '$out/ibad.log'"

# A NaN that a checksum does not catch (written with h5py, its block
# checksum recomputed as docs/checkpoint.md computes it): verify and
# inspect --verify exit 1 naming the tensor.
cp -r "$good" "$out/nan"
/usr/bin/python3 - "$out/nan" <<'PY'   # Debian's, with h5py (scripts/install_deps.sh)
import sys, h5py, numpy as np
ckpt, name = sys.argv[1], "layers.0.attn.qkv.weight"
with h5py.File(f"{ckpt}/index.h5") as ix:
    where = {(r["name"].decode(), r["kind"].decode()): r["file"].decode() for r in ix["tensors"][...]}
def fmix64(h):
    for s, m in ((33, 0xff51afd7ed558ccd), (33, 0xc4ceb9fe1a85ec53), (33, None)):
        h ^= h >> np.uint64(s)
        if m: h *= np.uint64(m)
    return h
with h5py.File(f"{ckpt}/{where[name, 'params']}", "r+") as f:
    ds = f[f"params/{name}"]
    w = ds[...]
    w.reshape(-1)[5] = np.nan
    ds[...] = w
    a = w.reshape(len(w), -1)
    g = np.arange(a.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = fmix64((g * np.uint64(0x9E3779B97F4A7C15)) ^ a.reshape(-1).view(np.uint32).astype(np.uint64))
    rows = h.reshape(a.shape).sum(axis=1, dtype=np.uint64)
    R = int(ds.attrs["checksum_rows"])
    sums = [rows[b * R:(b + 1) * R].sum(dtype=np.uint64) for b in range(len(ds.attrs["checksum"]))]
    ds.attrs.modify("checksum", np.array(sums, dtype=np.uint64))
PY
"$TRIDENT" ckpt verify "$out/nan" > "$out/vnan.log" 2>&1
ok "ckpt verify of a checkpoint holding a NaN (checksums consistent): exit 1 ($?) naming the tensor" \
    bash -c "[ $? -eq 1 ] && grep -q \"tensor 'layers.0.attn.qkv.weight' .*holds 1 non-finite values (the first at flat element 5)\" '$out/vnan.log'"
show vnan "trident: error"
"$TRIDENT" ckpt inspect "$out/nan" --verify > "$out/inan.log" 2>&1
ok "ckpt inspect --verify of it: exit 1 ($?), NOT VERIFIED" \
    bash -c "[ $? -eq 1 ] && grep -q 'NOT VERIFIED' '$out/inan.log'"

# 7. Disk full during a save on 2 ranks: a 50 MiB tmpfs holds the step-2
# checkpoint (38 MiB), not the step-4 one.
mnt="$out/full"
mkdir -p "$mnt"
if mount -t tmpfs -o size=50M tmpfs "$mnt" 2>/dev/null; then
    trap 'umount "$mnt" 2>/dev/null; rm -rf "$out"' EXIT
    # One rank (HDF5 used to crash in MPI_Finalize on the file it could
    # not close), then two.
    for n in 1 2; do
        rm -rf "$mnt/ckpt"
        if [ "$n" = 1 ]; then t full$n 1 --set checkpoint.every=2 --set checkpoint.dir="$mnt/ckpt"
        else t full$n 2 "${dp2[@]}" --set checkpoint.every=2 --set checkpoint.dir="$mnt/ckpt"; fi
        ok "disk full, $n rank(s): exit 1 ($rc) with the path, no crash" \
            bash -c "[ $rc -eq 1 ] && grep -q 'error: .*/step_00000004.tmp/stage_0.h5: cannot write' '$out/full$n.log' && grep -q 'No space left on device' '$out/full$n.log' && ! grep -qi 'segmentation\|signal 11' '$out/full$n.log'"
        ok "disk full, $n rank(s): one error message" errors_once full$n
        show full$n "trident: error"
        ok "disk full, $n rank(s): latest still step_00000002, which verifies; no .tmp left" \
            bash -c "[ \"\$(cat '$mnt/ckpt/latest')\" = step_00000002 ] && ! compgen -G '$mnt/ckpt/*.tmp' >/dev/null && '$TRIDENT' ckpt verify '$mnt/ckpt' >/dev/null"
    done
    umount "$mnt"
else
    # Not a pass: the disk-full faults need root to mount a tmpfs.
    echo "FAIL: disk full not tested: cannot mount a tmpfs (run the suite as root)"
    fails=$((fails + 1))
fi

echo "ckpt_faults: $fails failed"
[ "$fails" -eq 0 ]
