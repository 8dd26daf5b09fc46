#!/usr/bin/env bash
# Llama 3's RoPE scaling (config.json rope_scaling, rope_type "llama3";
# model.rope_scaling in trident):
#   - a tiny Llama written here (numpy, not by trident: config.json with
#     rope_scaling whose original context is short enough that the head's
#     four pairs fall in all three bands, random F32 safetensors) generates
#     greedy tokens whose logits equal, within 1e-4, those of an
#     independent numpy forward (tests/generate_check.py, Hugging Face's
#     llama3 formula in tests/rope_llama3_ref.py), with the cache (the
#     decoding rope) and with --no-cache (the training rope);
#   - ckpt import keeps the scaling (inspect shows it) and ckpt export
#     writes config.json's rope_scaling back as it was;
#   - checkpoint.init_from with no model section takes it from config.json
#     (the run's checkpoint records it); a config that says otherwise exits
#     2 naming both;
#   - rope_type default imports; yarn and linear exit 2 naming them.
. "$(dirname "$0")/e2e.sh"
py=/usr/bin/python3   # Debian's, with numpy and h5py (scripts/install_deps.sh)
"$py" -c 'import numpy, h5py' 2>/dev/null ||
    { echo "skip: $py lacks numpy or h5py (scripts/install_deps.sh installs them)"; exit 77; }

ok() { # what, condition...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

# write.py DIR ROPE_TYPE: a Llama of 2 layers, hidden 32, 4 heads of 8
# (2 kv heads), byte vocabulary (257), theta 10000, with rope_scaling of
# ROPE_TYPE (factor 8, low 1, high 4, original context 100: wavelengths
# 6.3 < 25 unchanged, 63 interpolated, 628 and 6283 > 100 scaled).
cat > "$out/write.py" <<'EOF'
import json, os, struct, sys
import numpy as np
d, kind = sys.argv[1:3]
os.makedirs(d, exist_ok=True)
C, H, K, hs, F, V, L = 32, 4, 2, 8, 64, 257, 2
rng = np.random.default_rng(7)
t = {"model.embed_tokens.weight": rng.normal(0, 1, (V, C)),
     "model.norm.weight": 1 + rng.normal(0, 0.1, C), "lm_head.weight": rng.normal(0, 0.2, (V, C))}
for l in range(L):
    p = f"model.layers.{l}."
    t[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
    t[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
    t[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.6, (H * hs, C))   # sharp attention:
    t[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.6, (K * hs, C))   # positions matter
    t[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.2, (K * hs, C))
    t[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.2, (C, H * hs))
    t[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.2, (F, C))
    t[p + "mlp.up_proj.weight"] = rng.normal(0, 0.2, (F, C))
    t[p + "mlp.down_proj.weight"] = rng.normal(0, 0.2, (C, F))
h, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
for name, a in t.items():
    b = a.astype(np.float32).tobytes()
    h[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
    blobs.append(b); at += len(b)
text = json.dumps(h).encode()
text += b" " * (-len(text) % 8)   # the data starts 8-byte aligned
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
rs = {"rope_type": kind, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 100}
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": K, "max_position_embeddings": 64,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": rs,
           "tie_word_embeddings": False, "torch_dtype": "float32"},
          open(os.path.join(d, "config.json"), "w"))
EOF
for kind in llama3 default yarn linear; do
    "$py" "$out/write.py" "$out/$kind.hf" "$kind" || { echo "FAIL: write $kind"; fails=$((fails + 1)); }
done

# ---- the forward, against numpy ----
prompt="The jury said that the"   # 22 bytes: positions to 33 of 64
for cache in "" --no-cache; do
    "$TRIDENT" generate "$out/llama3.hf" --tokenizer byte --prompt "$prompt" --max-new-tokens 12 \
        --greedy --ids --dump-logits "$out/g$cache.logits" $cache > "$out/g$cache.ids" 2> "$out/g.log"
    ok "generate ${cache:-(cache)} from the llama3 directory exits 0" test $? -eq 0
    "$py" tests/generate_check.py "$out/llama3.hf" "$(cat "$out/g$cache.ids")" "$out/g$cache.logits" ||
        fails=$((fails + 1))
done

# ---- import, inspect, export ----
timeout 120 "$TRIDENT" ckpt import --from hf "$out/llama3.hf" --out "$out/imp" > "$out/i.log" 2>&1
ok "ckpt import of the llama3 directory exits 0" test $? -eq 0
"$TRIDENT" ckpt inspect "$out/imp" > "$out/inspect.txt" 2>&1
want="rope_scaling llama3 (factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 100)"
ok "ckpt inspect shows the scaling" grep -qF "$want" "$out/inspect.txt"
"$TRIDENT" ckpt export --format hf --out "$out/exp.hf" "$out/imp" > "$out/e.log" 2>&1
ok "ckpt export writes config.json's rope_scaling back as it was" "$py" -c '
import json, sys
a, b = (json.load(open(f + "/config.json"))["rope_scaling"] for f in sys.argv[1:])
sys.exit(a != b)' "$out/llama3.hf" "$out/exp.hf"

# ---- init_from with no model section ----
"$TRIDENT" prepare-data --input data/brown/txt/ca01 --tokenizer byte --out "$out/bytes" > /dev/null ||
    { echo "FAIL: prepare-data byte"; fails=$((fails + 1)); }
cat > "$out/init.yaml" <<EOF
training: {steps: 1, global_batch: 2, micro_batch: 2, lr: 1.0e-4, warmup_steps: 0}
data: {path: $out/bytes}
checkpoint: {dir: $out/run/ckpt, init_from: $out/llama3.hf}
run: {dir: $out/run, log_every: 1, tensorboard: false}
EOF
timeout 120 "$TRIDENT" train "$out/init.yaml" > "$out/init.log" 2>&1
ok "init_from the llama3 directory with no model section trains (exit $?)" test $? -eq 0
"$TRIDENT" ckpt inspect "$out/run/ckpt" > "$out/inspect2.txt" 2>&1
ok "... and its checkpoint records the scaling" grep -qF "$want" "$out/inspect2.txt"
timeout 120 "$TRIDENT" train "$out/init.yaml" --set model.rope_scaling=none \
    --set checkpoint.dir="$out/run2" > "$out/init2.log" 2>&1
rc=$?
ok "init_from with model.rope_scaling none: exit $rc (want 2), both named" bash -c "[ $rc -eq 2 ] &&
    grep -q 'model.rope_scaling is llama3 (factor 8.*config.json, none in the config' '$out/init2.log'"

# ---- other kinds ----
timeout 60 "$TRIDENT" ckpt import --from hf "$out/default.hf" --out "$out/imp_default" > "$out/d.log" 2>&1
ok "rope_type default imports (exit $?)" test $? -eq 0
for kind in yarn linear; do
    timeout 60 "$TRIDENT" ckpt import --from hf "$out/$kind.hf" --out "$out/imp_$kind" > "$out/k.log" 2>&1
    rc=$?
    ok "rope_type $kind: exit $rc (want 2), named" bash -c "[ $rc -eq 2 ] &&
        grep -q 'rope_scaling rope_type \"$kind\": trident scales RoPE the Llama 3 way' '$out/k.log'"
done

[ "$fails" -eq 0 ] && echo "hf_rope_scaling: all checks passed"
exit $((fails > 0))
