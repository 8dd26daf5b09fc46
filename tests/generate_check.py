#!/usr/bin/python3
"""Check `trident generate --greedy --ids` against greedy decoding by repeated
full forwards of an independent model.

  generate_check.py HF_DIR|CHECKPOINT "PROMPT_IDS | GENERATED_IDS" [LOGITS_FILE]

The reference is Hugging Face's GPT2LMHeadModel / LlamaForCausalLM /
MixtralForCausalLM written in numpy (float64) over the exported
safetensors (tests/hf_export_check.py, its own safetensors reader), or,
given a trident checkpoint (a directory with `latest` or index.h5),
trident's model in numpy over its tensors (hf_export_check.trident_forward,
with tests/moe_ref.py's mixture-of-experts layer, dropless, for a MoE
model, which has no Hugging Face form when it is a gpt2): for every
generated position it runs the whole
sequence so far, without any cache, and takes the argmax.  trident's token
must be that argmax, or, where the two best logits are closer than float32
rounding can separate (relative 1e-5), the runner-up; the reference then
continues from trident's token.  With LOGITS_FILE (generate's
--dump-logits: float32 [new tokens][vocab]) the logits each token was drawn
from must equal the reference's last row within 1e-4 relative to the
largest magnitude: the key/value cache gives what a full forward gives.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_export_check import hf_forward, load_hf, load_trident, trident_forward  # noqa: E402


def reference(path):
    """(vocab, forward(ids) -> logits [T, vocab]) of an HF directory or a checkpoint."""
    if os.path.exists(f"{path}/latest"):
        path = f"{path}/{open(f'{path}/latest').read().strip()}"
    if os.path.exists(f"{path}/index.h5"):
        model, w, _ = load_trident(path)
        V = int(model["vocab"])
        return V, lambda ids: trident_forward(model, w, ids)[:, :V]
    cfg, t, _, _ = load_hf(path)
    V = cfg["vocab_size"]
    return V, lambda ids: hf_forward(cfg, t, ids)[:, :V]


def main():
    hf_dir, line = sys.argv[1], sys.argv[2]
    prompt, gen = line.split("|")
    prompt = [int(t) for t in prompt.split()]
    gen = [int(t) for t in gen.split()]
    V, forward = reference(hf_dir)
    dumped = None
    if len(sys.argv) > 3:
        dumped = np.fromfile(sys.argv[3], dtype=np.float32).reshape(-1, V)
        if len(dumped) != len(gen):
            print(f"generate_check: FAIL: {len(dumped)} rows of logits for {len(gen)} tokens",
                  file=sys.stderr)
            sys.exit(1)
    ids, ties, worst = list(prompt), 0, 0.0
    for i, tok in enumerate(gen):
        logits = forward(np.array(ids))[-1]
        if dumped is not None:
            rel = float(np.abs(dumped[i] - logits).max() / np.abs(logits).max())
            worst = max(worst, rel)
            if rel > 1e-4:
                print(f"generate_check: FAIL: token {i}: logits differ from the full forward's "
                      f"by {rel:.3g} relative", file=sys.stderr)
                sys.exit(1)
        best = int(np.argmax(logits))
        if tok != best:
            gap = logits[best] - logits[tok]
            if gap > 1e-5 * max(abs(logits[best]), 1.0):
                print(f"generate_check: FAIL: token {i}: trident {tok}, reference argmax {best} "
                      f"(logit gap {gap:.3g})", file=sys.stderr)
                sys.exit(1)
            ties += 1
        ids.append(tok)
    print(f"generate_check: {len(gen)} greedy tokens equal the argmax of repeated full "
          f"forwards (float64, no cache; {ties} near-ties)"
          + (f"; logits within {worst:.2g} relative" if dumped is not None else ""))


main()
