#!/usr/bin/env bash
# Generation speed (trident generate's key/value-cache decoding, batch 1, the
# CPU backend) against this machine's memory-bandwidth limit measured in the
# same run.
#   bench/decode.sh                   GPT-2 124M, 128 new tokens, 3 rounds
#   bench/decode.sh --tokens 256      more tokens (a longer cache)
#   bench/decode.sh --ops             then the time of each op of a token
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
exec build/bench/bench_decode "$@"
