#!/usr/bin/python3
"""Check a PEFT adapter directory written by `trident ckpt export --format peft`
against the merged and the base Hugging Face exports, with numpy only.

  peft_check.py PEFT_DIR BASE_HF_DIR MERGED_HF_DIR

adapter_model.safetensors is parsed here (an 8-byte header length, a JSON
header, raw little-endian tensors), not by trident's or the test helpers'
reader.  Checks: adapter_config.json says LORA, r, lora_alpha, and
fan_in_fan_out exactly for a GPT-2 base (its Conv1D weights are [in, out]);
its target_modules, matched as peft matches them (a module whose full name
is an entry or ends in "." + an entry), select exactly the adapted
modules among the base's 2-D weights; every tensor is named
base_model.model.<module>.lora_A.weight / lora_B.weight of a module of the
base, with A [r, in] and B [out, r] of that module's weight (Llama's
nn.Linear [out, in], GPT-2's Conv1D [in, out]); for every adapted module
the merged export's weight is the base's + (lora_alpha / r) B A,
transposed for Conv1D (relative 1e-6), and every other tensor of the
merged export equals the base's.
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
    conv1d = json.load(open(f"{base_dir}/config.json"))["model_type"] == "gpt2"
    if conf.get("fan_in_fan_out") is not conv1d:
        fail(f"adapter_config.json: fan_in_fan_out {conf.get('fan_in_fan_out')} for a "
             f"{'GPT-2 (Conv1D)' if conv1d else 'Llama (nn.Linear)'} base")
    pat = re.compile(r"base_model\.model\.(.+)\.lora_([AB])\.weight")
    modules = {}
    for name, t in ad.items():
        m = pat.fullmatch(name)
        w = base.get(m.group(1) + ".weight") if m else None
        if w is None or w.ndim != 2:
            fail(f"unexpected tensor name {name}: not an adapter of a linear layer of the base")
        out, inp = w.shape[::-1] if conv1d else w.shape
        want = (r, inp) if m.group(2) == "A" else (out, r)
        if t.shape != want:
            fail(f"{name}: shape {t.shape}, expected {want}")
        modules.setdefault(m.group(1), {})[m.group(2)] = t
    targets = conf["target_modules"]
    linear = [n[:-len(".weight")] for n, w in base.items() if n.endswith(".weight") and w.ndim == 2]
    chosen = {k for k in linear if k in targets or any(k.endswith("." + t) for t in targets)}
    if chosen != set(modules):
        fail(f"target_modules {targets} select {sorted(chosen - set(modules))[:4]} without "
             f"adapters and leave {sorted(set(modules) - chosen)[:4]} out")
    s = alpha / r
    for k, ab in modules.items():
        if set(ab) != {"A", "B"}:
            fail(f"{k}: lora_A and lora_B expected, got {sorted(ab)}")
        w = k + ".weight"
        delta = s * ab["B"] @ ab["A"]
        want = base[w] + (delta.T if conv1d else delta)
        err = np.abs(merged[w] - want).max() / max(np.abs(want).max(), 1e-30)
        if err > 1e-6:
            fail(f"{w}: merged export differs from base + (alpha/r) B A by {err:.3g} relative")
        if not np.any(ab["B"]):
            fail(f"{k}: lora_B is all zero (the adapters were not trained)")
    untouched = [n for n in base if n not in {k + ".weight" for k in modules}]
    for n in untouched:
        if not np.array_equal(base[n], merged[n]):
            fail(f"{n}: not adapted, yet the merged export differs from the base")
    if set(base) != set(merged):
        fail("the merged and the base exports hold different tensors")
    print(f"ok   PEFT adapters ({'GPT-2, Conv1D' if conv1d else 'Llama'}): {len(ad)} tensors of "
          f"{len(modules)} modules (r {r}, alpha {alpha}, targets {sorted(targets)}), merged = base "
          f"+ (alpha/r) B A{'^T' if conv1d else ''} for each; {len(untouched)} other tensors equal "
          f"the base's")


if __name__ == "__main__":
    main()
