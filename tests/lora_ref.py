#!/usr/bin/python3
"""LoRA's gradients and AdamW steps against an independent numpy reference.

  lora_ref.py BASE_HF_DIR PEFT_STEP1 PEFT_STEP2 METRICS_JSONL TOKENS LR

The reference is Hugging Face's LlamaForCausalLM in numpy float64
(tests/hf_export_check.hf_forward over the base model's HF export) with
each adapted weight W + (alpha/r) B A, the adapters taken from the PEFT
exports of the run's step 1 and 2 checkpoints (q_proj, k_proj and v_proj
share one A: trident's fused qkv adapter).  Its gradients are central
finite differences of the loss (so nothing of trident's backward is
reused); the run trained one sequence (TOKENS: its seq_len + 1 ids) for
two AdamW steps with a constant LR, no weight decay and no clipping.
Checks:
  - the loss of step 1 is the base's (B starts at zero) and the loss of
    step 2 the reference's with the step 1 adapters (relative 1e-5);
  - the gradient norm of each step equals the reference's (relative 2e-5);
  - AdamW from the reference gradients gives the step 1 and step 2
    adapters (within 1e-2 x LR per element; A does not move in step 1,
    its gradient being zero while B is);
  - A starts uniform within +-1/sqrt(in) (PEFT's kaiming_uniform_(a=sqrt 5)).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_export_check import hf_forward, load_hf  # noqa: E402
from peft_check import read  # noqa: E402  (its own safetensors parser)

B1, B2, EPS = 0.9, 0.95, 1e-8   # the run's beta1, beta2, eps (trident's defaults)


def fail(msg):
    print(f"lora_ref: FAIL: {msg}")
    sys.exit(1)


def adapters(peft_dir):
    """The trained variables: one A per adapted module, q/k/v's A once."""
    conf = json.load(open(f"{peft_dir}/adapter_config.json"))
    t = read(f"{peft_dir}/adapter_model.safetensors")
    var = {}
    for name, x in sorted(t.items()):
        kind = name[-len("A.weight")]                       # "A" or "B"
        mod = name[len("base_model.model."):-len(".lora_A.weight")]
        if kind == "A":
            for p in ("k_proj", "v_proj"):   # shared with q_proj's
                if mod.endswith(p):
                    if not np.array_equal(t[name.replace(p, "q_proj")], x):
                        fail(f"{name}: A differs from q_proj's (one fused qkv adapter)")
                    break
            else:
                var[("A", mod)] = x.copy()
        else:
            var[("B", mod)] = x.copy()
    return conf["lora_alpha"] / conf["r"], var


def loss_fn(cfg, base, s, var, ids):
    t = dict(base)
    for (kind, mod), x in var.items():
        if kind != "B":
            continue
        a = var.get(("A", mod))
        if a is None:   # k_proj, v_proj: q_proj's A
            a = var[("A", mod.rsplit(".", 1)[0] + ".q_proj")]
        t[mod + ".weight"] = base[mod + ".weight"] + s * x @ a
    logits = hf_forward(cfg, t, ids[:-1])
    z = logits - logits.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -lp[np.arange(len(ids) - 1), ids[1:]].mean()


def grads(cfg, base, s, var, ids, kinds, h=1e-5):
    g = {}
    for k, x in var.items():
        g[k] = np.zeros_like(x)
        if k[0] not in kinds:
            continue
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + h
            up = loss_fn(cfg, base, s, var, ids)
            x[i] = old - h
            down = loss_fn(cfg, base, s, var, ids)
            x[i] = old
            g[k][i] = (up - down) / (2 * h)
    return g


def main():
    base_dir, p1, p2, metrics, tokens, lr = sys.argv[1:7]
    lr = float(lr)
    ids = [int(t) for t in tokens.split()]
    cfg, base, _, _ = load_hf(base_dir)
    base = {k: v.astype(np.float64) for k, v in base.items()}
    rec = [json.loads(line) for line in open(metrics)]
    s, v1 = adapters(p1)
    _, v2 = adapters(p2)
    # Before step 1: A as at step 1 (no gradient, no decay), B zero.
    v0 = {k: (x if k[0] == "A" else np.zeros_like(x)) for k, x in v1.items()}
    for k, x in v0.items():
        if k[0] == "A" and np.abs(x).max() > 1 / np.sqrt(x.shape[1]):
            fail(f"{k[1]}: A beyond PEFT's bound 1/sqrt(in)")
    good = True

    def close(what, got, want, tol):
        nonlocal good
        err = abs(got - want) / abs(want)
        ok = err <= tol
        good &= ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}: trident {got:.7g}, reference {want:.7g} "
              f"({err:.2g} relative)")

    m = {k: np.zeros_like(x) for k, x in v0.items()}
    v = {k: np.zeros_like(x) for k, x in v0.items()}
    cur = v0
    for step, (after, r) in enumerate(zip((v1, v2), rec[:2]), 1):
        close(f"step {step} loss", r["loss"], loss_fn(cfg, base, s, cur, ids), 1e-5)
        g = grads(cfg, base, s, {k: x.copy() for k, x in cur.items()}, ids,
                  ("B",) if step == 1 else ("A", "B"))
        norm = np.sqrt(sum((x ** 2).sum() for x in g.values()))
        close(f"step {step} gradient norm", r["grad_norm"], norm, 2e-5)
        nxt = {}
        worst = 0.0
        for k in cur:
            m[k] = B1 * m[k] + (1 - B1) * g[k]
            v[k] = B2 * v[k] + (1 - B2) * g[k] ** 2
            mh, vh = m[k] / (1 - B1 ** step), v[k] / (1 - B2 ** step)
            nxt[k] = cur[k] - lr * mh / (np.sqrt(vh) + EPS)
            worst = max(worst, np.abs(after[k] - nxt[k]).max() / lr)
        ok = worst <= 1e-2
        good &= ok
        print(f"{'ok  ' if ok else 'FAIL'} step {step} AdamW update of {len(cur)} adapter "
              f"matrices: within {worst:.2g} x lr of the reference's")
        cur = after
    sys.exit(0 if good else 1)


main()
