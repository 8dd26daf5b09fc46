#!/usr/bin/env python3
"""curves.py: the loss-curve comparison of the training tests, in one place.

    python3 tests/curves.py REF GOT [options]

REF and GOT are run directories (their metrics.jsonl).  A step's last record
counts (a resumed run repeats steps); a line torn by a kill is skipped.
Checks, each relative to REF's value:
  loss of every compared step        <= --rtol          (default 1e-5)
  grad_norm of every compared step   <= --norm-rtol     (off unless given)
  val_loss where both have one       <= --rtol; with --val K: exactly K each,
                                        with --val-min K: at least K, and at the
                                        same steps as REF
  REF.weights / GOT.weights (files beside the run dirs, fp32, as
  TRIDENT_DUMP_WEIGHTS writes them) max abs diff <= --weights-atol
Compared steps: all of REF's, or --from S .. --to E, each of which GOT must
have; with --common only those GOT has (a run resumed midway), the last of
them the last compared; --steps N requires both runs to have exactly steps
1..N.  Prints one ok/FAIL line; exit 0/1.
"""
import argparse
import array
import json
import sys


def rows(run_dir):
    by_step = {}
    for line in open(f"{run_dir}/metrics.jsonl"):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        by_step[r["step"]] = r
    return by_step


def weights(run_dir):
    a = array.array("f")
    a.frombytes(open(f"{run_dir}.weights", "rb").read())
    return a


def rel(a, b):
    return abs(a - b) / abs(b) if b else abs(a)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ref")
    p.add_argument("got")
    p.add_argument("--name")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--norm-rtol", type=float)
    p.add_argument("--steps", type=int)
    p.add_argument("--from", dest="first", type=int, default=1)
    p.add_argument("--to", dest="last", type=int)
    p.add_argument("--val", type=int)
    p.add_argument("--val-min", type=int, default=0)
    p.add_argument("--weights-atol", type=float)
    p.add_argument("--common", action="store_true")
    a = p.parse_args()
    name = a.name or a.got.rstrip("/").split("/")[-1]
    r, g = rows(a.ref), rows(a.got)
    problems = []
    if a.steps is not None:
        for what, d in (("reference", r), ("run", g)):
            if sorted(d) != list(range(1, a.steps + 1)):
                problems.append(f"{what} has steps {sorted(d)}, want 1..{a.steps}")
    last = a.last if a.last is not None else max(r, default=0)
    steps = [s for s in range(a.first, last + 1) if s in r]
    missing = [s for s in steps if s not in g]
    if a.common:  # a resumed run: the steps both have, up to the last
        steps = [s for s in steps if s in g]
        if not steps or steps[-1] != last:
            problems.append(f"common steps {steps}, want them to end at step {last}")
    elif not steps or missing:
        problems.append(f"steps missing: {missing or 'all'}")
    steps = [s for s in steps if s in g]
    parts = []
    loss = max((rel(g[s]["loss"], r[s]["loss"]) for s in steps), default=0.0)
    parts.append(f"loss max rel diff {loss:.2e}")
    if loss > a.rtol:
        problems.append(f"loss differs by {loss:.2e} > {a.rtol:g}")
    if a.norm_rtol is not None:
        norm = max((rel(g[s]["grad_norm"], r[s]["grad_norm"]) for s in steps), default=0.0)
        parts.append(f"grad norm {norm:.2e}")
        if norm > a.norm_rtol:
            problems.append(f"grad norm differs by {norm:.2e} > {a.norm_rtol:g}")
    vr = [s for s in steps if "val_loss" in r[s]]
    vg = [s for s in steps if "val_loss" in g[s]]
    if a.val is not None and not len(vr) == len(vg) == a.val:
        problems.append(f"validation points: {len(vg)} and {len(vr)} in the reference, want {a.val}")
    if (a.val is not None or a.val_min) and (len(vg) < a.val_min or vr != vg):
        problems.append(f"validation at steps {vg}, the reference at {vr}")
    val = max((rel(g[s]["val_loss"], r[s]["val_loss"]) for s in vg if s in vr), default=0.0)
    if vg:
        parts.append(f"val {val:.2e}")
    if val > a.rtol:
        problems.append(f"val_loss differs by {val:.2e} > {a.rtol:g}")
    if a.weights_atol is not None:
        rw, gw = weights(a.ref.rstrip("/")), weights(a.got.rstrip("/"))
        wd = max((abs(x - y) for x, y in zip(gw, rw)), default=0.0) if len(rw) == len(gw) else 1e30
        parts.append(f"weights max abs diff {wd:.2e}")
        if wd > a.weights_atol:
            problems.append(f"weights differ by {wd:.2e} > {a.weights_atol:g} "
                            f"({len(gw)} and {len(rw)} values)")
    print(f"{'FAIL' if problems else 'ok  '} {name}: {len(steps)} steps, {', '.join(parts)}"
          + (f": {'; '.join(problems)}" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
