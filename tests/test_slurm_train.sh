#!/usr/bin/env bash
# trident under Slurm: `sbatch --wait` of slurm/train_cpu.sbatch on the local
# two-node cluster (slurm/cluster), 2 nodes x 4 tasks, tp 2 x pp 2 x dp 2,
# submitted from another directory than the repository.  The rank map in the
# job's log (named after the run) names the nodes: every TP group on one
# node, the two pipeline stages on different nodes; the loss of every step
# equals the same config under mpiexec (relative 1e-5, invariant 1).  Then
# slurm/prepare.sbatch on 2 nodes x 2 tasks makes data/brown/gpt2 again,
# byte for byte.
. "$(dirname "$0")/e2e.sh"
. "$TRIDENT_SOURCE_ROOT/slurm/cluster/testing.sh"
slurm_test_cluster train 17820
root=$TRIDENT_SOURCE_ROOT

# checkpoint.dir stays auto (<run.dir>/ckpt): a job that Slurm requeues
# (a node marked failed under load) resumes instead of being refused for
# the metrics its first attempt left, and a resume is bit-exact.
small=(--set model.layers=4 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=10 --set training.warmup_steps=2 --set training.lr=1e-3
       --set training.global_batch=8 --set training.micro_batch=1 --set data.val_every=5
       --set data.val_sequences=2 --set run.log_every=1)
mesh=(--set topology.tp=2 --set topology.pp=2 --set topology.dp=2)

run ref 8 "${mesh[@]}"

# From a directory of its own: the template must not depend on the cwd.
mkdir -p "$out/submit"
cd "$out/submit" || exit 1
TRIDENT=$TRIDENT TRIDENT_LOG_DIR="$out/logs" timeout 600 sbatch --wait -N 2 --ntasks-per-node 4 \
    "$root/slurm/train_cpu.sbatch" "$root/configs/tiny.yaml" "${small[@]}" "${mesh[@]}" \
    --set run.name=slurm3d --set run.dir="$out/slurm3d" --set data.path="$root/data/brown/gpt2" \
    --set data.val_path="$root/data/brown/gpt2_val" > "$out/sbatch.txt" 2>&1
rc=$?
cd "$root" || exit 1
job=$(grep -o '[0-9]\+' "$out/sbatch.txt" | head -1)
log="$out/logs/slurm3d-$job.log"
if [ "$rc" -ne 0 ] || [ ! -f "$log" ]; then
    echo "FAIL: sbatch --wait exited $rc (job ${job:-?}); log $log:"
    cat "$out/sbatch.txt"; tail -30 "$log" 2>/dev/null; ls "$out/logs" 2>/dev/null
    exit 1
fi
echo "ok   sbatch --wait: job $job completed, log named after the run: $(basename "$log")"

python3 - "$log" "$out" <<'PY' || fails=$((fails + 1))
import json, re, sys
log, out = sys.argv[1], sys.argv[2]
text = open(log).read()
bad = []
# The per-rank table: rank node host local tp dp pp tp-group dp-group pp-group.
rows = {}
for line in text.splitlines():
    f = line.split()
    if len(f) == 10 and f[0].isdigit() and re.fullmatch(r"node\d+", f[2]):
        rows[int(f[0])] = {"host": f[2], "node": int(f[1]), "pp": int(f[6]),
                           "tp_group": [int(x) for x in f[7].split(",")]}
if sorted(rows) != list(range(8)):
    bad.append(f"rank table with host names: ranks {sorted(rows)}")
else:
    hosts = {r["host"] for r in rows.values()}
    if hosts != {"node1", "node2"}:
        bad.append(f"hosts {hosts}, want node1 and node2")
    for r, row in rows.items():
        if len({rows[m]["host"] for m in row["tp_group"]}) != 1:
            bad.append(f"TP group {row['tp_group']} of rank {r} spans nodes")
    stage_hosts = [{row["host"] for row in rows.values() if row["pp"] == s} for s in (0, 1)]
    if stage_hosts[0] & stage_hosts[1] or any(len(h) != 1 for h in stage_hosts):
        bad.append(f"stage hosts {stage_hosts}: want one node each, different")
for want in ("nodes: 0 node1 (ranks 0-3), 1 node2 (ranks 4-7)",
             "placement: nodes from Slurm", "TP groups inside one node: yes",
             "pipeline stages: stage 0 on node 0; stage 1 on node 1"):
    if want not in text:
        bad.append(f"log lacks '{want}'")
def rows_of(d): return [json.loads(l) for l in open(f"{out}/{d}/metrics.jsonl")]
r, g = rows_of("ref"), rows_of("slurm3d")
if len(r) != 10 or len(g) != 10:
    bad.append(f"steps: mpiexec {len(r)}, sbatch {len(g)}")
else:
    rel = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(g, r))
    exact = all(a["loss"] == b["loss"] for a, b in zip(g, r))
    vr = [x["val_loss"] for x in r if "val_loss" in x]
    vg = [x["val_loss"] for x in g if "val_loss" in x]
    vrel = max(abs(a - b) / abs(b) for a, b in zip(vg, vr)) if len(vg) == len(vr) == 2 else 1.0
    print(f"{'ok  ' if rel <= 1e-5 and vrel <= 1e-5 else 'FAIL'} sbatch vs mpiexec: loss max rel "
          f"diff {rel:.2e} ({'bit-identical' if exact else 'not bit-identical'}), val {vrel:.2e}")
    if rel > 1e-5 or vrel > 1e-5:
        bad.append("loss curve differs from mpiexec")
for b in bad:
    print("FAIL:", b)
if not bad:
    print("ok   rank map: TP groups inside node1/node2, stage 0 and stage 1 on different nodes")
sys.exit(1 if bad else 0)
PY

# slurm/prepare.sbatch: prepare-data on 2 nodes x 2 tasks (srun, PMI-2),
# from the same other directory: the dataset scripts/get_corpus.sh made with
# one process, byte for byte (docs/data.md, "Several processes").
cd "$out/submit" || exit 1
TRIDENT=$TRIDENT timeout 300 sbatch --wait -N 2 --ntasks-per-node 2 --output="$out/prepare-%j.out" \
    "$root/slurm/prepare.sbatch" --input "$root/data/brown/txt" --tokenizer gpt2 --val-every 20 \
    --out "$out/brown/gpt2" > "$out/sbatch_prepare.txt" 2>&1
rc=$?
cd "$root" || exit 1
if [ "$rc" -eq 0 ] && grep -q "^  4 ranks (MPI)" "$out"/prepare-*.out &&
    cmp -s "$out/brown/gpt2.bin" data/brown/gpt2.bin && cmp -s "$out/brown/gpt2.idx" data/brown/gpt2.idx &&
    cmp -s "$out/brown/gpt2_val.bin" data/brown/gpt2_val.bin && cmp -s "$out/brown/gpt2_val.idx" data/brown/gpt2_val.idx; then
    echo "ok   slurm/prepare.sbatch on 2 nodes x 2 tasks: data/brown/gpt2{,_val}, byte for byte"
else
    echo "FAIL: slurm/prepare.sbatch exited $rc or made another dataset:"
    cat "$out/sbatch_prepare.txt" "$out"/prepare-*.out 2>/dev/null | tail -20
    fails=$((fails + 1))
fi

echo "slurm_train: $fails failed"
[ "$fails" -eq 0 ]
