#!/usr/bin/env bash
# Instruction and chat data (prepare-data --template, docs/data.md):
# 1. the dataset and its loss mask, read with numpy, equal an independent
#    rendering (tests/chat_data_check.py: each template written from its
#    model card, tokenized by the reference encoders: UTF-8 bytes, npm
#    gpt-3-encoder, npm js-tiktoken with its special tokens), for
#    prompt/completion and chat examples and every template;
# 2. a masked token's loss does not count: on data whose every window
#    trains one target, the validation loss is that one token's
#    cross-entropy computed in numpy from the exported model
#    (tests/hf_export_check.py's forward), and metrics.jsonl counts one
#    trained token per sequence, also across a resume;
# 3. prepare-data under mpiexec writes what one process writes; with the
#    masks, every layout (dp 2 with ZeRO 1; tp 2 with sequence
#    parallelism x pp 2) trains the curve of one rank (fp32, 1e-5) and
#    counts the same trained tokens, fewer than the batch holds;
# 4. bad input exits 2 naming the file and line: an unknown or missing
#    role, an empty completion, a template that cannot render the example,
#    a bad template, a mask that does not match its tokens.
. "$(dirname "$0")/e2e.sh"
py=/usr/bin/python3 # Debian's, with numpy and h5py (scripts/install_deps.sh)
"$py" -c 'import numpy, h5py' 2>/dev/null ||
    { echo "skip: $py lacks numpy or h5py (scripts/install_deps.sh installs them)"; exit 77; }
gpt2_pkg=$PWD/.cache/npm/node_modules/gpt-3-encoder
tik_pkg=$PWD/.cache/npm-tiktoken/node_modules/js-tiktoken
command -v node >/dev/null || { echo "FAIL: node is not installed (scripts/install_deps.sh)"; exit 1; }
scripts/get_tiktoken.sh >/dev/null || { echo "FAIL: scripts/get_tiktoken.sh failed"; exit 1; }

# ---- 1. the rendering ------------------------------------------------------
cat > "$out/ex.jsonl" <<'EOF'
{"prompt": "Translate to French: cheese", "completion": " fromage"}
{"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Capital of Peru?"}, {"role": "assistant", "content": "Lima."}, {"role": "user", "content": "And of Chile?"}, {"role": "assistant", "content": "Santiago — naïve café ☕."}]}

{"messages": [{"role": "user", "content": "Say <|im_start|> and <|endofprompt|> and </s>"}, {"role": "assistant", "content": "<|im_end|> stays text"}, {"role": "user", "content": "thanks"}]}
{"prompt": "", "completion": "Hello world\n"}
EOF
# A template of one's own (Zephyr's markers; with cl100k_base, two of its
# special tokens, which must become their ids).
cat > "$out/own.json" <<'EOF'
{"bos": "<s>", "system": {"prefix": "<|system|>\n", "suffix": "</s>\n"},
 "user": {"prefix": "<|fim_prefix|>\n", "suffix": "</s>\n", "prefix_after_system": "<|user|>\n"},
 "assistant": {"prefix": "<|assistant|>\n", "suffix": "<|endofprompt|>"}}
EOF
check() { # tokenizer-args... -- template tokenizer-name [pkg]
    local args=()
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    "$TRIDENT" prepare-data --input "$out/ex.jsonl" "${args[@]}" --template "$1" --out "$out/ds" \
        > "$out/prep.log" 2>&1 || { echo "FAIL: prepare-data $1 $2"; cat "$out/prep.log"; fails=$((fails + 1)); return; }
    "$py" tests/chat_data_check.py "$out/ex.jsonl" "$out/ds" "$@" || fails=$((fails + 1))
}
for t in plain chatml llama2 llama3 "$out/own.json"; do
    check --tokenizer byte -- "$t" byte
done
check --tokenizer gpt2 -- chatml gpt2 "$gpt2_pkg"
check --tokenizer tiktoken -- "$out/own.json" cl100k_base "$tik_pkg"
# (the last one: <|fim_prefix|> 100258 before the 5 user turns not after a
# system turn, <|endofprompt|> 100276 after the 5 assistant turns)
"$py" -c 'import numpy as np, sys; t = np.fromfile(sys.argv[1], np.int32)
sys.exit(0 if (t == 100258).sum() == 5 and (t == 100276).sum() == 5 else 1)' "$out/ds.bin" &&
    echo "ok   the template's special tokens are cl100k_base's ids" ||
    { echo "FAIL: <|fim_prefix|> / <|endofprompt|> are not ids 100258 / 100276"; fails=$((fails + 1)); }

# ---- 2. a masked token's loss does not count ------------------------------
# Examples of exactly seq_len = 32 bytes, all alike: every window is the
# same, and its only trained target is the assistant's "x".
"$py" -c 'import json
for _ in range(40):
    print(json.dumps({"messages": [{"role": "user", "content": "abcdefghij"},
        {"role": "assistant", "content": "x"}, {"role": "user", "content": "klmnopqrstuvwxyz0123"}]}))' \
    > "$out/one.jsonl"
"$TRIDENT" prepare-data --input "$out/one.jsonl" --tokenizer byte --template plain --out "$out/one" \
    > "$out/prep.log" 2>&1 || { echo "FAIL: prepare-data one"; cat "$out/prep.log"; exit 1; }
small=(--set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set model.vocab=257 --set training.warmup_steps=0 --set training.global_batch=2
       --set training.micro_batch=1 --set data.path="$out/one" --set data.val_path="$out/one"
       --set data.val_sequences=2 --set run.log_every=100)
run one 1 --set training.steps=1 --set checkpoint.dir="$out/one/ckpt"
"$TRIDENT" ckpt export --format hf --out "$out/one.hf" "$out/one/ckpt" > "$out/export.log" 2>&1 ||
    { echo "FAIL: ckpt export"; cat "$out/export.log"; fails=$((fails + 1)); }
"$py" - "$out/one.hf" "$out/one" "$out/one/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
import numpy as np
sys.path.insert(0, "tests")
from hf_export_check import cross_entropy, hf_forward, load_hf
hf, prefix, metrics = sys.argv[1:4]
cfg, t, _, _ = load_hf(hf)
T = cfg["n_positions"]
tokens = np.fromfile(prefix + ".bin", np.uint16).astype(np.int64)
mask = np.fromfile(prefix + ".mask", np.uint8)
window, m = tokens[:T + 1], mask[1:T + 1]  # target t is token t+1: its mask byte
k = int(np.flatnonzero(m)[0]) if m.sum() == 1 else sys.exit("FAIL: not one trained target")
logits = hf_forward(cfg, t, window[:T])
one = cross_entropy(logits[k:k + 1], window[k + 1:k + 2])
every = cross_entropy(logits, window[1:])
r = json.loads(open(metrics).readlines()[-1])
rel = abs(r["val_loss"] - one) / one
ok = rel < 1e-5 and abs(every - one) > 1e-3 and r["trained_tokens"] == 2
print(f"{'ok  ' if ok else 'FAIL'} val_loss {r['val_loss']} = the one trained token's loss "
      f"{one:.7g} (rel {rel:.1e}; all {T} tokens: {every:.7g}); trained_tokens "
      f"{r['trained_tokens']} (2 sequences, one each)")
sys.exit(0 if ok else 1)
PY
# A resume counts the trained tokens of the steps before it.
run one 1 --set training.steps=3 --set checkpoint.dir="$out/one/ckpt"
"$py" -c 'import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
got = [(x["step"], x["trained_tokens"], x["trained_tokens_total"]) for x in r]
sys.exit(0 if got == [(1, 2, 2), (2, 2, 4), (3, 2, 6)] else f"FAIL: trained tokens {got}")' \
    "$out/one/metrics.jsonl" && echo "ok   trained_tokens_total continues across a resume" ||
    fails=$((fails + 1))

# ---- 3. every layout trains the same curve with the masks ------------------
"$py" - "$out/chat.jsonl" <<'PY'
import glob, json, re, sys
ss = []
for path in sorted(glob.glob("data/brown/txt/c*"))[:4]:
    ss += [s for s in re.split(r"(?<=[.!?])\s+", open(path).read()) if 3 <= len(s.split()) <= 12]
with open(sys.argv[1], "w") as f:
    for i in range(0, len(ss) - 3, 3):
        if i % 2:
            f.write(json.dumps({"prompt": ss[i], "completion": " " + ss[i + 1]}) + "\n")
        else:
            f.write(json.dumps({"messages": [
                {"role": "system", "content": "Go on."}, {"role": "user", "content": ss[i]},
                {"role": "assistant", "content": ss[i + 1]}, {"role": "user", "content": ss[i + 2]},
                {"role": "assistant", "content": "Yes."}]}) + "\n")
PY
"$TRIDENT" prepare-data --input "$out/chat.jsonl" --tokenizer byte --template chatml --out "$out/chat" \
    > "$out/prep.log" 2>&1 || { echo "FAIL: prepare-data chat"; cat "$out/prep.log"; exit 1; }
# Under mpiexec the ranks share the examples; the dataset, its validation
# split and their masks are those of one process, byte for byte.
"$TRIDENT" prepare-data --input "$out/chat.jsonl" --tokenizer byte --template llama3 --val-every 3 \
    --out "$out/p1" > "$out/prep.log" 2>&1 &&
    timeout 120 mpiexec -n 2 "$TRIDENT" prepare-data --input "$out/chat.jsonl" --tokenizer byte \
        --template llama3 --val-every 3 --out "$out/p2" > "$out/prep2.log" 2>&1 ||
    { echo "FAIL: prepare-data --val-every 3, 1 and 2 processes"; cat "$out/prep.log" "$out/prep2.log"; exit 1; }
same=1
for f in .bin .idx .mask _val.bin _val.idx _val.mask; do
    cmp -s "$out/p1$f" "$out/p2$f" || { echo "FAIL: mpiexec -n 2 wrote another p2$f"; same=0; }
done
[ "$same" = 1 ] && [ -s "$out/p2_val.mask" ] && [ ! -e "$out/p2.rank00000.tmp.mask" ] &&
    echo "ok   mpiexec -n 2 prepare-data --template: the same dataset, split and masks" ||
    fails=$((fails + 1))
small=(--set checkpoint.dir= --set model.layers=2 --set model.hidden=64 --set model.heads=4
       --set model.seq_len=64 --set model.vocab=257 --set training.steps=6
       --set training.warmup_steps=2 --set training.lr=1e-3 --set training.global_batch=4
       --set training.micro_batch=1 --set data.path="$out/chat" --set data.val_path=
       --set run.log_every=100 --set data.document_mask=true --set data.eot=256)
run chat 1
run chat_dp2_zero1 2 --set topology.dp=2 --set topology.zero=1
curves chat chat_dp2_zero1 --steps 6 --norm-rtol 1e-4
run chat_tp2_sp_pp2 4 --set topology.tp=2 --set topology.sequence_parallel=true --set topology.pp=2
curves chat chat_tp2_sp_pp2 --steps 6 --norm-rtol 1e-4
"$py" - "$out" <<'PY' || fails=$((fails + 1))
import json, sys
d = sys.argv[1]
counts = {n: [json.loads(l)["trained_tokens"] for l in open(f"{d}/{n}/metrics.jsonl")]
          for n in ["chat", "chat_dp2_zero1", "chat_tp2_sp_pp2"]}
ref = counts["chat"]
ok = all(c == ref for c in counts.values()) and len(ref) == 6 and all(0 < c < 4 * 64 for c in ref)
print(f"{'ok  ' if ok else 'FAIL'} trained tokens per step {ref} of 4 x 64 on every layout: "
      f"{counts}")
sys.exit(0 if ok else 1)
PY

# ---- 4. bad input ------------------------------------------------------------
bad() { # what expected-message template jsonl-line
    printf '%s\n' '{"prompt": "a", "completion": "b"}' "$4" > "$out/bad.jsonl"
    "$TRIDENT" prepare-data --input "$out/bad.jsonl" --tokenizer byte --template "$3" \
        --out "$out/bad" > "$out/bad.log" 2>&1
    local rc=$?
    if [ "$rc" -eq 2 ] && grep -qF -- "$2" "$out/bad.log" && [ ! -e "$out/bad.bin" ]; then
        echo "ok   $1: exit 2"
    else
        echo "FAIL: $1: exit $rc, expected 2 and '$2'"; cat "$out/bad.log"; fails=$((fails + 1))
    fi
}
bad "unknown role" "bad.jsonl:2: message 0: unknown role \"bot\"" chatml \
    '{"messages": [{"role": "bot", "content": "hi"}]}'
bad "no role" "bad.jsonl:2: message 1 has no \"role\"" chatml \
    '{"messages": [{"role": "user", "content": "hi"}, {"content": "hello"}]}'
bad "empty completion" "bad.jsonl:2: empty completion" llama3 '{"prompt": "hi", "completion": ""}'
bad "no completion" "bad.jsonl:2: the example has no \"completion\"" llama3 '{"prompt": "hi"}'
bad "neither kind" "bad.jsonl:2: neither \"messages\"" chatml '{"text": "hi"}'
bad "no assistant turn" "bad.jsonl:2: no assistant message" chatml \
    '{"messages": [{"role": "user", "content": "hi"}]}'
printf '%s\n' '{"assistant": {"prefix": "A: ", "suffix": "\n"}, "user": {"prefix": "Q: "}}' \
    > "$out/nosys.json"
bad "template without the role" "bad.jsonl:2: message 0: the chat template $out/nosys.json has no \"system\" role" \
    "$out/nosys.json" '{"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}'
printf '%s\n' '{"user": {"prefix": "Q: ", "sufix": "\n"}, "assistant": {}}' > "$out/typo.json"
bad "template key" "unknown key \"sufix\" in \"user\"" "$out/typo.json" '{"prompt": "a", "completion": "b"}'
bad "template name" "unknown chat template 'chatml2'" chatml2 '{"prompt": "a", "completion": "b"}'
# A mask that does not match its tokens: training refuses it.
head -c 100 "$out/chat.mask" > "$out/short.mask"
cp "$out/chat.bin" "$out/short.bin" && cp "$out/chat.idx" "$out/short.idx"
"$TRIDENT" train configs/tiny.yaml "${small[@]}" --set run.dir="$out/short" \
    --set data.path="$out/short" > "$out/short.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "short.mask does not match its tokens: 100 bytes" "$out/short.log"; then
    echo "ok   a mask shorter than its tokens: exit 2"
else
    echo "FAIL: a short mask: exit $rc"; cat "$out/short.log"; fails=$((fails + 1))
fi

echo "chat_data: $fails failed"
[ "$fails" -eq 0 ]
