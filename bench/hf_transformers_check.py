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


def read_generate(ids_path, logits_path, vocab):
    """prompt, generated ids and the dumped logits [generated][vocab] of a
    `trident generate --ids --dump-logits` run."""
    prompt, gen = open(ids_path).read().split("|")
    prompt = [int(t) for t in prompt.split()]
    gen = [int(t) for t in gen.split()]
    dumped = np.fromfile(logits_path, dtype=np.float32).reshape(-1, vocab)
    if len(dumped) != len(gen):
        sys.exit(f"FAIL: {len(dumped)} rows of logits for {len(gen)} tokens")
    return prompt, gen, dumped


def compare(what, logits, prompt, gen, dumped, rtol, reader="transformers"):
    """(ok, line): trident's tokens and logits against one full run
    (logits [T, vocab] of prompt + gen): each token the reader's argmax or a
    near-tie within float32 rounding, the logits within rtol of the row's
    largest magnitude."""
    worst, ties = 0.0, 0
    for i, tok in enumerate(gen):
        row = logits[len(prompt) - 1 + i]
        worst = max(worst, float(np.abs(dumped[i] - row).max() / np.abs(row).max()))
        best = int(np.argmax(row))
        if tok != best:
            if row[best] - row[tok] > 1e-5 * max(abs(row[best]), 1.0):
                return False, f"FAIL {what}: token {i}: trident {tok}, {reader} {best}"
            ties += 1
    ok = worst <= rtol
    return ok, (f"{'ok  ' if ok else 'FAIL'} {what}: {len(gen)} greedy tokens of trident equal its "
                f"argmax ({ties} near-ties), logits within {worst:.2e} relative (tolerance {rtol:g})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("ids", help="generate --ids output: 'PROMPT_IDS | GENERATED_IDS'")
    ap.add_argument("logits", help="generate --dump-logits output: float32 [new tokens][vocab]")
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    model = transformers.AutoModelForCausalLM.from_pretrained(a.hf_dir, dtype=torch.float32)
    model = model.to(dev).eval()
    prompt, gen, dumped = read_generate(a.ids, a.logits, model.config.vocab_size)
    with torch.no_grad():
        ids = torch.tensor([prompt + gen], device=dev)
        logits = model(ids).logits[0].double().cpu().numpy()
    ok, line = compare(f"transformers {transformers.__version__} {type(model).__name__} on {dev}",
                       logits, prompt, gen, dumped, a.rtol)
    print(line)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
