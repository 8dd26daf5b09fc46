/* fuzz_jsonl.c — prepare-data's JSON lines input, plain, gzip or zstd
 * (the first input byte picks the file name's extension): reader_open and
 * reader_line stream it, each line is parsed as add_jsonl_file does
 * (cJSON, an object with a string "text").  A corrupt or truncated
 * compressed stream must be an error with a message. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "data/reader.h"
#include "fuzz.h"

FUZZ_INIT(NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    static const char *const names[3] = {"in.jsonl", "in.jsonl.gz", "in.jsonl.zst"};
    const char *path = fuzz_file(names[data[0] % 3], data + 1, size - 1);
    FUZZ_GUARD();
    char err[TRD_ERR] = "";
    DataReader *r = reader_open(path, err);
    if (!r) {
        fuzz_check(-1, -1, err, "reader_open");
        return 0;
    }
    const char *line;
    size_t len;
    int rc;
    while ((rc = reader_line(r, &line, &len, err)) > 0) {
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(line, len, &end, 0);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (cJSON_IsString(v) && strlen(v->valuestring) > len)
            abort();
        cJSON_Delete(j);
    }
    if (rc < 0)
        fuzz_check(-1, -1, err, "reader_line");
    reader_close(r);
    return 0;
}
