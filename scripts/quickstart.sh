#!/usr/bin/env bash
# The main job: install what is missing, build, fetch and prepare the Brown
# Corpus, and train configs/tiny.yaml on the CPU (a few minutes on 2 cores).
# Extra arguments go to `trident train`, e.g. --set training.steps=50.
#
# The run writes runs/tiny/ (or the --set run.dir given) and checkpoints every 100 steps; stop it any
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
# The run's directories are the config's unless the arguments set them.
run_dir=runs/tiny ckpt_dir=
prev=
for arg in "$@"; do
    if [ "$prev" = --set ]; then
        case $arg in
        run.dir=*) run_dir=${arg#run.dir=} ;;
        checkpoint.dir=*) ckpt_dir=${arg#checkpoint.dir=} ;;
        esac
    fi
    prev=$arg
done
if [ -z "$ckpt_dir" ] || [ "$ckpt_dir" = auto ]; then ckpt_dir=$run_dir/ckpt; fi
if [ -s "$run_dir/metrics.jsonl" ] && ! compgen -G "$ckpt_dir/step_[0-9]*[0-9]" >/dev/null; then
    n=1
    while [ -e "$run_dir.$n" ]; do n=$((n + 1)); done
    mv "$run_dir" "$run_dir.$n"
    echo "quickstart: the earlier run in $run_dir saved no checkpoint; moved it to $run_dir.$n"
fi
echo "quickstart: 4/4 training configs/tiny.yaml (metrics in $run_dir/metrics.jsonl)"
exec build/trident train configs/tiny.yaml "$@"
