/* fuzz_gpt2_bpe.c — GPT-2's tokenizer files, encoder.json and vocab.bpe
 * (bpe_load, as `prepare-data --tokenizer gpt2 --vocab --merges` and the
 * default GPT-2 tokenizer read them); a vocabulary that loads also encodes
 * a short text.  Input: encoder.json, a NUL byte, vocab.bpe. */
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"
#include "fuzz.h"

FUZZ_INIT(NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json;
    const uint8_t *merges;
    size_t merges_n;
    fuzz_split(data, size, &json, &merges, &merges_n);
    const char *enc = fuzz_file("encoder.json", data, strlen(json));
    const char *bpe = fuzz_file("vocab.bpe", merges, merges_n);
    free(json);
    FUZZ_GUARD();
    static Bpe b;
    char err[CFG_ERR] = "";
    memset(&b, 0, sizeof b);
    const int rc = bpe_load(&b, enc, bpe, err);
    fuzz_check(rc, -1, err, "bpe_load");
    if (rc == 0) {
        static const char text[] = "Hello world, it's 2026!\n  \xe2\x82\xac\xff";
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        if (bpe_encode(&b, text, sizeof text - 1, &ids, &n, &cap) != 0)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= b.vocab)
                abort();
        free(ids);
        bpe_free(&b);
    }
    return 0;
}
