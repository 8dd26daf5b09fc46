/* ckpt_load.c — find the checkpoint to resume from, and read it into any
 * topology.
 *
 * Rank 0 reads index.h5 and broadcasts it.  Every rank then checks its whole
 * local table against the index (each name present, global shapes equal),
 * and reads, for each tensor and each wanted kind, the global hyperslab of
 * its TP slice ∩ its flat range from the stage file the index names.  Reads
 * are independent (each rank opens the files it needs on MPI_COMM_SELF), so
 * a failure on one rank cannot leave the others in a collective; the ranks
 * agree on the outcome at the end. */
#include "checkpoint/ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "comm/comm.h"
#include "comm/comm_mpi.h"
#include "core/error.h"

/* ---- resolve ---- */

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* <dir>/latest -> <dir>/<name>: 1 found, 0 no latest, -1 broken. */
static int follow_latest(const char *dir, char out[CFG_STR], char err[CFG_ERR])
{
    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char name[CFG_STR] = "";
    char *got = fgets(name, sizeof name, f);
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    if (!got || !name[0] || strchr(name, '/') || strncmp(name, "step_", 5)) {
        ckpt_err(err, "%s: does not name a checkpoint step directory ('%s')", path, name);
        return -1;
    }
    if ((size_t)snprintf(out, CFG_STR, "%s/%s", dir, name) >= CFG_STR) {
        ckpt_err(err, "%s/%s: path too long", dir, name);
        return -1;
    }
    char index[CKPT_FILE_PATH];
    snprintf(index, sizeof index, "%s/index.h5", out);
    if (!is_file(index)) {
        ckpt_err(err, "%s names %s, which is not a complete checkpoint (no index.h5)", path, out);
        return -1;
    }
    return 1;
}

/* Whether step directory `path` (named step_<step>) is complete and its
 * index verifies: index.h5 reads (state checksums and ranges), records this
 * step, and every stage file it names opens as HDF5.  0, or -1 with why. */
static int step_complete(const char path[CFG_STR], int64_t step, char why[CFG_ERR])
{
    char file[CKPT_FILE_PATH];
    snprintf(file, sizeof file, "%s/index.h5", path);
    CkptIndex ix;
    if (ckpt_index_read(file, &ix, why) != 0)
        return -1;
    int rc = 0;
    if (ix.state.step != step) {
        ckpt_err(why, "%s records step %lld", file, (long long)ix.state.step);
        rc = -1;
    }
    hid_t fapl = ckpt_serial_fapl();
    for (int k = 0; k < ix.pp && rc == 0; k++) {
        snprintf(file, sizeof file, "%s/stage_%d.h5", path, k);
        hid_t f = is_file(file) ? H5Fopen(file, H5F_ACC_RDONLY, fapl) : -1;
        if (f < 0) {
            ckpt_err(why, "%s: missing or not readable", file);
            rc = -1;
        } else {
            H5Fclose(f);
        }
    }
    H5Pclose(fapl);
    ckpt_index_free(&ix);
    return rc;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x > y ? -1 : x < y;
}

/* No <dir>/latest: the newest step_<N> that is complete and verifies
 * (step_complete), never a .tmp.  1 with out and a note in err saying
 * what was taken and skipped; 0 when there are no step directories; -1
 * when there are some and none verifies (err lists them). */
static int newest_complete(const char *dir, char out[CFG_STR], char err[CFG_ERR])
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    /* Every step directory, however many: the newest must not hide
     * behind readdir's order. */
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s = ckpt_parse_step(de->d_name);
        char path[CKPT_FILE_PATH];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (s >= 0 && is_dir(path))
            ckpt_push_step(&steps, &n, &cap, s);
    }
    closedir(d);
    if (n == 0) {
        free(steps);
        return 0;
    }
    qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
    char skipped[CFG_ERR] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        char name[32], path[CFG_STR], why[CFG_ERR];
        ckpt_step_name(name, sizeof name, steps[i]);
        const int len = snprintf(path, sizeof path, "%s/%s", dir, name);
        if (len < 0 || len >= CFG_STR)
            snprintf(why, sizeof why, "path too long");
        else if (step_complete(path, steps[i], why) == 0) {
            snprintf(out, CFG_STR, "%s", path);
            ckpt_err(err,
                     "%s/latest is missing: resuming from the newest complete checkpoint "
                     "that verifies, %s%s%s",
                     dir, name, used ? "; skipped: " : "", skipped);
            free(steps);
            return 1;
        }
        int w = snprintf(skipped + used, sizeof skipped - used, "%s%s (%s)", used ? "; " : "", name,
                         why);
        if (w > 0)
            used = used + (size_t)w < sizeof skipped ? used + (size_t)w : sizeof skipped - 1;
    }
    free(steps);
    ckpt_err(err,
             "%s/latest is missing and no step directory there is a complete checkpoint: "
             "%s",
             dir, skipped);
    return -1;
}

int ckpt_resolve(const char *dir, ResumeKind kind, const char *path, char out[CFG_STR],
                 char err[CFG_ERR])
{
    out[0] = err[0] = '\0';
    if (kind == RESUME_NEVER)
        return 0;
    if (kind == RESUME_AUTO) {
        if (!dir || !dir[0])
            return 0;
        int rc = follow_latest(dir, out, err);
        return rc == 0 ? newest_complete(dir, out, err) : rc;
    }
    /* A path: a step directory, or a checkpoint.dir whose latest is taken. */
    char index[CKPT_FILE_PATH];
    snprintf(index, sizeof index, "%s/index.h5", path);
    if (is_file(index)) {
        snprintf(out, CFG_STR, "%s", path);
        return 1;
    }
    if (!is_dir(path)) {
        ckpt_err(err, "%s: no such checkpoint directory", path);
        return -1;
    }
    int rc = follow_latest(path, out, err);
    if (rc == 0)
        ckpt_err(err, "%s: not a checkpoint (no index.h5, no latest)", path);
    return rc == 1 ? 1 : -1;
}

/* ---- the index, on every rank ---- */

static int share_index(const char *step_dir, Comm *world, CkptIndex *ix, char err[CFG_ERR])
{
    const int rank = world->rank;
    long long bytes = 0;
    void *buf = NULL;
    if (rank == 0) {
        char path[CKPT_FILE_PATH];
        snprintf(path, sizeof path, "%s/index.h5", step_dir);
        if (!is_dir(step_dir))
            ckpt_err(err, "%s: checkpoint directory does not exist", step_dir);
        else if (ckpt_index_read(path, ix, err) == 0) {
            size_t n = 0;
            buf = ckpt_index_pack(ix, &n);
            bytes = (long long)n;
            ckpt_index_free(ix);
        }
    }
    if (ckpt_agree(world, rank == 0 && bytes == 0 ? -1 : 0, err) != 0)
        return -1;
    comm_broadcast(world, &bytes, sizeof bytes, 0);
    if (rank != 0)
        buf = trd_malloc((size_t)bytes, "checkpoint index");
    /* An index is small (one record per dataset): one broadcast. */
    comm_broadcast(world, buf, (size_t)bytes, 0);
    ckpt_index_unpack(ix, buf);
    free(buf);
    return 0;
}

/* ---- checks ---- */

static void model_line(const ModelConfig *m, char *out, size_t n)
{
    snprintf(out, n,
             "arch %s, layers %d, hidden %d, heads %d, kv_heads %d, ffn_hidden %d, vocab %d, "
             "tie_embeddings %d",
             config_arch_name(m->arch), m->layers, m->hidden, m->heads, m->kv_heads, m->ffn_hidden,
             m->vocab, m->tie_embeddings);
    const size_t used = strlen(out);
    if (m->moe_experts > 0 && used < n)
        snprintf(out + used, n - used, ", moe %d experts top-%d", m->moe_experts, m->moe_top_k);
}

static void shape_str(char *out, size_t n, int ndim, const int64_t shape[2])
{
    if (ndim == 1)
        snprintf(out, n, "[%lld]", (long long)shape[0]);
    else
        snprintf(out, n, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
}

/* Every tensor of the local table is in the index with its global shape,
 * and the saved model is this one. */
static int check_model(const char *dir, const CkptIndex *ix, const ParamTable *t,
                       const ModelConfig *m, char err[CFG_ERR])
{
    char saved[256], ours[256];
    ckpt_index_model_line(ix, saved, sizeof saved);
    model_line(m, ours, sizeof ours);
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        const CkptEntry *e = ckpt_index_find(ix, p->name, CKPT_PARAMS);
        if (!e) /* bf16: the master weights only */
            e = ckpt_index_find(ix, p->name, CKPT_MASTER);
        if (!e) {
            ckpt_err(err,
                     "%s/index.h5: checkpoint has no tensor '%s' that this model needs "
                     "(saved model: %s; this model: %s)",
                     dir, p->name, saved, ours);
            return -1;
        }
        int64_t want[2] = {p->real_rows, p->shape[1]};
        if (e->ndim != p->ndim || e->shape[0] != want[0] || e->shape[1] != want[1]) {
            char a[64], b[64];
            shape_str(a, sizeof a, e->ndim, e->shape);
            shape_str(b, sizeof b, p->ndim, want);
            ckpt_err(err,
                     "%s/%s: tensor '%s' has shape %s in the checkpoint, this model needs "
                     "%s (saved model: %s; this model: %s)",
                     dir, e->file, p->name, a, b, saved, ours);
            return -1;
        }
    }
    /* Shapes can agree while the models differ (more layers saved, a head
     * left over from an untied model): refuse those too. */
    if (strcmp(ix->arch, config_arch_name(m->arch)) || ix->layers != m->layers ||
        ix->tie_embeddings != m->tie_embeddings) {
        ckpt_err(err,
                 "%s/index.h5: checkpoint of another model (saved model: %s; this "
                 "model: %s)",
                 dir, saved, ours);
        return -1;
    }
    return 0;
}

/* Is `name` in the comma list of checkpoint.allow_changes? */
static int allowed(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, ",");
        if (k == n && !strncmp(p, name, n))
            return 1;
        p += k + (p[k] == ',');
    }
    return 0;
}

/* Every model hyper-parameter the index records equals the config's (the
 * shapes can agree while heads, eps or theta differ, and the run would
 * silently train another model); run.seed and data.path only with
 * checkpoint.allow_changes, and then rank 0 warns.  Older indexes lack
 * some records: rank 0 says which were not compared. */
static int check_hparams(const char *dir, const CkptIndex *ix, const ModelConfig *m,
                         int with_seq_len, char err[CFG_ERR])
{
    const char *arch = config_arch_name(m->arch);
    if (strcmp(ix->arch, arch)) {
        ckpt_err(err, "%s/index.h5: model.arch is %s in the checkpoint, %s in the config", dir,
                 ix->arch, arch);
        return -1;
    }
    const struct {
        const char *key;
        int saved, ours;
    } ints[] = {{"layers", ix->layers, m->layers},
                {"hidden", ix->hidden, m->hidden},
                {"heads", ix->heads, m->heads},
                {"kv_heads", ix->kv_heads, m->kv_heads},
                {"ffn_hidden", ix->ffn_hidden, m->ffn_hidden},
                {"vocab", ix->vocab, m->vocab},
                {"tie_embeddings", ix->tie_embeddings, m->tie_embeddings},
                {"seq_len", ix->seq_len, m->seq_len}};
    const size_t n_ints = sizeof ints / sizeof ints[0] - !with_seq_len;
    for (size_t i = 0; i < n_ints; i++)
        if (ints[i].saved != ints[i].ours) {
            ckpt_err(err, "%s/index.h5: model.%s is %d in the checkpoint, %d in the config", dir,
                     ints[i].key, ints[i].saved, ints[i].ours);
            return -1;
        }
    /* Stored as the double of the config's float: equal means identical. */
    if (ix->has_norms &&
        ((float)ix->norm_eps != m->norm_eps || (float)ix->rope_theta != m->rope_theta)) {
        const int eps = (float)ix->norm_eps != m->norm_eps;
        const double a = eps ? ix->norm_eps : ix->rope_theta;
        const double b = eps ? (double)m->norm_eps : (double)m->rope_theta;
        /* Short forms unless they look equal (floats 1 ulp apart). */
        char sa[32], sb[32];
        snprintf(sa, sizeof sa, "%g", a);
        snprintf(sb, sizeof sb, "%g", b);
        if (!strcmp(sa, sb)) {
            snprintf(sa, sizeof sa, "%.9g", a);
            snprintf(sb, sizeof sb, "%.9g", b);
        }
        ckpt_err(err, "%s/index.h5: model.%s is %s in the checkpoint, %s in the config", dir,
                 eps ? "norm_eps" : "rope_theta", sa, sb);
        return -1;
    }
    ModelConfig saved = *m;
    ckpt_index_rope_scaling(ix, &saved);
    if (!config_rope_scaling_same(&saved, m)) {
        char sa[160], sb[160];
        config_rope_scaling_text(&saved, sa, sizeof sa);
        config_rope_scaling_text(m, sb, sizeof sb);
        ckpt_err(err, "%s/index.h5: model.rope_scaling is %s in the checkpoint, %s in the config",
                 dir, sa, sb);
        return -1;
    }
    /* model.moe: the same experts and routing (dense: all 0 on both sides). */
    ckpt_index_moe(ix, &saved);
    const int ours[5] = {m->moe_experts, m->moe_experts ? m->moe_top_k : 0,
                         m->moe_experts ? m->moe_every : 0, m->moe_experts ? m->moe_ffn_hidden : 0,
                         m->moe_experts ? m->moe_shared_experts : 0};
    static const char *const moe_keys[5] = {"experts", "top_k", "every", "ffn_hidden",
                                            "shared_experts"};
    for (int i = 0; i < 5; i++)
        if (ix->moe[i] != ours[i]) {
            ckpt_err(err, "%s/index.h5: model.moe.%s is %d in the checkpoint, %d in the config",
                     dir, moe_keys[i], ix->moe[i], ours[i]);
            return -1;
        }
    return 0;
}

static int check_run(const char *dir, const CkptIndex *ix, const Config *cfg, int rank,
                     char err[CFG_ERR])
{
    if (check_hparams(dir, ix, &cfg->model, 1, err) != 0)
        return -1;
    const char *allow = cfg->checkpoint.allow_changes;
    const int seed_changed = ix->seed != cfg->run.seed;
    const char *data = config_data_name(&cfg->data);
    const int data_changed = ix->has_run && strcmp(ix->data_path, data);
    if ((seed_changed && !allowed(allow, "seed")) || (data_changed && !allowed(allow, "data"))) {
        if (seed_changed && !allowed(allow, "seed"))
            ckpt_err(err,
                     "%s/index.h5: run.seed is %llu in the checkpoint, %llu in the config; "
                     "resuming would draw another sample order (allow it with "
                     "checkpoint.allow_changes: seed)",
                     dir, (unsigned long long)ix->seed, (unsigned long long)cfg->run.seed);
        else
            ckpt_err(err,
                     "%s/index.h5: data.path is '%s' in the checkpoint, '%s' in the config; "
                     "the sample position would index another dataset (allow it with "
                     "checkpoint.allow_changes: data)",
                     dir, ix->data_path, data);
        return -1;
    }
    if (rank != 0)
        return 0;
    if (seed_changed)
        fprintf(stderr,
                "trident: warning: run.seed changed from %llu (checkpoint) to %llu "
                "(allowed by checkpoint.allow_changes)\n",
                (unsigned long long)ix->seed, (unsigned long long)cfg->run.seed);
    if (data_changed)
        fprintf(stderr,
                "trident: warning: data.path changed from '%s' (checkpoint) to '%s' "
                "(allowed by checkpoint.allow_changes)\n",
                ix->data_path, data);
    if (!ix->has_norms || !ix->has_run || !ix->state_checked) {
        char missing[160] = "";
        if (!ix->has_norms)
            strcat(missing, ", model.norm_eps and rope_theta");
        if (!ix->has_run)
            strcat(missing, ", data.path");
        if (!ix->state_checked)
            strcat(missing, ", the training state checksums");
        fprintf(stderr, "trident: note: %s/index.h5 is from an older trident; not checked: %s\n",
                dir, missing + 2);
    }
    return 0;
}

/* ---- reading ---- */

typedef struct {
    char name[CKPT_FILE_NAME];
    hid_t f;
} OpenFile;

typedef struct {
    const char *dir;
    OpenFile files[CFG_MAX_STAGES + 1];
    int n_files;
    hid_t fapl;
} Reader;

static hid_t reader_file(Reader *r, const char *file, const char *tensor, char err[CFG_ERR])
{
    for (int i = 0; i < r->n_files; i++)
        if (!strcmp(r->files[i].name, file))
            return r->files[i].f;
    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/%s", r->dir, file);
    if (!is_file(path)) {
        ckpt_err(err, "%s: missing checkpoint file (holds tensor '%s')", path, tensor);
        return -1;
    }
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, r->fapl);
    if (f < 0) {
        char why[256];
        ckpt_h5_reason(why, sizeof why);
        ckpt_err(err, "%s: cannot open (truncated or corrupted?) while reading tensor '%s': %s",
                 path, tensor, why);
        return -1;
    }
    TRD_ASSERT(r->n_files < CFG_MAX_STAGES + 1);
    snprintf(r->files[r->n_files].name, CKPT_FILE_NAME, "%s", file);
    r->files[r->n_files++].f = f;
    return f;
}

static void reader_close(Reader *r)
{
    for (int i = 0; i < r->n_files; i++)
        H5Fclose(r->files[i].f);
    r->n_files = 0;
}

/* Rows [r0, r1) of a dataset, all columns, into buf. */
static int read_rows(hid_t d, const CkptEntry *e, int64_t r0, int64_t r1, float *buf)
{
    hid_t fspace = ckpt_space(e->ndim, e->shape);
    hsize_t start[2] = {(hsize_t)r0, 0}, count[2] = {(hsize_t)(r1 - r0), (hsize_t)e->shape[1]};
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL);
    hsize_t n = (hsize_t)((r1 - r0) * e->shape[1]);
    hid_t mspace = H5Screate_simple(1, &n, NULL);
    int rc = H5Dread(d, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, buf) >= 0 ? 0 : -1;
    H5Sclose(mspace);
    H5Sclose(fspace);
    return rc;
}

/* Copy the part of the slab that lies in rows [r0, r1) (held whole in buf)
 * to its place in dst (slab order). */
static void copy_rows(const CkptSlab *s, const float *buf, int64_t r0, int64_t r1, int64_t cols,
                      float *dst)
{
    size_t at = 0;
    for (int i = 0; i < s->n; i++) {
        const CkptBlock *b = &s->b[i];
        int64_t lo = b->r > r0 ? b->r : r0, hi = b->r + b->nr < r1 ? b->r + b->nr : r1;
        for (int64_t r = lo; r < hi; r++)
            memcpy(dst + at + (size_t)((r - b->r) * b->nc), buf + (r - r0) * cols + b->c,
                   (size_t)b->nc * sizeof(float));
        at += (size_t)(b->nr * b->nc);
    }
}

/* Read the slab of one tensor from dataset /<kind>/<name>.  Whole checksum
 * blocks are read and verified, then the slab's part of each is copied. */
static int read_slab(Reader *r, const CkptEntry *e, const CkptSlab *s, float *dst,
                     char err[CFG_ERR])
{
    hid_t f = reader_file(r, e->file, e->name, err);
    if (f < 0)
        return -1;
    char dset[CKPT_PATH_NAME], why[256];
    snprintf(dset, sizeof dset, "%s/%s", e->kind, e->name);
    hid_t d = H5Dopen2(f, dset, H5P_DEFAULT);
    if (d < 0) {
        ckpt_h5_reason(why, sizeof why);
        ckpt_err(err, "%s/%s: cannot open dataset '/%s' of tensor '%s': %s", r->dir, e->file, dset,
                 e->name, why);
        return -1;
    }
    hid_t fspace = H5Dget_space(d);
    hsize_t dims[2] = {0, 1};
    int nd = fspace >= 0 ? H5Sget_simple_extent_dims(fspace, dims, NULL) : -1;
    if (fspace >= 0)
        H5Sclose(fspace);
    uint64_t *sums = NULL;
    int rc = -1;
    if (nd != e->ndim || (int64_t)dims[0] != e->shape[0] ||
        (nd == 2 && (int64_t)dims[1] != e->shape[1])) {
        ckpt_err(err,
                 "%s/%s: dataset '/%s' of tensor '%s' does not have the shape the index "
                 "records",
                 r->dir, e->file, dset, e->name);
    } else if (ckpt_get_checksums(d, e, &sums) != 0) {
        ckpt_err(err,
                 "%s/%s: dataset '/%s' of tensor '%s' has no valid checksum attributes "
                 "(damaged, or not written by trident)",
                 r->dir, e->file, dset, e->name);
    } else {
        const int64_t R = ckpt_block_rows(e->ndim, e->shape), cols = e->shape[1];
        const int64_t row_lo = s->b[0].r, row_hi = s->b[s->n - 1].r + s->b[s->n - 1].nr;
        float *buf = trd_malloc((size_t)(R * cols) * sizeof(float), "checkpoint read buffer");
        rc = 0;
        for (int64_t blk = row_lo / R; rc == 0 && blk * R < row_hi; blk++) {
            const int64_t r0 = blk * R, r1 = r0 + R < e->shape[0] ? r0 + R : e->shape[0];
            /* A block inside a run of whole rows is read in place. */
            const int direct = s->contiguous && r0 * cols >= s->gfirst &&
                               r1 * cols <= s->gfirst + (int64_t)s->count;
            float *into = direct ? dst + (r0 * cols - s->gfirst) : buf;
            if (read_rows(d, e, r0, r1, into) != 0) {
                ckpt_h5_reason(why, sizeof why);
                ckpt_err(err,
                         "%s/%s: cannot read tensor '%s' (dataset '/%s'): %s — the file is "
                         "corrupted or truncated",
                         r->dir, e->file, e->name, dset, why);
                rc = -1;
            } else if (ckpt_checksum_rows(into, r0, r1 - r0, cols) != sums[blk]) {
                ckpt_err(err,
                         "%s/%s: tensor '%s' (dataset '/%s'): checksum mismatch in rows "
                         "[%lld, %lld) — the file is corrupted",
                         r->dir, e->file, e->name, dset, (long long)r0, (long long)r1);
                rc = -1;
            } else if (!direct) {
                copy_rows(s, buf, r0, r1, cols, dst);
            }
        }
        free(buf);
    }
    free(sums);
    H5Dclose(d);
    return rc;
}

/* Which stored kind fills kind k of the view (the precision fallbacks). */
static CkptKind source_kind(const CkptIndex *ix, const CkptShardView *v, CkptKind k)
{
    const char *probe = ix->n ? ix->e[0].name : "";
    const int saved_master = ckpt_index_find(ix, probe, CKPT_MASTER) != NULL;
    const int saved_params = ckpt_index_find(ix, probe, CKPT_PARAMS) != NULL;
    if (k == CKPT_MASTER && !saved_master)
        return CKPT_PARAMS; /* an fp32 run: the weights are the master */
    /* A bf16 run read by an fp32 one; or any bf16 checkpoint since the
     * weights are no longer stored beside the master weights. */
    if (k == CKPT_PARAMS && saved_master && (!v->part[CKPT_MASTER].data || !saved_params))
        return CKPT_MASTER;
    return k;
}

/* Read kind k over the flat range [lo, hi) of its part. */
static int read_kind(Reader *r, const CkptIndex *ix, const CkptShardView *v, CkptKind k, size_t lo,
                     size_t hi, char err[CFG_ERR])
{
    const CkptRange *part = &v->part[k];
    if (lo >= hi)
        return 0;
    const CkptKind src = source_kind(ix, v, k);
    for (int i = 0; i < v->table->n; i++) {
        const ParamSpec *p = &v->table->p[i];
        CkptSlab slabs[CKPT_MAX_RUNS];
        int64_t first_row[CKPT_MAX_RUNS];
        const int ns = ckpt_slabs(p, p->real_rows, lo, hi, slabs, first_row);
        if (!ns)
            continue;
        const CkptEntry *e = ckpt_index_find(ix, p->name, src);
        if (!e) {
            ckpt_err(err, "%s/index.h5: checkpoint has no %s for tensor '%s'", r->dir,
                     ckpt_kind_names[src], p->name);
            return -1;
        }
        /* Every holder reads its rows, replicated ones included. */
        for (int j = 0; j < ns; j++)
            if (read_slab(r, e, &slabs[j], ckpt_range_at(part, slabs[j].first), err) != 0)
                return -1;
    }
    return 0;
}

/* Held whole by every DP rank: read in blocks, then all-gathered. */
static int gathered(const CkptShardView *v, CkptKind k)
{
    const CkptRange *part = &v->part[k];
    /* Experts divided over ep: the dp ranks do not hold the same range. */
    return v->dp > 1 && part->data && part->lo == 0 && part->hi == v->table->numel &&
           v->table->ep == 1;
}

/* Complete the gathered kinds over the DP group (collective over world). */
static void gather_kinds(const CkptShardView *v)
{
    const int color = v->pp_rank * v->table->tp + v->table->tp_rank;
    Comm c = comm_split(v->world, color, v->dp_rank);
    TRD_ASSERT(c.size == v->dp && c.rank == v->dp_rank);
    const size_t P = v->table->numel, S = (P + (size_t)v->dp - 1) / (size_t)v->dp;
    for (int k = 0; k < CKPT_KINDS; k++) {
        if (!gathered(v, (CkptKind)k))
            continue;
        float *d = v->part[k].data;
        CommHandle h = comm_iallgather_range_f32(&c, d + v->block_lo, d, 0, P, S);
        comm_wait(&h);
    }
    comm_free(&c);
}

static int load(const char *step_dir, const CkptShardView *v, CkptState *st, const Config *cfg,
                int weights_only, char err[CFG_ERR])
{
    err[0] = '\0';
    ckpt_h5_quiet();
    CkptIndex ix;
    memset(&ix, 0, sizeof ix);
    if (share_index(step_dir, v->world, &ix, err) != 0)
        return -1;
    const int rank = v->world->rank;
    int rc;
    if (weights_only) {
        /* The hyper-parameters first, so a mismatch names both values; the
         * sequence length only through the shapes (gpt2's wpe); run.seed
         * and data.path are the new run's own. */
        rc = check_hparams(step_dir, &ix, &cfg->model, 0, err);
        if (rc == 0)
            rc = check_model(step_dir, &ix, v->table, &cfg->model, err);
    } else {
        rc = check_model(step_dir, &ix, v->table, &cfg->model, err);
        if (rc == 0)
            rc = check_run(step_dir, &ix, cfg, rank, err);
    }
    if (rc == 0) {
        Reader r = {.dir = step_dir, .n_files = 0, .fapl = H5Pcreate(H5P_FILE_ACCESS)};
        TRD_ASSERT(r.fapl >= 0 && H5Pset_fapl_mpio(r.fapl, MPI_COMM_SELF, MPI_INFO_NULL) >= 0);
        for (int k = 0; k < CKPT_KINDS && rc == 0; k++) {
            const CkptRange *part = &v->part[k];
            if (!part->data)
                continue;
            const int g = gathered(v, (CkptKind)k);
            rc = read_kind(&r, &ix, v, (CkptKind)k, g ? v->block_lo : part->lo,
                           g ? v->block_hi : part->hi, err);
            if (rc == 0) /* a second run (ckpt.h), else empty */
                rc = read_kind(&r, &ix, v, (CkptKind)k, part->xlo, part->xhi, err);
        }
        reader_close(&r);
        H5Pclose(r.fapl);
    }
    if (rc == 0 && st)
        *st = ix.state;
    ckpt_index_free(&ix);
    if (ckpt_agree(v->world, rc, err) != 0)
        return -1;
    if (v->dp > 1)
        gather_kinds(v);
    return 0;
}

int ckpt_load(const char *step_dir, const CkptShardView *v, CkptState *st, const Config *cfg,
              char err[CFG_ERR])
{
    return load(step_dir, v, st, cfg, 0, err);
}

int ckpt_load_weights(const char *step_dir, const CkptShardView *v, const Config *cfg,
                      char err[CFG_ERR])
{
    CkptShardView w = *v;
    w.part[CKPT_ADAM_M].data = NULL;
    w.part[CKPT_ADAM_V].data = NULL;
    return load(step_dir, &w, NULL, cfg, 1, err);
}
