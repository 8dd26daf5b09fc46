#!/usr/bin/env bash
# The emulated CUDA build (-Demulate_cuda=true) under AddressSanitizer and
# UndefinedBehaviorSanitizer, then its test suite 'emu': the kernels of
# kernels/*.cu run on the CPU against the CPU reference (cuda_ops_emu), the
# emulation's strict device memory (cuda_emu), and whatever else the suite
# holds.  CI (scripts/test.sh) runs the same suite without sanitizers in
# build-emu; this adds ASan's byte-exact bounds on device buffers and UBSan.
# It does not check GPU behaviour (timing, memory model, the device math
# library, nvcc code generation): only `meson test --suite gpu` on a GPU does.
# Needs g++, python3 and the CPU build dependencies; cuda_ops_emu alone takes
# about 3.5 minutes on 2 cores.
# Usage: kernels/emu/run.sh [MESON_TEST_ARGS...]   e.g. kernels/emu/run.sh cuda_emu
# The build directory is $BUILD_DIR (default build-emu-sanitize, configured
# once and rebuilt as needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${BUILD_DIR:-build-emu-sanitize}
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dwerror=true -Demulate_cuda=true -Dbuildtype=debug -Doptimization=1 \
        -Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C "$dir"
# ASan warns once that it does not fully support swapcontext (the fibers of
# a thread block): expected.  No leak check: the suite may start MPI ranks,
# whose start-up allocations are never freed.  handle_segv stays on: the
# emulation's SIGSEGV handler passes any fault outside device memory on to
# ASan's.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
meson test -C "$dir" --suite emu --print-errorlogs --num-processes 1 "$@"
