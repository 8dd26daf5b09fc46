#!/usr/bin/python3
"""Check a `prepare-data --template` dataset against an independent rendering.

  chat_data_check.py EXAMPLES.jsonl PREFIX TEMPLATE TOKENIZER [NODE_PKG]
  chat_data_check.py EXAMPLES.jsonl PREFIX TEMPLATE spm MODEL CONTROL[,CONTROL...]

EXAMPLES.jsonl: the examples given to prepare-data; PREFIX: its --out.
TEMPLATE: plain, chatml, llama2, llama3 or a FILE.json (read here with
json); TOKENIZER: byte (ids = the UTF-8 bytes, EOT 256), gpt2 (npm
gpt-3-encoder at NODE_PKG, EOT 50256) or cl100k_base (npm js-tiktoken at
NODE_PKG, EOT 100257; template text encoded with its special tokens
allowed, message text with none) or spm (Debian's spm_encode, one piece a
line, so no piece may hold a line break; in template text the CONTROL
pieces named are their ids as spm_export_vocab lists them; EOT </s>).

The chat formats are written here from their model cards (ChatML, Llama 2's
[INST] <<SYS>>, Llama 3's header ids), not from trident's tables; each
piece is tokenized on its own, as docs/data.md says trident does.  The
dataset is read with numpy (PREFIX.idx: header, int32 lengths; PREFIX.bin:
the tokens, uint16 or int32 as the .idx says; PREFIX.mask: a uint8 per
token) and must equal the rendering: every example's tokens, its mask
(assistant content and suffix 1, the closing EOT 1 when the assistant spoke
last, everything else 0) and its length in the index.
"""
import json
import subprocess
import sys

import numpy as np


def fail(msg):
    print(f"chat_data_check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def turns_chatml(msgs):
    return [(f"<|im_start|>{m['role']}\n", m, "<|im_end|>\n") for m in msgs]


def turns_llama2(msgs):
    out, after_system = [], False
    for m in msgs:
        if m["role"] == "system":
            out.append(("<s>[INST] <<SYS>>\n", m, "\n<</SYS>>\n\n"))
        elif m["role"] == "user":
            out.append(("" if after_system else "<s>[INST] ", m, " [/INST]"))
        else:
            out.append((" ", m, " </s>"))
        after_system = m["role"] == "system"
    return out


def turns_llama3(msgs):
    return [(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n", m, "<|eot_id|>")
            for m in msgs]


def turns_file(t, msgs):
    out, after_system = [], False
    for m in msgs:
        r = t[m["role"]]
        pre = r.get("prefix_after_system", r.get("prefix", "")) if after_system else r.get("prefix", "")
        out.append((pre, m, r.get("suffix", "")))
        after_system = m["role"] == "system"
    return out


def render(template, ex):
    """[(text, is_template, mask)] and the closing EOT's mask."""
    msgs = ex.get("messages") or [{"role": "user", "content": ex["prompt"]},
                                  {"role": "assistant", "content": ex["completion"]}]
    bos = ""
    if template == "plain":
        turns = [("", m, "") for m in msgs]
    elif template == "chatml":
        turns = turns_chatml(msgs)
    elif template == "llama2":
        turns = turns_llama2(msgs)
    elif template == "llama3":
        bos, turns = "<|begin_of_text|>", turns_llama3(msgs)
    else:
        t = json.load(open(template))
        bos, turns = t.get("bos", ""), turns_file(t, msgs)
    pieces = [(bos, True, 0)]
    for pre, m, suf in turns:
        a = int(m["role"] == "assistant")
        pieces += [(pre, True, 0), (m["content"], False, a), (suf, True, a)]
    return pieces, int(msgs[-1]["role"] == "assistant")


def encode_spm(model, controls, pieces):
    vocab = subprocess.run(["spm_export_vocab", f"--model={model}"], capture_output=True,
                           text=True, check=True).stdout.split("\n")
    ids = {line.split("\t")[0]: i for i, line in enumerate(vocab) if line}
    parts = []  # (piece index, text to encode or a control id)
    for k, (text, tmpl, _) in enumerate(pieces):
        if "\n" in text:
            fail(f"spm: piece {text!r} has a line break")
        while tmpl and text:
            at = [(text.find(c), c) for c in controls if c in text]
            if not at:
                break
            i, c = min(at)
            parts += [(k, text[:i]), (k, ids[c])]
            text = text[i + len(c):]
        parts.append((k, text))
    lines = [p for _, p in parts if isinstance(p, str)]
    r = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id"],
                       input="".join(l + "\n" for l in lines), capture_output=True, text=True,
                       check=True)
    encoded = iter(r.stdout.split("\n"))
    out = [[] for _ in pieces]
    for k, p in parts:
        out[k] += [p] if isinstance(p, int) else [int(x) for x in next(encoded).split()]
    return out, ids["</s>"]


def encode_all(tokenizer, pkg, pieces):
    if tokenizer == "spm":
        model, controls = pkg.split(" ", 1)
        return encode_spm(model, controls.split(","), pieces)
    if tokenizer == "byte":
        return [list(text.encode()) for text, _, _ in pieces], 256
    if tokenizer == "gpt2":
        js = ("const {encode} = require(process.argv[1]);"
              "const p = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "console.log(JSON.stringify(p.map(([t]) => t ? encode(t) : [])));")
        eot = 50256
    else:
        js = ("const {getEncoding} = require(process.argv[1]); const e = getEncoding('cl100k_base');"
              "const p = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "console.log(JSON.stringify(p.map(([t, tmpl]) => tmpl ? e.encode(t, 'all') : e.encode(t, [], []))));")
        eot = 100257
    r = subprocess.run(["node", "-e", js, pkg], input=json.dumps([p[:2] for p in pieces]),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout), eot


def read_dataset(prefix):
    idx = open(prefix + ".idx", "rb").read()
    if idx[:9] != b"MMIDIDX\x00\x00":
        fail(f"{prefix}.idx: not a Megatron index")
    dtype = {8: np.uint16, 4: np.int32}[idx[17]]
    n_seq = int(np.frombuffer(idx, np.uint64, 1, 18)[0])
    lengths = np.frombuffer(idx, np.int32, n_seq, 34)
    tokens = np.fromfile(prefix + ".bin", dtype)
    mask = np.fromfile(prefix + ".mask", np.uint8)
    return lengths, tokens.astype(np.int64), mask


def main():
    examples, prefix, template, tokenizer = sys.argv[1:5]
    pkg = " ".join(sys.argv[5:]) or None
    exs = [json.loads(l) for l in open(examples) if l.strip()]
    pieces, eot_mask, owner = [], [], []
    for i, ex in enumerate(exs):
        p, e = render(template, ex)
        pieces += p
        owner += [i] * len(p)
        eot_mask.append(e)
    ids, eot = encode_all(tokenizer, pkg, pieces)
    want_ids, want_mask, want_len = [[] for _ in exs], [[] for _ in exs], []
    for (text, _, m), i, piece_ids in zip(pieces, owner, ids):
        want_ids[i] += piece_ids
        want_mask[i] += [m] * len(piece_ids)
    lengths, tokens, mask = read_dataset(prefix)
    if len(tokens) != len(mask):
        fail(f"{prefix}: {len(tokens)} tokens, {len(mask)} mask bytes")
    if len(lengths) != len(exs):
        fail(f"{prefix}: {len(lengths)} sequences in the index, {len(exs)} examples")
    at = 0
    for i in range(len(exs)):
        want_ids[i].append(eot)
        want_mask[i].append(eot_mask[i])
        n = len(want_ids[i])
        if lengths[i] != n:
            fail(f"{prefix} example {i}: length {lengths[i]} in the index, rendered {n}")
        got, gm = tokens[at:at + n].tolist(), mask[at:at + n].tolist()
        if got != want_ids[i]:
            k = next(j for j in range(n) if got[j] != want_ids[i][j])
            fail(f"{prefix} example {i}: token {k} is {got[k]}, rendered {want_ids[i][k]}")
        if gm != want_mask[i]:
            k = next(j for j in range(n) if gm[j] != want_mask[i][j])
            fail(f"{prefix} example {i}: mask {k} is {gm[k]}, rendered {want_mask[i][k]}")
        at += n
    print(f"ok   {template} / {tokenizer}: {len(exs)} examples, {at} tokens, "
          f"{int(mask.sum())} trained, as rendered independently")


if __name__ == "__main__":
    main()
