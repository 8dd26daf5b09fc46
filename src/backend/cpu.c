/* cpu.c — the CPU reference backend: the ops of cpu_ops.inc in fp32
 * (OpenBLAS for GEMMs, OpenMP for the rest), gathered in a Backend table. */
#include "backend/backend.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"
#include "core/rng.h"

typedef float real;
#define NAME(x) cpu_##x
#define OPS_API static
#define RM(fn)  fn##f
#define GEMM    cblas_sgemm
#include "backend/cpu_ops.inc"

/* Round to nearest, ties to even, on the bits: adding 0x7fff plus the lowest
 * kept bit carries into the kept half exactly when the dropped half is
 * above one half, or equal to it with an odd kept half.  Infinities pass
 * through unchanged; NaNs are kept NaN (quiet) rather than truncated,
 * which could turn a NaN whose payload sits in the low half into inf. */
float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u = (u | 0x00400000u) & 0xffff0000u;
    else
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t bf16_bits(float x)
{
    const float r = bf16_round(x);
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    return (uint16_t)(u >> 16);
}

static void cpu_widen_bf16(float *dst, const uint16_t *src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

static void cpu_dropout_philox(float *x, const uint64_t *rows, int N, int n, int col0, uint64_t key,
                               float p)
{
    const float inv = 1.0f / (1.0f - p);
    const double cut = (double)p * 4294967296.0;
#pragma omp parallel for schedule(static) if ((size_t)N * (size_t)n > 65536)
    for (int i = 0; i < N; i++) {
        float *xr = x + (size_t)i * (size_t)n;
        uint32_t r[4];
        for (int j = 0; j < n; j++) {
            const uint64_t c = (uint64_t)col0 + (uint64_t)j;
            if (j == 0 || c % 4 == 0) /* a new group of four columns */
                rng_philox(r, rows[i], c / 4, key);
            xr[j] = (double)r[c % 4] < cut ? 0.0f : xr[j] * inv;
        }
    }
}

/* FLOPs of the GEMMs the table ran (tests compare the model's FLOP count
 * with the shapes actually multiplied): 2*N*C*OC per product. */
static double gemm_flops;

static void counted_matmul_forward(float *out, const float *inp, const float *weight,
                                   const float *bias, int N, int C, int OC)
{
    gemm_flops += 2.0 * N * C * OC;
    cpu_matmul_forward(out, inp, weight, bias, N, C, OC);
}

/* GRAD_SET (backend.h) on the CPU: g [n] zeroed, then the op adds into it,
 * which is the arithmetic of the caller's zeroing it did before: the same
 * bits.  (cpu_ops.inc's ops, and their f64 twins, only add.) */
static void grad_start(float *g, size_t n, GradMode mode)
{
    if (g && mode == GRAD_SET)
        memset(g, 0, n * sizeof *g);
}

static void counted_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, int N, int C, int OC,
                                    GradMode dinp_mode)
{
    gemm_flops += 2.0 * N * C * OC * ((dinp != NULL) + (dweight != NULL));
    grad_start(dinp, (size_t)N * (size_t)C, dinp_mode);
    cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

static void table_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                                GradMode mode)
{
    grad_start(dinp, n, mode);
    cpu_gelu_backward(dinp, inp, dout, n);
}

static void table_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                  const float *up, size_t n, GradMode mode)
{
    grad_start(dgate, n, mode);
    grad_start(dup, n, mode);
    cpu_swiglu_backward(dgate, dup, dout, gate, up, n);
}

/* ---- bf16 GEMMs (backend_cpu_bf16): the fp32 products of rounded copies ---- */

/* Workspace slot k of at least n floats: slots grow to the largest operand
 * they held and are kept, since a fresh large allocation every call costs
 * its page faults every call.  0, 1: a GEMM's two rounded operands; 2: a
 * bf16-stored GEMM input widened; 3: a bf16-stored output before its
 * rounding. */
enum { SLOT_ROUND0, SLOT_ROUND1, SLOT_WIDE, SLOT_NARROW, SLOTS };

static float *work_slot(int k, size_t n)
{
    static float *slot[SLOTS];
    static size_t cap[SLOTS];
    if (n > cap[k]) {
        free(slot[k]);
        slot[k] = trd_malloc(n * sizeof(float), "bf16 GEMM operand");
        cap[k] = n;
    }
    return slot[k];
}

/* x rounded to bf16 in workspace slot k (a GEMM reads two operands). */
static float *rounded(int k, const float *x, size_t n)
{
    float *r = work_slot(k, n);
#pragma omp parallel for schedule(dynamic, 1 << 14) if (n >= ((size_t)1 << 18))
    for (size_t i = 0; i < n; i++)
        r[i] = bf16_round(x[i]);
    return r;
}

static void bf16_matmul_forward(float *out, const float *inp, const float *weight,
                                const float *bias, int N, int C, int OC)
{
    counted_matmul_forward(out, rounded(0, inp, (size_t)N * C), rounded(1, weight, (size_t)OC * C),
                           bias, N, C, OC);
}

static void bf16_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 GradMode dinp_mode)
{
    if (dinp || dweight) {
        const float *d = rounded(0, dout, (size_t)N * OC);
        if (dinp)
            counted_matmul_backward(dinp, NULL, NULL, d, NULL, rounded(1, weight, (size_t)OC * C),
                                    N, C, OC, dinp_mode);
        if (dweight)
            counted_matmul_backward(NULL, dweight, NULL, d, rounded(1, inp, (size_t)N * C), NULL, N,
                                    C, OC, GRAD_ADD);
    }
    if (dbias) /* from the fp32 gradient: a sum, not a tensor-core product */
        counted_matmul_backward(NULL, NULL, dbias, dout, NULL, NULL, N, C, OC, GRAD_ADD);
}

/* ---- the linear layer fused with GELU (backend.h): the two ops it fuses,
 * in order, with the table's own matmul (fp32 or bf16), so the fused call
 * gives the same bits as the two calls ---- */

static void fused_gelu_forward(void (*mm)(float *, const float *, const float *, const float *, int,
                                          int, int),
                               float *out, float *pre, const float *inp, const float *weight,
                               const float *bias, int N, int C, int OC)
{
    mm(pre, inp, weight, bias, N, C, OC);
    cpu_gelu_forward(out, pre, (size_t)N * (size_t)OC);
}

static void fused_backward_dgelu(void (*mm)(float *, float *, float *, const float *, const float *,
                                            const float *, int, int, int, GradMode),
                                 float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *pre, const float *weight, int N,
                                 int C, int OC)
{
    /* SETS dinp: the product first, then times gelu' */
    mm(dinp, dweight, dbias, dout, inp, weight, N, C, OC, GRAD_SET);
    cpu_gelu_backward_inplace(dinp, pre, (size_t)N * (size_t)C);
}

static void cpu_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *weight,
                                    const float *bias, int N, int C, int OC)
{
    fused_gelu_forward(counted_matmul_forward, out, pre, inp, weight, bias, N, C, OC);
}

static void cpu_matmul_backward_dgelu(float *dinp, float *dweight, float *dbias, const float *dout,
                                      const float *inp, const float *pre, const float *weight,
                                      int N, int C, int OC)
{
    fused_backward_dgelu(counted_matmul_backward, dinp, dweight, dbias, dout, inp, pre, weight, N,
                         C, OC);
}

static void bf16_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *weight,
                                     const float *bias, int N, int C, int OC)
{
    fused_gelu_forward(bf16_matmul_forward, out, pre, inp, weight, bias, N, C, OC);
}

static void bf16_matmul_backward_dgelu(float *dinp, float *dweight, float *dbias, const float *dout,
                                       const float *inp, const float *pre, const float *weight,
                                       int N, int C, int OC)
{
    fused_backward_dgelu(bf16_matmul_backward, dinp, dweight, dbias, dout, inp, pre, weight, N, C,
                         OC);
}

/* ---- grouped linears (backend.h): the table's own matmul (fp32 or bf16)
 * on each group's rows, in group order ---- */

typedef void (*MatmulForward)(float *, const float *, const float *, const float *, int, int, int);
typedef void (*MatmulBackward)(float *, float *, float *, const float *, const float *,
                               const float *, int, int, int, GradMode);

static void grouped_forward(MatmulForward mm, float *out, const float *inp, const float *const *w,
                            const float *const *b, const int *off, int G, int C, int OC)
{
    for (int g = 0; g < G; g++) {
        const int n = off[g + 1] - off[g];
        if (n > 0)
            mm(out + (size_t)off[g] * OC, inp + (size_t)off[g] * C, w[g], b ? b[g] : NULL, n, C,
               OC);
    }
}

static void grouped_backward(MatmulBackward mm, float *dinp, float *const *dw, float *const *db,
                             const float *dout, const float *inp, const float *const *w,
                             const int *off, int G, int C, int OC)
{
    for (int g = 0; g < G; g++) {
        const int n = off[g + 1] - off[g];
        if (n > 0)
            mm(dinp ? dinp + (size_t)off[g] * C : NULL, dw ? dw[g] : NULL, db ? db[g] : NULL,
               dout + (size_t)off[g] * OC, inp + (size_t)off[g] * C, w[g], n, C, OC, GRAD_ADD);
    }
}

static void cpu_matmul_grouped_forward(float *out, const float *inp, const float *const *w,
                                       const float *const *b, const int *off, int G, int C, int OC)
{
    grouped_forward(counted_matmul_forward, out, inp, w, b, off, G, C, OC);
}

static void cpu_matmul_grouped_backward(float *dinp, float *const *dw, float *const *db,
                                        const float *dout, const float *inp, const float *const *w,
                                        const int *off, int G, int C, int OC)
{
    grouped_backward(counted_matmul_backward, dinp, dw, db, dout, inp, w, off, G, C, OC);
}

static void bf16_matmul_grouped_forward(float *out, const float *inp, const float *const *w,
                                        const float *const *b, const int *off, int G, int C, int OC)
{
    grouped_forward(bf16_matmul_forward, out, inp, w, b, off, G, C, OC);
}

static void bf16_matmul_grouped_backward(float *dinp, float *const *dw, float *const *db,
                                         const float *dout, const float *inp, const float *const *w,
                                         const int *off, int G, int C, int OC)
{
    grouped_backward(bf16_matmul_backward, dinp, dw, db, dout, inp, w, off, G, C, OC);
}

double backend_cpu_gemm_flops(void) { return gemm_flops; }
void backend_cpu_gemm_flops_reset(void) { gemm_flops = 0; }

/* ---- vocabulary-parallel cross-entropy and the replicated bias (backend.h) ---- */

/* The local column of a global id, or -1 when another rank holds it. */
static inline int local_col(int32_t id, int vocab_start, int V)
{
    const int c = (int)id - vocab_start;
    return id >= 0 && c >= 0 && c < V ? c : -1;
}

static void cpu_vocab_max(float *stats, const float *logits, int N, int V, int Vp)
{
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)N * Vp >= ((size_t)1 << 18))
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float m = -INFINITY;
        for (int v = 0; v < V; v++)
            m = x[v] > m ? x[v] : m;
        stats[n] = m;
    }
}

static void cpu_vocab_sumexp(float *stats, const float *logits, const int32_t *targets, int N,
                             int V, int Vp, int vocab_start)
{
    const float *mx = stats;
    float *sum = stats + N, *tgt = stats + 2 * (size_t)N;
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)N * Vp >= ((size_t)1 << 18))
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float s = 0;
        for (int v = 0; v < V; v++)
            s += expf(x[v] - mx[n]);
        sum[n] = s;
        const int c = local_col(targets[n], vocab_start, V);
        tgt[n] = c >= 0 ? x[c] : 0.0f;
    }
}

static void cpu_vocab_loss(float *losses, const float *stats, const int32_t *targets, int N)
{
    const float *mx = stats, *sum = stats + N, *tgt = stats + 2 * (size_t)N;
    for (int n = 0; n < N; n++)
        losses[n] = targets[n] < 0 ? 0.0f : logf(sum[n]) + mx[n] - tgt[n];
}

static void cpu_vocab_backward(float *logits, const float *stats, const int32_t *targets,
                               float dloss, int N, int V, int Vp, int vocab_start)
{
    const float *mx = stats, *sum = stats + N;
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)N * Vp >= ((size_t)1 << 18))
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * Vp;
        if (targets[n] < 0) { /* ignored row: no gradient */
            memset(x, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        const float k = dloss / sum[n];
        for (int v = 0; v < V; v++)
            x[v] = expf(x[v] - mx[n]) * k;
        const int c = local_col(targets[n], vocab_start, V);
        if (c >= 0)
            x[c] -= dloss;
        for (int v = V; v < Vp; v++)
            x[v] = 0; /* padded columns are not part of the model */
    }
}

/* The next token (backend.h, decode_choose): generate.c's next_token
 * without top-k or top-p, the same arithmetic in the same order. */
static void cpu_decode_choose(int32_t *state, const float *logits, int V, double temperature,
                              const double *u, int n)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    int next = best;
    if (temperature > 0) {
        const double mx = logits[best];
        double sum = 0;
        for (int v = 0; v < V; v++)
            sum += (float)exp((logits[v] - mx) / temperature);
        const double target = u[state[0] + n] * sum;
        double acc = 0;
        next = V - 1;
        for (int v = 0; v < V; v++) {
            acc += (float)exp((logits[v] - mx) / temperature);
            if (target < acc) {
                next = v;
                break;
            }
        }
    }
    state[1] = next;
    state[0] += n;
}

static void cpu_add_bias(float *y, const float *bias, int rows, int C)
{
#pragma omp parallel for schedule(static) if ((size_t)rows * C >= ((size_t)1 << 18))
    for (int r = 0; r < rows; r++) {
        float *row = y + (size_t)r * (size_t)C;
        for (int c = 0; c < C; c++)
            row[c] += bias[c];
    }
}

/* Memory of the CPU backend is host memory: the table's memory functions
 * are the C library's.  Its whole 2 MiB pages inside a buffer are asked to
 * be transparent huge pages (where the system leaves that to madvise, as
 * Debian does): a stream through the weights then goes on across 4 KiB
 * page boundaries, where the hardware prefetchers stop, and needs fewer
 * TLB entries.  bench/decode.sh, which reads every weight once a token,
 * measured 85 tokens/s without and 92 with on an idle machine (its
 * bandwidth probe, in the same memory, 59 and 63 GB/s).  It is a hint:
 * where it fails, the buffer keeps ordinary pages. */
static void *cpu_alloc(size_t bytes, const char *what)
{
    void *p = trd_calloc(bytes ? bytes : 1, 1, what);
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    const uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    const uintptr_t b = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
#endif
    return p;
}

static void cpu_release(void *p) { free(p); }
static void *cpu_host_alloc(size_t bytes, const char *what)
{
    return trd_malloc(bytes ? bytes : 1, what);
}
static void cpu_zero(void *p, size_t bytes)
{
    if (bytes)
        memset(p, 0, bytes);
}
/* The CPU's copies are done when they return. */
static void cpu_no_wait(void) {}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

/* The copy stream is the host's own order: copies happen at once, and
 * events mark nothing (one shared non-NULL handle). */
static char cpu_event;
static void *cpu_event_create(void) { return &cpu_event; }
static void cpu_event_destroy(void *e) { (void)e; }
static void cpu_wait_event(const void *e) { (void)e; }

static void cpu_to_host_async(void *host, const void *src, size_t bytes, const void *after)
{
    (void)after;
    cpu_copy(host, src, bytes);
}

static void cpu_to_backend_copy(void *dst, const void *host, size_t bytes, void *done)
{
    (void)done;
    cpu_copy(dst, host, bytes);
}

/* The reference of the one-pass ops: one call per range, in order. */
static double cpu_sumsq_ranges(const float *x, const BackendRange *ranges, int n)
{
    double total = 0;
    for (int k = 0; k < n; k++)
        total += cpu_sumsq(x + ranges[k].lo, ranges[k].hi - ranges[k].lo);
    return total;
}

static void cpu_adamw_ranges(float *param, float *master, const float *grad, float *m, float *v,
                             const BackendRange *ranges, int n, float lr, float beta1, float beta2,
                             float eps, float weight_decay, float grad_scale, int t, int round_bf16,
                             const BackendStepState *state)
{
    if (state && state->skip)
        return;
    if (state)
        grad_scale *= (float)state->grad_scale;
    for (int k = 0; k < n; k++) {
        const size_t lo = ranges[k].lo;
        cpu_adamw(param + lo, master + lo, grad + lo, m + lo, v + lo, ranges[k].hi - lo, lr, beta1,
                  beta2, eps, ranges[k].decay ? weight_decay : 0.0f, grad_scale, t, round_bf16);
    }
}

/* The reference: the two ops in turn, so the bits of the unfused pair. */
static void cpu_residual_norm_forward(float *res, float *out, float *mean, float *rstd,
                                      const float *a, const float *b, const float *weight,
                                      const float *bias, int N, int C, float eps, int rms)
{
    cpu_add(res, a, b, (size_t)N * (size_t)C);
    if (rms)
        cpu_rmsnorm_forward(out, rstd, res, weight, N, C, eps);
    else
        cpu_layernorm_forward(out, mean, rstd, res, weight, bias, N, C, eps);
}

static void cpu_crossentropy_fused(float *losses, float *logits, const int32_t *targets,
                                   float dloss, int N, int V, int Vp)
{
    cpu_crossentropy_forward(losses, logits, targets, N, V, Vp);
    cpu_crossentropy_backward(logits, targets, dloss, N, V, Vp);
}

/* The host arithmetic of model_head_forward and the trainer: the mean in
 * double over the counted rows in order, rounded to fp32, times the share
 * in fp32. */
static void cpu_loss_add(BackendStepState *s, const float *losses, const int32_t *targets, int N,
                         float share)
{
    double sum = 0;
    int counted = 0;
    for (int n = 0; n < N; n++)
        if (targets[n] >= 0) {
            sum += losses[n];
            counted++;
        }
    const float mean = counted ? (float)(sum / counted) : 0.0f;
    s->loss += share * mean;
}

static void cpu_grad_check(BackendStepState *s, const float *g, const BackendRange *ranges, int n,
                           float clip)
{
    s->sumsq = cpu_sumsq_ranges(g, ranges, n);
    const double norm = sqrt(s->sumsq);
    s->skip = !(isfinite(s->loss) && isfinite(norm));
    s->grad_scale = !s->skip && clip > 0 && norm > clip ? clip / (float)(norm + 1e-6) : 1.0f;
}

/* ---- mixture of experts (backend.h): per row, in order, so the same
 * input gives the same bits ---- */

static void cpu_moe_router_forward(float *probs, float *lse, int32_t *idx, float *w,
                                   const float *logits, int N, int E, int k)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * E;
        float *p = probs + (size_t)n * E;
        float mx = x[0];
        for (int e = 1; e < E; e++)
            mx = x[e] > mx ? x[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++)
            sum += exp((double)x[e] - mx);
        for (int e = 0; e < E; e++)
            p[e] = (float)(exp((double)x[e] - mx) / sum);
        lse[n] = (float)(mx + log(sum));
        /* Selection: the j-th pick is the largest probability not picked,
         * the lowest index among equals (strictly greater replaces). */
        int32_t *id = idx + (size_t)n * k;
        double chosen = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++)
                    taken |= id[i] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            id[j] = best;
            chosen += p[best];
        }
        for (int j = 0; j < k; j++)
            w[(size_t)n * k + j] = (float)(p[id[j]] / chosen);
    }
}

static void cpu_moe_router_backward(float *dlogits, const float *dw, const float *probs,
                                    const float *lse, const int32_t *idx, const float *w,
                                    const float *aux_dp, float z_scale, int N, int E, int k)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * E;
        float *dl = dlogits + (size_t)n * E;
        const int32_t *id = idx + (size_t)n * k;
        const float *wn = w + (size_t)n * k, *dwn = dw + (size_t)n * k;
        /* w_j = p_j / S, S = sum of the chosen p: dp_j = (dw_j - sum_i dw_i w_i) / S */
        double S = 0, dot = 0;
        for (int j = 0; j < k; j++) {
            S += p[id[j]];
            dot += (double)dwn[j] * wn[j];
        }
        for (int e = 0; e < E; e++)
            dl[e] = aux_dp ? aux_dp[e] : 0.0f; /* d probs first, in dl */
        for (int j = 0; j < k; j++)
            dl[id[j]] += (float)(((double)dwn[j] - dot) / S);
        /* softmax: dlogit_e = p_e (dp_e - sum p dp) */
        double pd = 0;
        for (int e = 0; e < E; e++)
            pd += (double)p[e] * dl[e];
        for (int e = 0; e < E; e++)
            dl[e] = (float)(p[e] * (dl[e] - pd) + (double)z_scale * lse[n] * p[e]);
    }
}

static void cpu_moe_gather(float *out, const float *inp, const int32_t *slot, int R, int C, int k)
{
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        memcpy(out + (size_t)r * C, inp + (size_t)(slot[r] / k) * C, (size_t)C * sizeof(float));
}

/* Rows may repeat (a token's k choices): sequential over r, parallel over c. */
static void cpu_moe_scatter_add(float *dinp, const float *dout, const int32_t *slot, int R, int C,
                                int k)
{
    for (int r = 0; r < R; r++) {
        float *d = dinp + (size_t)(slot[r] / k) * C;
        const float *g = dout + (size_t)r * C;
        for (int c = 0; c < C; c++)
            d[c] += g[c];
    }
}

static void cpu_moe_combine_forward(float *out, const float *y, const float *w, const int32_t *slot,
                                    int R, int C, int k)
{
    for (int r = 0; r < R; r++) {
        float *o = out + (size_t)(slot[r] / k) * C;
        const float *yr = y + (size_t)r * C, wr = w[slot[r]];
        for (int c = 0; c < C; c++)
            o[c] += wr * yr[c];
    }
}

static void cpu_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y,
                                     const float *w, const int32_t *slot, int R, int C, int k)
{
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const float *g = dout + (size_t)(slot[r] / k) * C, *yr = y + (size_t)r * C;
        float *d = dy + (size_t)r * C;
        const float wr = w[slot[r]];
        double dot = 0;
        for (int c = 0; c < C; c++) {
            d[c] = wr * g[c];
            dot += (double)g[c] * yr[c];
        }
        dw[slot[r]] = (float)dot; /* each slot appears once */
    }
}

/* ---- GEMM inputs stored in bf16 (backend.h): the bf16 ops on the widened
 * bits, and the fp32 ops' outputs narrowed to bf16 bits.  A widened input
 * is already a bf16 value, so the GEMM's rounding of it changes nothing:
 * the same bits as the fp32-stored path. ---- */

static const float *widened(const uint16_t *x, size_t n)
{
    float *w = work_slot(SLOT_WIDE, n);
    cpu_widen_bf16(w, x, n);
    return w;
}

static void narrow(uint16_t *dst, const float *src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_bits(src[i]);
}

/* attention_forward with AttnArgs.out16: the bf16 bits narrowed from out
 * after the call (the CUDA kernels store them as they store out: the same
 * bits).  Both tables, so that any attention call may ask for them. */
static void table_attention_forward(float *out, float *lse, const float *q, const float *kv,
                                    const AttnArgs *a)
{
    cpu_attention_forward(out, lse, q, kv, a);
    if (a->out16)
        narrow(a->out16, out, (size_t)a->B * a->Tq * a->H * a->hs);
}

static void bf16_matmul_forward_x16(float *out, const uint16_t *inp, const float *weight,
                                    const float *bias, int N, int C, int OC)
{
    bf16_matmul_forward(out, widened(inp, (size_t)N * C), weight, bias, N, C, OC);
}

static void bf16_matmul_backward_x16(float *dinp, float *dweight, float *dbias, const float *dout,
                                     const uint16_t *inp, const float *weight, int N, int C, int OC,
                                     GradMode dinp_mode)
{
    const float *x = dweight ? widened(inp, (size_t)N * C) : NULL;
    bf16_matmul_backward(dinp, dweight, dbias, dout, x, weight, N, C, OC, dinp_mode);
}

static void bf16_matmul_gelu_forward_x16(uint16_t *out, float *pre, const uint16_t *inp,
                                         const float *weight, const float *bias, int N, int C,
                                         int OC)
{
    const size_t n = (size_t)N * (size_t)OC;
    float *act = work_slot(SLOT_NARROW, n);
    bf16_matmul_gelu_forward(act, pre, widened(inp, (size_t)N * C), weight, bias, N, C, OC);
    narrow(out, act, n);
}

static void bf16_matmul_backward_dgelu_x16(float *dinp, float *dweight, float *dbias,
                                           const float *dout, const uint16_t *inp, const float *pre,
                                           const float *weight, int N, int C, int OC)
{
    const float *x = dweight ? widened(inp, (size_t)N * C) : NULL;
    bf16_matmul_backward_dgelu(dinp, dweight, dbias, dout, x, pre, weight, N, C, OC);
}

static void cpu_swiglu_forward_x16(uint16_t *out, const float *gate, const float *up, size_t n)
{
    float *act = work_slot(SLOT_NARROW, n);
    cpu_swiglu_forward(act, gate, up, n);
    narrow(out, act, n);
}

static void cpu_swiglu_backward_x16(uint16_t *dgate, uint16_t *dup, const float *dout,
                                    const float *gate, const float *up, size_t n)
{
    float *g = work_slot(SLOT_NARROW, n), *u = work_slot(SLOT_WIDE, n);
    table_swiglu_backward(g, u, dout, gate, up, n, GRAD_SET);
    narrow(dgate, g, n);
    narrow(dup, u, n);
}

static void cpu_norm_forward_x16(float *res, uint16_t *out, float *mean, float *rstd,
                                 const float *a, const float *b, const float *weight,
                                 const float *bias, int N, int C, float eps, int rms)
{
    const size_t n = (size_t)N * (size_t)C;
    float *y = work_slot(SLOT_NARROW, n);
    if (b)
        cpu_residual_norm_forward(res, y, mean, rstd, a, b, weight, bias, N, C, eps, rms);
    else if (rms)
        cpu_rmsnorm_forward(y, rstd, a, weight, N, C, eps);
    else
        cpu_layernorm_forward(y, mean, rstd, a, weight, bias, N, C, eps);
    narrow(out, y, n);
}

/* The head in bf16 (backend.h): the fp32 ops on the widened logits, their
 * outputs narrowed.  A widened dlogits is already a bf16 value, so the
 * backward GEMM's rounding of it changes nothing. */
static void bf16_head_forward_x16(uint16_t *logits, const uint16_t *inp, const float *weight, int N,
                                  int C, int OC)
{
    const size_t n = (size_t)N * (size_t)OC;
    float *y = work_slot(SLOT_NARROW, n);
    bf16_matmul_forward(y, widened(inp, (size_t)N * C), weight, NULL, N, C, OC);
    narrow(logits, y, n);
}

static void cpu_crossentropy_x16(float *losses, uint16_t *logits, const int32_t *targets, int grad,
                                 float dloss, int N, int V, int Vp)
{
    const size_t n = (size_t)N * (size_t)Vp;
    float *x = work_slot(SLOT_NARROW, n);
    cpu_widen_bf16(x, logits, n);
    if (losses)
        cpu_crossentropy_forward(losses, x, targets, N, V, Vp);
    if (grad) {
        cpu_crossentropy_backward(x, targets, dloss, N, V, Vp);
        narrow(logits, x, n);
    }
}

static void bf16_matmul_backward_d16(float *dinp, float *dweight, const uint16_t *dout,
                                     const uint16_t *inp, const float *weight, int N, int C, int OC,
                                     GradMode dinp_mode)
{
    const size_t n = (size_t)N * (size_t)OC;
    float *d = work_slot(SLOT_NARROW, n);
    cpu_widen_bf16(d, dout, n);
    bf16_matmul_backward_x16(dinp, dweight, NULL, d, inp, weight, N, C, OC, dinp_mode);
}

static const Backend cpu_backend = {
    .name = "cpu",
    .device = 0,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .to_backend = cpu_copy,
    .to_host = cpu_copy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .to_host_async = cpu_to_host_async,
    .to_backend_copy = cpu_to_backend_copy,
    .wait_event = cpu_wait_event,
    .host_copies_wait = cpu_no_wait,
    .host_alloc = cpu_host_alloc,
    .host_release = cpu_release,
    .matmul_forward = counted_matmul_forward,
    .matmul_backward = counted_matmul_backward,
    .matmul_gelu_forward = cpu_matmul_gelu_forward,
    .matmul_backward_dgelu = cpu_matmul_backward_dgelu,
    .matmul_grouped_forward = cpu_matmul_grouped_forward,
    .matmul_grouped_backward = cpu_matmul_grouped_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .residual_norm_forward = cpu_residual_norm_forward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = table_gelu_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = table_swiglu_backward,
    .moe_router_forward = cpu_moe_router_forward,
    .moe_router_backward = cpu_moe_router_backward,
    .moe_gather = cpu_moe_gather,
    .moe_scatter_add = cpu_moe_scatter_add,
    .moe_combine_forward = cpu_moe_combine_forward,
    .moe_combine_backward = cpu_moe_combine_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = table_attention_forward,
    .attention_backward = cpu_attention_backward,
    .rope_decode = cpu_rope_decode,
    .attention_decode = cpu_attention_decode,
    .decode_choose = cpu_decode_choose,
    .crossentropy_forward = cpu_crossentropy_forward,
    .crossentropy_backward = cpu_crossentropy_backward,
    .crossentropy_fused = cpu_crossentropy_fused,
    .loss_add = cpu_loss_add,
    .vocab_max = cpu_vocab_max,
    .vocab_sumexp = cpu_vocab_sumexp,
    .vocab_loss = cpu_vocab_loss,
    .vocab_backward = cpu_vocab_backward,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .sumsq = cpu_sumsq,
    .sumsq_ranges = cpu_sumsq_ranges,
    .grad_check = cpu_grad_check,
    .scale = cpu_scale,
    .widen_bf16 = cpu_widen_bf16,
    .dropout_philox = cpu_dropout_philox,
    .adamw = cpu_adamw,
    .adamw_ranges = cpu_adamw_ranges,
};

const Backend *backend_cpu(void) { return &cpu_backend; }

const Backend *backend_cpu_bf16(void)
{
    static Backend t;
    if (!t.name) {
        t = cpu_backend;
        t.matmul_forward = bf16_matmul_forward;
        t.matmul_backward = bf16_matmul_backward;
        t.matmul_gelu_forward = bf16_matmul_gelu_forward;
        t.matmul_backward_dgelu = bf16_matmul_backward_dgelu;
        t.matmul_grouped_forward = bf16_matmul_grouped_forward;
        t.matmul_grouped_backward = bf16_matmul_grouped_backward;
        t.matmul_forward_x16 = bf16_matmul_forward_x16;
        t.matmul_backward_x16 = bf16_matmul_backward_x16;
        t.matmul_gelu_forward_x16 = bf16_matmul_gelu_forward_x16;
        t.matmul_backward_dgelu_x16 = bf16_matmul_backward_dgelu_x16;
        t.swiglu_forward_x16 = cpu_swiglu_forward_x16;
        t.swiglu_backward_x16 = cpu_swiglu_backward_x16;
        t.norm_forward_x16 = cpu_norm_forward_x16;
        t.head_forward_x16 = bf16_head_forward_x16;
        t.crossentropy_x16 = cpu_crossentropy_x16;
        t.matmul_backward_d16 = bf16_matmul_backward_d16;
    }
    return &t;
}
