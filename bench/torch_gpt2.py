"""PyTorch's CPU training throughput on the shapes of bench_cpu, for
bench/cpu.sh: a GPT-2 (tied embeddings, GELU tanh, pre-LayerNorm) trained
with AdamW and gradient clipping at 1.0, against torch's own SGEMM (a
1024^3 torch.mm) measured before and after the steps of each round.

Rounds alternate between 1 thread and --threads; the round with the best
ratio of model FLOP/s to SGEMM is reported, as bench_cpu does.  Model FLOPs
per token: 6 x matmul parameters (LM head included) + 12 x layers x seq x
hidden, bench_cpu's count.

    /usr/bin/python3 bench/torch_gpt2.py --threads 2 [--rounds 2 --steps 1]
"""

import argparse
import ctypes
import ctypes.util
import math
import time

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

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        hs = c // self.heads
        q, k, v = (z.view(b, t, self.heads, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = F.softmax(att.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, layers, c, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask)
        for mod in self.modules():  # GPT-2's initialization
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
            if isinstance(mod, nn.Linear):
                nn.init.zeros_(mod.bias)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def blas_threads_setter():
    """torch.set_num_threads does not reach the BLAS Debian's torch calls
    (OpenBLAS, its own pthreads): without this, torch.mm at "1 thread" runs
    on every core."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("blas") or "libblas.so.3")
        return lib.openblas_set_num_threads
    except (OSError, AttributeError):
        return lambda n: None


def sgemm_probe():
    a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
    best = 1e30
    for rep in range(10):
        t0 = time.perf_counter()
        torch.mm(a, b.t())
        dt = time.perf_counter() - t0
        if rep > 0:
            best = min(best, dt)
    return 2.0 * 1024**3 / best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = GPT2(a.layers, a.hidden, a.heads, a.vocab, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    C, L, V, T = a.hidden, a.layers, a.vocab, a.seq
    flops = (6.0 * (L * 12 * C * C + V * C) + 12.0 * L * T * C) * a.batch * a.seq

    def step():
        opt.zero_grad(set_to_none=False)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    counts = [1, a.threads] if a.threads > 1 else [1]
    best = {}
    set_blas_threads = blas_threads_setter()
    for r in range(a.rounds):
        for nt in counts:
            torch.set_num_threads(nt)
            set_blas_threads(nt)
            if r == 0:
                step()  # warm-up: allocations, thread pool
            peak = sgemm_probe()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                loss = step()
            dt = (time.perf_counter() - t0) / a.steps
            peak = max(peak, sgemm_probe())
            ratio = flops / dt / peak
            print(f"pytorch round {r + 1}, {nt:2d} thread(s): step {1e3 * dt:8.1f} ms  "
                  f"model {1e-9 * flops / dt:6.2f} GFLOP/s  SGEMM {1e-9 * peak:6.2f} GFLOP/s  "
                  f"ratio {ratio:.3f}", flush=True)
            if nt not in best or ratio > best[nt][2]:
                best[nt] = (dt, peak, ratio)
    print(f"pytorch {torch.__version__}, final loss {loss:.4f}")
    for nt in counts:
        dt, peak, ratio = best[nt]
        print(f"pytorch {nt:2d} thread(s), best round: step {1e3 * dt:.1f} ms, training tokens/s "
              f"{a.batch * a.seq / dt:.1f}, model GFLOP/s {1e-9 * flops / dt:.2f}, SGEMM GFLOP/s "
              f"{1e-9 * peak:.2f}, ratio to SGEMM {ratio:.3f}")


if __name__ == "__main__":
    main()
