/* fuzz_safetensors_index.c — model.safetensors.index.json (weight_map:
 * tensor -> shard file), with two valid shards beside it that the map may
 * name; ckpt_hf_check_safetensors opens what it names. */
#include <string.h>

#include "checkpoint/ckpt_internal.h"
#include "fuzz.h"

/* A shard with one F32 tensor "a" of 2 elements. */
static void shard(const char *name)
{
    static const char header[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint8_t buf[8 + sizeof header + 8] = {0};
    const uint64_t n = sizeof header - 1;
    memcpy(buf, &n, 8);
    memcpy(buf + 8, header, n);
    fuzz_file(name, buf, 8 + n + 8);
}

static void setup(void)
{
    shard("model-00001-of-00002.safetensors");
    shard("model-00002-of-00002.safetensors");
}

FUZZ_INIT(setup)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_file("model.safetensors.index.json", data, size);
    FUZZ_GUARD();
    char err[CFG_ERR] = "";
    fuzz_check(ckpt_hf_check_safetensors(fuzz_dir(), err), TRD_EXIT_INPUT, err,
               "ckpt_hf_check_safetensors (index)");
    return 0;
}
