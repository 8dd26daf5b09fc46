#!/usr/bin/python3
"""Write a tiny MixtralForCausalLM directory the way Hugging Face lays it
out (config.json + model.safetensors), with random weights, independently
of trident: numpy and a safetensors writer of its own.

  mixtral_write.py OUTDIR[:VARIANT] ...

The model: vocab 257 (bytes), hidden 64, 2 layers, 4 heads, 2 kv heads, 4
experts of width 96, top-2, context 64, rope_theta 1e6 (Mixtral's), untied
head; weights N(0, 0.2) (sharp enough that greedy tokens vary), norms
around 1.  VARIANT breaks it for the import's error tests:
  missing    expert 3's w2 of layer 1 left out
  duplicate  expert 0's w1 of layer 0 named twice in the header
  extra      an expert 4 in layer 0 (config.json says 4 experts)
  shape      expert 2's w3 of layer 0 stored [64, 96] (transposed)
"""
import json
import os
import sys

import numpy as np

V, C, L, H, KV, E, K, F, T = 257, 64, 2, 4, 2, 4, 2, 96, 64


def tensors(rng):
    hs = C // H
    t = {"model.embed_tokens.weight": rng.normal(0, 0.2, (V, C)),
         "model.norm.weight": 1 + 0.1 * rng.normal(size=C),
         "lm_head.weight": rng.normal(0, 0.2, (V, C))}
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        t[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.2, (H * hs, C))
        t[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.2, (KV * hs, C))
        t[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.2, (KV * hs, C))
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.2, (C, H * hs))
        t[p + "block_sparse_moe.gate.weight"] = rng.normal(0, 0.2, (E, C))
        for e in range(E):
            x = f"{p}block_sparse_moe.experts.{e}."
            t[x + "w1.weight"] = rng.normal(0, 0.2, (F, C))
            t[x + "w3.weight"] = rng.normal(0, 0.2, (F, C))
            t[x + "w2.weight"] = rng.normal(0, 0.2, (C, F))
    return [(k, v.astype("<f4")) for k, v in t.items()]


def write_safetensors(path, items):
    """items: (name, float32 array) pairs, written in order; a name may repeat."""
    entries, at = [], 0
    for name, a in items:
        entries.append(f'{json.dumps(name)}: {{"dtype": "F32", "shape": {list(a.shape)}, '
                       f'"data_offsets": [{at}, {at + a.nbytes}]}}')
        at += a.nbytes
    head = "{" + ", ".join(['"__metadata__": {"format": "pt"}'] + entries) + "}"
    head += " " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head.encode())
        for _, a in items:
            f.write(a.tobytes())


def write(out, variant):
    os.makedirs(out, exist_ok=True)
    items = tensors(np.random.default_rng(33))
    x0 = "model.layers.0.block_sparse_moe.experts."
    if variant == "missing":
        items = [(k, v) for k, v in items if k != "model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    elif variant == "duplicate":
        items += [(k, v) for k, v in items if k == x0 + "0.w1.weight"]
    elif variant == "extra":
        items += [(x0 + "4.w1.weight", np.zeros((F, C), "<f4"))]
    elif variant == "shape":
        items = [(k, v.T.copy() if k == x0 + "2.w3.weight" else v) for k, v in items]
    elif variant:
        sys.exit(f"mixtral_write: unknown variant {variant}")
    write_safetensors(f"{out}/model.safetensors", items)
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": C // H,
           "max_position_embeddings": T, "hidden_act": "silu", "rms_norm_eps": 1e-5,
           "rope_theta": 1e6, "rope_scaling": None, "sliding_window": None,
           "num_local_experts": E, "num_experts_per_tok": K, "router_aux_loss_coef": 0.02,
           "output_router_logits": False, "tie_word_embeddings": False,
           "torch_dtype": "float32"}
    json.dump(cfg, open(f"{out}/config.json", "w"), indent=2)


for arg in sys.argv[1:]:
    write(*(arg.split(":") if ":" in arg else (arg, "")))
