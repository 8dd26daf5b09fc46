#!/usr/bin/env bash
# Configure and build trident into BUILD_DIR (default build/).
# Extra arguments are Meson options, e.g. -Dwerror=true or
# -Db_sanitize=address,undefined: they are given to `meson setup` for a new
# build directory and to `meson configure` for an existing one, so they
# always apply.  Prints its progress; the compiler's output is in
# BUILD_DIR.ninja.log.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
if [ ! -f "$dir/build.ninja" ]; then
    echo "build: configuring $dir${*:+ ($*)}"
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log" >&2; exit 1; }
elif [ $# -gt 0 ]; then
    meson configure "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log" >&2; exit 1; }
fi
# ninja's [done/total] lines, shown every tenth of the way (the first build
# takes a minute or two on 2 cores).
# (set +e around it: with -e and pipefail a failed build would end the
# script here, before the compiler's messages are shown.)
set +e
ninja -C "$dir" 2>&1 | tee "$dir.ninja.log" | awk -v dir="$dir" '
    match($0, /^\[[0-9]+\/[0-9]+\]/) {
        split(substr($0, 2, RLENGTH - 2), f, "/")
        p = int(10 * f[1] / f[2])
        if (p > shown) { shown = p; printf "build: %s %d%% (%d of %d steps)\n", dir, 10 * p, f[1], f[2]; fflush() }
    }'
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] || { echo "build: $dir failed:" >&2; tail -50 "$dir.ninja.log" >&2; exit 1; }
echo "build: $dir/trident"
