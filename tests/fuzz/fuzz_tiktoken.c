/* fuzz_tiktoken.c — a .tiktoken ranks file ("BASE64 RANK" lines), as
 * `prepare-data --tokenizer tiktoken --ranks FILE` loads it (tiktoken_load)
 * for cl100k_base or o200k_base (the first input byte picks). */
#include <stdlib.h>

#include "data/tiktoken.h"
#include "fuzz.h"

FUZZ_INIT(NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const char *path = fuzz_file("ranks.tiktoken", data + 1, size - 1);
    FUZZ_GUARD();
    static Tiktoken t;
    char err[CFG_ERR] = "";
    const int rc = tiktoken_load(&t, path, data[0] & 1 ? "o200k_base" : "cl100k_base", err);
    fuzz_check(rc, -1, err, "tiktoken_load");
    if (rc == 0) {
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        if (tiktoken_encode(&t, "Hello world", 11, &ids, &n, &cap) != 0)
            abort();
        free(ids);
        tiktoken_free(&t);
    }
    return 0;
}
