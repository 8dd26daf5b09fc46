#!/usr/bin/env bash
# Run tests/test_cuda_ops.c with the kernels of kernels/*.cu executed on the
# CPU (the emulated runtime of kernels/emu), under AddressSanitizer and
# UndefinedBehaviorSanitizer: checks indexing, block reductions, launch
# shapes and the cuBLAS argument conventions without a GPU.  It does not
# check GPU behaviour (timing, memory model, the device math library, nvcc
# code generation): only a run of `meson test --suite gpu` on a GPU does.
# Needs g++, python3 and the CPU build dependencies; about 3 minutes on 2 cores.
# Usage: kernels/emu/run.sh [WORK_DIR]   (default: a temporary directory)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$(mktemp -d)}
mkdir -p "$work"
emu=$root/kernels/emu
san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
# -ffp-contract=fast: fused multiply-adds where the compiler finds them, as nvcc does
cxx=(g++ -std=c++20 -O1 -g -march=native -ffp-contract=fast "${san[@]}"
     -I"$emu" -I"$root/src" -I"$root/kernels")
cc=(gcc -std=c17 -O1 -g -D_GNU_SOURCE -fopenmp "${san[@]}" -I"$root/src" -I"$root/tests")
objs=()
for cu in "$root"/kernels/*.cu; do
    name=$(basename "$cu" .cu)
    python3 "$emu/launch.py" "$cu" "$work/$name.cpp"
    "${cxx[@]}" -c "$work/$name.cpp" -o "$work/$name.o"
    objs+=("$work/$name.o")
done
"${cxx[@]}" -c "$emu/emu.cpp" -o "$work/emu.o"
# the CPU reference and trd_fatal, compiled here (a build dir may hold the
# real CUDA objects under the same names)
for c in backend/cpu.c core/error.c; do
    "${cc[@]}" $(pkg-config --cflags mpich) -c "$root/src/$c" -o "$work/$(basename "$c" .c).o"
done
"${cc[@]}" -c "$root/tests/test_cuda_ops.c" -o "$work/test_cuda_ops.o"
g++ "${san[@]}" -fopenmp -o "$work/test_cuda_ops_emu" "$work/test_cuda_ops.o" "${objs[@]}" \
    "$work/emu.o" "$work/cpu.o" "$work/error.o" \
    $(pkg-config --libs mpich openblas) -lm
# ASan warns once that it does not fully support swapcontext: expected
ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=2 "$work/test_cuda_ops_emu"
