#!/usr/bin/python3
"""LoRA's gradients and AdamW steps against an independent numpy reference.

  lora_ref.py BASE_HF_DIR PEFT_STEP1 PEFT_STEP2 METRICS_JSONL TOKENS LR [DROPOUT SEED]

The reference is Hugging Face's LlamaForCausalLM in numpy float64 (the
base model's HF export) with PEFT's LoRA layers: each adapted linear
layer gives x W^T + (alpha/r) B A dropout(x), the adapters taken from the
PEFT exports of the run's step 1 and 2 checkpoints (q_proj, k_proj and
v_proj share one A and one dropout mask: trident's fused qkv adapter).
With DROPOUT p > 0 the masks are drawn here as trident documents them
(docs/finetune.md, src/model/model.c lora_dropout): Philox-4x32-10,
written here from the paper and checked against Random123's known answer,
keyed by (SEED, layer, target), counter (row, column / 4), word column % 4,
dropped below p 2^32, kept elements scaled by 1 / (1 - p); the row of
token t of step s (global batch 1) is (s - 1) x seq_len + t.  Its gradients are central
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
from hf_export_check import attend, load_hf, rmsnorm, silu  # noqa: E402
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


M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1


def philox(c_lo, c_hi, key):
    """Philox-4x32-10 (Salmon et al., SC'11) of the 128-bit counter
    (c_lo, c_hi) and 64-bit key: four 32-bit words."""
    c = [c_lo & M32, c_lo >> 32, c_hi & M32, c_hi >> 32]
    k0, k1 = key & M32, key >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & M32, (p0 >> 32) ^ c[3] ^ k1, p0 & M32]
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c


# Random123's known answer for philox4x32_10, counter 0 and key 0.
assert philox(0, 0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def mix(a, b):   # splitmix64's finaliser over a and b (core/rng.c rng_mix)
    z = a ^ ((b + 0x9E3779B97F4A7C15 + (a << 6) + (a >> 2)) & M64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def fnv1a(s):
    h = 0xCBF29CE484222325
    for ch in s.encode():
        h = ((h ^ ch) * 0x100000001B3) & M64
    return h


TARGET = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 2, "up_proj": 3,
          "down_proj": 4}


def masks(p, seed, step, T, layers, widths):
    """{(layer, target): [T, in] factors keep / (1 - p)} of step (1-based)."""
    if p == 0:
        return None
    p32 = float(np.float32(p))
    key0 = mix(seed, fnv1a("model.lora.dropout"))
    out = {}
    for layer in range(layers):
        for k, n_in in widths.items():
            key = mix(key0, layer * 5 + k)
            f = np.zeros((T, n_in))
            for t in range(T):
                row = (step - 1) * T + t
                for c in range(n_in):
                    w = philox(row, c // 4, key)[c % 4]
                    f[t, c] = 0.0 if w < p32 * 4294967296.0 else 1.0 / (1.0 - p32)
            out[(layer, k)] = f
    return out


def forward(cfg, base, s, var, ids, drop):
    """HF's LlamaForCausalLM (float64) with PEFT LoRA linear layers."""
    C, H, K = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, hs, T = cfg["rms_norm_eps"], C // H, len(ids)
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, hs, 2) / hs)
    ang = np.outer(np.arange(T), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):   # x [heads, T, hs]; HF's rotate_half
        rot = np.concatenate([-x[..., hs // 2:], x[..., :hs // 2]], -1)
        return x * cos + rot * sin

    def lin(x, layer, name):
        mod = f"model.layers.{layer}.{name}"
        y = x @ base[mod + ".weight"].T
        b = var.get(("B", mod))
        if b is not None:
            a = var.get(("A", mod))
            if a is None:   # k_proj, v_proj: q_proj's A
                a = var[("A", mod.rsplit(".", 1)[0] + ".q_proj")]
            xd = x if drop is None else x * drop[(layer, TARGET[name.split(".")[1]])]
            y = y + s * (xd @ a.T) @ b.T
        return y

    def heads(x, n):
        return x.reshape(T, n, hs).transpose(1, 0, 2)

    x = base["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = rmsnorm(x, base[p + "input_layernorm.weight"], eps)
        q = rope(heads(lin(a, layer, "self_attn.q_proj"), H))
        k = rope(heads(lin(a, layer, "self_attn.k_proj"), K))
        v = heads(lin(a, layer, "self_attn.v_proj"), K)
        k, v = np.repeat(k, H // K, axis=0), np.repeat(v, H // K, axis=0)   # repeat_kv
        x = x + lin(attend(q, k, v), layer, "self_attn.o_proj")
        m = rmsnorm(x, base[p + "post_attention_layernorm.weight"], eps)
        g = silu(lin(m, layer, "mlp.gate_proj")) * lin(m, layer, "mlp.up_proj")
        x = x + lin(g, layer, "mlp.down_proj")
    x = rmsnorm(x, base["model.norm.weight"], eps)
    head = base["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else base["lm_head.weight"]
    return x @ head.T


def loss_fn(cfg, base, s, var, ids, drop):
    logits = forward(cfg, base, s, var, ids[:-1], drop)
    z = logits - logits.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -lp[np.arange(len(ids) - 1), ids[1:]].mean()


def grads(cfg, base, s, var, ids, kinds, drop, h=1e-5):
    g = {}
    for k, x in var.items():
        g[k] = np.zeros_like(x)
        if k[0] not in kinds:
            continue
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + h
            up = loss_fn(cfg, base, s, var, ids, drop)
            x[i] = old - h
            down = loss_fn(cfg, base, s, var, ids, drop)
            x[i] = old
            g[k][i] = (up - down) / (2 * h)
    return g


def main():
    base_dir, p1, p2, metrics, tokens, lr = sys.argv[1:7]
    p, seed = (float(sys.argv[7]), int(sys.argv[8])) if len(sys.argv) > 8 else (0.0, 0)
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
        drop = masks(p, seed, step, len(ids) - 1, cfg["num_hidden_layers"],
                     {0: cfg["hidden_size"], 1: cfg["hidden_size"], 2: cfg["hidden_size"],
                      3: cfg["hidden_size"], 4: cfg["intermediate_size"]})
        if drop is not None:
            kept = np.mean([(f > 0).mean() for f in drop.values()])
            print(f"     step {step}: dropout {p}, {kept:.3f} of the adapters' inputs kept")
        close(f"step {step} loss", r["loss"], loss_fn(cfg, base, s, cur, ids, drop), 1e-5)
        g = grads(cfg, base, s, {k: x.copy() for k, x in cur.items()}, ids,
                  ("B",) if step == 1 else ("A", "B"), drop)
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
