# e2e.sh — sourced by the end-to-end training tests (tests/test_*.sh).
# Checks the environment, makes $out (removed on exit), and defines run:
#   run NAME RANKS [--set ...]   trains configs/tiny.yaml with the caller's
#                                ${small[@]} overrides into $out/NAME (log in
#                                $out/NAME.log, final weights of one-piece
#                                models in $out/NAME.weights; with
#                                RUN_CKPT=1 checkpoints in $out/NAME/ckpt),
#                                counting a failed run in $fails;
#   curves REF NAME [options]    compares $out/NAME's loss curve with
#                                $out/REF's (tests/curves.py), counting a
#                                difference in $fails;
#   byte_data [N]                writes $out/bytes (the paragraphs of N
#                                Brown texts, default 8, in bytes, vocab
#                                257) and sets
#                                ${bytes[@]}, the overrides that train on it:
#                                with GPT-2's vocabulary the classifier is
#                                most of a tiny model's time.
set -uo pipefail
: "${TRIDENT:?TRIDENT must point at the built binary}"
cd "${TRIDENT_SOURCE_ROOT:-.}" || exit 1
[ -f data/brown/gpt2.idx ] || { echo "FAIL: data/brown/gpt2 missing: run scripts/get_corpus.sh"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
fails=0

run() {
    local name=$1 n=$2; shift 2
    local ckpt=()
    [ "${RUN_CKPT:-0}" = 1 ] && ckpt=(--set checkpoint.dir="$out/$name/ckpt")
    TRIDENT_DUMP_WEIGHTS="$out/$name.weights" timeout 300 mpiexec -n "$n" "$TRIDENT" train \
        configs/tiny.yaml "${small[@]}" --set run.dir="$out/$name" "${ckpt[@]}" "$@" \
        > "$out/$name.log" 2>&1 \
        || { echo "FAIL: $name exited $?"; tail -20 "$out/$name.log"; fails=$((fails + 1)); }
}

curves() {
    python3 tests/curves.py "$out/$1" "$out/$2" "${@:3}" || fails=$((fails + 1))
}

byte_data() {
    python3 - "$out/bytes.jsonl" "${1:-8}" <<'PY'
import glob, json, sys
with open(sys.argv[1], "w") as f:
    for path in sorted(glob.glob("data/brown/txt/c*"))[:int(sys.argv[2])]:
        for para in open(path).read().split("\n\n"):
            if para.strip():
                f.write(json.dumps({"text": " ".join(para.split())}) + "\n")
PY
    "$TRIDENT" prepare-data --input "$out/bytes.jsonl" --tokenizer byte --out "$out/bytes" \
        > "$out/prepare.log" 2>&1 || { echo "FAIL: prepare-data"; cat "$out/prepare.log"; exit 1; }
    bytes=(--set model.vocab=257 --set data.path="$out/bytes" --set data.val_path="$out/bytes")
}
