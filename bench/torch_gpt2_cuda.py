"""PyTorch's GPU training throughput on GPT-2, the peer bench/gpu.sh runs
beside trident and llm.c in the same call: the same model shapes (tied
embeddings, GELU tanh, pre-LayerNorm, learned positions), batch, sequence
length and corpus (random windows of a Megatron .bin of uint16 tokens).

It is PyTorch as a careful user writes it for speed: bf16 autocast over
fp32 master weights, scaled_dot_product_attention (causal, PyTorch's flash
kernel), torch.compile of the model, fused AdamW, gradient clipping at 1.0,
TF32 for what stays fp32.  The figure is the median step time of the steps
after the first --warmup (compilation and autotuning excluded), with one
host synchronization a step (the loss read, as trident logs it).

    python3 bench/torch_gpt2_cuda.py --data data/brown/gpt2.bin [--batch 8 --seq 1024]

MFU counts bench_cpu's model FLOPs a token (6 x matmul parameters, LM head
included, + 12 x layers x seq x hidden) against --peak (dense bf16, H100/H200
SXM: 989 TFLOP/s), as trident's metrics do.
"""

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        hs = c // self.heads
        q, k, v = (z.view(b, t, self.heads, hs).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, layers, c, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        for mod in self.modules():  # GPT-2's initialization
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
            if isinstance(mod, nn.Linear):
                nn.init.zeros_(mod.bias)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="Megatron .bin of uint16 tokens")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak", type=float, default=989e12)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    tokens = np.memmap(a.data, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(0)

    def batch():
        starts = rng.integers(0, len(tokens) - a.seq - 1, a.batch)
        w = np.stack([tokens[s:s + a.seq + 1].astype(np.int64) for s in starts])
        w = torch.from_numpy(w).pin_memory().to(dev, non_blocking=True)
        return w[:, :-1], w[:, 1:]

    model = GPT2(a.layers, a.hidden, a.heads, a.vocab, a.seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    fwd = model if a.no_compile else torch.compile(model)
    mode = "eager" if a.no_compile else "torch.compile"
    C, L, V, T = a.hidden, a.layers, a.vocab, a.seq
    flops = (6.0 * (L * 12 * C * C + V * C) + 12.0 * L * T * C) * a.batch * a.seq

    times, losses = [], []
    for s in range(a.steps):
        x, y = batch()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(x, y)
        except Exception as e:  # noqa: BLE001 (no compiler on the machine, say)
            if fwd is model:
                raise
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            print(f"pytorch: torch.compile failed ({type(e).__name__}: {why}); eager instead",
                  flush=True)
            fwd, mode = model, f"eager (torch.compile failed: {type(e).__name__})"
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # the one host wait a step
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
    dt = statistics.median(times)
    print(f"pytorch {torch.__version__} ({torch.cuda.get_device_name()}), gpt2 "
          f"{L} layers x {C}, batch {a.batch} x {T}, bf16 autocast, "
          f"{mode}: step {1e3 * dt:.1f} ms (median of "
          f"{len(times)}), {a.batch * T / dt:.0f} tokens/s, MFU {100 * flops / dt / a.peak:.1f}%, "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"pytorch_tokens_per_s {a.batch * T / dt:.1f}")


if __name__ == "__main__":
    main()
