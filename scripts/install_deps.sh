#!/usr/bin/env bash
# Install the Debian 12 packages trident needs, only those missing.
# Runs as root, or through sudo when it is there.
set -euo pipefail
pkgs=(build-essential pkg-config meson ninja-build libyaml-dev mpich libmpich-dev
      libhdf5-mpich-dev libopenblas-dev libcjson-dev ca-certificates
      slurm-wlm munge    # the local test cluster of slurm/cluster (tests/test_slurm_*.sh)
      zlib1g-dev libzstd-dev zstd gzip  # prepare-data's .gz and .zst inputs; zstd and gzip for docs/data.md
      libsentencepiece-dev sentencepiece  # SentencePiece models (src/data/spm_shim.cc); spm_train/spm_encode for tests/test_spm.sh
      python3-h5py hdf5-tools   # the docs' h5py snippet and h5dump (docs/checkpoint.md)
      libprotobuf-c-dev protobuf-c-compiler  # TensorBoard event files (src/train/tensorboard.c)
      chromium python3-pil      # tests/test_tensorboard.sh renders the report
      clang-format              # scripts/check_format.sh: the C style (.clang-format)
      clang libclang-rt-14-dev libomp-dev)  # tests/fuzz: libFuzzer (-fsanitize=fuzzer), OpenMP under clang
# Tools that may come from elsewhere than Debian (a nodesource node, say):
# a working command is enough, and installing Debian's package beside it
# can conflict.
tools=(node:nodejs npm:npm python3:python3 git:git)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
for t in "${tools[@]}"; do
    command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install_deps: all packages present"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
