#!/usr/bin/env bash
# CPU backend throughput against this machine's SGEMM peak (issue: foundation).
#   bench/cpu.sh                 GPT-2 124M shapes, batch 4, seq 64
#   bench/cpu.sh --steps 10      more steps
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
exec build/bench/bench_cpu "$@"
