#!/usr/bin/env bash
# run.sh NAME HARNESS — the CI test of one fuzz harness (meson suite 'fuzz'):
# every committed seed (seeds/NAME) and regression input (regress/NAME, one
# per crasher found, fixed at its root) must pass, then FUZZ_SECONDS
# (default 3) of fuzzing from them must find nothing.  Options and their
# meaning: fuzz_opts.sh.
set -uo pipefail
name=$1 bin=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/fuzz_opts.sh"
dirs=()
for d in "$here/seeds/$name" "$here/regress/$name"; do
    [ -d "$d" ] && dirs+=("$d")
done
[ ${#dirs[@]} -gt 0 ] || { echo "FAIL: no seeds for $name ($here/seeds/$name)"; exit 1; }
# Scratch files on /dev/shm where there is one: a disk's open and close
# cost five times the parse.
tmp=$(mktemp -d "$(test -w /dev/shm && echo /dev/shm || echo /tmp)/fuzz-$name.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/corpus" "$tmp/scratch"
export TMPDIR=$tmp/scratch
n=$(find "${dirs[@]}" -type f | wc -l)
if ! "$bin" "${FUZZ_OPTS[@]}" -runs=0 -artifact_prefix="$tmp/" "${dirs[@]}" >"$tmp/replay.log" 2>&1; then
    tail -40 "$tmp/replay.log"
    echo "FAIL: $name: a seed or regression input crashes ($n inputs)"
    exit 1
fi
if ! "$bin" "${FUZZ_OPTS[@]}" -max_total_time="${FUZZ_SECONDS:-3}" -artifact_prefix="$tmp/" \
    "$tmp/corpus" "${dirs[@]}" >"$tmp/fuzz.log" 2>&1; then
    tail -40 "$tmp/fuzz.log"
    for a in "$tmp"/crash-* "$tmp"/timeout-* "$tmp"/oom-* "$tmp"/leak-*; do
        [ -f "$a" ] && { echo "input ($a):"; od -c "$a" | head -20; }
    done
    echo "FAIL: $name: ${FUZZ_SECONDS:-3} s of fuzzing found a crash, hang or allocation storm"
    exit 1
fi
# The exit contract through the program for the config regressions (YAML,
# NUL, --set lines): `trident plan` (validation, then the plan that builds
# the parameter table) must plan (exit 0) or refuse (exit 2, one error
# line), never exit 1 or die of a signal, allocating no single block over
# 256 MiB (ASan's allocator returns NULL above it).
if [ "$name" = config ] && [ -d "$here/regress/config" ] && [ -n "${TRIDENT:-}" ]; then
    for r in "$here/regress/config"/*; do
        mapfile -t sets < <(python3 -c '
import sys
d = open(sys.argv[1], "rb").read().split(b"\0", 1)
open(sys.argv[2], "wb").write(d[0])
for s in (d[1].decode(errors="replace").splitlines() if len(d) > 1 else []):
    if s: print("--set=" + s)' "$r" "$tmp/regress.yaml")
        rc=0
        ASAN_OPTIONS=max_allocation_size_mb=256:allocator_may_return_null=1:detect_leaks=0 \
            timeout 60 "$TRIDENT" plan "$tmp/regress.yaml" "${sets[@]}" >/dev/null 2>"$tmp/cli.err" || rc=$?
        errors=$(grep -c '^trident: error:' "$tmp/cli.err")
        if ! { [ "$rc" -eq 0 ] && [ "$errors" -eq 0 ]; } && ! { [ "$rc" -eq 2 ] && [ "$errors" -eq 1 ]; }; then
            cat "$tmp/cli.err"
            echo "FAIL: $name: trident plan on $(basename "$r") exited $rc with $errors error lines (want 0 and none, or 2 and one)"
            exit 1
        fi
    done
fi
echo "ok: $name: $n seed and regression inputs; $(grep -o 'Done [0-9]* runs' "$tmp/fuzz.log" | head -1) of fuzzing"
