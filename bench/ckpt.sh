#!/usr/bin/env bash
# Checkpoint write / read bandwidth against the raw sequential bandwidth of
# the same disk, measured in the same run (issue 6; goal: ratio >= 0.7).
#   bench/ckpt.sh                      GPT-2 shapes, 8 layers x 512 (~620 MB saved), 1 and 2 ranks
#   bench/ckpt.sh --layers 12 --hidden 768 --ranks "1 2 4" --reps 5
# Env: BUILD (build dir with libtrident.a, default build), DIR (scratch
# directory on the disk to measure, default .cache/bench_ckpt).
# Reads are measured cold when the page cache can be dropped
# (root: echo 3 > /proc/sys/vm/drop_caches); the script says which.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DIR=${DIR:-.cache/bench_ckpt}
RANKS="1 2"
REPS=5
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --ranks) RANKS="$2"; shift 2 ;;
        --reps) REPS="$2"; shift 2 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done

# The bench program: built by Meson when bench/meson.build lists it, else
# compiled here against the library of $BUILD.
BIN=$BUILD/bench/bench_ckpt
if [ ! -x "$BIN" ]; then
    [ -f "$BUILD/libtrident.a" ] || { echo "bench/ckpt.sh: no $BUILD/libtrident.a (set BUILD=)" >&2; exit 1; }
    BIN=$BUILD/bench_ckpt_local
    mpicc -std=c17 -O2 -D_GNU_SOURCE -Isrc bench/bench_ckpt.c -o "$BIN" "$BUILD/libtrident.a" \
        $(pkg-config --cflags --libs hdf5-mpich yaml-0.1 openblas) -fopenmp -lm
fi

mkdir -p "$DIR"
SRC=$DIR/src
[ -w /dev/shm ] && SRC=/dev/shm/trd_bench_ckpt_src.$$
trap 'rm -f "$SRC"' EXIT
drop_caches() {
    sync
    if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo cold; else echo warm; fi
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
# MB/s of a dd summary line "... copied, 1.2 s, 512 MB/s" for `bytes` bytes.
dd_mbps() { awk -v b="$1" '{print b / $(NF-3) / 1e6}'; }

echo "machine: $(nproc) cores; disk: $(df -h "$DIR" | awk 'NR==2 {print $1, $2}')," \
     "$(stat -f -c %T "$DIR"); $REPS repetitions, medians"
for n in $RANKS; do
    : > "$DIR/w.txt"; : > "$DIR/r.txt"; : > "$DIR/dw.txt"; : > "$DIR/dr.txt"
    rm -f "$SRC"
    bytes=
    threads=$(( $(nproc) / n > 0 ? $(nproc) / n : 1 ))
    for rep in $(seq "$REPS"); do
        rm -rf "$DIR/ckpt" "$DIR/raw"
        sync
        # Writes, in alternating order: the checkpoint (fsync'd by the save),
        # and the same number of bytes, sequentially, through dd in 4 MiB
        # blocks with fsync (buffered and O_DIRECT, the faster counts), from
        # non-zero data in memory (a VM disk may store zeros faster than data).
        for which in $( [ $((rep % 2)) = 1 ] && echo "save dd" || echo "dd save"); do
            sync
            if [ "$which" = save ]; then
                save=$(OMP_NUM_THREADS=$threads mpiexec -n "$n" "$BIN" save "$DIR/ckpt" "${ARGS[@]}")
                bytes=$(echo "$save" | awk '{print $7}')
                echo "$save" | awk '{print $11}' >> "$DIR/w.txt"
            else
                [ -n "${bytes:-}" ] || bytes=$(OMP_NUM_THREADS=$threads "$BIN" size "$DIR/none" "${ARGS[@]}")
                count=$(( (bytes + 4194303) / 4194304 ))
                raw=$((count * 4194304))
                [ -f "$SRC" ] || head -c "$raw" /dev/urandom > "$SRC"
                # The faster of buffered and direct writes: the save uses
                # O_DIRECT where it can (docs/checkpoint.md).
                b=$(dd if="$SRC" of="$DIR/raw" bs=4M count="$count" conv=fsync 2>&1 | tail -1 |
                    dd_mbps "$raw")
                rm -f "$DIR/raw"
                d=$(dd if="$SRC" of="$DIR/raw" bs=4M count="$count" oflag=direct conv=fsync 2>&1 |
                    tail -1 | dd_mbps "$raw")
                echo "$b $d" | awk '{print ($1 > $2 ? $1 : $2)}' >> "$DIR/dw.txt"
                rm -f "$DIR/raw"
            fi
        done
        # Reads, cold: the checkpoint through trident, and its own stage
        # files through dd, in alternating order (host-side caches of a VM
        # disk favour whichever reads second).
        for which in $( [ $((rep % 2)) = 1 ] && echo "load dd" || echo "dd load"); do
            cache=$(drop_caches)
            if [ "$which" = load ]; then
                OMP_NUM_THREADS=$threads mpiexec -n "$n" "$BIN" load "$DIR/ckpt" "${ARGS[@]}" |
                    awk '{print $11}' >> "$DIR/r.txt"
            else
                files=$(ls "$DIR"/ckpt/step_00000001/stage_*.h5)
                fbytes=$(stat -c %s $files | awk '{s += $1} END {print s}')
                t0=$(date +%s.%N)
                for f in $files; do dd if="$f" of=/dev/null bs=4M 2>/dev/null; done
                t1=$(date +%s.%N)
                awk -v b="$fbytes" -v a="$t0" -v z="$t1" 'BEGIN {print b / (z - a) / 1e6}' >> "$DIR/dr.txt"
            fi
        done
    done
    w=$(median < "$DIR/w.txt"); r=$(median < "$DIR/r.txt")
    dw=$(median < "$DIR/dw.txt"); dr=$(median < "$DIR/dr.txt")
    awk -v n="$n" -v b="$bytes" -v w="$w" -v r="$r" -v dw="$dw" -v dr="$dr" -v c="$cache" \
        'BEGIN {printf "ranks %s: %.0f MB checkpoint | write %.0f MB/s, dd %.0f MB/s: ratio %.2f | " \
                "read (%s cache) %.0f MB/s, dd %.0f MB/s: ratio %.2f\n", n, b / 1e6, w, dw, w / dw, \
                c, r, dr, r / dr}'
done
rm -rf "$DIR" "$SRC"
