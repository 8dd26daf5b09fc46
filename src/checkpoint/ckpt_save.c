/* ckpt_save.c — write a checkpoint collectively, then publish it atomically.
 *
 * Order of events (docs/design.md, invariant 2):
 *   1. rank 0 creates <dir>/step_X.tmp (removing one left by a crash);
 *   2. the stage leaders' tensor lists are gathered, so every rank knows
 *      which stage writes a name held by several stages (a tied embedding);
 *   3. the ranks of stage k create stage_k.h5 together (MPI-IO), create every
 *      dataset with identical calls, write their own pieces of the data
 *      (pwrite at the datasets' file offsets, O_DIRECT where possible),
 *      reduce the block checksums (one MPI_Allreduce), record them as
 *      attributes, flush (MPI_File_sync) and close; rank 0 writes
 *      index.h5;
 *   4. every rank reports; only then rank 0 renames step_X.tmp -> step_X,
 *      rewrites <dir>/latest through latest.tmp + fsync + rename, and prunes
 *      published steps beyond `keep`.
 * A kill before 4 leaves a step_X.tmp that nothing reads and the next save
 * of that step removes. */
#include "checkpoint/ckpt_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_mpi.h"
#include "core/error.h"
#include "zero/zero.h"

/* ---- the view ---- */

void ckpt_view_init(CkptShardView *v, const ParamTable *t, int zero, int dp_rank, int dp,
                    int pp_rank, Comm *world)
{
    memset(v, 0, sizeof *v);
    /* ZeRO's rule (zero.h): what stage `zero` keeps whole, what in blocks. */
    const size_t P = t->numel;
    zero_block(P, dp, dp_rank, &v->block_lo, &v->block_hi);
    v->xblock_lo = v->xblock_hi = P;
    if (t->ep > 1) { /* experts divided over ep (params.h): two regions, two groups */
        const size_t Pd = t->dense_numel;
        TRD_ASSERT(dp % t->ep == 0 && dp_rank % t->ep == t->ep_rank);
        zero_block(Pd, dp, dp_rank, &v->block_lo, &v->block_hi);
        zero_block(P - Pd, dp / t->ep, dp_rank / t->ep, &v->xblock_lo, &v->xblock_hi);
        v->xblock_lo += Pd;
        v->xblock_hi += Pd;
    }
    const ZeroWhole whole = zero_stage_whole(zero);
    for (int k = 0; k < CKPT_KINDS; k++) {
        const int w = k == CKPT_PARAMS ? whole.params : whole.optimizer;
        v->part[k] =
            (CkptRange){.data = NULL, .lo = w ? 0 : v->block_lo, .hi = w ? P : v->block_hi};
        if (!w && t->ep > 1) { /* the expert block, the optimizer's second range */
            v->part[k].xlo = v->xblock_lo;
            v->part[k].xhi = v->xblock_hi;
        }
    }
    v->table = t;
    v->pp_rank = pp_rank;
    v->dp_rank = dp_rank;
    v->dp = dp;
    v->zero = zero;
    v->world = world;
}

/* ---- step 2: who writes which tensor ---- */

typedef struct {
    CkptEntry *e; /* one per distinct tensor name, kind "params" */
    int n;
    int tp, pp;
    int stage_layers[CFG_MAX_STAGES];
} Catalog;

static int layers_of(const ParamTable *t)
{
    int lo = 1 << 30, hi = -1;
    for (int i = 0; i < t->n; i++)
        if (t->p[i].role == ROLE_BLOCK) {
            lo = t->p[i].layer < lo ? t->p[i].layer : lo;
            hi = t->p[i].layer > hi ? t->p[i].layer : hi;
        }
    return hi < 0 ? 0 : hi - lo + 1;
}

static CkptEntry entry_of(const ParamSpec *p, int stage)
{
    CkptEntry e;
    memset(&e, 0, sizeof e);
    snprintf(e.name, sizeof e.name, "%s", p->name);
    snprintf(e.kind, sizeof e.kind, "%s", ckpt_kind_names[CKPT_PARAMS]);
    snprintf(e.file, sizeof e.file, "stage_%d.h5", stage);
    snprintf(e.dtype, sizeof e.dtype, "float32");
    e.ndim = p->ndim;
    e.stage = stage;
    e.shape[0] = p->real_rows;
    e.shape[1] = p->shape[1];
    e.nbytes = e.shape[0] * e.shape[1] * (int64_t)sizeof(float);
    return e;
}

/* Gather the tensor lists of the stage leaders (stage rank 0) onto every
 * rank; a name held by several stages belongs to the first. */
static void gather_catalog(Catalog *c, const CkptShardView *v, int stage_rank)
{
    const int mine = stage_rank == 0 ? v->table->n : 0;
    CkptEntry *local = trd_calloc((size_t)(mine ? mine : 1), sizeof(CkptEntry), "catalog");
    for (int i = 0; i < mine; i++)
        local[i] = entry_of(&v->table->p[i], v->pp_rank);

    size_t total = 0;
    CkptEntry *all =
        comm_allgatherv_bytes(v->world, local, (size_t)mine * sizeof(CkptEntry), &total, NULL);
    const int n_all = (int)(total / sizeof(CkptEntry));

    /* Stage order, then each stage's table order: the index lists tensors
     * the way the model is laid out. */
    c->e = trd_calloc((size_t)(n_all ? n_all : 1), sizeof(CkptEntry), "catalog");
    c->n = 0;
    int max_stage = 0;
    for (int i = 0; i < n_all; i++)
        max_stage = all[i].stage > max_stage ? all[i].stage : max_stage;
    for (int s = 0; s <= max_stage; s++)
        for (int i = 0; i < n_all; i++) {
            if (all[i].stage != s)
                continue;
            int dup = 0;
            for (int j = 0; j < c->n && !dup; j++)
                dup = !strcmp(c->e[j].name, all[i].name);
            if (!dup)
                c->e[c->n++] = all[i];
        }

    /* layers[s] - 1: layers of stage s (0: no such stage); the last slot
     * carries the TP size. */
    int layers[CFG_MAX_STAGES + 1] = {0};
    TRD_ASSERT(v->pp_rank >= 0 && v->pp_rank < CFG_MAX_STAGES);
    layers[v->pp_rank] = layers_of(v->table) + 1;
    layers[CFG_MAX_STAGES] = v->table->tp;
    comm_allreduce_max_i32(v->world, layers, CFG_MAX_STAGES + 1);
    c->tp = layers[CFG_MAX_STAGES];
    c->pp = 0;
    for (int s = 0; s < CFG_MAX_STAGES; s++)
        if (layers[s]) {
            c->pp = s + 1;
            c->stage_layers[s] = layers[s] - 1;
        }
    free(all);
    free(local);
}

static int catalog_owner(const Catalog *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].name, name))
            return c->e[i].stage;
    return -1;
}

/* ---- step 3: one stage file, by the ranks of the stage ---- */

/* The first I/O error of this rank in a stage file.  After one, the rank
 * writes no more data but still makes every collective HDF5 call of the
 * sequence (creates, attributes, closes), so no rank of the stage is left
 * waiting; the ranks then agree and nothing is published.  (Ending the job
 * at once instead left HDF5 files open into MPI_Finalize, which crashed.) */
typedef struct {
    const char *path;
    int failed;
    char err[CFG_ERR];
} StageIo;

static int io_ok(StageIo *io, int ok, const char *tensor, const char *what)
{
    if (ok || io->failed)
        return ok;
    char why[256];
    ckpt_h5_reason(why, sizeof why);
    ckpt_err(io->err, "%s: %s%s%s: %s", io->path, what, tensor ? " of tensor " : "",
             tensor ? tensor : "", why);
    io->failed = 1;
    return 0;
}

/* Contiguous, allocated at creation (as parallel HDF5 does), never filled:
 * every element is written.  HDF5 filters (Fletcher32) would need a
 * collective transfer per dataset, a dozen collectives each (slow and,
 * with HDF5 1.10, fragile when some ranks have nothing to write); our
 * block checksums need one reduction per file. */
static hid_t create_dataset(hid_t group, const CkptEntry *e, StageIo *io)
{
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    io_ok(io,
          dcpl >= 0 && H5Pset_layout(dcpl, H5D_CONTIGUOUS) >= 0 &&
              H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0 &&
              H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0,
          e->name, "dataset properties");
    hid_t space = ckpt_space(e->ndim, e->shape);
    hid_t d = H5Dcreate2(group, e->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    io_ok(io, d >= 0, e->name, "cannot create dataset");
    H5Sclose(space);
    H5Pclose(dcpl);
    return d;
}

/* ---- the tensors' bytes (ckpt_raw.c) ---- */

/* This rank's slab of dataset d (nothing when it is empty, or after an I/O
 * error of this rank). */
static void write_slab(CkptRaw *w, hid_t d, const CkptEntry *e, const CkptSlab *s, const float *src,
                       const char *kind, StageIo *io)
{
    if (!s->count || io->failed || d < 0)
        return;
    const haddr_t base = H5Dget_offset(d);
    if (!io_ok(io, base != HADDR_UNDEF, e->name, "no file offset for the data"))
        return;
    const int64_t cols = e->shape[1];
    int ok = 1;
    for (int i = 0; ok && i < s->n; i++) {
        const CkptBlock *b = &s->b[i];
        /* Whole rows are one run of bytes, else one run per row. */
        const int whole = b->nc == cols;
        const int64_t runs = whole ? 1 : b->nr, per = whole ? b->nr * b->nc : b->nc;
        for (int64_t r = 0; ok && r < runs; r++) {
            const off_t at =
                (off_t)(base + (haddr_t)(((b->r + r) * cols + b->c) * (int64_t)sizeof(float)));
            ok = ckpt_raw_write(w, (const char *)src, (size_t)per * sizeof(float), at) == 0;
            src += per;
        }
    }
    if (!ok && !io->failed) {
        ckpt_err(io->err, "%s: cannot write %s of tensor %s: %s", io->path, kind, e->name,
                 strerror(errno));
        io->failed = 1;
    }
}

/* The slabs of kind k this rank writes for p: its range ∩ its ZeRO block,
 * rows it owns only (params_row_owned: tensors not split over TP belong
 * to TP rank 0, replicated kv rows to the first of their holders). */
static int writer_slabs(const CkptShardView *v, const ParamSpec *p, int k, int64_t rows,
                        CkptSlab out[CKPT_MAX_RUNS])
{
    const CkptRange *r = &v->part[k];
    const size_t blo = p->ep_region ? v->xblock_lo : v->block_lo;
    const size_t bhi = p->ep_region ? v->xblock_hi : v->block_hi;
    const int second = p->ep_region && r->xhi > r->xlo; /* in the range's second run */
    size_t lo = second ? r->xlo : r->lo, hi = second ? r->xhi : r->hi;
    lo = lo > blo ? lo : blo;
    hi = hi < bhi ? hi : bhi;
    if (lo >= hi)
        return 0;
    CkptSlab all[CKPT_MAX_RUNS];
    int64_t first_row[CKPT_MAX_RUNS];
    int n = ckpt_slabs(p, rows, lo, hi, all, first_row), m = 0;
    for (int i = 0; i < n; i++)
        if (params_row_owned(v->table, p, first_row[i]))
            out[m++] = all[i];
    if (m && !r->data)
        trd_fatal(TRD_EXIT_RUNTIME, NULL,
                  "checkpoint: no buffer given for %s of tensor %s (a bug in the caller)",
                  ckpt_kind_names[k], p->name);
    return m;
}

/* The datasets of a stage file: (kind, tensor) pairs this stage owns, in
 * the same order on every rank of the stage. */
typedef struct {
    CkptEntry e;
    int kind, param; /* kind, index in the local table */
    size_t sum_at;   /* first checksum block in the stage's array */
    hid_t d;
} StageSet;

static StageSet *stage_sets(const CkptShardView *v, const Catalog *c, const int *kinds, int n_kinds,
                            int *n_out, size_t *n_sums)
{
    StageSet *sets = trd_calloc((size_t)(n_kinds * v->table->n + 1), sizeof *sets, "datasets");
    int n = 0;
    size_t sums = 0;
    for (int kk = 0; kk < n_kinds; kk++)
        for (int i = 0; i < v->table->n; i++) {
            const ParamSpec *p = &v->table->p[i];
            if (catalog_owner(c, p->name) != v->pp_rank)
                continue; /* a copy held by a later stage (tied embedding) */
            StageSet *x = &sets[n++];
            x->e = entry_of(p, v->pp_rank);
            snprintf(x->e.kind, sizeof x->e.kind, "%s", ckpt_kind_names[kinds[kk]]);
            x->kind = kinds[kk];
            x->param = i;
            x->sum_at = sums;
            sums += (size_t)ckpt_n_blocks(x->e.ndim, x->e.shape);
        }
    *n_out = n;
    *n_sums = sums;
    return sets;
}

/* Returns 0, or -1 with err: this rank's first I/O error, else the first
 * tensor it holds with a non-finite value.  Either way the file is closed
 * and every rank of the stage made the same collective calls; the caller
 * agrees with the other ranks and does not publish. */
static int write_stage(const char *path, const CkptShardView *v, const Catalog *c, const int *kinds,
                       int n_kinds, Comm *stage, char err[CFG_ERR])
{
    StageIo io = {.path = path, .failed = 0, .err = ""};
    char nonfinite[CFG_ERR] = "";
    /* HDF5 writes the metadata only (the data: write_slab); no
     * read-modify-write data sieving of it either. */
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "romio_ds_write", "disable");
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    TRD_ASSERT(fapl >= 0 && H5Pset_fapl_mpio(fapl, comm_mpi(stage), info) >= 0 &&
               ckpt_fapl_tensor_layout(fapl) == 0);
    /* Collective: every rank of the stage gets the same outcome. */
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    MPI_Info_free(&info);
    if (!io_ok(&io, f >= 0, NULL, "cannot create the stage file")) {
        snprintf(err, CFG_ERR, "%s", io.err);
        return -1;
    }

    int n = 0;
    size_t n_sums = 0;
    StageSet *sets = stage_sets(v, c, kinds, n_kinds, &n, &n_sums);
    uint64_t *sums = trd_calloc(n_sums + 1, sizeof(uint64_t), "checksums");
    for (int kk = 0; kk < n_kinds; kk++) {
        /* Creating groups and datasets changes metadata: every rank of the
         * stage makes the same calls in the same order. */
        hid_t g = H5Gcreate2(f, ckpt_kind_names[kinds[kk]], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        io_ok(&io, g >= 0, NULL, "cannot create group");
        for (int i = 0; i < n; i++)
            if (sets[i].kind == kinds[kk]) {
                sets[i].d = create_dataset(g, &sets[i].e, &io);
                /* The checksum attributes are made now, beside the header,
                 * and filled in place once the sums are known. */
                io_ok(&io, ckpt_put_checksums(sets[i].d, &sets[i].e, sums + sets[i].sum_at) == 0,
                      sets[i].e.name, "cannot create checksum attributes");
            }
        if (g >= 0)
            H5Gclose(g);
    }
    CkptRaw raw;
    io_ok(&io, ckpt_raw_open(&raw, path) == 0, NULL, "cannot open for the tensors' data");
    for (int i = 0; i < n; i++) {
        StageSet *x = &sets[i];
        const ParamSpec *p = &v->table->p[x->param];
        CkptSlab slabs[CKPT_MAX_RUNS];
        const int ns = writer_slabs(v, p, x->kind, x->e.shape[0], slabs);
        for (int j = 0; j < ns; j++) {
            const CkptSlab *s = &slabs[j];
            const float *src = ckpt_range_at(&v->part[x->kind], s->first);
            write_slab(&raw, x->d, &x->e, s, src, x->e.kind, &io);
            const int64_t bad = ckpt_checksum_slab(
                s, x->e.shape[1], ckpt_block_rows(x->e.ndim, x->e.shape), src, sums + x->sum_at);
            if (bad && !nonfinite[0])
                ckpt_err(nonfinite,
                         "%s: tensor '%s' (%s) holds %lld non-finite value%s (NaN or "
                         "Inf): checkpoint not published",
                         path, x->e.name, x->e.kind, (long long)bad, bad == 1 ? "" : "s");
        }
    }
    if (ckpt_raw_close(&raw, !io.failed) != 0 && !io.failed) {
        ckpt_err(io.err, "%s: cannot sync the tensors' data: %s", path, strerror(errno));
        io.failed = 1;
    }
    /* Each block's writers hold parts of its sum: one reduction for the
     * whole file, then every rank records the same attributes. */
    comm_allreduce_sum_u64(stage, sums, n_sums);
    /* After an I/O error (a full disk) the closes below must still succeed:
     * HDF5 keeps a file it failed to close and crashes on it in
     * MPI_Finalize.  They flush metadata, so first free the space of this
     * unfinished file (it is never published; a truncated file still has
     * its space freed while open, an unlinked one does not). */
    int any_failed = io.failed;
    comm_allreduce_max_i32(stage, &any_failed, 1);
    if (any_failed) {
        if (stage->rank == 0 && truncate(path, 0) != 0)
            fprintf(stderr, "trident: warning: %s: cannot truncate the unfinished file: %s\n", path,
                    strerror(errno));
        comm_barrier(stage);
    }
    for (int i = 0; i < n; i++) {
        if (!any_failed)
            io_ok(&io, ckpt_set_checksums(sets[i].d, sums + sets[i].sum_at) == 0, sets[i].e.name,
                  "cannot write checksums");
        io_ok(&io, sets[i].d < 0 || H5Dclose(sets[i].d) >= 0, sets[i].e.name,
              "cannot close dataset");
    }
    /* Flush syncs the file (MPI_File_sync): the data is on disk before the
     * step can be published. */
    if (!any_failed)
        io_ok(&io, H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0, NULL, "cannot flush");
    io_ok(&io, H5Fclose(f) >= 0, NULL, "cannot close");
    if (any_failed && !io.failed)
        ckpt_err(io.err, "%s: another rank of this stage failed to write it", path);
    io.failed |= any_failed;
    free(sums);
    free(sets);
    if (io.failed || nonfinite[0]) {
        snprintf(err, CFG_ERR, "%s", io.failed ? io.err : nonfinite);
        return -1;
    }
    return 0;
}

/* ---- rank 0: the index ---- */

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = trd_malloc((size_t)(n > 0 ? n : 0) + 1, "config text");
    size_t got = n > 0 ? fread(s, 1, (size_t)n, f) : 0;
    s[got] = '\0';
    fclose(f);
    return s;
}

static int write_index(const char *tmp, const Catalog *c, const CkptShardView *v,
                       const CkptState *st, const Config *cfg, const int *kinds, int n_kinds,
                       char err[CFG_ERR])
{
    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/config.yaml", tmp);
    if (config_write_yaml(cfg, path, err) != 0 || ckpt_fsync_path(path, 0) != 0) {
        if (!err[0])
            ckpt_err(err, "%s: cannot sync: %s", path, strerror(errno));
        return -1;
    }
    CkptIndex ix;
    memset(&ix, 0, sizeof ix);
    ix.state = *st;
    ckpt_index_describe(&ix, cfg, cfg->training.precision);
    ix.pp = c->pp;
    memcpy(ix.stage_layers, c->stage_layers, sizeof ix.stage_layers);
    ix.dp = v->dp;
    ix.zero = v->zero;
    ix.world = v->world->size;
    ix.tp = c->tp;
    ix.yaml = read_text(path);
    ix.n = c->n * n_kinds;
    ix.e = trd_calloc((size_t)(ix.n ? ix.n : 1), sizeof(CkptEntry), "checkpoint index");
    for (int kk = 0, j = 0; kk < n_kinds; kk++)
        for (int i = 0; i < c->n; i++, j++) {
            ix.e[j] = c->e[i];
            snprintf(ix.e[j].kind, sizeof ix.e[j].kind, "%s", ckpt_kind_names[kinds[kk]]);
        }
    snprintf(path, sizeof path, "%s/index.h5", tmp);
    int rc = ckpt_index_write(path, &ix, err);
    if (rc == 0 && ckpt_fsync_path(path, 0) != 0) {
        ckpt_err(err, "%s: cannot sync: %s", path, strerror(errno));
        rc = -1;
    }
    ckpt_index_free(&ix);
    return rc;
}

/* ---- agreement ---- */

/* Every rank ends with the lowest failing rank's message (or rc 0). */
int ckpt_agree(Comm *world, int rc, char err[CFG_ERR])
{
    int first = rc != 0 ? world->rank : world->size;
    comm_allreduce_min_i32(world, &first, 1);
    if (first == world->size)
        return 0;
    comm_broadcast(world, err, CFG_ERR, first);
    return -1;
}

int ckpt_save(const char *dir, const CkptShardView *v, const CkptState *st, const Config *cfg,
              int keep, char err[CFG_ERR])
{
    err[0] = '\0';
    ckpt_h5_quiet();
    const int rank = v->world->rank;
    if (strlen(dir) >= CFG_STR) {
        ckpt_err(err, "checkpoint.dir is longer than %d characters", CFG_STR - 1);
        return -1;
    }
    char name[32], tmp[CKPT_PATH + 8], final[CKPT_PATH];
    ckpt_step_name(name, sizeof name, st->step);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);

    if (rank == 0)
        ckpt_note_foreign(dir);
    int rc = rank == 0 ? ckpt_prepare_tmp(dir, tmp, err) : 0;
    if (ckpt_agree(v->world, rc, err) != 0)
        return -1;

    Comm stage = comm_split(v->world, v->pp_rank, rank);
    Catalog c;
    gather_catalog(&c, v, stage.rank);

    /* bf16: the weights are the bf16 rounding of the master weights
     * (optimizer.h), so only the master weights are stored; a load derives
     * the weights from them (ckpt.h). */
    int kinds[CKPT_KINDS], n_kinds = 0;
    kinds[n_kinds++] = cfg->training.precision == PREC_BF16 ? CKPT_MASTER : CKPT_PARAMS;
    kinds[n_kinds++] = CKPT_ADAM_M;
    kinds[n_kinds++] = CKPT_ADAM_V;

    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/stage_%d.h5", tmp, v->pp_rank);
    rc = write_stage(path, v, &c, kinds, n_kinds, &stage, err);
    comm_free(&stage);
    /* An I/O error or a non-finite value on any rank: nothing is published,
     * and the unfinished step_X.tmp goes (freeing the space of a full disk). */
    if (ckpt_agree(v->world, rc, err) != 0) {
        free(c.e);
        if (rank == 0)
            ckpt_rm_tree(tmp);
        return -1;
    }

    rc = rank == 0 ? write_index(tmp, &c, v, st, cfg, kinds, n_kinds, err) : 0;
    free(c.e);
    /* The barrier of invariant 2: nothing is published before every rank
     * has closed its file and the index is on disk. */
    if (ckpt_agree(v->world, rc, err) != 0) {
        if (rank == 0)
            ckpt_rm_tree(tmp);
        return -1;
    }
    if (rank == 0) {
        rc = ckpt_publish_dir(dir, st->step, tmp, final, err);
        if (rc == 0)
            rc = ckpt_fsync_path(dir, 1) == 0 ? 0 : (ckpt_err(err, "%s: cannot sync", dir), -1);
        if (rc == 0)
            rc = ckpt_write_latest(dir, name, err);
        if (rc == 0)
            ckpt_prune(dir, keep, st->step);
    }
    return ckpt_agree(v->world, rc, err);
}
