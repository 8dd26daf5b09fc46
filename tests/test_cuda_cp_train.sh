#!/usr/bin/env bash
# Context parallelism on the device (docs/context_parallel.md): the layouts
# of tests/test_cp_train.sh with backend: cuda, at 1024 tokens a sequence,
# each against the one-rank device run (fp32, per-step loss within 1e-5,
# gradient norm within 1e-4): cp 2 and 4, cp 2 x tp 2 with sequence
# parallelism, cp 2 x pp 2, cp 2 x dp 2 with ZeRO 1 and 3 (GPT-2); Llama
# with GQA and packed documents at cp 4 and cp 2 x tp 2.  The one-rank
# device runs are checked against the CPU's (test_cuda_train.sh's
# tolerance: fp32 sums in another order).  Without a GPU it runs in the
# emulated build (suite emu); a tiny model and 2 steps keep it short there.
. "$(dirname "$0")/e2e.sh"

byte_data

small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=32 --set model.heads=2
       --set model.vocab=257 --set model.seq_len=1024 --set training.steps=2
       --set training.warmup_steps=1 --set training.lr=1e-3 --set training.global_batch=1
       --set training.micro_batch=1 --set data.path="$out/bytes" --set data.val_path=
       --set run.log_every=100 --set backend=cuda)
compare() { curves "$1" "$2" --steps 2 --norm-rtol 1e-4; } # reference, name
TOL=${TRIDENT_CUDA_TOL:-2e-5}
against_cpu() { curves "$1" "$2" --steps 2 --rtol "$TOL" --norm-rtol "$(python3 -c "print(100 * $TOL)")"; }

run gpt2 1
if grep -q "no CUDA device is visible" "$out/gpt2.log"; then
    echo "SKIP: no CUDA device (a -Dcuda=enabled build on a machine without a GPU)"
    exit 77
fi
run gpt2_cpu 1 --set backend=cpu
against_cpu gpt2_cpu gpt2
run gpt2_cp2 2 --set topology.cp=2
compare gpt2 gpt2_cp2
run gpt2_cp4 4 --set topology.cp=4
compare gpt2 gpt2_cp4
run gpt2_cp2_tp2_sp 4 --set topology.cp=2 --set topology.tp=2 --set topology.sequence_parallel=true
compare gpt2 gpt2_cp2_tp2_sp
run gpt2_cp2_pp2 4 --set topology.cp=2 --set topology.pp=2
compare gpt2 gpt2_cp2_pp2

# dp 2 reads two sequences a step: its own one-rank reference
gb2=(--set training.global_batch=2)
run gpt2_gb2 1 "${gb2[@]}"
run gpt2_cp2_dp2_zero1 4 "${gb2[@]}" --set topology.cp=2 --set topology.dp=2 --set topology.zero=1
compare gpt2_gb2 gpt2_cp2_dp2_zero1
run gpt2_cp2_dp2_zero3 4 "${gb2[@]}" --set topology.cp=2 --set topology.dp=2 --set topology.zero=3
compare gpt2_gb2 gpt2_cp2_dp2_zero3

# Llama: GQA (4 query heads, 2 key/value heads: tp 2 splits them) and
# packed documents (byte 256 ends one), whose masks cross the chunks.
llama=(--set model.arch=llama --set model.heads=4 --set model.kv_heads=2
       --set data.document_mask=true --set data.eot=256)
run llama 1 "${llama[@]}"
run llama_cpu 1 "${llama[@]}" --set backend=cpu
against_cpu llama_cpu llama
run llama_cp4 4 "${llama[@]}" --set topology.cp=4
compare llama llama_cp4
run llama_cp2_tp2_sp 4 "${llama[@]}" --set topology.cp=2 --set topology.tp=2 \
    --set topology.sequence_parallel=true
compare llama llama_cp2_tp2_sp

echo "cuda_cp_train: $fails failed"
[ "$fails" -eq 0 ]
