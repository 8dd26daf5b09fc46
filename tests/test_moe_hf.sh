#!/usr/bin/env bash
# Mixture-of-experts models in and out (docs/moe.md, "Generation" and
# "Hugging Face: Mixtral"):
#   - generate: a gpt2 MoE (4 experts, top-2, a shared expert) and a llama
#     MoE (4 experts, top-2, grouped-query attention), trained a few steps:
#     the key/value cache gives the tokens and logits (1e-5) of --no-cache;
#     the greedy tokens and logits (1e-4) are those of repeated full
#     forwards of an independent numpy model (tests/generate_check.py over
#     the checkpoint: trident's model with tests/moe_ref.py's MoE layer,
#     dropless, float64), and that numpy model's loss on a one-sequence
#     dataset is trident eval's (the training forward): decoder = numpy =
#     training forward; training.sample_every prints samples of a MoE model;
#   - export of the llama MoE as MixtralForCausalLM: config.json; every
#     tensor equal to its trident source (tests/hf_export_check.py, its own
#     safetensors reader, the stacked experts sliced in numpy), and its
#     numpy Mixtral forward (HF's sparse MoE block) gives trident's logits;
#     trident generate's greedy tokens and logits are that Mixtral's
#     (generate_check.py over the export); sharded over 3 ranks; what
#     Mixtral cannot express (gpt2, shared experts, moe.every 2) exits 2
#     naming it; a capacity factor exports with a note;
#   - import: export -> import gives the checkpoint's tensors bit for bit,
#     -> export again the same bytes; generate on the Mixtral directory
#     gives the checkpoint's tokens; a Mixtral written by numpy
#     (tests/mixtral_write.py) imports and generates the numpy Mixtral's
#     greedy tokens and logits, and checkpoint.init_from it starts where
#     the imported checkpoint does (a config with other experts: exit 2);
#     a missing, duplicate or extra expert and a wrong shape exit 2 naming
#     the file and the tensor.
# Tiny: bytes, hidden 64, 2 layers, seq 64, 12 steps (init_std 0.2: sharper
# logits, greedy tokens that vary); 1-step runs for the refusals.
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
    timeout 120 "$TRIDENT" eval "$out/$m/ckpt" --data "$out/one" --sequences 1 --micro-batch 1 \
        > "$out/$m.eval" 2>&1 || { echo "FAIL: eval $m: $(tail -2 "$out/$m.eval")"; fails=$((fails + 1)); }
done
# (one python for both models: its start is most of a check's time)
"$py" - "$out" <<'PY' || fails=$((fails + 1))
import re, sys
import numpy as np
sys.path.insert(0, "tests")
from hf_export_check import cross_entropy, load_trident, trident_forward
out, bad = sys.argv[1], 0
for m in ("gpt2", "llama"):
    a, b = (np.fromfile(f"{out}/{m}{x}.logits", dtype=np.float32) for x in ("", ".nocache"))
    rel = float(np.abs(a - b).max() / np.abs(b).max()) if a.size == b.size and a.size else 1.0
    print(f"{'ok  ' if rel <= 1e-5 else 'FAIL'} {m} MoE: the cache's logits equal --no-cache's: "
          f"{rel:.2g} relative")
    bad += rel > 1e-5
    ck = f"{out}/{m}/ckpt"
    model, w, _ = load_trident(f"{ck}/{open(f'{ck}/latest').read().strip()}")
    T = int(model["seq_len"])
    ids = np.frombuffer(open(f"{out}/one.txt", "rb").read(), np.uint8).astype(int)[:T + 1]
    want = cross_entropy(trident_forward(model, w, ids[:T]), ids[1:])
    got = float(re.search(r"\| loss ([0-9.]+)", open(f"{out}/{m}.eval").read()).group(1))
    rel = abs(got - want) / want
    print(f"{'ok  ' if rel <= 1e-5 else 'FAIL'} {m} MoE: eval's loss {got} (the training forward) "
          f"= the numpy model's {want:.7g} ({rel:.1e} relative)")
    bad += rel > 1e-5
sys.exit(1 if bad else 0)
PY

# ---- export as MixtralForCausalLM ----
export_hf() { # name (a run's checkpoint, or a checkpoint dir in $out), outdir, options...:
    local name=$1 dir=$2 src="$out/$1/ckpt"; shift 2  # exit status in $rc, output in $out/x.log
    [ -d "$src" ] || src="$out/$name"
    timeout 120 "$TRIDENT" ckpt export --format hf --out "$dir" "$@" "$src" \
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
# Sharded (100 KB: a stacked expert tensor's experts in several shards),
# its tensors split over 3 ranks.
timeout 120 mpiexec -n 3 "$TRIDENT" ckpt export --format hf --max-shard-size 100KB \
    --out "$out/llama.shards3" "$out/llama/ckpt" > "$out/x.log" 2>&1
rc=$?
ok "sharded export on 3 ranks (exit $rc): 15 shards" \
    test -f "$out/llama.shards3/model-00015-of-00015.safetensors"
ok "sharded export on 3 ranks: index, shards and tensors check" verify "$out/llama.shards3" llama

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

# ---- import of MixtralForCausalLM ----
import_hf() { # hf dir, out: exit status in $rc, output in $out/i.log
    timeout 120 "$TRIDENT" ckpt import --from hf "$1" --out "$2" > "$out/i.log" 2>&1
    rc=$?
}
import_hf "$out/llama.hf" "$out/llama.imp"
ok "import of the Mixtral export (exit $rc)" test $rc -eq 0
sed 's/^/     /' "$out/i.log"
ok "export -> import: every tensor bit-identical to the checkpoint's" \
    "$py" tests/hf_import_check.py "$out/llama/ckpt/$(cat "$out/llama/ckpt/latest")" \
    "$out/llama.imp/step_00000000"
export_hf llama.imp "$out/llama.again"
ok "export -> import -> export: the same model.safetensors and config.json, byte for byte" \
    bash -c "cmp -s '$out/llama.hf/model.safetensors' '$out/llama.again/model.safetensors' &&
             cmp -s '$out/llama.hf/config.json' '$out/llama.again/config.json'"
gen llama.hfgen "$out/llama.hf" --prompt "$prompt" --max-new-tokens 16 --greedy
ok "generate on the Mixtral directory: the checkpoint's tokens" cmp -s "$out/llama.ids" "$out/llama.hfgen.ids"

# A Mixtral written by numpy (tests/mixtral_write.py, rope_theta 1e6):
# imported, it generates the numpy Mixtral's greedy tokens and logits.
"$py" tests/mixtral_write.py "$out/mix.hf" "$out/missing.hf:missing" "$out/duplicate.hf:duplicate" \
    "$out/extra.hf:extra" "$out/shape.hf:shape" || { echo "FAIL: mixtral_write.py"; fails=$((fails + 1)); }
import_hf "$out/mix.hf" "$out/mix.imp"
ok "import of a numpy-written Mixtral (exit $rc)" test $rc -eq 0
gen mix "$out/mix.imp" --prompt "$prompt" --max-new-tokens 16 --greedy
echo "     mixtral greedy ids: $(cat "$out/mix.ids")"
"$py" tests/generate_check.py "$out/mix.hf" "$(cat "$out/mix.ids")" "$out/mix.logits" \
    || fails=$((fails + 1))
gen mix.hfgen "$out/mix.hf" --prompt "$prompt" --max-new-tokens 16 --greedy
ok "generate on the numpy Mixtral's directory: the imported checkpoint's tokens" \
    cmp -s "$out/mix.ids" "$out/mix.hfgen.ids"
# checkpoint.init_from the directory: the first step's loss is the one from
# the imported checkpoint; a config with other experts exits 2 naming both.
mix=(--set model.arch=llama --set model.kv_heads=2 --set model.ffn_hidden=96
     --set model.rope_theta=1000000 --set model.tie_embeddings=false --set training.steps=1)
run init_hf 1 "${mix[@]}" --set checkpoint.init_from="$out/mix.hf"
run init_ckpt 1 "${mix[@]}" --set checkpoint.init_from="$out/mix.imp"
first_loss() { grep -o '"loss": [-0-9.e+]*' "$out/$1/metrics.jsonl" | head -1; }
ok "init_from the Mixtral directory: step 1's loss = from the imported checkpoint ($(first_loss init_hf))" \
    bash -c "[ -n \"$(first_loss init_hf)\" ] && [ \"$(first_loss init_hf)\" = \"$(first_loss init_ckpt)\" ]"
timeout 120 "$TRIDENT" train configs/tiny.yaml "${small[@]}" "${mix[@]}" --set model.moe.top_k=1 \
    --set checkpoint.init_from="$out/mix.hf" --set run.dir="$out/init_bad" > "$out/init_bad.log" 2>&1
rc=$?
ok "init_from with top_k 1: exit 2 ($rc) naming both values" \
    bash -c "[ $rc -eq 2 ] && grep -q 'model.moe.top_k is 2 in .*config.json, 1 in the config' '$out/init_bad.log'"

# Broken Mixtral directories: exit 2 naming the file and the tensor.
broken() { # variant (tests/mixtral_write.py's), expected message
    import_hf "$out/$1.hf" "$out/$1.imp"
    ok "import, $1 expert: exit 2 ($rc) saying '$2', nothing written" \
        bash -c "[ $rc -eq 2 ] && grep -qF -- \"$2\" '$out/i.log' && [ ! -e '$out/$1.imp/step_00000000' ]"
}
broken missing "model.safetensors: required tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight' is missing"
broken duplicate "model.safetensors: tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' appears twice in the header"
broken extra "model.safetensors: tensor 'model.layers.0.block_sparse_moe.experts.4.w1.weight': config.json has 2 layers of 4 experts"
broken shape "model.safetensors: tensor 'model.layers.0.block_sparse_moe.experts.2.w3.weight' has shape [64, 96], config.json implies [96, 64]"

echo "moe_hf: $fails failed"
[ "$fails" -eq 0 ]
