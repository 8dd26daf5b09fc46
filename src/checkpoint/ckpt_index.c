/* ckpt_index.c — index.h5, the one small file that ties tensor names to
 * stage files and records the state, model and topology of the save, and
 * the HDF5 helpers the other files share.
 *
 * index.h5 (docs/checkpoint.md):
 *   /            attrs format="trident-checkpoint", version=1, step, config (YAML)
 *   /state       attrs step, sampler_position, lr_step, adam_t, rng[4], seed,
 *                data_path, checksum[7] (one per attribute before it)
 *   /model       attrs arch, precision, layers, hidden, heads, kv_heads,
 *                ffn_hidden, vocab, seq_len, tie_embeddings, norm_eps, rope_theta
 *   /topology    attrs tp, pp, dp, zero, world, stage_layers[pp]
 *   /tensors     compound dataset, one record per stored dataset:
 *                name, kind, file, dtype, ndim, stage, shape[2], nbytes */
#include "checkpoint/ckpt_internal.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

void ckpt_err(char err[CFG_ERR], const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, CFG_ERR, fmt, ap);
    va_end(ap);
}

hid_t ckpt_serial_fapl(void)
{
    /* Checkpoints do not change once published, and file systems without
     * flock (some NFS and Lustre mounts) would refuse the open otherwise. */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    TRD_ASSERT(fapl >= 0 && H5Pset_file_locking(fapl, 0, 1) >= 0);
    return fapl;
}

int ckpt_fapl_tensor_layout(hid_t fapl)
{
    /* Metadata (object headers, attributes, group indexes) gathered in
     * 4 MiB blocks instead of scattered between the tensors: a reader
     * opening hundreds of datasets from a cold cache then reads a few
     * blocks, not hundreds of seeks.  Tensors of 64 KiB or more start on
     * 4 KiB boundaries, so their whole blocks go out with O_DIRECT
     * (ckpt_raw.c) straight from a buffer aligned the same way. */
    return H5Pset_meta_block_size(fapl, 4 << 20) >= 0 &&
                   H5Pset_alignment(fapl, 64 << 10, CKPT_RAW_ALIGN) >= 0
               ? 0
               : -1;
}

void ckpt_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

typedef struct {
    char *out;
    size_t n;
} Reason;

static herr_t take_innermost(unsigned n, const H5E_error2_t *e, void *data)
{
    /* Walked upward: entry 0 is the innermost, the most specific cause. */
    Reason *r = data;
    if (n == 0 && e->desc)
        snprintf(r->out, r->n, "%s", e->desc);
    return 0;
}

void ckpt_h5_reason(char *out, size_t n)
{
    Reason r = {out, n};
    out[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &r);
    if (!out[0])
        snprintf(out, n, "HDF5 error");
}

/* ---- attributes ---- */

static int put_attr(hid_t loc, const char *name, hid_t type, int n, const void *v)
{
    hsize_t dims[1] = {(hsize_t)n};
    hid_t sp = n == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, NULL);
    hid_t a = H5Acreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a >= 0 && H5Awrite(a, type, v) >= 0 ? 0 : -1;
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

static int put_i64(hid_t loc, const char *name, int64_t v)
{
    return put_attr(loc, name, H5T_NATIVE_INT64, 0, &v);
}

static int put_str(hid_t loc, const char *name, const char *s)
{
    /* Variable-length UTF-8: h5py reads it as a str. */
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    int rc = put_attr(loc, name, t, 0, &s);
    H5Tclose(t);
    return rc;
}

static int get_attr(hid_t loc, const char *name, hid_t type, void *v)
{
    if (H5Aexists(loc, name) <= 0)
        return -1;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0)
        return -1;
    int rc = H5Aread(a, type, v) >= 0 ? 0 : -1;
    H5Aclose(a);
    return rc;
}

/* An int array attribute of at most max elements. */
static int get_ints(hid_t loc, const char *name, int *v, int max)
{
    if (H5Aexists(loc, name) <= 0)
        return -1;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0)
        return -1;
    hid_t sp = H5Aget_space(a);
    hssize_t n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    int rc = n >= 0 && n <= max && H5Aread(a, H5T_NATIVE_INT, v) >= 0 ? 0 : -1;
    if (sp >= 0)
        H5Sclose(sp);
    H5Aclose(a);
    return rc;
}

/* A double array attribute of exactly n elements. */
static int get_doubles(hid_t loc, const char *name, double *v, int n)
{
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0)
        return -1;
    hid_t sp = H5Aget_space(a);
    hssize_t got = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    int rc = got == n && H5Aread(a, H5T_NATIVE_DOUBLE, v) >= 0 ? 0 : -1;
    if (sp >= 0)
        H5Sclose(sp);
    H5Aclose(a);
    return rc;
}

static int get_int(hid_t loc, const char *name, int *v)
{
    int64_t x = 0;
    if (get_attr(loc, name, H5T_NATIVE_INT64, &x) != 0)
        return -1;
    *v = (int)x;
    return 0;
}

/* A variable-length string attribute, copied (malloc) into *out. */
static int get_str(hid_t loc, const char *name, char **out)
{
    if (H5Aexists(loc, name) <= 0)
        return -1;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0)
        return -1;
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    char *s = NULL;
    int rc = H5Aread(a, t, &s) >= 0 && s ? 0 : -1;
    if (rc == 0) {
        size_t n = strlen(s);
        *out = trd_malloc(n + 1, "checkpoint index string");
        memcpy(*out, s, n + 1);
        H5free_memory(s);
    }
    H5Tclose(t);
    H5Aclose(a);
    return rc;
}

static int get_strbuf(hid_t loc, const char *name, char *buf, size_t n)
{
    char *s = NULL;
    if (get_str(loc, name, &s) != 0)
        return -1;
    snprintf(buf, n, "%s", s);
    free(s);
    return 0;
}

/* ---- /state checksums ---- */

const char *const ckpt_state_attr_names[CKPT_STATE_ATTRS] = {
    "step", "sampler_position", "lr_step", "adam_t", "rng", "seed", "data_path"};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* One attribute's checksum: FNV-1a 64 over its name, a NUL and its value's
 * bytes (little-endian integers; a string without its NUL), then fmix64.
 * One per attribute, so a flipped bit is reported with the attribute's
 * name rather than as "the state". */
static uint64_t state_hash(const char *name, const void *v, size_t n)
{
    uint64_t h = fnv1a(0xcbf29ce484222325ull, name, strlen(name) + 1);
    h = fnv1a(h, v, n);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static void state_sums(const CkptIndex *ix, uint64_t out[CKPT_STATE_ATTRS])
{
    const CkptState *s = &ix->state;
    out[0] = state_hash("step", &s->step, sizeof s->step);
    out[1] = state_hash("sampler_position", &s->sampler_position, sizeof s->sampler_position);
    out[2] = state_hash("lr_step", &s->lr_step, sizeof s->lr_step);
    out[3] = state_hash("adam_t", &s->adam_t, sizeof s->adam_t);
    out[4] = state_hash("rng", s->rng, sizeof s->rng);
    out[5] = state_hash("seed", &ix->seed, sizeof ix->seed);
    out[6] = state_hash("data_path", ix->data_path, strlen(ix->data_path));
}

/* ---- the /tensors record type ---- */

static hid_t fixed_str(size_t n)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, n);
    H5Tset_strpad(t, H5T_STR_NULLTERM);
    return t;
}

static hid_t entry_type(void)
{
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(CkptEntry));
    hid_t sname = fixed_str(PARAM_NAME), skind = fixed_str(CKPT_KIND_NAME);
    hid_t sfile = fixed_str(CKPT_FILE_NAME), sdtype = fixed_str(CKPT_DTYPE_NAME);
    hsize_t two[1] = {2};
    hid_t shape = H5Tarray_create2(H5T_NATIVE_INT64, 1, two);
    H5Tinsert(t, "name", HOFFSET(CkptEntry, name), sname);
    H5Tinsert(t, "kind", HOFFSET(CkptEntry, kind), skind);
    H5Tinsert(t, "file", HOFFSET(CkptEntry, file), sfile);
    H5Tinsert(t, "dtype", HOFFSET(CkptEntry, dtype), sdtype);
    H5Tinsert(t, "ndim", HOFFSET(CkptEntry, ndim), H5T_NATIVE_INT32);
    H5Tinsert(t, "stage", HOFFSET(CkptEntry, stage), H5T_NATIVE_INT32);
    H5Tinsert(t, "shape", HOFFSET(CkptEntry, shape), shape);
    H5Tinsert(t, "nbytes", HOFFSET(CkptEntry, nbytes), H5T_NATIVE_INT64);
    H5Tclose(sname);
    H5Tclose(skind);
    H5Tclose(sfile);
    H5Tclose(sdtype);
    H5Tclose(shape);
    return t;
}

/* ---- write ---- */

static int write_groups(hid_t f, const CkptIndex *ix)
{
    int bad = 0;
    bad |= put_str(f, "format", CKPT_FORMAT);
    bad |= put_i64(f, "version", CKPT_VERSION);
    bad |= put_i64(f, "step", ix->state.step);
    bad |= put_str(f, "config", ix->yaml ? ix->yaml : "");

    hid_t g = H5Gcreate2(f, "state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bad |= g < 0;
    bad |= put_i64(g, "step", ix->state.step);
    bad |= put_attr(g, "sampler_position", H5T_NATIVE_UINT64, 0, &ix->state.sampler_position);
    bad |= put_i64(g, "lr_step", ix->state.lr_step);
    bad |= put_i64(g, "adam_t", ix->state.adam_t);
    bad |= put_attr(g, "rng", H5T_NATIVE_UINT64, 4, ix->state.rng);
    bad |= put_attr(g, "seed", H5T_NATIVE_UINT64, 0, &ix->seed);
    bad |= put_str(g, "data_path", ix->data_path);
    uint64_t sums[CKPT_STATE_ATTRS];
    state_sums(ix, sums);
    bad |= put_attr(g, "checksum", H5T_NATIVE_UINT64, CKPT_STATE_ATTRS, sums);
    H5Gclose(g);

    g = H5Gcreate2(f, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bad |= g < 0;
    bad |= put_str(g, "arch", ix->arch);
    bad |= put_str(g, "precision", ix->precision);
    const struct {
        const char *k;
        int v;
    } mi[] = {{"layers", ix->layers},         {"hidden", ix->hidden},
              {"heads", ix->heads},           {"kv_heads", ix->kv_heads},
              {"ffn_hidden", ix->ffn_hidden}, {"vocab", ix->vocab},
              {"seq_len", ix->seq_len},       {"tie_embeddings", ix->tie_embeddings}};
    for (size_t i = 0; i < sizeof mi / sizeof mi[0]; i++)
        bad |= put_i64(g, mi[i].k, mi[i].v);
    bad |= put_attr(g, "norm_eps", H5T_NATIVE_DOUBLE, 0, &ix->norm_eps);
    bad |= put_attr(g, "rope_theta", H5T_NATIVE_DOUBLE, 0, &ix->rope_theta);
    if (ix->rope_llama3)
        bad |= put_attr(g, "rope_scaling_llama3", H5T_NATIVE_DOUBLE, 4, ix->rope_params);
    if (ix->moe[0] > 0) {
        bad |= put_attr(g, "moe", H5T_NATIVE_INT, 5, ix->moe);
        bad |= put_attr(g, "moe_coefs", H5T_NATIVE_DOUBLE, 3, ix->moe_coefs);
    }
    H5Gclose(g);

    g = H5Gcreate2(f, "topology", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bad |= g < 0;
    const struct {
        const char *k;
        int v;
    } ti[] = {
        {"tp", ix->tp}, {"pp", ix->pp}, {"dp", ix->dp}, {"zero", ix->zero}, {"world", ix->world}};
    for (size_t i = 0; i < sizeof ti / sizeof ti[0]; i++)
        bad |= put_i64(g, ti[i].k, ti[i].v);
    bad |= put_attr(g, "stage_layers", H5T_NATIVE_INT, ix->pp, ix->stage_layers);
    H5Gclose(g);
    return bad ? -1 : 0;
}

static int write_tensors(hid_t f, const CkptIndex *ix)
{
    hid_t mt = entry_type();
    hid_t ft = H5Tcopy(mt);
    H5Tpack(ft);
    hsize_t dims[1] = {(hsize_t)ix->n};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t d = H5Dcreate2(f, "tensors", ft, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = d >= 0 && H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, ix->e) >= 0 ? 0 : -1;
    if (d >= 0)
        H5Dclose(d);
    H5Sclose(sp);
    H5Tclose(ft);
    H5Tclose(mt);
    return rc;
}

int ckpt_index_write(const char *path, const CkptIndex *ix, char err[CFG_ERR])
{
    ckpt_h5_quiet();
    hid_t fapl = ckpt_serial_fapl();
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) {
        char why[256];
        ckpt_h5_reason(why, sizeof why);
        ckpt_err(err, "%s: cannot create the checkpoint index: %s", path, why);
        return -1;
    }
    int rc =
        write_groups(f, ix) == 0 && write_tensors(f, ix) == 0 && H5Fflush(f, H5F_SCOPE_LOCAL) >= 0
            ? 0
            : -1;
    /* A full disk: free the file's space so that the close (which writes
     * metadata) succeeds; HDF5 crashes in MPI_Finalize on a file it failed
     * to close.  The file is never published. */
    if (rc != 0 && truncate(path, 0) != 0)
        fprintf(stderr, "trident: warning: %s: cannot truncate: %s\n", path, strerror(errno));
    if (H5Fclose(f) < 0)
        rc = -1;
    if (rc != 0)
        ckpt_err(err, "%s: cannot write the checkpoint index", path);
    return rc;
}

/* ---- read ---- */

/* A uint64 array attribute of exactly n elements. */
static int get_u64s(hid_t loc, const char *name, uint64_t *v, hssize_t n)
{
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0)
        return -1;
    hid_t sp = H5Aget_space(a);
    int rc =
        sp >= 0 && H5Sget_simple_extent_npoints(sp) == n && H5Aread(a, H5T_NATIVE_UINT64, v) >= 0
            ? 0
            : -1;
    if (sp >= 0)
        H5Sclose(sp);
    H5Aclose(a);
    return rc;
}

/* -1: *what is missing or unreadable; -2: attribute *bad_attr of /state
 * does not match its checksum. */
static int read_groups(hid_t f, CkptIndex *ix, const char **what, const char **bad_attr)
{
    char fmt[64] = "";
    int64_t version = 0;
    *what = "attribute 'format' (not a trident checkpoint index)";
    if (get_strbuf(f, "format", fmt, sizeof fmt) || strcmp(fmt, CKPT_FORMAT))
        return -1;
    *what = "attribute 'version'";
    if (get_attr(f, "version", H5T_NATIVE_INT64, &version) || version != CKPT_VERSION)
        return -1;
    *what = "attribute 'config'";
    if (get_str(f, "config", &ix->yaml))
        return -1;

    *what = "group 'state'";
    hid_t g = H5Gopen2(f, "state", H5P_DEFAULT);
    if (g < 0)
        return -1;
    int bad = get_attr(g, "step", H5T_NATIVE_INT64, &ix->state.step);
    bad |= get_attr(g, "sampler_position", H5T_NATIVE_UINT64, &ix->state.sampler_position);
    bad |= get_attr(g, "lr_step", H5T_NATIVE_INT64, &ix->state.lr_step);
    bad |= get_attr(g, "adam_t", H5T_NATIVE_INT64, &ix->state.adam_t);
    bad |= get_attr(g, "rng", H5T_NATIVE_UINT64, ix->state.rng);
    bad |= get_attr(g, "seed", H5T_NATIVE_UINT64, &ix->seed);
    if (bad) {
        H5Gclose(g);
        return -1;
    }
    /* Older checkpoints have neither: the caller says so. */
    ix->has_run = get_strbuf(g, "data_path", ix->data_path, sizeof ix->data_path) == 0;
    uint64_t sums[CKPT_STATE_ATTRS];
    if (ix->has_run && H5Aexists(g, "checksum") > 0) {
        *what = "attribute '/state/checksum'";
        if (get_u64s(g, "checksum", sums, CKPT_STATE_ATTRS) != 0) {
            H5Gclose(g);
            return -1;
        }
        ix->state_checked = 1;
    }
    H5Gclose(g);
    if (ix->state_checked) {
        uint64_t want[CKPT_STATE_ATTRS];
        state_sums(ix, want);
        for (int i = 0; i < CKPT_STATE_ATTRS; i++)
            if (sums[i] != want[i]) {
                *bad_attr = ckpt_state_attr_names[i];
                return -2;
            }
    }

    *what = "group 'model'";
    if ((g = H5Gopen2(f, "model", H5P_DEFAULT)) < 0)
        return -1;
    bad = get_strbuf(g, "arch", ix->arch, sizeof ix->arch);
    bad |= get_strbuf(g, "precision", ix->precision, sizeof ix->precision);
    bad |= get_int(g, "layers", &ix->layers) | get_int(g, "hidden", &ix->hidden);
    bad |= get_int(g, "heads", &ix->heads) | get_int(g, "kv_heads", &ix->kv_heads);
    bad |= get_int(g, "ffn_hidden", &ix->ffn_hidden) | get_int(g, "vocab", &ix->vocab);
    bad |= get_int(g, "seq_len", &ix->seq_len);
    bad |= get_int(g, "tie_embeddings", &ix->tie_embeddings);
    ix->has_norms = get_attr(g, "norm_eps", H5T_NATIVE_DOUBLE, &ix->norm_eps) == 0 &&
                    get_attr(g, "rope_theta", H5T_NATIVE_DOUBLE, &ix->rope_theta) == 0;
    ix->rope_llama3 = H5Aexists(g, "rope_scaling_llama3") > 0;
    if (ix->rope_llama3) {
        bad |= get_doubles(g, "rope_scaling_llama3", ix->rope_params, 4);
        /* read into floats and an int later: in range, or a bad index */
        for (int i = 0; i < 3; i++)
            bad |= !(fabs(ix->rope_params[i]) <= 3e38);
        bad |= !(ix->rope_params[3] >= 0 && ix->rope_params[3] <= INT32_MAX);
    }
    if (H5Aexists(g, "moe") > 0) {
        bad |= get_ints(g, "moe", ix->moe, 5) | get_doubles(g, "moe_coefs", ix->moe_coefs, 3);
        bad |= ix->moe[0] < 1 || ix->moe[0] > MOE_MAX_EXPERTS;
        for (int i = 0; i < 3; i++)
            bad |= !(ix->moe_coefs[i] >= 0 && ix->moe_coefs[i] <= 3e38);
    }
    H5Gclose(g);
    if (bad)
        return -1;

    *what = "group 'topology'";
    if ((g = H5Gopen2(f, "topology", H5P_DEFAULT)) < 0)
        return -1;
    bad = get_int(g, "tp", &ix->tp) | get_int(g, "pp", &ix->pp) | get_int(g, "dp", &ix->dp);
    bad |= get_int(g, "zero", &ix->zero) | get_int(g, "world", &ix->world);
    if (!bad && (ix->pp < 1 || ix->pp > CFG_MAX_STAGES))
        bad = 1;
    if (!bad)
        bad = get_ints(g, "stage_layers", ix->stage_layers, CFG_MAX_STAGES);
    H5Gclose(g);
    return bad ? -1 : 0;
}

static int read_tensors(hid_t f, CkptIndex *ix)
{
    hid_t d = H5Dopen2(f, "tensors", H5P_DEFAULT);
    if (d < 0)
        return -1;
    hid_t sp = H5Dget_space(d);
    hsize_t n = 0;
    int rc = sp >= 0 && H5Sget_simple_extent_ndims(sp) == 1 &&
                     H5Sget_simple_extent_dims(sp, &n, NULL) == 1
                 ? 0
                 : -1;
    if (rc == 0) {
        ix->n = (int)n;
        ix->e = trd_calloc(n, sizeof(CkptEntry), "checkpoint index");
        hid_t mt = entry_type();
        rc = H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, ix->e) >= 0 ? 0 : -1;
        H5Tclose(mt);
    }
    if (sp >= 0)
        H5Sclose(sp);
    H5Dclose(d);
    /* Fixed-length fields are NUL-terminated by construction; make sure. */
    for (int i = 0; rc == 0 && i < ix->n; i++) {
        CkptEntry *e = &ix->e[i];
        e->name[PARAM_NAME - 1] = e->kind[CKPT_KIND_NAME - 1] = '\0';
        e->file[CKPT_FILE_NAME - 1] = e->dtype[CKPT_DTYPE_NAME - 1] = '\0';
        if (e->ndim < 1 || e->ndim > 2 || strchr(e->file, '/'))
            rc = -1;
    }
    return rc;
}

/* Ranges every index must satisfy whoever wrote it: a value outside them
 * is damage the checksums could not see (an older index has none) or a
 * writer's bug, and resuming from it would train on a wrong state. */
int ckpt_index_check(const char *path, const CkptIndex *ix, char err[CFG_ERR])
{
    const CkptState *s = &ix->state;
    const char *bad = NULL;
    char why[160] = "";
    if (s->step < 0 || s->step > INT32_MAX) {
        bad = "step";
        snprintf(why, sizeof why, "%lld, expected 0..%d", (long long)s->step, INT32_MAX);
    } else if (s->lr_step < 0 || s->lr_step > s->step) {
        bad = "lr_step";
        snprintf(why, sizeof why, "%lld, expected 0..step (%lld)", (long long)s->lr_step,
                 (long long)s->step);
    } else if (s->adam_t < 0 || s->adam_t > s->step) {
        bad = "adam_t";
        snprintf(why, sizeof why, "%lld, expected 0..step (%lld): Adam counts one per update",
                 (long long)s->adam_t, (long long)s->step);
    } else if (s->sampler_position < (uint64_t)s->step ||
               s->sampler_position > (uint64_t)s->step * (uint64_t)INT32_MAX) {
        /* Each step consumes global_batch (1..INT32_MAX) samples. */
        bad = "sampler_position";
        snprintf(why, sizeof why,
                 "%llu, expected step x global_batch, between %lld and "
                 "%lld x %d",
                 (unsigned long long)s->sampler_position, (long long)s->step, (long long)s->step,
                 INT32_MAX);
    }
    const char *group = "state";
    /* tp x pp x dp in 64 bits overflows for sizes near 2^31 (fuzzing,
     * issue 34): an overflow is a mismatch. */
    int64_t ranks = 0;
    const bool wrapped = __builtin_mul_overflow((int64_t)ix->tp, (int64_t)ix->pp, &ranks) ||
                         __builtin_mul_overflow(ranks, (int64_t)ix->dp, &ranks);
    if (!bad && (ix->tp < 1 || ix->pp < 1 || ix->pp > CFG_MAX_STAGES || ix->dp < 1 ||
                 ix->zero < 0 || ix->zero > 3 || wrapped || ranks != ix->world)) {
        /* The saving layout is only reported (a load reads the global
         * layout), but a value no run can have is damage too. */
        group = "topology";
        bad = ix->zero < 0 || ix->zero > 3 ? "zero" : "world";
        snprintf(why, sizeof why,
                 "tp %d, pp %d, dp %d, zero %d, world %d: expected sizes >= 1, "
                 "zero 0..3, pp at most the stage limit, world = tp x pp x dp",
                 ix->tp, ix->pp, ix->dp, ix->zero, ix->world);
    }
    if (!bad && (ix->heads < 1 || ix->kv_heads < 1 || ix->hidden < 1 || ix->hidden % ix->heads ||
                 ix->heads % ix->kv_heads || ix->tie_embeddings < 0 || ix->tie_embeddings > 1)) {
        group = "model";
        bad = "heads";
        snprintf(why, sizeof why,
                 "hidden %d, heads %d, kv_heads %d, tie_embeddings %d: expected heads dividing "
                 "hidden, kv_heads dividing heads, tie_embeddings 0 or 1",
                 ix->hidden, ix->heads, ix->kv_heads, ix->tie_embeddings);
    }
    if (!bad) {
        /* The sizes a config may have: an export or a resume builds tables
         * and loops from them (issue 34). */
        const ModelConfig m = {.layers = ix->layers,
                               .hidden = ix->hidden,
                               .heads = ix->heads,
                               .kv_heads = ix->kv_heads,
                               .ffn_hidden = ix->ffn_hidden,
                               .vocab = ix->vocab,
                               .seq_len = ix->seq_len,
                               .vocab_pad_multiple = 1};
        char sizes[CFG_ERR];
        if (config_model_sizes(&m, sizes) != 0) {
            group = "model";
            bad = "layers";
            snprintf(why, sizeof why, "%.150s", sizes);
        }
    }
    for (int st = 0; !bad && st < ix->pp; st++)
        if (ix->stage_layers[st] < 0 || ix->stage_layers[st] > ix->layers) {
            group = "topology";
            bad = "stage_layers";
            snprintf(why, sizeof why, "stage %d has %d layers, expected 0..layers (%d)", st,
                     ix->stage_layers[st], ix->layers);
        }
    if (!bad)
        return 0;
    ckpt_err(err, "%s: attribute '/%s/%s' is out of range (%s) — the index is corrupted", path,
             group, bad, why);
    return -1;
}

int ckpt_index_read(const char *path, CkptIndex *ix, char err[CFG_ERR])
{
    memset(ix, 0, sizeof *ix);
    ckpt_h5_quiet();
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        ckpt_err(err,
                 "%s: cannot open the checkpoint index (missing: is this a checkpoint "
                 "directory step_<N>?)",
                 path);
        return -1;
    }
    fclose(probe);
    hid_t fapl = ckpt_serial_fapl();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (f < 0) {
        char why[256];
        ckpt_h5_reason(why, sizeof why);
        ckpt_err(err, "%s: not a readable HDF5 file (truncated or corrupted?): %s", path, why);
        return -1;
    }
    const char *what = "", *bad_attr = "";
    int rc = read_groups(f, ix, &what, &bad_attr);
    if (rc == -2) {
        ckpt_err(err,
                 "%s: attribute '/state/%s' does not match its checksum — the index is "
                 "corrupted",
                 path, bad_attr);
        rc = -1;
    } else if (rc != 0)
        ckpt_err(err, "%s: bad checkpoint index: missing or unreadable %s", path, what);
    else if (ckpt_index_check(path, ix, err) != 0)
        rc = -1;
    else if ((rc = read_tensors(f, ix)) != 0)
        ckpt_err(err, "%s: bad checkpoint index: unreadable dataset 'tensors'", path);
    H5Fclose(f);
    if (rc != 0)
        ckpt_index_free(ix);
    return rc;
}

void ckpt_index_free(CkptIndex *ix)
{
    free(ix->e);
    free(ix->yaml);
    ix->e = NULL;
    ix->yaml = NULL;
    ix->n = 0;
}

const CkptEntry *ckpt_index_find(const CkptIndex *ix, const char *name, CkptKind kind)
{
    for (int i = 0; i < ix->n; i++)
        if (!strcmp(ix->e[i].name, name) && !strcmp(ix->e[i].kind, ckpt_kind_names[kind]))
            return &ix->e[i];
    return NULL;
}

/* ---- broadcast form: header | entries | yaml ---- */

void *ckpt_index_pack(const CkptIndex *ix, size_t *bytes)
{
    const size_t ylen = ix->yaml ? strlen(ix->yaml) + 1 : 1;
    const size_t en = (size_t)ix->n * sizeof(CkptEntry);
    *bytes = sizeof *ix + en + ylen;
    char *buf = trd_malloc(*bytes, "checkpoint index");
    CkptIndex head = *ix;
    head.e = NULL;
    head.yaml = NULL;
    memcpy(buf, &head, sizeof head);
    if (en)
        memcpy(buf + sizeof head, ix->e, en);
    memcpy(buf + sizeof head + en, ix->yaml ? ix->yaml : "", ylen);
    return buf;
}

void ckpt_index_unpack(CkptIndex *ix, const void *buf)
{
    const char *p = buf;
    memcpy(ix, p, sizeof *ix);
    const size_t en = (size_t)ix->n * sizeof(CkptEntry);
    ix->e = trd_malloc(en, "checkpoint index");
    memcpy(ix->e, p + sizeof *ix, en);
    const char *y = p + sizeof *ix + en;
    size_t ylen = strlen(y) + 1;
    ix->yaml = trd_malloc(ylen, "checkpoint index");
    memcpy(ix->yaml, y, ylen);
}

void ckpt_index_model_line(const CkptIndex *ix, char *out, size_t n)
{
    snprintf(out, n,
             "arch %s, layers %d, hidden %d, heads %d, kv_heads %d, ffn_hidden %d, vocab %d, "
             "tie_embeddings %d",
             ix->arch, ix->layers, ix->hidden, ix->heads, ix->kv_heads, ix->ffn_hidden, ix->vocab,
             ix->tie_embeddings);
    const size_t used = strlen(out);
    if (ix->moe[0] > 0 && used < n)
        snprintf(out + used, n - used, ", moe %d experts top-%d", ix->moe[0], ix->moe[1]);
}

/* ---- per-dataset checksums ---- */

int ckpt_put_checksums(hid_t d, const CkptEntry *e, const uint64_t *sums)
{
    const int64_t rows = ckpt_block_rows(e->ndim, e->shape);
    const int64_t n = ckpt_n_blocks(e->ndim, e->shape);
    hsize_t dims[1] = {(hsize_t)n};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t a = H5Acreate2(d, "checksum", H5T_STD_U64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, sums) >= 0 ? 0 : -1;
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    sp = H5Screate(H5S_SCALAR);
    a = H5Acreate2(d, "checksum_rows", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, H5T_NATIVE_INT64, &rows) < 0)
        rc = -1;
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

int ckpt_set_checksums(hid_t d, const uint64_t *sums)
{
    hid_t a = H5Aopen(d, "checksum", H5P_DEFAULT);
    int rc = a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, sums) >= 0 ? 0 : -1;
    if (a >= 0)
        H5Aclose(a);
    return rc;
}

int ckpt_get_checksums(hid_t d, const CkptEntry *e, uint64_t **sums)
{
    *sums = NULL;
    int64_t rows = 0;
    if (get_attr(d, "checksum_rows", H5T_NATIVE_INT64, &rows) != 0 ||
        rows != ckpt_block_rows(e->ndim, e->shape))
        return -1;
    const int64_t n = ckpt_n_blocks(e->ndim, e->shape);
    hid_t a = H5Aopen(d, "checksum", H5P_DEFAULT);
    if (a < 0)
        return -1;
    hid_t sp = H5Aget_space(a);
    int rc = sp >= 0 && H5Sget_simple_extent_npoints(sp) == n ? 0 : -1;
    if (rc == 0) {
        *sums = trd_malloc((size_t)n * sizeof(uint64_t), "checksums");
        if (H5Aread(a, H5T_NATIVE_UINT64, *sums) < 0) {
            free(*sums);
            *sums = NULL;
            rc = -1;
        }
    }
    if (sp >= 0)
        H5Sclose(sp);
    H5Aclose(a);
    return rc;
}

void ckpt_index_describe(CkptIndex *ix, const Config *cfg, Precision precision)
{
    const ModelConfig *m = &cfg->model;
    ix->seed = cfg->run.seed;
    snprintf(ix->data_path, sizeof ix->data_path, "%s", config_data_name(&cfg->data));
    snprintf(ix->arch, sizeof ix->arch, "%s", config_arch_name(m->arch));
    snprintf(ix->precision, sizeof ix->precision, "%s", config_precision_name(precision));
    ix->layers = m->layers;
    ix->hidden = m->hidden;
    ix->heads = m->heads;
    ix->kv_heads = m->kv_heads;
    ix->ffn_hidden = m->ffn_hidden;
    ix->vocab = m->vocab;
    ix->seq_len = m->seq_len;
    ix->tie_embeddings = m->tie_embeddings;
    ix->norm_eps = m->norm_eps;
    ix->rope_theta = m->rope_theta;
    ix->rope_llama3 = m->rope_scaling == ROPE_SCALING_LLAMA3;
    const double p[4] = {m->rope_factor, m->rope_low_freq_factor, m->rope_high_freq_factor,
                         m->rope_original_max_position_embeddings};
    memcpy(ix->rope_params, ix->rope_llama3 ? p : (const double[4]){0}, sizeof p);
    const int moe[5] = {m->moe_experts, m->moe_top_k, m->moe_every, m->moe_ffn_hidden,
                        m->moe_shared_experts};
    const double coefs[3] = {m->moe_aux_loss_coef, m->moe_z_loss_coef, m->moe_capacity_factor};
    memcpy(ix->moe, m->moe_experts > 0 ? moe : (const int[5]){0}, sizeof moe);
    memcpy(ix->moe_coefs, m->moe_experts > 0 ? coefs : (const double[3]){0}, sizeof coefs);
}

void ckpt_index_moe(const CkptIndex *ix, ModelConfig *m)
{
    m->moe_experts = ix->moe[0];
    m->moe_top_k = ix->moe[1];
    m->moe_every = ix->moe[2];
    m->moe_ffn_hidden = ix->moe[3];
    m->moe_shared_experts = ix->moe[4];
    m->moe_aux_loss_coef = (float)ix->moe_coefs[0];
    m->moe_z_loss_coef = (float)ix->moe_coefs[1];
    m->moe_capacity_factor = (float)ix->moe_coefs[2];
}

void ckpt_index_rope_scaling(const CkptIndex *ix, ModelConfig *m)
{
    m->rope_scaling = ix->rope_llama3 ? ROPE_SCALING_LLAMA3 : ROPE_SCALING_NONE;
    m->rope_factor = ix->rope_llama3 ? (float)ix->rope_params[0] : 0;
    m->rope_low_freq_factor = ix->rope_llama3 ? (float)ix->rope_params[1] : 0;
    m->rope_high_freq_factor = ix->rope_llama3 ? (float)ix->rope_params[2] : 0;
    m->rope_original_max_position_embeddings = ix->rope_llama3 ? (int)ix->rope_params[3] : 0;
}
