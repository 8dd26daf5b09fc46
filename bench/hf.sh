#!/usr/bin/env bash
# Hugging Face export and import throughput against a raw copy of the same
# bytes on the same disk, measured in the same run (goal: ratio >= 0.7 each).
#   bench/hf.sh                         GPT-2 shapes, 16 layers x 1024 (1.0 GB of fp32 weights)
#   bench/hf.sh --layers 24 --hidden 1024 --reps 5 --ranks 2
# An export reads the weights from the checkpoint's stage file and writes
# them as safetensors; an import reads the safetensors and writes a
# weights-only checkpoint.  The peer for both is `dd` copying a file of the
# same size (read + write, 4 MiB blocks; the faster of buffered and
# O_DIRECT writes), each timed up to a `sync`, with
# the page cache dropped before each when this runs as root (the script
# says cold or warm).  The programs themselves are then loaded once
# untimed (`trident --help`, `dd --version`): a cold start of trident is
# about 0.08 s of page faults in the dynamic loader over its ~40 shared
# libraries (dd has one), a constant that is not the data's throughput.
# Repetitions alternate the order; medians.
# Env: BUILD (default build), DIR (scratch directory on the disk to
# measure, default .cache/bench_hf).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=${DIR:-.cache/bench_hf}
REPS=3 RANKS=1 LAYERS=16 HIDDEN=1024
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift 2 ;;
        --ranks) RANKS=$2; shift 2 ;;
        --layers) LAYERS=$2; shift 2 ;;
        --hidden) HIDDEN=$2; shift 2 ;;
        *) echo "bench/hf.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
scripts/build.sh >/dev/null
T=$BUILD/trident
rm -rf "$DIR"
mkdir -p "$DIR"
trap 'rm -rf "$DIR"' EXIT
drop() {
    sync
    local c=warm
    echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && c=cold
    "$T" --help > /dev/null 2>&1; dd --version > /dev/null   # the programs, not the data
    [ "$RANKS" -gt 1 ] && mpiexec -n 1 true
    echo $c
}
secs() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null 2>&1; sync; t1=$(date +%s.%N); awk -v a="$t0" -v z="$t1" 'BEGIN {print z - a}'; }
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

echo "machine: $(nproc) cores; disk: $(df -h "$DIR" | awk 'NR==2 {print $1, $2}'), $(stat -f -c %T "$DIR")"
"$BUILD/bench/bench_ckpt" save "$DIR/ckpt" --layers "$LAYERS" --hidden "$HIDDEN" > /dev/null
"$T" ckpt export --format hf --out "$DIR/hf" "$DIR/ckpt" > /dev/null   # the import's source
bytes=$(stat -c %s "$DIR/hf/model.safetensors")
head -c "$bytes" /dev/urandom > "$DIR/raw.src"
launch=(); [ "$RANKS" -gt 1 ] && launch=(mpiexec -n "$RANKS")
: > "$DIR/e"; : > "$DIR/i"; : > "$DIR/d"
for rep in $(seq "$REPS"); do
    for which in $( [ $((rep % 2)) = 1 ] && echo "export import dd" || echo "dd import export"); do
        cache=$(drop)
        case $which in
        export) rm -rf "$DIR/out.hf"
                secs "${launch[@]}" "$T" ckpt export --format hf --out "$DIR/out.hf" "$DIR/ckpt" >> "$DIR/e" ;;
        import) rm -rf "$DIR/out.ckpt"
                secs "$T" ckpt import --from hf --out "$DIR/out.ckpt" "$DIR/hf" >> "$DIR/i" ;;
        dd)     # The faster of a buffered and an O_DIRECT copy (trident
                # writes with O_DIRECT where it can, docs/checkpoint.md).
                rm -f "$DIR/raw.dst"
                a=$(secs dd if="$DIR/raw.src" of="$DIR/raw.dst" bs=4M)
                rm -f "$DIR/raw.dst"; drop > /dev/null
                b=$(secs dd if="$DIR/raw.src" of="$DIR/raw.dst" bs=4M oflag=direct)
                echo "$a $b" | awk '{print ($1 < $2 ? $1 : $2)}' >> "$DIR/d" ;;
        esac
    done
done
e=$(median < "$DIR/e"); i=$(median < "$DIR/i"); d=$(median < "$DIR/d")
awk -v b="$bytes" -v e="$e" -v i="$i" -v d="$d" -v c="$cache" -v n="$RANKS" 'BEGIN {
    printf "weights %.0f MB (fp32), %s cache, export on %d rank(s)\n", b / 1e6, c, n
    printf "dd copy   %6.2f s  %6.0f MB/s\n", d, b / d / 1e6
    printf "export    %6.2f s  %6.0f MB/s  ratio to dd %.2f\n", e, b / e / 1e6, d / e
    printf "import    %6.2f s  %6.0f MB/s  ratio to dd %.2f   (goal >= 0.7 each)\n", i, b / i / 1e6, d / i
}'
