#!/usr/bin/env python3
"""The seeds of fuzz_hf_import (tests/fuzz/seeds/hf_import): tiny Hugging
Face models as `trident ckpt import --from hf` reads them, each one file:
config.json, a NUL byte, model.safetensors.  Run from the repository root:
    python3 tests/fuzz/make_hf_import_seeds.py"""
import json
import os
import random
import struct

OUT = "tests/fuzz/seeds/hf_import"


def safetensors(tensors, dtype):
    """tensors: [(name, shape)]; values small and finite."""
    rng = random.Random(1)
    size = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    header, data = {}, b""
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        vals = [rng.uniform(-0.1, 0.1) for _ in range(n)]
        if dtype == "F32":
            b = struct.pack("<%df" % n, *vals)
        elif dtype == "F16":
            b = struct.pack("<%de" % n, *vals)
        else:  # bf16: the high half of the float32
            b = b"".join(struct.pack("<f", v)[2:] for v in vals)
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + n * size]}
        data += b
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


def llama(dtype, torch_dtype):
    V, C, H, KV, F, T = 16, 8, 2, 1, 16, 8
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "max_position_embeddings": T, "hidden_size": C, "num_hidden_layers": 1,
           "num_attention_heads": H, "num_key_value_heads": KV, "intermediate_size": F,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "torch_dtype": torch_dtype}
    hs = C // H
    t = [("model.embed_tokens.weight", (V, C)), ("lm_head.weight", (V, C)),
         ("model.norm.weight", (C,))]
    p = "model.layers.0."
    t += [(p + "input_layernorm.weight", (C,)), (p + "post_attention_layernorm.weight", (C,)),
          (p + "self_attn.q_proj.weight", (H * hs, C)), (p + "self_attn.k_proj.weight", (KV * hs, C)),
          (p + "self_attn.v_proj.weight", (KV * hs, C)), (p + "self_attn.o_proj.weight", (C, C)),
          (p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
          (p + "mlp.down_proj.weight", (C, F))]
    return cfg, safetensors(t, dtype)


def gpt2():
    V, C, H, T = 16, 8, 2, 8
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
           "n_positions": T, "n_embd": C, "n_layer": 1, "n_head": H,
           "activation_function": "gelu_new", "torch_dtype": "float32"}
    t = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (T, C)),
         ("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    p = "transformer.h.0."
    t += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)), (p + "ln_2.weight", (C,)),
          (p + "ln_2.bias", (C,)), (p + "attn.c_attn.weight", (C, 3 * C)),
          (p + "attn.c_attn.bias", (3 * C,)), (p + "attn.c_proj.weight", (C, C)),
          (p + "attn.c_proj.bias", (C,)), (p + "mlp.c_fc.weight", (C, 4 * C)),
          (p + "mlp.c_fc.bias", (4 * C,)), (p + "mlp.c_proj.weight", (4 * C, C)),
          (p + "mlp.c_proj.bias", (C,))]
    return cfg, safetensors(t, "F32")


os.makedirs(OUT, exist_ok=True)
for name, (cfg, st) in {"llama_f32": llama("F32", "float32"),
                        "llama_bf16": llama("BF16", "bfloat16"),
                        "gpt2_f32": gpt2()}.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(json.dumps(cfg).encode() + b"\0" + st)
