/* fuzz_hf_config.c — a Hugging Face directory's config.json, as
 * `trident ckpt import --from hf` and checkpoint.init_from read it first
 * (ckpt_hf_read_model). */
#include "checkpoint/ckpt_internal.h"
#include "fuzz.h"

FUZZ_INIT(NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_file("config.json", data, size);
    FUZZ_GUARD();
    ModelConfig m = {0};
    int want_dtype = 0;
    char err[CFG_ERR] = "";
    fuzz_check(ckpt_hf_read_model(fuzz_dir(), &m, &want_dtype, err), TRD_EXIT_INPUT, err,
               "ckpt_hf_read_model");
    return 0;
}
