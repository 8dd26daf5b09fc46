#!/usr/bin/env bash
# The main job: install what is missing, build, fetch and prepare the Brown
# Corpus, and train configs/tiny.yaml on the CPU (a few minutes on 2 cores).
# Extra arguments go to `trident train`, e.g. --set training.steps=50.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
TRIDENT=build/trident scripts/get_corpus.sh
exec build/trident train configs/tiny.yaml "$@"
