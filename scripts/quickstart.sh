#!/usr/bin/env bash
# The main job: install what is missing, build, fetch and prepare the Brown
# Corpus, and train configs/tiny.yaml on the CPU (a few minutes on 2 cores).
# Extra arguments go to `trident train`, e.g. --set training.steps=50.
#
# The run writes runs/tiny/ and checkpoints every 100 steps; stop it any
# time (Ctrl-C saves a checkpoint first) and run this again to resume.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "quickstart: 1/4 Debian packages"
scripts/install_deps.sh
echo "quickstart: 2/4 building trident"
scripts/build.sh
echo "quickstart: 3/4 the Brown Corpus and the GPT-2 vocabulary"
TRIDENT=build/trident scripts/get_corpus.sh
# A run stopped before its first checkpoint cannot be resumed, and trident
# refuses to overwrite its metrics: keep them beside, under a new name.
if [ -s runs/tiny/metrics.jsonl ] && ! compgen -G 'runs/tiny/ckpt/step_[0-9]*[0-9]' >/dev/null; then
    n=1
    while [ -e "runs/tiny.$n" ]; do n=$((n + 1)); done
    mv runs/tiny "runs/tiny.$n"
    echo "quickstart: the earlier run in runs/tiny saved no checkpoint; moved it to runs/tiny.$n"
fi
echo "quickstart: 4/4 training configs/tiny.yaml (metrics in runs/tiny/metrics.jsonl)"
exec build/trident train configs/tiny.yaml "$@"
