/* test_tp.c — tensor and sequence parallelism against the single-rank run.
 *
 * On 4 ranks, split into TP groups of 2 and of 4:
 *   - the parallel layers alone: a column-parallel then row-parallel linear
 *     pair (with and without SP) against the unsplit matmuls; the
 *     vocabulary-parallel embedding and cross-entropy against the backend's
 *     (and, on one rank, number for number);
 *   - whole models: GPT-2 and Llama with kv heads split (kv_heads % tp == 0)
 *     and replicated (tp % kv_heads == 0), with and without SP: every rank
 *     builds the full model (tp = 1) and its TP shard, runs two accumulated
 *     micro-batches through both, and checks the losses, every local
 *     gradient against the same slice of the full gradient, replicated
 *     gradients bit-equal across the TP group, and the TP-counted gradient
 *     norm against the full one.  The vocabulary (37) does not divide by the
 *     tp: it is padded to 48 / 64 rows and with tp 4 the last rank holds
 *     padding only.
 *
 * Run as a plain unit test (one process), it re-executes itself under
 * `mpiexec -n 4` and exits with mpiexec's status. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "mpi_test.h"
#include "comm/comm.h"
#include "core/rng.h"
#include "model/model.h"
#include "tensor_par/tensor_par.h"

enum { WORLD = 4, B = 2, T = 8, N = B * T, V = 37 };

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Uniform in [-a, a), the same on every rank for the same seed. */
static void fill(float *x, size_t n, float a, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        x[i] = a * (2.0f * (float)lcg(&seed) / 2147483648.0f - 1.0f);
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* Worst |got - want| relative to atol + rtol |want| over n pairs: <= 1 passes. */
static double worst(const float *got, const float *want, size_t n, double rtol, double atol)
{
    double w = 0;
    for (size_t i = 0; i < n; i++)
        w = fmax(w, fabs((double)got[i] - want[i]) / (atol + rtol * fabs(want[i])));
    return w;
}

/* ---- the parallel layers alone ----------------------------------------- */

/* y = (x W1^T + b1) W2^T + b2 with W1 [F, C] column-parallel (rows split,
 * b1 split) and W2 [C, F] row-parallel (columns split, b2 replicated). */
static void check_linear_pair(Comm *tpc, int sp)
{
    enum { C = 12, F = 16 };
    const int tp = tpc->size, r = tpc->rank, Fl = F / tp;
    const Backend *be = backend_cpu();
    TpGroup g = tp_group_layout(be, tp, r, sp, 1);
    tp_group_attach(&g, tpc);
    const int n = tp_stream_rows(&g, N);
    char what[96];
    snprintf(what, sizeof what, "linear pair tp %d sp %d", tp, sp);

    float x[N * C], w1[F * C], b1[F], w2[C * F], b2[C], h[N * F], y[N * C], dy[N * C];
    fill(x, N * C, 1, 1);
    fill(w1, F * C, 0.5f, 2);
    fill(b1, F, 0.5f, 3);
    fill(w2, C * F, 0.5f, 4);
    fill(b2, C, 0.5f, 5);
    fill(dy, N * C, 1, 6);
    /* The unsplit reference, forward and backward. */
    be->matmul_forward(h, x, w1, b1, N, C, F);
    be->matmul_forward(y, h, w2, b2, N, F, C);
    float dh[N * F] = {0}, dx[N * C] = {0}, dw1[F * C] = {0}, db1[F] = {0}, dw2[C * F] = {0};
    float db2[C] = {0};
    be->matmul_backward(dh, dw2, db2, dy, h, w2, N, F, C, GRAD_ADD);
    be->matmul_backward(dx, dw1, db1, dh, x, w1, N, C, F, GRAD_ADD);

    /* This rank's pieces. */
    float w1l[F * C], w2l[C * F], xl[N * C], hl[N * F], yl[N * C], full[N * C];
    memcpy(w1l, w1 + (size_t)r * Fl * C, (size_t)Fl * C * sizeof(float));
    for (int o = 0; o < C; o++)
        memcpy(w2l + o * Fl, w2 + o * F + r * Fl, (size_t)Fl * sizeof(float));
    /* Column input forward: SP ranks start from their rows only. */
    memset(xl, 0, sizeof xl);
    memcpy(tp_my_rows(&g, xl, N, C), tp_my_rows(&g, x, N, C), (size_t)n * C * sizeof(float));
    if (!sp)
        memcpy(xl, x, sizeof xl);
    tp_column_input_forward(&g, xl, N, C);
    CHECK(worst(xl, x, N * C, 0, 0) == 0, "%s: column input made whole", what);
    be->matmul_forward(hl, xl, w1l, b1 + r * Fl, N, C, Fl);
    be->matmul_forward(yl, hl, w2l, NULL, N, Fl, C);
    tp_row_output_forward(&g, yl, b2, N, C);
    const float *ymine = tp_my_rows(&g, y, N, C);
    CHECK(worst(yl, ymine, (size_t)n * C, 1e-5, 1e-6) <= 1, "%s: output rows", what);

    /* Backward from this rank's rows of dy. */
    float dyl[N * C], dhl[N * F] = {0}, dxl[N * C] = {0}, dw1l[F * C] = {0}, db1l[F] = {0};
    float dw2l[C * F] = {0}, db2l[C] = {0};
    memcpy(dyl, tp_my_rows(&g, dy, N, C), (size_t)n * C * sizeof(float));
    const float *dyw = tp_row_output_backward(&g, dyl, full, N, C);
    CHECK(worst(dyw, dy, N * C, 0, 0) == 0, "%s: row output gradient made whole", what);
    be->matmul_backward(dhl, dw2l, db2l, dyw, hl, w2l, N, Fl, C, GRAD_ADD);
    be->matmul_backward(dxl, dw1l, db1l, dhl, xl, w1l, N, C, Fl, GRAD_ADD);
    tp_column_input_backward(&g, dxl, N, C);
    CHECK(worst(dxl, tp_my_rows(&g, dx, N, C), (size_t)n * C, 1e-5, 1e-6) <= 1,
          "%s: input gradient rows", what);
    CHECK(worst(dw1l, dw1 + (size_t)r * Fl * C, (size_t)Fl * C, 1e-5, 1e-6) <= 1,
          "%s: column weight gradient", what);
    CHECK(worst(db1l, db1 + r * Fl, (size_t)Fl, 1e-5, 1e-6) <= 1, "%s: column bias gradient", what);
    float want[C * F];
    for (int o = 0; o < C; o++)
        memcpy(want + o * Fl, dw2 + o * F + r * Fl, (size_t)Fl * sizeof(float));
    CHECK(worst(dw2l, want, (size_t)C * Fl, 1e-5, 1e-6) <= 1, "%s: row weight gradient", what);
    CHECK(worst(db2l, db2, C, 1e-5, 1e-6) <= 1, "%s: replicated bias gradient complete", what);
    tp_group_free(&g);
}

/* The embedding over a vocabulary split tp ways (Vp rows in all). */
static void check_embedding(Comm *tpc, int sp)
{
    enum { C = 8, Vp = 64 };
    const int tp = tpc->size, r = tpc->rank, Vl = Vp / tp;
    const Backend *be = backend_cpu();
    TpGroup g = tp_group_layout(be, tp, r, sp, 1);
    tp_group_attach(&g, tpc);
    const int n = tp_stream_rows(&g, N);
    char what[96];
    snprintf(what, sizeof what, "embedding tp %d sp %d", tp, sp);

    int32_t tok[N];
    uint64_t seed = 7;
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(lcg(&seed) % V);
    tok[0] = V - 1;
    float wte[Vp * C], wpe[T * C], out[N * C], dout[N * C];
    fill(wte, Vp * C, 1, 8);
    fill(wpe, T * C, 1, 9);
    fill(dout, N * C, 1, 10);
    be->embedding_forward(out, tok, NULL, wte, wpe, N, T, C, 0, Vp);
    float dwte[Vp * C] = {0}, dwpe[T * C] = {0};
    be->embedding_backward(dwte, dwpe, dout, tok, NULL, N, T, C, 0, Vp);

    float outl[N * C], full[N * C], dwtel[Vp * C] = {0}, dwpel[T * C] = {0}, scratch[T * C];
    tp_embedding_forward(be, &g, outl, full, tok, NULL, wte + (size_t)r * Vl * C, wpe, N, T, C,
                         r * Vl, Vl);
    CHECK(worst(outl, tp_my_rows(&g, out, N, C), (size_t)n * C, 1e-6, 1e-7) <= 1, "%s: output rows",
          what);
    float doutl[N * C];
    memcpy(doutl, tp_my_rows(&g, dout, N, C), (size_t)n * C * sizeof(float));
    /* Twice: the second adds to the first, as micro-batches do. */
    for (int k = 0; k < 2; k++)
        tp_embedding_backward(be, &g, dwtel, dwpel, scratch, doutl, full, tok, NULL, N, T, C,
                              r * Vl, Vl);
    for (size_t i = 0; i < (size_t)Vp * C; i++)
        dwte[i] *= 2;
    for (size_t i = 0; i < (size_t)T * C; i++)
        dwpe[i] *= 2;
    CHECK(worst(dwtel, dwte + (size_t)r * Vl * C, (size_t)Vl * C, 1e-6, 1e-7) <= 1,
          "%s: wte gradient rows", what);
    CHECK(worst(dwpel, dwpe, (size_t)T * C, 1e-6, 1e-7) <= 1,
          "%s: wpe gradient complete after accumulation", what);
    tp_group_free(&g);
}

/* Cross-entropy over logits [N, Vp] of which V are real, split tp ways. */
static void check_crossentropy(Comm *tpc)
{
    enum { Vp = 64 };
    const int tp = tpc ? tpc->size : 1, r = tpc ? tpc->rank : 0, Vl = Vp / tp;
    const Backend *be = backend_cpu();
    TpGroup g = tp_group_layout(be, tp, r, 0, 1);
    tp_group_attach(&g, tpc);
    char what[64];
    snprintf(what, sizeof what, "cross-entropy tp %d", tp);

    float logits[N * Vp], losses[N];
    fill(logits, N * Vp, 4, 11);
    int32_t tgt[N];
    uint64_t seed = 12;
    for (int i = 0; i < N; i++)
        tgt[i] = (int32_t)(lcg(&seed) % V);
    tgt[1] = -1;
    tgt[2] = V - 1;
    tgt[3] = 0;
    be->crossentropy_forward(losses, logits, tgt, N, V, Vp);
    const float dloss = 0.25f;

    float mine[N * Vp], ll[N], stats[3 * N];
    for (int i = 0; i < N; i++)
        memcpy(mine + i * Vl, logits + i * Vp + r * Vl, (size_t)Vl * sizeof(float));
    const int real = V - r * Vl < 0 ? 0 : (V - r * Vl > Vl ? Vl : V - r * Vl);
    tp_crossentropy_forward(&g, ll, stats, mine, tgt, tgt, N, real, Vl, r * Vl, V);
    tp_crossentropy_backward(&g, mine, stats, tgt, dloss, N, real, Vl, r * Vl);
    be->crossentropy_backward(logits, tgt, dloss, N, V, Vp);
    float want[N * Vp];
    for (int i = 0; i < N; i++)
        memcpy(want + i * Vl, logits + i * Vp + r * Vl, (size_t)Vl * sizeof(float));
    if (tp == 1) {
        CHECK(memcmp(ll, losses, sizeof ll) == 0, "%s: losses bit-equal to the backend's", what);
        CHECK(memcmp(mine, want, (size_t)N * Vp * sizeof(float)) == 0,
              "%s: dlogits bit-equal to the backend's", what);
    } else {
        CHECK(worst(ll, losses, N, 1e-6, 1e-7) <= 1, "%s: losses", what);
        CHECK(worst(mine, want, (size_t)N * Vl, 1e-5, 1e-8) <= 1, "%s: dlogits slice", what);
    }
    tp_group_free(&g);
}

/* ---- whole models ------------------------------------------------------- */

typedef struct {
    ModelArch arch;
    int kv_heads;
    Recompute recompute;
} ModelCase;

static void tiny_config(Config *c, const ModelCase *k, int tp, int sp)
{
    config_defaults(c);
    ModelConfig *m = &c->model;
    m->arch = k->arch;
    m->layers = 2;
    m->hidden = 32;
    m->heads = 4;
    m->kv_heads = k->kv_heads;
    m->ffn_hidden = k->arch == ARCH_GPT2 ? 64 : 48;
    m->vocab = V;
    m->vocab_pad_multiple = 8;
    m->seq_len = T;
    m->tie_embeddings = k->arch == ARCH_GPT2;
    m->norm_eps = 1e-5f;
    m->rope_theta = 10000.0f;
    m->init_std = 0.1f;
    c->training.recompute = k->recompute;
    c->run.seed = 99;
    c->topology.tp = tp;
    c->topology.sequence_parallel = sp;
}

static void make_batch(int32_t *tok, int32_t *tgt, uint64_t seed)
{
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)(lcg(&seed) % V);
        tgt[i] = (int32_t)(lcg(&seed) % V);
    }
    tok[5] = V - 1; /* the last real row: on the last rank holding any */
    tgt[6] = V - 1;
    tgt[9] = -1; /* ignored */
}

/* Move every parameter off its initial value by a pure function of (name,
 * global element), the same in both models: biases start at zero and norm
 * weights at one, which would hide a bias added tp times or a norm weight
 * read from the wrong place. */
static void perturb(Model *m)
{
    const ParamTable *t = model_params(m);
    float *w = model_param_buffer(m);
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        const uint64_t key = rng_mix(7, rng_hash_str(p->name));
        for (int64_t r = 0; r < p->local_shape[0]; r++)
            for (int64_t c = 0; c < p->local_shape[1]; c++) {
                const int64_t g = params_global_row(p, r) * p->shape[1] + p->local_start[1] + c;
                w[p->offset + (size_t)(r * p->local_shape[1] + c)] +=
                    0.1f * rng_normal(key, (uint64_t)g);
            }
    }
}

/* Every local gradient element of tm against the full model's. */
static void compare_grads(Model *tm, Model *fm, const char *what)
{
    const ParamTable *tt = model_params(tm), *ft = model_params(fm);
    const float *tg = model_grad_buffer(tm), *fg = model_grad_buffer(fm);
    for (int i = 0; i < tt->n; i++) {
        const ParamSpec *p = &tt->p[i];
        const ParamSpec *f = params_find(ft, p->name);
        CHECK(f && f->shape[0] == p->shape[0] && f->shape[1] == p->shape[1],
              "%s: %s has the full model's shape", what, p->name);
        if (!f)
            continue;
        const double scale = max_abs(fg + f->offset, f->numel);
        double w = 0;
        int64_t wr = 0, wc = 0;
        for (int64_t r = 0; r < p->local_shape[0]; r++)
            for (int64_t c = 0; c < p->local_shape[1]; c++) {
                const int64_t gr = params_global_row(p, r), gc = p->local_start[1] + c;
                const float got = tg[p->offset + (size_t)(r * p->local_shape[1] + c)];
                const float want = fg[f->offset + (size_t)(gr * f->shape[1] + gc)];
                const double e =
                    fabs((double)got - want) / (1e-5 * scale + 1e-4 * fabs(want) + 1e-30);
                if (e > w) {
                    w = e;
                    wr = gr;
                    wc = gc;
                }
            }
        CHECK(w <= 1,
              "%s: %s gradient differs from the full model's at (%lld, %lld) "
              "(%.3g of the tolerance)",
              what, p->name, (long long)wr, (long long)wc, w);
    }
}

/* Replicated tensors (split_dim -1) must carry the same gradient bits on
 * every TP rank, so that the optimizer keeps them equal. */
static void compare_replicas(Model *tm, Comm *tpc, const char *what)
{
    const ParamTable *t = model_params(tm);
    const float *g = model_grad_buffer(tm);
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        if (p->split_dim >= 0)
            continue;
        float *root = malloc(p->numel * sizeof(float));
        memcpy(root, g + p->offset, p->numel * sizeof(float));
        comm_broadcast(tpc, root, p->numel * sizeof(float), 0);
        CHECK(memcmp(root, g + p->offset, p->numel * sizeof(float)) == 0,
              "%s: %s gradient differs across TP ranks", what, p->name);
        free(root);
    }
}

static void check_model(Comm *tpc, const ModelCase *k, int sp)
{
    const int tp = tpc->size;
    char what[128];
    snprintf(what, sizeof what, "%s kv_heads %d recompute %d tp %d sp %d",
             k->arch == ARCH_GPT2 ? "gpt2" : "llama", k->kv_heads, (int)k->recompute, tp, sp);

    Config tc, fc;
    tiny_config(&tc, k, tp, sp);
    tiny_config(&fc, k, 1, 0);
    /* The full model padded like the TP one, so the tensors have one shape. */
    fc.model.vocab_pad_multiple *= tp;
    CHECK(params_padded_vocab(&tc.model, tp) == params_padded_vocab(&fc.model, 1),
          "%s: padded vocabularies agree", what);
    ParamShard fsh = params_full_shard(&fc.model);
    ParamShard tsh = params_full_shard(&tc.model);
    tsh.tp = tp;
    tsh.tp_rank = tpc->rank;
    Model *fm = model_create(&fc, backend_cpu(), &fsh, B);
    Model *tm = model_create(&tc, backend_cpu(), &tsh, B);
    model_set_tensor_parallel(tm, tpc);
    perturb(fm);
    perturb(tm);
    CHECK(model_stream_rows(tm) == (sp ? N / tp : N), "%s: stream rows %d", what,
          model_stream_rows(tm));

    /* Two micro-batches accumulated, as the trainer does. */
    model_zero_grad(fm);
    model_zero_grad(tm);
    for (int mb = 0; mb < 2; mb++) {
        int32_t tok[N], tgt[N];
        make_batch(tok, tgt, 100 + (uint64_t)mb);
        const float lf = model_forward(fm, tok, tgt);
        const float lt = model_forward(tm, tok, tgt);
        CHECK_CLOSE(lt, lf, 1e-5, 0, what);
        float lmax = lt, lmin = lt;
        comm_allreduce_max_f32(tpc, &lmax, 1);
        lmin = -lmin;
        comm_allreduce_max_f32(tpc, &lmin, 1);
        CHECK(lmax == -lmin, "%s: loss equal on all TP ranks", what);
        model_backward(fm, 0.5f);
        model_backward(tm, 0.5f);
    }
    compare_grads(tm, fm, what);
    compare_replicas(tm, tpc, what);

    /* The gradient norm with replicated elements counted once. */
    const ParamTable *tt = model_params(tm), *ft = model_params(fm);
    double st = params_grad_sumsq(tt, backend_cpu(), model_grad_buffer(tm), 0, tt->numel);
    comm_allreduce_f64(tpc, &st, 1);
    const double sf = params_grad_sumsq(ft, backend_cpu(), model_grad_buffer(fm), 0, ft->numel);
    CHECK_CLOSE(st, sf, 1e-5, 0, "gradient sum of squares over TP");
    /* A range that starts and ends inside tensors: split in two, same sum. */
    const size_t cut = tt->numel / 3 + 1;
    double parts =
        params_grad_sumsq(tt, backend_cpu(), model_grad_buffer(tm), 0, cut) +
        params_grad_sumsq(tt, backend_cpu(), model_grad_buffer(tm) + cut, cut, tt->numel);
    comm_allreduce_f64(tpc, &parts, 1);
    CHECK_CLOSE(parts, st, 1e-12, 0, "gradient sum of squares over split ranges");

    model_free(tm);
    model_free(fm);
}

int main(int argc, char **argv)
{
    if (!mpi_test_child())
        return mpi_test_relaunch("tp", 4);
    comm_init(&argc, &argv);
    alarm(120);             /* a hung collective fails the test instead of stalling it */
    omp_set_num_threads(1); /* four ranks share the machine */
    Comm world = comm_world();
    if (world.size != WORLD) {
        fprintf(stderr, "tp: needs %d ranks, got %d\n", WORLD, world.size);
        comm_finalize();
        return 1;
    }
    {
        ModelConfig m = {.vocab = V, .vocab_pad_multiple = 8};
        CHECK(params_padded_vocab(&m, 4) == 64 && params_padded_vocab(&m, 2) == 48,
              "V 37 pads to 48 rows (tp 2) and 64 (tp 4), got %d and %d",
              params_padded_vocab(&m, 2), params_padded_vocab(&m, 4));
    }
    check_crossentropy(NULL);

    static const ModelCase cases[] = {
        {ARCH_GPT2, 4, RECOMPUTE_NONE},  {ARCH_LLAMA, 4, RECOMPUTE_NONE},
        {ARCH_LLAMA, 2, RECOMPUTE_NONE}, {ARCH_LLAMA, 1, RECOMPUTE_NONE},
        {ARCH_GPT2, 2, RECOMPUTE_FULL},  {ARCH_LLAMA, 2, RECOMPUTE_SELECTIVE},
    };
    for (int tp = 2; tp <= WORLD; tp *= 2) {
        Comm tpc = comm_split(&world, world.rank / tp, world.rank);
        check_crossentropy(&tpc);
        for (int sp = 0; sp <= 1; sp++) {
            check_linear_pair(&tpc, sp);
            check_embedding(&tpc, sp);
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
                check_model(&tpc, &cases[i], sp);
        }
        comm_free(&tpc);
    }

    int failed = check_failures;
    comm_allreduce_max_i32(&world, &failed, 1);
    int rc = check_summary("tp");
    comm_finalize();
    return rc || failed;
}
