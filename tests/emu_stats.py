"""The emulation's step counts (TRD_EMU_STATS files; docs/cuda.md "Step
budget") as the multi-rank tests read them."""


def steady(out, n, what, ranks=2):
    """Run n's count `what` in its last step, summed over the ranks' lines
    (0 where a rank's line lacks it)."""
    rows = [l.split("\t") for l in open(f"{out}/{n}.stats") if l.startswith("step\t")]
    last = max(int(r[1]) for r in rows)
    mine = [r for r in rows if int(r[1]) == last]
    assert len(mine) == ranks, f"{n}: {len(mine)} lines for step {last}, not one per rank"
    return sum(int(r[r.index(what) + 1]) if what in r else 0 for r in mine)
