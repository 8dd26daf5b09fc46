#!/usr/bin/env bash
# The test command: install what is missing, build (warnings are errors),
# fetch the corpus and the reference tokenizer, run every test, then the
# unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer,
# every input parser's fuzz harness for a few seconds (tests/fuzz),
# (with a CUDA toolkit) build the CUDA backend and run two tests with it, and
# build the CUDA backend on the CPU emulation of the CUDA runtime and run the
# CUDA ops and training tests there (suite emu; no GPU needed).
# Ends with one line "N passed, N failed"; exit status 0 only if none failed.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh || exit 1
BUILD_DIR=build scripts/build.sh -Dwerror=true || exit 1
BUILD_DIR=build-sanitize scripts/build.sh -Dwerror=true -Dbuildtype=debug -Doptimization=1 \
    -Db_sanitize=address,undefined -Db_lundef=false || exit 1
TRIDENT=build/trident scripts/get_corpus.sh || exit 1

passed=0 failed=0
count() { # meson test log dir
    local json=$1/meson-logs/testlog.json p f
    p=$(grep -c '"result": "OK"' "$json" 2>/dev/null || true)
    f=$(grep -c '"result": "\(FAIL\|TIMEOUT\|ERROR\|UNEXPECTEDPASS\)"' "$json" 2>/dev/null || true)
    s=$(grep -c '"result": "SKIP"' "$json" 2>/dev/null || true)
    passed=$((passed + p)); failed=$((failed + f + s))  # a skipped test is not a pass
}
meson test -C build --print-errorlogs --num-processes 1
count build
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    meson test -C build-sanitize --suite unit --no-suite mpi --print-errorlogs --num-processes 1
count build-sanitize
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    meson test -C build-sanitize --suite mpi --print-errorlogs --num-processes 1
count build-sanitize

# Every input parser under libFuzzer (tests/fuzz, issue 34; clang, ASan and
# UBSan): each harness over its seeds and regression inputs, then 3 s of
# fuzzing (suite fuzz; bench/fuzz.sh fuzzes for minutes).
if CC=clang CXX=clang++ BUILD_DIR=build-fuzz scripts/build.sh -Dwerror=true -Dfuzz=true \
    -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug -Doptimization=1; then
    meson test -C build-fuzz --suite fuzz --print-errorlogs --num-processes 1
    count build-fuzz
else
    echo "FAIL: the fuzz build (build-fuzz, -Dfuzz=true)"; failed=$((failed + 1))
fi

# With a CUDA toolkit: the CUDA backend must compile and link (issue 8), and
# the binary with it must still run everything on the CPU where there is no
# GPU.  The 'gpu' suite needs a device and is run by hand on a GPU machine
# (docs/cuda.md).
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    if BUILD_DIR=build-cuda scripts/build.sh -Dwerror=true -Dcuda=enabled; then
        meson test -C build-cuda --no-suite gpu --print-errorlogs --num-processes 1 ops cli
        count build-cuda
    else
        echo "FAIL: the CUDA build (build-cuda, -Dcuda=enabled)"; failed=$((failed + 1))
    fi
else
    echo "no CUDA toolkit (nvcc): the CUDA build is not checked here"
fi

# The CUDA backend on the CPU emulation of the CUDA runtime (kernels/emu,
# docs/cuda.md): g++ and python3 only, so it runs everywhere.  Suite 'emu':
# the kernels against the CPU reference, and device memory that host code
# cannot touch (tests/test_cuda_emu.c).
if BUILD_DIR=build-emu scripts/build.sh -Dwerror=true -Demulate_cuda=true; then
    meson test -C build-emu --suite emu --print-errorlogs --num-processes 1
    count build-emu
else
    echo "FAIL: the emulated CUDA build (build-emu, -Demulate_cuda=true)"; failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
