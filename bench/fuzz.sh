#!/usr/bin/env bash
# Fuzz every input parser (tests/fuzz, issue 34) for a while and print, per
# harness, the executions, the coverage (edges, features) and what was
# found (crashes, timeouts = hangs, OOMs = allocation storms).  Not in CI:
# CI runs each harness for 3 s (meson test --suite fuzz).
#   bench/fuzz.sh                  every harness for 180 s, 2 at a time
#   bench/fuzz.sh --seconds 600 --parallel 1 config safetensors
# Builds build-fuzz with clang (scripts/install_deps.sh installs it).
# Leak detection is off here for speed (ASAN_OPTIONS to override); the CI
# runs keep it on.
# The corpus grows in .cache/fuzz/NAME (kept between runs, not in git);
# what it finds lands in .cache/fuzz/NAME.artifacts: make a regression
# input of it (tests/fuzz/regress/NAME/) and fix the parser.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=180 par=2 names=()
while [ $# -gt 0 ]; do
    case $1 in
    --seconds) secs=$2; shift 2 ;;
    --parallel) par=$2; shift 2 ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) names+=("$1"); shift ;;
    esac
done
CC=clang CXX=clang++ BUILD_DIR=build-fuzz scripts/build.sh -Dwerror=true -Dfuzz=true \
    -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug -Doptimization=1 >/dev/null
[ ${#names[@]} -gt 0 ] || mapfile -t names < <(ls build-fuzz/tests/fuzz/ | sed -n 's/^fuzz_\(.*\)$/\1/p' | grep -v '\.' | sort)
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=0}
. tests/fuzz/fuzz_opts.sh
# One harness for $secs: libFuzzer stops at the first crash, hang or OOM,
# so it is started again (the input saved under .artifacts, the corpus
# kept) until the time is spent; each start's final stats are summed.
# Scratch files on /dev/shm (a disk's open/close costs 5x the parse here).
one() {
    local n=$1 c=.cache/fuzz/$1 end=$((SECONDS + secs)) left
    mkdir -p "$c" "$c.artifacts"
    local dirs=("$c" "tests/fuzz/seeds/$n")
    [ -d "tests/fuzz/regress/$n" ] && dirs+=("tests/fuzz/regress/$n")
    local tmp
    tmp=$(mktemp -d "$(test -w /dev/shm && echo /dev/shm || echo /tmp)/fuzz-$n.XXXXXX")
    : >"$c.log"
    while left=$((end - SECONDS)) && [ "$left" -gt 0 ]; do
        TMPDIR=$tmp "build-fuzz/tests/fuzz/fuzz_$n" "${FUZZ_OPTS[@]}" -max_total_time="$left" \
            -artifact_prefix="$c.artifacts/" "${dirs[@]}" >>"$c.log" 2>&1 || true
    done
    rm -rf "$tmp"
}
running=0
for n in "${names[@]}"; do
    one "$n" &
    running=$((running + 1))
    if [ "$running" -ge "$par" ]; then wait -n; running=$((running - 1)); fi
done
wait
# Per harness: executions summed over the starts (final stats), edges and
# features of the last status line ("#N ... cov: E ft: F corp: C/..."),
# and the inputs saved: crash-*, timeout-* (hangs), oom-* and leak-*.
printf '| harness | executions | edges (cov) | features (ft) | corpus | crashes | timeouts | OOMs | leaks |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
total=0
for n in "${names[@]}"; do
    c=.cache/fuzz/$n
    ex=$(awk '/^stat::number_of_executed_units:/ { s += $2 } END { print s + 0 }' "$c.log")
    read -r cov ft corp <<<"$(grep -E '^#[0-9]+.*cov: ' "$c.log" | tail -1 |
        sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+).*/\1 \2 \3/')"
    k() { find "$c.artifacts" -name "$1-*" | wc -l; }
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$ex" "${cov:-?}" "${ft:-?}" \
        "${corp:-?}" "$(k crash)" "$(k timeout)" "$(k oom)" "$(k leak)"
    total=$((total + ex))
done
printf '\n%s executions in all, %s s per harness, %s at a time, on %s cores.\n' "$total" "$secs" "$par" "$(nproc)"
