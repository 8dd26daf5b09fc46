/* fuzz_safetensors.c — a model.safetensors file (8-byte header length,
 * JSON header, data), as the HF import opens it (ckpt_hf_check_safetensors:
 * header, dtypes, shapes, offsets). */
#include "checkpoint/ckpt_internal.h"
#include "fuzz.h"

FUZZ_INIT(NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_file("model.safetensors", data, size);
    FUZZ_GUARD();
    char err[CFG_ERR] = "";
    fuzz_check(ckpt_hf_check_safetensors(fuzz_dir(), err), TRD_EXIT_INPUT, err,
               "ckpt_hf_check_safetensors");
    return 0;
}
