"""Hugging Face's own reader on a trident export: `transformers` loads the
directory `trident ckpt export --format hf` wrote (AutoModelForCausalLM,
float32, on the GPU when there is one) and runs the full sequence of a
`trident generate --greedy --ids --dump-logits` run without a cache.  Each
of trident's tokens must be transformers' argmax (or a near-tie within
float32 rounding), and the logits trident drew each token from must equal
transformers' within --rtol of the largest magnitude.  bench/gpu.sh runs it
on the GPU machine, where transformers is installed (tests/generate_check.py
is the numpy reader that runs everywhere).

    python3 bench/hf_transformers_check.py HF_DIR IDS_FILE LOGITS_FILE [--rtol 1e-4]
"""

import argparse
import sys

import numpy as np
import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("ids", help="generate --ids output: 'PROMPT_IDS | GENERATED_IDS'")
    ap.add_argument("logits", help="generate --dump-logits output: float32 [new tokens][vocab]")
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    prompt, gen = open(a.ids).read().split("|")
    prompt = [int(t) for t in prompt.split()]
    gen = [int(t) for t in gen.split()]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    model = transformers.AutoModelForCausalLM.from_pretrained(a.hf_dir, dtype=torch.float32)
    model = model.to(dev).eval()
    V = model.config.vocab_size
    dumped = np.fromfile(a.logits, dtype=np.float32).reshape(-1, V)
    if len(dumped) != len(gen):
        sys.exit(f"hf_transformers_check: FAIL: {len(dumped)} rows of logits for {len(gen)} tokens")
    with torch.no_grad():
        ids = torch.tensor([prompt + gen], device=dev)
        logits = model(ids).logits[0].double().cpu().numpy()
    worst, ties = 0.0, 0
    for i, tok in enumerate(gen):
        row = logits[len(prompt) - 1 + i]
        rel = float(np.abs(dumped[i] - row).max() / np.abs(row).max())
        worst = max(worst, rel)
        best = int(np.argmax(row))
        if tok != best:
            if row[best] - row[tok] > 1e-5 * max(abs(row[best]), 1.0):
                sys.exit(f"hf_transformers_check: FAIL: token {i}: trident {tok}, transformers {best}")
            ties += 1
    ok = worst <= a.rtol
    print(f"{'ok  ' if ok else 'FAIL'} transformers {transformers.__version__} "
          f"{type(model).__name__} on {dev}: {len(gen)} greedy tokens of trident equal its argmax "
          f"({ties} near-ties), logits within {worst:.2e} relative (tolerance {a.rtol:g})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
