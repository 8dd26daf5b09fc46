#!/usr/bin/env bash
# Fuzz every input parser (tests/fuzz, issue 34) for a while and print, per
# harness, the executions, the coverage (edges, features) and what was
# found (crashes, timeouts = hangs, OOMs = allocation storms).  Not in CI:
# CI runs each harness for 3 s (meson test --suite fuzz).
#   bench/fuzz.sh                  every harness for 180 s, 2 at a time
#   bench/fuzz.sh --seconds 600 --parallel 1 config safetensors
# Builds build-fuzz with clang (scripts/install_deps.sh installs it).
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
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) names+=("$1"); shift ;;
    esac
done
CC=clang CXX=clang++ BUILD_DIR=build-fuzz scripts/build.sh -Dwerror=true -Dfuzz=true \
    -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug -Doptimization=1 >/dev/null
[ ${#names[@]} -gt 0 ] || mapfile -t names < <(ls build-fuzz/tests/fuzz/ | sed -n 's/^fuzz_\(.*\)$/\1/p' | grep -v '\.' | sort)
. tests/fuzz/fuzz_opts.sh
# Fork mode: a crash, hang or OOM is counted and saved, and fuzzing goes on.
one() {
    local n=$1 c=.cache/fuzz/$1
    mkdir -p "$c" "$c.artifacts" "$c.tmp"
    local dirs=("$c" "tests/fuzz/seeds/$n")
    [ -d "tests/fuzz/regress/$n" ] && dirs+=("tests/fuzz/regress/$n")
    TMPDIR=$PWD/$c.tmp "build-fuzz/tests/fuzz/fuzz_$n" "${FUZZ_OPTS[@]}" -fork=1 \
        -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -max_total_time="$secs" \
        -artifact_prefix="$c.artifacts/" "${dirs[@]}" >"$c.log" 2>&1 || true
    rm -rf "$c.tmp"
}
running=0
for n in "${names[@]}"; do
    one "$n" &
    running=$((running + 1))
    if [ "$running" -ge "$par" ]; then wait -n; running=$((running - 1)); fi
done
wait
# libFuzzer's fork-mode status line:
#   #EXECS: cov: EDGES ft: FEATURES corp: N exec/s R oom/timeout/crash: O/T/C time: Ss ...
printf '| harness | executions | exec/s | edges (cov) | features (ft) | corpus | crashes | timeouts | OOMs |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
total=0
for n in "${names[@]}"; do
    l=$(grep -E '^#[0-9]+: cov:' ".cache/fuzz/$n.log" | tail -1 || true)
    if [ -z "$l" ]; then
        printf '| %s | (no status line: see .cache/fuzz/%s.log) |||||||\n' "$n" "$n"
        continue
    fi
    read -r ex cov ft corp rate otc <<<"$(sed -E 's/^#([0-9]+): cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+) exec\/s:? ([0-9]+) oom\/timeout\/crash: ([0-9\/]+).*/\1 \2 \3 \4 \5 \6/' <<<"$l")"
    IFS=/ read -r oom to cr <<<"$otc"
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$ex" "$rate" "$cov" "$ft" "$corp" "$cr" "$to" "$oom"
    total=$((total + ex))
done
printf '\n%s executions in all, %s s per harness, %s at a time, on %s cores.\n' "$total" "$secs" "$par" "$(nproc)"
