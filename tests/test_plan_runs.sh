#!/usr/bin/env bash
# `trident plan` against real runs and published results (docs/plan.md).
#
#  1. Memory: for single rank, dp 4 with each ZeRO stage (fp32, and bf16 for
#     stage 3), tp 2, tp 2 Llama with sequence parallelism, pp 2, pp 4 and
#     the 3D mesh tp 2 x pp 2 x dp 2, a mixture of experts at dp 4 x ep 2
#     with ZeRO 0-3 (the experts' memory divided over ep, their gradients
#     all-reduced or reduce-scattered over the expert-data-parallel pairs,
#     at ZeRO 3 their weights gathered over them), the plan's per-rank
#     bytes of stage 0
#     (rank 0 writes the metrics) per category, and every stage's activation
#     bytes, are within 10% of the allocation report of the first step (the
#     MoE cases' weights, gradients, optimizer state and ZeRO buffers
#     exactly).
#  2. Communication: comm_bytes of step 2 (what src/comm counts on rank 0's
#     data-parallel communicators, dp and the experts' edp; step 1 also
#     holds ZeRO's start-up gather)
#     equals the plan's DP bytes per step exactly.
#  3. Published runs (configs/published/): the plan (--storage bf16, as
#     they stored) fits the GPU the run used and its MFU is within 10 points
#     of the published figure; without --storage a bf16 CUDA plan counts
#     the fp32 buffers trident allocates today and states its GEMM efficiency.
#  4. Every committed config plans on its cluster; --search returns a
#     layout that fits; a config that cannot fit says so and what would.
. "$(dirname "$0")/e2e.sh"

small=(--set checkpoint.dir= --set model.layers=4 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=2 --set training.global_batch=16 --set training.micro_batch=2
       --set data.val_path= --set data.val_every=0 --set run.log_every=100
       --set topology.bucket_mb=1)

cases=(
    "single 1"
    "dp4_zero0 4 --set topology.dp=4 --set topology.zero=0"
    "dp4_zero1 4 --set topology.dp=4 --set topology.zero=1"
    "dp4_zero2 4 --set topology.dp=4 --set topology.zero=2"
    "dp4_zero3 4 --set topology.dp=4 --set topology.zero=3"
    "dp4_zero3_bf16 4 --set topology.dp=4 --set topology.zero=3 --set training.precision=bf16"
    "tp2 2 --set topology.tp=2"
    "tp2_sp_llama 2 --set topology.tp=2 --set topology.sequence_parallel=true --set model.arch=llama --set model.kv_heads=2"
    "pp2 2 --set topology.pp=2"
    "pp4 4 --set topology.pp=4 --set model.tie_embeddings=false"
    "mesh_tp2_pp2_dp2 8 --set topology.tp=2 --set topology.pp=2 --set topology.dp=2 --set topology.zero=1"
    "moe_dp4_ep2 4 --set topology.dp=4 --set topology.ep=2 --set model.moe.experts=4"
    "moe_dp4_ep2_zero1 4 --set topology.dp=4 --set topology.ep=2 --set model.moe.experts=4 --set topology.zero=1"
    "moe_dp4_ep2_zero2 4 --set topology.dp=4 --set topology.ep=2 --set model.moe.experts=4 --set topology.zero=2"
    "moe_dp4_ep2_zero3 4 --set topology.dp=4 --set topology.ep=2 --set model.moe.experts=4 --set topology.zero=3"
)

for c in "${cases[@]}"; do
    read -r -a w <<<"$c"
    name=${w[0]} n=${w[1]}
    sets=("${w[@]:2}")
    run "$name" "$n" "${sets[@]}"
    "$TRIDENT" plan configs/tiny.yaml "${small[@]}" "${sets[@]}" --json > "$out/$name.plan.json" \
        2> "$out/$name.plan.err" || { echo "FAIL: plan $name"; cat "$out/$name.plan.err"; fails=$((fails + 1)); }
done

python3 - "$out" "${cases[@]}" <<'PY' || fails=$((fails + 1))
import json, sys
out, cases = sys.argv[1], [c.split()[0] for c in sys.argv[2:]]
bad = 0
for name in cases:
    try:
        rec = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
        plan = json.load(open(f"{out}/{name}.plan.json"))
    except (OSError, ValueError) as e:
        print(f"FAIL {name}: {e}"); bad += 1; continue
    meas, st = rec[0]["memory_bytes"], plan["stages"]
    keys = [("params", "params"), ("grads", "grads"), ("optimizer", "optimizer"),
            ("zero_buffers", "buffers"), ("activations", "activations"), ("scratch", "scratch")]
    worst = 0.0
    for mk, pk in keys + [("total", "total")]:
        m = sum(meas[k] for k, _ in keys) if mk == "total" else meas[mk]
        p = sum(st[0][k] for _, k in keys) if mk == "total" else st[0][pk]
        rel = abs(p - m) / m if m else (0.0 if p == 0 else 1.0)
        worst = max(worst, rel)
        if rel > 0.10:
            print(f"FAIL {name}: {mk} planned {p:.0f}, measured {m}"); bad += 1
        # the divided experts' weights, gradients, Adam state and ZeRO
        # slots are counted from the same parameter table: exactly
        elif name.startswith("moe_") and mk in ("params", "grads", "optimizer", "zero_buffers") \
                and p != m:
            print(f"FAIL {name}: {mk} planned {p:.0f}, measured {m} (exact for the experts)")
            bad += 1
    for k, m in enumerate(rec[0].get("stage_activation_bytes", [])):
        rel = abs(st[k]["activations"] - m) / m
        worst = max(worst, rel)
        if rel > 0.10:
            print(f"FAIL {name}: stage {k} activations planned {st[k]['activations']:.0f}, measured {m:.0f}"); bad += 1
    comm, want = rec[1]["comm_bytes"], st[0]["dp_bytes_step"]
    if comm != want:
        print(f"FAIL {name}: comm_bytes step 2 {comm}, planned {want}"); bad += 1
    print(f"{'ok  ' if not bad else '    '} {name}: memory max rel diff {worst:.4f} "
          f"(total {sum(meas[k] for k, _ in keys)} B), DP bytes/step {comm} = plan {want}")
sys.exit(1 if bad else 0)
PY

# Published runs: fits the GPU it ran on, MFU within 10 points.
published=("narayanan2021_145b a100-80gb:192x8 0.35"
           "korthikanti2022_175b a100-80gb:8x8 0.51"
           "megatron_h100_175b h100-sxm:16x8 0.44")
for p in "${published[@]}"; do
    read -r cfg cluster mfu <<<"$p"
    # --storage bf16: these runs stored bf16 weights, gradients and activations.
    "$TRIDENT" plan "configs/published/$cfg.yaml" --cluster "$cluster" --storage bf16 --json > "$out/$cfg.json" \
        || { echo "FAIL: plan $cfg"; fails=$((fails + 1)); continue; }
    python3 - "$out/$cfg.json" "$cfg" "$mfu" <<'PY' || fails=$((fails + 1))
import json, sys
r, name, want = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3])
ok = r["fits"] and abs(r["mfu"] - want) <= 0.10
gib = r["stages"][r["worst"]]["total"] / 2**30
print(f"{'ok  ' if ok else 'FAIL'} {name}: {gib:.1f} GiB per GPU of {r['capacity'] / 2**30:.0f}, "
      f"MFU {100 * r['mfu']:.1f}% vs published {100 * want:.0f}%")
sys.exit(0 if ok else 1)
PY
done

# What the CUDA backend allocates today: fp32 weights, gradients and
# activations, also for a bf16 run (2 bytes only with --storage bf16); the
# throughput says what GEMM efficiency it assumes.
"$TRIDENT" plan configs/gpt2_124m.yaml --cluster h200:1x1 --json > "$out/s32.json" &&
    "$TRIDENT" plan configs/gpt2_124m.yaml --cluster h200:1x1 --storage bf16 --json > "$out/s16.json" &&
    "$TRIDENT" plan configs/gpt2_124m.yaml --cluster h200:1x1 > "$out/s32.txt" ||
    { echo "FAIL: plan gpt2_124m on h200"; fails=$((fails + 1)); }
python3 - "$out/s32.json" "$out/s16.json" <<'PY' || fails=$((fails + 1))
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ok = (a["elem_param"], a["elem_act"], b["elem_param"], b["elem_act"]) == (4, 4, 2, 2) and \
    a["stages"][0]["params"] == 2 * b["stages"][0]["params"] and a["gemm_efficiency"] == 0.57
print(f"{'ok  ' if ok else 'FAIL'} storage: cuda bf16 plans {a['elem_param']}-byte weights "
      f"({b['elem_param']} with --storage bf16), gemm_efficiency {a['gemm_efficiency']}")
sys.exit(0 if ok else 1)
PY
grep -q "^assumes: compute at gemm_efficiency 0.57 of the 989 TFLOP/s peak" "$out/s32.txt" &&
    grep -q "^bytes per element: weights 4, gradients 4, activations 4" "$out/s32.txt" &&
    echo "ok   the plan states its storage and its assumed GEMM efficiency" ||
    { echo "FAIL: the plan's text lacks its storage or GEMM efficiency"; fails=$((fails + 1)); }

# Every committed config plans on the cluster its '# plan:' line names.
for f in configs/*.yaml; do
    cluster=$(sed -n 's/^# plan: .*--cluster \([^ ]*\).*/\1/p' "$f")
    "$TRIDENT" plan "$f" ${cluster:+--cluster "$cluster"} > "$out/plan.txt" 2>&1 \
        || { echo "FAIL: trident plan $f ${cluster:+--cluster $cluster}"; tail -3 "$out/plan.txt"; fails=$((fails + 1)); continue; }
    echo "ok   plans: $f ${cluster:+on $cluster}: $(grep -E '^(fits|DOES)' "$out/plan.txt" | cut -c1-60)"
done

# --search finds a layout that fits; a config that cannot fit says by how
# much and what would.
"$TRIDENT" plan configs/gpt_100b.yaml --cluster a100-80gb:8x8 --search --top 3 > "$out/search.txt" 2>&1
if grep -qE '^  1 ' "$out/search.txt" && ! grep -E '^  1 ' "$out/search.txt" | grep -q 'DOES NOT FIT'; then
    echo "ok   search: $(grep -E '^  1 ' "$out/search.txt" | cut -c1-90)"
else
    echo "FAIL: search"; cat "$out/search.txt"; fails=$((fails + 1))
fi
"$TRIDENT" plan configs/gpt_100b.yaml --cluster a100-80gb:8x8 --set topology.tp=1 \
    --set topology.pp=1 --set topology.dp=64 --set topology.zero=0 --set topology.virtual_stages=1 \
    --set topology.schedule=1f1b > "$out/nofit.txt" 2>&1
if grep -q 'DOES NOT FIT' "$out/nofit.txt" && grep -q '^what fits on 64 GPUs: tp' "$out/nofit.txt"; then
    echo "ok   no fit: $(grep 'DOES NOT FIT' "$out/nofit.txt" | cut -c1-80)"
else
    echo "FAIL: no-fit report"; cat "$out/nofit.txt"; fails=$((fails + 1))
fi

# topology.offload (docs/finetune.md): Llama 7B on four 24 GB GPUs fits only
# with the optimizer state in host memory; the best layout of --search is
# offloaded, the committed config's layout does not fit without it, and a
# host with too little RAM for the offloaded state does not fit either.
"$TRIDENT" plan configs/llama_7b.yaml --cluster rtx3090:1x4 --search --top 3 > "$out/s7b.txt" 2>&1
"$TRIDENT" plan configs/llama_7b.yaml --cluster rtx3090 --set topology.offload=none \
    > "$out/p7b_none.txt" 2>&1
printf 'preset: rtx3090\nhost_memory_gib: 64\n' > "$out/small_host.yaml"
"$TRIDENT" plan configs/llama_7b.yaml --cluster "$out/small_host.yaml" > "$out/p7b_host.txt" 2>&1
if grep -qE '^search: [0-9]+ valid layouts evaluated, [1-9][0-9]* fit' "$out/s7b.txt" &&
   grep -E '^  1 ' "$out/s7b.txt" | grep -q ' optimizer ' &&
   ! grep -E '^  1 ' "$out/s7b.txt" | grep -q 'DOES NOT FIT' &&
   grep -q '^DOES NOT FIT: stage' "$out/p7b_none.txt" &&
   grep -q "^DOES NOT FIT: the GPUs do .*host memory needs [0-9.]* GiB, more than its 64.00 GiB" \
       "$out/p7b_host.txt"; then
    echo "ok   offload: $(grep '^search:' "$out/s7b.txt" | cut -c9-60); best: $(grep -E '^  1 ' "$out/s7b.txt" | cut -c1-75)"
else
    echo "FAIL: offload plans"; cat "$out/s7b.txt" "$out/p7b_none.txt" "$out/p7b_host.txt"
    fails=$((fails + 1))
fi

echo "plan_runs: $fails failed"
[ "$fails" -eq 0 ]
