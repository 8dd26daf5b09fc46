#!/usr/bin/python3
"""Check a PEFT adapter directory written by `trident ckpt export --format peft`
against the merged and the base Hugging Face exports, with numpy only.

  peft_check.py PEFT_DIR BASE_HF_DIR MERGED_HF_DIR

adapter_model.safetensors is parsed here (an 8-byte header length, a JSON
header, raw little-endian tensors), not by trident's or the test helpers'
reader.  Checks: adapter_config.json says LORA, r, lora_alpha and the
target modules; every tensor is named base_model.model.model.layers.N.
<module>.lora_A.weight / lora_B.weight with A [r, in] and B [out, r] of the
module's Llama shapes; for every adapted module the merged export's weight
is the base's + (lora_alpha / r) B A (relative 1e-6), and every other
tensor of the merged export equals the base's.
"""
import json
import re
import struct
import sys

import numpy as np


def fail(msg):
    print(f"peft_check: FAIL: {msg}")
    sys.exit(1)


def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if v["dtype"] == "BF16":   # the upper half of an fp32 (a base exported with --dtype bf16)
            x = (np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] == "F32":
            x = np.frombuffer(data[a:b], dtype="<f4")
        else:
            fail(f"{path}: {k}: dtype {v['dtype']} not expected")
        out[k] = x.reshape(v["shape"]).astype(np.float64)
    return out


def main():
    peft, base_dir, merged_dir = sys.argv[1:4]
    conf = json.load(open(f"{peft}/adapter_config.json"))
    if conf.get("peft_type") != "LORA" or conf.get("task_type") != "CAUSAL_LM":
        fail(f"adapter_config.json: peft_type {conf.get('peft_type')}, task_type {conf.get('task_type')}")
    r, alpha = conf["r"], conf["lora_alpha"]
    ad = read(f"{peft}/adapter_model.safetensors")
    base = read(f"{base_dir}/model.safetensors")
    merged = read(f"{merged_dir}/model.safetensors")
    cfg = json.load(open(f"{base_dir}/config.json"))
    C, H, K, F = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                  cfg["intermediate_size"])
    hs = C // H
    shapes = {"self_attn.q_proj": (H * hs, C), "self_attn.k_proj": (K * hs, C),
              "self_attn.v_proj": (K * hs, C), "self_attn.o_proj": (C, H * hs),
              "mlp.gate_proj": (F, C), "mlp.up_proj": (F, C), "mlp.down_proj": (C, F)}
    pat = re.compile(r"base_model\.model\.(model\.layers\.(\d+)\.([a-z_]+\.[a-z_]+))\.lora_([AB])\.weight")
    modules = {}
    for name, t in ad.items():
        m = pat.fullmatch(name)
        if not m or m.group(3) not in shapes:
            fail(f"unexpected tensor name {name}")
        out, inp = shapes[m.group(3)]
        want = (r, inp) if m.group(4) == "A" else (out, r)
        if t.shape != want:
            fail(f"{name}: shape {t.shape}, expected {want}")
        modules.setdefault(m.group(1), {})[m.group(4)] = t
    mods = sorted({k.split(".", 3)[3] for k in modules})
    if sorted(conf["target_modules"]) != sorted(m.split(".")[1] for m in mods):
        fail(f"target_modules {conf['target_modules']}, tensors adapt {mods}")
    s = alpha / r
    for k, ab in modules.items():
        if set(ab) != {"A", "B"}:
            fail(f"{k}: lora_A and lora_B expected, got {sorted(ab)}")
        w = k + ".weight"
        want = base[w] + s * ab["B"] @ ab["A"]
        err = np.abs(merged[w] - want).max() / max(np.abs(want).max(), 1e-30)
        if err > 1e-6:
            fail(f"{w}: merged export differs from base + (alpha/r) B A by {err:.3g} relative")
        if not np.any(ab["B"]):
            fail(f"{k}: lora_B is all zero (the adapters were not trained)")
    untouched = [n for n in base if n[:-len(".weight")] not in modules]
    for n in untouched:
        if not np.array_equal(base[n], merged[n]):
            fail(f"{n}: not adapted, yet the merged export differs from the base")
    if set(base) != set(merged):
        fail("the merged and the base exports hold different tensors")
    print(f"ok   PEFT adapters: {len(ad)} tensors of {len(modules)} modules (r {r}, alpha {alpha}), "
          f"merged = base + (alpha/r) B A for each; {len(untouched)} other tensors equal the base's")


if __name__ == "__main__":
    main()
