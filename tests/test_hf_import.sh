#!/usr/bin/env bash
# `trident ckpt import --from hf` and `checkpoint.init_from` (issue 16):
#   - round trip: checkpoint (saved on tp 2 x pp 2 x dp 2) -> export --format hf ->
#     import -> checkpoint, every params tensor bit-identical in fp32
#     (tests/hf_import_check.py, h5py), for gpt2 and for llama with
#     grouped-query attention (sharded export); a bf16 run's master weights
#     through a bf16 export: imported exactly, re-exported byte for byte;
#     F16 safetensors (written by numpy) widened exactly to fp32;
#   - init_from: the first-step loss from an HF directory on 1 rank equals
#     the one from the source trident checkpoint exactly (and the weights
#     after the step bit for bit), and on tp 2, dp 2 with ZeRO-3 and pp 2
#     within 1e-5; a fresh run's differs; bf16 training from an fp32 export
#     of a bf16 run's master weights = from its checkpoint; a gpt2 with a
#     shorter seq_len takes the first rows of wpe; a mismatched model exits
#     2 naming both values; a resumed run ignores init_from; a config with no
#     model section takes the source's (config.json or the index);
#   - ckpt import's argument errors (exit 2); a full disk (exit 1, nothing
#     left behind);
#   - bad safetensors (crafted by a short python script): exit 2 naming the
#     file and the tensor, never a crash; NaN and Inf values in a tensor
#     copied a piece at a time and in one converted whole;
#   - the same import from a file system without O_DIRECT (a tmpfs).
. "$(dirname "$0")/e2e.sh"

py=/usr/bin/python3   # Debian's, with numpy and h5py (scripts/install_deps.sh)
"$py" -c 'import numpy, h5py' 2>/dev/null ||
    { echo "skip: $py lacks numpy or h5py (scripts/install_deps.sh installs them)"; exit 77; }

ok() {
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

small=(--set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=2 --set run.log_every=1)
export RUN_CKPT=1
# Saved on tp 2 x pp 2 x dp 2 with ZeRO-1 (8 ranks): every tensor written in
# pieces by its TP slice and ZeRO block owners.
run g 8 --set topology.tp=2 --set topology.pp=2 --set topology.dp=2 --set topology.zero=1
run l 8 --set model.arch=llama --set model.kv_heads=2 --set topology.tp=2 --set topology.pp=2 \
    --set topology.dp=2 --set topology.zero=1
run lb 1 --set model.arch=llama --set model.kv_heads=1 --set training.precision=bf16
unset RUN_CKPT

step_of() { echo "$out/$1/ckpt/$(cat "$out/$1/ckpt/latest")"; }
# import HF_DIR OUT: exit status in $rc, output in $out/i.log
import() {
    timeout 120 "$TRIDENT" ckpt import --from hf "$1" --out "$2" > "$out/i.log" 2>&1
    rc=$?
}
same() {
    "$py" tests/hf_import_check.py "$1" "$2" > "$out/c.log" 2>&1
    local r=$?
    sed 's/^/     /' "$out/c.log"
    return $r
}

# ---- round trip ----
"$TRIDENT" ckpt export --format hf --out "$out/g.hf" "$out/g/ckpt" > /dev/null
import "$out/g.hf" "$out/g.imp"
ok "gpt2 (tp2 pp2 dp2): import (exit $rc)" test $rc -eq 0
sed 's/^/     /' "$out/i.log"
ok "gpt2: every tensor bit-identical to the checkpoint" same "$(step_of g)" "$out/g.imp/step_00000000"
ok "gpt2: the imported checkpoint verifies" "$TRIDENT" ckpt verify "$out/g.imp" > /dev/null

"$TRIDENT" ckpt export --format hf --max-shard-size 1MB --out "$out/l.hf" "$out/l/ckpt" > /dev/null
import "$out/l.hf" "$out/l.imp"
ok "llama kv_heads 2 (tp2 pp2 dp2, sharded export): import (exit $rc)" test $rc -eq 0
ok "llama: every tensor bit-identical to the checkpoint" same "$(step_of l)" "$out/l.imp/step_00000000"

"$TRIDENT" ckpt export --format hf --out "$out/lb.hf" "$out/lb/ckpt" > /dev/null
import "$out/lb.hf" "$out/lb.imp"
ok "llama bf16 run: fp32 export imports the master weights exactly" \
    bash -c "[ $rc -eq 0 ] && $py tests/hf_import_check.py '$(step_of lb)' '$out/lb.imp/step_00000000'"
"$TRIDENT" ckpt export --format hf --dtype bf16 --out "$out/lb16.hf" "$out/lb/ckpt" > /dev/null
import "$out/lb16.hf" "$out/lb16.imp"
"$TRIDENT" ckpt export --format hf --dtype bf16 --out "$out/lb16b.hf" "$out/lb16.imp" > /dev/null
ok "llama bf16: BF16 widened exactly (re-export as bf16 is byte-identical)" \
    bash -c "[ $rc -eq 0 ] && cmp '$out/lb16.hf/model.safetensors' '$out/lb16b.hf/model.safetensors'"

# fp16 as published: the gpt2 export rewritten as F16 (torch_dtype float16)
# by numpy, with subnormals, -0, the largest half and a tiny normal put in
# one tensor; its exact fp32 widening (numpy's) written as an F32 twin.
# Both import to the same bits.
cat > "$out/to_f16.py" <<'EOF'
import json, os, shutil, struct, sys
import numpy as np
src, f16, f32 = sys.argv[1:4]
def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), f.read()
def write(path, tensors, dtype):
    h, blobs, at = {}, [], 0
    for name, a in tensors.items():
        b = a.astype(dtype).tobytes()
        h[name] = {"dtype": {np.float16: "F16", np.float32: "F32"}[dtype],
                   "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b); at += len(b)
    text = json.dumps(h).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
h, data = read(os.path.join(src, "model.safetensors"))
half = {}
for name, t in h.items():
    if name == "__metadata__":
        continue
    b, e = t["data_offsets"]
    half[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(t["shape"]).astype(np.float16)
w = half["transformer.h.0.attn.c_attn.weight"].reshape(-1)
w[:6] = np.array([2.0**-24, -3 * 2.0**-24, 1023 * 2.0**-24, -0.0, 65504.0, 2.0**-14], dtype=np.float16)
for out, dtype, torch in ((f16, np.float16, "float16"), (f32, np.float32, "float32")):
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    write(os.path.join(out, "model.safetensors"), {k: v.astype(np.float32) for k, v in half.items()}, dtype)
    c = json.load(open(os.path.join(out, "config.json")))
    c["torch_dtype"] = torch
    json.dump(c, open(os.path.join(out, "config.json"), "w"))
EOF
"$py" "$out/to_f16.py" "$out/g.hf" "$out/g16.hf" "$out/g16w.hf"
import "$out/g16w.hf" "$out/g16w.imp"
import "$out/g16.hf" "$out/g16.imp"
ok "gpt2 F16 safetensors (torch_dtype float16): import (exit $rc)" test $rc -eq 0
sed 's/^/     /' "$out/i.log"
ok "gpt2 F16: widened exactly (= numpy's fp32 of the same halves, subnormals included)" \
    same "$out/g16w.imp/step_00000000" "$out/g16.imp/step_00000000"
import "$out/g.hf" "$out/g.imp"
ok "import into a directory that holds a step 0: exit 2, not overwritten" \
    bash -c "[ $rc -eq 2 ] && grep -q 'not overwritten' '$out/i.log'"

# From a file system without O_DIRECT (a tmpfs: the reads ahead go through
# the page cache instead): the same checkpoint.
mnt="$out/mnt"
mkdir -p "$mnt"
trap 'umount "$mnt" 2>/dev/null; rm -rf "$out"' EXIT
if mount -t tmpfs -o size=64M tmpfs "$mnt" 2>/dev/null; then
    cp -r "$out/g.hf" "$out/l.hf" "$mnt/"
    import "$mnt/g.hf" "$out/g.tmpfs.imp"
    ok "gpt2 from a tmpfs (no O_DIRECT): import (exit $rc), bit-identical" \
        bash -c "[ $rc -eq 0 ] && $py tests/hf_import_check.py '$(step_of g)' '$out/g.tmpfs.imp/step_00000000'"
    import "$mnt/l.hf" "$out/l.tmpfs.imp"
    ok "llama from a tmpfs (no O_DIRECT): import (exit $rc), bit-identical" \
        bash -c "[ $rc -eq 0 ] && $py tests/hf_import_check.py '$(step_of l)' '$out/l.tmpfs.imp/step_00000000'"
    umount "$mnt"
else
    echo "FAIL: cannot mount a tmpfs for the no-O_DIRECT case (run as root)"; fails=$((fails + 1))
fi

# A full disk (a 4 MiB tmpfs, as root; the model is 13 MB): exit 1 naming
# the file, no step left behind.  The sink's thread writes behind the
# conversion, so the failure surfaces at a later write or at the close.
if mount -t tmpfs -o size=4M tmpfs "$mnt" 2>/dev/null; then
    timeout 60 "$TRIDENT" ckpt import --from hf --out "$mnt/x" "$out/g.hf" > "$out/i.log" 2>&1
    r=$?
    ok "import onto a full disk: exit $r (want 1), 'stage_0.h5: cannot write.*No space left'" \
        bash -c "[ $r -eq 1 ] && grep -q 'stage_0.h5: cannot write.*No space left' '$out/i.log'"
    ok "import onto a full disk: no step left behind" bash -c "! ls -d '$mnt/x'/step_* > /dev/null 2>&1"
    umount "$mnt"
else
    echo "FAIL: cannot mount a tmpfs for the full-disk case (run as root)"; fails=$((fails + 1))
fi

for args in "--out $out/x $out/g.hf:--from hf is required" "--from onnx --out $out/x $out/g.hf:--from hf is required" \
            "--from hf $out/g.hf:--out is required" "--from hf --out $out/x:HF_DIR) is required" \
            "--from hf --out $out/x --set model.hidden=8 $out/g.hf:the model comes from" \
            "--from hf --out $out/x $out/g:config.json: cannot open"; do
    timeout 60 "$TRIDENT" ckpt import ${args%%:*} > "$out/i.log" 2>&1
    r=$?
    ok "ckpt import ${args%%:*}: exit $r (want 2), '${args#*:}'" \
        bash -c "[ $r -eq 2 ] && grep -q -- '${args#*:}' '$out/i.log'"
done

# ---- init_from ----
small=(--set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=1 --set run.log_every=1 --set checkpoint.dir=)
loss1() { grep -h '"step": 1,' "$out/$1/metrics.jsonl" | grep -o '"loss": [-0-9.e+]*' | cut -d' ' -f2; }
close() {   # A B: equal within 1e-5 relative
    "$py" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(b))" "$1" "$2"
}
run ih1 1 --set checkpoint.init_from="$out/g.hf"
run ic1 1 --set checkpoint.init_from="$(step_of g)"
run ih2 2 --set checkpoint.init_from="$out/g.hf" --set topology.tp=2
run ihz 2 --set checkpoint.init_from="$out/g.hf" --set topology.dp=2 --set topology.zero=3
run fresh 1
echo "     first-step losses: hf 1 rank $(loss1 ih1), checkpoint $(loss1 ic1), hf tp2 $(loss1 ih2)," \
     "hf dp2 zero3 $(loss1 ihz), fresh $(loss1 fresh)"
ok "gpt2 init_from HF = init_from the trident checkpoint (same weights), exactly" \
    test "$(loss1 ih1)" = "$(loss1 ic1)"
ok "gpt2 init_from HF = init_from the checkpoint: weights after the step bit-identical" \
    cmp -s "$out/ih1.weights" "$out/ic1.weights"
ok "gpt2 init_from HF: tp2 = 1 rank (1e-5)" close "$(loss1 ih2)" "$(loss1 ih1)"
ok "gpt2 init_from HF: dp2 ZeRO-3 = 1 rank (1e-5)" close "$(loss1 ihz)" "$(loss1 ih1)"
ok "gpt2 init_from: the weights were taken (a fresh run's loss differs)" \
    test "$(loss1 fresh)" != "$(loss1 ih1)"
ok "init_from HF: read by each rank from the safetensors, said so, nothing converted on disk" \
    bash -c "grep -q 'initialised from $out/g.hf: weights of its safetensors' '$out/ih1.log' && [ ! -e '$out/ih1/init_from' ]"

# A config with no model section: the model is the source's (config.json or
# the checkpoint's index); the same first step as the config that spells it
# out.  A model key given that differs is an error naming both values.
nomodel() { # SOURCE OUT.yaml: tiny.yaml without model:, init_from SOURCE in the file
    sed -e '/^model:/,/^$/d' -e "s#^checkpoint:.*#checkpoint:\n  init_from: $1#" configs/tiny.yaml > "$2"
}
nsmall=(--set training.steps=2 --set run.log_every=1)
nomodel "$out/g.hf" "$out/nm_g.yaml"
nomodel "$(step_of g)" "$out/nm_c.yaml"
nomodel "$out/l.hf" "$out/nm_l.yaml"
for n in g c l; do
    TRIDENT_DUMP_WEIGHTS="$out/nm_$n.weights" timeout 300 "$TRIDENT" train "$out/nm_$n.yaml" \
        "${nsmall[@]}" --set run.dir="$out/nm_$n" > "$out/nm_$n.log" 2>&1 ||
        { echo "FAIL: init_from without a model section ($n) exited $?"; tail -5 "$out/nm_$n.log"; fails=$((fails + 1)); }
done
ok "no model section, init_from HF gpt2: the same first step as with the model written out" \
    test "$(loss1 nm_g)" = "$(loss1 ih1)"
ok "no model section, init_from a trident checkpoint: the same first step" \
    test "$(loss1 nm_c)" = "$(loss1 ic1)"
ok "no model section: the resolved config holds config.json's model" \
    grep -q "^  hidden: 64" "$out/nm_g/config.yaml"
timeout 60 "$TRIDENT" train "$out/nm_g.yaml" "${nsmall[@]}" --set run.dir="$out/nm_bad" \
    --set model.hidden=128 > "$out/b.log" 2>&1
r=$?
ok "no model section, --set model.hidden=128: exit $r (want 2) naming both values" \
    bash -c "[ $r -eq 2 ] && grep -q 'model.hidden is 64 in $out/g.hf/config.json, 128 in the config' '$out/b.log'"

lsmall=(--set model.arch=llama --set model.kv_heads=2)
run lh1 1 "${lsmall[@]}" --set checkpoint.init_from="$out/l.hf"
run lc1 1 "${lsmall[@]}" --set checkpoint.init_from="$out/l/ckpt"
run lhp 2 "${lsmall[@]}" --set checkpoint.init_from="$out/l.hf" --set topology.pp=2
echo "     llama first-step losses: hf $(loss1 lh1), checkpoint $(loss1 lc1), hf pp2 $(loss1 lhp)"
ok "llama GQA init_from HF (sharded) = init_from the checkpoint, exactly" \
    test "$(loss1 lh1)" = "$(loss1 lc1)"
ok "llama GQA init_from HF = init_from the checkpoint: weights after the step bit-identical" \
    cmp -s "$out/lh1.weights" "$out/lc1.weights"
ok "llama GQA init_from HF: pp2 = 1 rank (1e-5)" close "$(loss1 lhp)" "$(loss1 lh1)"
ok "no model section, init_from HF llama GQA: the same first step as with the model written out" \
    test "$(loss1 nm_l)" = "$(loss1 lh1)"

# bf16 training from the fp32 export of a bf16 run's master weights: the
# same start (master = the values, weights = their bf16 rounding) as from
# the run's own checkpoint (its master weights and rounded weights).
bsmall=(--set model.arch=llama --set model.kv_heads=1 --set training.precision=bf16)
run bh1 1 "${bsmall[@]}" --set checkpoint.init_from="$out/lb.hf"
run bc1 1 "${bsmall[@]}" --set checkpoint.init_from="$out/lb/ckpt"
run bh2 2 "${bsmall[@]}" --set checkpoint.init_from="$out/lb.hf" --set topology.dp=2 --set topology.zero=1
echo "     bf16 first-step losses: hf $(loss1 bh1), checkpoint $(loss1 bc1), hf dp2 zero1 $(loss1 bh2)"
ok "bf16 run init_from HF (fp32 master) = init_from the bf16 checkpoint, exactly" \
    test "$(loss1 bh1)" = "$(loss1 bc1)"
ok "bf16 run init_from HF = init_from the checkpoint: weights after the step bit-identical" \
    cmp -s "$out/bh1.weights" "$out/bc1.weights"
ok "bf16 run init_from HF: dp2 ZeRO-1 = 1 rank (1e-5)" close "$(loss1 bh2)" "$(loss1 bh1)"

# A shorter context: gpt2 keeps the first seq_len rows of wpe (n_positions is
# an upper bound); llama has no position table.
# With lr 1e-30 the step leaves the weights as init_from made them (each
# update is far below half an ulp), and the run's own checkpoint shows them.
run is16 1 --set checkpoint.init_from="$out/g.hf" --set model.seq_len=16 --set training.lr=1e-30 \
    --set training.min_lr=0 --set checkpoint.dir="$out/is16/ckpt"
ok "gpt2 init_from with seq_len 16 < n_positions 32: wpe = the first 16 rows" \
    "$py" -c "
import sys, h5py, numpy as np
src = h5py.File('$(step_of g)/stage_0.h5', 'r')['params/embed.wpe.weight'][()]
got = h5py.File('$(step_of is16)/stage_0.h5', 'r')['params/embed.wpe.weight'][()]
sys.exit(not (got.shape == (16, 64) and np.array_equal(got.view(np.uint32), src[:16].view(np.uint32))))"
run ls16 1 "${lsmall[@]}" --set checkpoint.init_from="$out/l.hf" --set model.seq_len=16
ok "llama init_from with seq_len 16 != max_position_embeddings 32 runs" \
    grep -q "initialised from" "$out/ls16.log"

# A resumed run ignores init_from (its own checkpoint wins).
run res 1 --set checkpoint.init_from="$out/g.hf" --set checkpoint.dir="$out/res/ckpt"
run res 1 --set checkpoint.init_from="$out/g.hf" --set checkpoint.dir="$out/res/ckpt" \
    --set training.steps=2
ok "a resumed run ignores init_from, with a note" \
    bash -c "grep -q 'resumed from' '$out/res.log' && grep -q 'init_from .* ignored' '$out/res.log'"

# Another model: exit 2 naming both values.
bad_run() {
    local what=$1 pattern=$2; shift 2
    timeout 120 mpiexec -n 1 "$TRIDENT" train configs/tiny.yaml "${small[@]}" \
        --set run.dir="$out/bad" "$@" > "$out/b.log" 2>&1
    local r=$?
    ok "$what: exit $r (want 2), '$pattern'" bash -c "[ $r -eq 2 ] && grep -q -- \"$pattern\" '$out/b.log'"
    echo "     $(grep -m1 'error' "$out/b.log" | cut -c1-200)"
}
bad_run "init_from HF with model.hidden 128" "model.hidden is 64 in $out/g.hf/config.json, 128 in the config" \
    --set model.hidden=128 --set checkpoint.init_from="$out/g.hf"
bad_run "init_from checkpoint with model.kv_heads 1" "model.kv_heads is 2 in the checkpoint, 1 in the config" \
    "${lsmall[@]}" --set model.kv_heads=1 --set checkpoint.init_from="$out/l/ckpt"
bad_run "init_from a llama into a gpt2" "model.arch is llama in $out/l.hf/config.json, gpt2 in the config" \
    --set checkpoint.init_from="$out/l.hf"
bad_run "gpt2 init_from with seq_len 64 > n_positions 32" "model.seq_len 64 > n_positions 32 of $out/g.hf/config.json" \
    --set model.seq_len=64 --set checkpoint.init_from="$out/g.hf"
bad_run "init_from nothing" "checkpoint.init_from: $out/nowhere: no such directory" --set checkpoint.init_from="$out/nowhere"

# ---- bad safetensors: one broken copy per case ----
# break.py SRC DST CASE: DST = a copy of the HF directory SRC with CASE done to it.
cat > "$out/break.py" <<'EOF'
import json, os, shutil, struct, sys
src, dst, case = sys.argv[1:4]
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
st = os.path.join(dst, "model.safetensors")
def header():
    with open(st, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), f.read()
def write(h, data):
    text = json.dumps(h).encode()
    with open(st, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
def config(**kv):
    p = os.path.join(dst, "config.json")
    c = json.load(open(p))
    c.update(kv)
    json.dump(c, open(p, "w"))
if case == "absurd":          # header length past the file (and 100 MB)
    with open(st, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 40))
elif case == "absurd100":     # within a (sparse) 300 MB file, but over 100 MB
    with open(st, "r+b") as f:
        f.write(struct.pack("<Q", 200_000_000))
    os.truncate(st, 300_000_000)
elif case == "json":          # the header's first byte
    with open(st, "r+b") as f:
        f.seek(8); f.write(b"x")
elif case == "overlap":       # ln_1.bias given ln_1.weight's bytes (same size)
    h, d = header()
    h["transformer.h.0.ln_1.bias"]["data_offsets"] = h["transformer.h.0.ln_1.weight"]["data_offsets"]
    write(h, d)
elif case == "past_end":      # final norm moved beyond the data
    h, d = header()
    b, e = h["transformer.ln_f.bias"]["data_offsets"]
    h["transformer.ln_f.bias"]["data_offsets"] = [b + len(d), e + len(d)]
    write(h, d)
elif case == "shape":         # [64] -> [32, 2]: same bytes, not config.json's shape
    h, d = header()
    h["transformer.ln_f.weight"]["shape"] = [32, 2]
    write(h, d)
elif case == "dtype":         # F32 tensors, config.json says bfloat16
    config(torch_dtype="bfloat16")
elif case == "f64":           # a dtype trident does not read
    h, d = header()
    t = h["transformer.h.1.ln_2.weight"]
    t["dtype"], t["shape"] = "F64", [32]
    write(h, d)
elif case == "dtype16":       # F32 tensors, config.json says float16
    config(torch_dtype="float16")
elif case == "truncated":     # the last 100 bytes gone
    size = os.path.getsize(st)
    os.truncate(st, size - 100)
elif case == "missing":       # an entry removed from the header
    h, d = header()
    del h["transformer.h.1.mlp.c_fc.bias"]
    write(h, d)
elif case == "shard":         # a shard the index names removed
    os.remove(os.path.join(dst, "model-00002-of-%05d.safetensors"
                           % len([f for f in os.listdir(dst) if f.startswith("model-")])))
elif case == "rope_scaling":  # Llama 3.1's without one of its parameters
    config(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
elif case == "arch":
    config(architectures=["BertForMaskedLM"], model_type="bert")
elif case == "layers":         # issue 34: a size a typo gives, bounded like a config's
    config(n_layer=1000000000)
elif case == "n_inner":        # issue 34: checked against the file before the buffers
    config(n_inner=1000000000)
elif case.startswith("nan_"):  # one value NaN, one Inf (read in pieces / whole)
    name = {"nan_wte": "transformer.wte.weight", "nan_fc": "transformer.h.1.mlp.c_fc.weight"}[case]
    h, d = header()
    b, e = h[name]["data_offsets"]
    d = bytearray(d)
    d[e - 4:e] = struct.pack("<f", float("nan"))
    d[b + 40:b + 44] = struct.pack("<f", float("inf"))
    write(h, bytes(d))
EOF
bad_st() {
    local case=$1 src=$2 pattern=$3
    "$py" "$out/break.py" "$src" "$out/bad_$case.hf" "$case" || { echo "FAIL: break.py $case"; fails=$((fails + 1)); return; }
    import "$out/bad_$case.hf" "$out/bad_$case.imp"
    ok "bad safetensors ($case): exit $rc (want 2), '$pattern'" \
        bash -c "[ $rc -eq 2 ] && grep -q -- \"$pattern\" '$out/i.log' && [ ! -d '$out/bad_$case.imp/step_00000000' ]"
    echo "     $(grep -m1 'error' "$out/i.log" | cut -c1-200)"
}
f=model.safetensors
bad_st absurd "$out/g.hf" "bad_absurd.hf/$f: header length 1099511627776 is absurd"
bad_st absurd100 "$out/g.hf" "bad_absurd100.hf/$f: header length 200000000 is absurd (file 300000000 bytes, limit 100000000)"
bad_st json "$out/g.hf" "bad_json.hf/$f: the header is not a JSON object (malformed JSON)"
bad_st overlap "$out/g.hf" "bad_overlap.hf/$f: tensor 'transformer.h.0.ln_1.*data_offsets overlap"
bad_st past_end "$out/g.hf" "bad_past_end.hf/$f: tensor 'transformer.ln_f.bias': data_offsets .* past the end"
bad_st shape "$out/g.hf" "bad_shape.hf/$f: tensor 'transformer.ln_f.weight' has shape \[32, 2\], config.json implies \[64\]"
bad_st dtype "$out/g.hf" "bad_dtype.hf/$f: tensor '.*' is F32, config.json's torch_dtype says bfloat16"
bad_st f64 "$out/g.hf" "bad_f64.hf/$f: tensor 'transformer.h.1.ln_2.weight': dtype F64 (trident reads F32, F16 and BF16)"
bad_st dtype16 "$out/g.hf" "bad_dtype16.hf/$f: tensor '.*' is F32, config.json's torch_dtype says float16"
bad_st truncated "$out/g.hf" "bad_truncated.hf/$f: tensor '.*': data_offsets .* past the end of the file .*truncated"
bad_st missing "$out/g.hf" "bad_missing.hf/$f: required tensor 'transformer.h.1.mlp.c_fc.bias' is missing"
bad_st shard "$out/l.hf" "bad_shard.hf/model.safetensors.index.json: shard .*model-00002-of-.* (of tensor '.*') is missing"
bad_st rope_scaling "$out/l.hf" "bad_rope_scaling.hf/config.json: rope_scaling: .low_freq_factor. is missing"
bad_st arch "$out/g.hf" "bad_arch.hf/config.json: architectures .*BertForMaskedLM.*, model_type .bert.: trident imports"
bad_st layers "$out/g.hf" "bad_layers.hf/config.json: model.layers (1000000000) is more than 4096"
bad_st n_inner "$out/g.hf" "bad_n_inner.hf/$f: tensor 'transformer.h.0.mlp.c_fc.weight' has shape \[64, 256\], config.json implies \[64, 1000000000\]"
bad_st nan_wte "$out/g.hf" "bad_nan_wte.hf: tensor 'embed.wte.weight' has 2 non-finite values"
bad_st nan_fc "$out/g.hf" "bad_nan_fc.hf: tensor 'layers.1.mlp.fc.weight' has 2 non-finite values"

# The same files through checkpoint.init_from on 2 ranks (tp 2: each reads
# its pieces): exit 2, the reader's message once.
for case in truncated missing; do
    timeout 120 mpiexec -n 2 "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set topology.tp=2 \
        --set run.dir="$out/bi_$case" --set checkpoint.init_from="$out/bad_$case.hf" > "$out/b.log" 2>&1
    r=$?
    ok "init_from a bad safetensors ($case) on 2 ranks: exit $r (want 2), named once" \
        bash -c "[ $r -eq 2 ] && [ \$(grep -o 'bad_$case.hf/$f: ' '$out/b.log' | wc -l) -eq 1 ]"
    echo "     $(grep -m1 'error' "$out/b.log" | cut -c1-200)"
done

echo "hf_import: $fails failed"
[ "$fails" -eq 0 ]
