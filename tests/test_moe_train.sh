#!/usr/bin/env bash
# Mixture of experts in training (model.moe, docs/moe.md): the layouts that
# compose with it train the curve of one rank (fp32, per-step loss within
# relative 1e-5, and the router's metrics equal): GPT-2 (4 experts, top-2,
# a shared expert) at dp 2, pp 2, dp 2 with ZeRO 1 and 3; Llama (4
# experts, top-1, capacity 1.0, every 2nd layer) at dp 2 with ZeRO 3 and
# pp 2.  Expert parallelism (topology.ep 2: the 4 experts split over 2
# ranks, tokens sent to them by all-to-all): gpt2 at dp 2, dp 4, dp 2 with
# ZeRO 1, 2 and 3, dp 4 with ZeRO 1, 2 and 3 and dp 2 x pp 2, llama
# (dropping) at dp 2 with ZeRO 3; the experts' memory divided over ep at
# every stage (memory_bytes against the config; the checkpoints of dp 4 x
# ep 2 at ZeRO 1-3, read by h5py, the 1-rank run's), their gradients reduced
# per layer during backward at ZeRO 0-1 (the traces of dp 4 x ep 2).  A
# checkpoint of the 1-rank run resumes at dp 2 with ep 2, one of the ep 2
# run resumes on one rank, and both go on as the 1-rank run did; eval
# reads a MoE checkpoint.  ep 4 at dp 4.  Tensor parallelism (each expert
# split over tp 2): gpt2 at tp 2, with sequence parallelism, ep 2 x tp 2;
# llama (dropping) at tp 2 with sequence parallelism.  Eight experts and
# one shared expert: a llama, top-2, at ep 2 with ZeRO 3, ep 2 x tp 2 with
# sequence parallelism, ep 4 with ZeRO 3 and ep 2 x pp 2; a gpt2, top-1,
# at ep 2 and ep 2 x tp 2 with ZeRO 1.  The ep 2 x tp 2 checkpoint resumes
# on one rank, the 1-rank one at tp 2 with sequence parallelism.  Tiny:
# bytes, hidden 32, 2 layers, seq 32, 3 steps, micro-batch 1 (the router's
# losses are per micro-batch).
. "$(dirname "$0")/e2e.sh"

byte_data 2

small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=32 --set model.heads=4
       --set model.vocab=257 --set model.seq_len=32 --set training.steps=3
       --set training.warmup_steps=1 --set training.global_batch=4 --set training.micro_batch=1
       --set data.path="$out/bytes" --set data.val_path= --set run.log_every=100
       --set model.moe.experts=4 --set model.moe.shared_experts=1)
llama=(--set model.arch=llama --set model.kv_heads=2 --set model.moe.top_k=1
       --set model.moe.capacity_factor=1.0 --set model.moe.every=2 --set model.moe.shared_experts=0)

# The loss curve, and the router's metrics of every step equal one rank's.
compare() { # reference, name
    curves "$1" "$2" --steps 3 --norm-rtol 1e-4
    python3 - "$out/$1/metrics.jsonl" "$out/$2/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
keys = ["moe_aux_loss", "moe_z_loss", "moe_tokens_per_expert_min", "moe_tokens_per_expert_max",
        "moe_dropped"]
bad = [(r["step"], k, r[k], s[k]) for r, s in zip(a, b) for k in keys
       if abs(r[k] - s[k]) > 1e-5 * abs(r[k])]
print(("FAIL" if bad or len(a) != len(b) else "ok  ") + f" router metrics of {sys.argv[2]}: {bad}")
sys.exit(1 if bad or len(a) != len(b) else 0)
PY
}

RUN_CKPT=1 run gpt2 1 --set checkpoint.every=2
run gpt2_dp2 2 --set topology.dp=2
compare gpt2 gpt2_dp2
run gpt2_pp2 2 --set topology.pp=2
compare gpt2 gpt2_pp2
for z in 1 3; do
    run "gpt2_dp2_zero$z" 2 --set topology.dp=2 --set topology.zero="$z"
    compare gpt2 "gpt2_dp2_zero$z"
done
run llama 1 "${llama[@]}"
run llama_dp2_zero3 2 "${llama[@]}" --set topology.dp=2 --set topology.zero=3
compare llama llama_dp2_zero3
run llama_pp2 2 "${llama[@]}" --set topology.pp=2
compare llama llama_pp2
# Expert parallelism: the experts split over ep ranks of dp, the same curve.
ep=(--set topology.ep=2)
RUN_CKPT=1 run gpt2_ep2 2 --set topology.dp=2 "${ep[@]}" --set checkpoint.every=2 \
    --set training.trace=true
compare gpt2 gpt2_ep2
run gpt2_dp4_ep2 4 --set topology.dp=4 "${ep[@]}" --set training.trace=true
compare gpt2 gpt2_dp4_ep2
for z in 1 2 3; do
    run "gpt2_ep2_zero$z" 2 --set topology.dp=2 "${ep[@]}" --set topology.zero="$z"
    compare gpt2 "gpt2_ep2_zero$z"
done
run gpt2_ep2_pp2 4 --set topology.dp=2 --set topology.pp=2 "${ep[@]}"
compare gpt2 gpt2_ep2_pp2
run llama_ep2_zero3 2 "${llama[@]}" --set topology.dp=2 "${ep[@]}" --set topology.zero=3
compare llama llama_ep2_zero3
run gpt2_dp4_ep4 4 --set topology.dp=4 --set topology.ep=4
compare gpt2 gpt2_dp4_ep4
# dp 4, ep 2: expert-data-parallel groups of two ranks, at ZeRO 1, 2 and 3
# (saved; 1 and 3 resumed below).
for z in 1 2 3; do
    RUN_CKPT=1 run "gpt2_dp4_ep2_zero$z" 4 --set topology.dp=4 "${ep[@]}" \
        --set topology.zero="$z" --set checkpoint.every=2 --set training.trace=true
    compare gpt2 "gpt2_dp4_ep2_zero$z"
    # The checkpoint keeps the global layout: read by h5py, its weights and
    # Adam state are the 1-rank run's (rtol 1e-3 of each dataset's largest
    # value: Adam's first steps are lr x sign(g), and gradients near 0, like
    # the key biases', change sign with the order of the sums; a row in the
    # wrong place is off by the whole scale).
    /usr/bin/python3 tests/ckpt_same.py "$out/gpt2/ckpt/step_00000002" \
        "$out/gpt2_dp4_ep2_zero$z/ckpt/step_00000002" --rtol 1e-3 || fails=$((fails + 1))
done
# At ZeRO 0-1 (as at 2-3) each layer's expert gradients are reduced over
# edp as soon as that layer's backward is done, overlapped with the rest
# of backward: in the traces of dp 4 x ep 2 every rank has, per step, one
# all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1) over edp per MoE layer,
# each issued inside a backward span.
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
out, bad = sys.argv[1], []
for name, op in [("gpt2_dp4_ep2", "all-reduce edp"), ("gpt2_dp4_ep2_zero1", "reduce-scatter edp")]:
    spans = [e for e in json.load(open(f"{out}/{name}/trace.json"))["traceEvents"] if e["ph"] == "X"]
    for r in range(4):
        bwd = [e for e in spans if e["pid"] == r and e["name"] == "bwd"]
        red = [e for e in spans if e["pid"] == r and e["name"] == op and e["args"].get("bytes")]
        late = [e["ts"] for e in red
                if not any(b["ts"] <= e["ts"] <= b["ts"] + b["dur"] for b in bwd)]
        if len(red) != 3 * 2 or late:
            bad.append((name, r, len(red), "issued after backward at", late))
print(("FAIL" if bad else "ok  ") + f" expert reductions at ZeRO 0-1 overlap backward: {bad}")
sys.exit(1 if bad else 0)
PY
# ep divides the experts' memory at every ZeRO stage (memory_bytes of the
# first record, rank 0's, against sizes counted here from the written
# config): the weights are the 1-rank run's less (ep - 1) / ep of the
# experts; at ZeRO 0 so are the gradients, and the optimizer state is
# twice that (Adam's m and v); at ZeRO 1-3 the optimizer state is rank 0's
# block of the dense part over dp and of its experts over dp / ep, m and v;
# the gradients are the whole buffer plus those blocks at ZeRO 1, the
# blocks only at ZeRO 2-3 (the per-layer slots are zero_buffers), and at
# ZeRO 3 the weights are those blocks too, and its parameter slots (its
# zero_buffers less ZeRO 2's) hold the rank's experts only.
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
out, bad = sys.argv[1], []
def first(name):
    return json.loads(open(f"{out}/{name}/metrics.jsonl").readline())["memory_bytes"]
def moe(name):
    text = open(f"{out}/{name}/config.yaml").read()
    model = dict(l.strip().split(": ", 1) for l in text.split("\nmodel:\n")[1].split("\n  moe:\n")[0]
                 .splitlines() if l.startswith("  ") and ": " in l)
    block = text.split("\n  moe:\n")[1].splitlines()
    m = dict(l.strip().split(": ", 1) for l in block if l.startswith("    "))
    C, L, E, every = (int(model["hidden"]), int(model["layers"]), int(m["experts"]), int(m["every"]))
    F = int(m["ffn_hidden"]) or int(model["ffn_hidden"])
    layers = sum(1 for l in range(L) if (l + 1) % every == 0)
    return layers * E * (2 * C * F + F + C)  # gpt2 experts: fc, fc bias, proj, proj bias
whole = first("gpt2")["params"] // 4
X = moe("gpt2")
ceil = lambda a, b: -(-a // b)
for name, dp, ep, zero in [("gpt2", 1, 1, 0), ("gpt2_ep2", 2, 2, 0), ("gpt2_dp4_ep2", 4, 2, 0),
                           ("gpt2_dp4_ep4", 4, 4, 0)] + [
        (f"gpt2{'_dp4' if dp == 4 else ''}_ep2_zero{z}", dp, 2, z) for dp in (2, 4)
        for z in (1, 2, 3)]:
    mem = first(name)
    n = whole - X + X // ep
    block = ceil(whole - X, dp) + ceil(X // ep, dp // ep)
    if zero == 0:
        want = (4 * n, 4 * n, 8 * n)
    elif zero == 1:
        want = (4 * n, 4 * (n + block), 8 * block)
    else:
        want = (4 * (n if zero == 2 else block), 4 * block, 8 * block)
    got = (mem["params"], mem["grads"], mem["optimizer"])
    if got != want:
        bad.append((name, got, want))
    if zero == 3:  # ZeRO 3's blocks are 1 / dp of everything either way: its
        # parameter slots show the division (two slots of one layer each and
        # the outer one: with 2 layers the rank's whole model, E / ep experts)
        slots = mem["zero_buffers"] - first(name.replace("zero3", "zero2"))["zero_buffers"]
        if slots != 4 * n:
            bad.append((name, "parameter slots", slots, 4 * n))
print(("FAIL" if bad else "ok  ") + f" experts' memory divided over ep at ZeRO 0-3: {bad}")
sys.exit(1 if bad else 0)
PY
# Tensor and sequence parallelism: every expert split over tp like the
# dense MLP, alone, under sequence parallelism and with ep.
tp=(--set topology.tp=2)
sp=(--set topology.sequence_parallel=true)
run gpt2_tp2 2 "${tp[@]}"
compare gpt2 gpt2_tp2
run gpt2_tp2_sp 2 "${tp[@]}" "${sp[@]}"
compare gpt2 gpt2_tp2_sp
RUN_CKPT=1 run gpt2_ep2_tp2 4 --set topology.dp=2 "${ep[@]}" "${tp[@]}" --set checkpoint.every=2
compare gpt2 gpt2_ep2_tp2
run llama_tp2_sp 2 "${llama[@]}" "${tp[@]}" "${sp[@]}"
compare llama llama_tp2_sp
# Eight experts and one shared expert, the issue's layouts between them:
# Llama, top-2: ep 2 with ZeRO 3, ep 2 x tp 2 with sequence parallelism,
# ep 4 with ZeRO 3, ep 2 x pp 2; GPT-2, top-1: ep 2, ep 2 x tp 2 with
# ZeRO 1.
llama8=(--set model.arch=llama --set model.kv_heads=2 --set model.moe.experts=8
        --set model.moe.top_k=2 --set model.moe.ffn_hidden=32 --set model.moe.shared_experts=1)
run llama8 1 "${llama8[@]}"
run llama8_ep2_zero3 2 "${llama8[@]}" --set topology.dp=2 "${ep[@]}" --set topology.zero=3
compare llama8 llama8_ep2_zero3
run llama8_ep2_tp2_sp 4 "${llama8[@]}" --set topology.dp=2 "${ep[@]}" "${tp[@]}" "${sp[@]}"
compare llama8 llama8_ep2_tp2_sp
run llama8_dp4_ep4_zero3 4 "${llama8[@]}" --set topology.dp=4 --set topology.ep=4 \
    --set topology.zero=3
compare llama8 llama8_dp4_ep4_zero3
run llama8_ep2_pp2 4 "${llama8[@]}" --set topology.dp=2 "${ep[@]}" --set topology.pp=2
compare llama8 llama8_ep2_pp2
gpt8=(--set model.moe.experts=8 --set model.moe.top_k=1 --set model.moe.ffn_hidden=32
      --set model.moe.shared_experts=1)
run gpt8 1 "${gpt8[@]}"
run gpt8_ep2 2 "${gpt8[@]}" --set topology.dp=2 "${ep[@]}"
compare gpt8 gpt8_ep2
run gpt8_ep2_tp2_zero1 4 "${gpt8[@]}" --set topology.dp=2 "${ep[@]}" "${tp[@]}" \
    --set topology.zero=1
compare gpt8 gpt8_ep2_tp2_zero1
# The eight-expert runs are what the comment says: 8 experts, one shared,
# top-2 (llama8) and top-1 (gpt8), as each run's written config records.
python3 - "$out" <<'PY' || fails=$((fails + 1))
import glob, itertools, os, sys
out, bad = sys.argv[1], []
runs = sorted(glob.glob(f"{out}/llama8*/config.yaml") + glob.glob(f"{out}/gpt8*/config.yaml"))
for path in runs:
    name = os.path.basename(os.path.dirname(path))
    block = open(path).read().split("\n  moe:\n")[1].splitlines()
    moe = dict(l.strip().split(": ")
               for l in itertools.takewhile(lambda l: l.startswith("    "), block))
    want = {"experts": "8", "shared_experts": "1", "top_k": "2" if name[0] == "l" else "1"}
    bad += [(name, k, moe.get(k), v) for k, v in want.items() if moe.get(k) != v]
ok = len(runs) == 8 and not bad
print(("ok  " if ok else "FAIL") + f" {len(runs)} eight-expert runs, one shared expert each: {bad}")
sys.exit(0 if ok else 1)
PY
# The all-to-alls ran: the trace of ep 2 has them (the group "ep").
grep -q "all-to-all ep" "$out/gpt2_ep2/trace.json" 2>/dev/null \
    || { echo "FAIL: no all-to-all in gpt2_ep2's trace"; fails=$((fails + 1)); }

# The llama runs drop tokens (capacity 1.0, top-1): the metric says so.
python3 - "$out/llama/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
d = [json.loads(l)["moe_dropped"] for l in open(sys.argv[1])]
print(("ok  " if sum(d) > 0 else "FAIL") + f" llama dropped assignments per step: {d}")
sys.exit(0 if sum(d) > 0 else 1)
PY

# Step 2 of the 1-rank run resumes at dp 2 with ep 2, and step 2 of the ep
# 2 run on one rank; both go on as the 1-rank run (experts are saved whole).
resume() { # from, name, ranks, settings...
    local from=$1 name=$2 n=$3
    shift 3
    cp -r "$out/$from/ckpt" "$out/$name.ckpt"
    rm -rf "$out/$name.ckpt"/step_00000003
    echo step_00000002 > "$out/$name.ckpt/latest"
    run "$name" "$n" --set checkpoint.dir="$out/$name.ckpt" "$@"
    grep -q "resumed from .*step_00000002" "$out/$name.log" \
        || { echo "FAIL: $name did not resume"; fails=$((fails + 1)); }
    curves "${RESUME_REF:-gpt2}" "$name" --from 3 --to "${RESUME_TO:-3}"
}
resume gpt2 resume_dp2_ep2 2 --set topology.dp=2 "${ep[@]}"
resume gpt2_ep2 resume_ep1 1
# Each rank writes and reads its own experts' rows, optimizer state
# included (step 4 follows from step 3's Adam update): ep 2 -> ep 4 and
# dp 4 x ep 2, against the 1-rank checkpoint resumed on one rank (4 steps).
resume gpt2 resume_4 1 --set training.steps=4
for to in "resume_dp4_ep4 --set topology.ep=4" "resume_dp4_ep2 ${ep[*]}" \
    "resume_dp4_ep2_zero1 ${ep[*]} --set topology.zero=1" \
    "resume_dp4_ep2_zero3 ${ep[*]} --set topology.zero=3"; do
    set -- $to
    RESUME_REF=resume_4 RESUME_TO=4 resume gpt2_ep2 "$1" 4 --set topology.dp=4 "${@:2}" \
        --set training.steps=4
done
# ZeRO 1 and 3 checkpoints with the experts' optimizer state (and at ZeRO
# 3 their weights) in blocks over the expert-data-parallel pairs, on one
# rank.
for z in 1 3; do
    RESUME_REF=resume_4 RESUME_TO=4 resume "gpt2_dp4_ep2_zero$z" "resume_zero${z}_ep1" 1 \
        --set training.steps=4
done
# Across tp: the ep 2 x tp 2 checkpoint on one rank, the 1-rank one at tp 2
# with sequence parallelism (the experts are saved in the global layout).
resume gpt2_ep2_tp2 resume_tp1 1
resume gpt2 resume_tp2_sp 2 "${tp[@]}" "${sp[@]}"
cp -r "$out/gpt2/ckpt" "$out/resume.ckpt"
# An ep that does not divide dp: exit 2 before anything runs, the rule named.
timeout 60 "$TRIDENT" plan configs/tiny.yaml "${small[@]}" --set topology.dp=2 \
    --set topology.ep=4 > "$out/ep_bad.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "topology.ep (4) must divide topology.dp (2)" "$out/ep_bad.log"; then
    echo "ok   ep 4 of dp 2 refused (exit 2)"
else
    echo "FAIL: ep 4 of dp 2 exited $rc: $(tail -2 "$out/ep_bad.log")"; fails=$((fails + 1))
fi
# training.sample_every decodes with rank 0's model, which with ep holds
# only its ep rank's experts: exit 2 at the key (ZeRO 2 here, the one
# stage sample_every takes otherwise).
timeout 60 "$TRIDENT" plan configs/tiny.yaml "${small[@]}" --set topology.dp=2 "${ep[@]}" \
    --set topology.zero=2 --set training.sample_every=2 > "$out/sample_bad.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "training.sample_every needs the whole model on rank 0, but topology.ep 2" \
    "$out/sample_bad.log"; then
    echo "ok   sample_every with the experts divided over ep refused (exit 2)"
else
    echo "FAIL: sample_every at ep 2 exited $rc: $(tail -2 "$out/sample_bad.log")"; fails=$((fails + 1))
fi
# A dense config does not load the MoE checkpoint: exit 2, the two models named.
timeout 120 "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set model.moe.experts=0 \
    --set run.dir="$out/resume_dense" --set checkpoint.dir="$out/resume.ckpt" \
    > "$out/resume_dense.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "saved model: .*moe 4 experts top-2; this model: .*tie_embeddings 1)" \
    "$out/resume_dense.log"; then
    echo "ok   a dense config refuses the MoE checkpoint (exit 2)"
else
    echo "FAIL: resume_dense exited $rc: $(tail -2 "$out/resume_dense.log")"; fails=$((fails + 1))
fi
# eval reads the MoE checkpoint.
timeout 120 "$TRIDENT" eval "$out/gpt2/ckpt" --data "$out/bytes" --sequences 4 --micro-batch 1 \
    > "$out/eval.log" 2>&1 && grep -q "loss" "$out/eval.log" \
    || { echo "FAIL: eval: $(tail -2 "$out/eval.log")"; fails=$((fails + 1)); }

echo "moe_train: $fails failed"
[ "$fails" -eq 0 ]
