#!/usr/bin/python3
"""Check a `trident ckpt export --format hf` directory against its checkpoint.

Independent of trident's C code and of the safetensors / transformers
libraries (neither is installed here): numpy and h5py only.

  hf_export_check.py HF_DIR STEP_DIR [--tokens IDS --loss L]

1. safetensors: its own parser of the format (8-byte little-endian header
   length, JSON header, data); the header length is a multiple of 8, the
   offsets are contiguous from 0 and end at the end of the file, every
   dtype / shape matches config.json, the sharded index (when there is one)
   names every tensor and its total_size is the sum of their bytes.
2. every tensor equals its trident source exactly, mapped here by a Python
   implementation of the conventions (fp32: bit for bit; bf16: the
   round-to-nearest-even of the fp32 value).
3. two forwards in float64 on a short prompt: Hugging Face's
   GPT2LMHeadModel / LlamaForCausalLM written in numpy over the exported
   tensors (Conv1D, [Q|K|V], half-split rotate_half RoPE, repeated kv
   heads), and trident's over the checkpoint (fused per-kv-group qkv,
   interleaved-pair RoPE); their logits agree within 1e-5 relative.
   MixtralForCausalLM (a llama checkpoint with model.moe) is Llama with
   HF's MixtralSparseMoeBlock in place of the MLP (softmax over the
   router's logits, top-k, renormalised, SwiGLU experts w2(silu(w1 x) *
   w3 x)); trident's side is tests/moe_ref.py's MoE layer (dropless).
4. with --tokens (T+1 ids) and --loss, trident's forward gives that mean
   cross-entropy (the val_loss trident printed for that one sequence): the
   check that the trident-convention forward is trident's.
"""
import json
import os
import struct
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rope_llama3_ref import llama3_inv_freq  # noqa: E402


def fail(msg):
    print(f"hf_export_check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


# ---- safetensors, read by hand ------------------------------------------

ITEM = {"F32": 4, "BF16": 2}


def read_safetensors(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        check(len(raw) == 8, f"{path}: shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        check(8 + n <= size, f"{path}: header length {n} past the end of the file ({size} bytes)")
        check((8 + n) % 8 == 0, f"{path}: data does not start 8-byte aligned (header {n} bytes)")
        header = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    check(header.pop("__metadata__", None) == {"format": "pt"},
          f"{path}: __metadata__ is not {{'format': 'pt'}}")
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    at = 0
    for s, e, k in spans:
        check(s == at, f"{path}: tensor {k} starts at {s}, the previous one ends at {at}")
        check(e >= s, f"{path}: tensor {k}: end {e} before start {s}")
        at = e
    check(at == len(data), f"{path}: data section is {len(data)} bytes, tensors cover {at}")
    out = {}
    for k, v in header.items():
        dt, shape = v["dtype"], v["shape"]
        check(dt in ITEM, f"{path}: tensor {k}: dtype {dt} (expected F32 or BF16)")
        s, e = v["data_offsets"]
        check(e - s == int(np.prod(shape)) * ITEM[dt],
              f"{path}: tensor {k}: {e - s} bytes for shape {shape} {dt}")
        buf = np.frombuffer(data[s:e], dtype="<u4" if dt == "F32" else "<u2")
        bits = buf.astype(np.uint32) << (0 if dt == "F32" else 16)
        out[k] = (dt, bits.view(np.float32).reshape(shape))
    return out


def load_hf(d):
    cfg = json.load(open(f"{d}/config.json"))
    single, index = f"{d}/model.safetensors", f"{d}/model.safetensors.index.json"
    check(os.path.exists(single) != os.path.exists(index),
          f"{d}: exactly one of model.safetensors and its index expected")
    tensors = {}
    if os.path.exists(single):
        tensors = read_safetensors(single)
        files = ["model.safetensors"]
    else:
        ix = json.load(open(index))
        files = sorted(set(ix["weight_map"].values()))
        for i, name in enumerate(files):
            check(name == f"model-{i + 1:05d}-of-{len(files):05d}.safetensors",
                  f"{index}: shard names: {files}")
            part = read_safetensors(f"{d}/{name}")
            for k in part:
                check(ix["weight_map"].get(k) == name, f"{index}: {k} is in {name}, the map says "
                      f"{ix['weight_map'].get(k)}")
            tensors.update(part)
        check(set(tensors) == set(ix["weight_map"]), f"{index}: weight_map and shards differ")
        total = sum(t.size * ITEM[dt] for dt, t in tensors.values())
        check(ix["metadata"]["total_size"] == total,
              f"{index}: total_size {ix['metadata']['total_size']}, tensors hold {total}")
    want = {"float32": "F32", "bfloat16": "BF16"}[cfg["torch_dtype"]]
    for k, (dt, _) in tensors.items():
        check(dt == want, f"{k}: dtype {dt}, config.json says {cfg['torch_dtype']}")
    return cfg, {k: t for k, (dt, t) in tensors.items()}, files, want


def expected_shapes(cfg):
    if cfg["model_type"] == "gpt2":
        C, V, L, F = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"], cfg["n_inner"]
        s = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [cfg["n_positions"], C],
             "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
        for l in range(L):
            p = f"transformer.h.{l}."
            s.update({p + "ln_1.weight": [C], p + "ln_1.bias": [C], p + "ln_2.weight": [C],
                      p + "ln_2.bias": [C], p + "attn.c_attn.weight": [C, 3 * C],
                      p + "attn.c_attn.bias": [3 * C], p + "attn.c_proj.weight": [C, C],
                      p + "attn.c_proj.bias": [C], p + "mlp.c_fc.weight": [C, F],
                      p + "mlp.c_fc.bias": [F], p + "mlp.c_proj.weight": [F, C],
                      p + "mlp.c_proj.bias": [C]})
    else:
        C, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
        F, H, K = cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hs = C // H
        s = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
        for l in range(L):
            p = f"model.layers.{l}."
            s.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                      p + "self_attn.q_proj.weight": [H * hs, C],
                      p + "self_attn.k_proj.weight": [K * hs, C],
                      p + "self_attn.v_proj.weight": [K * hs, C],
                      p + "self_attn.o_proj.weight": [C, H * hs]})
            if cfg["model_type"] == "mixtral":   # intermediate_size: an expert's width
                E = cfg["num_local_experts"]
                s[p + "block_sparse_moe.gate.weight"] = [E, C]
                for e in range(E):
                    x = f"{p}block_sparse_moe.experts.{e}."
                    s.update({x + "w1.weight": [F, C], x + "w3.weight": [F, C],
                              x + "w2.weight": [C, F]})
            else:
                s.update({p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                          p + "mlp.down_proj.weight": [C, F]})
    if not cfg["tie_word_embeddings"]:
        s["lm_head.weight"] = [V, C]
    return s


# ---- the trident checkpoint --------------------------------------------

def load_trident(step):
    with h5py.File(f"{step}/index.h5") as ix:
        model = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in ix["model"].attrs.items()}
        recs = ix["tensors"][...]
    kinds = {r["kind"].decode() for r in recs}
    kind = "master" if "master" in kinds else "params"
    w = {}
    for r in recs:
        if r["kind"].decode() != kind:
            continue
        name = r["name"].decode()
        with h5py.File(f"{step}/{r['file'].decode()}") as f:
            w[name] = f[f"{kind}/{name}"][...].astype(np.float32)
    return model, w, kind


def rne_bf16(a):
    b = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return r.view(np.float32)


def to_hf(model, w):
    """The HF tensors of a trident checkpoint, written from the conventions."""
    arch, L = model["arch"], int(model["layers"])
    C, H, K = int(model["hidden"]), int(model["heads"]), int(model["kv_heads"])
    hs, Q = C // H, H // K
    tied = bool(model["tie_embeddings"])

    def qkv_parts(t):
        # trident: per kv group g, Q query heads, one k head, one v head.
        g = t.reshape((K, Q + 2, hs) + t.shape[1:])
        q = g[:, :Q].reshape((H * hs,) + t.shape[1:])
        k = g[:, Q].reshape((K * hs,) + t.shape[1:])
        v = g[:, Q + 1].reshape((K * hs,) + t.shape[1:])
        return q, k, v

    def half_split(t, heads):
        # trident's pair (2i, 2i+1) -> HF's (i, i + hs/2) in every head
        r = t.reshape((heads, hs // 2, 2) + t.shape[1:])
        return np.concatenate([r[:, :, 0], r[:, :, 1]], axis=1).reshape(t.shape)

    out = {}
    if arch == "gpt2":
        out["transformer.wte.weight"] = w["embed.wte.weight"]
        out["transformer.wpe.weight"] = w["embed.wpe.weight"]
        out["transformer.ln_f.weight"] = w["final_norm.weight"]
        out["transformer.ln_f.bias"] = w["final_norm.bias"]
        for l in range(L):
            s, p = f"layers.{l}.", f"transformer.h.{l}."
            out[p + "ln_1.weight"], out[p + "ln_1.bias"] = w[s + "ln1.weight"], w[s + "ln1.bias"]
            out[p + "ln_2.weight"], out[p + "ln_2.bias"] = w[s + "ln2.weight"], w[s + "ln2.bias"]
            out[p + "attn.c_attn.weight"] = np.concatenate(qkv_parts(w[s + "attn.qkv.weight"])).T
            out[p + "attn.c_attn.bias"] = np.concatenate(qkv_parts(w[s + "attn.qkv.bias"]))
            out[p + "attn.c_proj.weight"] = w[s + "attn.proj.weight"].T
            out[p + "attn.c_proj.bias"] = w[s + "attn.proj.bias"]
            out[p + "mlp.c_fc.weight"] = w[s + "mlp.fc.weight"].T
            out[p + "mlp.c_fc.bias"] = w[s + "mlp.fc.bias"]
            out[p + "mlp.c_proj.weight"] = w[s + "mlp.proj.weight"].T
            out[p + "mlp.c_proj.bias"] = w[s + "mlp.proj.bias"]
    else:
        out["model.embed_tokens.weight"] = w["embed.wte.weight"]
        out["model.norm.weight"] = w["final_norm.weight"]
        for l in range(L):
            s, p = f"layers.{l}.", f"model.layers.{l}."
            q, k, v = qkv_parts(w[s + "attn.qkv.weight"])
            out[p + "self_attn.q_proj.weight"] = half_split(q, H)
            out[p + "self_attn.k_proj.weight"] = half_split(k, K)
            out[p + "self_attn.v_proj.weight"] = v
            out[p + "self_attn.o_proj.weight"] = w[s + "attn.proj.weight"]
            out[p + "input_layernorm.weight"] = w[s + "ln1.weight"]
            out[p + "post_attention_layernorm.weight"] = w[s + "ln2.weight"]
            if s + "moe.router.weight" in w:   # Mixtral: the stacked experts, one by one
                E = w[s + "moe.router.weight"].shape[0]
                out[p + "block_sparse_moe.gate.weight"] = w[s + "moe.router.weight"]
                for name, src in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
                    for e, part in enumerate(np.split(w[s + f"moe.experts.{src}.weight"], E)):
                        out[f"{p}block_sparse_moe.experts.{e}.{name}.weight"] = part
                continue
            out[p + "mlp.gate_proj.weight"] = w[s + "mlp.gate.weight"]
            out[p + "mlp.up_proj.weight"] = w[s + "mlp.up.weight"]
            out[p + "mlp.down_proj.weight"] = w[s + "mlp.down.weight"]
    if not tied:
        out["lm_head.weight"] = w["head.weight"]
    return out


# ---- forwards, float64 --------------------------------------------------

def layernorm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def attend(q, k, v):
    """q [H, T, hs], k, v [H, T, hs] (kv already per query head) -> [T, H*hs]."""
    T, hs = q.shape[1], q.shape[2]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(hs)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(T, -1)


def mixtral_moe(cfg, t, p, m):
    """HF's MixtralSparseMoeBlock over rows m [T, C]: softmax over the
    router's logits, the top k (ties to the lower expert, as trident's
    router breaks them), their weights renormalised to sum 1, each token
    through its experts w2(silu(w1 x) * w3 x), weighted and summed."""
    E, k = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    logits = m @ t[p + "gate.weight"].T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    top = np.argsort(-prob, axis=1, kind="stable")[:, :k]
    wts = np.take_along_axis(prob, top, 1)
    wts /= wts.sum(1, keepdims=True)
    out = np.zeros_like(m)
    for e in range(E):
        rows, j = np.nonzero(top == e)
        if len(rows):
            x, q = m[rows], f"{p}experts.{e}."
            h = silu(x @ t[q + "w1.weight"].T) * (x @ t[q + "w3.weight"].T)
            out[rows] += wts[rows, j][:, None] * (h @ t[q + "w2.weight"].T)
    return out


def hf_forward(cfg, t, ids):
    t = {k: v.astype(np.float64) for k, v in t.items()}
    T = len(ids)
    if cfg["model_type"] == "gpt2":
        C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
        hs = C // H
        x = t["transformer.wte.weight"][ids] + t["transformer.wpe.weight"][:T]
        for l in range(cfg["n_layer"]):
            p = f"transformer.h.{l}."
            a = layernorm(x, t[p + "ln_1.weight"], t[p + "ln_1.bias"], eps)
            qkv = a @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]   # Conv1D
            q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, hs).transpose(1, 0, 2)
                       for i in range(3))
            x = x + attend(q, k, v) @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
            m = layernorm(x, t[p + "ln_2.weight"], t[p + "ln_2.bias"], eps)
            h = gelu_tanh(m @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"])
            x = x + h @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
        x = layernorm(x, t["transformer.ln_f.weight"], t["transformer.ln_f.bias"], eps)
        head = t["transformer.wte.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
        return x @ head.T
    C, H, K = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    hs = C // H
    inv = 1.0 / theta ** (np.arange(0, hs, 2) / hs)
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":   # Llama 3.1's
        inv = llama3_inv_freq(theta, hs, rs["factor"], rs["low_freq_factor"],
                              rs["high_freq_factor"], rs["original_max_position_embeddings"])
    elif rs and rs.get("rope_type", rs.get("type")) != "default":
        fail(f"hf_forward: rope_scaling {rs} is not modelled here")
    ang = np.outer(np.arange(T), inv)
    emb = np.concatenate([ang, ang], -1)
    cos, sin = np.cos(emb), np.sin(emb)

    def rope(x):   # x [heads, T, hs]; HF's rotate_half
        h2 = hs // 2
        rot = np.concatenate([-x[..., h2:], x[..., :h2]], -1)
        return x * cos + rot * sin

    x = t["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = rmsnorm(x, t[p + "input_layernorm.weight"], eps)
        q = (a @ t[p + "self_attn.q_proj.weight"].T).reshape(T, H, hs).transpose(1, 0, 2)
        k = (a @ t[p + "self_attn.k_proj.weight"].T).reshape(T, K, hs).transpose(1, 0, 2)
        v = (a @ t[p + "self_attn.v_proj.weight"].T).reshape(T, K, hs).transpose(1, 0, 2)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, H // K, axis=0), np.repeat(v, H // K, axis=0)   # repeat_kv
        x = x + attend(q, k, v) @ t[p + "self_attn.o_proj.weight"].T
        m = rmsnorm(x, t[p + "post_attention_layernorm.weight"], eps)
        if cfg["model_type"] == "mixtral":
            x = x + mixtral_moe(cfg, t, p + "block_sparse_moe.", m)
            continue
        g = silu(m @ t[p + "mlp.gate_proj.weight"].T) * (m @ t[p + "mlp.up_proj.weight"].T)
        x = x + g @ t[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
    return x @ head.T


def trident_forward(model, w, ids):
    """trident's model (src/model, src/backend/cpu_ops.inc) over its own tensors."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    llama = model["arch"] == "llama"
    C, H, K, L = (int(model[k]) for k in ("hidden", "heads", "kv_heads", "layers"))
    eps, theta = float(model["norm_eps"]), float(model["rope_theta"])
    hs, Q, T = C // H, H // K, len(ids)
    x = w["embed.wte.weight"][ids]
    if not llama:
        x = x + w["embed.wpe.weight"][:T]

    def norm(x, s):
        if llama:
            return rmsnorm(x, w[s + ".weight"], eps)
        return layernorm(x, w[s + ".weight"], w[s + ".bias"], eps)

    def linear(x, s):
        y = x @ w[s + ".weight"].T
        return y + w[s + ".bias"] if s + ".bias" in w else y

    for l in range(L):
        s = f"layers.{l}."
        qkv = linear(norm(x, s + "ln1"), s + "attn.qkv").reshape(T, K, Q + 2, hs)
        if llama:   # rope_apply: pairs (2i, 2i+1) of every q and k head
            i = np.arange(hs // 2)
            ang = np.arange(T)[:, None] * theta ** (-2.0 * i / hs)
            c, sn = np.cos(ang)[:, None, None], np.sin(ang)[:, None, None]
            x0, x1 = qkv[:, :, :Q + 1, 0::2].copy(), qkv[:, :, :Q + 1, 1::2].copy()
            qkv[:, :, :Q + 1, 0::2] = x0 * c - x1 * sn
            qkv[:, :, :Q + 1, 1::2] = x0 * sn + x1 * c
        q = qkv[:, :, :Q].reshape(T, H, hs).transpose(1, 0, 2)        # head g*Q + j
        k = np.repeat(qkv[:, :, Q].transpose(1, 0, 2), Q, axis=0)
        v = np.repeat(qkv[:, :, Q + 1].transpose(1, 0, 2), Q, axis=0)
        x = x + linear(attend(q, k, v), s + "attn.proj")
        m = norm(x, s + "ln2")
        if s + "moe.router.weight" in w:   # tests/moe_ref.py's layer, dropless
            from moe_ref import moe_mlp
            E, k, _, Fe, S = (int(v) for v in model["moe"])
            mc = {"E": E, "K": k, "Fe": Fe or int(model["ffn_hidden"]), "S": S, "cf": 0,
                  "gpt2": not llama}
            x = x + moe_mlp(m, w, s, mc)[0]
        elif llama:
            h = silu(linear(m, s + "mlp.gate")) * linear(m, s + "mlp.up")
            x = x + linear(h, s + "mlp.down")
        else:
            x = x + linear(gelu_tanh(linear(m, s + "mlp.fc")), s + "mlp.proj")
    x = norm(x, "final_norm")
    head = w["head.weight"] if "head.weight" in w else w["embed.wte.weight"]
    return x @ head.T


def cross_entropy(logits, targets):
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    return float(np.mean(lse - logits[np.arange(len(targets)), targets]))


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        fail(__doc__)
    hf_dir, step = args[0], args[1]
    opts = dict(zip(args[2::2], args[3::2]))
    cfg, hf, files, dtype = load_hf(hf_dir)
    shapes = expected_shapes(cfg)
    check(set(hf) == set(shapes), f"tensor names: missing {sorted(set(shapes) - set(hf))}, "
          f"unexpected {sorted(set(hf) - set(shapes))}")
    for k, s in shapes.items():
        check(list(hf[k].shape) == s, f"{k}: shape {list(hf[k].shape)}, config.json implies {s}")

    model, w, kind = load_trident(step)
    check(cfg["vocab_size"] == int(model["vocab"]), "vocab_size is not the checkpoint's vocab")
    if dtype == "BF16":
        w = {k: rne_bf16(v) for k, v in w.items()}
    want = to_hf(model, w)
    for k, t in hf.items():
        check(np.array_equal(t.view(np.uint32), np.ascontiguousarray(want[k]).view(np.uint32)),
              f"{k}: differs from its trident source ({kind}"
              f"{', rounded to bf16' if dtype == 'BF16' else ''})")

    V = cfg["vocab_size"]
    prompt = np.array([464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 50256, 40, 1101,
                       V - 1, 0, 11][:int(model["seq_len"])]) % V   # (a byte vocabulary too)
    a, b = hf_forward(cfg, hf, prompt), trident_forward(model, w, prompt)
    rel = float(np.abs(a - b).max() / np.abs(b).max())
    check(rel < 1e-5, f"logits of the HF forward and trident's differ: relative {rel:.3g}")
    line = (f"{hf_dir}: {cfg['architectures'][0]}, {len(hf)} tensors in {len(files)} file(s), "
            f"{dtype}, equal to trident's {kind}; logits agree to {rel:.2g} relative")
    if "--tokens" in opts:
        ids = np.array([int(t) for t in opts["--tokens"].split()])
        T = int(model["seq_len"])
        check(len(ids) >= T + 1, f"--tokens: {len(ids)} ids, need seq_len + 1 = {T + 1}")
        ce = cross_entropy(trident_forward(model, w, ids[:T]), ids[1:T + 1])
        ce_hf = cross_entropy(hf_forward(cfg, hf, ids[:T]), ids[1:T + 1])
        want_ce = float(opts["--loss"])
        check(abs(ce - want_ce) <= 1e-4 * abs(want_ce),
              f"trident-convention forward: loss {ce:.7g}, trident printed {want_ce:.7g}")
        check(abs(ce_hf - want_ce) <= 1e-4 * abs(want_ce),
              f"HF forward: loss {ce_hf:.7g}, trident printed {want_ce:.7g}")
        line += f"; loss {ce:.7g} (HF {ce_hf:.7g}) = trident's val_loss {want_ce:.7g}"
    print(line)


if __name__ == "__main__":
    main()
