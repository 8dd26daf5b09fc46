/* bench_cpu — training throughput of the CPU backend against the machine's
 * own SGEMM rate and copy bandwidth, measured in the same run, with the time
 * of one step broken down by op.
 *
 * Default shapes: GPT-2 124M (12 layers, 768 hidden, 12 heads, vocab 50257),
 * micro-batch 4, sequence 64.  One step = zero grads, forward, backward,
 * gradient clipping (norm, then scale), AdamW: what trainer_step does on one
 * rank.  Model FLOPs = model_flops_per_token() * tokens (6 * matmul params +
 * attention).
 *
 * Rounds alternate between 1 thread and all threads (OMP_NUM_THREADS, else
 * every core); each round measures its SGEMM probe (OpenBLAS on that many
 * threads, 1024^3) and a copy probe (STREAM-like, OpenMP) before and after
 * its steps.  This machine's speed drifts, so each figure is a ratio to the
 * probes of its own round, and the round with the best ratio is reported,
 * with its per-op breakdown.
 *
 * The breakdown comes from a copy of the CPU backend's table whose entries
 * time the real ones (the backend itself is untouched: nothing is added to
 * an op when no one profiles).  GEMMs are told apart by their shapes.
 *
 *   bench_cpu [--layers L --hidden C --heads H --vocab V --batch B --seq T
 *              --steps N --rounds R --threads T]
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/params.h"
#include "train/trainer.h"
#include "zero/optimizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the profiled table ------------------------------------------------- */

/* The rows of the breakdown.  GEMM rows are rated in FLOP/s against the
 * SGEMM probe, the others in bytes moved against the copy probe (attention
 * in FLOP/s: it is a loop of dot products). */
enum {
    OP_QKV,
    OP_ATTO,
    OP_FC,
    OP_PROJ,
    OP_HEAD,
    OP_QKV_B,
    OP_ATTO_B,
    OP_FC_B,
    OP_PROJ_B,
    OP_HEAD_B,
    OP_GEMM_OTHER,
    OP_ATTN,
    OP_ATTN_B,
    OP_LN,
    OP_LN_B,
    OP_GELU,
    OP_GELU_B,
    OP_CE,
    OP_CE_B,
    OP_EMB,
    OP_EMB_B,
    OP_RESID,
    OP_ZERO,
    OP_CLIP,
    OP_ADAMW,
    OP_N
};
static const char *op_name[OP_N] = {
    "gemm qkv",
    "gemm attn out",
    "gemm fc",
    "gemm mlp proj",
    "gemm vocab head",
    "gemm qkv bwd",
    "gemm attn out bwd",
    "gemm fc bwd",
    "gemm mlp proj bwd",
    "gemm vocab head bwd",
    "gemm other",
    "attention",
    "attention bwd",
    "layernorm",
    "layernorm bwd",
    "gelu",
    "gelu bwd",
    "softmax+xent",
    "softmax+xent bwd",
    "embedding",
    "embedding bwd",
    "residual add",
    "zero grads",
    "grad clip",
    "adamw",
};
static int op_is_flops(int k) { return k <= OP_GEMM_OTHER || k == OP_ATTN || k == OP_ATTN_B; }

typedef struct {
    double s[OP_N], work[OP_N]; /* seconds; FLOPs or bytes */
} Profile;

static Profile prof;
static const Backend *base;
static int g_C, g_F, g_QKV, g_Vp; /* the shapes that tell GEMMs apart */

static int gemm_class(int C, int OC)
{
    if (C == g_C && OC == g_QKV)
        return OP_QKV;
    if (C == g_C && OC == g_C)
        return OP_ATTO;
    if (C == g_C && OC == g_F)
        return OP_FC;
    if (C == g_F && OC == g_C)
        return OP_PROJ;
    if (C == g_C && OC == g_Vp)
        return OP_HEAD;
    return OP_GEMM_OTHER;
}

#define TIMED(k, work_, call)                                                                      \
    do {                                                                                           \
        double t0_ = now_s();                                                                      \
        call;                                                                                      \
        prof.s[k] += now_s() - t0_;                                                                \
        prof.work[k] += (work_);                                                                   \
    } while (0)

static void p_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                             int N, int C, int OC)
{
    TIMED(gemm_class(C, OC), 2.0 * N * C * OC,
          base->matmul_forward(out, inp, weight, bias, N, C, OC));
}

static void p_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int N, int C, int OC,
                              GradMode dinp_mode)
{
    int k = gemm_class(C, OC);
    if (k != OP_GEMM_OTHER)
        k += OP_QKV_B - OP_QKV;
    TIMED(k, 2.0 * N * C * OC * ((dinp != NULL) + (dweight != NULL)),
          base->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, dinp_mode));
}

/* Causal (query, key) pairs times the products per pair: forward q.k and
 * p.v; backward q.k again, dout.v, dq, dk, dv. */
static double attn_flops(int B, int T, int H, int hs, int products)
{
    return 2.0 * hs * products * (double)B * H * T * (T + 1) / 2;
}

static void p_attention_forward(float *out, float *lse, const float *q, const float *kv,
                                const AttnArgs *a)
{
    TIMED(OP_ATTN, attn_flops(a->B, a->Tq, a->H, a->hs, 2),
          base->attention_forward(out, lse, q, kv, a));
}

static void p_attention_backward(float *dq, float *dkv, const float *dout, const float *q,
                                 const float *kv, const float *out, const float *lse,
                                 const AttnArgs *a)
{
    TIMED(OP_ATTN_B, attn_flops(a->B, a->Tq, a->H, a->hs, 5),
          base->attention_backward(dq, dkv, dout, q, kv, out, lse, a));
}

/* Bytes below: each float read or written once (4 bytes). */
static void p_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int N, int C, float eps)
{
    TIMED(OP_LN, 8.0 * N * C,
          base->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps));
}

static void p_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int N, int C)
{
    TIMED(OP_LN_B, 16.0 * N * C,
          base->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C));
}

static void p_gelu_forward(float *out, const float *inp, size_t n)
{
    TIMED(OP_GELU, 8.0 * (double)n, base->gelu_forward(out, inp, n));
}

static void p_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                            GradMode mode)
{
    TIMED(OP_GELU_B, 16.0 * (double)n, base->gelu_backward(dinp, inp, dout, n, mode));
}

static void p_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                                   int N, int V, int Vp)
{
    TIMED(OP_CE, 4.0 * N * Vp, base->crossentropy_forward(losses, logits, targets, N, V, Vp));
}

static void p_crossentropy_backward(float *logits, const int32_t *targets, float dloss, int N,
                                    int V, int Vp)
{
    TIMED(OP_CE_B, 8.0 * N * Vp, base->crossentropy_backward(logits, targets, dloss, N, V, Vp));
}

static void p_embedding_forward(float *out, const int32_t *tokens, const int32_t *pos,
                                const float *wte, const float *wpe, int N, int T, int C,
                                int vocab_start, int V)
{
    TIMED(OP_EMB, 12.0 * N * C,
          base->embedding_forward(out, tokens, pos, wte, wpe, N, T, C, vocab_start, V));
}

static void p_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                 const int32_t *pos, int N, int T, int C, int vocab_start, int V)
{
    TIMED(OP_EMB_B, 20.0 * N * C,
          base->embedding_backward(dwte, dwpe, dout, tokens, pos, N, T, C, vocab_start, V));
}

static void p_add(float *out, const float *a, const float *b, size_t n)
{
    TIMED(OP_RESID, 12.0 * (double)n, base->add(out, a, b, n));
}

static void p_accumulate(float *y, const float *x, size_t n)
{
    TIMED(OP_RESID, 12.0 * (double)n, base->accumulate(y, x, n));
}

static void p_zero(void *p, size_t bytes) { TIMED(OP_ZERO, (double)bytes, base->zero(p, bytes)); }

static double p_sumsq(const float *x, size_t n)
{
    double r;
    TIMED(OP_CLIP, 4.0 * (double)n, r = base->sumsq(x, n));
    return r;
}

static void p_scale(float *x, float s, size_t n)
{
    TIMED(OP_CLIP, 8.0 * (double)n, base->scale(x, s, n));
}

/* p, g, m, v read; p, m, v written (fp32, param == master). */
static void p_adamw(float *param, float *master, const float *grad, float *m, float *v, size_t n,
                    float lr, float beta1, float beta2, float eps, float weight_decay,
                    float grad_scale, int t, int round_bf16)
{
    TIMED(OP_ADAMW, 28.0 * (double)n,
          base->adamw(param, master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale,
                      t, round_bf16));
}

static Backend profiled_backend(void)
{
    base = backend_cpu();
    Backend b = *base;
    b.matmul_forward = p_matmul_forward;
    b.matmul_backward = p_matmul_backward;
    b.attention_forward = p_attention_forward;
    b.attention_backward = p_attention_backward;
    b.layernorm_forward = p_layernorm_forward;
    b.layernorm_backward = p_layernorm_backward;
    b.gelu_forward = p_gelu_forward;
    b.gelu_backward = p_gelu_backward;
    b.crossentropy_forward = p_crossentropy_forward;
    b.crossentropy_backward = p_crossentropy_backward;
    b.embedding_forward = p_embedding_forward;
    b.embedding_backward = p_embedding_backward;
    b.add = p_add;
    b.accumulate = p_accumulate;
    b.zero = p_zero;
    b.sumsq = p_sumsq;
    b.scale = p_scale;
    b.adamw = p_adamw;
    return b;
}

/* ---- probes ------------------------------------------------------------- */

/* Copy bandwidth on the OpenMP threads, bytes read + written per second,
 * best of several: 64 MiB each way, far beyond the caches. */
static double copy_probe(void)
{
    const size_t n = (size_t)16 << 20;
    float *a = trd_malloc(n * sizeof(float), "copy probe"),
          *b = trd_malloc(n * sizeof(float), "copy probe");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] = (float)(i & 7);
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = now_s();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            b[i] = a[i];
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    volatile float sink = b[n - 1];
    (void)sink;
    free(a);
    free(b);
    return 2.0 * (double)(n * sizeof(float)) / best;
}

/* ---- one round ---------------------------------------------------------- */

typedef struct {
    int threads;
    double step_s, sgemm, copy, ratio;
    Profile prof;
} Round;

typedef struct {
    Config cfg;
    const Backend *be;
    Model *m;
    Optimizer opt;
    int32_t *tok, *tgt;
    float loss;
} Bench;

/* One training step on one rank, as trainer_step runs it (stage 0). */
static void one_step(Bench *b)
{
    const ParamTable *pt = model_params(b->m);
    model_zero_grad(b->m);
    b->loss = model_forward(b->m, b->tok, b->tgt);
    model_backward(b->m, 1.0f);
    double norm = sqrt(params_grad_sumsq(pt, b->be, model_grad_buffer(b->m), 0, pt->numel));
    const float clip = b->cfg.training.grad_clip;
    if (clip > 0 && norm > clip)
        optimizer_scale_grads(&b->opt, clip / (float)(norm + 1e-6));
    optimizer_step(&b->opt, model_param_buffer(b->m), model_grad_buffer(b->m), 3e-4f,
                   &b->cfg.training);
}

static double max2(double a, double b) { return a > b ? a : b; }

/* The probes run before and after the steps, and the faster of the two
 * counts: a probe that fell into a slow moment of the machine would
 * flatter the ratio. */
static Round run_round(Bench *b, int threads, int steps, int warm)
{
    Round r = {.threads = threads};
    omp_set_num_threads(threads);
    if (warm)
        one_step(b); /* the first round warms caches and thread pools */
    r.sgemm = train_cpu_peak_flops(1024);
    r.copy = copy_probe();
    memset(&prof, 0, sizeof prof);
    double t0 = now_s();
    for (int s = 0; s < steps; s++)
        one_step(b);
    r.step_s = (now_s() - t0) / steps;
    for (int k = 0; k < OP_N; k++) { /* per step, as step_s */
        r.prof.s[k] = prof.s[k] / steps;
        r.prof.work[k] = prof.work[k] / steps;
    }
    r.sgemm = max2(r.sgemm, train_cpu_peak_flops(1024));
    r.copy = max2(r.copy, copy_probe());
    const double tokens = (double)b->cfg.training.micro_batch * b->cfg.model.seq_len;
    r.ratio = model_flops_per_token(&b->cfg.model) * tokens / r.step_s / r.sgemm;
    return r;
}

static void print_breakdown(const Round *r, int n)
{
    printf("\nper-op time of one step in the best round of each thread count, its rate against "
           "that round's probes\n(GEMMs and attention: GFLOP/s and / SGEMM; the rest: GB/s and / "
           "copy)\n");
    printf("%-24s", "op");
    for (int i = 0; i < n; i++)
        printf(" | %2d thr: %8s %5s %7s %5s", r[i].threads, "ms", "%", "rate", "/peak");
    if (n == 2)
        printf(" | speed-up");
    printf("\n");
    double acc[8] = {0};
    for (int k = 0; k < OP_N; k++) {
        int any = 0;
        for (int i = 0; i < n; i++)
            any |= r[i].prof.s[k] > 0;
        if (!any)
            continue;
        printf("%-24s", op_name[k]);
        for (int i = 0; i < n; i++) {
            const double s = r[i].prof.s[k], w = r[i].prof.work[k];
            const double rate = w / s, peak = op_is_flops(k) ? r[i].sgemm : r[i].copy;
            acc[i] += s;
            printf(" | %8s %8.1f %5.1f %7.1f %5.2f", "", 1e3 * s, 100 * s / r[i].step_s,
                   1e-9 * rate, rate / peak);
        }
        if (n == 2)
            printf(" | %7.2fx", r[0].prof.s[k] / r[1].prof.s[k]);
        printf("\n");
    }
    printf("%-24s", "the rest");
    for (int i = 0; i < n; i++) {
        const double s = r[i].step_s - acc[i];
        printf(" | %8s %8.1f %5.1f %7s %5s", "", 1e3 * s, 100 * s / r[i].step_s, "", "");
    }
    printf("\n%-24s", "step");
    for (int i = 0; i < n; i++)
        printf(" | %8s %8.1f %5.1f %7s %5s", "", 1e3 * r[i].step_s, 100.0, "", "");
    if (n == 2)
        printf(" | %7.2fx", r[0].step_s / r[1].step_s);
    printf("\n");
}

int main(int argc, char **argv)
{
    Bench b = {0};
    Config *cfg = &b.cfg;
    config_defaults(cfg);
    cfg->model.arch = ARCH_GPT2;
    cfg->model.layers = 12;
    cfg->model.hidden = 768;
    cfg->model.heads = 12;
    cfg->model.vocab = 50257;
    cfg->model.seq_len = 64;
    cfg->training.micro_batch = 4;
    cfg->training.global_batch = 4;
    cfg->training.steps = 1;
    cfg->training.lr = 3e-4f;
    snprintf(cfg->data.path, sizeof cfg->data.path, "unused");
    int steps = 2, rounds = 3, threads = omp_get_max_threads();
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers"))
            cfg->model.layers = v;
        else if (!strcmp(argv[i], "--hidden"))
            cfg->model.hidden = v;
        else if (!strcmp(argv[i], "--heads"))
            cfg->model.heads = v;
        else if (!strcmp(argv[i], "--vocab"))
            cfg->model.vocab = v;
        else if (!strcmp(argv[i], "--seq"))
            cfg->model.seq_len = v;
        else if (!strcmp(argv[i], "--batch"))
            cfg->training.micro_batch = cfg->training.global_batch = v;
        else if (!strcmp(argv[i], "--steps"))
            steps = v;
        else if (!strcmp(argv[i], "--rounds"))
            rounds = v;
        else if (!strcmp(argv[i], "--threads"))
            threads = v;
        else if (!strcmp(argv[i], "--arch"))
            cfg->model.arch = !strcmp(argv[i + 1], "llama") ? ARCH_LLAMA : ARCH_GPT2;
        else
            trd_fatal(TRD_EXIT_INPUT, NULL, "unknown option %s", argv[i]);
    }
    if (steps < 1 || rounds < 1 || threads < 1)
        trd_fatal(TRD_EXIT_INPUT, NULL, "--steps, --rounds and --threads must be at least 1");
    char err[CFG_ERR];
    if (config_validate(cfg, 1, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);

    static Backend pb;
    pb = profiled_backend();
    b.be = &pb;
    const int B = cfg->training.micro_batch, T = cfg->model.seq_len;
    ParamShard sh = params_full_shard(&cfg->model);
    b.m = model_create(cfg, b.be, &sh, B);
    const ParamTable *pt = model_params(b.m);
    optimizer_init(&b.opt, pt, b.be, model_param_buffer(b.m), 0, pt->numel, PREC_FP32);
    g_C = cfg->model.hidden;
    g_F = cfg->model.ffn_hidden;
    g_QKV = 3 * cfg->model.hidden;
    g_Vp = model_vocab_padded(b.m);

    b.tok = malloc((size_t)B * T * sizeof(int32_t));
    b.tgt = malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) {
        b.tok[i] = (int32_t)(rng_u64(1, (uint64_t)i) % (uint64_t)cfg->model.vocab);
        b.tgt[i] = (int32_t)(rng_u64(2, (uint64_t)i) % (uint64_t)cfg->model.vocab);
    }

    const double tokens = (double)B * T, flops = model_flops_per_token(&cfg->model) * tokens;
    printf("model: %s layers %d hidden %d heads %d vocab %d | batch %d x seq %d | %.1f M params\n",
           config_arch_name(cfg->model.arch), cfg->model.layers, cfg->model.hidden,
           cfg->model.heads, cfg->model.vocab, B, T, 1e-6 * (double)params_count_real(&cfg->model));
    printf("step = zero grads, forward, backward, clip, AdamW; %d step(s) a round, %d rounds "
           "alternating 1 and %d threads\n\n",
           steps, rounds, threads);
    const int nt = threads > 1 ? 2 : 1, tc[2] = {1, threads};
    Round best[2] = {{0}};
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < nt; i++) {
            Round r = run_round(&b, tc[i], steps, k == 0);
            printf("round %d, %2d thread(s): step %8.1f ms  model %6.2f GFLOP/s  SGEMM %6.2f "
                   "GFLOP/s  copy %5.1f GB/s  ratio %.3f\n",
                   k + 1, r.threads, 1e3 * r.step_s, 1e-9 * flops / r.step_s, 1e-9 * r.sgemm,
                   1e-9 * r.copy, r.ratio);
            fflush(stdout);
            if (r.ratio > best[i].ratio)
                best[i] = r;
        }
    print_breakdown(best, nt);
    printf("\nfinal loss %.4f (finite check)\n", b.loss);
    for (int i = 0; i < nt; i++) {
        const Round *r = &best[i];
        printf("%2d thread(s), best round: step %.1f ms, training tokens/s %.1f, model GFLOP/s "
               "%.2f, SGEMM GFLOP/s %.2f, ratio to SGEMM %.3f\n",
               r->threads, 1e3 * r->step_s, tokens / r->step_s, 1e-9 * flops / r->step_s,
               1e-9 * r->sgemm, r->ratio);
    }
    if (nt == 2) {
        const double sp = best[0].step_s / best[1].step_s, sg = best[1].sgemm / best[0].sgemm;
        printf("speed-up 1 -> %d threads, best rounds: trident %.2fx, SGEMM %.2fx (trident/SGEMM "
               "%.2f)\n",
               threads, sp, sg, sp / sg);
    }
    optimizer_free(&b.opt);
    model_free(b.m);
    free(b.tok);
    free(b.tgt);
    return 0;
}
