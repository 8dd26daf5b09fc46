"""Two checkpoints of one model read with h5py (not trident's reader):
every dataset of every stage file, the weights and the Adam state, equal
within a relative tolerance of the dataset's largest value.  Used where
two layouts train the same model and save it in the same global layout
(tests/test_moe_train.sh: the experts divided over ep at ZeRO 1-3 against
one rank).

usage: ckpt_same.py STEP_DIR_A STEP_DIR_B [--rtol R]"""
import argparse
import os
import sys

import h5py
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--rtol", type=float, default=1e-5)
args = ap.parse_args()


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


files = sorted(f for f in os.listdir(args.a) if f.startswith("stage_") and f.endswith(".h5"))
if not files or files != sorted(f for f in os.listdir(args.b) if f.startswith("stage_")):
    sys.exit(f"FAIL stage files differ: {files} vs {sorted(os.listdir(args.b))}")
bad, n = [], 0
for name in files:
    a, b = datasets(f"{args.a}/{name}"), datasets(f"{args.b}/{name}")
    if sorted(a) != sorted(b):
        bad.append((name, "datasets", sorted(set(a) ^ set(b))))
        continue
    for key in sorted(a):
        x, y = np.asarray(a[key], np.float64), np.asarray(b[key], np.float64)
        if x.shape != y.shape:
            bad.append((name, key, "shape", x.shape, y.shape))
            continue
        scale = max(np.abs(x).max(initial=0.0), np.abs(y).max(initial=0.0))
        err = np.abs(x - y).max(initial=0.0)
        if not err <= args.rtol * scale:
            bad.append((name, key, f"max diff {err:.3g} of {scale:.3g}"))
        n += 1
print(("FAIL" if bad else "ok  ") + f" {n} datasets of {args.b} equal to {args.a}'s: {bad[:5]}")
sys.exit(1 if bad else 0)
