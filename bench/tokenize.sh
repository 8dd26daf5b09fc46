#!/usr/bin/env bash
# Tokenizer throughput per core (issue 18): trident's GPT-2 BPE, cl100k_base
# and o200k_base against OpenAI's tiktoken compiled to WebAssembly (npm
# @dqbd/tiktoken) and js-tiktoken, on the same text in the same run; then
# trident's scaling from 1 to 2 threads.
#   bench/tokenize.sh                    3 rounds, the Brown Corpus once per pass
#   bench/tokenize.sh --rounds 5 --no-js    more rounds, without js-tiktoken (slow)
#   bench/tokenize.sh --repeat 4         the corpus 4 times per pass (see below)
#
# The text is the Brown Corpus (scripts/get_corpus.sh: 500 documents, 5.97 MB),
# each document encoded on its own as prepare-data does; reading the files and
# loading the tokenizers are not timed, a warm-up on 50 documents is not
# counted.  Rounds alternate between the implementations (the machine's speed
# drifts) and the best pass of each is reported.  Every implementation must
# give the same token count, or the script fails.
#
# trident starts every pass with empty word caches (bench_tokenize loads fresh
# tokenizers), so filling them is part of its time; the peers keep no such
# cache.  With --repeat N every document is seen N times per pass, which lets
# trident's cache answer every word of the copies; the default, one copy, keeps
# the cache's help to what one pass over real text gives.
#
# Scaling: bench_tokenize on 1 and 2 OpenMP threads (a tokenizer per thread,
# documents handed out one at a time, as prepare-data --workers does) over the
# corpus 4 times; the machine's own 2-core scaling from two 1-thread processes
# run at once; and prepare-data --workers 1 against --workers 2, end to end.
# On a machine others share, the wall-time ratios hold only when both cores
# were free: the table prints how busy each pass kept the cores, and the CPU
# work of 2 threads over 1 (each thread fills its own word cache, so 2
# threads do more work), which holds whatever the load.
# Needs node and npm; installs @dqbd/tiktoken into .cache/npm-bench.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3 repeat=1 js=1 scale_repeat=4
encodings=(gpt2 cl100k_base o200k_base)
wasm_version=1.0.22
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --no-js) js=0; shift ;;
        *) echo "usage: bench/tokenize.sh [--rounds N] [--repeat R] [--no-js]" >&2; exit 2 ;;
    esac
done

die() { echo "bench/tokenize.sh: error: $*" >&2; exit 1; }
scripts/build.sh >/dev/null
[[ -f data/brown/txt/ca01 ]] || die "no Brown Corpus text: run scripts/get_corpus.sh"
scripts/get_tiktoken.sh >/dev/null || die "scripts/get_tiktoken.sh failed"
js_pkg=$(pwd)/.cache/npm-tiktoken/node_modules/js-tiktoken
wasm_prefix=.cache/npm-bench
wasm_pkg=$(pwd)/$wasm_prefix/node_modules/@dqbd/tiktoken
if ! grep -qs "\"version\": \"$wasm_version\"" "$wasm_pkg/package.json"; then
    echo "installing @dqbd/tiktoken@$wasm_version into $wasm_prefix"
    npm install --prefer-offline --no-audit --no-fund --prefix "$wasm_prefix" \
        "@dqbd/tiktoken@$wasm_version" >/dev/null || die "npm install @dqbd/tiktoken failed"
fi

bench=build/bench/bench_tokenize
trident=build/trident
docs=(data/brown/txt/*)
tok_args() { [[ $1 == gpt2 ]] && echo "--tokenizer gpt2" || echo "--tokenizer tiktoken --encoding $1"; }
tmp=$(mktemp -d /tmp/trd_tokbench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/runs

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) (other programs on these cores slow every figure)"
echo "corpus: ${#docs[@]} Brown documents x $repeat per pass, $rounds alternating rounds"
echo "peers: @dqbd/tiktoken $wasm_version (tiktoken's Rust in WebAssembly), js-tiktoken" \
    "$(grep -o '"version": "[^"]*"' "$js_pkg/package.json" | cut -d'"' -f4), node $(node --version)"
for r in $(seq "$rounds"); do
    for enc in "${encodings[@]}"; do
        "$bench" --tokenizer "$enc" --repeat "$repeat" "${docs[@]}" >> "$log"
        node bench/tokenize_ref.js dqbd "$wasm_pkg" "$enc" "$repeat" "${docs[@]}" >> "$log"
        if [[ $js == 1 ]]; then
            node bench/tokenize_ref.js js "$js_pkg" "$enc" "$repeat" "${docs[@]}" >> "$log"
        fi
    done
    echo "round $r done" >&2
done

# Scaling: per round, 1 thread, 2 threads, and two 1-thread processes at once.
for r in $(seq "$rounds"); do
    for enc in gpt2 cl100k_base; do
        "$bench" --tokenizer "$enc" --repeat "$scale_repeat" "${docs[@]}" >> "$log"
        "$bench" --tokenizer "$enc" --repeat "$scale_repeat" --threads 2 "${docs[@]}" >> "$log"
        "$bench" --tokenizer "$enc" --repeat "$scale_repeat" "${docs[@]}" |
            sed 's/^trident/pair-a/' > "$tmp/pa" &
        "$bench" --tokenizer "$enc" --repeat "$scale_repeat" "${docs[@]}" |
            sed 's/^trident/pair-b/' > "$tmp/pb"
        wait
        cat "$tmp/pa" "$tmp/pb" >> "$log"
        for w in 1 2; do
            # The corpus 4 times (a directory listed again is read again);
            # the run's own time, which starts after the tokenizers load.
            "$trident" prepare-data --input $(printf 'data/brown/txt %.0s' $(seq "$scale_repeat")) \
                $(tok_args "$enc") --workers "$w" --out "$tmp/prep" > "$tmp/prep.log"
            sed -n "s/.* tokens in \([0-9.]*\) s (encoding \([0-9.]*\) s.*/prepare $enc threads $w: \1 s \2/p" \
                "$tmp/prep.log" >> "$log"
        done
    done
    echo "scaling round $r done" >&2
done

# The tables: the best pass of each implementation, encoding, thread count
# and text size (impl enc threads: BYTES bytes, TOKENS tokens, S s, ...).
awk -v scale_repeat="$scale_repeat" '
function best(key, s) { if (!(key in t) || s < t[key]) t[key] = s }
function mbs(key) { return (key in t) ? nbytes[key] / t[key] / 1e6 : 0 }
/ bytes, / {
    th = $4; sub(":", "", th)
    key = $1 SUBSEP $2 SUBSEP th SUBSEP $5
    c = ($NF == "s" && $(NF - 2) == "cpu") ? $(NF - 1) : 0
    if (!(key in t) || $9 < t[key]) cpu[key] = c
    if (!(key in mincpu) || c < mincpu[key]) mincpu[key] = c
    best(key, $9); nbytes[key] = $5; ntok[key] = $7
    if ($1 == "trident" || $1 == "tiktoken-wasm" || $1 == "js-tiktoken") {
        ck = $2 SUBSEP $5
        if ((ck in count) && count[ck] != $7)
            bad = bad "\n  " $2 ", " $5 " bytes: " $1 " " $7 " tokens, before " count[ck]
        count[ck] = $7
    }
    if ($1 == "tiktoken-wasm") table_bytes[$2] = $5
    if ($1 == "pair-a") scale_bytes[$2] = $5
}
/^prepare / {
    th = $4; sub(":", "", th); best("prepare" SUBSEP $2 SUBSEP th, $5)
    best("prepare-enc" SUBSEP $2 SUBSEP th, $7)
}
function row(impl, enc,   key, w) {
    key = impl SUBSEP enc SUBSEP 1 SUBSEP table_bytes[enc]
    if (!(key in t)) return
    printf "%-14s %-12s %8.2f %10.2f %10d", impl, enc, mbs(key), ntok[key] / t[key] / 1e6, ntok[key]
    w = "tiktoken-wasm" SUBSEP enc SUBSEP 1 SUBSEP table_bytes[enc]
    if (impl != "tiktoken-wasm") printf " %8.2f", t[w] / t[key]
    printf "\n"
}
END {
    n = split("gpt2 cl100k_base o200k_base", encs, " ")
    print "\nPer core (1 thread), best pass; x wasm = tokens/s over tiktoken-wasm'"'"'s:"
    printf "%-14s %-12s %8s %10s %10s %8s\n", "implementation", "encoding", "MB/s", "Mtokens/s", "tokens", "x wasm"
    split("trident tiktoken-wasm js-tiktoken", impls, " ")
    for (i = 1; i <= n; i++)
        for (k = 1; k <= 3; k++)
            row(impls[k], encs[i])
    print "\nScaling, trident, corpus x " scale_repeat " per pass (MB/s; ratio = 2 threads / 1 thread; busy = CPU time / wall time of"
    print "that pass, below 1 and 2 when other programs took the cores; work = least CPU time of a 2-thread pass over"
    print "that of a 1-thread pass, so 2 / work bounds the ratio even on idle cores):"
    printf "%-12s %9s %9s %6s %7s %10s %5s   %s\n", "encoding", "1 thread", "2 threads", "ratio", "of 2.0", "busy", "work", "machine: two 1-thread processes at once"
    for (i = 1; i <= 2; i++) {
        e = encs[i]; b = scale_bytes[e]
        one = mbs("trident" SUBSEP e SUBSEP 1 SUBSEP b); two = mbs("trident" SUBSEP e SUBSEP 2 SUBSEP b)
        pa = mbs("pair-a" SUBSEP e SUBSEP 1 SUBSEP b); pb = mbs("pair-b" SUBSEP e SUBSEP 1 SUBSEP b)
        k1 = "trident" SUBSEP e SUBSEP 1 SUBSEP b; k2 = "trident" SUBSEP e SUBSEP 2 SUBSEP b
        printf "%-12s %9.2f %9.2f %6.2f %7.2f %4.2f %4.2f %5.2f   %.2f + %.2f MB/s = %.2f x one alone (%.2f of 2.0)\n",
               e, one, two, two / one, two / one / 2, cpu[k1] / t[k1], cpu[k2] / t[k2],
               mincpu[k2] / mincpu[k1], pa, pb, (pa + pb) / one, (pa + pb) / one / 2
    }
    print "\nprepare-data, corpus x " scale_repeat " (its own time: reading, UTF-8 check, encoding, writing; and its encoding alone):"
    for (i = 1; i <= 2; i++) {
        e = encs[i]; a = t["prepare" SUBSEP e SUBSEP 1]; c = t["prepare" SUBSEP e SUBSEP 2]
        ea = t["prepare-enc" SUBSEP e SUBSEP 1]; ec = t["prepare-enc" SUBSEP e SUBSEP 2]
        printf "%-12s --workers 1 %.2f s, --workers 2 %.2f s: %.2f x (%.2f of 2.0); encoding %.2f s, %.2f s: %.2f x\n",
               e, a, c, a / c, a / c / 2, ea, ec, ea / ec
    }
    if (bad) { print "\nFAIL: token counts differ:" bad; exit 1 }
    print "\ntoken counts: the same for every implementation, per encoding and text"
}' "$log"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
