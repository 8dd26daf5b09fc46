#!/usr/bin/env bash
# training.trace: the Chrome trace of a run.  An interleaved tp 2 x pp 2 x
# dp 2 run (8 ranks) and a dp 2 run without pipeline; checked against what
# the schedule implies, independently of the code that wrote the file:
# every rank is there with its mesh coordinates; per step each pipeline rank
# has m*v forwards and backwards and, per direction, m*(v - 1) or m*v
# sends and receives (chunk 0 of the first rank receives no activation, the
# last chunk of the last rank sends none); a rank's compute spans never
# overlap; every activation arrives after its sender posted it (one clock);
# data-parallel reductions appear with their bytes.
. "$(dirname "$0")/e2e.sh"

small=(--set checkpoint.dir= --set model.layers=4 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=3 --set training.global_batch=8 --set training.micro_batch=1
       --set data.val_every=0 --set run.log_every=100 --set training.trace=true)

run mesh 8 --set topology.tp=2 --set topology.pp=2 --set topology.dp=2 --set topology.zero=1 \
    --set topology.schedule=interleaved --set topology.virtual_stages=2
run dp 2 --set topology.dp=2
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, re, sys
from collections import Counter, defaultdict
out = sys.argv[1]
bad = []
def check(cond, what):
    if not cond:
        bad.append(what)

def load(name):
    ev = json.load(open(f"{out}/{name}/trace.json"))["traceEvents"]
    labels = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    spans = [e for e in ev if e["ph"] == "X"]
    return labels, spans

steps = 3
# --- the 3D mesh: tp 2, pp 2, dp 2, v 2; m = 8 / (1 * 2) = 4 micro-batches
labels, spans = load("mesh")
pp, v, m, tp, dp = 2, 2, 4, 2, 2
check(sorted(labels) == list(range(8)), f"ranks in the trace: {sorted(labels)}")
by_rank = defaultdict(list)
for e in spans:
    by_rank[e["pid"]].append(e)
for r in range(8):
    # default order tp-dp-pp: tp fastest, then dp, then pp
    t, d, p = r % tp, r // tp % dp, r // (tp * dp)
    want = f"rank {r} (tp {t}, pp {p}, dp {d})"
    check(labels.get(r) == want, f"rank {r} label {labels.get(r)!r}, want {want!r}")
    n = Counter(e["name"] for e in by_rank[r])
    first, last = p == 0, p == pp - 1
    expect = {"fwd": m * v, "bwd": m * v,
              "recv-act": m * (v - first), "send-act": m * (v - last),
              "recv-grad": m * (v - last), "send-grad": m * (v - first)}
    for k, e in expect.items():
        check(n[k] == steps * e, f"rank {r}: {n[k]} {k} spans, want {steps * e}")
    for s in range(1, steps + 1):
        check(n[f"step {s}"] == 1, f"rank {r}: step {s} span missing")
    dp_red = [e for e in by_rank[r] if e["name"] in ("all-reduce dp", "reduce-scatter dp")
              and e["args"].get("bytes", 0) > 0]
    check(len(dp_red) >= steps, f"rank {r}: {len(dp_red)} data-parallel reductions")
    comp = sorted((e for e in by_rank[r] if e["tid"] == 0), key=lambda e: e["ts"])
    for a, b in zip(comp, comp[1:]):
        if b["ts"] < a["ts"] + a["dur"] - 1e-3:
            check(False, f"rank {r}: {a['name']} and {b['name']} overlap at {b['ts']}")
            break
# Activations: (mb, chunk c) received by pp rank p comes from pp rank p - 1,
# chunk c (chunk c - 1 when p is the first rank); the k-th step's message
# is the k-th of its kind.  Same tp and dp coordinates.
def key(e): return (e["args"]["mb"], e["args"]["chunk"])
for r in range(8):
    t, d, p = r % tp, r // tp % dp, r // (tp * dp)
    if p == 0:
        continue
    src = t + tp * d + tp * dp * (p - 1)
    sends = defaultdict(list)
    for e in by_rank[src]:
        if e["name"] == "send-act":
            sends[key(e)].append(e)
    for e in by_rank[r]:
        if e["name"] == "recv-act":
            k = key(e)
            s = sends[k].pop(0) if sends[k] else None
            # 0.5 ms: the clocks are aligned to half a round trip (trace.h)
            check(s is not None and e["ts"] + e["dur"] >= s["ts"] - 500,
                  f"rank {r}: recv-act {k} ends before rank {src} sent it")
# --- dp 2 without a pipeline: one fwd and bwd per micro-batch (m = 4)
labels, spans = load("dp")
check(sorted(labels) == [0, 1], f"dp ranks {sorted(labels)}")
for r in (0, 1):
    n = Counter(e["name"] for e in spans if e["pid"] == r)
    check(n["fwd"] == steps * 4 and n["bwd"] == steps * 4, f"dp rank {r}: {n['fwd']} fwd, {n['bwd']} bwd")
    check(n["all-reduce dp"] >= steps, f"dp rank {r}: {n['all-reduce dp']} all-reduce dp")
for b in bad:
    print("FAIL", b)
print("ok   trace: ranks, span counts, order and clocks" if not bad else f"{len(bad)} failures")
sys.exit(1 if bad else 0)
PY
grep -q "trace: .* spans of 8 ranks" "$out/mesh.log" || { echo "FAIL: no trace line in the log"; fails=$((fails + 1)); }
echo "trace: $fails failed"
[ "$fails" -eq 0 ]
