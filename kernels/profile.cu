/* profile.cu — TRIDENT_PROFILE=1: the device time of every Backend op,
 * measured with a pair of CUDA events around each call on the ops'
 * stream, summed per op name over the steps after the first (which
 * allocates), with the op's nominal bytes and FLOPs (what it must read,
 * write and multiply at the least; 0 where not stated) for GB/s and
 * TFLOP/s.  At the end of the run rank 0 prints a table and writes
 * run.dir/profile.tsv (docs/cuda.md, "Profile").  Without TRIDENT_PROFILE
 * nothing here runs: the trainer takes the plain table.
 *
 * Ops nest (an op's own memset or copy is not seen: only table calls are
 * wrapped), and the events of one step are read once, at its end: one
 * extra host synchronization per step while profiling.
 *
 * Parts: inside an op, the kernels marked PROFILE_PART (ops.cuh: a GEMM's
 * bf16 conversions and its cuBLAS call, the tensor-core attention's
 * kernels, cuDNN's execution and conversions) get a pair of events of their own, and a
 * row "op/part" under their op's; the parts are inside the op's time, so
 * they are left out of what the ops cover (the GPU idle row). */
#include "ops.cuh"

#include <stdio.h>
#include <string.h>

enum { PROF_PAIRS = 8192, PROF_OPS = 64 };

typedef struct {
    const char *name;
    double calls, ms, bytes, flops;
    int parent; /* a part's op (index into ops), -1 for an op */
} ProfOp;

static struct {
    const Backend *base;
    cudaEvent_t ev[2 * PROF_PAIRS];
    int op[PROF_PAIRS];
    double bytes[PROF_PAIRS], flops[PROF_PAIRS];
    int pairs, dropped; /* this step's; pairs beyond PROF_PAIRS dropped */
    ProfOp ops[PROF_OPS];
    int nops, steps;
    double wall_ms;
    const char *current; /* the op being called, for its parts' rows */
} prof;

/* The row of op `name` (parent -1), or of part `name` of op `parent`. */
static int prof_op_index(const char *name, int parent)
{
    for (int i = 0; i < prof.nops; i++)
        if (prof.ops[i].parent == parent &&
            (prof.ops[i].name == name || strcmp(prof.ops[i].name, name) == 0))
            return i;
    if (prof.nops == PROF_OPS)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "TRIDENT_PROFILE: more than %d op names", PROF_OPS);
    prof.ops[prof.nops].name = name;
    prof.ops[prof.nops].parent = parent;
    return prof.nops++;
}

/* the pair of this call, or -1 when the step's pairs are used up */
static int prof_begin(void)
{
    if (prof.pairs == PROF_PAIRS) {
        prof.dropped++;
        return -1;
    }
    int k = prof.pairs++;
    if (!prof.ev[2 * k]) {
        CUDA_CHECK(cudaEventCreate(&prof.ev[2 * k]));
        CUDA_CHECK(cudaEventCreate(&prof.ev[2 * k + 1]));
    }
    CUDA_CHECK(cudaEventRecord(prof.ev[2 * k], cuda_stream()));
    return k;
}

static void prof_end_row(int k, int row, double bytes, double flops)
{
    if (k < 0)
        return;
    CUDA_CHECK(cudaEventRecord(prof.ev[2 * k + 1], cuda_stream()));
    prof.op[k] = row;
    prof.bytes[k] = bytes;
    prof.flops[k] = flops;
}

static void prof_end(int k, const char *name, double bytes, double flops)
{
    prof_end_row(k, prof_op_index(name, -1), bytes, flops);
}

int cuda_profile_part_begin(void) { return prof.base && prof.current ? prof_begin() : -1; }

void cuda_profile_part_end(int k, const char *part, double bytes, double flops)
{
    if (k >= 0)
        prof_end_row(k, prof_op_index(part, prof_op_index(prof.current, -1)), bytes, flops);
}

/* step ends: read its events (one wait), add them unless it is step 1 */
void cuda_profile_step(int step, double wall_ms)
{
    if (!prof.base)
        return;
    if (prof.pairs)
        CUDA_CHECK(cudaEventSynchronize(prof.ev[2 * prof.pairs - 1]));
    if (step > 1) {
        for (int k = 0; k < prof.pairs; k++) {
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, prof.ev[2 * k], prof.ev[2 * k + 1]));
            ProfOp *o = &prof.ops[prof.op[k]];
            o->calls += 1;
            o->ms += ms;
            o->bytes += prof.bytes[k];
            o->flops += prof.flops[k];
        }
        prof.steps++;
        prof.wall_ms += wall_ms;
    }
    prof.pairs = 0;
}

/* ---- the wrapped table: each op timed, with its nominal bytes / FLOPs ---- */

#define F4 4.0 /* bytes of an fp32 element */
#define TIMED(name, bytes, flops, call)                                                            \
    do {                                                                                           \
        int k_ = prof_begin();                                                                     \
        prof.current = name;                                                                       \
        prof.base->call;                                                                           \
        prof.current = NULL;                                                                       \
        prof_end(k_, name, bytes, flops);                                                          \
    } while (0)

static void p_zero(void *p, size_t b) { TIMED("zero", (double)b, 0, zero(p, b)); }
static void p_copy(void *d, const void *s, size_t b)
{
    TIMED("copy", 2.0 * (double)b, 0, copy(d, s, b));
}
static void p_to_backend(void *d, const void *h, size_t b)
{
    TIMED("to_backend", (double)b, 0, to_backend(d, h, b));
}
static void p_to_host(void *h, const void *d, size_t b)
{
    TIMED("to_host", (double)b, 0, to_host(h, d, b));
}

static void p_matmul_forward(float *out, const float *inp, const float *w, const float *b, int N,
                             int C, int OC)
{
    double n = N, c = C, oc = OC;
    TIMED("matmul_forward", F4 * (n * c + oc * c + n * oc + (b ? oc : 0)), 2 * n * c * oc,
          matmul_forward(out, inp, w, b, N, C, OC));
}

/* Times dinp [n, c] goes through memory: read and written when added to,
 * written only when SET. */
static double dinp_passes(GradMode mode) { return mode == GRAD_SET ? 1.0 : 2.0; }

static void p_matmul_backward(float *dinp, float *dw, float *db, const float *dout,
                              const float *inp, const float *w, int N, int C, int OC, GradMode dm)
{
    double n = N, c = C, oc = OC;
    double bytes = F4 * n * oc + (dinp ? F4 * (oc * c + dinp_passes(dm) * n * c) : 0) +
                   (dw ? F4 * (n * c + 2 * oc * c) : 0) + (db ? F4 * 2 * oc : 0);
    double flops = (dinp ? 2 * n * c * oc : 0) + (dw ? 2 * n * c * oc : 0);
    TIMED("matmul_backward", bytes, flops,
          matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, dm));
}

/* the grouped linears: n rows in all, `used` groups with rows (a weight each) */
static double groups_used(const int *off, int G)
{
    double used = 0;
    for (int g = 0; g < G; g++)
        used += off[g + 1] > off[g];
    return used;
}

static void p_matmul_grouped_forward(float *out, const float *inp, const float *const *w,
                                     const float *const *b, const int *off, int G, int C, int OC)
{
    double n = off[G], c = C, oc = OC, used = groups_used(off, G);
    TIMED("matmul_grouped_forward", F4 * (n * c + used * oc * c + n * oc + (b ? used * oc : 0)),
          2 * n * c * oc, matmul_grouped_forward(out, inp, w, b, off, G, C, OC));
}

static void p_matmul_grouped_backward(float *dinp, float *const *dw, float *const *db,
                                      const float *dout, const float *inp, const float *const *w,
                                      const int *off, int G, int C, int OC)
{
    double n = off[G], c = C, oc = OC, used = groups_used(off, G);
    double bytes = F4 * n * oc + (dinp ? F4 * (used * oc * c + 2 * n * c) : 0) +
                   (dw ? F4 * (n * c + 2 * used * oc * c) : 0) + (db ? F4 * 2 * used * oc : 0);
    double flops = (dinp ? 2 * n * c * oc : 0) + (dw ? 2 * n * c * oc : 0);
    TIMED("matmul_grouped_backward", bytes, flops,
          matmul_grouped_backward(dinp, dw, db, dout, inp, w, off, G, C, OC));
}

static void p_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w,
                                  const float *b, int N, int C, int OC)
{
    double n = N, c = C, oc = OC;
    TIMED("matmul_gelu_forward", F4 * (n * c + oc * c + 2 * n * oc + oc), 2 * n * c * oc,
          matmul_gelu_forward(out, pre, inp, w, b, N, C, OC));
}

static void p_matmul_backward_dgelu(float *dinp, float *dw, float *db, const float *dout,
                                    const float *inp, const float *pre, const float *w, int N,
                                    int C, int OC)
{
    double n = N, c = C, oc = OC;
    /* dinp: reads dout, w and pre, writes dinp; dw, db as matmul_backward */
    double bytes = F4 * n * oc + F4 * (oc * c + 2 * n * c) + (dw ? F4 * (n * c + 2 * oc * c) : 0) +
                   (db ? F4 * 2 * oc : 0);
    double flops = 2 * n * c * oc * (1 + (dw != NULL));
    TIMED("matmul_backward_dgelu", bytes, flops,
          matmul_backward_dgelu(dinp, dw, db, dout, inp, pre, w, N, C, OC));
}

/* ---- the *_x16 ops: the activation operand (and GELU's output) 2 bytes ---- */
#define F2 2.0 /* bytes of a bf16 element */

static void p_matmul_forward_x16(float *out, const uint16_t *inp, const float *w, const float *b,
                                 int N, int C, int OC)
{
    double n = N, c = C, oc = OC;
    TIMED("matmul_forward_x16", F2 * n * c + F4 * (oc * c + n * oc + (b ? oc : 0)), 2 * n * c * oc,
          matmul_forward_x16(out, inp, w, b, N, C, OC));
}

static void p_matmul_backward_x16(float *dinp, float *dw, float *db, const float *dout,
                                  const uint16_t *inp, const float *w, int N, int C, int OC,
                                  GradMode dm)
{
    double n = N, c = C, oc = OC;
    double bytes = F4 * n * oc + (dinp ? F4 * (oc * c + dinp_passes(dm) * n * c) : 0) +
                   (dw ? F2 * n * c + F4 * 2 * oc * c : 0) + (db ? F4 * 2 * oc : 0);
    double flops = (dinp ? 2 * n * c * oc : 0) + (dw ? 2 * n * c * oc : 0);
    TIMED("matmul_backward_x16", bytes, flops,
          matmul_backward_x16(dinp, dw, db, dout, inp, w, N, C, OC, dm));
}

static void p_matmul_gelu_forward_x16(uint16_t *out, float *pre, const uint16_t *inp,
                                      const float *w, const float *b, int N, int C, int OC)
{
    double n = N, c = C, oc = OC;
    TIMED("matmul_gelu_forward_x16", F2 * n * c + F4 * (oc * c + n * oc + oc) + F2 * n * oc,
          2 * n * c * oc, matmul_gelu_forward_x16(out, pre, inp, w, b, N, C, OC));
}

static void p_matmul_backward_dgelu_x16(float *dinp, float *dw, float *db, const float *dout,
                                        const uint16_t *inp, const float *pre, const float *w,
                                        int N, int C, int OC)
{
    double n = N, c = C, oc = OC;
    double bytes = F4 * n * oc + F4 * (oc * c + 2 * n * c) +
                   (dw ? F2 * n * c + F4 * 2 * oc * c : 0) + (db ? F4 * 2 * oc : 0);
    double flops = 2 * n * c * oc * (1 + (dw != NULL));
    TIMED("matmul_backward_dgelu_x16", bytes, flops,
          matmul_backward_dgelu_x16(dinp, dw, db, dout, inp, pre, w, N, C, OC));
}

static void p_swiglu_forward_x16(uint16_t *out, const float *gate, const float *up, size_t n)
{
    TIMED("swiglu_forward_x16", (2 * F4 + F2) * n, 0, swiglu_forward_x16(out, gate, up, n));
}

static void p_swiglu_backward_x16(uint16_t *dgate, uint16_t *dup, const float *dout,
                                  const float *gate, const float *up, size_t n)
{
    TIMED("swiglu_backward_x16", (3 * F4 + 2 * F2) * n, 0,
          swiglu_backward_x16(dgate, dup, dout, gate, up, n));
}

static void p_norm_forward_x16(float *res, uint16_t *out, float *mean, float *rstd, const float *a,
                               const float *b, const float *w, const float *bias, int N, int C,
                               float eps, int rms)
{
    /* reads a (and b, writing res), writes out in bf16 */
    TIMED("norm_forward_x16", (F4 * (b ? 3.0 : 1.0) + F2) * N * C, 0,
          norm_forward_x16(res, out, mean, rstd, a, b, w, bias, N, C, eps, rms));
}

/* the head in bf16: logits written in 2 bytes; the cross-entropy reads the
 * row once for its max and sum and once more, writing dlogits (grad) */
static void p_head_forward_x16(uint16_t *logits, const uint16_t *inp, const float *w, int N, int C,
                               int OC)
{
    double n = N, c = C, oc = OC;
    TIMED("head_forward_x16", F2 * (n * c + n * oc) + F4 * oc * c, 2 * n * c * oc,
          head_forward_x16(logits, inp, w, N, C, OC));
}

static void p_crossentropy_x16(float *losses, uint16_t *logits, const int32_t *t, int grad,
                               float dloss, int N, int V, int Vp)
{
    TIMED("crossentropy_x16", F2 * (grad ? 3.0 : 1.0) * N * Vp, 0,
          crossentropy_x16(losses, logits, t, grad, dloss, N, V, Vp));
}

static void p_matmul_backward_d16(float *dinp, float *dw, const uint16_t *dout, const uint16_t *inp,
                                  const float *w, int N, int C, int OC, GradMode dm)
{
    double n = N, c = C, oc = OC;
    double bytes = F2 * n * oc + (dinp ? F4 * (oc * c + dinp_passes(dm) * n * c) : 0) +
                   (dw ? F2 * n * c + F4 * 2 * oc * c : 0);
    double flops = (dinp ? 2 * n * c * oc : 0) + (dw ? 2 * n * c * oc : 0);
    TIMED("matmul_backward_d16", bytes, flops,
          matmul_backward_d16(dinp, dw, dout, inp, w, N, C, OC, dm));
}

static void p_embedding_forward(float *out, const int32_t *tok, const int32_t *pos,
                                const float *wte, const float *wpe, int N, int T, int C, int vs,
                                int V)
{
    TIMED("embedding_forward", F4 * (double)N * C * (wpe ? 3 : 2), 0,
          embedding_forward(out, tok, pos, wte, wpe, N, T, C, vs, V));
}

static void p_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                                 const int32_t *pos, int N, int T, int C, int vs, int V)
{
    TIMED("embedding_backward", F4 * (double)N * C * 3, 0,
          embedding_backward(dwte, dwpe, dout, tok, pos, N, T, C, vs, V));
}

static void p_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *w, const float *b, int N, int C, float eps)
{
    TIMED("layernorm_forward", F4 * 2.0 * N * C, 0,
          layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps));
}

static void p_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                 const float *inp, const float *w, const float *mean,
                                 const float *rstd, int N, int C)
{
    TIMED("layernorm_backward", F4 * 4.0 * N * C, 0,
          layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C));
}

static void p_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N,
                              int C, float eps)
{
    TIMED("rmsnorm_forward", F4 * 2.0 * N * C, 0, rmsnorm_forward(out, rstd, inp, w, N, C, eps));
}

static void p_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                               const float *w, const float *rstd, int N, int C)
{
    TIMED("rmsnorm_backward", F4 * 4.0 * N * C, 0,
          rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C));
}

static void p_gelu_forward(float *out, const float *inp, size_t n)
{
    TIMED("gelu_forward", F4 * 2.0 * n, 0, gelu_forward(out, inp, n));
}

static void p_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                            GradMode mode)
{
    TIMED("gelu_backward", F4 * (2.0 + dinp_passes(mode)) * n, 0,
          gelu_backward(dinp, inp, dout, n, mode));
}

static void p_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    TIMED("swiglu_forward", F4 * 3.0 * n, 0, swiglu_forward(out, gate, up, n));
}

static void p_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, size_t n, GradMode mode)
{
    TIMED("swiglu_backward", F4 * (3.0 + 2 * dinp_passes(mode)) * n, 0,
          swiglu_backward(dgate, dup, dout, gate, up, n, mode));
}

static void p_rope_forward(float *qkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                           int hs, RopeFreq rf)
{
    TIMED("rope_forward", F4 * 2.0 * N * (H + KVH) * hs, 0,
          rope_forward(qkv, pos, N, T, pos0, H, KVH, hs, rf));
}

static void p_rope_backward(float *dqkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                            int hs, RopeFreq rf)
{
    TIMED("rope_backward", F4 * 2.0 * N * (H + KVH) * hs, 0,
          rope_backward(dqkv, pos, N, T, pos0, H, KVH, hs, rf));
}

/* causal attention of whole sequences: about half of the T x T scores; 2
 * products forward, 5 backward (as the study counts).  A block pair or
 * packed documents do less; the nominal count is the whole causal one. */
static double attn_flops(const AttnArgs *a, int products)
{
    return 2.0 * products * a->B * a->H * ((double)a->Tq * (a->Tq + 1) / 2) * a->hs;
}

static void p_attention_forward(float *out, float *lse, const float *q, const float *kv,
                                const AttnArgs *a)
{
    double N = (double)a->B * a->Tq;
    TIMED("attention_forward", F4 * N * ((a->H + 2 * a->KVH) * a->hs + a->H * a->hs + a->H),
          attn_flops(a, 2), attention_forward(out, lse, q, kv, a));
}

static void p_attention_backward(float *dq, float *dkv, const float *dout, const float *q,
                                 const float *kv, const float *out, const float *lse,
                                 const AttnArgs *a)
{
    double N = (double)a->B * a->Tq;
    TIMED(
        "attention_backward",
        F4 * N *
            ((a->grad == GRAD_SET ? 2 : 3) * (a->H + 2 * a->KVH) * a->hs + 2 * a->H * a->hs + a->H),
        attn_flops(a, 5), attention_backward(dq, dkv, dout, q, kv, out, lse, a));
}

/* a and b read, res and out written (the norm's re-reads of res hit the
 * cache), its weight and bias */
static void p_residual_norm_forward(float *res, float *out, float *mean, float *rstd,
                                    const float *a, const float *b, const float *w,
                                    const float *bias, int N, int C, float eps, int rms)
{
    TIMED("residual_norm_forward", F4 * 4.0 * N * C, 0,
          residual_norm_forward(res, out, mean, rstd, a, b, w, bias, N, C, eps, rms));
}

static void p_crossentropy_forward(float *losses, const float *logits, const int32_t *t, int N,
                                   int V, int Vp)
{
    TIMED("crossentropy_forward", F4 * (double)N * Vp, 0,
          crossentropy_forward(losses, logits, t, N, V, Vp));
}

/* one read for the max and sum, one read and one write for dlogits */
static void p_crossentropy_fused(float *losses, float *logits, const int32_t *t, float dloss, int N,
                                 int V, int Vp)
{
    TIMED("crossentropy_fused", F4 * 3.0 * N * Vp, 0,
          crossentropy_fused(losses, logits, t, dloss, N, V, Vp));
}

static void p_crossentropy_backward(float *logits, const int32_t *t, float dloss, int N, int V,
                                    int Vp)
{
    TIMED("crossentropy_backward", F4 * 2.0 * N * Vp, 0,
          crossentropy_backward(logits, t, dloss, N, V, Vp));
}

static void p_vocab_max(float *stats, const float *logits, int N, int V, int Vp)
{
    TIMED("vocab_max", F4 * (double)N * Vp, 0, vocab_max(stats, logits, N, V, Vp));
}

static void p_vocab_sumexp(float *stats, const float *logits, const int32_t *t, int N, int V,
                           int Vp, int vs)
{
    TIMED("vocab_sumexp", F4 * (double)N * Vp, 0, vocab_sumexp(stats, logits, t, N, V, Vp, vs));
}

static void p_vocab_loss(float *losses, const float *stats, const int32_t *t, int N)
{
    TIMED("vocab_loss", F4 * 4.0 * N, 0, vocab_loss(losses, stats, t, N));
}

static void p_vocab_backward(float *logits, const float *stats, const int32_t *t, float dloss,
                             int N, int V, int Vp, int vs)
{
    TIMED("vocab_backward", F4 * 2.0 * N * Vp, 0,
          vocab_backward(logits, stats, t, dloss, N, V, Vp, vs));
}

static void p_add_bias(float *y, const float *bias, int rows, int C)
{
    TIMED("add_bias", F4 * 2.0 * rows * C, 0, add_bias(y, bias, rows, C));
}

static void p_add(float *out, const float *a, const float *b, size_t n)
{
    TIMED("add", F4 * 3.0 * n, 0, add(out, a, b, n));
}

static void p_accumulate(float *y, const float *x, size_t n)
{
    TIMED("accumulate", F4 * 3.0 * n, 0, accumulate(y, x, n));
}

static double p_sumsq_ranges(const float *x, const BackendRange *r, int n)
{
    double elems = 0;
    for (int k = 0; k < n; k++)
        elems += (double)(r[k].hi - r[k].lo);
    int k = prof_begin();
    double s = prof.base->sumsq_ranges(x, r, n);
    prof_end(k, "sumsq_ranges", F4 * elems, 0);
    return s;
}

static void p_grad_check(BackendStepState *st, const float *g, const BackendRange *r, int n,
                         float clip)
{
    double elems = 0;
    for (int k = 0; k < n; k++)
        elems += (double)(r[k].hi - r[k].lo);
    TIMED("grad_check", F4 * elems, 0, grad_check(st, g, r, n, clip));
}

static void p_loss_add(BackendStepState *st, const float *losses, const int32_t *targets, int N,
                       float share)
{
    TIMED("loss_add", F4 * 2.0 * N, 0, loss_add(st, losses, targets, N, share));
}

static void p_scale(float *x, float s, size_t n)
{
    TIMED("scale", F4 * 2.0 * n, 0, scale(x, s, n));
}

/* the step's bf16 weight copy: read 4 bytes, write 2 */
static void p_weights_bf16(const float *params, size_t n)
{
    TIMED("weights_bf16", 6.0 * n, 0, weights_bf16(params, n));
}

static void p_adamw_ranges(float *param, float *master, const float *grad, float *m, float *v,
                           const BackendRange *r, int n, float lr, float b1, float b2, float eps,
                           float wd, float gs, int t, int bf16, const BackendStepState *st)
{
    double elems = 0;
    for (int k = 0; k < n; k++)
        elems += (double)(r[k].hi - r[k].lo);
    /* read grad, m, v, master; write m, v, master, param */
    TIMED("adamw", F4 * 8.0 * elems, 0,
          adamw_ranges(param, master, grad, m, v, r, n, lr, b1, b2, eps, wd, gs, t, bf16, st));
}

extern "C" const Backend *backend_cuda_profiled(const Backend *base)
{
    static Backend t;
    prof.base = base;
    t = *base;
    /* Ops timed one by one: no CUDA graphs (events recorded while a graph
     * is captured would time nothing; the decoder then runs op by op). */
    t.graph_begin = NULL;
    t.graph_end = NULL;
    t.graph_launch = NULL;
    t.graph_free = NULL;
    t.zero = p_zero;
    t.copy = p_copy;
    t.to_backend = p_to_backend;
    t.to_host = p_to_host;
    t.matmul_forward = p_matmul_forward;
    t.matmul_backward = p_matmul_backward;
    t.matmul_grouped_forward = p_matmul_grouped_forward;
    t.matmul_grouped_backward = p_matmul_grouped_backward;
    if (base->matmul_gelu_forward) /* optional ops stay NULL where the base has none */
        t.matmul_gelu_forward = p_matmul_gelu_forward;
    if (base->matmul_backward_dgelu)
        t.matmul_backward_dgelu = p_matmul_backward_dgelu;
    if (base->matmul_forward_x16) { /* all six or none (model_x16_ok needs all) */
        t.matmul_forward_x16 = p_matmul_forward_x16;
        t.matmul_backward_x16 = p_matmul_backward_x16;
        t.matmul_gelu_forward_x16 = p_matmul_gelu_forward_x16;
        t.matmul_backward_dgelu_x16 = p_matmul_backward_dgelu_x16;
        t.swiglu_forward_x16 = p_swiglu_forward_x16;
        if (base->swiglu_backward_x16)
            t.swiglu_backward_x16 = p_swiglu_backward_x16;
        t.norm_forward_x16 = p_norm_forward_x16;
    }
    if (base->head_forward_x16) { /* the three or none (model_x16_logits_ok) */
        t.head_forward_x16 = p_head_forward_x16;
        t.crossentropy_x16 = p_crossentropy_x16;
        t.matmul_backward_d16 = p_matmul_backward_d16;
    }
    t.embedding_forward = p_embedding_forward;
    t.embedding_backward = p_embedding_backward;
    t.layernorm_forward = p_layernorm_forward;
    t.layernorm_backward = p_layernorm_backward;
    t.rmsnorm_forward = p_rmsnorm_forward;
    t.rmsnorm_backward = p_rmsnorm_backward;
    t.gelu_forward = p_gelu_forward;
    t.gelu_backward = p_gelu_backward;
    t.swiglu_forward = p_swiglu_forward;
    t.swiglu_backward = p_swiglu_backward;
    t.rope_forward = p_rope_forward;
    t.rope_backward = p_rope_backward;
    t.attention_forward = p_attention_forward;
    t.attention_backward = p_attention_backward;
    t.crossentropy_forward = p_crossentropy_forward;
    t.crossentropy_backward = p_crossentropy_backward;
    t.crossentropy_fused = p_crossentropy_fused;
    t.residual_norm_forward = p_residual_norm_forward;
    t.loss_add = p_loss_add;
    t.vocab_max = p_vocab_max;
    t.vocab_sumexp = p_vocab_sumexp;
    t.vocab_loss = p_vocab_loss;
    t.vocab_backward = p_vocab_backward;
    t.add_bias = p_add_bias;
    t.add = p_add;
    t.accumulate = p_accumulate;
    t.sumsq_ranges = p_sumsq_ranges;
    t.grad_check = p_grad_check;
    t.scale = p_scale;
    t.adamw_ranges = p_adamw_ranges;
    if (base->weights_bf16) /* the drop enqueues nothing: not timed */
        t.weights_bf16 = p_weights_bf16;
    return &t;
}

/* One row of the table or the TSV: an op, or a part ("op/part" in the TSV,
 * indented under its op in the table). */
static void prof_row(FILE *f, int tsv, const ProfOp *o, double steps, double wall)
{
    const double ms = o->ms / steps, s = o->ms * 1e-3;
    const double gbs = s > 0 ? o->bytes / s * 1e-9 : 0, tfs = s > 0 ? o->flops / s * 1e-12 : 0;
    char name[128];
    if (o->parent < 0)
        snprintf(name, sizeof name, "%s", o->name);
    else
        snprintf(name, sizeof name, tsv ? "%s/%s" : "  + %s",
                 tsv ? prof.ops[o->parent].name : o->name, o->name);
    fprintf(f,
            tsv ? "%s\t%g\t%.4f\t%.2f\t%.1f\t%.3f\t%.2f\n"
                : "%-22s %10g %10.4f %9.2f %9.1f %9.3f %10.2f\n",
            name, o->calls / steps, ms, wall > 0 ? 100 * ms / wall : 0, gbs, tfs,
            o->calls > 0 ? 1e3 * o->ms / o->calls : 0);
}

/* One row per op, costliest first, each followed by its parts (costliest
 * first), then the step's wall time and what of it no op covered (host
 * work, waits, launch gaps: "GPU idle"). */
static void prof_write(FILE *f, int tsv)
{
    const double steps = prof.steps, wall = prof.wall_ms / steps;
    int order[PROF_OPS];
    for (int i = 0; i < prof.nops; i++)
        order[i] = i;
    for (int i = 1; i < prof.nops; i++) /* insertion sort by ms, descending */
        for (int j = i; j > 0 && prof.ops[order[j]].ms > prof.ops[order[j - 1]].ms; j--) {
            int x = order[j];
            order[j] = order[j - 1], order[j - 1] = x;
        }
    if (tsv)
        fprintf(f, "op\tcalls_per_step\tms_per_step\tpct_of_step\tgb_per_s\ttflop_per_s\t"
                   "us_per_call\n");
    else
        fprintf(f,
                "profile (TRIDENT_PROFILE, %d steps after the first, device time per op):\n"
                "%-22s %10s %10s %9s %9s %9s %10s\n",
                prof.steps, "op", "calls/step", "ms/step", "% of step", "GB/s", "TFLOP/s",
                "us/call");
    double covered = 0;
    for (int i = 0; i < prof.nops; i++) {
        const ProfOp *o = &prof.ops[order[i]];
        if (o->parent >= 0)
            continue;
        covered += o->ms / steps;
        prof_row(f, tsv, o, steps, wall);
        for (int j = 0; j < prof.nops; j++) /* (a part seen in step 1 only: no row) */
            if (prof.ops[order[j]].parent == order[i] && prof.ops[order[j]].calls > 0)
                prof_row(f, tsv, &prof.ops[order[j]], steps, wall);
    }
    const double idle = wall - covered, pct = wall > 0 ? 100 * idle / wall : 0;
    if (tsv)
        fprintf(f, "gpu_idle\t0\t%.4f\t%.2f\t0\t0\t0\nstep_wall\t0\t%.4f\t100\t0\t0\t0\n", idle,
                pct, wall);
    else
        fprintf(f, "%-22s %10s %10.4f %9.2f\n%-22s %10s %10.4f %9.2f\n", "GPU idle (no op)", "",
                idle, pct, "step wall", "", wall, 100.0);
}

extern "C" void backend_cuda_profile_report(const char *dir)
{
    if (!prof.base)
        return;
    if (prof.steps == 0) {
        printf("profile (TRIDENT_PROFILE): no step after the first, nothing to report\n");
        return;
    }
    if (prof.dropped)
        printf("profile: %d calls beyond %d a step were not timed\n", prof.dropped, PROF_PAIRS);
    prof_write(stdout, 0);
    /* whose attention the attention_* rows timed (cuDNN's includes its
     * bf16 conversions) */
    printf("profile: attention by %s\n",
           cuda_attention_cudnn_on() ? "cuDNN (kernels/attention_cudnn.cu)" : "trident's kernels");
    char path[4096];
    snprintf(path, sizeof path, "%s/profile.tsv", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        trd_fatal(TRD_EXIT_RUNTIME, "check that run.dir is writable", "cannot write %s", path);
    prof_write(f, 1);
    if (fclose(f) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, "check that run.dir is writable", "cannot write %s", path);
    printf("profile: %s\n", path);
}
