#!/usr/bin/env bash
# Many shards and weighted blends in training (docs/data.md):
#   - data.path as a quoted glob of shards, and as a list, trains exactly
#     as the one dataset holding the same documents (bitwise: same loss
#     curve and final weights);
#   - a blend of three datasets (one of them 4 shards by a pattern, one so
#     small that it runs through several epochs) gives the same loss curve on
#     1, 2 (dp) and 8 ranks (tp2 x pp2 x dp2), and metrics.jsonl's
#     data_tokens hold each dataset's share within one sample of its weight
#     at every step;
#   - a run stopped after step 4 and resumed ends bitwise equal to the
#     uninterrupted one (the small dataset is past its first epoch by then);
#   - a blend of one dataset is that dataset (for training and validation);
#   - `trident data inspect CONFIG` prints the shares, and sample N's text
#     is a window of the dataset it names;
#   - bad blends exit 2 with the key's place.
source "$(dirname "$0")/e2e.sh"
small=(--set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.seq_len=32
       --set training.steps=8 --set training.global_batch=8 --set data.val_every=4
       --set data.val_sequences=8 --set checkpoint.dir= --set run.log_every=100)
txt=data/brown/txt
d="$out/data"
mkdir -p "$d"
prep() { # OUT FILES...: one dataset of the files, in order
    local o=$1; shift
    "$TRIDENT" prepare-data --input "$@" --tokenizer gpt2 --out "$o" > /dev/null ||
        { echo "FAIL: prepare-data $o"; exit 1; }
}
news=($txt/ca*) learned=($txt/cj*) fiction=($txt/ck*)
prep "$d/news" "${news[@]}"
prep "$d/learned" "${learned[@]}"
prep "$d/fiction" "${fiction[@]}"
head -c 700 $txt/cr01 > "$d/humor.txt"   # about 150 tokens: 5 samples of 32, so
prep "$d/humor" "$d/humor.txt"           # 0.2 of 64 samples is 2-3 epochs
# The news as 4 shards (names sort in document order) and the learned as 2.
n=${#news[@]} q=$(( (${#news[@]} + 3) / 4 ))
for i in 0 1 2 3; do prep "$d/news-0000$i" "${news[@]:$((i * q)):q}"; done
h=$(( ${#learned[@]} / 2 ))
prep "$d/learned-a" "${learned[@]:0:h}"
prep "$d/learned-b" "${learned[@]:h}"

# Shards: a pattern and a list train as the merged dataset.
run merged 1 --set data.path="$d/news"
run glob 1 --set data.path="$d/news-*"
curves merged glob --rtol 0 --weights-atol 0
run list 1 --set "data.path=[$d/learned-a, $d/learned-b]"
run learned 1 --set data.path="$d/learned"
curves learned list --rtol 0 --weights-atol 0
grep -q "4 shards" "$out/glob.log" || { echo "FAIL: the start-up line does not count 4 shards"; fails=$((fails + 1)); }

# A blend on 1, 2 and 8 ranks.
blend="0.5 $d/news-* 0.3 $d/fiction 0.2 $d/humor"
B=(--set data.path= --set "data.blend=$blend")
run b1 1 "${B[@]}"
run b2 2 "${B[@]}"
run b8 8 "${B[@]}" --set topology.tp=2 --set topology.pp=2 --set topology.sequence_parallel=true
curves b1 b2 --val 2
curves b1 b8 --val 2
# data.val_blend of one dataset validates as data.val_path on it.
run vb 1 "${B[@]}" --set data.val_path= --set "data.val_blend=2 data/brown/gpt2_val"
curves b1 vb --val 2 --rtol 0
python3 - "$out/b1/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
w = [0.5, 0.3, 0.2]
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 8, len(rows)
for r in rows:
    samples = [t // 32 for t in r["data_tokens"]]
    n = r["step"] * 8
    assert sum(samples) == n, (r["step"], samples)
    for s, wt in zip(samples, w):
        assert abs(s - wt * n) <= 1, (r["step"], samples)
assert rows[3]["data_epochs"][2] > 1 and rows[-1]["data_epochs"][2] > 2, rows[-1]["data_epochs"]
print("data_tokens: shares within one sample of 0.5/0.3/0.2 at every step;",
      "last", rows[-1]["data_tokens"], "epochs", rows[-1]["data_epochs"])
PY
python3 - "$out/b1.log" "$out/b1/metrics.jsonl" <<'PY' || fails=$((fails + 1))
import json, re, sys
lines = re.findall(r"^data: (\S+): (\d+) samples", open(sys.argv[1]).read(), re.M)
last = [json.loads(l) for l in open(sys.argv[2])][-1]["data_tokens"]
assert [int(n) for _, n in lines] == [t // 32 for t in last], (lines, last)
print("end-of-run data lines:", lines)
PY

# Stop after step 4, resume: equal to the run that did not stop.
RUN_CKPT=1 run stop 1 "${B[@]}" --set training.steps=4 --set checkpoint.every=4
mkdir -p "$out/resumed" && cp -r "$out/stop/ckpt" "$out/resumed/ckpt"
RUN_CKPT=1 run resumed 1 "${B[@]}" --set checkpoint.every=100
grep -q "resum" "$out/resumed.log" || { echo "FAIL: no resume in resumed.log"; fails=$((fails + 1)); }
curves b1 resumed --common --rtol 0 --weights-atol 0

# The blend run's checkpoint generates and evaluates (its config has no data.path).
"$TRIDENT" generate "$out/resumed/ckpt" --prompt "The jury" --max-new-tokens 4 --greedy \
    > "$out/gen.log" 2>&1 || { echo "FAIL: generate from the blend run:"; cat "$out/gen.log"; fails=$((fails + 1)); }
"$TRIDENT" eval "$out/resumed/ckpt" --data "$d/humor" --sequences 4 > "$out/eval.log" 2>&1 &&
    grep -q "perplexity" "$out/eval.log" ||
    { echo "FAIL: eval of the blend run:"; cat "$out/eval.log"; fails=$((fails + 1)); }

# A blend of one dataset is that dataset.
run one_blend 1 --set data.path= --set "data.blend=3 $d/fiction"
run fiction 1 --set data.path="$d/fiction"
curves fiction one_blend --rtol 0 --weights-atol 0

# data inspect: shares, and the sample's text is in the dataset it names.
"$TRIDENT" data inspect configs/tiny.yaml "${small[@]}" "${B[@]}" --sample 11 > "$out/inspect.txt" ||
    { echo "FAIL: data inspect exited $?"; fails=$((fails + 1)); }
python3 - "$out/inspect.txt" "$d" "$txt" <<'PY' || fails=$((fails + 1))
import glob, re, sys
text = open(sys.argv[1]).read()
shares = re.findall(r"\[(\d)\] (\d+) samples = ([\d.]+)% \(target ([\d.]+)%\)", text)
assert len(shares) == 3, text
for _, n, got, want in shares:
    assert abs(float(got) - float(want)) * 64 / 100 <= 1, (got, want)
m = re.search(r"sample 11: dataset \[(\d)\] (\S+), its sample \d+ .*?:\n(.*)", text, re.S)
assert m, text
files = {"0": f"{sys.argv[3]}/ca*", "1": f"{sys.argv[3]}/ck*", "2": f"{sys.argv[2]}/humor.txt"}
corpus = "".join(open(f).read() + "<|endoftext|>" for f in sorted(glob.glob(files[m.group(1)])))
window = m.group(3).rstrip("\n")
assert window and window in corpus, window[:200]
print(f"data inspect: shares {[(g, w) for _, _, g, w in shares]}; sample 11 from dataset "
      f"{m.group(1)} ({len(window)} chars) is a window of its documents")
PY

# Bad blends.
bad() { # expected message, then --set arguments
    local want=$1; shift
    "$TRIDENT" train configs/tiny.yaml "${small[@]}" --set run.dir="$out/bad" "$@" > "$out/bad.log" 2>&1
    local rc=$?
    if [ $rc -ne 2 ] || ! grep -qF -- "$want" "$out/bad.log"; then
        echo "FAIL: exit $rc, wanted 2 and '$want':"; cat "$out/bad.log"; fails=$((fails + 1))
    fi
}
bad "'x' is not a weight > 0" --set data.path= --set "data.blend=x $d/news"
bad "data.blend and data.path are both set" --set "data.blend=1 $d/news"
bad "matches no file" --set data.path= --set "data.blend=1 $d/nothing-*"
bad "weight 0.5 has no path" --set data.path= --set "data.blend=0.5 $d/news 0.5"
printf 'data:\n  blend:\n    - {path: a, weight: 1}\n    - [b, 2]\n' > "$out/bad.yaml"
sed '/^data:/,$d' configs/tiny.yaml > "$out/badcfg.yaml" && cat "$out/bad.yaml" >> "$out/badcfg.yaml"
"$TRIDENT" train "$out/badcfg.yaml" > "$out/bad.log" 2>&1
rc=$?
grep -q "badcfg.yaml:.*list item 2 is a list" "$out/bad.log" && [ $rc -eq 2 ] ||
    { echo "FAIL: YAML blend item (exit $rc):"; cat "$out/bad.log"; fails=$((fails + 1)); }

[ $fails -eq 0 ] && echo "PASS blend" || { echo "FAIL blend: $fails"; exit 1; }
