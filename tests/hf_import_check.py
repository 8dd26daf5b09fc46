#!/usr/bin/python3
"""Compare the weights of two trident checkpoints bit for bit (h5py only).

  hf_import_check.py STEP_DIR_A STEP_DIR_B

Every "params" tensor of A (the master weights when A has them: what an
export takes) must be in B's "params" with the same shape and the same fp32
bits, and B must have no other params tensor.  Each checkpoint's tensors are
found through its index.h5 (/tensors: name, kind, file).
"""
import sys

import h5py
import numpy as np


def tensors(step_dir):
    with h5py.File(f"{step_dir}/index.h5", "r") as ix:
        recs = ix["tensors"][()]
    out = {}
    for r in recs:
        name, kind, file = (r[k].decode() if isinstance(r[k], bytes) else r[k]
                            for k in ("name", "kind", "file"))
        out.setdefault(kind, {})[name] = file
    return out


def load(step_dir, kind, name, file):
    with h5py.File(f"{step_dir}/{file}", "r") as f:
        return np.asarray(f[f"{kind}/{name}"][()], dtype=np.float32)


a, b = sys.argv[1], sys.argv[2]
ta, tb = tensors(a), tensors(b)
ka = "master" if "master" in ta else "params"
names_a, names_b = set(ta[ka]), set(tb["params"])
if names_a != names_b:
    sys.exit(f"hf_import_check: FAIL: tensors differ: only in A {sorted(names_a - names_b)}, "
             f"only in B {sorted(names_b - names_a)}")
if set(tb) != {"params"}:
    sys.exit(f"hf_import_check: FAIL: B has kinds {sorted(tb)}, expected params only")
for n in sorted(names_a):
    x, y = load(a, ka, n, ta[ka][n]), load(b, "params", n, tb["params"][n])
    if x.shape != y.shape:
        sys.exit(f"hf_import_check: FAIL: {n}: shape {x.shape} vs {y.shape}")
    if not np.array_equal(x.view(np.uint32), y.view(np.uint32)):
        i = np.flatnonzero(x.view(np.uint32) != y.view(np.uint32))
        sys.exit(f"hf_import_check: FAIL: {n}: {i.size} elements differ, first at flat {i[0]}")
print(f"{len(names_a)} tensors bit-identical ({ka} of A, params of B)")
