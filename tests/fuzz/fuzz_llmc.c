/* fuzz_llmc.c — an llm.c token shard (a header of 256 int32: magic,
 * version, token count; then uint16 tokens), as dataset_open reads it. */
#include <string.h>

#include "data/dataset.h"
#include "fuzz.h"

FUZZ_INIT(NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("shard.bin", data, size);
    FUZZ_GUARD();
    TokenDataset ds;
    char err[CFG_ERR] = "";
    const int rc = dataset_open(&ds, path, DATA_LLMC, err);
    fuzz_check(rc, -1, err, "dataset_open (llmc)");
    if (rc == 0) {
        uint64_t sum = 0;
        for (uint64_t i = 0; i < ds.n_tokens; i++)
            sum += dataset_token(&ds, i);
        if (sum == 1)
            memset(err, 0, 1);
        dataset_close(&ds);
    }
    return 0;
}
