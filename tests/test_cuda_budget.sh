#!/usr/bin/env bash
# The step budget of the CUDA backend, counted by the emulation
# (kernels/emu, TRD_EMU_STATS; docs/cuda.md "Step budget"): what the host
# asks of the device in a steady training step (step 2: step 1 allocates
# the bf16 slots, the range tables and the pinned result buffers), for a
# small GPT-2 with bf16 GEMMs (as bench/gpu.sh runs it) and a small Llama
# (GQA, RMSNorm, SwiGLU, RoPE) in fp32, one rank.  About 20 s of CPU each.
# Rules, each on step 2:
#   syncs    at most SYNCS host synchronizations: 1, the read of the
#            step's scalars at its end (loss, gradient norm, skip decision:
#            trainer.c device_step), with the cross-entropy target check
#            riding along; the clip factor and the skip decision stay on
#            the device, where AdamW reads them;
#   memory   no device allocation or free, no pinned host allocation;
#   memsets  at most MEMSETS a step, whatever the layers: the gradient
#            buffer, the step's scalars and the residual stream's gradient
#            at the head (dres).  The block backward zeroes nothing: the
#            first op to write each gradient buffer SETS it (backend.h
#            GRAD_SET, issue 30; before, GPT-2 bf16 4 a layer + 4, the
#            Llamas 7 a layer + 4);
#   serial   every kernel launch has at least N threads (grid x block),
#            N = B*T the token rows of the micro-batch (512 here, more than
#            four times the hidden size): a kernel whose parallelism is a
#            column count (one thread per column, each looping over all N
#            rows) has fewer.  Exempt: the finishing stages of two-stage
#            reductions, which loop over a fixed number of partials
#            whatever N (FINISH below: the gradient norm's finishing
#            block, which also makes the step's decision; the column
#            sums' second stage, over at most 264 chunks of rows);
#   launches at most LAUNCH_PER_LAYER * layers + LAUNCH_FIXED kernel
#            launches (the emulation does not see cuBLAS's own kernels;
#            its GEMMs are counted apart);
#   fused    (GPT-2 bf16) none of FUSED_AWAY is launched: the biases and
#            the MLP's GELU gradient are cuBLASLt epilogues, the GELU
#            writes its bf16 output from the GEMM's fp32 pre-activation in
#            a kernel of its own (gelu_forward_x16_kernel), not the fp32
#            one, and every bias gradient is summed in the pass that
#            converts its output gradient (to_bf16_col_sum_kernel), not by
#            col_sum_acc_kernel;
#   convert  exactly CONVERT[cfg] fp32 -> bf16 conversions a step, as
#            "A B": A to_bf16_kernel launches (matmul.cu), B
#            to_bf16_col_sum_kernel ones (an output gradient converted and
#            its bias gradient summed in one pass).  With bf16 activation
#            storage (docs/design.md) the norms' outputs, the MLP
#            projection's input and the attention output (its kernel
#            writes a bf16 copy beside the fp32 one) are written in bf16
#            and never converted, and with the step's bf16 weight copy
#            (backend.h weights_bf16) no GEMM converts its weight: one
#            conversion of the whole flat parameter buffer a step, then
#            per layer only the output gradients, one per backward: GPT-2
#            4 linears, each with a bias (B = 4 a layer), Llama (no
#            biases) 3 a layer (A: qkv, the projection and down;
#            SwiGLU's backward writes the gate's and up's in bf16, 5
#            before); the head none (its logits and
#            dlogits are stored in bf16, head_*_x16).  fp32: none.  (Before
#            the attention's bf16 copy, GPT-2 6 a layer and Llama 7, the
#            attention output converted for its forward and its weight
#            gradient, and GPT-2's dbias col_sum_acc_kernel, 4 a layer;
#            before the weight copy, one per GEMM forward and per
#            input-gradient GEMM more: GPT-2 14 a layer, Llama 17, the
#            head 2, no copy; before bf16 storage: GPT-2 20 a layer, head
#            5; before the bf16 logits the head was 3, its dlogits
#            converted.)
# A MoE step (below): launches, cuBLAS calls and memsets the same with 8
# experts as with 4.
# KNOWN_SERIAL lists serial kernels still to be fixed (none now: issue 30
# item 3 made the column sums and the embedding backward parallel); the
# test fails when another kernel is serial, and when a listed one no
# longer is (then take it off the list).
. "$(dirname "$0")/e2e.sh"

SYNCS=${TRIDENT_BUDGET_SYNCS:-1}
MEMSETS=3
declare -A CONVERT=([gpt2_bf16]="1 $((4 * 2))" [llama_bf16]="$((3 * 2 + 1)) 0" [llama]="0 0")
LAUNCH_PER_LAYER=34
# 18: the embedding backward's grouping is three launches for dwte (rank,
# place, sum; issue 30's replacement of the linked chains)
LAUNCH_FIXED=18
FUSED_AWAY="bias_broadcast_kernel gelu_forward_kernel gelu_backward_kernel col_sum_acc_kernel"
FINISH="sumsq_total_kernel grad_check_total_kernel colsum_finish_kernel"
KNOWN_SERIAL=""

small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=64 --set model.heads=4
       --set model.seq_len=64 --set training.steps=2 --set training.warmup_steps=1
       --set training.global_batch=8 --set training.micro_batch=8 --set data.val_every=1000 --set data.val_sequences=8
       --set run.log_every=1 --set backend=cuda)
llama=(--set model.arch=llama --set model.kv_heads=2)

budget() { # name: check step 3 of $out/name.stats
    python3 - "$out/$1.stats" "$1" "$SYNCS" "$LAUNCH_PER_LAYER" "$LAUNCH_FIXED" "$FINISH" \
        "$KNOWN_SERIAL" "$2" "${CONVERT[$1]}" "$MEMSETS" <<'PY' || fails=$((fails + 1))
import sys
path, name, syncs, per_layer, fixed = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
finish, known = set(sys.argv[6].split()), set(sys.argv[7].split())
fused_away = set(sys.argv[8].split())
convert, memsets = [int(x) for x in sys.argv[9].split()], int(sys.argv[10])
N, layers, step = 8 * 64, 2, 2
tot, kernels = None, {}
for line in open(path):
    f = line.rstrip("\n").split("\t")
    if f[0] == "step" and int(f[1]) == step:
        tot = {f[i]: float(f[i + 1]) for i in range(2, len(f), 2)}
    elif f[0] == "kernel" and int(f[1]) == step:
        kernels[f[2]] = (int(f[3]), int(f[4]))
bad = []
if tot is None:
    bad.append(f"no counts for step {step}")
    tot = {}
else:
    if tot["syncs"] > syncs:
        bad.append(f"{tot['syncs']:.0f} host synchronizations (budget {syncs})")
    for k in ("mallocs", "frees", "host_allocs"):
        if tot[k]:
            bad.append(f"{tot[k]:.0f} {k} in a steady step")
    if tot["memsets"] > memsets:
        bad.append(f"{tot['memsets']:.0f} memsets (budget {memsets}): a gradient buffer "
                   "zeroed before an op that could SET it (GRAD_SET)?")
    limit = per_layer * layers + fixed
    if tot["launches"] > limit:
        bad.append(f"{tot['launches']:.0f} launches (budget {limit})")
got = [kernels.get(k, (0, 0))[0] for k in ("to_bf16_kernel", "to_bf16_col_sum_kernel")]
if got != convert:
    bad.append(f"fp32 -> bf16 conversions (to_bf16_kernel, to_bf16_col_sum_kernel) {got}, "
               f"want {convert}")
for k in sorted(fused_away & set(kernels)):
    bad.append(f"{k} launched {kernels[k][0]} times: it should be fused into another pass")
serial = {k for k, (n, tmin) in kernels.items() if tmin < N and k not in finish}
for k in sorted(serial - known):
    bad.append(f"serial reduction: {k} launched with {kernels[k][1]} threads for {N} rows")
for k in sorted((known & set(kernels)) - serial):
    bad.append(f"{k} is no longer serial: take it off KNOWN_SERIAL")
summary = ", ".join(f"{k} {tot.get(k, 0):.0f}" for k in
                    ("launches", "syncs", "h2d", "d2h", "memsets", "mallocs", "gemms"))
summary += f", conversions {got[0]} + {got[1]} with dbias"
print(f"{'FAIL' if bad else 'ok  '} {name} step {step}: {summary}; "
      f"serial (known, issue 30): {' '.join(sorted(serial)) or 'none'}")
for b in bad:
    print(f"     {b}")
sys.exit(1 if bad else 0)
PY
}

for cfg in gpt2_bf16 llama_bf16 llama; do
    extra=(--set training.precision=bf16)
    [ $cfg = llama_bf16 ] && extra+=("${llama[@]}")
    [ $cfg = llama ] && extra=("${llama[@]}")
    rm -f "$out/$cfg.stats"
    TRD_EMU_STATS="$out/$cfg.stats" run "$cfg" 1 "${extra[@]}"
    away=""
    [ $cfg = gpt2_bf16 ] && away=$FUSED_AWAY
    budget "$cfg" "$away"
done
# A mixture of experts' step costs the same launches, cuBLAS calls and
# memsets with 8 experts as with 4 (step 2, bf16: the fp32 path's calls
# and launches are a subset (no rounding kernels); GPT-2, 2 MoE layers,
# top-2, no capacity limit; about 8 s a run): each linear of the experts
# is one grouped GEMM over all of them and the activation one pass over
# their rows (src/model/moe.c; a loop over the experts made them grow
# with E).  Only the products' count (gemms, one per expert with rows)
# grows.
moe=(--set model.seq_len=32 --set training.global_batch=2 --set training.micro_batch=2
     --set data.val_sequences=2 --set model.moe.top_k=2)
for p in bf16; do
    for E in 4 8; do
        rm -f "$out/moe${E}_$p.stats"
        TRD_EMU_STATS="$out/moe${E}_$p.stats" run "moe${E}_$p" 1 "${moe[@]}" \
            --set model.moe.experts=$E --set training.precision=$p
    done
    python3 - "$out/moe4_$p.stats" "$out/moe8_$p.stats" "$p" <<'PY' || fails=$((fails + 1))
import sys
def step2(path):
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        if f[0] == "step" and int(f[1]) == 2:
            return {f[i]: float(f[i + 1]) for i in range(2, len(f), 2)}
    return {}
a, b = step2(sys.argv[1]), step2(sys.argv[2])
keys = ("launches", "gemm_calls", "memsets")
bad = [f"{k}: {a.get(k)} with 4 experts, {b.get(k)} with 8" for k in keys
       if k not in a or a.get(k) != b.get(k)]
if not bad and not b["gemms"] > a["gemms"]:
    bad.append(f"gemms {a['gemms']:.0f} and {b['gemms']:.0f}: the products should be per expert")
print(f"{'FAIL' if bad else 'ok  '} MoE {sys.argv[3]} step 2, 4 against 8 experts: "
      + ", ".join(f"{k} {a.get(k, 0):.0f}/{b.get(k, 0):.0f}" for k in keys + ("gemms",)))
for x in bad:
    print(f"     {x}")
sys.exit(1 if bad else 0)
PY
done
# TRIDENT_PROFILE=1 (docs/cuda.md "Profile"): the table and run.dir's
# profile.tsv, checked for shape (the emulation's times mean nothing): the
# header, 7 numeric fields a row, the calls a step of known ops (GPT-2 with
# 2 layers: 4 linears a layer + the head = 9 matmul_forward, one adamw, one
# grad_check, one fused cross-entropy and its loss_add, no unfused one,
# one read to the host, one fused residual add + LayerNorm a layer),
# and the ops' ms plus the idle row adding up to the wall.
TRIDENT_PROFILE=1 run profile 1 --set model.seq_len=32 --set training.steps=3 --set training.global_batch=2 \
    --set training.micro_batch=2 --set data.val_sequences=2 --set training.precision=fp32
python3 - "$out/profile" "$out/profile.log" <<'PY' || fails=$((fails + 1))
import sys
d, log = sys.argv[1], open(sys.argv[2]).read()
bad = []
if "profile (TRIDENT_PROFILE, 2 steps after the first" not in log:
    bad.append("no profile table on stdout")
try:
    rows = [l.rstrip("\n").split("\t") for l in open(f"{d}/profile.tsv")]
except OSError as e:
    rows, bad = [], bad + [f"no profile.tsv: {e}"]
head = "op calls_per_step ms_per_step pct_of_step gb_per_s tflop_per_s us_per_call".split()
if rows and rows[0] != head:
    bad.append(f"header {rows[0]}")
ops = {}
for r in rows[1:]:
    try:
        ops[r[0]] = [float(x) for x in r[1:]]
        assert len(r) == 7
    except (ValueError, AssertionError):
        bad.append(f"bad row {r}")
want = {"matmul_forward": 9, "matmul_backward": 9, "adamw": 1, "grad_check": 1,
        "crossentropy_fused": 1, "loss_add": 1, "to_host": 1, "residual_norm_forward": 2}
for k, n in want.items():
    if k not in ops or ops[k][0] != n:
        bad.append(f"{k}: {ops.get(k, ['missing'])[0]} calls a step, want {n}")
for k in ("crossentropy_forward", "crossentropy_backward", "sumsq_ranges"):
    if k in ops and ops[k][0] > 0:  # (validation's forward runs unfused, not in a step)
        bad.append(f"{k}: {ops[k][0]} calls a step, want none (fused / on the device)")
if "step_wall" in ops and "gpu_idle" in ops:  # (parts "op/part" are inside their op's time)
    total = sum(v[1] for k, v in ops.items() if k != "step_wall" and "/" not in k)
    if abs(total - ops["step_wall"][1]) > 1e-3 * ops["step_wall"][1] + 0.01:
        bad.append(f"ops + idle {total} ms != step wall {ops['step_wall'][1]} ms")
else:
    bad.append("no gpu_idle / step_wall rows")
print(f"{'FAIL' if bad else 'ok  '} profile: {len(ops)} rows in profile.tsv, table on stdout")
for b in bad:
    print(f"     {b}")
sys.exit(1 if bad else 0)
PY
# The parts of the ops in bf16 (kernels/profile.cu, PROFILE_PART): each
# GEMM op's cuBLAS calls and its output gradients' conversions as rows
# "op/part" under the op, inside its time: every op with GEMM FLOPs has a
# gemm or gemm_lt part, at least one a call; the output gradients'
# conversions (with their bias gradients) are 4 a layer, as the budget's
# count; no GEMM converts an operand (to_bf16) in a step; a part takes no
# longer than its op; the ops without the parts still add up to the wall.
TRIDENT_PROFILE=1 run profile_bf16 1 --set model.seq_len=32 --set training.steps=3 \
    --set training.global_batch=2 --set training.micro_batch=2 --set data.val_sequences=2 \
    --set training.precision=bf16
python3 - "$out/profile_bf16" <<'PY' || fails=$((fails + 1))
import sys
rows = [l.rstrip("\n").split("\t") for l in open(f"{sys.argv[1]}/profile.tsv")][1:]
ops = {r[0]: [float(x) for x in r[1:]] for r in rows}
parts = {k: v for k, v in ops.items() if "/" in k}
bad = []
gemm_ops = [k for k, v in ops.items() if "/" not in k and v[4] > 0]
if not gemm_ops:
    bad.append("no op with FLOPs")
for op in gemm_ops:
    calls = sum(v[0] for k, v in parts.items() if k in (f"{op}/gemm", f"{op}/gemm_lt"))
    if calls < ops[op][0]:
        bad.append(f"{op}: {calls} cuBLAS parts a step for {ops[op][0]} calls")
for k, v in parts.items():
    parent = ops.get(k.split("/")[0])
    if parent is None:
        bad.append(f"part {k} without its op's row")
    elif v[1] > parent[1] * 1.001 + 0.01:
        bad.append(f"part {k}: {v[1]} ms, more than its op's {parent[1]}")
dout = sum(v[0] for k, v in parts.items() if k.endswith("/dout_bf16_dbias"))
if dout != 4 * 2:
    bad.append(f"{dout} output gradients converted a step, want 4 a layer (8)")
conv = [k for k in parts if k.endswith("/to_bf16")]
if conv:
    bad.append(f"operands converted in a step: {conv}")
total = sum(v[1] for k, v in ops.items() if k != "step_wall" and "/" not in k)
if abs(total - ops["step_wall"][1]) > 1e-3 * ops["step_wall"][1] + 0.01:
    bad.append(f"ops + idle {total} ms != step wall {ops['step_wall'][1]} ms")
print(f"{'FAIL' if bad else 'ok  '} profile bf16: {len(parts)} part rows "
      f"({', '.join(sorted(parts))})")
for b in bad:
    print(f"     {b}")
sys.exit(1 if bad else 0)
PY

[ "$fails" -eq 0 ] && echo "PASS cuda_budget" || echo "FAIL cuda_budget: $fails"
exit $((fails > 0))
