#!/usr/bin/env bash
# CPU backend throughput against this machine's SGEMM rate and copy
# bandwidth, with the time of one step per op, at 1 thread and at all
# threads (OMP_NUM_THREADS, else every core), then PyTorch on the same
# shapes and thread counts (Debian's python3-torch, installed on demand).
#   bench/cpu.sh                      GPT-2 124M shapes, batch 4, seq 64, 3 rounds
#   bench/cpu.sh --rounds 5 --steps 2 more rounds, more steps a round
#   TRIDENT_BENCH_TORCH=0 bench/cpu.sh   without PyTorch
#   OMP_WAIT_POLICY=active bench/cpu.sh  OpenMP's default waiting (see below)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
threads=${OMP_NUM_THREADS:-$(nproc)}
# Threads that wait at the end of a parallel region sleep rather than spin:
# on a machine whose cores other work shares, a spinning thread holds the
# core its descheduled partner needs, and every one of a step's few hundred
# parallel regions then lasts a time slice (measured minutes apart on a
# loaded machine: ratio 0.44 active, 0.79 passive at 2 threads; on an idle
# one passive costs about 2%).  OpenMP reads it at process start only.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "load average $(cut -d' ' -f1 /proc/loadavg); OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
OMP_NUM_THREADS=$threads build/bench/bench_cpu --threads "$threads" "$@"
[ "${TRIDENT_BENCH_TORCH:-1}" = 0 ] && exit 0
# Debian's torch, for Debian's python (a pyenv python3 may come first on PATH).
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "cpu.sh: installing python3-torch for the PyTorch comparison"
    apt-get install -y python3-torch >/dev/null 2>&1 ||
        { echo "cpu.sh: python3-torch could not be installed; no PyTorch comparison"; exit 0; }
fi
echo
OMP_NUM_THREADS=$threads "$py" bench/torch_gpt2.py --threads "$threads"
