#!/usr/bin/env bash
# prepare-data's inputs and the tiktoken tokenizer (docs/data.md):
#   1. the tiktoken BPE (cl100k_base, o200k_base) against the reference
#      encoder, npm js-tiktoken 1.0.21: every token of the whole Brown Corpus
#      (500 documents through prepare-data, compared as int32 .bin files)
#      and of edge cases and a pseudo-random mix through `trident tokenize`;
#   2. JSON lines, plain, .gz (several members) and .zst (several frames),
#      give byte-identical .bin/.idx files to the same documents as text files;
#   3. bad documents: FILE:LINE and what, exit 2, no dataset or .tmp file left;
#      --skip-bad counts them and keeps the rest;
#   4. --progress prints documents, MiB, throughput and an ETA;
#   5. `trident train` refuses (exit 2) a cl100k_base dataset with model.vocab 50257.
# Needs node and the Brown text (scripts/get_corpus.sh --text-only); installs
# js-tiktoken into .cache/npm-tiktoken with scripts/get_tiktoken.sh.
set -euo pipefail

root=${TRIDENT_SOURCE_ROOT:-$(pwd)}
cd "$root"
trident=${TRIDENT:-build/trident}
pkg=$root/.cache/npm-tiktoken/node_modules/js-tiktoken
txt=data/brown/txt

fail() { echo "test_prepare_inputs: FAIL: $*" >&2; exit 1; }
say() { echo "test_prepare_inputs: $*"; }
command -v node >/dev/null || fail "node is not installed (scripts/install_deps.sh)"
[[ -x $trident ]] || fail "no trident binary at $trident"
compgen -G "$txt/c[a-r][0-9][0-9]" >/dev/null || fail "no Brown text in $txt (run scripts/get_corpus.sh --text-only)"
scripts/get_tiktoken.sh >/dev/null || fail "scripts/get_tiktoken.sh failed"

tmp=$(mktemp -d /tmp/trd_prepare_inputs.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
docs=("$txt"/c[a-r][0-9][0-9])

# ---- 1. tiktoken against js-tiktoken -------------------------------------

# Edge cases: empty text, runs of spaces/digits/newlines, contractions in
# every case, the letter subcategories and marks o200k's pattern tells
# apart, '/' after punctuation (o200k), non-ASCII, emoji, a special token's
# text (ordinary text for both), ill-formed UTF-8 (U+FFFD for both).
: > "$tmp/empty.txt"
{
    printf 'Hello world! It'"'"'s, they'"'"'RE, we'"'"'Ve, I'"'"'M, you'"'"'LL, he'"'"'d; '"'"'tis rock'"'"'n'"'"'roll don'"'"''"'"'t\n'
    printf 'Numbers: 1 12 123 1234 12345678901234567890 3.14159 1,000,000 42nd x2 2x 007\n'
    printf '%s\n' "spaces:$(printf '%*s' 40 '')end   ,   trailing   "
    printf 'tabs\there\t\tand\n\n\n\nnewlines \n  \n\t \r\n\r\n end\r\n'
    printf 'URLs: https://example.com/a/b?c=d&e=f ../../x //\n/// .//\n'
    printf 'caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac 2024 \xc2\xb2\xc2\xbd \xd9\xa1\xd9\xa2\xd9\xa3\xd9\xa4\n'
    printf 'emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xab\xf0\x9f\x87\xb7\n'
    printf 'marks: se\xcc\x81 A\xcc\x81BC \xcc\x81\xcc\x82x \xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80\n'
    printf 'titlecase: \xc7\x85ungla \xc7\x88ubljana \xc7\x8bje HELLOworld HELLO\xca\xb0 \xca\xb0\xca\xb0abc ABC\xe3\x81\x82\xe3\x81\x84\n'
    printf 'Stra\xc3\x9fe \xc4\xb0stanbul \xef\xac\x81 \xce\x95\xce\xbb\xce\xbb\xce\xac\xce\xb4\xce\xb1 \xd0\x9c\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4\n'
    printf 'special: <|endoftext|> <|fim_prefix|><|endofprompt|>\n'
    printf 'bad: \xff \xc3 \xe2\x82 \xed\xa0\x80 end'
} > "$tmp/edge.txt"
# A fixed pseudo-random mix (LCG): pieces of many scripts and categories,
# apostrophes, slashes, Unicode spaces, random code points of every plane.
node -e '
let x = 4242;
const r = n => { x = (x * 1103515245 + 12345) % 2147483648; return x % n; };
const pool = ["the", " of", "The", "HTML", "iPhone", "McDonald", "Zürich", "ÉCOLE", "Ελλάδα",
  "Москва", "東京", "한국어", "عربى", "हिन्दी", "ǅ", "ǈ", "ʰ", "ー", "々", "\u0301", "\u0308",
  "\u20dd", "١٢٣", "Ⅻ", "½", "²", "𝟘𝟙", "👍", "🎉", "\u00a0", "\u2003", "\u3000", "\u2028",
  "\ufeff", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "\r", ",", "\"", "\x27", "/", "//",
  "]", "[", ".", "}", "{", ")", "(", "-", "_", "’", "…", "$", "%", "&", "12", "3.5", "12345",
  "\x27s", "\x27S", "\x27ll", "\x27Ll", "\x27VE", "\x27re", "\x27d", "\x27t", "\x27M", "can\x27t",
  "ﬁ", "ß", "İ", "ǅungla", "ABCdef", "abcDEF", "aʰb", "Aʰ", "ʰA"];
const cp = () => { const k = r(4); return k == 0 ? 0x80 + r(0x780)
  : k == 1 ? 0x800 + r(0xD000) : k == 2 ? 0xE000 + r(0x2000) : 0x10000 + r(0x30000); };
let s = "";
for (let i = 0; i < 8000; i++) s += r(6) ? pool[r(pool.length)] : String.fromCodePoint(cp());
process.stdout.write(s);
' > "$tmp/mix.txt"

for enc in cl100k_base o200k_base; do
    for f in empty edge mix; do
        node tests/tiktoken_ref.js "$pkg" "$enc" ids "$tmp/$f.txt" > "$tmp/$f.$enc.ref" ||
            fail "js-tiktoken failed on $f"
        "$trident" tokenize --tokenizer tiktoken --encoding "$enc" "$tmp/$f.txt" |
            tr ' ' '\n' | sed '/^$/d' > "$tmp/$f.$enc.out" || fail "trident tokenize failed on $f"
        nref=$(wc -l < "$tmp/$f.$enc.ref")
        if ! cmp -s "$tmp/$f.$enc.ref" "$tmp/$f.$enc.out"; then
            pos=$(paste -d' ' "$tmp/$f.$enc.ref" "$tmp/$f.$enc.out" | awk '$1 != $2 { print NR - 1; exit }')
            fail "$enc $f: first difference at id $pos: reference" \
                 "$(sed -n "$((pos + 1)),$((pos + 6))p" "$tmp/$f.$enc.ref" | tr '\n' ' ')trident" \
                 "$(sed -n "$((pos + 1)),$((pos + 6))p" "$tmp/$f.$enc.out" | tr '\n' ' ')"
        fi
        say "$enc $f: $(wc -c < "$tmp/$f.txt") bytes -> $nref ids, identical"
    done

    # The whole corpus through prepare-data: int32 tokens, EOT after each document.
    ref=$(node tests/tiktoken_ref.js "$pkg" "$enc" bin "$tmp/ref.bin" "${docs[@]}") ||
        fail "js-tiktoken failed on the corpus"
    "$trident" prepare-data --input "${docs[@]}" --tokenizer tiktoken --encoding "$enc" \
        --out "$tmp/brown_$enc" > "$tmp/brown_$enc.log" || fail "prepare-data $enc: $(cat "$tmp/brown_$enc.log")"
    [[ $(od -A n -t u1 -j 17 -N 1 "$tmp/brown_$enc.idx" | tr -d ' ') == 4 ]] ||
        fail "$enc: the .idx dtype is not int32 (code 4)"
    if ! cmp -s "$tmp/ref.bin" "$tmp/brown_$enc.bin"; then
        at=$(cmp "$tmp/ref.bin" "$tmp/brown_$enc.bin" | awk '{ print $5 }' | tr -d ,)
        fail "$enc Brown Corpus: tokens differ from js-tiktoken's at token $(( (at - 1) / 4 ))"
    fi
    # Two tokenizing threads: the same dataset.
    "$trident" prepare-data --input "${docs[@]}" --tokenizer tiktoken --encoding "$enc" --workers 2 \
        --out "$tmp/brown2_$enc" > "$tmp/brown2_$enc.log" || fail "prepare-data --workers 2: $(cat "$tmp/brown2_$enc.log")"
    cmp -s "$tmp/brown_$enc.bin" "$tmp/brown2_$enc.bin" && cmp -s "$tmp/brown_$enc.idx" "$tmp/brown2_$enc.idx" ||
        fail "$enc: --workers 2 gives another dataset than one worker"
    say "$enc Brown Corpus: ${#docs[@]} documents, $(( $(stat -c %s "$tmp/ref.bin") / 4 )) tokens" \
        "(EOT included), identical (also with --workers 2); js-tiktoken: $ref; trident: $(grep -o '[0-9]* tokens/s' "$tmp/brown_$enc.log" | tail -1)"
done

# Ranks files that do not fit: exit 2 naming the file (and line).
expect_tok_error() {   # expect_tok_error 'MESSAGE' ARGS...
    local msg=$1 rc
    shift
    set +e
    "$trident" tokenize --tokenizer tiktoken "$@" "$tmp/edge.txt" > "$tmp/tok.log" 2>&1
    rc=$?
    set -e
    [[ $rc -eq 2 ]] && grep -qF -- "$msg" "$tmp/tok.log" ||
        fail "tokenize $*: exit $rc, expected 2 and '$msg': $(cat "$tmp/tok.log")"
}
{ head -n 3 .cache/tiktoken/cl100k_base.tiktoken; echo "IQ==x 3"; } > "$tmp/bad.tiktoken"
expect_tok_error "bad.tiktoken:4: expected 'BASE64 RANK'" --ranks "$tmp/bad.tiktoken"
expect_tok_error "cl100k_base.tiktoken: 100256 ranks, o200k_base has 199998" \
    --encoding o200k_base --ranks .cache/tiktoken/cl100k_base.tiktoken
expect_tok_error "o200k_base.tiktoken:100257: rank 100256, but cl100k_base has ranks 0..100255" \
    --encoding cl100k_base --ranks .cache/tiktoken/o200k_base.tiktoken
expect_tok_error "run scripts/get_tiktoken.sh" --ranks "$tmp/missing.tiktoken"
expect_tok_error "unknown tiktoken encoding 'p50k_base'" --encoding p50k_base
say "ranks files: malformed line, another encoding's ranks, missing file, unknown encoding: exit 2"

# ---- 2. JSON lines, gzip, zstd ---------------------------------------------

sub=("${docs[@]:0:12}")
node -e '
const fs = require("fs");
for (const f of process.argv.slice(1))
  process.stdout.write(JSON.stringify({ id: f, meta: { n: 1, tags: ["a", null] }, text: fs.readFileSync(f, "utf8") }) + "\n");
' "${sub[@]}" > "$tmp/docs.jsonl"
node -e '
const fs = require("fs");
for (const f of process.argv.slice(1))   /* ensure_ascii style: \uXXXX escapes */
  process.stdout.write(JSON.stringify({ body: fs.readFileSync(f, "utf8") }).replace(/[\u007f-\uffff]/g,
    c => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0")) + "\r\n");
' "${sub[@]}" > "$tmp/escaped.data"
gzip -c -n "$tmp/docs.jsonl" > "$tmp/docs.jsonl.gz"
zstd -q -c "$tmp/docs.jsonl" > "$tmp/docs.jsonl.zst"
# Several gzip members and zstd frames: the halves compressed separately.
head -n 5 "$tmp/docs.jsonl" > "$tmp/h1"
tail -n +6 "$tmp/docs.jsonl" > "$tmp/h2"
cat <(gzip -c "$tmp/h1") <(gzip -c "$tmp/h2") > "$tmp/multi.jsonl.gz"
cat <(zstd -q -c "$tmp/h1") <(zstd -q -c "$tmp/h2") > "$tmp/multi.jsonl.zst"
mkdir -p "$tmp/gz"
for f in "${sub[@]}"; do gzip -c "$f" > "$tmp/gz/$(basename "$f").txt.gz"; done

prep() {   # prep OUT ARGS...: prepare-data with gpt2, --val-every 5
    local out=$1
    shift
    "$trident" prepare-data --tokenizer gpt2 --val-every 5 --out "$tmp/$out" "$@" > "$tmp/$out.log" 2>&1 ||
        fail "prepare-data $*: $(cat "$tmp/$out.log")"
}
same() {   # same A B: identical datasets (train and val)
    for s in "" _val; do
        for e in bin idx; do
            cmp -s "$tmp/$1$s.$e" "$tmp/$2$s.$e" || fail "$2$s.$e differs from $1$s.$e"
        done
    done
}
prep plain --input "${sub[@]}"
prep jsonl --input "$tmp/docs.jsonl"
prep gz --input "$tmp/docs.jsonl.gz"
prep zst --input "$tmp/docs.jsonl.zst"
prep multi --input "$tmp/multi.jsonl.gz"
prep multiz --input "$tmp/multi.jsonl.zst"
prep escaped --input "$tmp/escaped.data" --input-format jsonl --json-key body
prep txtgz --input "$tmp/gz" --ext txt
# The whole corpus (6 MiB of JSON: lines that span the reader's buffers).
node -e '
const fs = require("fs");
for (const f of process.argv.slice(1))
  process.stdout.write(JSON.stringify({ text: fs.readFileSync(f, "utf8") }) + "\n");
' "${docs[@]}" | gzip -c > "$tmp/all.jsonl.gz"
prep all_plain --input "${docs[@]}"
prep all_gz --input "$tmp/all.jsonl.gz"
same all_plain all_gz
# --ext jsonl takes compressed JSON lines from a directory, not the rest.
mkdir -p "$tmp/mixdir/sub"
cp "$tmp/h1" "$tmp/mixdir/a.jsonl"
zstd -q -c "$tmp/h2" > "$tmp/mixdir/sub/b.jsonl.zst"
cp "${sub[0]}" "$tmp/mixdir/c.txt"
gzip -c "${sub[0]}" > "$tmp/mixdir/d.txt.gz"
prep ext --input "$tmp/mixdir" --ext jsonl
same plain ext
for d in jsonl gz zst multi multiz escaped txtgz; do same plain "$d"; done
grep -q "12 documents" "$tmp/jsonl.log" || fail "jsonl: not 12 documents: $(cat "$tmp/jsonl.log")"
say "JSONL (plain, .gz, .zst, several members/frames, \\u escapes and CRLF, --json-key) and" \
    ".txt.gz, --ext jsonl over .jsonl and .jsonl.zst: ${#sub[@]} documents, and the whole corpus as .jsonl.gz (${#docs[@]} documents):" \
    ".bin/.idx identical to the text files'"

# ---- 3. bad documents ----------------------------------------------------------

expect_bad() {   # expect_bad FILE 'MESSAGE' [--input-format jsonl]
    local f=$1 msg=$2
    shift 2
    rm -f "$tmp/bad."*
    set +e
    "$trident" prepare-data --tokenizer gpt2 --input "$f" --out "$tmp/bad" "$@" > "$tmp/bad.log" 2>&1
    local rc=$?
    set -e
    [[ $rc -eq 2 ]] || fail "$f: exit $rc, expected 2: $(cat "$tmp/bad.log")"
    grep -qF -- "$msg" "$tmp/bad.log" || fail "$f: no '$msg' in: $(cat "$tmp/bad.log")"
    [[ ! -e $tmp/bad.bin && ! -e $tmp/bad.idx ]] || fail "$f: a dataset was left under the real name"
    [[ -z $(compgen -G "$tmp/bad*.tmp") ]] || fail "$f: left $(compgen -G "$tmp/bad*.tmp")"
}
good='{"text": "fine"}'
printf '%s\n%s\n{"text": "x",}\n' "$good" "$good" > "$tmp/malformed.jsonl"
expect_bad "$tmp/malformed.jsonl" "malformed.jsonl:3: malformed JSON"
printf '%s\n\n{"txt": "x"}\n' "$good" > "$tmp/nokey.jsonl"
expect_bad "$tmp/nokey.jsonl" 'nokey.jsonl:3: no key "text"'
printf '{"text": 12}\n' > "$tmp/number.jsonl"
expect_bad "$tmp/number.jsonl" 'number.jsonl:1: "text" is a number, not a string'
printf '[1, 2]\n' > "$tmp/array.jsonl"
expect_bad "$tmp/array.jsonl" "array.jsonl:1: not a JSON object (an array)"
printf '%s {"text": "y"}\n' "$good" > "$tmp/two.jsonl"
expect_bad "$tmp/two.jsonl" "two.jsonl:1: text after the JSON value"
printf '%s\n{"text": "caf\xc3 au lait"}\n' "$good" > "$tmp/utf8.jsonl"
expect_bad "$tmp/utf8.jsonl" "utf8.jsonl:2: invalid UTF-8 (byte 0xC3 at byte 3 of the text)"
printf 'line one\nline \xff two\n' > "$tmp/utf8.txt"
expect_bad "$tmp/utf8.txt" "utf8.txt:2: invalid UTF-8 (byte 0xFF"
printf '%s\n' "$good" > "$tmp/forced.txt"
printf 'not json\n' >> "$tmp/forced.txt"
expect_bad "$tmp/forced.txt" "forced.txt:2: malformed JSON" --input-format jsonl
head -c $(( $(stat -c %s "$tmp/docs.jsonl.gz") / 2 )) "$tmp/docs.jsonl.gz" > "$tmp/cut.jsonl.gz"
expect_bad "$tmp/cut.jsonl.gz" "truncated gzip stream"
head -c $(( $(stat -c %s "$tmp/docs.jsonl.zst") / 2 )) "$tmp/docs.jsonl.zst" > "$tmp/cut.jsonl.zst"
expect_bad "$tmp/cut.jsonl.zst" "truncated zstd stream"
printf 'plain text, not gzip\n' > "$tmp/fake.jsonl.gz"
expect_bad "$tmp/fake.jsonl.gz" "fake.jsonl.gz:1: corrupt gzip data"
say "bad documents: malformed JSON, missing key, non-string value, not an object, trailing" \
    "text, invalid UTF-8 (JSON and text), truncated .gz/.zst, not gzip: exit 2 with FILE:LINE"

# --skip-bad: 3 good + 4 bad lines, then a truncated file: counted, the rest kept.
{
    printf '{"text": "one"}\n{"text": 1}\nnot json\n{"text": "two"}\n{"nope": ""}\n'
    printf '{"text": "bad \xff"}\n{"text": "three"}\n'
} > "$tmp/mixed.jsonl"
"$trident" prepare-data --tokenizer gpt2 --input "$tmp/mixed.jsonl" "$tmp/cut.jsonl.gz" --skip-bad \
    --out "$tmp/skip" > "$tmp/skip.log" 2>&1 || fail "--skip-bad: $(cat "$tmp/skip.log")"
grep -q "skipped 5 bad documents (--skip-bad):" "$tmp/skip.log" || fail "--skip-bad count: $(cat "$tmp/skip.log")"
for place in 'mixed.jsonl:2: "text" is a number' "mixed.jsonl:3: malformed JSON" 'mixed.jsonl:5: no key' \
             "mixed.jsonl:6: invalid UTF-8" "cut.jsonl.gz:[0-9]*: truncated gzip stream"; do
    grep -q "/$place" "$tmp/skip.log" || fail "--skip-bad: no '$place' in: $(cat "$tmp/skip.log")"
done
# The complete lines before the cut are kept: as many documents as in the
# plain file's lines before the line the error names.
cut_line=$(grep -o 'cut.jsonl.gz:[0-9]*' "$tmp/skip.log" | cut -d: -f2)
n=$(grep -o 'train [^ ]*: [0-9]* documents' "$tmp/skip.log" | awk '{ print $3 }')
[[ $cut_line -ge 2 && $n -eq $(( 3 + cut_line - 1 )) ]] ||
    fail "--skip-bad kept $n documents, the cut is at line $cut_line: $(cat "$tmp/skip.log")"
# The same with two threads: the same dataset, counts and places.
"$trident" prepare-data --tokenizer gpt2 --input "$tmp/mixed.jsonl" "$tmp/cut.jsonl.gz" --skip-bad \
    --workers 2 --out "$tmp/skip2" > "$tmp/skip2.log" 2>&1 || fail "--skip-bad --workers 2: $(cat "$tmp/skip2.log")"
cmp -s "$tmp/skip.bin" "$tmp/skip2.bin" && cmp -s "$tmp/skip.idx" "$tmp/skip2.idx" &&
    diff <(grep '^  /' "$tmp/skip.log") <(grep '^  /' "$tmp/skip2.log") > /dev/null ||
    fail "--skip-bad --workers 2 differs: $(cat "$tmp/skip2.log")"
say "--skip-bad: 5 bad documents counted and shown, $n good ones kept (3 + $((cut_line - 1)) before the cut), also with --workers 2"

# ---- 4. progress ---------------------------------------------------------------

"$trident" prepare-data --tokenizer gpt2 --input "$tmp/docs.jsonl.zst" --out "$tmp/prog" --progress \
    > /dev/null 2> "$tmp/prog.err" || fail "--progress: $(cat "$tmp/prog.err")"
grep -Eq "^prepare-data: 12 documents, [0-9.]+ / [0-9.]+ MiB \(100%\), [0-9.]+ MiB/s, [0-9]+ tokens/s$" "$tmp/prog.err" ||
    fail "--progress: no final progress line: $(cat "$tmp/prog.err")"
say "--progress: $(tail -1 "$tmp/prog.err")"

# ---- 5. train refuses ids outside model.vocab ------------------------------------

sed "s#runs/tiny#$tmp/run#" configs/tiny.yaml > "$tmp/tiny.yaml"
set +e
"$trident" train "$tmp/tiny.yaml" --set data.path="$tmp/brown_cl100k_base" \
    --set data.val_path="$tmp/brown_cl100k_base" > "$tmp/train.log" 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "train on cl100k_base data with model.vocab 50257: exit $rc: $(tail -5 "$tmp/train.log")"
grep -q "is outside model.vocab = 50257 (ids 0..50256; the dataset holds int32 tokens)" "$tmp/train.log" &&
    grep -q "set model.vocab to that tokenizer's vocabulary" "$tmp/train.log" ||
    fail "train: unclear message: $(cat "$tmp/train.log")"
[[ ! -e $tmp/run ]] || fail "the refused run wrote $tmp/run"
say "train: cl100k_base data with model.vocab 50257 refused at start-up (exit 2)"
