/* fuzz_hf_import.c — `trident ckpt import --from hf`: the tensor-name
 * mapping of a Hugging Face directory onto trident's parameter table
 * (model.layers.N.self_attn.q_proj.weight, transformer.h.N.attn.c_attn.*,
 * ...), each tensor's shape and dtype against config.json, the conversion
 * (transpose, fused qkv, bf16/f16 widening, the finite check) and the
 * writing of the checkpoint.  The input is config.json, a NUL byte, then
 * model.safetensors (header length, JSON header, data): names, layer
 * indices out of range, duplicates, shapes and offsets are what the fuzzer
 * varies.  Entry point: ckpt_hf_import, as `trident ckpt import` calls it
 * (seeds: tests/fuzz/make_hf_import_seeds.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "fuzz.h"

static char out[600];

static void setup(void) { snprintf(out, sizeof out, "%s/out", fuzz_dir()); }

FUZZ_INIT(setup)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json;
    const uint8_t *st;
    size_t st_n;
    fuzz_split(data, size, &json, &st, &st_n);
    fuzz_file("config.json", (const uint8_t *)json, strlen(json));
    free(json);
    fuzz_file("model.safetensors", st, st_n);
    FUZZ_GUARD();
    char err[CFG_ERR] = "";
    /* replace: each input's checkpoint replaces the last one's step 0 */
    fuzz_check(ckpt_hf_import(fuzz_dir(), out, NULL, 0, 1, err), TRD_EXIT_INPUT, err,
               "ckpt_hf_import");
    return 0;
}
