#!/usr/bin/python3
"""An independent numpy (float64) reference of a trident model with
mixture-of-experts layers (docs/moe.md), for tests/test_moe.c.

  moe_ref.py DUMP

DUMP (written by test_moe.c) holds the config, one micro-batch, trident's
loss, router statistics, its parameters and the gradients of one backward.
This recomputes the forward from the documented definitions (router:
softmax, top-k with ties to the lower index, renormalised; experts in token
order up to the capacity; Switch load-balancing loss and z-loss) and checks:
  - the cross-entropy, the summed aux and z-losses and the dropped count;
  - the gradient of CE + aux_coef * sum aux + z_coef * sum z against
    central finite differences of this forward, on sampled coordinates of
    every MoE tensor and of tensors upstream of the MoE layers.
Exits 1 on a mismatch."""
import math
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from hf_export_check import attend, gelu_tanh, layernorm, rmsnorm, silu  # noqa: E402


def read_dump(path):
    cfg, params, grads, table = {}, None, None, []
    with open(path) as f:
        for line in f:
            k, *v = line.split()
            if k == "param":
                table.append((v[0], int(v[1]), int(v[2]), int(v[3])))
            elif k == "params":
                params = np.array(v, dtype=np.float64)
            elif k == "grads":
                grads = np.array(v, dtype=np.float64)
            else:
                cfg[k] = [float(x) for x in v]
    w = {n: params[o:o + r * c].reshape(r, c) if c > 1 else params[o:o + r]
         for n, r, c, o in table}
    g = {n: grads[o:o + r * c].reshape(r, c) if c > 1 else grads[o:o + r]
         for n, r, c, o in table}
    return cfg, w, g


def moe_mlp(m, w, s, mc):
    """The MLP branch of a MoE layer over rows m [N, C]: (out, aux, z, dropped)."""
    E, K, Fe, S, cf, gpt2 = mc["E"], mc["K"], mc["Fe"], mc["S"], mc["cf"], mc["gpt2"]
    N, C = m.shape
    logits = m @ w[s + "moe.router.weight"].T
    mx = logits.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[:, 0]
    p = np.exp(logits - lse[:, None])
    idx = np.argsort(-p, axis=1, kind="stable")[:, :K]   # ties: lower index first
    pk = np.take_along_axis(p, idx, 1)
    wts = pk / pk.sum(1, keepdims=True)

    def expert(e, x):
        if gpt2:
            h = gelu_tanh(x @ w[s + "moe.experts.fc.weight"][e * Fe:(e + 1) * Fe].T
                          + w[s + "moe.experts.fc.bias"][e * Fe:(e + 1) * Fe])
            return (h @ w[s + "moe.experts.proj.weight"][e * C:(e + 1) * C].T
                    + w[s + "moe.experts.proj.bias"][e * C:(e + 1) * C])
        h = (silu(x @ w[s + "moe.experts.gate.weight"][e * Fe:(e + 1) * Fe].T)
             * (x @ w[s + "moe.experts.up.weight"][e * Fe:(e + 1) * Fe].T))
        return h @ w[s + "moe.experts.down.weight"][e * C:(e + 1) * C].T

    # Capacity: an expert keeps its first `cap` assignments in token order.
    cap = math.ceil(cf * N * K / E) if cf > 0 else N
    kept = np.zeros((N, K), bool)
    seen = np.zeros(E, int)
    for n in range(N):
        for j in range(K):
            e = idx[n, j]
            kept[n, j] = seen[e] < cap
            seen[e] += 1
    dropped = int((~kept).sum())
    out = np.zeros_like(m)
    for e in range(E):
        n, j = np.nonzero((idx == e) & kept)
        if len(n):
            out[n] += wts[n, j][:, None] * expert(e, m[n])
    if S > 0:
        if gpt2:
            h = gelu_tanh(m @ w[s + "moe.shared.fc.weight"].T + w[s + "moe.shared.fc.bias"])
            out += h @ w[s + "moe.shared.proj.weight"].T + w[s + "moe.shared.proj.bias"]
        else:
            h = silu(m @ w[s + "moe.shared.gate.weight"].T) * (m @ w[s + "moe.shared.up.weight"].T)
            out += h @ w[s + "moe.shared.down.weight"].T
    f = np.bincount(idx.ravel(), minlength=E) / (N * K)
    aux = E * float(np.sum(f * p.mean(0)))
    z = float(np.mean(lse ** 2))
    return out, aux, z, dropped


def forward(cfg, w, mc):
    """(CE, sum aux, sum z, dropped) over the micro-batch."""
    gpt2 = mc["gpt2"]
    L, C, H, KV = (int(cfg["dims"][i]) for i in range(4))
    B, T = int(cfg["dims"][4]), int(cfg["dims"][5])
    every = int(cfg["moe"][2])
    eps = cfg["eps"][0]
    hs, Q = C // H, H // KV
    tok = np.array(cfg["tokens"], int)
    tgt = np.array(cfg["targets"], int)
    x = w["embed.wte.weight"][tok]
    if gpt2:
        x = x + np.tile(w["embed.wpe.weight"][:T], (B, 1))

    def norm(x, s):
        return rmsnorm(x, w[s + ".weight"], eps) if not gpt2 else \
            layernorm(x, w[s + ".weight"], w[s + ".bias"], eps)

    def linear(x, s):
        y = x @ w[s + ".weight"].T
        return y + w[s + ".bias"] if s + ".bias" in w else y

    aux_sum = z_sum = 0.0
    dropped = 0
    for l in range(L):
        s = f"layers.{l}."
        qkv = linear(norm(x, s + "ln1"), s + "attn.qkv").reshape(B, T, KV, Q + 2, hs)
        if not gpt2:
            i = np.arange(hs // 2)
            ang = np.arange(T)[:, None] * cfg["rope"][0] ** (-2.0 * i / hs)
            c, sn = np.cos(ang)[:, None, None], np.sin(ang)[:, None, None]
            x0, x1 = qkv[..., :Q + 1, 0::2].copy(), qkv[..., :Q + 1, 1::2].copy()
            qkv[..., :Q + 1, 0::2] = x0 * c - x1 * sn
            qkv[..., :Q + 1, 1::2] = x0 * sn + x1 * c
        att = []
        for b in range(B):
            q = qkv[b, :, :, :Q].reshape(T, H, hs).transpose(1, 0, 2)
            k = np.repeat(qkv[b, :, :, Q].transpose(1, 0, 2), Q, axis=0)
            v = np.repeat(qkv[b, :, :, Q + 1].transpose(1, 0, 2), Q, axis=0)
            att.append(attend(q, k, v))
        x = x + linear(np.concatenate(att), s + "attn.proj")
        m = norm(x, s + "ln2")
        if (l + 1) % every == 0:
            y, aux, z, dr = moe_mlp(m, w, s, mc)
            x = x + y
            aux_sum, z_sum, dropped = aux_sum + aux, z_sum + z, dropped + dr
        elif gpt2:
            x = x + linear(gelu_tanh(linear(m, s + "mlp.fc")), s + "mlp.proj")
        else:
            x = x + linear(silu(linear(m, s + "mlp.gate")) * linear(m, s + "mlp.up"), s + "mlp.down")
    x = norm(x, "final_norm")
    head = w["head.weight"] if "head.weight" in w else w["embed.wte.weight"]
    logits = x @ head.T
    V = int(cfg["dims"][6])
    logits = logits[:, :V]
    keep = tgt >= 0
    mx = logits.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[:, 0]
    ce = float(np.mean((lse - logits[np.arange(len(tgt)), np.maximum(tgt, 0)])[keep]))
    return ce, aux_sum, z_sum, dropped


def main():
    cfg, w, g = read_dump(sys.argv[1])
    E, K, every, Fe, S = (int(v) for v in cfg["moe"][:5])
    aux_coef, z_coef, cf = cfg["moe"][5:8]
    mc = {"E": E, "K": K, "Fe": Fe, "S": S, "cf": cf, "gpt2": cfg["gpt2"][0] == 1}
    fails = 0

    def check(ok, msg):
        nonlocal fails
        print(("ok   " if ok else "FAIL ") + msg)
        fails += not ok

    ce, aux, z, dropped = forward(cfg, w, mc)
    t_ce, t_aux, t_z, t_drop = cfg["result"]
    check(abs(ce - t_ce) <= 1e-5 * abs(ce), f"cross-entropy {t_ce:.7g} vs reference {ce:.7g}")
    check(abs(aux - t_aux) <= 1e-5 * abs(aux), f"aux loss {t_aux:.7g} vs reference {aux:.7g}")
    check(abs(z - t_z) <= 1e-5 * abs(z), f"z-loss {t_z:.7g} vs reference {z:.7g}")
    check(int(t_drop) == dropped, f"dropped {int(t_drop)} vs reference {dropped}")

    def total():
        c, a, zz, _ = forward(cfg, w, mc)
        return c + aux_coef * a + z_coef * zz

    rng = np.random.default_rng(7)
    names = [n for n in w if ".moe." in n] + ["layers.0.ln2.weight", "layers.0.attn.qkv.weight",
                                               "embed.wte.weight"]
    h = 1e-5
    for n in names:
        t = w[n].reshape(-1)
        gt = g[n].reshape(-1)
        if n == "embed.wte.weight":   # rows of the batch's tokens only
            C = w[n].shape[1]
            cand = np.concatenate([np.arange(r * C, (r + 1) * C) for r in set(cfg["tokens"][:4])])
        else:
            cand = np.arange(t.size)
        pick = rng.choice(cand.astype(int), size=min(6, cand.size), replace=False)
        fd = np.empty(len(pick))
        for i, j in enumerate(pick):
            keep = t[j]
            t[j] = keep + h
            up = total()
            t[j] = keep - h
            dn = total()
            t[j] = keep
            fd[i] = (up - dn) / (2 * h)
        scale = max(np.abs(fd).max(), 1e-6)
        err = np.abs(gt[pick] - fd).max() / scale
        check(err < 1e-4, f"{n}: gradient vs finite differences, max error {err:.2e} "
                          f"of the largest {scale:.2e}")
    print(f"moe_ref: {fails} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
