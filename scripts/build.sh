#!/usr/bin/env bash
# Configure (once) and build trident into BUILD_DIR (default build/).
# Extra arguments go to `meson setup`, e.g. -Db_sanitize=address,undefined.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log" >&2; exit 1; }
fi
ninja -C "$dir" >"$dir.ninja.log" 2>&1 || { tail -50 "$dir.ninja.log" >&2; exit 1; }
echo "build: $dir/trident"
