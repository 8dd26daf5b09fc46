#!/usr/bin/env bash
# `trident topology`: the rank map of a config, as a table and as JSON, for
# Megatron's documented example (16 ranks on 2 nodes of 8, tp 2, pp 4, so
# dp 2); the expected groups below are worked out by hand.  Impossible meshes
# exit with code 2 and name the violated constraint and its fix.
set -uo pipefail
: "${TRIDENT:?TRIDENT must point at the built binary}"
cd "${TRIDENT_SOURCE_ROOT:-.}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 checks=0

fail() { fails=$((fails + 1)); echo "FAIL: $*"; }

expect() { # want_rc, want_substring, cmd...
    local want_rc=$1 want=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    checks=$((checks + 1))
    if [ "$rc" -ne "$want_rc" ] || ! grep -qF -- "$want" <<<"$out"; then
        fail "$* -> exit $rc (want $want_rc), output:"; echo "$out" | head -8
        echo "      expected to contain: $want"
    fi
}

cat > "$tmp/cfg.yaml" <<'Y'
model: {arch: gpt2, layers: 8, hidden: 64, heads: 8, vocab: 256, seq_len: 32}
topology: {tp: 1, pp: 1}
training: {steps: 1, global_batch: 8, micro_batch: 1, lr: 1.0e-3}
data: {path: unused}
Y
mesh=(--world 16 --ranks-per-node 8 --set topology.tp=2 --set topology.pp=4)

# The table: summary lines and one row per rank.
out=$("$TRIDENT" topology "$tmp/cfg.yaml" "${mesh[@]}" 2>&1); rc=$?
checks=$((checks + 1))
[ "$rc" -eq 0 ] || fail "table: exit $rc: $out"
for want in "world 16 = tp 2 x dp 2 x pp 4" "2 nodes x 8 ranks" \
            "TP groups inside one node: yes" \
            "stage 0 on node 0; stage 1 on node 0; stage 2 on node 1; stage 3 on node 1"; do
    checks=$((checks + 1))
    grep -qF -- "$want" <<<"$out" || fail "table lacks '$want'"
done
# Rank 13: node 1, local 5, tp 1, dp 0, pp 3; groups {12,13}, {13,15}, {1,5,9,13}.
row=$(awk '$1 == 13 && NF == 9' <<<"$out")
checks=$((checks + 1))
[ "$(echo $row)" = "13 1 5 1 0 3 12,13 13,15 1,5,9,13" ] || fail "row of rank 13: '$row'"
checks=$((checks + 1))
[ "$(awk '$1 ~ /^[0-9]+$/ && NF == 9' <<<"$out" | wc -l)" -eq 16 ] || fail "not 16 rows"

# The JSON, checked with python3 against the hand-made layout.
"$TRIDENT" topology "$tmp/cfg.yaml" "${mesh[@]}" --json > "$tmp/map.json"
checks=$((checks + 1))
python3 - "$tmp/map.json" <<'PY' || fail "JSON map"
import json, sys
m = json.load(open(sys.argv[1]))
bad = []
def want(what, got, exp):
    if got != exp:
        bad.append(f"{what}: got {got}, want {exp}")
for k, v in dict(world=16, tp=2, pp=4, dp=2, ranks_per_node=8, nodes=2,
                 order="tp-dp-pp", tp_inside_node=True).items():
    want(k, m.get(k), v)
want("stage_nodes", m.get("stage_nodes"), [[0], [0], [1], [1]])
tp = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
dp = [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
pp = [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
ranks = m.get("ranks", [])
want("number of ranks", len(ranks), 16)
for r, e in enumerate(ranks):
    want(f"rank {r} id", e["rank"], r)
    want(f"rank {r} node", (e["node"], e["local_rank"]), (r // 8, r % 8))
    want(f"rank {r} coords", (e["tp"], e["dp"], e["pp"]), (r % 2, r // 2 % 2, r // 4))
    for name, groups in (("tp", tp), ("dp", dp), ("pp", pp)):
        mine = [g for g in groups if r in g]
        want(f"rank {r} {name}_group", e[f"{name}_group"], mine[0])
print("\n".join(bad) or "json ok")
sys.exit(1 if bad else 0)
PY

# A custom order: dp fastest puts data-parallel pairs on consecutive ranks.
out=$("$TRIDENT" topology "$tmp/cfg.yaml" --world 8 --ranks-per-node 8 --json \
      --set topology.tp=2 --set topology.pp=2 --set topology.order=dp-tp-pp)
checks=$((checks + 1))
python3 -c '
import json, sys
m = json.loads(sys.argv[1])
r6 = m["ranks"][6]
ok = (r6["tp"], r6["dp"], r6["pp"]) == (1, 0, 1) and r6["tp_group"] == [4, 6] \
     and r6["dp_group"] == [6, 7] and r6["pp_group"] == [2, 6]
sys.exit(0 if ok else 1)' "$out" || fail "dp-tp-pp order: rank 6 is $(grep '"rank": 6' <<<"$out")"

# Impossible meshes: exit 2 with the constraint and the fix.
expect 2 "topology.tp 4 does not fit in 2 ranks per node: TP groups must stay inside a node (NVLink); use tp <= 2, or set topology.allow_tp_across_nodes: true" \
    "$TRIDENT" topology "$tmp/cfg.yaml" --world 8 --ranks-per-node 2 --set topology.tp=4
expect 0 "TP groups inside one node: no" \
    "$TRIDENT" topology "$tmp/cfg.yaml" --world 8 --ranks-per-node 2 --set topology.tp=4 \
    --set topology.allow_tp_across_nodes=true
expect 2 "topology.tp 4 does not divide the 6 ranks per node" \
    "$TRIDENT" topology "$tmp/cfg.yaml" --world 12 --ranks-per-node 6 --set topology.tp=4 \
    --set training.global_batch=12 --set model.heads=4
expect 2 "3 ranks per node do not divide the world size 8" \
    "$TRIDENT" topology "$tmp/cfg.yaml" --world 8 --ranks-per-node 3
expect 2 "but the world size is 16" \
    "$TRIDENT" topology "$tmp/cfg.yaml" "${mesh[@]}" --set topology.dp=4
expect 2 "model.heads (8) must be divisible by topology.tp (3)" \
    "$TRIDENT" topology "$tmp/cfg.yaml" --world 12 --set topology.tp=3
expect 2 "give --world N" "$TRIDENT" topology "$tmp/cfg.yaml"
expect 2 "--world 'x'" "$TRIDENT" topology "$tmp/cfg.yaml" --world x
expect 2 "missing CONFIG" "$TRIDENT" topology
expect 0 "--ranks-per-node" "$TRIDENT" topology --help
expect 0 "--schedule" "$TRIDENT" topology --help

# --schedule: the pipeline schedule of the config's pp, after the summary.
# Rank 0 of 1F1B with pp 4 and 8 micro-batches, written out by hand: three
# warm-up forwards, then one forward one backward, then the last backwards;
# bubble (p-1)/(m+p-1) = 3/11 = 27.27%; rank r holds pp - r micro-batches.
sched=("$TRIDENT" topology "$tmp/cfg.yaml" "${mesh[@]}" --schedule)
expect 0 "world 16 = tp 2 x dp 2 x pp 4" "${sched[@]}" --set training.global_batch=16
expect 0 "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7" \
    "${sched[@]}" --set training.global_batch=16
expect 0 "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7" \
    "${sched[@]}" --set training.global_batch=16
expect 0 "bubble: 27.27% of the step (formula (p-1)/(v*m+p-1) = 27.27%)" \
    "${sched[@]}" --set training.global_batch=16
expect 0 "(forward done, backward not): 4 3 2 1" "${sched[@]}" --set training.global_batch=16
# The default micro-batch count is global_batch / (micro_batch x dp) = 8 / 2.
expect 0 "pipeline schedule 1f1b: pp 4, 4 micro-batches" "${sched[@]}"
expect 0 "pipeline schedule 1f1b: pp 4, 12 micro-batches" "${sched[@]}" --micro-batches 12
# Interleaved, v 2: groups of 4 micro-batches through chunk 0, then chunk 1;
# bubble (p-1)/(v m+p-1) = 3/19 = 15.79%.
inter=("${sched[@]}" --set topology.schedule=interleaved --set topology.virtual_stages=2
       --micro-batches 8)
expect 0 "rank 0: F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 B0.1 F4.0" "${inter[@]}"
expect 0 "15.79% of the step" "${inter[@]}"
expect 0 "last group of micro-batches is smaller" "${sched[@]}" \
    --set topology.schedule=interleaved --set topology.virtual_stages=2 --micro-batches 6
expect 0 "rank 0: F0 F1 F2 F3 F4 B0 B1 B2 B3 B4" "${sched[@]}" --set topology.schedule=gpipe \
    --micro-batches 5
# With the sends and receives, pp 2.
expect 0 "rank 1: <a0 F0 B0 >g0 <a1 F1 B1 >g1 R S" \
    "$TRIDENT" topology "$tmp/cfg.yaml" --world 2 --set topology.pp=2 --schedule-comm \
    --micro-batches 2
expect 2 "--micro-batches only applies to --schedule" \
    "$TRIDENT" topology "$tmp/cfg.yaml" "${mesh[@]}" --micro-batches 4
expect 2 "--schedule prints text" "${sched[@]}" --json
expect 2 "--micro-batches '0'" "${sched[@]}" --micro-batches 0
expect 2 "virtual_stages (2) > 1 needs topology.schedule interleaved" \
    "${sched[@]}" --set topology.virtual_stages=2

echo "topology_cli: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
