/* fuzz_ckpt_index.c — the checkpoint index's attribute checks
 * (ckpt_index_read: /state with its checksums, /model, /topology).  HDF5's
 * own file parser is out of scope: the harness writes a valid index.h5
 * once (ckpt_index_write), and each input overwrites the numeric
 * attribute values of the groups its first byte selects (bit 0 the root,
 * 1 /state, 2 /model, 3 /topology), in HDF5's order, with the following
 * bytes, before ckpt_index_read reads the copy. */
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt_internal.h"
#include "fuzz.h"
#include "fuzz_index.h"

static uint8_t *base; /* the valid index.h5 */
static size_t base_n;

static void setup(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/base.h5", fuzz_dir());
    fuzz_write_index(path, "fuzz_ckpt_index");
    FILE *f = fopen(path, "rb");
    base = malloc(1 << 20);
    base_n = f && base ? fread(base, 1, 1 << 20, f) : 0;
    if (!f || !base_n)
        abort();
    fclose(f);
}

FUZZ_INIT(setup)

typedef struct {
    const uint8_t *p;
    size_t n;
} Bytes;

/* Overwrite one numeric attribute with the next bytes of the input. */
static herr_t overwrite(hid_t loc, const char *name, const H5A_info_t *info, void *data)
{
    (void)info;
    Bytes *in = data;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t t = H5Aget_type(a);
    const H5T_class_t c = H5Tget_class(t);
    const size_t need = (size_t)H5Aget_storage_size(a);
    if ((c == H5T_INTEGER || c == H5T_FLOAT) && need > 0 && need <= in->n) {
        H5Awrite(a, t, in->p);
        in->p += need;
        in->n -= need;
    }
    H5Tclose(t);
    H5Aclose(a);
    return in->n ? 0 : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const char *path = fuzz_file("index.h5", base, base_n);
    Bytes in = {data + 1, size - 1};
    hid_t fapl = ckpt_serial_fapl();
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, fapl);
    H5Pclose(fapl);
    if (f < 0)
        abort();
    static const char *const groups[4] = {"/", "state", "model", "topology"};
    for (int g = 0; g < 4 && in.n; g++) {
        if (!(data[0] >> g & 1))
            continue;
        hid_t loc = H5Oopen(f, groups[g], H5P_DEFAULT);
        H5Aiterate2(loc, H5_INDEX_NAME, H5_ITER_INC, NULL, overwrite, &in);
        H5Oclose(loc);
    }
    H5Fclose(f);

    FUZZ_GUARD();
    CkptIndex ix;
    char err[CFG_ERR] = "";
    const int rc = ckpt_index_read(path, &ix, err);
    fuzz_check(rc, -1, err, "ckpt_index_read");
    if (rc == 0) {
        char line[512];
        ckpt_index_model_line(&ix, line, sizeof line);
        ckpt_index_free(&ix);
    }
    return 0;
}
