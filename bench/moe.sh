#!/usr/bin/env bash
# Mixture of experts (model.moe, docs/moe.md), measured on this machine's
# cores:
#  1. expert parallelism (dp 2, ep 2): the all-to-all bytes each rank sent
#     per MoE layer and micro-batch (the trace's "all-to-all ep" spans)
#     against the formula for balanced routing, 4 exchanges (dispatch and
#     combine, forward and backward) of the N x k x (ep-1)/ep rows that
#     leave the rank, C floats each; the ratio is 1 up to the routing's
#     imbalance; and the exchanges' time as a share of the step;
#  2. the step time of a MoE model against a dense model of the same
#     active FLOPs per token, in alternating rounds (the machine is shared:
#     a ratio from the same round, not an absolute time).
#   dense: Llama, SwiGLU MLP of width F = k x Fe
#   MoE:   the same Llama with E experts of width Fe, top-k, every layer
# Per token the experts' GEMMs are the dense MLP's (k x 3 x C x Fe
# multiply-adds against 3 x C x F); the MoE model adds the router (C x E),
# the dispatch (gather, combine, scatter-add of k rows per token) and E
# smaller GEMMs instead of one, which is what the ratio prices.
#   bench/moe.sh [ROUNDS]           rounds (default 3)
#   BUILD_DIR=dir bench/moe.sh      the build to use (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
rounds=${1:-3}
trident=$dir/trident
[ -x "$trident" ] || { echo "build first: scripts/build.sh (no $trident)"; exit 1; }
[ -d data/brown/txt ] || { echo "fetch the corpus first: scripts/get_corpus.sh"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 - "$out/bytes.jsonl" <<'PY'
import glob, json, sys
with open(sys.argv[1], "w") as f:
    for path in sorted(glob.glob("data/brown/txt/c*"))[:40]:
        f.write(json.dumps({"text": " ".join(open(path).read().split())}) + "\n")
PY
"$trident" prepare-data --input "$out/bytes.jsonl" --tokenizer byte --out "$out/bytes" \
    > "$out/prepare.log" 2>&1 || { cat "$out/prepare.log"; exit 1; }

L=4 C=256 H=4 E=8 K=2 Fe=256 T=256 B=8 steps=6
F=$((K * Fe))
common=(--set model.arch=llama --set model.layers=$L --set model.hidden=$C --set model.heads=$H
        --set model.kv_heads=$H --set model.vocab=257 --set model.seq_len=$T
        --set training.steps=$steps --set training.global_batch=$B --set training.micro_batch=$B
        --set data.path="$out/bytes" --set data.val_path= --set checkpoint.dir=
        --set run.log_every=100)
dense=(--set model.ffn_hidden=$F)
moe=(--set model.moe.experts=$E --set model.moe.top_k=$K --set model.moe.ffn_hidden=$Fe)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u +%F)"
echo "model: llama, $L layers, hidden $C, heads $H, vocab 257, seq $T, batch $B, $steps steps, 1 rank"
echo "dense MLP width $F; MoE: $E experts of width $Fe, top-$K, every layer, dropless"
echo "planner, dense: $("$trident" plan configs/tiny.yaml "${common[@]}" "${dense[@]}" --json \
    2>/dev/null | python3 -c 'import json, sys; p = json.load(sys.stdin)
n = sum(s["params"] for s in p["stages"]) / p["elem_param"]
print("%.4g M parameters" % (n / 1e6))')"
echo "planner, moe: $("$trident" plan configs/tiny.yaml "${common[@]}" "${moe[@]}" 2>/dev/null |
    sed -n 's/^mixture of experts: .*: //p')"
echo
echo "1. expert parallelism: dp 2, ep 2, 3 steps, micro-batch $((B / 2)) per rank"
OMP_NUM_THREADS=1 mpiexec -n 2 "$trident" train configs/tiny.yaml "${common[@]}" "${moe[@]}" \
    --set training.steps=3 --set topology.dp=2 --set topology.ep=2 --set training.trace=true \
    --set training.micro_batch=$((B / 2)) \
    --set run.dir="$out/ep2" > "$out/ep2.log" 2>&1 || { tail -20 "$out/ep2.log"; exit 1; }
python3 - "$out/ep2" $L $C $K $((B / 2)) $T 2 <<'PY'
import json, sys
d, L, C, K, mb, T, ep = sys.argv[1], *map(int, sys.argv[2:])
ev = [e for e in json.load(open(f"{d}/trace.json"))["traceEvents"] if e.get("ph") == "X"]
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
steps, n_micro = len(rows), 1
for r in range(ep):
    a2a = [e for e in ev if e["pid"] == r and e["name"].startswith("all-to-all ep")]
    sent = sum(e["args"].get("bytes", 0) for e in a2a) / (steps * n_micro * L)
    formula = 4 * mb * T * K * (ep - 1) / ep * C * 4
    t = sum(e["dur"] for e in a2a) / 1e3
    step_ms = sum(x["step_ms"] for x in rows)
    print(f"  rank {r}: {sent:.0f} bytes per MoE layer and micro-batch, formula {formula:.0f}, "
          f"ratio {sent / formula:.3f}; all-to-all {t:.0f} ms of {step_ms:.0f} ms of steps "
          f"({t / step_ms:.3f}, blocking)")
PY

echo
echo "2. MoE against dense at equal active FLOPs, 1 rank, $(nproc) threads"
printf "%5s %12s %12s %8s\n" round "dense ms" "moe ms" ratio
for r in $(seq 1 "$rounds"); do
    for m in dense moe; do
        declare -n a=$m
        OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} "$trident" train configs/tiny.yaml \
            "${common[@]}" "${a[@]}" --set run.dir="$out/$m$r" > "$out/$m$r.log" 2>&1 ||
            { tail -20 "$out/$m$r.log"; exit 1; }
    done
    python3 - "$out" "$r" <<'PY'
import json, statistics, sys
out, r = sys.argv[1], sys.argv[2]
def ms(m):  # median step time after the first step (which allocates)
    rows = [json.loads(l) for l in open(f"{out}/{m}{r}/metrics.jsonl")]
    return statistics.median(x["step_ms"] for x in rows[1:])
d, m = ms("dense"), ms("moe")
print(f"{r:>5} {d:12.1f} {m:12.1f} {m / d:8.3f}")
open(f"{out}/ratios", "a").write(f"{m / d}\n")
PY
done
python3 -c "
import statistics, sys
r = [float(x) for x in open('$out/ratios')]
print(f'MoE / dense step time at equal active FLOPs: median {statistics.median(r):.3f} over {len(r)} rounds')"
