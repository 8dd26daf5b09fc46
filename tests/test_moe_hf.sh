#!/usr/bin/env bash
# Mixture-of-experts models in and out (docs/moe.md, "Generation, export
# and import"):
#   - generate: a gpt2 MoE (4 experts, top-2, a shared expert) and a llama
#     MoE (4 experts, top-2, grouped-query attention), trained a few steps:
#     the key/value cache gives the tokens and logits (1e-5) of --no-cache;
#     the greedy tokens and logits (1e-4) are those of repeated full
#     forwards of an independent numpy model (tests/generate_check.py over
#     the checkpoint: trident's model with tests/moe_ref.py's MoE layer,
#     dropless, float64), and that numpy model's loss on a one-sequence
#     dataset is trident eval's (the training forward): decoder = numpy =
#     training forward.
# Tiny: bytes, hidden 64, 2 layers, seq 64, 12 steps (init_std 0.2: sharper
# logits, greedy tokens that vary).
. "$(dirname "$0")/e2e.sh"
py=/usr/bin/python3   # Debian's, with numpy and h5py (scripts/install_deps.sh)
"$py" -c 'import numpy, h5py' 2>/dev/null ||
    { echo "skip: $py lacks numpy or h5py (scripts/install_deps.sh installs them)"; exit 77; }

ok() { # what, condition...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}

byte_data 2
small=(--set model.layers=2 --set model.hidden=64 --set model.heads=4 --set model.vocab=257
       --set model.seq_len=64 --set training.steps=12 --set training.warmup_steps=1
       --set training.global_batch=4 --set training.micro_batch=4 --set data.path="$out/bytes"
       --set data.val_path= --set run.log_every=100 --set model.moe.experts=4
       --set model.moe.top_k=2 --set model.init_std=0.2)
export RUN_CKPT=1
run gpt2 1 --set model.moe.shared_experts=1 --set training.sample_every=6
run llama 1 --set model.arch=llama --set model.kv_heads=2
unset RUN_CKPT
ok "gpt2 MoE: training.sample_every 6 prints samples at steps 6 and 12" \
    bash -c "[ \"\$(grep -ao '^sample at step [0-9]*' '$out/gpt2.log' | tr '\n' ,)\" = 'sample at step 6,sample at step 12,' ]"

# A dataset of one sequence (65 byte tokens of a 75-byte line): eval's loss
# on it is the training forward's.
printf 'The jury further said in term-end presentments that the City Executive.\n' \
    > "$out/one.txt"
"$TRIDENT" prepare-data --input "$out/one.txt" --tokenizer byte --out "$out/one" > /dev/null ||
    { echo "FAIL: prepare-data one"; exit 1; }

gen() { # name, source, args...: ids into $out/NAME.ids, logits into $out/NAME.logits
    local name=$1 src=$2; shift 2
    "$TRIDENT" generate "$src" --ids --dump-logits "$out/$name.logits" "$@" \
        > "$out/$name.ids" 2> "$out/$name.log"
    rc=$?
}
prompt="The jury said that the city"
for m in gpt2 llama; do
    gen "$m" "$out/$m/ckpt" --prompt "$prompt" --max-new-tokens 16 --greedy
    ok "$m MoE: generate exits 0 ($rc: $(tail -1 "$out/$m.log"))" test "$rc" -eq 0
    echo "     $m greedy ids: $(cat "$out/$m.ids")"
    "$py" tests/generate_check.py "$out/$m/ckpt" "$(cat "$out/$m.ids")" "$out/$m.logits" \
        || fails=$((fails + 1))
    gen "$m.nocache" "$out/$m/ckpt" --prompt "$prompt" --max-new-tokens 16 --greedy --no-cache
    ok "$m MoE: the cache gives the tokens of --no-cache" cmp -s "$out/$m.ids" "$out/$m.nocache.ids"
    "$py" - "$out/$m.logits" "$out/$m.nocache.logits" <<'PY' || fails=$((fails + 1))
import sys, numpy as np
a, b = (np.fromfile(f, dtype=np.float32) for f in sys.argv[1:])
rel = float(np.abs(a - b).max() / np.abs(b).max()) if a.size == b.size and a.size else 1.0
print(f"{'ok  ' if rel <= 1e-5 else 'FAIL'} the cache's logits equal --no-cache's: {rel:.2g} relative")
sys.exit(0 if rel <= 1e-5 else 1)
PY
    timeout 120 "$TRIDENT" eval "$out/$m/ckpt" --data "$out/one" --sequences 1 --micro-batch 1 \
        > "$out/$m.eval" 2>&1 || { echo "FAIL: eval $m: $(tail -2 "$out/$m.eval")"; fails=$((fails + 1)); }
    "$py" - "$out/$m/ckpt" "$out/one.txt" "$out/$m.eval" <<'PY' || fails=$((fails + 1))
import os, re, sys
import numpy as np
sys.path.insert(0, "tests")
from hf_export_check import cross_entropy, load_trident, trident_forward
ck, text, log = sys.argv[1:]
model, w, _ = load_trident(f"{ck}/{open(f'{ck}/latest').read().strip()}")
T = int(model["seq_len"])
ids = np.frombuffer(open(text, "rb").read(), np.uint8).astype(int)[:T + 1]
want = cross_entropy(trident_forward(model, w, ids[:T]), ids[1:])
got = float(re.search(r"\| loss ([0-9.]+)", open(log).read()).group(1))
rel = abs(got - want) / want
print(f"{'ok  ' if rel <= 1e-5 else 'FAIL'} eval's loss {got} (the training forward) = the numpy "
      f"model's {want:.7g} ({rel:.1e} relative)")
sys.exit(0 if rel <= 1e-5 else 1)
PY
done

# ---- export as MixtralForCausalLM ----
export_hf() { # name, outdir, options...: exit status in $rc, output in $out/x.log
    local name=$1 dir=$2; shift 2
    timeout 120 "$TRIDENT" ckpt export --format hf --out "$dir" "$@" "$out/$name/ckpt" \
        > "$out/x.log" 2>&1
    rc=$?
}
verify() { # hf dir, checkpoint name: tests/hf_export_check.py
    "$py" tests/hf_export_check.py "$1" "$out/$2/ckpt/$(cat "$out/$2/ckpt/latest")" > "$out/c.log" 2>&1
    local r=$?
    sed 's/^/     /' "$out/c.log"
    return $r
}
export_hf llama "$out/llama.hf"
ok "llama MoE: export (exit $rc)" test $rc -eq 0
ok "config.json: MixtralForCausalLM, 4 local experts, 2 per token, intermediate_size the expert width" \
    "$py" -c "import json, sys; c = json.load(open('$out/llama.hf/config.json'))
sys.exit(not (c['architectures'] == ['MixtralForCausalLM'] and c['model_type'] == 'mixtral'
              and c['num_local_experts'] == 4 and c['num_experts_per_tok'] == 2
              and c['intermediate_size'] == 192 and abs(c['router_aux_loss_coef'] - 0.01) < 1e-7))"
ok "Mixtral export: every tensor equals its trident source (experts sliced), the numpy Mixtral's logits = trident's" \
    verify "$out/llama.hf" llama
"$py" tests/generate_check.py "$out/llama.hf" "$(cat "$out/llama.ids")" "$out/llama.logits" \
    || fails=$((fails + 1))
export_hf llama "$out/llama.bf16" --dtype bf16
ok "bf16 export (exit $rc): the experts rounded to nearest even" verify "$out/llama.bf16" llama
export_hf llama "$out/llama.shards" --max-shard-size 100KB
ok "sharded export (exit $rc, 100 KB shards: a stacked expert tensor spans shards)" \
    verify "$out/llama.shards" llama
timeout 120 mpiexec -n 3 "$TRIDENT" ckpt export --format hf --max-shard-size 100KB \
    --out "$out/llama.shards3" "$out/llama/ckpt" > "$out/x.log" 2>&1
rc=$?
ok "sharded, 3 ranks (exit $rc): every file identical to one rank's" \
    bash -c "[ $rc -eq 0 ] && for f in '$out/llama.shards'/*; do cmp -s \"\$f\" '$out/llama.shards3'/\"\$(basename \"\$f\")\" || exit 1; done"

# What Mixtral cannot express: exit 2 naming it.  A capacity factor exports
# with a note (Hugging Face runs dropless).
one=(--set training.steps=1 --set model.arch=llama --set model.kv_heads=2)
export RUN_CKPT=1
run shared 1 "${one[@]}" --set model.moe.shared_experts=1
run every2 1 "${one[@]}" --set model.moe.every=2
run capacity 1 "${one[@]}" --set model.moe.capacity_factor=1.0
unset RUN_CKPT
refused() { # name, expected message
    export_hf "$1" "$out/$1.hf"
    ok "export of $1: exit 2 ($rc) saying '$2', no weights written" \
        bash -c "[ $rc -eq 2 ] && grep -qF -- \"$2\" '$out/x.log' && ! ls '$out/$1.hf'/*.safetensors 2>/dev/null"
}
refused gpt2 "no Hugging Face export of a mixture-of-experts model with arch gpt2"
refused shared "model.moe.shared_experts 1: MixtralForCausalLM has no shared experts"
refused every2 "model.moe.every 2: every layer of MixtralForCausalLM is a MoE layer"
export_hf capacity "$out/capacity.hf"
ok "capacity factor: exports (exit $rc) with a note that Hugging Face runs dropless" \
    bash -c "[ $rc -eq 0 ] && grep -q 'Hugging Face.s Mixtral runs dropless' '$out/x.log'"
ok "capacity factor: the export checks" verify "$out/capacity.hf" capacity

echo "moe_hf: $fails failed"
[ "$fails" -eq 0 ]
