/* fuzz_megatron_idx.c — a Megatron-LM indexed dataset (PREFIX.idx and
 * PREFIX.bin), as training and `trident data` open it (dataset_open).
 * Input: the .idx bytes, then optionally a "\0BIN\0" marker and the .bin bytes.
 * A dataset that opens is read whole: every sequence length and token
 * must lie in the mapping (ASan catches what does not). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "fuzz.h"

FUZZ_INIT(NULL)

/* Where the .idx ends: libFuzzer's inputs hold NULs in the .idx, so the cut
 * is the last "\0BIN\0" marker if any, else the whole input. */
static size_t idx_len(const uint8_t *data, size_t size)
{
    for (size_t i = size; i >= 5; i--)
        if (!memcmp(data + i - 5, "\0BIN\0", 5))
            return i - 5;
    return size;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const size_t n = idx_len(data, size);
    fuzz_file("d.idx", data, n);
    fuzz_file("d.bin", data + (n < size ? n + 5 : n), n < size ? size - n - 5 : 0);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s/d", fuzz_dir());
    FUZZ_GUARD();
    TokenDataset ds;
    char err[CFG_ERR] = "";
    const int rc = dataset_open(&ds, prefix, DATA_MEGATRON, err);
    fuzz_check(rc, -1, err, "dataset_open (megatron)");
    if (rc == 0) {
        uint64_t sum = 0;
        for (uint64_t i = 0; i < ds.n_tokens; i++)
            sum += dataset_token(&ds, i);
        for (uint64_t d = 0; d < ds.n_docs; d++)
            sum += (uint64_t)dataset_sequence_length(&ds, d);
        if (sum == 1) /* keep the reads */
            memset(err, 0, 1);
        dataset_close(&ds);
    }
    return 0;
}
