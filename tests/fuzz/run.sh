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
if ! "$bin" "${FUZZ_OPTS[@]}" -runs=0 "${dirs[@]}" >"$tmp/replay.log" 2>&1; then
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
echo "ok: $name: $n seed and regression inputs; $(grep -o 'Done [0-9]* runs' "$tmp/fuzz.log" | head -1) of fuzzing"
