#!/usr/bin/env bash
# prepare-data over MPI ranks (docs/data.md, "Several processes"): under
# `mpiexec -n 2` and `-n 4` the input is cut into one range per rank, and
#   1. the merged .bin/.idx (train and _val, --val-every by global document
#      index) are byte for byte one process's: for the Brown text files, for
#      the corpus as one plain JSON lines file (cut inside the file, at line
#      starts) and as one .jsonl.gz (whole files only); llm.c shards too;
#   2. --shards: one dataset per rank, PREFIX-0000r-of-0000N, every one
#      non-empty (the JSON lines file was cut), whose documents and tokens,
#      concatenated in shard order, are the one-process dataset's (read with
#      numpy from the .idx layout of docs/data.md);
#   3. a bad document in the last rank's range: exit 2 with one process's
#      FILE:LINE message, and no dataset, spool or .tmp file left; the tasks
#      of an srun without MPI are refused;
#   4. --skip-bad: the same dataset, count and first five places as one process;
#   5. --progress: rank 0 prints the job's totals.
# Needs the Brown text (scripts/get_corpus.sh --text-only), MPICH's mpiexec
# and numpy in /usr/bin/python3 (scripts/install_deps.sh).
set -euo pipefail

root=${TRIDENT_SOURCE_ROOT:-$(pwd)}
cd "$root"
trident=${TRIDENT:-build/trident}
txt=data/brown/txt

fail() { echo "test_prepare_mpi: FAIL: $*" >&2; exit 1; }
say() { echo "test_prepare_mpi: $*"; }
[[ -x $trident ]] || fail "no trident binary at $trident"
command -v mpiexec >/dev/null || fail "no mpiexec (apt-get install mpich)"
compgen -G "$txt/c[a-r][0-9][0-9]" >/dev/null || fail "no Brown text in $txt (run scripts/get_corpus.sh --text-only)"
py=python3
[[ -x /usr/bin/python3 ]] && py=/usr/bin/python3
"$py" -c 'import numpy' 2>/dev/null || fail "$py has no numpy (scripts/install_deps.sh)"
export OMP_NUM_THREADS=1

tmp=$(mktemp -d /tmp/trd_prepare_mpi.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
docs=("$txt"/c[a-r][0-9][0-9])
t_start=$SECONDS

# The corpus as one JSON lines file (a document per line), and gzipped.
"$py" -c '
import json, sys
for f in sys.argv[1:]:
    print(json.dumps({"text": open(f, encoding="utf-8").read()}))
' "${docs[@]}" > "$tmp/all.jsonl"
gzip -c -n "$tmp/all.jsonl" > "$tmp/all.jsonl.gz"

prep() {   # prep RANKS OUT ARGS...: prepare-data with gpt2, --val-every 7
    local n=$1 out=$2 launch=()
    shift 2
    [[ $n -gt 0 ]] && launch=(mpiexec -n "$n")
    timeout 300 "${launch[@]}" "$trident" prepare-data --tokenizer gpt2 --val-every 7 \
        --out "$tmp/$out" "$@" > "$tmp/$out.log" 2>&1 || fail "${launch[*]} prepare-data $*: $(cat "$tmp/$out.log")"
}
same() {   # same A B [EXTS]: identical datasets (train and val)
    local e s
    for s in "" _val; do
        for e in ${3:-bin idx}; do
            cmp -s "$tmp/$1$s.$e" "$tmp/$2$s.$e" || fail "$2$s.$e differs from $1$s.$e"
        done
    done
}

# ---- 1. merged: the same bytes as one process -------------------------------

prep 0 txt --input "${docs[@]}"
prep 0 jsonl --input "$tmp/all.jsonl"
prep 0 llmc --input "$tmp/all.jsonl" --format llmc
same txt jsonl
for n in 2 4; do
    prep $n txt$n --input "${docs[@]}"
    same txt txt$n
    prep $n jsonl$n --input "$tmp/all.jsonl"
    same txt jsonl$n
    prep $n gz$n --input "$tmp/all.jsonl.gz"
    same txt gz$n
    grep -q "^  $n ranks (MPI)" "$tmp/jsonl$n.log" || fail "-n $n: not $n ranks: $(cat "$tmp/jsonl$n.log")"
done
prep 2 llmc2 --input "$tmp/all.jsonl" --format llmc
same llmc llmc2 bin
prep 4 w4 --input "$tmp/all.jsonl" --workers 2
same txt w4
prep 1 one --input "$tmp/all.jsonl"
same txt one
say "2 and 4 ranks: ${#docs[@]} text files, one .jsonl, one .jsonl.gz, llm.c, --workers 2," \
    "mpiexec -n 1: .bin/.idx and _val identical to one process's"

# ---- 2. --shards ----------------------------------------------------------------

prep 4 sh --input "$tmp/all.jsonl" --shards
"$py" - "$tmp" <<'PY' || fail "--shards: the shards are not the one-process dataset (above)"
import sys, numpy as np
tmp = sys.argv[1]

def read(prefix):
    """A Megatron dataset: (document lengths, tokens), from the .idx layout."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", prefix
    dtype = {8: np.uint16, 4: np.int32}[idx[17]]
    n_seq = int(np.frombuffer(idx, np.uint64, 1, 18)[0])
    n_doc = int(np.frombuffer(idx, np.uint64, 1, 26)[0])
    lengths = np.frombuffer(idx, np.int32, n_seq, 34)
    ptrs = np.frombuffer(idx, np.int64, n_seq, 34 + 4 * n_seq)
    doc_idx = np.frombuffer(idx, np.int64, n_doc, 34 + 12 * n_seq)
    tokens = np.fromfile(prefix + ".bin", dtype)
    size = np.dtype(dtype).itemsize
    assert len(tokens) == lengths.sum(), prefix
    assert (ptrs == np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * size).all()
    assert (doc_idx == np.arange(n_doc)).all(), prefix
    return lengths, tokens

bad = 0
for split in ("", "_val"):
    ref_len, ref_tok = read(f"{tmp}/txt{split}")
    parts = [read(f"{tmp}/sh{split}-{r:05d}-of-00004") for r in range(4)]
    counts = [len(l) for l, _ in parts]
    lengths = np.concatenate([l for l, _ in parts])
    tokens = np.concatenate([t for _, t in parts])
    ok = min(counts) > 0 and (lengths == ref_len).all() and (tokens == ref_tok).all()
    print(f"test_prepare_mpi: --shards{split}: documents per shard {counts}, "
          f"{len(tokens)} tokens: {'the one-process dataset' if ok else 'DIFFERENT'}")
    bad += not ok
sys.exit(bad)
PY
[[ -z $(compgen -G "$tmp/sh*.tmp*") && -z $(compgen -G "$tmp/sh.bin") ]] ||
    fail "--shards left $(compgen -G "$tmp/sh*.tmp*") $(compgen -G "$tmp/sh.bin")"

# ---- 3. bad input in the last rank's range -----------------------------------

expect_bad() {   # expect_bad RANKS NAME 'MESSAGE' ARGS...: exit 2, the message, no file
    local n=$1 name=$2 msg=$3 rc launch=()
    shift 3
    [[ $n -gt 0 ]] && launch=(mpiexec -n "$n")
    set +e
    timeout 120 "${launch[@]}" "$trident" prepare-data --tokenizer gpt2 --val-every 7 \
        --out "$tmp/$name" "$@" > "$tmp/$name.log" 2>&1
    rc=$?
    set -e
    [[ $rc -eq 2 ]] || fail "$name: exit $rc, expected 2: $(cat "$tmp/$name.log")"
    grep -qF -- "$msg" "$tmp/$name.log" || fail "$name: no '$msg' in: $(cat "$tmp/$name.log")"
    [[ $(grep -c "trident: error:" "$tmp/$name.log") -eq 1 ]] ||
        fail "$name: not one error message: $(cat "$tmp/$name.log")"
    [[ -z $(compgen -G "$tmp/$name*[!g]") ]] || fail "$name: left $(compgen -G "$tmp/$name*[!g]")"
}
# The last line: in the last rank's range, whatever the cut.
sed '$ s/.*/{"text": "caf\xc3 au lait"}/' "$tmp/all.jsonl" > "$tmp/bad.jsonl"
last=$(wc -l < "$tmp/bad.jsonl")
msg="bad.jsonl:$last: invalid UTF-8 (byte 0xC3 at byte 3 of the text)"
expect_bad 0 bad0 "$msg" --input "$tmp/bad.jsonl"
for n in 2 4; do
    t0=$SECONDS
    expect_bad $n bad$n "$msg" --input "$tmp/bad.jsonl"
    took=$((SECONDS - t0))
    expect_bad $n badw$n "$msg" --input "$tmp/bad.jsonl" --workers 2 --shards
done
# A text file, the last input: its line of the bad byte.
printf 'line one\nline \xff two\n' > "$tmp/zz.txt"
expect_bad 4 badtxt "zz.txt:2: invalid UTF-8 (byte 0xFF" --input "${docs[@]}" "$tmp/zz.txt"
say "a bad document in the last rank's range (.jsonl line $last, a text file): exit 2 with" \
    "one process's FILE:LINE (4 ranks: $took s), no dataset, spool or .tmp file left"

# srun without MPI: tasks that do not know of each other are refused.
set +e
SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0 "$trident" prepare-data --tokenizer gpt2 --input "$tmp/all.jsonl" \
    --out "$tmp/nompi" > "$tmp/nompi.log" 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] && grep -q "srun started 2 tasks without MPI" "$tmp/nompi.log" && [[ ! -e $tmp/nompi.bin ]] ||
    fail "srun --mpi=none: exit $rc: $(cat "$tmp/nompi.log")"
say "2 tasks of srun without MPI: refused (exit 2), nothing written"

# ---- 4. --skip-bad --------------------------------------------------------------

# Seven bad lines spread over the file (every rank's range has some), and a
# cut .jsonl.gz after it.
"$py" - "$tmp/all.jsonl" "$tmp/mixed.jsonl" <<'PY'
import sys
lines = open(sys.argv[1], "rb").read().split(b"\n")[:-1]
for i, bad in zip((3, 90, 180, 260, 330, 410, 480),
                  (b'{"text": 1}', b"not json", b'{"nope": ""}', b'[1]', b'{"text": "\xff"}',
                   b'{"text": "a"} x', b'{"text": null}')):
    lines[i - 1] = bad
open(sys.argv[2], "wb").write(b"\n".join(lines) + b"\n")
PY
head -c 20000 "$tmp/all.jsonl.gz" > "$tmp/cut.jsonl.gz"
prep 0 skip --input "$tmp/mixed.jsonl" "$tmp/cut.jsonl.gz" --skip-bad
grep -q "skipped 8 bad documents" "$tmp/skip.log" || fail "--skip-bad count: $(cat "$tmp/skip.log")"
for n in 2 4; do
    prep $n skip$n --input "$tmp/mixed.jsonl" "$tmp/cut.jsonl.gz" --skip-bad
    same skip skip$n
    diff <(grep -E '^  /|^prepare-data: skipped' "$tmp/skip.log") <(grep -E '^  /|^prepare-data: skipped' "$tmp/skip$n.log") > /dev/null ||
        fail "--skip-bad -n $n: another report than one process's:" \
             "$(diff <(grep -E '^  /|^prepare-data: skipped' "$tmp/skip.log") <(grep -E '^  /|^prepare-data: skipped' "$tmp/skip$n.log"))"
done
say "--skip-bad: 8 bad documents (7 lines over every rank's range, a cut .gz), the same" \
    "dataset, count and first five places as one process, on 2 and 4 ranks"

# ---- 5. --progress ---------------------------------------------------------------

prep 4 prog --input "$tmp/all.jsonl" --progress
grep -Eq "^prepare-data: 500 documents, [0-9.]+ / [0-9.]+ MiB \(100%\), [0-9.]+ MiB/s, [0-9]+ tokens/s$" "$tmp/prog.log" ||
    fail "--progress: no final line with the job's 500 documents: $(cat "$tmp/prog.log")"
[[ $(grep -c "MiB (100%)" "$tmp/prog.log") -eq 1 ]] || fail "--progress: more than rank 0 printed: $(cat "$tmp/prog.log")"
say "--progress on 4 ranks: $(grep "MiB (100%)" "$tmp/prog.log")"
say "all checks passed in $((SECONDS - t_start)) s"
