"""The `peft` library on a trident PEFT export: transformers loads the base
(`trident ckpt export --format hf` of the base the LoRA run started from,
float32, on the GPU when there is one), PeftModel.from_pretrained puts the
adapters of `trident ckpt export --format peft` on it, and the full
sequence of a `trident generate --greedy --ids --dump-logits` run of the
LoRA checkpoint goes through it without a cache, twice: with the adapters
as peft runs them (x A^T B^T beside the base layer) and after peft's
merge_and_unload (which, for GPT-2's Conv1D layers, adds (B A) transposed
as fan_in_fan_out says).  Each of trident's tokens must be the argmax (or a
near-tie within float32 rounding), and the logits trident drew it from
must equal peft's within --rtol of the largest magnitude.  bench/peft_gpu.sh
runs it (tests/peft_check.py is the numpy reader that runs everywhere).
Without peft installed it says so and exits 0.

    python3 bench/peft_check_gpu.py BASE_HF_DIR PEFT_DIR IDS_FILE LOGITS_FILE [--rtol 1e-4]
"""

import argparse
import sys

try:
    import peft
    import torch
    import transformers
except ModuleNotFoundError as e:
    print(f"{e.name} not installed: skipped")
    sys.exit(0)
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_transformers_check import compare, read_generate  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_dir", help="ckpt export --format hf of the LoRA run's base")
    ap.add_argument("peft_dir", help="ckpt export --format peft of the LoRA checkpoint")
    ap.add_argument("ids", help="generate --ids output: 'PROMPT_IDS | GENERATED_IDS'")
    ap.add_argument("logits", help="generate --dump-logits output: float32 [new tokens][vocab]")
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    base = transformers.AutoModelForCausalLM.from_pretrained(a.base_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, a.peft_dir).to(dev).eval()
    prompt, gen, dumped = read_generate(a.ids, a.logits, base.config.vocab_size)
    ids = torch.tensor([prompt + gen], device=dev)
    name = f"peft {peft.__version__} on {type(base).__name__} ({dev})"
    good = True
    with torch.no_grad():
        for what in ("adapters", "merge_and_unload"):
            if what == "merge_and_unload":
                model = model.merge_and_unload()
            logits = model(ids).logits[0].double().cpu().numpy()
            ok, line = compare(f"{name}, {what}", logits, prompt, gen, dumped, a.rtol, "peft")
            print(line)
            good = good and ok
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
