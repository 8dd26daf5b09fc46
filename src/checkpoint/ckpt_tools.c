/* ckpt_tools.c — what `trident ckpt inspect`, `verify` and `export` do
 * (the front end is src/cli/ckpt_cli.c): the checkpoint read by a person,
 * checked block by block, and the weights handed to other tools as one
 * plain HDF5 file.  Serial (the sec2 driver of the same HDF5 library), so
 * none needs mpiexec.  Each prints its result and returns an exit code. */
#include "checkpoint/ckpt_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

static int fail(int code, const char *msg)
{
    fprintf(stderr, "trident: error: %s\n", msg);
    return code;
}

static int open_index(const char *arg, char step_dir[CFG_STR], CkptIndex *ix, char err[CFG_ERR])
{
    if (ckpt_resolve(NULL, RESUME_PATH, arg, step_dir, err) != 1)
        return -1;
    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/index.h5", step_dir);
    return ckpt_index_read(path, ix, err);
}

int ckpt_read_state(const char *step_dir, CkptState *st, char err[CFG_ERR])
{
    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/index.h5", step_dir);
    CkptIndex ix;
    if (ckpt_index_read(path, &ix, err) != 0)
        return -1;
    *st = ix.state;
    ckpt_index_free(&ix);
    return 0;
}

static void print_shape(char *out, size_t n, const CkptEntry *e)
{
    if (e->ndim == 1)
        snprintf(out, n, "[%lld]", (long long)e->shape[0]);
    else
        snprintf(out, n, "[%lld, %lld]", (long long)e->shape[0], (long long)e->shape[1]);
}

static int verify_all(const char *step_dir, const CkptIndex *ix, int64_t *bytes, char err[CFG_ERR]);

int ckpt_inspect(const char *arg, int check)
{
    ckpt_h5_quiet();
    char step_dir[CFG_STR], err[CFG_ERR];
    CkptIndex ix;
    if (open_index(arg, step_dir, &ix, err) != 0)
        return fail(TRD_EXIT_INPUT, err);
    const CkptState *s = &ix.state;
    printf("checkpoint: %s\n", step_dir);
    printf("state: step %lld, sampler_position %llu, lr_step %lld, adam_t %lld, seed %llu\n",
           (long long)s->step, (unsigned long long)s->sampler_position, (long long)s->lr_step,
           (long long)s->adam_t, (unsigned long long)ix.seed);
    printf("run: data_path %s; state checksums %s\n", ix.has_run ? ix.data_path : "(not recorded)",
           ix.state_checked ? "match" : "not recorded (older trident)");
    char line[256];
    ckpt_index_model_line(&ix, line, sizeof line);
    printf("model: %s, seq_len %d, precision %s", line, ix.seq_len, ix.precision);
    if (ix.has_norms)
        printf(", norm_eps %g, rope_theta %g", ix.norm_eps, ix.rope_theta);
    if (ix.rope_llama3) {
        ModelConfig m = {0};
        char rs[160];
        ckpt_index_rope_scaling(&ix, &m);
        config_rope_scaling_text(&m, rs, sizeof rs);
        printf(", rope_scaling %s", rs);
    }
    printf("\n");
    printf("topology: tp %d, pp %d, dp %d, zero %d, world %d, stage_layers [", ix.tp, ix.pp, ix.dp,
           ix.zero, ix.world);
    for (int i = 0; i < ix.pp; i++)
        printf("%s%d", i ? ", " : "", ix.stage_layers[i]);
    printf("]\n");

    printf("files:");
    for (int k = 0; k < ix.pp; k++) {
        char path[CKPT_FILE_PATH];
        snprintf(path, sizeof path, "%s/stage_%d.h5", step_dir, k);
        struct stat st;
        if (stat(path, &st) == 0)
            printf(" stage_%d.h5 %.1f MiB;", k, trd_mib((size_t)st.st_size));
        else
            printf(" stage_%d.h5 MISSING;", k);
    }
    printf("\n");

    int64_t total = 0;
    printf("datasets: %d\n  %-7s %-40s %-16s %-8s %10s  %s\n", ix.n, "kind", "name", "shape",
           "dtype", "MiB", "file");
    for (int i = 0; i < ix.n; i++) {
        const CkptEntry *e = &ix.e[i];
        char shape[64];
        print_shape(shape, sizeof shape, e);
        printf("  %-7s %-40s %-16s %-8s %10.3f  %s:/%s/%s\n", e->kind, e->name, shape, e->dtype,
               trd_mib((size_t)e->nbytes), e->file, e->kind, e->name);
        total += e->nbytes;
    }
    printf("total: %.1f MiB of tensor data\n", trd_mib((size_t)total));
    printf("config:\n%s", ix.yaml ? ix.yaml : "");
    int code = TRD_EXIT_OK;
    if (!check) {
        printf("data: not verified (trident ckpt verify %s reads and checks every tensor)\n",
               step_dir);
    } else if (verify_all(step_dir, &ix, &total, err) == 0) {
        printf("data: verified: every checksum matches, every value is finite\n");
    } else {
        printf("data: NOT VERIFIED: %s\n", err);
        code = fail(TRD_EXIT_RUNTIME, err);
    }
    ckpt_index_free(&ix);
    return code;
}

/* Every checksum block of a whole tensor in buf matches (0), or -1. */
static int verify_whole(hid_t d, const CkptEntry *e, const float *buf, int64_t *bad_row)
{
    uint64_t *sums = NULL;
    if (ckpt_get_checksums(d, e, &sums) != 0) {
        *bad_row = -1;
        return -1;
    }
    const int64_t R = ckpt_block_rows(e->ndim, e->shape), cols = e->shape[1];
    int rc = 0;
    for (int64_t r0 = 0; r0 < e->shape[0] && rc == 0; r0 += R) {
        const int64_t n = r0 + R < e->shape[0] ? R : e->shape[0] - r0;
        if (ckpt_checksum_rows(buf + r0 * cols, r0, n, cols) != sums[r0 / R]) {
            *bad_row = r0;
            rc = -1;
        }
    }
    free(sums);
    return rc;
}

/* Read one whole stored tensor (checksums verified) into a new buffer. */
static float *read_whole(const char *step_dir, const CkptEntry *e, char err[CFG_ERR])
{
    char path[CKPT_FILE_PATH], dset[CKPT_PATH_NAME], why[256];
    snprintf(path, sizeof path, "%s/%s", step_dir, e->file);
    snprintf(dset, sizeof dset, "%s/%s", e->kind, e->name);
    hid_t fapl = ckpt_serial_fapl();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (f < 0) {
        ckpt_h5_reason(why, sizeof why);
        ckpt_err(err, "%s: cannot open (missing, truncated or corrupted?) for tensor '%s': %s",
                 path, e->name, why);
        return NULL;
    }
    size_t n = (size_t)(e->shape[0] * e->shape[1]);
    float *buf = trd_malloc(n * sizeof(float), e->name);
    hid_t d = H5Dopen2(f, dset, H5P_DEFAULT);
    int64_t bad_row = 0;
    if (d < 0 || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        ckpt_h5_reason(why, sizeof why);
        ckpt_err(err, "%s: cannot read tensor '%s' (dataset '/%s'): %s", path, e->name, dset, why);
        free(buf);
        buf = NULL;
    } else if (verify_whole(d, e, buf, &bad_row) != 0) {
        if (bad_row < 0)
            ckpt_err(err, "%s: tensor '%s' (dataset '/%s') has no valid checksum attributes", path,
                     e->name, dset);
        else
            ckpt_err(err,
                     "%s: tensor '%s' (dataset '/%s'): checksum mismatch in the block at "
                     "row %lld — the file is corrupted",
                     path, e->name, dset, (long long)bad_row);
        free(buf);
        buf = NULL;
    }
    if (d >= 0)
        H5Dclose(d);
    H5Fclose(f);
    return buf;
}

/* Every dataset the index lists: read whole (read_whole verifies each
 * checksum block) and every value finite.  0, or -1 with err naming the
 * file and the tensor. */
static int verify_all(const char *step_dir, const CkptIndex *ix, int64_t *bytes, char err[CFG_ERR])
{
    *bytes = 0;
    for (int i = 0; i < ix->n; i++) {
        const CkptEntry *e = &ix->e[i];
        float *buf = read_whole(step_dir, e, err);
        if (!buf)
            return -1;
        const size_t n = (size_t)(e->shape[0] * e->shape[1]);
        size_t bad = 0, first = 0;
        for (size_t j = 0; j < n; j++)
            if (!isfinite(buf[j]) && !bad++)
                first = j;
        free(buf);
        if (bad) {
            ckpt_err(err,
                     "%s/%s: tensor '%s' (dataset '/%s/%s') holds %zu non-finite values "
                     "(the first at flat element %zu)",
                     step_dir, e->file, e->name, e->kind, e->name, bad, first);
            return -1;
        }
        *bytes += e->nbytes;
    }
    return 0;
}

int ckpt_verify(const char *arg)
{
    ckpt_h5_quiet();
    char step_dir[CFG_STR], err[CFG_ERR];
    if (ckpt_resolve(NULL, RESUME_PATH, arg, step_dir, err) != 1)
        return fail(TRD_EXIT_INPUT, err);
    CkptIndex ix;
    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/index.h5", step_dir);
    /* The index read checks the training state's checksums and ranges. */
    if (ckpt_index_read(path, &ix, err) != 0)
        return fail(TRD_EXIT_RUNTIME, err);
    int64_t bytes = 0;
    const int rc = verify_all(step_dir, &ix, &bytes, err);
    if (rc == 0)
        printf("%s: verified: step %lld, %d datasets, %.1f MiB: every checksum matches, every "
               "value is finite%s\n",
               step_dir, (long long)ix.state.step, ix.n, trd_mib((size_t)bytes),
               ix.state_checked ? ", training state checksums match"
                                : " (older index: no training state checksums)");
    ckpt_index_free(&ix);
    return rc == 0 ? TRD_EXIT_OK : fail(TRD_EXIT_RUNTIME, err);
}

static int put_attr_str(hid_t loc, const char *name, const char *s)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a >= 0 && H5Awrite(a, t, &s) >= 0 ? 0 : -1;
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    return rc;
}

static int put_attr_i64(hid_t loc, const char *name, int64_t v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0 ? 0 : -1;
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

int ckpt_export_h5(const char *arg, const char *out, int master)
{
    ckpt_h5_quiet();
    char step_dir[CFG_STR], err[CFG_ERR];
    CkptIndex ix;
    if (open_index(arg, step_dir, &ix, err) != 0)
        return fail(TRD_EXIT_INPUT, err);
    const int has_master = ix.n && ckpt_index_find(&ix, ix.e[0].name, CKPT_MASTER);
    /* A bf16 checkpoint stores the master weights only: its weights are
     * their bf16 rounding. */
    const int derive = !master && has_master && !ckpt_index_find(&ix, ix.e[0].name, CKPT_PARAMS);
    const CkptKind kind = master || derive ? CKPT_MASTER : CKPT_PARAMS;
    if (master && !has_master) {
        ckpt_err(err, "%s: --master: this checkpoint has no master weights (precision %s)",
                 step_dir, ix.precision);
        ckpt_index_free(&ix);
        return fail(TRD_EXIT_INPUT, err);
    }
    hid_t fapl = ckpt_serial_fapl();
    hid_t f = H5Fcreate(out, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) {
        char why[256];
        ckpt_h5_reason(why, sizeof why);
        ckpt_err(err, "%s: cannot create: %s", out, why);
        ckpt_index_free(&ix);
        return fail(TRD_EXIT_RUNTIME, err);
    }
    int bad = put_attr_str(f, "format", "trident-weights") | put_attr_i64(f, "step", ix.state.step);
    bad |= put_attr_str(f, "arch", ix.arch) | put_attr_str(f, "source", step_dir);
    bad |= put_attr_str(f, "config", ix.yaml ? ix.yaml : "");
    int code = bad ? TRD_EXIT_RUNTIME : TRD_EXIT_OK;
    if (bad)
        ckpt_err(err, "%s: cannot write attributes", out);
    int count = 0;
    for (int i = 0; i < ix.n && code == TRD_EXIT_OK; i++) {
        const CkptEntry *e = &ix.e[i];
        if (strcmp(e->kind, ckpt_kind_names[kind]))
            continue;
        float *buf = read_whole(step_dir, e, err);
        if (!buf) {
            code = TRD_EXIT_INPUT;
            break;
        }
        const size_t n = (size_t)(e->shape[0] * e->shape[1]);
        for (size_t j = 0; derive && j < n; j++)
            buf[j] = bf16_round(buf[j]);
        hid_t sp = ckpt_space(e->ndim, e->shape);
        hid_t d = H5Dcreate2(f, e->name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (d < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
            ckpt_err(err, "%s: cannot write tensor '%s'", out, e->name);
            code = TRD_EXIT_RUNTIME;
        }
        if (d >= 0)
            H5Dclose(d);
        H5Sclose(sp);
        free(buf);
        count++;
    }
    if (H5Fclose(f) < 0 && code == TRD_EXIT_OK) {
        ckpt_err(err, "%s: cannot close", out);
        code = TRD_EXIT_RUNTIME;
    }
    if (code != TRD_EXIT_OK) {
        remove(out); /* no half-written export left behind */
        ckpt_index_free(&ix);
        return fail(code, err);
    }
    printf("exported %d tensors of step %lld (%s) to %s\n", count, (long long)ix.state.step,
           ckpt_kind_names[kind], out);
    ckpt_index_free(&ix);
    return TRD_EXIT_OK;
}
