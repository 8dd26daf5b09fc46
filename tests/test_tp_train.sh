#!/usr/bin/env bash
# Tensor parallelism in training against the single-rank run (docs/design.md,
# invariant 1): tp 2 and 4, with and without sequence parallelism, GPT-2 and
# Llama-style (grouped-query attention, kv heads split and replicated), and
# tp 2 x dp 2 with ZeRO 1 and 3: per-step loss within relative 1e-5 for 10
# steps.  The vocabulary, 50257, divides by neither 2 nor 4 (padded).
. "$(dirname "$0")/e2e.sh"

small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=10 --set training.warmup_steps=2 --set training.lr=1e-3
       --set training.global_batch=8 --set training.micro_batch=2 --set data.val_every=0
       --set data.val_sequences=2 --set run.log_every=100)


compare() { curves "$1" "$2" --steps 10 --norm-rtol 1e-4; } # reference, name

gpt2=()
llama=(--set model.arch=llama --set model.kv_heads=2)
mqa=(--set model.arch=llama --set model.kv_heads=1)
run gpt2 1 "${gpt2[@]}"
run llama 1 "${llama[@]}"
run mqa 1 "${mqa[@]}"
for tp in 2 4; do
    for sp in false true; do
        run "gpt2_tp${tp}_sp$sp" "$tp" --set topology.tp="$tp" --set topology.sequence_parallel="$sp"
        compare gpt2 "gpt2_tp${tp}_sp$sp"
        # kv heads 2: split over tp 2, replicated over tp 4
        run "llama_tp${tp}_sp$sp" "$tp" "${llama[@]}" --set topology.tp="$tp" \
            --set topology.sequence_parallel="$sp"
        compare llama "llama_tp${tp}_sp$sp"
    done
done
run mqa_tp4 4 "${mqa[@]}" --set topology.tp=4
compare mqa mqa_tp4
for z in 1 3; do
    run "gpt2_tp2_dp2_zero$z" 4 --set topology.tp=2 --set topology.dp=2 --set topology.zero="$z"
    compare gpt2 "gpt2_tp2_dp2_zero$z"
    run "llama_tp2_dp2_zero${z}_sp" 4 "${llama[@]}" --set topology.tp=2 --set topology.dp=2 \
        --set topology.zero="$z" --set topology.sequence_parallel=true
    compare llama "llama_tp2_dp2_zero${z}_sp"
done
# The rank map of the run says TP groups are inside a node.
grep -q "TP groups inside one node: yes" "$out/gpt2_tp2_dp2_zero1.log" \
    || { echo "FAIL: rank map missing from the log"; fails=$((fails + 1)); }

echo "tp_train: $fails failed"
[ "$fails" -eq 0 ]
