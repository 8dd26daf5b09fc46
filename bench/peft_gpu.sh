#!/usr/bin/env bash
# The `peft` library reads trident's PEFT exports: for a tiny Llama and a
# tiny GPT-2, a plain base trained and saved, LoRA adapters on every linear
# layer trained from it, the base exported as a Hugging Face directory and
# the adapters as a PEFT directory, and `trident generate` run on the LoRA
# checkpoint; bench/peft_check_gpu.py then loads the base with
# transformers, puts the adapters on with PeftModel.from_pretrained and
# compares tokens and logits.  One ok/FAIL line per arch and way of running
# the adapters; exit 1 on a FAIL.  Where peft is not installed the check
# says "peft not installed: skipped" (the trident side still runs).
#
#   TRIDENT=build-cuda/trident bench/peft_gpu.sh WORKDIR              (backend cuda)
#   TRIDENT=build/trident bench/peft_gpu.sh WORKDIR --backend cpu
set -uo pipefail
cd "$(dirname "$0")/.."
: "${TRIDENT:?TRIDENT must point at the built binary}"
[ $# -ge 1 ] || { echo "usage: TRIDENT=BIN bench/peft_gpu.sh WORKDIR [--backend cuda|cpu]" >&2; exit 2; }
work=$1 backend=cuda
shift
while [ $# -gt 0 ]; do
    case "$1" in
        --backend) backend=$2; shift 2 ;;
        *) echo "bench/peft_gpu.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$work"

# peft_arch ARCH: base, LoRA, exports and generate in $work/ARCH, then the check.
peft_arch() {
    local arch=$1 d=$work/$1 targets=qkv,proj,fc,fcproj
    local small=(--set backend="$backend" --set model.arch="$arch" --set model.layers=2
                 --set model.hidden=64 --set model.heads=4 --set model.seq_len=64
                 --set training.global_batch=4 --set training.micro_batch=4
                 --set training.warmup_steps=0 --set training.lr=1e-2 --set data.val_every=0)
    [ "$arch" = llama ] && small+=(--set model.kv_heads=2) && targets=qkv,proj,fc,up,fcproj
    rm -rf "$d"
    mkdir -p "$d"
    if "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set training.steps=5 \
            --set run.dir="$d/base" --set checkpoint.dir="$d/base/ckpt" > "$d/log" 2>&1 &&
        "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set training.steps=10 \
            --set model.lora.rank=4 --set model.lora.alpha=8 --set model.lora.targets=$targets \
            --set model.lora.base="$d/base/ckpt" --set run.dir="$d/lora" \
            --set checkpoint.dir="$d/lora/ckpt" >> "$d/log" 2>&1 &&
        "$TRIDENT" ckpt export --format hf --out "$d/base.hf" "$d/base/ckpt" >> "$d/log" 2>&1 &&
        "$TRIDENT" ckpt export --format peft --out "$d/peft" "$d/lora/ckpt" >> "$d/log" 2>&1 &&
        "$TRIDENT" generate "$d/lora/ckpt" --prompt "The jury said that" --max-new-tokens 16 \
            --greedy --ids --backend "$backend" --dump-logits "$d/logits" > "$d/ids" 2>> "$d/log"
    then
        echo "$arch: trained, exported and generated ($backend) in $d"
        python3 bench/peft_check_gpu.py "$d/base.hf" "$d/peft" "$d/ids" "$d/logits"
    else
        echo "FAIL $arch: $(tail -3 "$d/log")"
        return 1
    fi
}

rc=0
for arch in llama gpt2; do
    peft_arch $arch || rc=1
done
exit $rc
