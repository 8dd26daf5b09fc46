/* test_ckpt.c — sharded HDF5 checkpoints on 4 real ranks.
 *
 * Every buffer element gets a value that is a known function of (kind, tensor
 * name, global element index): save with one layout (tp, pp, dp, zero), load
 * with another, and every loaded element must equal the function at its
 * global coordinate (padded vocabulary rows must keep the loader's
 * sentinel).  Also: the hyperslab arithmetic by hand, the index content,
 * `latest`, keep, an interrupted save, corrupted / truncated files, wrong
 * shapes and other models, resolve, and `trident ckpt inspect / export`.
 *
 * Run as a plain unit test (one process), it re-executes itself under
 * `mpiexec -n 4` and exits with mpiexec's status. */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "mpi_test.h"
#include "checkpoint/ckpt.h"
#include "cli/commands.h"
#include "checkpoint/ckpt_internal.h"
#include "comm/comm.h"
#include "core/error.h"
#include "core/rng.h"

#define WORLD    4
#define SENTINEL (-12345.0f)

static int g_rank;
static double g_t0;

/* Progress with the time since the start (4 ranks may share 2 cores). */
static void mark(const char *what)
{
    if (g_rank == 0) {
        printf("[%6.2f s] %s\n", MPI_Wtime() - g_t0, what);
        fflush(stdout);
    }
}
static char g_root[128];

/* ---- models ---- */

static Config model_config_kv(ModelArch arch, int hidden, Precision prec, int kv_heads)
{
    Config c;
    config_defaults(&c);
    ModelConfig *m = &c.model;
    m->arch = arch;
    m->layers = 3;
    m->hidden = hidden;
    m->heads = 4;
    m->kv_heads = kv_heads;
    m->ffn_hidden = arch == ARCH_LLAMA ? 48 : 4 * hidden;
    m->vocab = 97; /* padded to 104 (tp 1) or 112 (tp 2) */
    m->vocab_pad_multiple = 8;
    m->seq_len = 16;
    m->tie_embeddings = arch == ARCH_GPT2;
    c.training.precision = prec;
    return c;
}

static Config model_config(ModelArch arch, int hidden, Precision prec)
{
    return model_config_kv(arch, hidden, prec, arch == ARCH_LLAMA ? 2 : 4);
}

/* The value of element gidx of tensor `name`, kind k (salt: a later save). */
static float value_of(int k, const char *name, uint64_t gidx, int salt)
{
    uint64_t h = rng_mix(rng_hash_str(name), (uint64_t)(k + 8 * salt) * 1000003u + gidx);
    return (float)(h >> 40) / 16777216.0f - 0.5f; /* exact: 24 bits */
}

/* ---- one rank of a layout ---- */

typedef struct {
    int tp, pp, dp, zero;
    int stage_layers[4]; /* {0}: even split */
} Layout;

typedef struct {
    int active;
    Comm comm;
    ParamTable t;
    CkptShardView v;
    float *buf[CKPT_KINDS];
} Shard;

static void layer_range(const Layout *L, int layers, int stage, int *b, int *e)
{
    int at = 0;
    for (int s = 0; s <= stage; s++) {
        int n =
            L->stage_layers[0] ? L->stage_layers[s] : layers / L->pp + (s < layers % L->pp ? 1 : 0);
        *b = at;
        at += n;
        *e = at;
    }
}

/* For each element of part k: the value it must hold (or SENTINEL for
 * padding rows), from kind `src`. */
static float expect_at(const Shard *s, int k, size_t i, int src, int salt, int *pad)
{
    (void)k;
    for (int j = 0; j < s->t.n; j++) {
        const ParamSpec *p = &s->t.p[j];
        if (i < p->offset || i >= p->offset + p->numel)
            continue;
        size_t li = i - p->offset;
        int64_t lc = p->local_shape[1];
        int64_t gr = params_global_row(p, (int64_t)li / lc);
        int64_t gc = p->local_start[1] + (int64_t)li % lc;
        *pad = gr >= p->real_rows;
        return *pad ? SENTINEL : value_of(src, p->name, (uint64_t)(gr * p->shape[1] + gc), salt);
    }
    TRD_ASSERT(0);
    return 0;
}

/* Build the shard of world rank `rank` in layout L (inactive when the layout
 * has fewer ranks).  fill: values of the function (save) or SENTINEL (load). */
static void shard_make(Shard *s, const Config *cfg, const Layout *L, int master, int fill, int salt)
{
    memset(s, 0, sizeof *s);
    const int n = L->tp * L->pp * L->dp;
    s->active = g_rank < n;
    Comm world = comm_world();
    s->comm = comm_split(&world, s->active ? 0 : -1, g_rank);
    if (!s->active)
        return;
    const int tp_r = g_rank % L->tp, dp_r = g_rank / L->tp % L->dp;
    const int pp_r = g_rank / (L->tp * L->dp);
    ParamShard sh = {.tp = L->tp,
                     .tp_rank = tp_r,
                     .n_chunks = 1,
                     .has_embed = pp_r == 0,
                     .has_head = pp_r == L->pp - 1};
    layer_range(L, cfg->model.layers, pp_r, &sh.chunk[0].begin, &sh.chunk[0].end);
    params_build(&s->t, &cfg->model, &sh);
    ckpt_view_init(&s->v, &s->t, L->zero, dp_r, L->dp, pp_r, &s->comm);
    for (int k = 0; k < CKPT_KINDS; k++) {
        if (k == CKPT_MASTER && !master)
            continue;
        CkptRange *r = &s->v.part[k];
        size_t len = r->hi - r->lo;
        s->buf[k] = malloc((len ? len : 1) * sizeof(float));
        r->data = s->buf[k];
        for (size_t i = 0; i < len; i++) {
            int pad = 0;
            float x = expect_at(s, k, r->lo + i, k, salt, &pad);
            r->data[i] = fill && !pad ? x : SENTINEL;
        }
    }
}

static void shard_free(Shard *s)
{
    if (!s->active)
        return;
    for (int k = 0; k < CKPT_KINDS; k++)
        free(s->buf[k]);
    params_free(&s->t);
    comm_free(&s->comm);
    s->active = 0;
}

/* Every element of the loaded parts: the function of kind src[k]. */
static void shard_verify(const Shard *s, const int src[CKPT_KINDS], int salt, const char *what)
{
    if (!s->active)
        return;
    for (int k = 0; k < CKPT_KINDS; k++) {
        const CkptRange *r = &s->v.part[k];
        if (!r->data)
            continue;
        size_t bad = 0, pads = 0, first = 0;
        for (size_t i = r->lo; i < r->hi; i++) {
            int pad = 0;
            float want = expect_at(s, k, i, src[k], salt, &pad);
            pads += pad;
            if (r->data[i - r->lo] != want && bad++ == 0)
                first = i;
        }
        CHECK(bad == 0, "%s: rank %d %s: %zu of %zu elements wrong (first flat %zu)", what, g_rank,
              ckpt_kind_names[k], bad, r->hi - r->lo, first);
        (void)pads;
    }
}

static const int SAME[CKPT_KINDS] = {CKPT_PARAMS, CKPT_MASTER, CKPT_ADAM_M, CKPT_ADAM_V};

static void path_of(char *out, size_t n, const char *sub)
{
    snprintf(out, n, "%s/%s", g_root, sub);
}

static int save_layout(const char *sub, const Config *cfg, const Layout *L, int64_t step, int keep,
                       int salt)
{
    Shard s;
    shard_make(&s, cfg, L, cfg->training.precision == PREC_BF16, 1, salt);
    int rc = 0;
    if (s.active) {
        char dir[512], err[CFG_ERR];
        path_of(dir, sizeof dir, sub);
        CkptState st = {.step = step,
                        .sampler_position = 1000 + (uint64_t)step,
                        .lr_step = step,
                        .adam_t = step - 1};
        rc = ckpt_save(dir, &s.v, &st, cfg, keep, err);
        CHECK(rc == 0, "save %s step %lld: %s", sub, (long long)step, err);
    }
    shard_free(&s);
    MPI_Barrier(MPI_COMM_WORLD);
    return rc;
}

/* Load dir into layout L and verify against src kinds. */
static void load_verify(const char *step_dir, const Config *cfg, const Layout *L, int master,
                        const int src[CKPT_KINDS], int salt, int64_t step, const char *what)
{
    Shard s;
    shard_make(&s, cfg, L, master, 0, 0);
    if (s.active) {
        char err[CFG_ERR];
        CkptState st = {0};
        int rc = ckpt_load(step_dir, &s.v, &st, cfg, err);
        CHECK(rc == 0, "%s: load: %s", what, err);
        if (rc == 0) {
            shard_verify(&s, src, salt, what);
            CHECK(st.step == step && st.sampler_position == 1000 + (uint64_t)step &&
                      st.lr_step == step && st.adam_t == step - 1,
                  "%s: state step %lld pos %llu adam_t %lld", what, (long long)st.step,
                  (unsigned long long)st.sampler_position, (long long)st.adam_t);
        }
    }
    shard_free(&s);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Load expecting failure; every rank gets the same message, which must
 * contain each of the `needles`. */
static void load_fails(const char *step_dir, const Config *cfg, const Layout *L, const char *what,
                       const char *n1, const char *n2)
{
    Shard s;
    shard_make(&s, cfg, L, 0, 0, 0);
    if (s.active) {
        char err[CFG_ERR] = "", first[CFG_ERR];
        int rc = ckpt_load(step_dir, &s.v, NULL, cfg, err);
        CHECK(rc == -1, "%s: load should fail", what);
        memcpy(first, err, sizeof first);
        comm_broadcast(&s.comm, first, CFG_ERR, 0);
        CHECK(!strcmp(first, err), "%s: ranks disagree: '%s' vs '%s'", what, first, err);
        CHECK(strstr(err, n1) != NULL, "%s: message lacks '%s': %s", what, n1, err);
        CHECK(!n2 || strstr(err, n2) != NULL, "%s: message lacks '%s': %s", what, n2, err);
        if (g_rank == 0)
            printf("  %s -> %s\n", what, err);
    }
    shard_free(&s);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- pure layout ---- */

static void test_slab(void)
{
    /* A 5 x 4 tensor held whole, at flat offset 10 of a table. */
    ParamSpec p = {.ndim = 2,
                   .shape = {5, 4},
                   .split_dim = 0,
                   .role = ROLE_BLOCK,
                   .local_shape = {5, 4},
                   .local_start = {0, 0},
                   .numel = 20,
                   .offset = 10};
    /* Flat [10+2, 10+15): partial row 0 (cols 2-3), rows 1-2, partial row 3 (cols 0-2). */
    CkptSlab s = ckpt_slab(&p, 5, 12, 25);
    CHECK(s.n == 3 && s.first == 12 && s.count == 13, "slab: n %d first %zu count %zu", s.n,
          s.first, s.count);
    CHECK(s.b[0].r == 0 && s.b[0].c == 2 && s.b[0].nr == 1 && s.b[0].nc == 2, "slab first row");
    CHECK(s.b[1].r == 1 && s.b[1].c == 0 && s.b[1].nr == 2 && s.b[1].nc == 4, "slab middle");
    CHECK(s.b[2].r == 3 && s.b[2].c == 0 && s.b[2].nr == 1 && s.b[2].nc == 3, "slab last row");
    /* Inside one row. */
    s = ckpt_slab(&p, 5, 15, 17);
    CHECK(s.n == 1 && s.b[0].r == 1 && s.b[0].c == 1 && s.b[0].nc == 2, "slab within a row");
    /* Column slice of TP rank 1 (columns 4-7 of an 5 x 8 tensor), padded
     * rows 3-4 cut off: real_rows 3. */
    ParamSpec q = {.ndim = 2,
                   .shape = {5, 8},
                   .split_dim = 1,
                   .role = ROLE_BLOCK,
                   .local_shape = {5, 4},
                   .local_start = {0, 4},
                   .numel = 20,
                   .offset = 0};
    s = ckpt_slab(&q, 3, 6, 20);
    CHECK(s.n == 2 && s.count == 6 && s.first == 6, "slab cut: n %d count %zu", s.n, s.count);
    CHECK(s.b[0].r == 1 && s.b[0].c == 6 && s.b[0].nc == 2, "slab cut first row at col 6");
    CHECK(s.b[1].r == 2 && s.b[1].c == 4 && s.b[1].nr == 1 && s.b[1].nc == 4, "slab cut row 2");
    /* A qkv weight with one kv head over tp 2: rows in two runs, the k and v
     * rows held by both TP ranks and owned by rank 0. */
    Config mq = model_config_kv(ARCH_LLAMA, 32, PREC_FP32, 1);
    ParamShard sh1 = {.tp = 2, .tp_rank = 1, .n_chunks = 1, .chunk = {{0, 1}}};
    ParamTable tq;
    params_build(&tq, &mq.model, &sh1);
    const ParamSpec *qkv = params_find(&tq, "layers.0.attn.qkv.weight");
    CkptSlab two[CKPT_MAX_RUNS];
    int64_t fr[CKPT_MAX_RUNS];
    int ns = ckpt_slabs(qkv, qkv->shape[0], qkv->offset, qkv->offset + qkv->numel, two, fr);
    /* 4 heads of 8 rows, 1 kv group: q rows 0-31, k 32-39, v 40-47; rank 1
     * holds q rows 16-31, then k and v rows 32-47. */
    CHECK(qkv->kv_share == 2 && ns == 2 && two[0].b[0].r == 16 && two[0].count == 16 * 32 &&
              two[1].b[0].r == 32 && two[1].count == 16 * 32 && fr[1] == 16 &&
              !params_row_owned(&tq, qkv, fr[1]) && params_row_owned(&tq, qkv, fr[0]),
          "qkv runs: kv_share %d, %d slabs, rows %lld and %lld", qkv->kv_share, ns,
          (long long)two[0].b[0].r, (long long)two[1].b[0].r);
    params_free(&tq);
    /* The stacked experts of a MoE layer over tp 2 (docs/moe.md): rank 1
     * holds the second half of each expert's fc rows (3 experts of width
     * 8: global rows 4-7, 12-15, 20-23), one run per expert, all owned;
     * the proj is split by columns, the router replicated. */
    Config me = model_config(ARCH_GPT2, 16, PREC_FP32);
    me.model.moe_experts = 3;
    me.model.moe_top_k = 1;
    me.model.moe_every = 1;
    me.model.moe_ffn_hidden = 8;
    ParamTable te;
    params_build(&te, &me.model, &sh1);
    const ParamSpec *fc = params_find(&te, "layers.0.moe.experts.fc.weight");
    ns = ckpt_slabs(fc, fc->shape[0], fc->offset, fc->offset + fc->numel, two, fr);
    CHECK(fc->row_blocks == 3 && fc->local_shape[0] == 12 && ns == 3 && two[0].b[0].r == 4 &&
              two[1].b[0].r == 12 && two[2].b[0].r == 20 && two[2].b[0].nr == 4 &&
              two[1].first == fc->offset + 4 * 16 && fr[2] == 8 && params_global_row(fc, 5) == 13 &&
              params_row_owned(&te, fc, fr[2]),
          "expert runs: row_blocks %d, %d slabs, rows %lld %lld %lld", fc->row_blocks, ns,
          (long long)two[0].b[0].r, (long long)two[1].b[0].r, (long long)two[2].b[0].r);
    /* A range inside the second expert's rows only. */
    ns = ckpt_slabs(fc, fc->shape[0], fc->offset + 5 * 16, fc->offset + 6 * 16, two, fr);
    CHECK(ns == 1 && two[0].b[0].r == 13 && two[0].count == 16, "expert run cut: %d slabs", ns);
    const ParamSpec *proj = params_find(&te, "layers.0.moe.experts.proj.weight");
    const ParamSpec *router = params_find(&te, "layers.0.moe.router.weight");
    CHECK(proj->split_dim == 1 && proj->local_shape[1] == 4 && proj->local_start[1] == 4 &&
              router->split_dim == -1 && router->local_shape[0] == 3,
          "expert proj columns %lld from %lld, router split %d", (long long)proj->local_shape[1],
          (long long)proj->local_start[1], router->split_dim);
    params_free(&te);
    /* Entirely padding, or outside the tensor. */
    CHECK(ckpt_slab(&q, 3, 12, 20).n == 0 && ckpt_slab(&p, 5, 0, 10).n == 0, "empty slabs");
}

/* ---- the index, read back with the HDF5 C API ---- */

static int64_t attr_i64(hid_t loc, const char *name)
{
    int64_t v = -1;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a >= 0) {
        H5Aread(a, H5T_NATIVE_INT64, &v);
        H5Aclose(a);
    }
    return v;
}

static void test_index(const char *step_dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/index.h5", step_dir);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    CHECK(f >= 0, "index: open %s", path);
    if (f < 0)
        return;
    CHECK(attr_i64(f, "step") == 5 && attr_i64(f, "version") == 1, "index: step, version");
    hid_t g = H5Gopen2(f, "topology", H5P_DEFAULT);
    CHECK(attr_i64(g, "tp") == 2 && attr_i64(g, "pp") == 1 && attr_i64(g, "dp") == 2 &&
              attr_i64(g, "zero") == 1 && attr_i64(g, "world") == 4,
          "index: topology tp %lld pp %lld dp %lld zero %lld", (long long)attr_i64(g, "tp"),
          (long long)attr_i64(g, "pp"), (long long)attr_i64(g, "dp"),
          (long long)attr_i64(g, "zero"));
    H5Gclose(g);
    g = H5Gopen2(f, "state", H5P_DEFAULT);
    CHECK(attr_i64(g, "sampler_position") == 1005 && attr_i64(g, "adam_t") == 4, "index: state");
    H5Gclose(g);
    g = H5Gopen2(f, "model", H5P_DEFAULT);
    CHECK(attr_i64(g, "vocab") == 97 && attr_i64(g, "hidden") == 32, "index: model");
    H5Gclose(g);
    H5Fclose(f);

    /* Through the module's reader: entries, shapes, the config text. */
    CkptIndex ix;
    char err[CFG_ERR];
    CHECK(ckpt_index_read(path, &ix, err) == 0, "index read: %s", err);
    /* bf16: the master weights only (the weights are their rounding). */
    CHECK(!ckpt_index_find(&ix, "embed.wte.weight", CKPT_PARAMS), "index: no params in bf16");
    const CkptEntry *wte = ckpt_index_find(&ix, "embed.wte.weight", CKPT_MASTER);
    CHECK(wte && wte->shape[0] == 97 && wte->shape[1] == 32 && wte->ndim == 2 &&
              !strcmp(wte->file, "stage_0.h5") && !strcmp(wte->dtype, "float32"),
          "index: wte entry (unpadded global shape)");
    const CkptEntry *fc = ckpt_index_find(&ix, "layers.2.mlp.fc.bias", CKPT_MASTER);
    CHECK(fc && fc->ndim == 1 && fc->shape[0] == 128, "index: master of fc.bias");
    CHECK(ix.n == 3 * (2 + 2 + 12 * 3), "index: %d datasets (3 kinds x 40 tensors)", ix.n);
    CHECK(ix.yaml && strstr(ix.yaml, "hidden: 32") && strstr(ix.yaml, "precision: bf16"),
          "index: config yaml");
    ckpt_index_free(&ix);

    /* Each stored dataset carries the checksums of its row blocks: check
     * them against the definition (docs/checkpoint.md), computed here. */
    snprintf(path, sizeof path, "%s/stage_0.h5", step_dir);
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "adam_v/layers.1.attn.qkv.weight", H5P_DEFAULT);
    CHECK(d >= 0, "stage file: dataset /adam_v/layers.1.attn.qkv.weight");
    int64_t rows_per_block = attr_i64(d, "checksum_rows");
    uint64_t stored = 0;
    hid_t a = H5Aopen(d, "checksum", H5P_DEFAULT);
    CHECK(a >= 0 && H5Aread(a, H5T_NATIVE_UINT64, &stored) >= 0, "checksum attribute");
    H5Aclose(a);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < 96 * 32; i++) { /* one block: the whole [96, 32] tensor */
        float x = value_of(CKPT_ADAM_V, "layers.1.attn.qkv.weight", i, 0);
        uint32_t bits;
        memcpy(&bits, &x, 4);
        uint64_t h = (i * 0x9E3779B97F4A7C15ull) ^ bits;
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
        h *= 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 33;
        sum += h;
    }
    CHECK(rows_per_block >= 96 && stored == sum, "checksum: rows %lld, %llx vs %llx",
          (long long)rows_per_block, (unsigned long long)stored, (unsigned long long)sum);
    H5Dclose(d);
    H5Fclose(f);
}

/* ---- files ---- */

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void read_latest(const char *dir, char *out, size_t n)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/latest", dir);
    out[0] = '\0';
    FILE *f = fopen(p, "r");
    if (f) {
        if (!fgets(out, (int)n, f))
            out[0] = '\0';
        fclose(f);
    }
    out[strcspn(out, "\n")] = '\0';
}

static int sh(const char *fmt, const char *a, const char *b)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

/* Flip bytes in the middle of a dataset's data. */
static int corrupt_dataset(const char *file, const char *dset)
{
    hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return -1;
    hid_t d = H5Dopen2(f, dset, H5P_DEFAULT);
    haddr_t addr = d >= 0 ? H5Dget_offset(d) : HADDR_UNDEF;
    hsize_t size = d >= 0 ? H5Dget_storage_size(d) : 0;
    if (d >= 0)
        H5Dclose(d);
    H5Fclose(f);
    if (addr == HADDR_UNDEF || size < 8)
        return -1;
    int fd = open(file, O_RDWR);
    unsigned char b[4];
    off_t at = (off_t)(addr + size / 2);
    if (fd < 0 || pread(fd, b, 4, at) != 4)
        return -1;
    for (int i = 0; i < 4; i++)
        b[i] ^= 0x5a;
    int rc = pwrite(fd, b, 4, at) == 4 ? 0 : -1;
    close(fd);
    return rc;
}

/* ---- the CLI, in process ---- */

static int run_cli(char **argv, int argc, const char *out_path)
{
    fflush(stdout);
    int saved = dup(1);
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    close(fd);
    int rc = ckpt_main(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return rc;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_cli(const char *step_dir, const Config *cfg)
{
    char out[1024], model[1024];
    snprintf(out, sizeof out, "%s/inspect.txt", g_root);
    char *inspect[] = {"ckpt", "inspect", (char *)step_dir};
    CHECK(run_cli(inspect, 3, out) == 0, "ckpt inspect exits 0");
    char *text = slurp(out);
    CHECK(text && strstr(text, "embed.wte.weight") && strstr(text, "[97, 32]") &&
              strstr(text, "stage_0.h5") && strstr(text, "tp 2, pp 1, dp 2, zero 1") &&
              strstr(text, "step 5") && strstr(text, "hidden: 32") && strstr(text, "adam_v") &&
              strstr(text, "[128]"),
          "inspect output:\n%s", text ? text : "(none)");

    snprintf(model, sizeof model, "%s/model.h5", g_root);
    char *exp[] = {"ckpt", "export", (char *)step_dir, "--out", model, "--master"};
    CHECK(run_cli(exp, 6, out) == 0, "ckpt export exits 0");
    hid_t f = H5Fopen(model, H5F_ACC_RDONLY, H5P_DEFAULT);
    CHECK(f >= 0, "export: open %s", model);
    if (f < 0)
        return;
    ParamShard full = params_full_shard(&cfg->model);
    ParamTable t;
    params_build(&t, &cfg->model, &full);
    int tensors = 0;
    size_t bad = 0;
    for (int i = 0; i < t.n; i++) {
        const ParamSpec *p = &t.p[i];
        hid_t d = H5Dopen2(f, p->name, H5P_DEFAULT);
        if (d < 0)
            continue;
        tensors++;
        int64_t rows = p->real_rows;
        size_t n = (size_t)(rows * p->shape[1]);
        float *buf = malloc(n * sizeof(float));
        hid_t sp = H5Dget_space(d);
        CHECK(H5Sget_simple_extent_npoints(sp) == (hssize_t)n &&
                  H5Sget_simple_extent_ndims(sp) == p->ndim,
              "export: %s has the global unpadded shape", p->name);
        if (H5Sget_simple_extent_npoints(sp) == (hssize_t)n &&
            H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0)
            for (size_t j = 0; j < n; j++)
                bad += buf[j] != value_of(CKPT_MASTER, p->name, j, 0);
        H5Sclose(sp);
        H5Dclose(d);
        free(buf);
    }
    CHECK(tensors == t.n && bad == 0, "export: %d of %d tensors, %zu wrong values", tensors, t.n,
          bad);
    params_free(&t);
    H5Fclose(f);

    printf("  (an error message about /nonexistent/ckpt is expected next)\n");
    fflush(stdout);
    char *bad_args[] = {"ckpt", "inspect", "/nonexistent/ckpt"};
    CHECK(run_cli(bad_args, 3, out) == 2, "inspect of a missing directory exits 2");
}

/* ---- the cases ---- */

static void read_index(const char *step_dir, CkptIndex *ix)
{
    char path[1024], err[CFG_ERR];
    snprintf(path, sizeof path, "%s/index.h5", step_dir);
    CHECK(ckpt_index_read(path, ix, err) == 0, "read %s: %s", path, err);
}

/* Overwrite one int64 attribute of /state in place (a flipped bit). */
static void poke_state(const char *index, const char *attr, int64_t v)
{
    hid_t f = H5Fopen(index, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t g = f >= 0 ? H5Gopen2(f, "state", H5P_DEFAULT) : -1;
    hid_t a = g >= 0 ? H5Aopen(g, attr, H5P_DEFAULT) : -1;
    CHECK(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0, "poke %s in %s", attr, index);
    if (a >= 0)
        H5Aclose(a);
    if (g >= 0)
        H5Gclose(g);
    if (f >= 0)
        H5Fclose(f);
}

/* G (issue 17): a non-finite value is never published; the training state
 * is checksummed and range-checked; resume auto without `latest`; every
 * model hyper-parameter, run.seed and data.path compared at load. */
static void test_reliability(const char *good, const Config *g32, const Layout *four,
                             const Layout *one)
{
    char dir[512], p[1024], err[CFG_ERR] = "", latest[64];
    /* A NaN in Adam's v on rank 0: refused, named, latest unchanged. */
    save_layout("g", g32, four, 1, 2, 0);
    Shard s;
    shard_make(&s, g32, four, 0, 1, 0);
    if (s.active) {
        if (g_rank == 0)
            s.v.part[CKPT_ADAM_V].data[0] = NAN;
        CkptState st = {.step = 2, .sampler_position = 1002, .lr_step = 2, .adam_t = 1};
        path_of(dir, sizeof dir, "g");
        int rc = ckpt_save(dir, &s.v, &st, g32, 2, err);
        CHECK(rc == -1 && strstr(err, "non-finite") && strstr(err, "adam_v") &&
                  strstr(err, "stage_0.h5"),
              "NaN save refused: rc %d: %s", rc, err);
        if (g_rank == 0)
            printf("  NaN in adam_v -> %s\n", err);
    }
    shard_free(&s);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
        path_of(dir, sizeof dir, "g");
        read_latest(dir, latest, sizeof latest);
        CHECK(!strcmp(latest, "step_00000001"), "after the NaN save latest is '%s'", latest);
        snprintf(p, sizeof p, "%s/step_00000002", dir);
        CHECK(!is_dir(p), "no step 2 published");
        snprintf(p, sizeof p, "%s/step_00000002.tmp", dir);
        CHECK(!is_dir(p), "the refused step_2.tmp is removed");

        /* The training state: a changed attribute, and values out of range
         * written with matching checksums (a writer's bug). */
        path_of(p, sizeof p, "bad");
        CHECK(sh("cp -r %s %s/flip", good, p) == 0 && sh("cp -r %s %s/range", good, p) == 0,
              "copies of %s", good);
        snprintf(p, sizeof p, "%s/bad/flip/index.h5", g_root);
        poke_state(p, "lr_step", 7 ^ 4);
        /* An index of an older trident: without the new records. */
        path_of(p, sizeof p, "bad");
        CHECK(sh("cp -r %s %s/older", good, p) == 0, "copy for an older index");
        snprintf(p, sizeof p, "%s/bad/older/index.h5", g_root);
        hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
        CHECK(f >= 0 && H5Adelete_by_name(f, "state", "data_path", H5P_DEFAULT) >= 0 &&
                  H5Adelete_by_name(f, "state", "checksum", H5P_DEFAULT) >= 0 &&
                  H5Adelete_by_name(f, "model", "norm_eps", H5P_DEFAULT) >= 0 &&
                  H5Adelete_by_name(f, "model", "rope_theta", H5P_DEFAULT) >= 0,
              "strip the new attributes of %s", p);
        if (f >= 0)
            H5Fclose(f);
        CkptIndex ix;
        read_index(good, &ix);
        CHECK(ix.state_checked && ix.has_run && ix.has_norms, "new index records: %d %d %d",
              ix.state_checked, ix.has_run, ix.has_norms);
        ix.state.adam_t = ix.state.step + 1;
        snprintf(p, sizeof p, "%s/bad/range/index.h5", g_root);
        CHECK(ckpt_index_write(p, &ix, err) == 0, "rewrite %s: %s", p, err);
        ix.state.adam_t = ix.state.step;
        ix.world = ix.tp * ix.pp * ix.dp + 1; /* a world no layout has */
        path_of(p, sizeof p, "bad");
        CHECK(sh("cp -r %s %s/world", good, p) == 0, "copy for a bad world");
        snprintf(p, sizeof p, "%s/bad/world/index.h5", g_root);
        CHECK(ckpt_index_write(p, &ix, err) == 0, "rewrite %s: %s", p, err);
        ckpt_index_free(&ix);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    path_of(p, sizeof p, "bad/older");
    load_verify(p, g32, one, 0, SAME, 0, 7, "an older index still loads");
    if (g_rank == 0) {
        CkptIndex ix;
        read_index(p, &ix);
        CHECK(!ix.state_checked && !ix.has_run && !ix.has_norms,
              "older index: nothing new "
              "recorded: %d %d %d",
              ix.state_checked, ix.has_run, ix.has_norms);
        ckpt_index_free(&ix);
    }
    path_of(p, sizeof p, "bad/flip");
    load_fails(p, g32, one, "flipped state bit", "flip/index.h5",
               "'/state/lr_step' does not match");
    path_of(p, sizeof p, "bad/range");
    load_fails(p, g32, four, "adam_t > step", "range/index.h5", "'/state/adam_t' is out of range");
    path_of(p, sizeof p, "bad/world");
    load_fails(p, g32, one, "world != tp x pp x dp", "world/index.h5",
               "'/topology/world' is out of range");

    /* Hyper-parameters that keep every shape: still refused, both values named. */
    Config c = *g32;
    c.model.heads = 2; /* with kv_heads 2, the qkv rows stay 32 + 2 x 2 x 16 */
    c.model.kv_heads = 2;
    load_fails(good, &c, one, "other heads", "model.heads is 4 in the checkpoint, 2 in the config",
               NULL);
    c = *g32;
    c.model.norm_eps = 1e-6f;
    load_fails(good, &c, one, "other norm_eps", "model.norm_eps is 1e-05 in the checkpoint", NULL);
    c = *g32;
    c.model.rope_theta = 5e5f;
    load_fails(good, &c, one, "other rope_theta", "model.rope_theta is 10000", "500000");
    c = *g32;
    c.run.seed = 99;
    load_fails(good, &c, one, "other seed", "run.seed is 1234 in the checkpoint, 99", NULL);
    snprintf(c.checkpoint.allow_changes, sizeof c.checkpoint.allow_changes, "data,seed");
    load_verify(good, &c, one, 0, SAME, 0, 7, "other seed, allowed");
    c = *g32;
    snprintf(c.data.path, sizeof c.data.path, "data/other");
    load_fails(good, &c, one, "other data.path", "data.path is '' in the checkpoint", NULL);

    /* resume auto without latest: the newest complete step that verifies. */
    if (g_rank == 0) {
        char out[CFG_STR];
        path_of(dir, sizeof dir, "nolatest");
        snprintf(p, sizeof p, "%s/e", g_root);
        CHECK(sh("cp -r %s %s/nolatest", p, g_root) == 0, "copy e");
        snprintf(p, sizeof p, "%s/latest", dir);
        CHECK(remove(p) == 0, "remove %s", p);
        CHECK(ckpt_resolve(dir, RESUME_AUTO, "", out, err) == 1 && strstr(out, "step_00000004") &&
                  strstr(err, "latest is missing"),
              "no latest: %s (%s)", out, err);
        snprintf(p, sizeof p, "%s/step_00000004/stage_0.h5", dir);
        CHECK(remove(p) == 0, "remove %s", p);
        CHECK(ckpt_resolve(dir, RESUME_AUTO, "", out, err) == 1 && strstr(out, "step_00000003") &&
                  strstr(err, "skipped: step_00000004"),
              "incomplete newest: %s (%s)", out, err);
        printf("  %s\n", err);
        snprintf(p, sizeof p, "%s/step_00000003/index.h5", dir);
        poke_state(p, "step", 5);
        CHECK(ckpt_resolve(dir, RESUME_AUTO, "", out, err) == -1 && strstr(err, "step_00000003") &&
                  strstr(err, "step_00000004"),
              "none verifies: %s", err);
        printf("  %s\n", err);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* A save there keeps the steps this job did not write: step 4 is moved
     * aside, not replaced; keep 1 prunes neither it nor step 3. */
    save_layout("nolatest", g32, four, 4, 1, 0);
    save_layout("nolatest", g32, four, 5, 1, 0);
    if (g_rank == 0) {
        path_of(dir, sizeof dir, "nolatest");
        read_latest(dir, latest, sizeof latest);
        CHECK(!strcmp(latest, "step_00000005"), "latest '%s'", latest);
        const char *want[] = {"step_00000003", "step_00000004.kept", "step_00000005"};
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "%s/%s", dir, want[i]);
            CHECK(is_dir(p), "%s kept", p);
        }
        snprintf(p, sizeof p, "%s/step_00000004", dir);
        CHECK(!is_dir(p), "our own step 4 pruned (keep 1)");
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* ckpt_transpose against the definition, element by element: shapes with
 * and without edges beyond its 8 x 8 blocks and 64 x 64 panels, with and
 * without row maps (reversed input rows, permuted output rows). */
static void test_transpose(void)
{
    const int64_t shapes[][2] = {{1, 1}, {8, 8}, {7, 13}, {64, 64}, {65, 129}, {200, 72}, {3, 500}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t r = shapes[s][0], c = shapes[s][1];
        float *in = trd_malloc((size_t)(r * c) * sizeof(float), "transpose in");
        float *out = trd_malloc((size_t)(r * c) * sizeof(float), "transpose out");
        int64_t *imap = trd_malloc((size_t)r * sizeof(int64_t), "imap");
        int64_t *omap = trd_malloc((size_t)c * sizeof(int64_t), "omap");
        for (int64_t k = 0; k < r * c; k++)
            in[k] = (float)k + 0.5f;
        for (int64_t i = 0; i < r; i++)
            imap[i] = r - 1 - i;
        for (int64_t j = 0; j < c; j++)
            omap[j] = (j * 7 + 3) % c; /* a permutation: no c here is a multiple of 7 */
        for (int maps = 0; maps < 4; maps++) {
            const int64_t *im = maps & 1 ? imap : NULL, *om = maps & 2 ? omap : NULL;
            for (int64_t k = 0; k < r * c; k++)
                out[k] = -1.0f;
            ckpt_transpose(in, r, c, im, om, out);
            int64_t bad = 0;
            for (int64_t i = 0; i < r; i++)
                for (int64_t j = 0; j < c; j++)
                    bad += out[(om ? om[j] : j) * r + i] != in[(im ? im[i] : i) * c + j];
            CHECK(bad == 0, "transpose %lld x %lld, maps %d: %lld elements wrong", (long long)r,
                  (long long)c, maps, (long long)bad);
        }
        free(in);
        free(out);
        free(imap);
        free(omap);
    }
}

/* CkptSource (ckpt_raw.c), the import's reads ahead: reads at unaligned
 * offsets, empty ones and one past the end of the file, through a ring far
 * smaller than all of them (it wraps many times) while the caller holds up
 * to three reads at once; with O_DIRECT and through the page cache; and a
 * source closed with reads still in flight. */
static void test_source(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/source.bin", g_root);
    const size_t size = (1 << 20) + 123;
    unsigned char *data = malloc(size);
    TRD_ASSERT(data);
    for (size_t i = 0; i < size; i++)
        data[i] = (unsigned char)(i * 131 + i / 4096);
    FILE *f = fopen(path, "wb");
    TRD_ASSERT(f && fwrite(data, 1, size, f) == size && fclose(f) == 0);
    enum { N = 1000, RING = 256 << 10 }; /* the ring holds the 3 reads held and the next */
    CkptSourceRead plan[N];
    uint64_t x = 12345;
    size_t total = 0;
    for (int direct = 1; direct >= 0; direct--) {
        const int fd = open(path, O_RDONLY), fdd = direct ? open(path, O_RDONLY | O_DIRECT) : -1;
        CHECK(fd >= 0 && (!direct || fdd >= 0), "source: open %s (O_DIRECT %d)", path, direct);
        for (int i = 0; i < N; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const size_t n = i % 17 == 0 ? 0 : (size_t)(x >> 33) % 40000;
            const off_t at = (off_t)((x >> 13) % (size - n));
            plan[i] = (CkptSourceRead){fd, fdd, at, n};
            total += n;
        }
        plan[N - 1] = (CkptSourceRead){fd, fdd, (off_t)size - 10, 100}; /* past the end */
        CkptSource src;
        ckpt_source_open(&src, plan, N, RING);
        CHECK(src.cap == RING && total > 20 * (size_t)RING, "source: ring %zu for %zu bytes",
              src.cap, total);
        int bad = 0, held = 0;
        for (int i = 0; i < N - 1; i++) {
            const void *b;
            off_t fail;
            const int err = ckpt_source_take(&src, &b, &fail);
            bad += err != 0 || memcmp(b, data + plan[i].at, plan[i].n) != 0;
            if (++held >= 1 + i % 3) /* hold 1, 2 or 3 reads, then release them */
                for (; held > 0; held--)
                    ckpt_source_release(&src);
        }
        CHECK(bad == 0, "source (O_DIRECT %d): %d of %d reads wrong", direct, bad, N - 1);
        const void *b;
        off_t fail = 0;
        const int err = ckpt_source_take(&src, &b, &fail);
        CHECK(err == -1 && fail == (off_t)size, "source (O_DIRECT %d): past the end: %d at %lld",
              direct, err, (long long)fail);
        ckpt_source_close(&src);
        /* Closed early: the threads stop, waiting for room or not. */
        ckpt_source_open(&src, plan, N, RING);
        for (int i = 0; i < 5; i++) {
            CHECK(ckpt_source_take(&src, &b, &fail) == 0, "source: read %d before the close", i);
            ckpt_source_release(&src);
        }
        ckpt_source_close(&src);
        close(fd);
        if (fdd >= 0)
            close(fdd);
    }
    unlink(path);
    free(data);
}

int main(int argc, char **argv)
{
    if (!mpi_test_child())
        return mpi_test_relaunch("ckpt", 4);
    comm_init(&argc, &argv);
    alarm(120); /* a hung collective fails the test instead of stalling it */
    Comm world = comm_world();
    if (world.size != WORLD) {
        fprintf(stderr, "ckpt: needs %d ranks, got %d\n", WORLD, world.size);
        comm_finalize();
        return 1;
    }
    g_rank = world.rank;
    g_t0 = MPI_Wtime();
    if (g_rank == 0) {
        snprintf(g_root, sizeof g_root, "/tmp/trd_ckpt_XXXXXX");
        TRD_ASSERT(mkdtemp(g_root));
        test_slab();
        test_transpose();
        test_source();
    }
    MPI_Bcast(g_root, sizeof g_root, MPI_CHAR, 0, MPI_COMM_WORLD);
    ckpt_h5_quiet();

    const Config g32 = model_config(ARCH_GPT2, 32, PREC_FP32);
    const Config gbf = model_config(ARCH_GPT2, 32, PREC_BF16);
    const Config lbf = model_config(ARCH_LLAMA, 32, PREC_BF16);
    const Layout one = {1, 1, 1, 0, {0}};
    char dir[512], step[1024];

    mark("start");
    /* A: tp2 x dp2 (ZeRO 1, bf16 with master) -> 1 rank; partial rows at
     * the ZeRO block boundary. */
    save_layout("a", &gbf, &(Layout){2, 1, 2, 1, {0}}, 5, 3, 0);
    path_of(dir, sizeof dir, "a/step_00000005");
    /* A bf16 checkpoint stores no weights: they come from the master (the
     * trainer rounds them), into a bf16 run and into an fp32 one. */
    const int from_master[CKPT_KINDS] = {CKPT_MASTER, CKPT_MASTER, CKPT_ADAM_M, CKPT_ADAM_V};
    load_verify(dir, &gbf, &one, 1, from_master, 0, 5, "A tp2 dp2 zero1 -> 1 rank");
    load_verify(dir, &g32, &(Layout){1, 1, 4, 3, {0}}, 0, from_master, 0, 5, "A -> fp32 dp4 zero3");
    if (g_rank == 0) {
        test_index(dir);
        test_cli(dir, &gbf);
    }

    mark("A done");
    /* B: 1 rank (fp32) -> tp2 x pp2 with uneven stages; and into a bf16
     * run (master from the weights). */
    save_layout("b", &g32, &one, 7, 3, 0);
    path_of(dir, sizeof dir, "b/step_00000007");
    load_verify(dir, &g32, &(Layout){2, 2, 1, 0, {1, 2}}, 0, SAME, 0, 7, "B 1 rank -> tp2 pp2");
    const int from_params[CKPT_KINDS] = {CKPT_PARAMS, CKPT_PARAMS, CKPT_ADAM_M, CKPT_ADAM_V};
    load_verify(dir, &gbf, &(Layout){2, 1, 2, 2, {0}}, 1, from_params, 0, 7,
                "B -> bf16 tp2 dp2 zero2");

    mark("B done");
    /* C: pp2 x dp2 ZeRO 3 -> pp1 dp4 ZeRO 2 (blocks of other sizes). */
    save_layout("c", &g32, &(Layout){1, 2, 2, 3, {2, 1}}, 9, 3, 0);
    path_of(dir, sizeof dir, "c/step_00000009");
    load_verify(dir, &g32, &(Layout){1, 1, 4, 2, {0}}, 0, SAME, 0, 9, "C pp2 dp2 zero3 -> dp4");
    load_verify(dir, &g32, &one, 0, SAME, 0, 9, "C pp2 dp2 zero3 -> 1 rank");

    mark("C done");
    /* D: Llama (GQA, untied head, bf16): tp2 pp2 -> pp2 dp2 ZeRO 3. */
    save_layout("d", &lbf, &(Layout){2, 2, 1, 0, {0}}, 11, 3, 0);
    path_of(dir, sizeof dir, "d/step_00000011");
    load_verify(dir, &lbf, &(Layout){1, 2, 2, 3, {1, 2}}, 1, from_master, 0, 11,
                "D llama -> pp2 dp2");
    load_verify(dir, &lbf, &(Layout){2, 1, 2, 1, {0}}, 1, from_master, 0, 11, "D llama -> tp2 dp2");

    mark("D done");
    /* D2: one kv head (MQA) over tp 2: both TP ranks hold the k and v rows
     * (params.h, kv_share 2), written once, read by both; ZeRO blocks cut
     * through the qkv rows. */
    const Config mqa = model_config_kv(ARCH_LLAMA, 32, PREC_FP32, 1);
    save_layout("d2", &mqa, &(Layout){2, 1, 2, 3, {0}}, 13, 3, 0);
    path_of(dir, sizeof dir, "d2/step_00000013");
    load_verify(dir, &mqa, &one, 0, SAME, 0, 13, "D2 mqa tp2 dp2 zero3 -> 1 rank");
    save_layout("d3", &mqa, &one, 15, 3, 0);
    path_of(dir, sizeof dir, "d3/step_00000015");
    load_verify(dir, &mqa, &(Layout){2, 2, 1, 1, {0}}, 0, SAME, 0, 15, "D3 mqa 1 rank -> tp2 pp2");
    mark("D2, D3 done");

    /* E: latest, keep, an interrupted save, resolve. */
    const Layout four = {2, 1, 2, 1, {0}};
    path_of(dir, sizeof dir, "e");
    for (int s = 1; s <= 3; s++)
        save_layout("e", &g32, &four, s, 2, 0);
    if (g_rank == 0) {
        char latest[64], p[1024], out[CFG_STR], err[CFG_ERR];
        read_latest(dir, latest, sizeof latest);
        CHECK(!strcmp(latest, "step_00000003"), "latest is '%s'", latest);
        snprintf(p, sizeof p, "%s/step_00000001", dir);
        CHECK(!is_dir(p), "keep 2: step 1 removed");
        snprintf(p, sizeof p, "%s/step_00000002", dir);
        CHECK(is_dir(p), "keep 2: step 2 kept");
        /* A save killed half way: its .tmp is there, latest unchanged. */
        snprintf(p, sizeof p, "%s/step_00000004.tmp", dir);
        mkdir(p, 0777);
        sh("echo partial > %s/stage_0.h5%s", p, "");
        snprintf(p, sizeof p, "%s/step_00000099.tmp", dir);
        mkdir(p, 0777);
        CHECK(ckpt_resolve(dir, RESUME_AUTO, "", out, err) == 1, "resolve auto: %s", err);
        snprintf(p, sizeof p, "%s/step_00000003", dir);
        CHECK(!strcmp(out, p), "resolve auto ignores the .tmp: %s", out);
        CHECK(ckpt_resolve(dir, RESUME_PATH, dir, out, err) == 1 && !strcmp(out, p),
              "resolve path of checkpoint.dir follows latest: %s", out);
        CHECK(ckpt_resolve(dir, RESUME_NEVER, "", out, err) == 0, "resolve never");
        snprintf(p, sizeof p, "%s/none", g_root);
        CHECK(ckpt_resolve(p, RESUME_AUTO, "", out, err) == 0, "resolve auto without latest");
        CHECK(ckpt_resolve(dir, RESUME_PATH, p, out, err) == -1 && strstr(err, p),
              "resolve of a missing path: %s", err);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* The next save of step 4 replaces the leftover; step 2 goes (keep 2). */
    save_layout("e", &g32, &four, 4, 2, 1);
    /* Saving step 4 again (a rerun) replaces it whole. */
    save_layout("e", &g32, &four, 4, 2, 2);
    if (g_rank == 0) {
        char latest[64], p[1024];
        read_latest(dir, latest, sizeof latest);
        CHECK(!strcmp(latest, "step_00000004"), "latest is '%s'", latest);
        snprintf(p, sizeof p, "%s/step_00000004.tmp", dir);
        CHECK(!is_dir(p), "the leftover .tmp is gone");
        snprintf(p, sizeof p, "%s/step_00000099.tmp", dir);
        CHECK(!is_dir(p), "a stale .tmp of another step is gone");
        snprintf(p, sizeof p, "%s/step_00000002", dir);
        CHECK(!is_dir(p), "keep 2: step 2 removed");
        snprintf(p, sizeof p, "%s/step_00000003", dir);
        CHECK(is_dir(p), "keep 2: step 3 kept");
    }
    snprintf(step, sizeof step, "%s/step_00000004", dir);
    load_verify(step, &g32, &(Layout){1, 2, 2, 1, {0}}, 0, SAME, 2, 4, "E resaved step 4");

    mark("E done");
    /* F: bad input.  Copies of B, damaged. */
    char src[512];
    path_of(src, sizeof src, "b/step_00000007");
    if (g_rank == 0) {
        char p[512];
        path_of(p, sizeof p, "bad");
        mkdir(p, 0777);
        CHECK(sh("cp -r %s %s/corrupt", src, p) == 0, "copy for corruption");
        CHECK(sh("cp -r %s %s/truncated", src, p) == 0, "copy for truncation");
        CHECK(sh("cp -r %s %s/noindex", src, p) == 0, "copy for a missing index");
        snprintf(step, sizeof step, "%s/noindex/index.h5", p);
        CHECK(remove(step) == 0, "remove %s", step);
        snprintf(step, sizeof step, "%s/corrupt/stage_0.h5", p);
        CHECK(corrupt_dataset(step, "params/layers.0.attn.qkv.weight") == 0,
              "flip bytes in a chunk of %s", step);
        snprintf(step, sizeof step, "%s/truncated/stage_0.h5", p);
        CHECK(truncate(step, 4096) == 0, "truncate %s", step);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const Layout tp2pp2 = {2, 2, 1, 0, {0}};
    path_of(step, sizeof step, "bad/corrupt");
    load_fails(step, &g32, &tp2pp2, "corrupted data", "stage_0.h5", "layers.0.attn.qkv.weight");
    path_of(step, sizeof step, "bad/truncated");
    load_fails(step, &g32, &one, "truncated file", "stage_0.h5", "truncated");
    path_of(step, sizeof step, "bad/missing");
    load_fails(step, &g32, &four, "missing directory", "bad/missing", "does not exist");
    path_of(step, sizeof step, "bad/noindex");
    load_fails(step, &g32, &one, "missing index", "index.h5", NULL);
    const Config g48 = model_config(ARCH_GPT2, 48, PREC_FP32);
    load_fails(src, &g48, &four, "other hidden size", "embed.wte.weight", "[97, 32]");
    const Config l32 = model_config(ARCH_LLAMA, 32, PREC_FP32);
    load_fails(src, &l32, &one, "other architecture", "has no tensor", "arch gpt2");
    Config more = g32;
    more.model.layers = 2;
    load_fails(src, &more, &one, "fewer layers", "another model", "layers 3");
    /* Nothing was deleted: the good checkpoint still loads. */
    load_verify(src, &g32, &one, 0, SAME, 0, 7, "B still loads after the failures");

    mark("F done");
    test_reliability(src, &g32, &four, &one);
    mark("G done");
    if (g_rank == 0)
        sh("rm -rf %s%s", g_root, "");
    int failed = check_failures;
    comm_allreduce_max_i32(&world, &failed, 1);
    int rc = g_rank == 0 ? check_summary("ckpt") : (check_failures ? 1 : 0);
    comm_finalize();
    return rc || failed;
}
