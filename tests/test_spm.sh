#!/usr/bin/env bash
# The SentencePiece tokenizer against its reference, Debian's spm_encode and
# spm_decode, on models that spm_train makes here from the Brown Corpus text
# (scripts/get_corpus.sh writes it): a unigram model with user-defined and
# control symbols, a BPE model with byte fallback, and a word model of
# 70,000 pieces (above 65,536: int32 tokens).  For each model:
#   1. the whole corpus line by line: every line of every document as a
#      document of its own (a JSON line; blank lines are empty documents)
#      through prepare-data, against spm_encode of the same lines (which
#      encodes line by line): every token, and the EOT after each;
#   2. the whole corpus document by document: the 500 files through
#      prepare-data, against spm_encode of each file with its line breaks
#      as spaces, which is what the models' normalizer (nmt_nfkc) makes of
#      them;
#   3. edge cases through `trident tokenize` (empty text, runs of spaces,
#      digits and letters, ill-formed UTF-8 and encoded surrogates, control
#      characters, special and user-defined symbols in the text, non-ASCII),
#      and their decoding (`trident tokenize --decode`) against spm_decode.
# Then: the token width (uint16 up to 65,536 ids, int32 above, which llm.c
# shards refuse), --workers, `trident generate --tokenizer FILE.model` on a
# model trained 2 steps on SentencePiece tokens, and bad models and inputs
# (exit 2 naming the file).
set -euo pipefail

root=${TRIDENT_SOURCE_ROOT:-$(pwd)}
cd "$root"
trident=${TRIDENT:-build/trident}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

fail() { echo "test_spm: FAIL: $*" >&2; exit 1; }
for t in spm_train spm_encode spm_decode python3; do
    command -v $t >/dev/null || fail "$t is missing (scripts/install_deps.sh installs it)"
done
[[ -x $trident ]] || fail "no trident binary at $trident"
compgen -G "data/brown/txt/c*" >/dev/null || fail "no Brown corpus text (run scripts/get_corpus.sh)"

tmp=$(mktemp -d /tmp/trd_spm.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS

# The training text, and every line of every document as a text file and a
# JSON lines file (the same lines, in the same order).
cat data/brown/txt/c* > "$tmp/brown.txt"
python3 - "$tmp" data/brown/txt/c* <<'PY'
import json, sys
tmp, files = sys.argv[1], sys.argv[2:]
with open(f"{tmp}/lines.txt", "w", encoding="utf-8", newline="") as txt, \
     open(f"{tmp}/lines.jsonl", "w", encoding="utf-8", newline="") as js:
    for f in files:
        text = open(f, encoding="utf-8", newline="").read()
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        for line in lines:
            txt.write(line + "\n")
            js.write(json.dumps({"text": line}) + "\n")
PY
for f in data/brown/txt/c*; do tr '\n' ' ' < "$f"; echo; done > "$tmp/docs_as_lines.txt"

train() { # name spm_train options...
    local name=$1
    shift
    spm_train --input="$tmp/brown.txt" --model_prefix="$tmp/$name" --num_threads=2 \
        --minloglevel=2 "$@" > "$tmp/$name.train.log" 2>&1 ||
        { cat "$tmp/$name.train.log" >&2; fail "spm_train $name"; }
}
train unigram --model_type=unigram --vocab_size=8000 --input_sentence_size=15000 \
    --shuffle_input_sentence=false \
    --user_defined_symbols='<sep>,<cls>,@@' --control_symbols='<ctl>'
train bpe --model_type=bpe --vocab_size=8000 --byte_fallback=true --user_defined_symbols='<sep>'
train word --model_type=word --vocab_size=70000
echo "test_spm: trained 3 models in $((SECONDS - t0)) s"

# Compare a prepare-data dataset with spm_encode's ids, one reference line
# per document, each document followed by EOT; the dtype must be the one
# the vocabulary asks for.
compare() { # prefix reference-ids eot vocab what
    python3 - "$@" <<'PY'
import struct, sys
prefix, ref_path, eot, vocab, what = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
idx = open(prefix + ".idx", "rb").read()
code, S = idx[17], struct.unpack("<Q", idx[18:26])[0]
want = 4 if vocab > 65536 else 8
if code != want:
    sys.exit(f"{what}: dtype code {code}, expected {want} for vocabulary {vocab}")
lens = struct.unpack(f"<{S}i", idx[34:34 + 4 * S])
data = open(prefix + ".bin", "rb").read()
size = 4 if code == 4 else 2
toks = struct.unpack(f"<{len(data) // size}{'i' if size == 4 else 'H'}", data)
ref = [[int(x) for x in l.split()] for l in open(ref_path)]
if len(ref) != S:
    sys.exit(f"{what}: {S} documents, the reference has {len(ref)} lines")
o = bad = 0
for d, n in enumerate(lens):
    got, exp = list(toks[o:o + n]), ref[d] + [eot]
    o += n
    if got != exp:
        bad += 1
        if bad <= 3:
            k = next((j for j in range(min(len(got), len(exp))) if got[j] != exp[j]), min(len(got), len(exp)))
            print(f"{what}: document {d} differs at token {k}: trident {got[max(0, k - 3):k + 4]}, "
                  f"spm_encode {exp[max(0, k - 3):k + 4]}", file=sys.stderr)
if bad or o != len(toks):
    sys.exit(f"{what}: {bad} of {S} documents differ")
print(f"test_spm: {what}: {S} documents, {len(toks)} tokens equal (max id {max(toks)})")
PY
}

# ids of a file for trident (as is) and spm_encode (one line: the text and
# a newline); both must give the same line.
printf '' > "$tmp/case.empty"
printf '%*s' 5000 '' > "$tmp/case.spaces"
printf '  a   b    c  ' > "$tmp/case.spaces2"
python3 -c 'import sys; sys.stdout.write("1234567890" * 300)' > "$tmp/case.digits"
printf 'x 2024 3.14159 1,000,000 007 42nd' > "$tmp/case.numbers"
python3 -c 'import sys; sys.stdout.write("a" * 3000 + " " + "ab" * 1000)' > "$tmp/case.letters"
printf 'a\xffb \xc3 c\xe2\x82 \xed\xa0\x80 \xed\xbf\xbf \xf4\x90\x80\x80 \xc0\x80 \x80end' > "$tmp/case.badutf8"
printf 'tab\there\x01\x7f ctl\rcr' > "$tmp/case.control"
printf '</s> <s> <unk> <ctl> <sep>x<cls>@@y <sep><sep> a<sep>b' > "$tmp/case.special"
printf 'caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80 se\xcc\x81 \xef\xac\x81 \xe2\x85\xab' > "$tmp/case.unicode"

failures=0
for m in unigram bpe word; do
    before=$failures
    model=$tmp/$m.model
    vocab=$(spm_export_vocab --model="$model" | wc -l)
    eot=$(echo | spm_encode --model="$model" --output_format=id --extra_options=eos)

    # 1. line by line
    spm_encode --model="$model" --output_format=id < "$tmp/lines.txt" > "$tmp/$m.lines.ref"
    "$trident" prepare-data --input "$tmp/lines.jsonl" --tokenizer sentencepiece \
        --model "$model" --out "$tmp/$m.lines" > "$tmp/$m.lines.log" ||
        { cat "$tmp/$m.lines.log"; fail "$m: prepare-data of the lines"; }
    grep -q "sentencepiece tokenizer (vocab $vocab, EOT $eot)" "$tmp/$m.lines.log" ||
        fail "$m: expected vocab $vocab and EOT $eot: $(head -1 "$tmp/$m.lines.log")"
    compare "$tmp/$m.lines" "$tmp/$m.lines.ref" "$eot" "$vocab" "$m, the corpus line by line" ||
        failures=$((failures + 1))

    # 2. document by document
    spm_encode --model="$model" --output_format=id < "$tmp/docs_as_lines.txt" > "$tmp/$m.docs.ref"
    "$trident" prepare-data --input data/brown/txt --tokenizer sentencepiece --model "$model" \
        --out "$tmp/$m.docs" > "$tmp/$m.docs.log" ||
        { cat "$tmp/$m.docs.log"; fail "$m: prepare-data of the documents"; }
    compare "$tmp/$m.docs" "$tmp/$m.docs.ref" "$eot" "$vocab" "$m, the corpus document by document" ||
        failures=$((failures + 1))

    # 3. edge cases, encoded and decoded
    for c in "$tmp"/case.*; do
        name=${c##*.}
        got=$("$trident" tokenize --tokenizer sentencepiece --model "$model" "$c")
        exp=$(cat "$c" <(echo) | spm_encode --model="$model" --output_format=id)
        if [[ "$got" != "$exp" ]]; then
            echo "test_spm: $m: case $name: trident '${got:0:200}', spm_encode '${exp:0:200}'" >&2
            failures=$((failures + 1))
            continue
        fi
        "$trident" tokenize --tokenizer sentencepiece --model "$model" --decode <(echo "$got") \
            > "$tmp/dec.got"
        echo "$exp" | spm_decode --model="$model" --input_format=id > "$tmp/dec.exp"
        if ! cmp -s "$tmp/dec.got" "$tmp/dec.exp"; then
            echo "test_spm: $m: case $name: decoded text differs from spm_decode's" >&2
            failures=$((failures + 1))
        fi
    done
    # a whole document's ids decode as spm_decode decodes them
    got=$("$trident" tokenize --tokenizer sentencepiece --model "$model" data/brown/txt/cg22)
    "$trident" tokenize --tokenizer sentencepiece --model "$model" --decode <(echo "$got") > "$tmp/dec.got"
    echo "$got" | spm_decode --model="$model" --input_format=id > "$tmp/dec.exp"
    cmp -s "$tmp/dec.got" "$tmp/dec.exp" ||
        { echo "test_spm: $m: decoding cg22 differs from spm_decode" >&2; failures=$((failures + 1)); }
    [ "$failures" -gt "$before" ] ||
        echo "test_spm: $m: $(ls "$tmp"/case.* | wc -l) edge cases and cg22 encode and decode as the reference"
done
[ "$failures" -eq 0 ] || fail "$failures comparisons with the reference failed (above)"

# The special pieces: control symbols (and </s>, <s>) in text are text, a
# user-defined symbol is its own piece wherever it stands.
piece_id() { spm_export_vocab --model="$tmp/unigram.model" | awk -F'\t' -v p="$1" '$1 == p { print NR - 1 }'; }
ids=" $("$trident" tokenize --tokenizer sentencepiece --model "$tmp/unigram.model" "$tmp/case.special") "
for p in '<s>' '</s>' '<ctl>'; do
    id=$(piece_id "$p")
    [[ -n $id && $ids != *" $id "* ]] || fail "unigram: control piece $p (id $id) produced from text:$ids"
done
for p in '<sep>' '<cls>' '@@'; do
    id=$(piece_id "$p")
    [[ -n $id && $ids == *" $id "* ]] || fail "unigram: user-defined piece $p (id $id) not in:$ids"
done

# Chat templates (prepare-data --template): <s>, </s> and the control
# symbol <ctl> in a template are their ids, in a message text; the
# user-defined <sep> is its piece anywhere.  Against tests/chat_data_check.py's
# rendering with spm_encode (no line breaks: it encodes line by line).
cat > "$tmp/chat.jsonl" <<'EOF'
{"prompt": "Translate to French: cheese", "completion": " fromage"}
{"messages": [{"role": "user", "content": "Peru? <sep> <ctl> </s>"}, {"role": "assistant", "content": "Lima."}, {"role": "user", "content": "And Chile?"}, {"role": "assistant", "content": "Santiago, café."}]}
EOF
cat > "$tmp/chat_tmpl.json" <<'EOF'
{"bos": "<s>", "user": {"prefix": "<ctl>Q: ", "suffix": " <sep>"}, "assistant": {"prefix": "A:", "suffix": "</s><ctl>"}}
EOF
for t in llama2 "$tmp/chat_tmpl.json"; do
    "$trident" prepare-data --input "$tmp/chat.jsonl" --tokenizer sentencepiece \
        --model "$tmp/unigram.model" --template "$t" --out "$tmp/chat" > "$tmp/chat.log" 2>&1 ||
        { cat "$tmp/chat.log"; fail "prepare-data --template $t"; }
    /usr/bin/python3 tests/chat_data_check.py "$tmp/chat.jsonl" "$tmp/chat" "$t" spm \
        "$tmp/unigram.model" '<s>,</s>,<ctl>' || fail "chat template $t"
done

# Token width: the word model's ids go past 65535 (int32, checked above);
# llm.c shards are uint16 and refuse it.
rc=0
"$trident" prepare-data --input data/brown/txt/ca01 --tokenizer sentencepiece \
    --model "$tmp/word.model" --format llmc --out "$tmp/llmc" > "$tmp/llmc.log" 2>&1 || rc=$?
[[ $rc -eq 2 ]] && grep -q "llm.c shards hold uint16 tokens" "$tmp/llmc.log" ||
    { cat "$tmp/llmc.log"; fail "--format llmc with a vocabulary of 70000: exit $rc, expected 2"; }
grep -q "int32 tokens" "$tmp/word.lines.log" || fail "the word model's dataset is not int32"
grep -q "uint16 tokens" "$tmp/unigram.lines.log" || fail "the unigram model's dataset is not uint16"

# --workers: the same dataset.
"$trident" prepare-data --input "$tmp/lines.jsonl" --tokenizer sentencepiece \
    --model "$tmp/bpe.model" --workers 2 --out "$tmp/bpe.w2" > /dev/null
cmp "$tmp/bpe.w2.bin" "$tmp/bpe.lines.bin" && cmp "$tmp/bpe.w2.idx" "$tmp/bpe.lines.idx" ||
    fail "--workers 2 gives another dataset"

# A model trained on SentencePiece tokens generates with its .model: the
# prompt's ids are spm_encode's, the text printed is spm_decode's of prompt
# and continuation, past the prompt's text (with the space the
# continuation's first piece starts with).
timeout 300 "$trident" train configs/tiny.yaml --set model.layers=2 --set model.hidden=64 \
    --set model.heads=4 --set model.seq_len=64 --set model.vocab=8000 --set training.steps=2 \
    --set data.path="$tmp/bpe.docs" --set data.val_path= --set data.val_every=0 \
    --set run.dir="$tmp/run" > "$tmp/train.log" 2>&1 || { tail -5 "$tmp/train.log"; fail "train on bpe.docs"; }
gen=("$trident" generate "$tmp/run/ckpt" --prompt "The jury said" --max-new-tokens 8 --tokenizer "$tmp/bpe.model")
ids=$("${gen[@]}" --ids 2>/dev/null)
[[ ${ids%% | *} == "$(echo "The jury said" | spm_encode --model="$tmp/bpe.model" --output_format=id)" ]] ||
    fail "generate: prompt ids '${ids%% | *}' are not spm_encode's"
all=$(echo "${ids/ | / }" | spm_decode --model="$tmp/bpe.model" --input_format=id)
text=$("${gen[@]}" 2>/dev/null)
[[ "The jury said$text" == "$all" ]] || fail "generate printed '$text'; spm_decode of all ids: '$all'"
echo "test_spm: generate with --tokenizer FILE.model: '$text'"

# Bad input: exit 2 and a message naming the file.
expect_bad() { # what pattern command...
    local what=$1 pattern=$2 rc=0
    shift 2
    "$@" > "$tmp/bad.log" 2>&1 || rc=$?
    [[ $rc -eq 2 ]] && grep -q -- "$pattern" "$tmp/bad.log" ||
        { cat "$tmp/bad.log"; fail "$what: exit $rc (expected 2) or no '$pattern'"; }
}
head -c 100000 "$tmp/brown.txt" > "$tmp/small.txt"
spm_train --input="$tmp/small.txt" --model_prefix="$tmp/noeos" --vocab_size=300 --eos_id=-1 \
    --minloglevel=2 > /dev/null 2>&1 || fail "spm_train noeos"
printf 'not a model' > "$tmp/garbage.model"
printf 'caf\xc3 \n' > "$tmp/bad_utf8.txt"
tok=(--tokenizer sentencepiece --model)
expect_bad "missing model" "$tmp/missing.model" "$trident" tokenize "${tok[@]}" "$tmp/missing.model" "$tmp/small.txt"
expect_bad "not a model" "$tmp/garbage.model: not a SentencePiece model" "$trident" tokenize "${tok[@]}" "$tmp/garbage.model" "$tmp/small.txt"
expect_bad "model without eos" "$tmp/noeos.model has no end-of-sentence piece" \
    "$trident" prepare-data --input "$tmp/small.txt" "${tok[@]}" "$tmp/noeos.model" --out "$tmp/x"
expect_bad "no --model" "needs --model" "$trident" prepare-data --input "$tmp/small.txt" --tokenizer sentencepiece --out "$tmp/x"
expect_bad "--model without sentencepiece" "--model is for --tokenizer sentencepiece" \
    "$trident" tokenize --tokenizer gpt2 --model "$tmp/bpe.model" "$tmp/small.txt"
expect_bad "ill-formed UTF-8 in prepare-data" "bad_utf8.txt:1: invalid UTF-8 (byte 0xC3 at byte 3" \
    "$trident" prepare-data --input "$tmp/bad_utf8.txt" "${tok[@]}" "$tmp/bpe.model" --out "$tmp/x"
[[ ! -e $tmp/x.bin && ! -e $tmp/x.bin.tmp ]] || fail "a refused prepare-data left a dataset behind"
expect_bad "--decode of a non-id" "'x7' is not a token id" \
    "$trident" tokenize "${tok[@]}" "$tmp/bpe.model" --decode <(echo "5 x7")
# An id outside the vocabulary decodes as U+FFFD.
out=$("$trident" tokenize "${tok[@]}" "$tmp/bpe.model" --decode <(echo "-1 8000"))
[[ $out == $'\xef\xbf\xbd\xef\xbf\xbd' ]] || fail "ids outside the vocabulary decode as '$out'"

echo "test_spm: all checks passed in $((SECONDS - t0)) s"
