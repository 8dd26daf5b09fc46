#!/usr/bin/env bash
# topology.offload: optimizer (docs/finetune.md) in the emulated CUDA build
# (suite emu): the optimizer state of each rank's shard in host memory,
# AdamW on the host, against the same runs with the state on the device.
#
#   1 rank (fp32): the same losses, gradient norms and final weights, bit
#     for bit (the host runs the CPU backend's AdamW, the device the
#     kernel's: the same arithmetic); the device memory report's optimizer
#     drops to 0 and rank 0's device peak drops by exactly the no-offload
#     run's optimizer bytes, m and v = 2 x the fp32 weights; the host holds
#     master, m, v and the staging buffer = 4 x the weights, as `trident plan`
#     says; a checkpoint saved without offload resumes with it;
#   dp 2 with ZeRO 1 and tp 2 x pp 2 (fp32): the 1-rank curve without
#     offload, within the fp32 tolerance of test_cuda_train.sh (2e-5
#     relative, losses and gradient norms; the layouts sum in another
#     order: the emulation's losses agree to every printed digit, the final
#     weights by ~1e-7);
#   dp 2 with ZeRO 0 and 1 (fp32, 4 buckets): the same curve and weights
#     as the same layout without offload, bit for bit; the gradients go
#     down a bucket at a time (one copy per rank and non-empty part of a
#     bucket, TRD_EMU_STATS) with one host wait a step, as before, on the
#     copy stream (under NCCL after each reduction's own event, not after
#     the compute stream), and the weights come up on the copy stream,
#     waited for by the compute stream once per part (the emulation's
#     counts per stream: docs/cuda.md);
#   dp 2 with ZeRO 3 in bf16 (master weights on the host, sharded): the
#     same curve and weights as without offload; a checkpoint saved with
#     offload resumes without it, and one saved without resumes with it,
#     each continuing the uninterrupted curve bit for bit.
# topology.offload: optimizer+params (ZeRO-3's parameter shard in host
# memory as well): at the end of this file, with its copies' streams and
# skipped steps over bf16's streamed gradients.
# A byte-level corpus (vocab 257) and a 2-layer model of width 32 keep the
# emulated kernels cheap: 2 steps a run (3 for the resumes).
. "$(dirname "$0")/e2e.sh"

cat data/brown/txt/ca0[1-4] > "$out/corpus.txt"
"$TRIDENT" prepare-data --input "$out/corpus.txt" --tokenizer byte --out "$out/byte" > /dev/null ||
    { echo "FAIL: prepare-data of the byte corpus"; exit 1; }
small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=32 --set model.heads=2
       --set model.seq_len=32 --set model.vocab=257 --set training.steps=2
       --set training.warmup_steps=1 --set training.lr=1e-3 --set training.global_batch=4
       --set training.micro_batch=2 --set data.path="$out/byte" --set data.val_path=
       --set run.log_every=100 --set backend=cuda)
off=(--set topology.offload=optimizer)

same() { # ref, name[, first step]: identical losses and gradient norms (and final weights)
    python3 - "$out" "$@" <<'PY' || fails=$((fails + 1))
import filecmp, json, os, sys
out, ref, name = sys.argv[1:4]
first = int(sys.argv[4]) if len(sys.argv) > 4 else 1
def curve(n):
    recs = [json.loads(l) for l in open(f"{out}/{n}/metrics.jsonl")]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in recs if "loss" in r and r["step"] >= first}
a, b = curve(ref), curve(name)
wa, wb = f"{out}/{ref}.weights", f"{out}/{name}.weights"
weights = os.path.exists(wa) and os.path.exists(wb)
ok = a == b and len(b) > 0 and (not weights or filecmp.cmp(wa, wb, shallow=False))
print(f"{'ok  ' if ok else 'FAIL'} {name} equals {ref} bit for bit from step {first} "
      f"({len(b)} steps{', final weights' if weights else ''})"
      + ("" if ok else f": {sorted(a.items())} vs {sorted(b.items())}"))
sys.exit(0 if ok else 1)
PY
}

# ---- 1 rank, fp32 ---------------------------------------------------------
TRD_EMU_STATS="$out/one.stats" RUN_CKPT=1 run one 1 --set checkpoint.every=1
TRD_EMU_STATS="$out/one_off.stats" run one_off 1 "${off[@]}"
same one one_off
# fp32 keeps no master weights in a checkpoint: the host's are read back
# from the loaded weights (zero_params_loaded).
run one_off_from_plain 1 "${off[@]}" --set checkpoint.resume="$out/one/ckpt/step_00000001"
same one one_off_from_plain 2
"$TRIDENT" plan configs/tiny.yaml "${small[@]}" "${off[@]}" --json > "$out/plan.json" 2>&1 ||
    { echo "FAIL: trident plan with offload"; cat "$out/plan.json"; fails=$((fails + 1)); }
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, re, sys
out = sys.argv[1]
def mem(n):
    rec = json.loads(open(f"{out}/{n}/metrics.jsonl").readline())
    peak = re.search(r"device memory: peak \d+ bytes .*\(rank 0: (\d+) bytes\)",
                     open(f"{out}/{n}.log").read())
    return rec["memory_bytes"], rec.get("host_memory_bytes", {}), int(peak.group(1))
(b, bh, bpeak), (o, oh, opeak) = mem("one"), mem("one_off")
plan = json.loads(open(f"{out}/plan.json").read().strip().splitlines()[-1])
st = plan["stages"][0]
checks = [
    ("no-offload optimizer = m and v of the fp32 weights", b["optimizer"] == 2 * b["params"]),
    ("offloaded: device optimizer 0", o["optimizer"] == 0 and not bh),
    ("device peak drops by the optimizer's bytes", bpeak - opeak == b["optimizer"]),
    ("host: master, m, v, staging = 4 x the weights", oh.get("optimizer") == 4 * o["params"]),
    ("the other categories unchanged", {k: v for k, v in b.items() if k != "optimizer"} ==
                                       {k: v for k, v in o.items() if k != "optimizer"}),
    ("trident plan: the same host and device bytes", plan.get("offload") is True and
        st["optimizer"] == 0 and st["host_optimizer"] == oh.get("optimizer")),
]
bad = [w for w, good in checks if not good]
print(f"{'FAIL' if bad else 'ok  '} memory: device peak {bpeak} -> {opeak} bytes, optimizer "
      f"{b['optimizer']} -> {o['optimizer']} on the device, {oh.get('optimizer')} on the host"
      + (f"; wrong: {bad}" if bad else ""))
sys.exit(1 if bad else 0)
PY

# ---- layouts against the 1-rank curve (fp32) ------------------------------
TOL=${TRIDENT_CUDA_TOL:-2e-5}
run dp2_zero1_off 2 --set topology.dp=2 --set topology.zero=1 "${off[@]}"
curves one dp2_zero1_off --steps 2 --rtol "$TOL" --norm-rtol "$TOL" --weights-atol 1e-5
run tp2_pp2_off 4 --set topology.tp=2 --set topology.pp=2 --set topology.dp=1 "${off[@]}"
curves one tp2_pp2_off --steps 2 --rtol "$TOL" --norm-rtol "$TOL"

# ---- ZeRO 0 and 1, dp 2: the gradients go down per bucket ------------------
# A wider model (3 layers of hidden 192: 1.7 MiB each) with
# topology.bucket_mb 1 makes four buckets: each layer, then the outer
# tensors.  Offload sends each rank's part of a bucket to the host as that
# bucket's reduction completes (ZeRO 0: the whole bucket, all-reduced;
# ZeRO 1: the rank's part of it, reduce-scattered), on the copy stream,
# and the optimizer step waits once for all of them.  Against the same
# layout without offload (fp32): the same curve and weights bit for bit;
# in the steady step's counts (TRD_EMU_STATS, both ranks summed) one copy
# down per (rank, non-empty part of a bucket) where a copy of the whole
# gradient was before, and one host wait more per rank, whatever the
# number of buckets: the wait for all the copies, as many as the one
# to_host of the whole gradient made before (no wait per bucket).
wide=(--set model.layers=3 --set model.hidden=192 --set model.heads=3
      --set topology.bucket_mb=1 --set topology.dp=2)
# Both ways of communicating: MPI staging through the host (whose wait for
# a bucket is the host's) and NCCL (played by MPI here: a wait orders the
# compute stream, not the host), each against itself without offload.
for zero in 0 1; do
    for comm in mpi nccl; do
        n="dp2_z${zero}_$comm"
        TRD_EMU_STATS="$out/$n.stats" run "$n" 2 "${wide[@]}" --set topology.zero=$zero \
            --set topology.comm=$comm
        TRD_EMU_STATS="$out/${n}_off.stats" run "${n}_off" 2 "${wide[@]}" \
            --set topology.zero=$zero --set topology.comm=$comm "${off[@]}"
        same "$n" "${n}_off"
        grep -q "| comm $comm" "$out/${n}_off.log" ||
            { echo "FAIL: ${n}_off did not run with comm $comm"; fails=$((fails + 1)); }
    done
done
PYTHONPATH="$(dirname "$0")" python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
out = sys.argv[1]
from emu_stats import steady as steady_in
def steady(n, what):  # the last step's count, summed over the two ranks' lines
    return steady_in(out, n, what)
def parts(n, zero):  # non-empty (rank, bucket) parts: the copies expected
    P = json.loads(open(f"{out}/{n}/metrics.jsonl").readline())["memory_bytes"]["params"] // 4
    h, nl, dp = 192, 3, 2
    L = 12 * h * h + 13 * h  # a GPT-2 block: 2 norms, qkv, proj, fc, fc proj
    O = P - nl * L           # the outer tensors, first in the flat buffer
    buckets = [(O + i * L, O + (i + 1) * L) for i in range(nl)] + [(0, O)]
    S = -(-P // dp)
    own = [(r * S, min(P, (r + 1) * S)) for r in range(dp)]
    if zero == 0:
        return dp * len(buckets)
    return sum(1 for lo, hi in buckets for a, b in own if min(hi, b) > max(lo, a))
bad = []
for zero in (0, 1):
    for comm in ("mpi", "nccl"):
        base = f"dp2_z{zero}_{comm}"
        off = base + "_off"
        want = parts(off, zero)
        d2h = steady(off, "d2h") - steady(base, "d2h")
        syncs = steady(off, "syncs") - steady(base, "syncs")
        ok = d2h == want and syncs == 2
        print(f"{'ok  ' if ok else 'FAIL'} ZeRO {zero}, dp 2, {comm}: {d2h} gradient copies "
              f"down a step (ranks summed; {want} parts of buckets), {syncs} host waits more "
              f"than without offload (want 2: one a rank)")
        bad += [] if ok else [(zero, comm)]
        # Which stream each copy ran on and what it waited for (the
        # emulation's per-stream counts): the gradients go down on the
        # copy stream, under NCCL each after its own reduction's event
        # (copy<comm), not after the compute stream; under MPI the result
        # is back on the device through the compute stream, which the copy
        # follows.  The weights go up on the copy stream (ZeRO 0: a part
        # per group, outer + 3 layers; ZeRO 1: the rank's block, before
        # its all-gather), each waited for once by the compute stream
        # (compute<copy), and each after the compute stream's work
        # (copy<compute); nothing more goes up on the compute stream, and
        # the compute stream waits for the reductions no more than without
        # offload.
        ups = 2 * (4 if zero == 0 else 1)
        got = {k: steady(off, k) for k in ("d2h.copy", "h2d.copy", "wait.copy<comm",
                                            "wait.copy<compute", "wait.compute<copy")}
        want_streams = {"d2h.copy": want, "h2d.copy": ups,
                        "wait.copy<comm": want if comm == "nccl" else 0,
                        "wait.copy<compute": ups + (0 if comm == "nccl" else want),
                        "wait.compute<copy": ups}
        same_compute = {k: (steady(base, k), steady(off, k))
                        for k in ("h2d.compute", "wait.compute<comm")}
        ok = got == want_streams and all(a == b for a, b in same_compute.values())
        print(f"{'ok  ' if ok else 'FAIL'} ZeRO {zero}, dp 2, {comm}: streams {got}"
              + ("" if got == want_streams else f" (want {want_streams})")
              + f"; compute stream without -> with offload {same_compute}")
        bad += [] if ok else [(zero, comm, "streams")]
sys.exit(1 if bad else 0)
PY

# ---- dp 2, ZeRO 3, bf16; resume across offload settings -------------------
z3=(--set topology.dp=2 --set topology.zero=3 --set training.precision=bf16
    --set training.steps=3 --set checkpoint.every=2)
RUN_CKPT=1 run z3 2 "${z3[@]}"
TRD_EMU_STATS="$out/z3_off.stats" RUN_CKPT=1 run z3_off 2 "${z3[@]}" "${off[@]}"
same z3 z3_off
run z3_off_from_plain 2 "${z3[@]}" "${off[@]}" --set checkpoint.resume="$out/z3/ckpt/step_00000002"
same z3 z3_off_from_plain 3
run z3_plain_from_off 2 "${z3[@]}" --set checkpoint.resume="$out/z3_off/ckpt/step_00000002"
same z3 z3_plain_from_off 3
grep -q "resumed from .*step_00000002: step 2" "$out/z3_off_from_plain.log" &&
    grep -q "resumed from .*step_00000002: step 2" "$out/z3_plain_from_off.log" ||
    { echo "FAIL: a resume did not start from step 2"; fails=$((fails + 1)); }

# ---- optimizer+params: ZeRO-3's parameter shard in host memory too --------
# 1 rank (ZeRO-3 with dp 1, fp32): the curve and weights of the same run
# without offload, bit for bit (the gathers copy the host's shard up, the
# host runs the CPU backend's AdamW); the device report's params drop to 0
# and rank 0's device peak drops by exactly the no-offload run's params
# and optimizer bytes; the host holds the same 4 x the shard as
# offload: optimizer, as `trident plan` says.  The emulation's counts of a
# steady step (TRD_EMU_STATS) check the copies' wiring: offload: optimizer
# at ZeRO 0 (one_off above; without offload ZeRO 0 and 3 wait once alike)
# waits twice more than without offload, reading the device's decision and
# waiting once for the gradients' copies (this small model's gradient is
# one bucket: one copy), its weights going up without a wait.  ZeRO-3
# sends the gradient down a layer at a time as each reduction is added on
# the last micro-batch (a copy stream): 3 copies (2 layers, the outer
# tensors) in place of ZeRO 0's one bucket, the same one wait for them;
# the gathers' copies up add no wait.
par=(--set topology.offload=optimizer+params)
TRD_EMU_STATS="$out/one_z3.stats" run one_z3 1 --set topology.zero=3
TRD_EMU_STATS="$out/one_z3_par.stats" run one_z3_par 1 --set topology.zero=3 "${par[@]}"
same one_z3 one_z3_par
"$TRIDENT" plan configs/tiny.yaml "${small[@]}" --set topology.zero=3 "${par[@]}" --json \
    > "$out/plan_par.json" 2>&1 ||
    { echo "FAIL: trident plan with optimizer+params"; cat "$out/plan_par.json"; fails=$((fails + 1)); }
python3 - "$out" <<'PY' || fails=$((fails + 1))
import json, re, sys
out = sys.argv[1]
def mem(n):
    rec = json.loads(open(f"{out}/{n}/metrics.jsonl").readline())
    peak = re.search(r"device memory: peak \d+ bytes .*\(rank 0: (\d+) bytes\)",
                     open(f"{out}/{n}.log").read())
    return rec["memory_bytes"], rec.get("host_memory_bytes", {}), int(peak.group(1))
(b, bh, bpeak), (o, oh, opeak) = mem("one_z3"), mem("one_z3_par")
def count(n, what="syncs"):  # the last (steady) step's count
    rows = [l.split("\t") for l in open(f"{out}/{n}.stats") if l.startswith("step\t")]
    return int(rows[-1][rows[-1].index(what) + 1]) if what in rows[-1] else 0
bsync, osync, offsync = count("one_z3"), count("one_z3_par"), count("one_off")
d2h_streamed = count("one_z3_par", "d2h") - count("one_off", "d2h")
plan = json.loads(open(f"{out}/plan_par.json").read().strip().splitlines()[-1])
st = plan["stages"][0]
shard = b["params"]  # one rank: the whole model is its shard
checks = [
    ("no offload: a parameter shard on the device", shard > 0 and not bh),
    ("offloaded: device params and optimizer 0", o["params"] == 0 and o["optimizer"] == 0),
    ("device peak drops by the shard and its optimizer state",
     bpeak - opeak == shard + b["optimizer"]),
    ("host: master, m, v, staging = 4 x the shard", oh.get("optimizer") == 4 * shard),
    ("the other categories unchanged",
     {k: v for k, v in b.items() if k not in ("params", "optimizer")} ==
     {k: v for k, v in o.items() if k not in ("params", "optimizer")}),
    ("offload: optimizer's weights go up without a host wait (no offload + 2)",
     offsync == bsync + 2),
    ("ZeRO-3's gathers add no wait: as many as ZeRO 0's", osync == offsync),
    ("ZeRO-3's gradients go down per layer: 3 copies for ZeRO 0's one bucket",
     d2h_streamed == 2),
    ("offload: optimizer's weights go up on the copy stream, a part per group (outer, 2 layers)",
     count("one_off", "h2d.copy") == 3),
    ("each part waited for once by the compute stream, before its first reader",
     count("one_off", "wait.compute<copy") == 3),
    ("no more copies up on the compute stream than without offload",
     count("one_off", "h2d.compute") == count("one", "h2d.compute")),
    ("optimizer+params: the gathers' copies up on the copy stream, none on the compute stream",
     count("one_z3_par", "h2d.copy") > 0 and
     count("one_z3_par", "h2d.compute") == count("one_z3", "h2d.compute")),
    ("one rank: the compute stream waits for each gather's copy (no all-gather to carry it)",
     count("one_z3_par", "wait.compute<copy") == count("one_z3_par", "h2d.copy")),
    ("trident plan: the same host and device bytes", plan.get("offload") is True and
        st["params"] == 0 and st["optimizer"] == 0 and st["host_optimizer"] == oh.get("optimizer")),
]
bad = [w for w, good in checks if not good]
print(f"{'FAIL' if bad else 'ok  '} optimizer+params memory: device peak {bpeak} -> {opeak} bytes, "
      f"params {b['params']} -> {o['params']} on the device, {oh.get('optimizer')} on the host, "
      f"host syncs a step {bsync} -> {osync} (optimizer: {offsync}), gradient copies down "
      f"+{d2h_streamed}"
      + (f"; wrong: {bad}" if bad else ""))
sys.exit(1 if bad else 0)
PY
# dp 2, ZeRO-3, bf16: the same curve as without offload; resumes across
# the settings (none -> optimizer+params, optimizer+params -> optimizer)
# continue the uninterrupted curve bit for bit.
RUN_CKPT=1 run z3_par 2 "${z3[@]}" "${par[@]}"
same z3 z3_par
run z3_par_from_plain 2 "${z3[@]}" "${par[@]}" --set checkpoint.resume="$out/z3/ckpt/step_00000002"
same z3 z3_par_from_plain 3
run z3_off_from_par 2 "${z3[@]}" "${off[@]}" --set checkpoint.resume="$out/z3_par/ckpt/step_00000002"
same z3 z3_off_from_par 3
# The same under NCCL (the emulation's), against itself without offload.
# Both: bf16's gradients stream down as with offload: optimizer (the
# same copies, d2h.copy; none on the compute stream), each layer's part
# after the step's last gather of that layer, whose copy up ran first on
# the same copy stream; the gathers' copies go up on the copy stream (none
# on the compute stream), and the all-gather reads each after it: under
# NCCL its communicator's stream waits for the copy (comm<copy) and the
# compute stream never does, under MPI (host staging on the compute
# stream) the compute stream waits for each.
# (Without checkpoints, which copy the device's weights down in the last
# step without offload.)
for comm in mpi nccl; do
    TRD_EMU_STATS="$out/z3_$comm.stats" run "z3_$comm" 2 "${z3[@]}" --set topology.comm=$comm
    TRD_EMU_STATS="$out/z3_${comm}_par.stats" run "z3_${comm}_par" 2 "${z3[@]}" "${par[@]}" \
        --set topology.comm=$comm
    same "z3_$comm" "z3_${comm}_par"
done
PYTHONPATH="$(dirname "$0")" python3 - "$out" <<'PY' || fails=$((fails + 1))
import sys
out = sys.argv[1]
from emu_stats import steady as steady_in
def steady(n, what):  # the last step's count, summed over the two ranks' lines
    return steady_in(out, n, what)
bad = []
for comm in ("mpi", "nccl"):
    base, par = f"z3_{comm}", f"z3_{comm}_par"
    ups = steady(par, "h2d.copy")
    checks = [
        ("the gradients stream down as with offload: optimizer",
         steady(par, "d2h.copy") == steady("z3_off", "d2h.copy") > 0),
        ("no gradient copy down on the compute stream",
         steady(par, "d2h.compute") == steady(base, "d2h.compute")),
        ("the gathers' copies up on the copy stream", ups > 0),
        ("no copy up on the compute stream", steady(par, "h2d.compute") == steady(base, "h2d.compute")),
        ("the all-gather follows each copy",
         steady(par, "wait.comm<copy" if comm == "nccl" else "wait.compute<copy") == ups),
        ("under NCCL the compute stream waits for no copy",
         comm != "nccl" or steady(par, "wait.compute<copy") == 0),
    ]
    wrong = [w for w, good in checks if not good]
    print(f"{'FAIL' if wrong else 'ok  '} optimizer+params, dp 2 ZeRO-3 bf16, {comm}: "
          f"{steady(par, 'd2h.copy')} gradient copies down and {ups} copies up on the copy stream a step"
          + (f"; wrong: {wrong}" if wrong else ""))
    bad += wrong
sys.exit(1 if bad else 0)
PY
# A skipped step (lr 1e6: steps 3-5 have a non-finite gradient norm and
# are skipped; max_skipped 4 lets the run end) drops the gradients that
# went down over bf16 optimizer+params's weights: they are written back
# from the master weights, and the curve and final weights equal the same
# run without offload, bit for bit.  One rank decides on the device (the
# optimizer step sees the skip), dp 2 on the host (the trainer drops the
# gradients); 3 layers, so that the next step gathers again from the host.
skip=(--set model.layers=3 --set training.precision=bf16 --set topology.zero=3 --set training.lr=1e6
      --set training.nonfinite=skip --set training.max_skipped=4 --set training.steps=5)
for n in 1 2; do
    run "skip$n" "$n" "${skip[@]}" --set topology.dp=$n
    run "skip${n}_par" "$n" "${skip[@]}" --set topology.dp=$n "${par[@]}"
    same "skip$n" "skip${n}_par"
    [ "$(grep -c "update skipped" "$out/skip${n}_par.log")" = 3 ] ||
        { echo "FAIL: skip${n}_par did not skip 3 steps"; fails=$((fails + 1)); }
done
"$TRIDENT" train configs/tiny.yaml "${small[@]}" "${par[@]}" > "$out/par_zero0.log" 2>&1
rc=$?
grep -q "topology.offload optimizer+params .*set topology.zero: 3" "$out/par_zero0.log" &&
    [ "$rc" -eq 2 ] && echo "ok   optimizer+params without ZeRO-3: exit 2 at the key" ||
    { echo "FAIL: optimizer+params with ZeRO 0 (exit $rc)"; cat "$out/par_zero0.log"; fails=$((fails + 1)); }

echo "offload: $fails failed"
[ "$fails" -eq 0 ]
