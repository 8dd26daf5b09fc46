/* The CUDA ops (kernels/) against the CPU reference (src/backend/cpu.c).
 *
 * For every op of the Backend table: random inputs, several shapes (odd
 * sizes, more than one block of threads, GQA / MQA / MHA, vocab slices with
 * foreign and negative tokens, ignored targets, padded vocabularies), the
 * same inputs given to both backends, the results compared.  Output and
 * gradient buffers start with random values on both sides: a kernel that
 * forgets an element, or overwrites a gradient instead of adding to it,
 * fails.
 *
 * Tolerances (|gpu - cpu| <= rtol * (|cpu| + scale), scale = the largest
 * |cpu| of the array, so cancellation near zero is judged against the size
 * of the terms that cancelled; a wrong index or a missing term is an error
 * of the order of the scale and fails whatever the tolerance below):
 *   exact    add, accumulate, scale, add_bias, embedding forward and
 *            backward, sumsq of integers, bf16 rounding, dropout_philox,
 *            the attention's bf16 copy of out against its fp32 out, the
 *            bf16 backward's dbias against the fp32 CUDA table's:
 *            the same IEEE fp32 operations in the same order on both sides;
 *            vocab_max and the target logit of vocab_sumexp: a maximum and
 *            a copy, exact in any order;
 *   1e-5     elementwise ops (GELU, SwiGLU, RoPE, AdamW, and vocab_loss and
 *            vocab_backward from the same statistics): a few roundings
 *            each, expf / logf within 2 ulp on both sides, FMA contraction
 *            on the GPU: ~1e-6 observed in such kernels, 10x margin;
 *   1e-4     reductions (GEMMs, fp32 and bf16, decode_linear's GEMV and its norm, the
 *            bias gradient (rows summed in groups), norms, attention,
 *            cross-entropy, the sum of vocab_sumexp, the vocab ops composed
 *            as tp = 2 against the plain cross-entropy): fp32 sums of up
 *            to a few hundred terms in another order (cuBLAS, warp and
 *            block reductions), error
 *            ~ sqrt(K) * 6e-8 relative to the terms, 1e-6..1e-5 at these
 *            sizes;
 *   1e-10    sumsq of random floats: squares are exact in double, only the
 *            order of the double additions differs (~1e-13 expected; one
 *            element left out would move the sum by ~1/n >= 6e-8).
 *
 * Needs a CUDA device: without one it prints "SKIP: no CUDA device" and
 * exits 77 (meson's skip code).  Registered only in the suite 'gpu'. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda.h"
#include "check.h"
#include "core/error.h"
#include "core/rng.h"
#include "doc_positions.h"

static const Backend *cpu, *gpu;

/* ------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

/* uniform in [-1, 1): xorshift64* */
static double urand(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545f4914f6cdd1dull;
    return (double)(r >> 11) / (double)(1ull << 52) - 1.0;
}

/* integer in [lo, hi) */
static int irand(int lo, int hi)
{
    int v = lo + (int)((urand() + 1) / 2 * (hi - lo));
    return v < hi ? v : hi - 1;
}

/* host array of n values uniform in [-scale, scale) */
static float *hrand(size_t n, float scale)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(urand() * scale);
    return x;
}

/* a device copy of a host array */
static void *dcopy(const void *host, size_t bytes)
{
    void *d = backend_cuda_malloc(bytes, "test buffer");
    backend_cuda_to_device(d, host, bytes);
    return d;
}

static float *dcopyf(const float *host, size_t n) { return dcopy(host, n * sizeof(float)); }

/* h [n] and its device twin d filled with NaN: what an op that SETS its
 * output (GRAD_SET) must overwrite without reading */
static void nan_fill(float *h, float *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    backend_cuda_to_device(d, h, n * sizeof *h);
}

/* the device array's content, in a new host array */
static float *fetch(const float *dev, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    backend_cuda_to_host(h, dev, n * sizeof *h);
    return h;
}

/* One check per array: the worst element against
 * |got - want| <= rtol * (|want| + max |want|); rtol = 0 asks for equal bits
 * (0 and -0 apart, which compare equal).  Infinities (the lse of a row that
 * sees no key) must be equal, and do not count in max |want|. */
static void compare(const char *what, const float *got, const float *want, size_t n, double rtol)
{
    double scale = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(want[i]))
            scale = fmax(scale, fabs(want[i]));
    size_t worst = 0;
    double worst_excess = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double excess = fabs((double)got[i] - want[i]) - rtol * (fabs(want[i]) + scale);
        if (isnan(got[i]) != isnan(want[i]))
            excess = INFINITY;
        else if (isnan(got[i]))
            excess = -1;
        else if (isinf(got[i]) || isinf(want[i]))
            excess = got[i] == want[i] ? -1 : INFINITY;
        if (excess > worst_excess) {
            worst_excess = excess;
            worst = i;
        }
    }
    CHECK(n > 0 && worst_excess <= 0, "%s: element %zu of %zu: gpu %.9g, cpu %.9g (rtol %g)", what,
          worst, n, n ? got[worst] : 0.0, n ? want[worst] : 0.0, rtol);
}

/* compare a device array with a host one, then free the device array's
 * host copy */
static void compare_dev(const char *what, const float *dev, const float *want, size_t n,
                        double rtol)
{
    float *got = fetch(dev, n);
    compare(what, got, want, n, rtol);
    free(got);
}

enum { R_EXACT = 0 };
#define R_ELEM 1e-5
#define R_RED  1e-4
#define R_TC   4e-3

/* --------------------------------------------------------------- matmul */

/* The column sums (dbias; the norms' parameter gradients share the code)
 * sum the rows in groups, not in the CPU's order: the same input must
 * still give the same bits on every call. */
static void test_dbias_repeat(int N, int OC)
{
    size_t no = (size_t)N * OC;
    float *dout = hrand(no, 1), *zero = calloc((size_t)OC, sizeof *zero);
    float *d_dout = dcopyf(dout, no), *d_a = dcopyf(zero, OC), *d_b = dcopyf(zero, OC);
    gpu->matmul_backward(NULL, NULL, d_a, d_dout, d_dout, d_dout, N, 1, OC, GRAD_ADD);
    gpu->matmul_backward(NULL, NULL, d_b, d_dout, d_dout, d_dout, N, 1, OC, GRAD_ADD);
    float *a = fetch(d_a, OC), *b = fetch(d_b, OC);
    CHECK(memcmp(a, b, (size_t)OC * sizeof *a) == 0, "dbias N=%d OC=%d: the same bits twice", N,
          OC);
    free(dout), free(zero), free(a), free(b);
    backend_cuda_free(d_dout), backend_cuda_free(d_a), backend_cuda_free(d_b);
}

/* The bf16 backward's bias gradient, summed in the pass that converts
 * dout (to_bf16_col_sum_kernel), has the bits of the fp32 table's
 * (col_sum_acc_kernel: the same walk over the rows), in matmul_backward
 * with either gradient beside it and in matmul_backward_dgelu. */
static void test_dbias_fused(int N, int C, int OC)
{
    const Backend *f32 = backend_cuda(), *b16 = backend_cuda_bf16();
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *dout = hrand(no, 1), *inp = hrand(ni, 1), *w = hrand(nw, 1), *db = hrand(OC, 1);
    float *d_dout = dcopyf(dout, no), *d_inp = dcopyf(inp, ni), *d_w = dcopyf(w, nw);
    float *d_dinp = dcopyf(inp, ni), *d_dw = dcopyf(w, nw), *d_want = dcopyf(db, OC);
    float *d_db[3] = {dcopyf(db, OC), dcopyf(db, OC), dcopyf(db, OC)};
    f32->matmul_backward(NULL, NULL, d_want, d_dout, d_inp, d_w, N, C, OC, GRAD_ADD);
    b16->matmul_backward(d_dinp, d_dw, d_db[0], d_dout, d_inp, d_w, N, C, OC, GRAD_SET);
    b16->matmul_backward(NULL, d_dw, d_db[1], d_dout, d_inp, d_w, N, C, OC, GRAD_ADD);
    b16->matmul_backward_dgelu(d_dinp, d_dw, d_db[2], d_dout, d_inp, d_inp, d_w, N, C, OC);
    float *want = fetch(d_want, OC);
    static const char *op[3] = {"matmul_backward", "matmul_backward dweight only", "dgelu"};
    for (int k = 0; k < 3; k++) {
        float *got = fetch(d_db[k], OC);
        CHECK(memcmp(got, want, (size_t)OC * sizeof *got) == 0,
              "bf16 %s %dx%dx%d: dbias summed in the conversion pass = the fp32 table's bits",
              op[k], N, C, OC);
        free(got), backend_cuda_free(d_db[k]);
    }
    free(dout), free(inp), free(w), free(db), free(want);
    backend_cuda_free(d_dout), backend_cuda_free(d_inp), backend_cuda_free(d_w);
    backend_cuda_free(d_dinp), backend_cuda_free(d_dw), backend_cuda_free(d_want);
}

/* "bf16 " while the tables are the bf16 ones */
static const char *matmul_tag = "";

static void test_matmul(int N, int C, int OC, int with_bias)
{
    char what[128];
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = hrand(ni, 1), *w = hrand(nw, 1), *b = with_bias ? hrand(OC, 1) : NULL;
    float *out = hrand(no, 1), *dout = hrand(no, 1);
    float *dinp = hrand(ni, 1), *dw = hrand(nw, 1), *db = hrand(OC, 1);
    float *d_inp = dcopyf(inp, ni), *d_w = dcopyf(w, nw), *d_b = b ? dcopyf(b, OC) : NULL;
    float *d_out = dcopyf(out, no), *d_dout = dcopyf(dout, no);
    float *d_dinp = dcopyf(dinp, ni), *d_dw = dcopyf(dw, nw), *d_db = dcopyf(db, OC);

    cpu->matmul_forward(out, inp, w, b, N, C, OC);
    gpu->matmul_forward(d_out, d_inp, d_w, d_b, N, C, OC);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d%s out", matmul_tag, N, C, OC, b ? "+bias" : "");
    compare_dev(what, d_out, out, no, R_RED);

    /* all three gradients, accumulated onto random values */
    cpu->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, GRAD_ADD);
    gpu->matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC, GRAD_ADD);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dinp", matmul_tag, N, C, OC);
    compare_dev(what, d_dinp, dinp, ni, R_RED);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dweight", matmul_tag, N, C, OC);
    compare_dev(what, d_dw, dw, nw, R_RED);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dbias", matmul_tag, N, C, OC);
    compare_dev(what, d_db, db, OC, R_RED);

    /* NULL gradients are skipped, the others still produced */
    cpu->matmul_backward(NULL, dw, NULL, dout, inp, w, N, C, OC, GRAD_ADD);
    gpu->matmul_backward(NULL, d_dw, NULL, d_dout, d_inp, d_w, N, C, OC, GRAD_ADD);
    cpu->matmul_backward(dinp, NULL, db, dout, inp, w, N, C, OC, GRAD_ADD);
    gpu->matmul_backward(d_dinp, NULL, d_db, d_dout, d_inp, d_w, N, C, OC, GRAD_ADD);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dinp after a NULL-gradient pass", matmul_tag, N,
             C, OC);
    compare_dev(what, d_dinp, dinp, ni, R_RED);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dweight alone", matmul_tag, N, C, OC);
    compare_dev(what, d_dw, dw, nw, R_RED);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dbias twice", matmul_tag, N, C, OC);
    compare_dev(what, d_db, db, OC, R_RED);

    /* GRAD_SET: dinp written over NaN, dweight and dbias still added to */
    nan_fill(dinp, d_dinp, ni);
    cpu->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, GRAD_SET);
    gpu->matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC, GRAD_SET);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dinp SET over NaN", matmul_tag, N, C, OC);
    compare_dev(what, d_dinp, dinp, ni, R_RED);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dweight added beside a SET", matmul_tag, N, C,
             OC);
    compare_dev(what, d_dw, dw, nw, R_RED);
    snprintf(what, sizeof what, "%smatmul %dx%dx%d dbias added beside a SET", matmul_tag, N, C, OC);
    compare_dev(what, d_db, db, OC, R_RED);

    free(inp), free(w), free(b), free(out), free(dout), free(dinp), free(dw), free(db);
    backend_cuda_free(d_inp), backend_cuda_free(d_w), backend_cuda_free(d_b);
    backend_cuda_free(d_out), backend_cuda_free(d_dout), backend_cuda_free(d_dinp);
    backend_cuda_free(d_dw), backend_cuda_free(d_db);
}

/* The grouped linears (backend.h; kernels/matmul.cu: one grouped GEMM per
 * product) against the CPU's per-group loop: G groups of the given row
 * counts (empty ones among them), group g's weight and bias those of
 * expert g % E (E < G: groups share a gradient, as the ep blocks of
 * src/model/moe.c do; their gradients add).  Outputs and gradients start
 * random; then the weight gradient alone and the input gradient with the
 * bias gradient alone. */
static void test_matmul_grouped(int G, const int *rows, int E, int C, int OC, int with_bias)
{
    char what[160];
    int off[65];
    TRD_ASSERT(G <= 64 && E <= G);
    off[0] = 0;
    for (int g = 0; g < G; g++)
        off[g + 1] = off[g] + rows[g];
    const int R = off[G];
    size_t ni = (size_t)R * C, nw = (size_t)E * OC * C, no = (size_t)R * OC, nb = (size_t)E * OC;
    float *inp = hrand(ni, 1), *w = hrand(nw, 1), *b = hrand(nb, 1);
    float *out = hrand(no, 1), *dout = hrand(no, 1);
    float *dinp = hrand(ni, 1), *dw = hrand(nw, 1), *db = hrand(nb, 1);
    float *d_inp = dcopyf(inp, ni), *d_w = dcopyf(w, nw), *d_b = dcopyf(b, nb);
    float *d_out = dcopyf(out, no), *d_dout = dcopyf(dout, no);
    float *d_dinp = dcopyf(dinp, ni), *d_dw = dcopyf(dw, nw), *d_db = dcopyf(db, nb);
    const float *hw[64], *hb[64], *gw[64], *gb[64];
    float *hdw[64], *hdb[64], *gdw[64], *gdb[64];
    for (int g = 0; g < G; g++) {
        const size_t e = (size_t)(g % E);
        hw[g] = w + e * OC * C, gw[g] = d_w + e * OC * C;
        hb[g] = b + e * OC, gb[g] = d_b + e * OC;
        hdw[g] = dw + e * OC * C, gdw[g] = d_dw + e * OC * C;
        hdb[g] = db + e * OC, gdb[g] = d_db + e * OC;
    }
    int len = snprintf(what, sizeof what, "%sgrouped matmul G %d E %d rows", matmul_tag, G, E);
    for (int g = 0; g < G && len < 100; g++)
        len += snprintf(what + len, sizeof what - len, "%s%d", g ? "," : " ", rows[g]);
    snprintf(what + len, sizeof what - len, " C %d OC %d%s", C, OC, with_bias ? " +bias" : "");
    char name[224];

    cpu->matmul_grouped_forward(out, inp, hw, with_bias ? hb : NULL, off, G, C, OC);
    gpu->matmul_grouped_forward(d_out, d_inp, gw, with_bias ? gb : NULL, off, G, C, OC);
    snprintf(name, sizeof name, "%s out", what);
    if (R > 0) /* (no rows: only the gradients, unchanged, below) */
        compare_dev(name, d_out, out, no, R_RED);

    cpu->matmul_grouped_backward(dinp, hdw, with_bias ? hdb : NULL, dout, inp, hw, off, G, C, OC);
    gpu->matmul_grouped_backward(d_dinp, gdw, with_bias ? gdb : NULL, d_dout, d_inp, gw, off, G, C,
                                 OC);
    snprintf(name, sizeof name, "%s dinp", what);
    if (R > 0)
        compare_dev(name, d_dinp, dinp, ni, R_RED);
    snprintf(name, sizeof name, "%s dweight", what);
    compare_dev(name, d_dw, dw, nw, R_RED);
    snprintf(name, sizeof name, "%s dbias", what);
    compare_dev(name, d_db, db, nb, R_RED);

    cpu->matmul_grouped_backward(NULL, hdw, NULL, dout, inp, hw, off, G, C, OC);
    gpu->matmul_grouped_backward(NULL, gdw, NULL, d_dout, d_inp, gw, off, G, C, OC);
    cpu->matmul_grouped_backward(dinp, NULL, hdb, dout, inp, hw, off, G, C, OC);
    gpu->matmul_grouped_backward(d_dinp, NULL, gdb, d_dout, d_inp, gw, off, G, C, OC);
    snprintf(name, sizeof name, "%s dweight alone", what);
    compare_dev(name, d_dw, dw, nw, R_RED);
    snprintf(name, sizeof name, "%s dinp and dbias alone", what);
    if (R > 0)
        compare_dev(name, d_dinp, dinp, ni, R_RED);
    compare_dev(name, d_db, db, nb, R_RED);

    free(inp), free(w), free(b), free(out), free(dout), free(dinp), free(dw), free(db);
    backend_cuda_free(d_inp), backend_cuda_free(d_w), backend_cuda_free(d_b);
    backend_cuda_free(d_out), backend_cuda_free(d_dout), backend_cuda_free(d_dinp);
    backend_cuda_free(d_dw), backend_cuda_free(d_db);
}

/* Shapes of the grouped linears: uneven groups with empty ones (first,
 * middle, last), one group, all empty, and groups sharing a gradient. */
static void test_matmul_grouped_all(void)
{
    const int uneven[6] = {0, 37, 1, 0, 128, 0}, one[1] = {53}, none[3] = {0, 0, 0};
    const int ep2[8] = {5, 0, 17, 3, 9, 2, 0, 40}; /* 4 experts, 2 blocks each */
    test_matmul_grouped(6, uneven, 6, 75, 53, 1);
    test_matmul_grouped(6, uneven, 6, 64, 96, 0);
    test_matmul_grouped(1, one, 1, 40, 24, 1);
    test_matmul_grouped(3, none, 3, 16, 8, 1);
    test_matmul_grouped(8, ep2, 4, 48, 40, 1);
}

/* The linear layer fused with GELU (backend_cuda_bf16: cuBLASLt's
 * GELU_AUX_BIAS and DGELU epilogues where the shapes suit them, the
 * separate kernels where not) against backend_cpu_bf16's two ops in order.
 * pre: a GEMM (R_RED); out = gelu(pre) and dinp = gelu'(pre) * (dout . W):
 * the GEMM's error times a slope of at most 1.13, plus two evaluations of
 * tanh-GELU (the library's and the reference's x * sigmoid(2u), ~1e-6):
 * 2 * R_RED.  dinp starts random on both sides (the op SETS it); dweight
 * and dbias add onto random values as matmul_backward's do. */
static void test_matmul_gelu(int N, int C, int OC)
{
    char what[128];
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = hrand(ni, 1), *w = hrand(nw, 1), *b = hrand(OC, 1), *w2 = hrand(nw, 1);
    float *out = hrand(no, 1), *pre = hrand(no, 1), *dout = hrand(ni, 1);
    float *dinp = hrand(no, 1), *dw = hrand(nw, 1), *db = hrand(C, 1);
    float *d_inp = dcopyf(inp, ni), *d_w = dcopyf(w, nw), *d_b = dcopyf(b, OC);
    float *d_w2 = dcopyf(w2, nw), *d_out = dcopyf(out, no), *d_pre = dcopyf(pre, no);
    float *d_dout = dcopyf(dout, ni), *d_dinp = dcopyf(dinp, no), *d_dw = dcopyf(dw, nw);
    float *d_db = dcopyf(db, C);

    /* forward: inp [N, C] through w [OC, C] (+ b) to pre and out [N, OC] */
    cpu->matmul_gelu_forward(out, pre, inp, w, b, N, C, OC);
    gpu->matmul_gelu_forward(d_out, d_pre, d_inp, d_w, d_b, N, C, OC);
    snprintf(what, sizeof what, "bf16 matmul+gelu %dx%dx%d pre", N, C, OC);
    compare_dev(what, d_pre, pre, no, R_RED);
    snprintf(what, sizeof what, "bf16 matmul+gelu %dx%dx%d out", N, C, OC);
    compare_dev(what, d_out, out, no, 2 * R_RED);

    /* the backward of the next linear, w2 [C, OC] reading out [N, OC]
     * (both sides from the CPU's out and pre): the gradient at pre through
     * gelu', dweight [C, OC] and dbias [C] */
    float *d_out_cpu = dcopyf(out, no), *d_pre_cpu = dcopyf(pre, no);
    cpu->matmul_backward_dgelu(dinp, dw, db, dout, out, pre, w2, N, OC, C);
    gpu->matmul_backward_dgelu(d_dinp, d_dw, d_db, d_dout, d_out_cpu, d_pre_cpu, d_w2, N, OC, C);
    snprintf(what, sizeof what, "bf16 matmul dgelu %dx%dx%d dinp", N, OC, C);
    compare_dev(what, d_dinp, dinp, no, 2 * R_RED);
    snprintf(what, sizeof what, "bf16 matmul dgelu %dx%dx%d dweight", N, OC, C);
    compare_dev(what, d_dw, dw, nw, R_RED);
    snprintf(what, sizeof what, "bf16 matmul dgelu %dx%dx%d dbias", N, OC, C);
    compare_dev(what, d_db, db, C, R_RED);

    free(inp), free(w), free(b), free(w2), free(out), free(pre), free(dout), free(dinp);
    free(dw), free(db);
    backend_cuda_free(d_inp), backend_cuda_free(d_w), backend_cuda_free(d_b);
    backend_cuda_free(d_w2), backend_cuda_free(d_out), backend_cuda_free(d_pre);
    backend_cuda_free(d_dout), backend_cuda_free(d_dinp), backend_cuda_free(d_dw);
    backend_cuda_free(d_db), backend_cuda_free(d_out_cpu), backend_cuda_free(d_pre_cpu);
}

/* ------------------------------------------------------------ embedding */

/* Tokens drawn from [-3, vocab_start + V + 10): negative ones, ones below
 * the slice and above it, and repeats; the first four are set so that
 * every case is there whatever the draw. */
static void test_embedding(int B, int T, int C, int vocab_start, int V, const int32_t *pos)
{
    char what[128];
    int N = B * T;
    size_t no = (size_t)N * C, nte = (size_t)V * C, npe = (size_t)T * C;
    int32_t *tok = malloc(N * sizeof *tok);
    int foreign = 0;
    for (int n = 0; n < N; n++) {
        tok[n] = irand(-3, vocab_start + V + 10);
        if (n < 4) /* ours, the first past the slice, negative, a repeat */
            tok[n] = (int32_t[]){vocab_start, vocab_start + V, -1, vocab_start}[n];
        foreign += tok[n] < vocab_start || tok[n] >= vocab_start + V;
    }
    CHECK(foreign > 0 && foreign < N, "embedding test: %d foreign tokens of %d", foreign, N);
    float *wte = hrand(nte, 1), *wpe = hrand(npe, 1), *out = hrand(no, 1);
    float *dout = hrand(no, 1), *dwte = hrand(nte, 1), *dwpe = hrand(npe, 1);
    int32_t *d_tok = dcopy(tok, N * sizeof *tok), *d_pos = pos ? dcopy(pos, N * sizeof *pos) : NULL;
    float *d_wte = dcopyf(wte, nte), *d_wpe = dcopyf(wpe, npe), *d_out = dcopyf(out, no);
    float *d_dout = dcopyf(dout, no), *d_dwte = dcopyf(dwte, nte), *d_dwpe = dcopyf(dwpe, npe);

    for (int with_wpe = 1; with_wpe >= 0; with_wpe--) {
        cpu->embedding_forward(out, tok, pos, wte, with_wpe ? wpe : NULL, N, T, C, vocab_start, V);
        gpu->embedding_forward(d_out, d_tok, d_pos, d_wte, with_wpe ? d_wpe : NULL, N, T, C,
                               vocab_start, V);
        snprintf(what, sizeof what, "embedding N=%d C=%d start=%d V=%d%s%s out", N, C, vocab_start,
                 V, with_wpe ? "" : " (no wpe)", pos ? " documents" : "");
        compare_dev(what, d_out, out, no, R_EXACT);
    }
    cpu->embedding_backward(dwte, dwpe, dout, tok, pos, N, T, C, vocab_start, V);
    gpu->embedding_backward(d_dwte, d_dwpe, d_dout, d_tok, d_pos, N, T, C, vocab_start, V);
    cpu->embedding_backward(dwte, NULL, dout, tok, pos, N, T, C, vocab_start, V);
    gpu->embedding_backward(d_dwte, NULL, d_dout, d_tok, d_pos, N, T, C, vocab_start, V);
    cpu->embedding_backward(NULL, dwpe, dout, tok, pos, N, T, C, vocab_start, V);
    gpu->embedding_backward(NULL, d_dwpe, d_dout, d_tok, d_pos, N, T, C, vocab_start, V);
    snprintf(what, sizeof what, "embedding N=%d C=%d start=%d%s dwte", N, C, vocab_start,
             pos ? " documents" : "");
    compare_dev(what, d_dwte, dwte, nte, R_EXACT);
    snprintf(what, sizeof what, "embedding N=%d C=%d start=%d%s dwpe", N, C, vocab_start,
             pos ? " documents" : "");
    compare_dev(what, d_dwpe, dwpe, npe, R_EXACT);

    free(tok), free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    backend_cuda_free(d_tok), backend_cuda_free(d_wte), backend_cuda_free(d_wpe);
    backend_cuda_free(d_out), backend_cuda_free(d_dout), backend_cuda_free(d_dwte);
    backend_cuda_free(d_dwpe), backend_cuda_free(d_pos);
}

/* ---------------------------------------------------------------- norms */

/* inputs with a non-zero mean, so that the centring matters */
static float *norm_input(size_t n)
{
    float *x = hrand(n, 1);
    for (size_t i = 0; i < n; i++)
        x[i] += 0.7f;
    return x;
}

static void test_layernorm(int N, int C, int with_bias)
{
    char what[128];
    size_t n = (size_t)N * C;
    float *inp = norm_input(n), *w = hrand(C, 1), *b = with_bias ? hrand(C, 1) : NULL;
    float *out = hrand(n, 1), *mean = hrand(N, 1), *rstd = hrand(N, 1), *dout = hrand(n, 1);
    float *dinp = hrand(n, 1), *dw = hrand(C, 1), *db = hrand(C, 1);
    float *d_inp = dcopyf(inp, n), *d_w = dcopyf(w, C), *d_b = b ? dcopyf(b, C) : NULL;
    float *d_out = dcopyf(out, n), *d_mean = dcopyf(mean, N), *d_rstd = dcopyf(rstd, N);
    float *d_dout = dcopyf(dout, n), *d_dinp = dcopyf(dinp, n), *d_dw = dcopyf(dw, C);
    float *d_db = dcopyf(db, C);

    cpu->layernorm_forward(out, mean, rstd, inp, w, b, N, C, 1e-5f);
    gpu->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C, 1e-5f);
    snprintf(what, sizeof what, "layernorm N=%d C=%d%s out", N, C, b ? "" : " (no bias)");
    compare_dev(what, d_out, out, n, R_RED);
    snprintf(what, sizeof what, "layernorm N=%d C=%d mean", N, C);
    compare_dev(what, d_mean, mean, N, R_RED);
    snprintf(what, sizeof what, "layernorm N=%d C=%d rstd", N, C);
    compare_dev(what, d_rstd, rstd, N, R_RED);

    /* backward from the CPU's statistics on both sides (the GPU's were
     * just checked), all gradients, then subsets */
    backend_cuda_to_device(d_mean, mean, N * sizeof(float));
    backend_cuda_to_device(d_rstd, rstd, N * sizeof(float));
    cpu->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    gpu->layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    cpu->layernorm_backward(NULL, dw, NULL, dout, inp, w, mean, rstd, N, C);
    gpu->layernorm_backward(NULL, d_dw, NULL, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    cpu->layernorm_backward(dinp, NULL, db, dout, inp, w, mean, rstd, N, C);
    gpu->layernorm_backward(d_dinp, NULL, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, N, C);
    snprintf(what, sizeof what, "layernorm N=%d C=%d dinp", N, C);
    compare_dev(what, d_dinp, dinp, n, R_RED);
    snprintf(what, sizeof what, "layernorm N=%d C=%d dweight", N, C);
    compare_dev(what, d_dw, dw, C, R_RED);
    snprintf(what, sizeof what, "layernorm N=%d C=%d dbias", N, C);
    compare_dev(what, d_db, db, C, R_RED);

    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout);
    free(dinp), free(dw), free(db);
    backend_cuda_free(d_inp), backend_cuda_free(d_w), backend_cuda_free(d_b);
    backend_cuda_free(d_out), backend_cuda_free(d_mean), backend_cuda_free(d_rstd);
    backend_cuda_free(d_dout), backend_cuda_free(d_dinp), backend_cuda_free(d_dw);
    backend_cuda_free(d_db);
}

/* residual_norm_forward (LayerNorm with and without bias, RMSNorm) against
 * the CPU's add then norm: the sum with equal bits (one fp32 add each), the
 * norm within a reduction's tolerance; then with res aliasing a, the
 * model's in-place use, which must give the same. */
static void test_residual_norm(int N, int C, int with_bias, int rms)
{
    char what[128];
    size_t n = (size_t)N * C;
    float *a = norm_input(n), *b = hrand(n, 0.5f), *w = hrand(C, 1);
    float *bias = with_bias ? hrand(C, 1) : NULL;
    float *res = hrand(n, 1), *out = hrand(n, 1), *mean = hrand(N, 1), *rstd = hrand(N, 1);
    float *d_a = dcopyf(a, n), *d_b = dcopyf(b, n), *d_w = dcopyf(w, C);
    float *d_bias = bias ? dcopyf(bias, C) : NULL, *d_res = dcopyf(res, n);
    float *d_out = dcopyf(out, n), *d_mean = dcopyf(mean, N), *d_rstd = dcopyf(rstd, N);
    const char *kind = rms ? "rmsnorm" : with_bias ? "layernorm" : "layernorm (no bias)";

    cpu->residual_norm_forward(res, out, mean, rstd, a, b, w, bias, N, C, 1e-5f, rms);
    gpu->residual_norm_forward(d_res, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C, 1e-5f,
                               rms);
    snprintf(what, sizeof what, "residual %s N=%d C=%d res", kind, N, C);
    compare_dev(what, d_res, res, n, 0);
    snprintf(what, sizeof what, "residual %s N=%d C=%d out", kind, N, C);
    compare_dev(what, d_out, out, n, R_RED);
    snprintf(what, sizeof what, "residual %s N=%d C=%d rstd", kind, N, C);
    compare_dev(what, d_rstd, rstd, N, R_RED);
    if (!rms) {
        snprintf(what, sizeof what, "residual %s N=%d C=%d mean", kind, N, C);
        compare_dev(what, d_mean, mean, N, R_RED);
    }
    gpu->residual_norm_forward(d_a, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C, 1e-5f, rms);
    snprintf(what, sizeof what, "residual %s N=%d C=%d res in place", kind, N, C);
    compare_dev(what, d_a, res, n, 0);
    snprintf(what, sizeof what, "residual %s N=%d C=%d out, res in place", kind, N, C);
    compare_dev(what, d_out, out, n, R_RED);
    free(a), free(b), free(w), free(bias), free(res), free(out), free(mean), free(rstd);
    backend_cuda_free(d_a), backend_cuda_free(d_b), backend_cuda_free(d_w);
    backend_cuda_free(d_bias), backend_cuda_free(d_res), backend_cuda_free(d_out);
    backend_cuda_free(d_mean), backend_cuda_free(d_rstd);
}

static void test_rmsnorm(int N, int C)
{
    char what[128];
    size_t n = (size_t)N * C;
    float *inp = norm_input(n), *w = hrand(C, 1), *out = hrand(n, 1), *rstd = hrand(N, 1);
    float *dout = hrand(n, 1), *dinp = hrand(n, 1), *dw = hrand(C, 1);
    float *d_inp = dcopyf(inp, n), *d_w = dcopyf(w, C), *d_out = dcopyf(out, n);
    float *d_rstd = dcopyf(rstd, N), *d_dout = dcopyf(dout, n), *d_dinp = dcopyf(dinp, n);
    float *d_dw = dcopyf(dw, C);

    cpu->rmsnorm_forward(out, rstd, inp, w, N, C, 1e-5f);
    gpu->rmsnorm_forward(d_out, d_rstd, d_inp, d_w, N, C, 1e-5f);
    snprintf(what, sizeof what, "rmsnorm N=%d C=%d out", N, C);
    compare_dev(what, d_out, out, n, R_RED);
    snprintf(what, sizeof what, "rmsnorm N=%d C=%d rstd", N, C);
    compare_dev(what, d_rstd, rstd, N, R_RED);

    backend_cuda_to_device(d_rstd, rstd, N * sizeof(float));
    cpu->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    gpu->rmsnorm_backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C);
    cpu->rmsnorm_backward(NULL, dw, dout, inp, w, rstd, N, C);
    gpu->rmsnorm_backward(NULL, d_dw, d_dout, d_inp, d_w, d_rstd, N, C);
    cpu->rmsnorm_backward(dinp, NULL, dout, inp, w, rstd, N, C);
    gpu->rmsnorm_backward(d_dinp, NULL, d_dout, d_inp, d_w, d_rstd, N, C);
    snprintf(what, sizeof what, "rmsnorm N=%d C=%d dinp", N, C);
    compare_dev(what, d_dinp, dinp, n, R_RED);
    snprintf(what, sizeof what, "rmsnorm N=%d C=%d dweight", N, C);
    compare_dev(what, d_dw, dw, C, R_RED);

    free(inp), free(w), free(out), free(rstd), free(dout), free(dinp), free(dw);
    backend_cuda_free(d_inp), backend_cuda_free(d_w), backend_cuda_free(d_out);
    backend_cuda_free(d_rstd), backend_cuda_free(d_dout), backend_cuda_free(d_dinp);
    backend_cuda_free(d_dw);
}

/* ---------------------------------------------------------- activations */

/* inputs over [-4, 4) and a few far out, where exp overflows */
static float *act_input(size_t n)
{
    float *x = hrand(n, 4);
    const float far[] = {-100, -30, 30, 100, -9, 9};
    for (size_t i = 0; i < n && i < sizeof far / sizeof far[0]; i++)
        x[i * 7 % n] = far[i];
    return x;
}

static void test_gelu(size_t n)
{
    char what[96];
    float *inp = act_input(n), *out = hrand(n, 1), *dout = hrand(n, 1), *dinp = hrand(n, 1);
    float *d_inp = dcopyf(inp, n), *d_out = dcopyf(out, n), *d_dout = dcopyf(dout, n);
    float *d_dinp = dcopyf(dinp, n);
    cpu->gelu_forward(out, inp, n);
    gpu->gelu_forward(d_out, d_inp, n);
    snprintf(what, sizeof what, "gelu n=%zu out", n);
    compare_dev(what, d_out, out, n, R_ELEM);
    cpu->gelu_backward(dinp, inp, dout, n, GRAD_ADD);
    gpu->gelu_backward(d_dinp, d_inp, d_dout, n, GRAD_ADD);
    snprintf(what, sizeof what, "gelu n=%zu dinp", n);
    compare_dev(what, d_dinp, dinp, n, R_ELEM);
    nan_fill(dinp, d_dinp, n);
    cpu->gelu_backward(dinp, inp, dout, n, GRAD_SET);
    gpu->gelu_backward(d_dinp, d_inp, d_dout, n, GRAD_SET);
    snprintf(what, sizeof what, "gelu n=%zu dinp SET over NaN", n);
    compare_dev(what, d_dinp, dinp, n, R_ELEM);
    free(inp), free(out), free(dout), free(dinp);
    backend_cuda_free(d_inp), backend_cuda_free(d_out), backend_cuda_free(d_dout);
    backend_cuda_free(d_dinp);
}

static void test_swiglu(size_t n)
{
    char what[96];
    float *gate = act_input(n), *up = hrand(n, 2), *out = hrand(n, 1), *dout = hrand(n, 1);
    float *dgate = hrand(n, 1), *dup = hrand(n, 1);
    float *d_gate = dcopyf(gate, n), *d_up = dcopyf(up, n), *d_out = dcopyf(out, n);
    float *d_dout = dcopyf(dout, n), *d_dgate = dcopyf(dgate, n), *d_dup = dcopyf(dup, n);
    cpu->swiglu_forward(out, gate, up, n);
    gpu->swiglu_forward(d_out, d_gate, d_up, n);
    snprintf(what, sizeof what, "swiglu n=%zu out", n);
    compare_dev(what, d_out, out, n, R_ELEM);
    cpu->swiglu_backward(dgate, dup, dout, gate, up, n, GRAD_ADD);
    gpu->swiglu_backward(d_dgate, d_dup, d_dout, d_gate, d_up, n, GRAD_ADD);
    cpu->swiglu_backward(dgate, NULL, dout, gate, up, n, GRAD_ADD);
    gpu->swiglu_backward(d_dgate, NULL, d_dout, d_gate, d_up, n, GRAD_ADD);
    cpu->swiglu_backward(NULL, dup, dout, gate, up, n, GRAD_ADD);
    gpu->swiglu_backward(NULL, d_dup, d_dout, d_gate, d_up, n, GRAD_ADD);
    snprintf(what, sizeof what, "swiglu n=%zu dgate", n);
    compare_dev(what, d_dgate, dgate, n, R_ELEM);
    snprintf(what, sizeof what, "swiglu n=%zu dup", n);
    compare_dev(what, d_dup, dup, n, R_ELEM);
    nan_fill(dgate, d_dgate, n), nan_fill(dup, d_dup, n);
    cpu->swiglu_backward(dgate, dup, dout, gate, up, n, GRAD_SET);
    gpu->swiglu_backward(d_dgate, d_dup, d_dout, d_gate, d_up, n, GRAD_SET);
    snprintf(what, sizeof what, "swiglu n=%zu dgate SET over NaN", n);
    compare_dev(what, d_dgate, dgate, n, R_ELEM);
    snprintf(what, sizeof what, "swiglu n=%zu dup SET over NaN", n);
    compare_dev(what, d_dup, dup, n, R_ELEM);
    free(gate), free(up), free(out), free(dout), free(dgate), free(dup);
    backend_cuda_free(d_gate), backend_cuda_free(d_up), backend_cuda_free(d_out);
    backend_cuda_free(d_dout), backend_cuda_free(d_dgate), backend_cuda_free(d_dup);
}

/* ----------------------------------------- GEMM inputs stored in bf16 */

/* backend.h's *_x16 ops (the bf16 tables): the GEMMs reading a bf16-stored
 * input, the producers writing one.  Two checks each:
 *   - on each backend, the same bits as the fp32-storage op it replaces:
 *     a GEMM on the widened bf16 values (which its rounding leaves as they
 *     are), and a producer's bits = bf16_bits of the fp32 op's output;
 *     this is what makes bf16 storage change no result (docs/design.md);
 *   - GPU against CPU: GEMMs and the fp32 outputs within R_RED as their
 *     fp32-storage twins; the bf16 outputs within R_TC (4e-3 > 2^-8, one
 *     bf16 step: the fp32 values within 1e-4 may round to neighbours). */

static uint16_t *hrand16(size_t n, float scale)
{
    float *x = hrand(n, scale);
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = bf16_bits(x[i]);
    free(x);
    return h;
}

static float *widen16(const uint16_t *h, size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&x[i], &u, sizeof u);
    }
    return x;
}

static uint16_t *fetch16(const uint16_t *dev, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    backend_cuda_to_host(h, dev, n * sizeof *h);
    return h;
}

/* bf16 bits h (host) are bf16_bits of the fp32 values x (host) */
static void check_rounded(const char *what, const uint16_t *h, const float *x, size_t n)
{
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (h[i] != bf16_bits(x[i]))
            bad = i;
    CHECK(bad == n, "%s: element %zu of %zu: bits %04x, bf16 of the fp32 op's %.9g", what, bad, n,
          bad < n ? h[bad] : 0, bad < n ? x[bad] : 0.0);
}

/* bf16 device output d16 against the CPU's h16 (R_TC), and equal to the
 * rounding of the GPU's fp32-output op (d32) */
static void compare16(const char *what, const uint16_t *d16, const uint16_t *h16, const float *d32,
                      size_t n)
{
    char w[160];
    uint16_t *got = fetch16(d16, n);
    float *g = widen16(got, n), *want = widen16(h16, n), *f32 = fetch(d32, n);
    snprintf(w, sizeof w, "%s (bf16) against the CPU", what);
    compare(w, g, want, n, R_TC);
    snprintf(w, sizeof w, "%s (bf16) = the GPU's fp32 op rounded", what);
    check_rounded(w, got, f32, n);
    free(got), free(g), free(want), free(f32);
}

static void test_matmul_x16(int N, int C, int OC, int with_bias)
{
    char what[128];
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    uint16_t *x = hrand16(ni, 1);
    float *inp = widen16(x, ni), *w = hrand(nw, 1), *b = with_bias ? hrand(OC, 1) : NULL;
    float *dout = hrand(no, 1), *o0 = hrand(no, 1), *g0 = hrand(ni + nw + OC, 1);
    uint16_t *d_x = dcopy(x, ni * sizeof *x);
    float *d_inp = dcopyf(inp, ni), *d_w = dcopyf(w, nw), *d_b = b ? dcopyf(b, OC) : NULL;
    float *d_dout = dcopyf(dout, no);
    /* [0]: the x16 op, [1]: its fp32-storage twin on the widened input */
    float *out[2], *g[2], *d_out[2], *d_g[2];
    for (int k = 0; k < 2; k++) {
        out[k] = malloc(no * sizeof(float)), memcpy(out[k], o0, no * sizeof(float));
        g[k] = malloc((ni + nw + OC) * sizeof(float));
        memcpy(g[k], g0, (ni + nw + OC) * sizeof(float));
        d_out[k] = dcopyf(o0, no), d_g[k] = dcopyf(g0, ni + nw + OC);
    }
    cpu->matmul_forward_x16(out[0], x, w, b, N, C, OC);
    cpu->matmul_forward(out[1], inp, w, b, N, C, OC);
    gpu->matmul_forward_x16(d_out[0], d_x, d_w, d_b, N, C, OC);
    gpu->matmul_forward(d_out[1], d_inp, d_w, d_b, N, C, OC);
    cpu->matmul_backward_x16(g[0], g[0] + ni, g[0] + ni + nw, dout, x, w, N, C, OC, GRAD_ADD);
    cpu->matmul_backward(g[1], g[1] + ni, g[1] + ni + nw, dout, inp, w, N, C, OC, GRAD_ADD);
    gpu->matmul_backward_x16(d_g[0], d_g[0] + ni, d_g[0] + ni + nw, d_dout, d_x, d_w, N, C, OC,
                             GRAD_ADD);
    gpu->matmul_backward(d_g[1], d_g[1] + ni, d_g[1] + ni + nw, d_dout, d_inp, d_w, N, C, OC,
                         GRAD_ADD);
    /* dweight alone (the frozen-input case passes dinp NULL the other way) */
    cpu->matmul_backward_x16(NULL, g[0] + ni, NULL, dout, x, w, N, C, OC, GRAD_ADD);
    cpu->matmul_backward(NULL, g[1] + ni, NULL, dout, inp, w, N, C, OC, GRAD_ADD);
    gpu->matmul_backward_x16(NULL, d_g[0] + ni, NULL, d_dout, d_x, d_w, N, C, OC, GRAD_ADD);
    gpu->matmul_backward(NULL, d_g[1] + ni, NULL, d_dout, d_inp, d_w, N, C, OC, GRAD_ADD);

    snprintf(what, sizeof what, "matmul_x16 %dx%dx%d%s", N, C, OC, b ? "+bias" : "");
    float *go = fetch(d_out[0], no), *go1 = fetch(d_out[1], no);
    float *gg = fetch(d_g[0], ni + nw + OC), *gg1 = fetch(d_g[1], ni + nw + OC);
    CHECK(!memcmp(out[0], out[1], no * sizeof(float)) &&
              !memcmp(g[0], g[1], (ni + nw + OC) * sizeof(float)),
          "%s: CPU's out and gradients equal to the fp32-storage op's", what);
    CHECK(!memcmp(go, go1, no * sizeof(float)) && !memcmp(gg, gg1, (ni + nw + OC) * sizeof(float)),
          "%s: GPU's out and gradients equal to the fp32-storage op's", what);
    compare(what, go, out[0], no, R_RED);
    compare(what, gg, g[0], ni + nw + OC, R_RED);

    /* GRAD_SET: dinp written over NaN */
    for (int k = 0; k < 2; k++)
        nan_fill(g[k], d_g[k], ni);
    cpu->matmul_backward_x16(g[0], NULL, NULL, dout, x, w, N, C, OC, GRAD_SET);
    cpu->matmul_backward(g[1], NULL, NULL, dout, inp, w, N, C, OC, GRAD_SET);
    gpu->matmul_backward_x16(d_g[0], NULL, NULL, d_dout, d_x, d_w, N, C, OC, GRAD_SET);
    gpu->matmul_backward(d_g[1], NULL, NULL, d_dout, d_inp, d_w, N, C, OC, GRAD_SET);
    free(gg), free(gg1);
    gg = fetch(d_g[0], ni), gg1 = fetch(d_g[1], ni);
    snprintf(what, sizeof what, "matmul_x16 %dx%dx%d dinp SET over NaN", N, C, OC);
    CHECK(!memcmp(gg, gg1, ni * sizeof(float)), "%s: GPU's equal to the fp32-storage op's", what);
    compare(what, gg, g[0], ni, R_RED);

    free(go), free(go1), free(gg), free(gg1);
    for (int k = 0; k < 2; k++) {
        free(out[k]), free(g[k]);
        backend_cuda_free(d_out[k]), backend_cuda_free(d_g[k]);
    }
    free(x), free(inp), free(w), free(b), free(dout), free(o0), free(g0);
    backend_cuda_free(d_x), backend_cuda_free(d_inp), backend_cuda_free(d_w);
    backend_cuda_free(d_b), backend_cuda_free(d_dout);
}

/* The bf16 weight copy (backend.h weights_bf16): the linear's weight w
 * [OC, C] at offset `at` of a flat buffer of P floats.  With the copy
 * made, the GEMMs (forward, input gradient, the x16 forward, the fused
 * GELU forward and its gradient) give the bits of the converting GEMMs;
 * they read the copy (the fp32 weight changed behind it leaves their
 * results as they were); after weights_bf16_drop they read the new
 * weight, as does a GEMM whose weight is not wholly inside the copied
 * range. */
static void test_weights_bf16(int N, int C, int OC)
{
    enum { OPS = 5 };
    char what[128];
    const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC, at = 37;
    const size_t P = at + nw + 11, nmax = ni > no ? ni : no;
    float *params = hrand(P, 1), *params2 = hrand(P, 1), *inp = hrand(ni, 1);
    float *b = hrand(OC, 1), *dout = hrand(no, 1), *pre = hrand(nmax, 1); /* dgelu's [N, C] */
    uint16_t *x = hrand16(ni, 1);
    float *d_p = dcopyf(params, P), *d_inp = dcopyf(inp, ni), *d_b = dcopyf(b, OC);
    float *d_dout = dcopyf(dout, no), *d_pre = dcopyf(pre, ni), *d_pw = dcopyf(params2, P);
    float *d_gpre = dcopyf(pre, no);
    uint16_t *d_x = dcopy(x, ni * sizeof *x);
    size_t n[OPS] = {no, ni, no, no, ni};
    float *d_o[OPS];
    for (int k = 0; k < OPS; k++)
        d_o[k] = dcopyf(pre, n[k]);
        /* the five GEMMs on the weight at d_w, into d_o; their outputs */
#define WB_RUN(d_w)                                                                                \
    do {                                                                                           \
        gpu->matmul_forward(d_o[0], d_inp, d_w, d_b, N, C, OC);                                    \
        gpu->matmul_backward(d_o[1], NULL, NULL, d_dout, d_inp, d_w, N, C, OC, GRAD_SET);          \
        gpu->matmul_forward_x16(d_o[2], d_x, d_w, d_b, N, C, OC);                                  \
        gpu->matmul_gelu_forward(d_o[3], d_gpre, d_inp, d_w, d_b, N, C, OC);                       \
        gpu->matmul_backward_dgelu(d_o[4], NULL, NULL, d_dout, d_inp, d_pre, d_w, N, C, OC);       \
    } while (0)
    float *want[OPS], *want2[OPS], *got[OPS];
    WB_RUN(d_p + at); /* converting: the weights of params, then params2's */
    for (int k = 0; k < OPS; k++)
        want[k] = fetch(d_o[k], n[k]);
    WB_RUN(d_pw + at);
    for (int k = 0; k < OPS; k++)
        want2[k] = fetch(d_o[k], n[k]);
    static const char *op[OPS] = {"forward", "dinp", "forward_x16", "gelu_forward", "dgelu"};
    /* check[k] == want[k] bit for bit, for each op */
#define WB_CHECK(check, fmt)                                                                       \
    do {                                                                                           \
        for (int k = 0; k < OPS; k++) {                                                            \
            got[k] = fetch(d_o[k], n[k]);                                                          \
            snprintf(what, sizeof what, "weights_bf16 %dx%dx%d %s", N, C, OC, op[k]);              \
            CHECK(!memcmp(got[k], check[k], n[k] * sizeof(float)), "%s: " fmt, what);              \
            free(got[k]);                                                                          \
        }                                                                                          \
    } while (0)

    gpu->weights_bf16(d_p, P);
    WB_RUN(d_p + at);
    WB_CHECK(want, "the copy's results equal the converting GEMM's");
    backend_cuda_to_device(d_p, params2, P * sizeof(float)); /* behind the copy's back */
    WB_RUN(d_p + at);
    WB_CHECK(want, "read from the copy (the changed fp32 weight unseen)");
    gpu->weights_bf16_drop();
    WB_RUN(d_p + at);
    WB_CHECK(want2, "after the drop, the changed weight read");
    /* a copy of all but the weight's last element: the weight converted */
    backend_cuda_to_device(d_p, params, P * sizeof(float));
    gpu->weights_bf16(d_p, at + nw - 1);
    backend_cuda_to_device(d_p, params2, P * sizeof(float));
    WB_RUN(d_p + at);
    WB_CHECK(want2, "a weight past the copy's end converted");
    gpu->weights_bf16_drop();
#undef WB_RUN
#undef WB_CHECK
    for (int k = 0; k < OPS; k++)
        free(want[k]), free(want2[k]), backend_cuda_free(d_o[k]);
    free(params), free(params2), free(inp), free(b), free(dout), free(pre), free(x);
    backend_cuda_free(d_p), backend_cuda_free(d_inp), backend_cuda_free(d_b);
    backend_cuda_free(d_dout), backend_cuda_free(d_pre), backend_cuda_free(d_pw);
    backend_cuda_free(d_gpre), backend_cuda_free(d_x);
}

/* matmul_gelu_forward_x16 and matmul_backward_dgelu_x16: inp [N, C] in
 * bf16 through w [OC, C] (+ b) to pre (fp32) and out (bf16) [N, OC]; then
 * the backward of the next linear w2 [C, OC] reading out. */
static void test_matmul_gelu_x16(int N, int C, int OC)
{
    char what[128];
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    uint16_t *x = hrand16(ni, 1);
    float *w = hrand(nw, 1), *b = hrand(OC, 1), *pre = hrand(no, 1), *act = hrand(no, 1);
    uint16_t *out = malloc(no * sizeof *out);
    uint16_t *d_x = dcopy(x, ni * sizeof *x), *d_out = dcopy(out, no * sizeof *out);
    float *d_w = dcopyf(w, nw), *d_b = dcopyf(b, OC), *d_pre = dcopyf(pre, no);
    float *d_act = dcopyf(act, no);

    cpu->matmul_gelu_forward_x16(out, pre, x, w, b, N, C, OC);
    gpu->matmul_gelu_forward_x16(d_out, d_pre, d_x, d_w, d_b, N, C, OC);
    snprintf(what, sizeof what, "matmul_gelu_x16 %dx%dx%d pre", N, C, OC);
    compare_dev(what, d_pre, pre, no, R_RED);
    cpu->gelu_forward(act, pre, no); /* the fp32 op's output, rounded: out */
    snprintf(what, sizeof what, "matmul_gelu_x16 %dx%dx%d out on the CPU", N, C, OC);
    check_rounded(what, out, act, no);
    gpu->gelu_forward(d_act, d_pre, no);
    snprintf(what, sizeof what, "matmul_gelu_x16 %dx%dx%d out", N, C, OC);
    compare16(what, d_out, out, d_act, no);

    /* backward from the CPU's out and pre on both sides, against the
     * fp32-storage op on the widened out */
    float *w2 = hrand(nw, 1), *dout = hrand(ni, 1), *g0 = hrand(no + nw + C, 1);
    float *outw = widen16(out, no), *g[2], *d_g[2];
    float *d_w2 = dcopyf(w2, nw), *d_dout = dcopyf(dout, ni), *d_pre_cpu = dcopyf(pre, no);
    float *d_outw = dcopyf(outw, no);
    uint16_t *d_out_cpu = dcopy(out, no * sizeof *out);
    for (int k = 0; k < 2; k++) {
        g[k] = malloc((no + nw + C) * sizeof(float));
        memcpy(g[k], g0, (no + nw + C) * sizeof(float));
        d_g[k] = dcopyf(g0, no + nw + C);
    }
    cpu->matmul_backward_dgelu_x16(g[0], g[0] + no, g[0] + no + nw, dout, out, pre, w2, N, OC, C);
    cpu->matmul_backward_dgelu(g[1], g[1] + no, g[1] + no + nw, dout, outw, pre, w2, N, OC, C);
    gpu->matmul_backward_dgelu_x16(d_g[0], d_g[0] + no, d_g[0] + no + nw, d_dout, d_out_cpu,
                                   d_pre_cpu, d_w2, N, OC, C);
    gpu->matmul_backward_dgelu(d_g[1], d_g[1] + no, d_g[1] + no + nw, d_dout, d_outw, d_pre_cpu,
                               d_w2, N, OC, C);
    snprintf(what, sizeof what, "matmul dgelu_x16 %dx%dx%d", N, OC, C);
    float *gg = fetch(d_g[0], no + nw + C), *gg1 = fetch(d_g[1], no + nw + C);
    CHECK(!memcmp(g[0], g[1], (no + nw + C) * sizeof(float)),
          "%s: CPU's gradients equal to the fp32-storage op's", what);
    CHECK(!memcmp(gg, gg1, (no + nw + C) * sizeof(float)),
          "%s: GPU's gradients equal to the fp32-storage op's", what);
    compare(what, gg, g[0], no + nw + C, 2 * R_RED);

    free(gg), free(gg1), free(w2), free(dout), free(g0), free(outw);
    for (int k = 0; k < 2; k++)
        free(g[k]), backend_cuda_free(d_g[k]);
    backend_cuda_free(d_w2), backend_cuda_free(d_dout), backend_cuda_free(d_pre_cpu);
    backend_cuda_free(d_outw), backend_cuda_free(d_out_cpu);
    free(x), free(w), free(b), free(pre), free(act), free(out);
    backend_cuda_free(d_x), backend_cuda_free(d_out), backend_cuda_free(d_w);
    backend_cuda_free(d_b), backend_cuda_free(d_pre), backend_cuda_free(d_act);
}

/* norm_forward_x16: the norm alone (b NULL) and the residual add then the
 * norm, LayerNorm with and without bias and RMSNorm, against the CPU and
 * against the GPU's fp32-output ops */
static void test_norm_x16(int N, int C, int residual, int with_bias, int rms)
{
    char what[128];
    size_t n = (size_t)N * C;
    float *a = norm_input(n), *b = residual ? hrand(n, 0.5f) : NULL, *w = hrand(C, 1);
    float *bias = with_bias ? hrand(C, 1) : NULL, *res = hrand(n, 1), *mean = hrand(N, 1);
    float *rstd = hrand(N, 1), *y = hrand(n, 1);
    uint16_t *out = malloc(n * sizeof *out);
    float *d_a = dcopyf(a, n), *d_b = b ? dcopyf(b, n) : NULL, *d_w = dcopyf(w, C);
    float *d_bias = bias ? dcopyf(bias, C) : NULL, *d_res = dcopyf(res, n);
    float *d_res32 = dcopyf(res, n), *d_mean = dcopyf(mean, N), *d_rstd = dcopyf(rstd, N);
    float *d_mean32 = dcopyf(mean, N), *d_rstd32 = dcopyf(rstd, N), *d_y = dcopyf(y, n);
    uint16_t *d_out = dcopy(out, n * sizeof *out);
    const char *kind = rms ? "rmsnorm" : with_bias ? "layernorm" : "layernorm (no bias)";

    cpu->norm_forward_x16(res, out, mean, rstd, a, b, w, bias, N, C, 1e-5f, rms);
    gpu->norm_forward_x16(d_res, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C, 1e-5f, rms);
    /* the fp32-output ops, on the CPU (y) and the GPU (d_y) */
    if (residual) {
        cpu->residual_norm_forward(res, y, mean, rstd, a, b, w, bias, N, C, 1e-5f, rms);
        gpu->residual_norm_forward(d_res32, d_y, d_mean32, d_rstd32, d_a, d_b, d_w, d_bias, N, C,
                                   1e-5f, rms);
    } else if (rms) {
        cpu->rmsnorm_forward(y, rstd, a, w, N, C, 1e-5f);
        gpu->rmsnorm_forward(d_y, d_rstd32, d_a, d_w, N, C, 1e-5f);
    } else {
        cpu->layernorm_forward(y, mean, rstd, a, w, bias, N, C, 1e-5f);
        gpu->layernorm_forward(d_y, d_mean32, d_rstd32, d_a, d_w, d_bias, N, C, 1e-5f);
    }
    snprintf(what, sizeof what, "norm_x16 %s%s N=%d C=%d", residual ? "residual " : "", kind, N, C);
    char w2[160];
    snprintf(w2, sizeof w2, "%s out on the CPU", what);
    check_rounded(w2, out, y, n);
    compare16(what, d_out, out, d_y, n);
    snprintf(w2, sizeof w2, "%s rstd", what);
    compare_dev(w2, d_rstd, rstd, N, R_RED);
    if (!rms) {
        snprintf(w2, sizeof w2, "%s mean", what);
        compare_dev(w2, d_mean, mean, N, R_RED);
    }
    if (residual) {
        snprintf(w2, sizeof w2, "%s res", what);
        compare_dev(w2, d_res, res, n, 0);
    }
    free(a), free(b), free(w), free(bias), free(res), free(mean), free(rstd), free(y), free(out);
    backend_cuda_free(d_a), backend_cuda_free(d_b), backend_cuda_free(d_w);
    backend_cuda_free(d_bias), backend_cuda_free(d_res), backend_cuda_free(d_res32);
    backend_cuda_free(d_mean), backend_cuda_free(d_rstd), backend_cuda_free(d_mean32);
    backend_cuda_free(d_rstd32), backend_cuda_free(d_y), backend_cuda_free(d_out);
}

static void test_swiglu_x16(size_t n)
{
    char what[96];
    float *gate = act_input(n), *up = hrand(n, 2), *y = hrand(n, 1);
    uint16_t *out = malloc(n * sizeof *out);
    float *d_gate = dcopyf(gate, n), *d_up = dcopyf(up, n), *d_y = dcopyf(y, n);
    uint16_t *d_out = dcopy(out, n * sizeof *out);
    cpu->swiglu_forward_x16(out, gate, up, n);
    gpu->swiglu_forward_x16(d_out, d_gate, d_up, n);
    cpu->swiglu_forward(y, gate, up, n);
    gpu->swiglu_forward(d_y, d_gate, d_up, n);
    snprintf(what, sizeof what, "swiglu_x16 n=%zu out on the CPU", n);
    check_rounded(what, out, y, n);
    snprintf(what, sizeof what, "swiglu_x16 n=%zu out", n);
    compare16(what, d_out, out, d_y, n);
    free(gate), free(up), free(y), free(out);
    backend_cuda_free(d_gate), backend_cuda_free(d_up), backend_cuda_free(d_y);
    backend_cuda_free(d_out);
}

/* SwiGLU's gradients stored in bf16 (swiglu_backward_x16, SET), each the
 * bits of the same backend's fp32 swiglu_backward rounded, and the GPU's
 * against the CPU within the bf16 tolerance. */
static void test_swiglu_backward_x16(size_t n)
{
    char what[112];
    float *gate = act_input(n), *up = hrand(n, 2), *dout = hrand(n, 1);
    float *dg = hrand(n, 1), *du = hrand(n, 1);
    uint16_t *dg16 = hrand16(n, 1), *du16 = hrand16(n, 1);
    float *d_gate = dcopyf(gate, n), *d_up = dcopyf(up, n), *d_dout = dcopyf(dout, n);
    float *d_dg = dcopyf(dg, n), *d_du = dcopyf(du, n);
    uint16_t *d_dg16 = dcopy(dg16, n * sizeof *dg16), *d_du16 = dcopy(du16, n * sizeof *du16);
    cpu->swiglu_backward_x16(dg16, du16, dout, gate, up, n);
    gpu->swiglu_backward_x16(d_dg16, d_du16, d_dout, d_gate, d_up, n);
    cpu->swiglu_backward(dg, du, dout, gate, up, n, GRAD_SET);
    gpu->swiglu_backward(d_dg, d_du, d_dout, d_gate, d_up, n, GRAD_SET);
    snprintf(what, sizeof what, "swiglu_backward_x16 n=%zu dgate on the CPU", n);
    check_rounded(what, dg16, dg, n);
    snprintf(what, sizeof what, "swiglu_backward_x16 n=%zu dup on the CPU", n);
    check_rounded(what, du16, du, n);
    snprintf(what, sizeof what, "swiglu_backward_x16 n=%zu dgate", n);
    compare16(what, d_dg16, dg16, d_dg, n);
    snprintf(what, sizeof what, "swiglu_backward_x16 n=%zu dup", n);
    compare16(what, d_du16, du16, d_du, n);
    free(gate), free(up), free(dout), free(dg), free(du), free(dg16), free(du16);
    backend_cuda_free(d_gate), backend_cuda_free(d_up), backend_cuda_free(d_dout);
    backend_cuda_free(d_dg), backend_cuda_free(d_du), backend_cuda_free(d_dg16);
    backend_cuda_free(d_du16);
}

/* The head in bf16 (head_forward_x16, crossentropy_x16, matmul_backward_d16):
 * each against the fp32-storage op it replaces on the same backend (the
 * logits and dlogits exactly bf16_bits of the fp32 op's, the losses and
 * the backward GEMM equal bits: one rounding point each, no other), and
 * the GPU against the CPU twin (losses and GEMMs R_RED, bf16 outputs R_TC).
 * The cross-entropy runs fused (grad with losses) and apart (losses alone,
 * then grad alone: model_head_backward after an unfused forward). */
static void test_head_x16(int N, int C, int V, int Vp, float dloss)
{
    char what[160];
    const size_t ni = (size_t)N * C, nw = (size_t)Vp * C, nl = (size_t)N * Vp;
    uint16_t *x = hrand16(ni, 1);
    float *w = hrand(nw, 0.5f), *l32 = malloc(nl * sizeof *l32);
    uint16_t *l16 = malloc(nl * sizeof *l16);
    uint16_t *d_x = dcopy(x, ni * sizeof *x), *d_l16 = dcopy(l16, nl * sizeof *l16);
    float *d_w = dcopyf(w, nw), *d_l32 = dcopyf(l32, nl);

    snprintf(what, sizeof what, "head_forward_x16 %dx%dx%d", N, C, Vp);
    cpu->head_forward_x16(l16, x, w, N, C, Vp);
    cpu->matmul_forward_x16(l32, x, w, NULL, N, C, Vp);
    gpu->head_forward_x16(d_l16, d_x, d_w, N, C, Vp);
    gpu->matmul_forward_x16(d_l32, d_x, d_w, NULL, N, C, Vp);
    char w2[256];
    snprintf(w2, sizeof w2, "%s on the CPU = its fp32 op rounded", what);
    check_rounded(w2, l16, l32, nl);
    compare16(what, d_l16, l16, d_l32, nl);

    /* the cross-entropy on the CPU's bf16 logits, on both backends */
    int32_t *tgt = malloc(N * sizeof *tgt);
    for (int r = 0; r < N; r++)
        tgt[r] = r % 5 == 1 ? -1 : irand(0, V);
    tgt[N - 1] = V - 1;
    int32_t *d_tgt = dcopy(tgt, N * sizeof *tgt);
    float *wide = widen16(l16, nl), *losses = malloc(N * sizeof *losses);
    float *ref_losses = malloc(N * sizeof *ref_losses);
    uint16_t *dl16 = malloc(nl * sizeof *dl16);
    memcpy(dl16, l16, nl * sizeof *dl16);
    float *d_losses = dcopyf(losses, N), *d_losses2 = dcopyf(losses, N);
    float *d_wide = dcopyf(wide, N * (size_t)Vp), *d_ref_losses = dcopyf(losses, N);
    uint16_t *d_dl16 = dcopy(l16, nl * sizeof *l16), *d_apart = dcopy(l16, nl * sizeof *l16);
    cpu->crossentropy_x16(losses, dl16, tgt, 1, dloss, N, V, Vp);
    cpu->crossentropy_fused(ref_losses, wide, tgt, dloss, N, V, Vp); /* wide: dlogits now */
    gpu->crossentropy_x16(d_losses, d_dl16, d_tgt, 1, dloss, N, V, Vp);
    gpu->crossentropy_fused(d_ref_losses, d_wide, d_tgt, dloss, N, V, Vp);
    gpu->crossentropy_x16(d_losses2, d_apart, d_tgt, 0, 0.0f, N, V, Vp);
    gpu->crossentropy_x16(NULL, d_apart, d_tgt, 1, dloss, N, V, Vp);
    snprintf(what, sizeof what, "crossentropy_x16 N=%d V=%d Vp=%d", N, V, Vp);
    CHECK(!memcmp(losses, ref_losses, N * sizeof *losses),
          "%s: CPU's losses = the fp32 op's on the rounded logits", what);
    snprintf(w2, sizeof w2, "%s dlogits on the CPU = the fp32 op's rounded", what);
    check_rounded(w2, dl16, wide, nl);
    snprintf(w2, sizeof w2, "%s losses", what);
    compare_dev(w2, d_losses, losses, N, R_RED);
    snprintf(w2, sizeof w2, "%s dlogits", what);
    compare16(w2, d_dl16, dl16, d_wide, nl);
    float *gl = fetch(d_losses, N), *gl2 = fetch(d_losses2, N), *glr = fetch(d_ref_losses, N);
    uint16_t *g16 = fetch16(d_dl16, nl), *ga16 = fetch16(d_apart, nl);
    CHECK(!memcmp(gl, glr, N * sizeof *gl), "%s: GPU's losses = the fp32 op's", what);
    CHECK(!memcmp(gl, gl2, N * sizeof *gl) && !memcmp(g16, ga16, nl * sizeof *g16),
          "%s: GPU's forward and backward apart = fused", what);
    int zeros_ok = 1;
    for (int r = 0; r < N; r++)
        for (int v = 0; v < Vp; v++)
            if (tgt[r] < 0 || v >= V)
                zeros_ok &= g16[(size_t)r * Vp + v] == 0 && dl16[(size_t)r * Vp + v] == 0;
    CHECK(zeros_ok, "%s: ignored rows and padding get exactly 0", what);

    /* the backward GEMMs on the CPU's bf16 dlogits */
    float *dwide = widen16(dl16, nl), *g0 = hrand(ni + nw, 1);
    float *g[2], *d_g[2];
    for (int k = 0; k < 2; k++) {
        g[k] = malloc((ni + nw) * sizeof(float)), memcpy(g[k], g0, (ni + nw) * sizeof(float));
        d_g[k] = dcopyf(g0, ni + nw);
    }
    uint16_t *d_dlc = dcopy(dl16, nl * sizeof *dl16);
    float *d_dwide = dcopyf(dwide, nl);
    cpu->matmul_backward_d16(g[0], g[0] + ni, dl16, x, w, N, C, Vp, GRAD_ADD);
    cpu->matmul_backward_x16(g[1], g[1] + ni, NULL, dwide, x, w, N, C, Vp, GRAD_ADD);
    gpu->matmul_backward_d16(d_g[0], d_g[0] + ni, d_dlc, d_x, d_w, N, C, Vp, GRAD_ADD);
    gpu->matmul_backward_x16(d_g[1], d_g[1] + ni, NULL, d_dwide, d_x, d_w, N, C, Vp, GRAD_ADD);
    snprintf(what, sizeof what, "matmul_backward_d16 %dx%dx%d", N, C, Vp);
    float *gg = fetch(d_g[0], ni + nw), *gg1 = fetch(d_g[1], ni + nw);
    CHECK(!memcmp(g[0], g[1], (ni + nw) * sizeof(float)),
          "%s: CPU's gradients = the fp32-dout op's on the widened dlogits", what);
    CHECK(!memcmp(gg, gg1, (ni + nw) * sizeof(float)),
          "%s: GPU's gradients = the fp32-dout op's on the widened dlogits", what);
    compare(what, gg, g[0], ni + nw, R_RED);
    /* GRAD_SET: dinp written over NaN (dweight adds once more) */
    for (int k = 0; k < 2; k++)
        nan_fill(g[k], d_g[k], ni);
    cpu->matmul_backward_d16(g[0], g[0] + ni, dl16, x, w, N, C, Vp, GRAD_SET);
    cpu->matmul_backward_x16(g[1], g[1] + ni, NULL, dwide, x, w, N, C, Vp, GRAD_SET);
    gpu->matmul_backward_d16(d_g[0], d_g[0] + ni, d_dlc, d_x, d_w, N, C, Vp, GRAD_SET);
    gpu->matmul_backward_x16(d_g[1], d_g[1] + ni, NULL, d_dwide, d_x, d_w, N, C, Vp, GRAD_SET);
    free(gg), free(gg1);
    gg = fetch(d_g[0], ni + nw), gg1 = fetch(d_g[1], ni + nw);
    snprintf(what, sizeof what, "matmul_backward_d16 %dx%dx%d, dinp SET over NaN", N, C, Vp);
    CHECK(!memcmp(gg, gg1, (ni + nw) * sizeof(float)),
          "%s: GPU's gradients = the fp32-dout op's on the widened dlogits", what);
    compare(what, gg, g[0], ni + nw, R_RED);

    free(gg), free(gg1), free(dwide), free(g0), free(gl), free(gl2), free(glr), free(g16);
    free(ga16);
    for (int k = 0; k < 2; k++)
        free(g[k]), backend_cuda_free(d_g[k]);
    free(x), free(w), free(l32), free(l16), free(tgt), free(wide), free(losses), free(ref_losses);
    free(dl16);
    backend_cuda_free(d_x), backend_cuda_free(d_l16), backend_cuda_free(d_w);
    backend_cuda_free(d_l32), backend_cuda_free(d_tgt), backend_cuda_free(d_losses);
    backend_cuda_free(d_losses2), backend_cuda_free(d_wide), backend_cuda_free(d_ref_losses);
    backend_cuda_free(d_dl16), backend_cuda_free(d_apart), backend_cuda_free(d_dlc);
    backend_cuda_free(d_dwide);
}

/* ----------------------------------------------------------------- rope */

/* pos: NULL (row n at pos0 + n % T) or positions per row. */
static void test_rope(int B, int T, int H, int KVH, int hs, RopeFreq rf, int pos0,
                      const int32_t *pos)
{
    char what[160];
    int N = B * T;
    size_t n = (size_t)N * (H + 2 * KVH) * hs;
    float *qkv = hrand(n, 1), *d_qkv = dcopyf(qkv, n);
    int32_t *d_pos = pos ? dcopy(pos, (size_t)N * sizeof *pos) : NULL;
    cpu->rope_forward(qkv, pos, N, T, pos0, H, KVH, hs, rf);
    gpu->rope_forward(d_qkv, d_pos, N, T, pos0, H, KVH, hs, rf);
    snprintf(what, sizeof what,
             "rope B=%d T=%d H=%d KVH=%d hs=%d theta=%g factor=%g pos0=%d%s forward", B, T, H, KVH,
             hs, rf.theta, rf.factor, pos0, pos ? " documents" : "");
    compare_dev(what, d_qkv, qkv, n, R_ELEM);
    float *g = hrand(n, 1), *d_g = dcopyf(g, n);
    cpu->rope_backward(g, pos, N, T, pos0, H, KVH, hs, rf);
    gpu->rope_backward(d_g, d_pos, N, T, pos0, H, KVH, hs, rf);
    snprintf(what, sizeof what, "rope B=%d T=%d H=%d KVH=%d hs=%d pos0=%d%s backward", B, T, H, KVH,
             hs, pos0, pos ? " documents" : "");
    compare_dev(what, d_g, g, n, R_ELEM);
    free(qkv), free(g);
    backend_cuda_free(d_qkv), backend_cuda_free(d_g), backend_cuda_free(d_pos);
}

/* ------------------------------------------------------------ attention */

/* The tensor-core attention (backend_cuda_bf16, head sizes 64 and 128)
 * while attn_tc: q, kv and dout rounded to bf16 before both backends see
 * them, the CPU's fp32 attention the reference, out and the gradients
 * within attn_rtol = R_TC (lse stays R_RED: its scores are fp32 sums of
 * exact products), see docs/cuda.md "bf16 attention". */
static int attn_tc;
static const char *attn_tag = "";
static double attn_rtol = R_RED;

static void round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = bf16_round(x[i]);
}

/* One call with the arguments a (a->pos: host positions, copied to the
 * device here).  q and kv are separate buffers unless self (then a->Tq ==
 * a->Tk and kv is q, as in training).  out and lse start random on both
 * backends: with a->merge that is the partial result merged into (lse kept
 * finite), without it everything must be overwritten; dq and dkv start
 * random, so the accumulation (+=) is checked too. */
static void test_attention_args(const AttnArgs *a, int self, const char *label)
{
    char what[192];
    const int B = a->B, H = a->H, KVH = a->KVH, hs = a->hs;
    const int W = (H + 2 * KVH) * hs, kvw = a->kv_packed ? 2 * KVH * hs : W;
    size_t nq = (size_t)B * a->Tq * W, nkv = (size_t)B * a->Tk * kvw;
    size_t no = (size_t)B * a->Tq * H * hs, nl = (size_t)B * H * a->Tq;
    float *q = hrand(nq, 2), *kv = self ? q : hrand(nkv, 2), *out = hrand(no, 1);
    float *lse = hrand(nl, 1), *dout = hrand(no, 1), *dq = hrand(nq, 1);
    if (a->merge) /* rows merged into with no key yet: where this block has none either, */
        for (size_t i = 0; i < nl; i += 3) /* out stays as it is, and its copy is written */
            lse[i] = -INFINITY;
    if (attn_tc) { /* the bf16 kernels' operands, exact in bf16 on both sides */
        round_bf16(q, nq), round_bf16(dout, no);
        if (!self)
            round_bf16(kv, nkv);
    }
    float *dkv = self ? dq : hrand(nkv, 1);
    float *d_q = dcopyf(q, nq), *d_kv = self ? d_q : dcopyf(kv, nkv), *d_out = dcopyf(out, no);
    float *d_lse = dcopyf(lse, nl), *d_dout = dcopyf(dout, no), *d_dq = dcopyf(dq, nq);
    float *d_dkv = self ? d_dq : dcopyf(dkv, nkv);
    AttnArgs ga = *a, ca = *a;
    int32_t *d_pos = a->pos ? dcopy(a->pos, (size_t)B * a->Tq * sizeof(int32_t)) : NULL;
    ga.pos = d_pos;
    /* out's bf16 copy (AttnArgs.out16), from random bits */
    uint16_t *out16 = hrand16(no, 1), *d_out16 = dcopy(out16, no * sizeof *out16);
    ca.out16 = out16, ga.out16 = d_out16;

    cpu->attention_forward(out, lse, q, kv, &ca);
    gpu->attention_forward(d_out, d_lse, d_q, d_kv, &ga);
    snprintf(what, sizeof what, "attention%s B=%d Tq=%d Tk=%d H=%d KVH=%d hs=%d%s out16 on the CPU",
             attn_tag, B, a->Tq, a->Tk, H, KVH, hs, label);
    check_rounded(what, out16, out, no);
    snprintf(what, sizeof what, "attention%s B=%d Tq=%d Tk=%d H=%d KVH=%d hs=%d%s out16", attn_tag,
             B, a->Tq, a->Tk, H, KVH, hs, label);
    uint16_t *got16 = fetch16(d_out16, no);
    float *got = fetch(d_out, no);
    check_rounded(what, got16, got, no);
    free(got16), free(got), free(out16), backend_cuda_free(d_out16);
    ga.out16 = NULL;
    snprintf(what, sizeof what, "attention%s B=%d Tq=%d Tk=%d H=%d KVH=%d hs=%d%s lse", attn_tag, B,
             a->Tq, a->Tk, H, KVH, hs, label);
    compare_dev(what, d_lse, lse, nl, R_RED);
    snprintf(what, sizeof what, "attention%s B=%d Tq=%d Tk=%d H=%d KVH=%d hs=%d%s out", attn_tag, B,
             a->Tq, a->Tk, H, KVH, hs, label);
    compare_dev(what, d_out, out, no, attn_rtol);

    /* each backend from its own out and lse, as in training */
    cpu->attention_backward(dq, dkv, dout, q, kv, out, lse, a);
    gpu->attention_backward(d_dq, d_dkv, d_dout, d_q, d_kv, d_out, d_lse, &ga);
    snprintf(what, sizeof what, "attention%s B=%d Tq=%d Tk=%d H=%d KVH=%d hs=%d%s dq", attn_tag, B,
             a->Tq, a->Tk, H, KVH, hs, label);
    compare_dev(what, d_dq, dq, nq, attn_rtol);
    if (!self) {
        snprintf(what, sizeof what, "attention%s B=%d Tq=%d Tk=%d H=%d KVH=%d hs=%d%s dkv",
                 attn_tag, B, a->Tq, a->Tk, H, KVH, hs, label);
        compare_dev(what, d_dkv, dkv, nkv, attn_rtol);
    }

    /* GRAD_SET: dq and dkv written over NaN; what the call does not write
     * (dq's key and value heads, dkv's query heads, when kv is separate)
     * stays NaN on both backends, which compare accepts */
    AttnArgs as = *a;
    as.grad = ga.grad = GRAD_SET;
    nan_fill(dq, d_dq, nq);
    if (!self)
        nan_fill(dkv, d_dkv, nkv);
    cpu->attention_backward(dq, dkv, dout, q, kv, out, lse, &as);
    gpu->attention_backward(d_dq, d_dkv, d_dout, d_q, d_kv, d_out, d_lse, &ga);
    snprintf(what, sizeof what, "attention%s B=%d Tq=%d Tk=%d H=%d KVH=%d hs=%d%s dq SET", attn_tag,
             B, a->Tq, a->Tk, H, KVH, hs, label);
    compare_dev(what, d_dq, dq, nq, attn_rtol);
    if (!self) {
        snprintf(what, sizeof what, "attention%s B=%d Tq=%d Tk=%d H=%d KVH=%d hs=%d%s dkv SET",
                 attn_tag, B, a->Tq, a->Tk, H, KVH, hs, label);
        compare_dev(what, d_dkv, dkv, nkv, attn_rtol);
    }

    free(q), free(out), free(lse), free(dout), free(dq);
    if (!self)
        free(kv), free(dkv), backend_cuda_free(d_kv), backend_cuda_free(d_dkv);
    backend_cuda_free(d_q), backend_cuda_free(d_out), backend_cuda_free(d_lse);
    backend_cuda_free(d_dout), backend_cuda_free(d_dq), backend_cuda_free(d_pos);
}

static void test_attention(int B, int T, int H, int KVH, int hs)
{
    const AttnArgs a = attn_args(B, T, H, KVH, hs);
    test_attention_args(&a, 1, "");
}

/* cuDNN's fused attention (kernels/attention_cudnn.cu) where it loads (a
 * GPU machine with libcudnn.so.9 on the loader's path or
 * TRIDENT_CUDNN_LIB): shapes it serves (MHA, T a multiple of 128), against
 * the CPU within the tensor-core tolerance, then that it is still on: its
 * first call of a shape compares it with trident's kernel and turns it
 * off on a mismatch, which would let the comparisons above pass on
 * trident's result.  Without cuDNN: a SKIP line and no check counted. */
static void test_attention_cudnn(void)
{
    if (!backend_cuda_cudnn_attention(1)) {
        printf("SKIP: cuDNN attention (not loaded; nothing checked)\n");
        return;
    }
    attn_tag = " cudnn";
    test_attention(2, 128, 4, 4, 64);  /* B > 1, hs 64 */
    test_attention(1, 256, 2, 2, 128); /* hs 128, two 128-row blocks */
    /* the same shapes again: cuDNN alone (the first call of a shape ran
     * trident's kernel beside it for the self-check), its out16 too */
    AttnArgs a = attn_args(2, 128, 4, 4, 64);
    test_attention_args(&a, 1, " again");
    a = attn_args(1, 256, 2, 2, 128);
    test_attention_args(&a, 1, " again");
    CHECK(backend_cuda_cudnn_attention(0),
          "cuDNN attention still on after its self-checks (stderr says why not)");
    attn_tag = " tc";
}

/* Packed documents (whole sequences, self-attention), and a block pair of a
 * sequence split over ranks: query rows at q_pos0, keys at k_pos0 (before,
 * overlapping or after the queries), separate buffers, keys in either
 * layout, merged or not, with documents across the blocks. */
static void test_attention_blocks(int B, int H, int KVH, int hs)
{
    const int lens[] = {5, 1, 40, 17, 3};
    int32_t *pos = doc_positions(B, 70, lens, 5);
    AttnArgs a = attn_args(B, 70, H, KVH, hs);
    a.pos = pos;
    test_attention_args(&a, 1, " documents");

    const int qp[] = {64, 32, 0, 96}, kp[] = {0, 32, 64, 40};
    for (int i = 0; i < 4; i++) {
        AttnArgs c = attn_args(B, 32, H, KVH, hs);
        c.Tk = 50, c.q_pos0 = qp[i], c.k_pos0 = kp[i];
        c.kv_packed = i % 2, c.merge = i >= 2;
        char label[96];
        snprintf(label, sizeof label, " q_pos0=%d k_pos0=%d packed=%d merge=%d", qp[i], kp[i],
                 c.kv_packed, c.merge);
        test_attention_args(&c, 0, label);
        /* documents: this block's rows are rows qp.. of a packed sequence */
        int32_t *whole = doc_positions(B, 128, lens, 5), *mine = malloc((size_t)B * 32 * 4);
        for (int b = 0; b < B; b++)
            memcpy(mine + (size_t)b * 32, whole + (size_t)b * 128 + qp[i], 32 * sizeof *mine);
        c.pos = mine;
        strncat(label, " documents", sizeof label - strlen(label) - 1);
        test_attention_args(&c, 0, label);
        free(whole), free(mine);
    }
    free(pos);
}

/* The tensor-core product alone (kernels/mma.cuh through
 * backend_cuda_mma_check): D = A B + C for one 16x8x16 tile, against the
 * plain product.  Small integers first, where every sum is exact in fp32,
 * so any element a lane loads or stores at the wrong place shows as an
 * inequality; then random bf16 values (products exact, 17-term fp32 sums
 * in another order: R_ELEM).  B by the per-lane formulas, then by
 * ldmatrix.x2.trans (mma.cuh) from shared memory. */
static void test_mma(void)
{
    for (int exact = 1; exact >= 0; exact--) {
        float a[16 * 16], b[16 * 8], c[16 * 8], want[16 * 8];
        for (int i = 0; i < 16 * 16; i++)
            a[i] = exact ? (float)irand(-8, 8) : bf16_round((float)(4 * urand() - 2));
        for (int i = 0; i < 16 * 8; i++) {
            b[i] = exact ? (float)irand(-8, 8) : bf16_round((float)(4 * urand() - 2));
            c[i] = exact ? (float)irand(-100, 100) : (float)(4 * urand() - 2);
        }
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) {
                double acc = c[r * 8 + n];
                for (int k = 0; k < 16; k++)
                    acc += (double)a[r * 16 + k] * b[k * 8 + n];
                want[r * 8 + n] = (float)acc;
            }
        float *d_a = dcopyf(a, 16 * 16), *d_b = dcopyf(b, 16 * 8), *d_c = dcopyf(c, 16 * 8);
        float *d_d = backend_cuda_calloc(16 * 8 * sizeof(float), "mma d");
        for (int ldm = 0; ldm <= 1; ldm++) {
            char what[96];
            snprintf(what, sizeof what, "mma m16n8k16 bf16, %s%s", exact ? "integers" : "random",
                     ldm ? ", B by ldmatrix.trans" : "");
            backend_cuda_mma_check(d_d, d_a, d_b, d_c, ldm);
            compare_dev(what, d_d, want, 16 * 8, exact ? R_EXACT : R_ELEM);
        }
        backend_cuda_free(d_a), backend_cuda_free(d_b), backend_cuda_free(d_c);
        backend_cuda_free(d_d);
    }
}

/* ------------------------------------------------------------- decoding */

/* A sequence fed in pieces from position P0 (a prompt: half the rows, or
 * all but 8 past 16; then single tokens and three rows in turn) through
 * rope_decode and attention_decode on both backends: the rotated rows, the
 * caches and the outputs agree, and the rows below P0 stay as they were.
 * The caches start random, the same on both, so that positions below P0
 * stand for an earlier prompt: a long cache costs the emulation only the
 * rows fed.  The GPU reads the position from device memory (at) for the
 * prompt and the single tokens, as the decoder does, and gets pos0 for
 * three rows.  The last piece once more gives the same bits.
 *
 * R_RED: the CUDA kernel splits the positions into chunks and lane groups
 * and adds the softmax's terms up in another order than the CPU's one pass
 * (each output a weighted mean of up to 1100 values here, fp32 rounding of
 * ~6e-8 a term: the emulation passes at rtol 1e-6 and fails at 3e-7, so
 * 1e-4 leaves room for the GPU's expf and FMA contraction; a split,
 * position or head left out moves outputs by percents). */
static void test_decode(int T, int P0, int H, int KVH, int hs)
{
    char what[128];
    const int W = (H + 2 * KVH) * hs, O = H * hs;
    const size_t nq = (size_t)T * W, no = (size_t)T * O, nc = (size_t)T * KVH * hs;
    float *qkv = hrand(nq, 2), *d_qkv = dcopyf(qkv, nq);
    float *out = hrand(no, 1), *d_out = dcopyf(out, no);
    float *kc = hrand(nc, 1), *vc = hrand(nc, 1), *d_kc = dcopyf(kc, nc), *d_vc = dcopyf(vc, nc);
    int32_t *d_at = gpu->alloc(sizeof(int32_t), "position");
    int last = P0, last_n = 0;
    for (int pos = P0; pos < T;) {
        const int n = pos != P0     ? pos + 3 < T && pos % 2 ? 3 : 1
                      : T - P0 > 16 ? T - P0 - 8
                                    : (T - P0 + 1) / 2;
        const int m = pos + n > T ? T - pos : n;
        cpu->rope_decode(qkv + (size_t)pos * W, m, pos, H, KVH, hs, (RopeFreq){.theta = 1e4});
        gpu->rope_decode(d_qkv + (size_t)pos * W, m, pos, H, KVH, hs, (RopeFreq){.theta = 1e4});
        gpu->to_backend(d_at, &pos, sizeof pos);
        cpu->attention_decode(out + (size_t)pos * O, qkv + (size_t)pos * W, kc, vc, m, NULL, pos, H,
                              KVH, hs);
        const int by_at = m != 3;
        gpu->attention_decode(d_out + (size_t)pos * O, d_qkv + (size_t)pos * W, d_kc, d_vc, m,
                              by_at ? d_at : NULL, by_at ? 0 : pos, H, KVH, hs);
        last = pos, last_n = m;
        pos += m;
    }
    snprintf(what, sizeof what, "decode T=%d from %d H=%d KVH=%d hs=%d", T, P0, H, KVH, hs);
    char part[160];
    snprintf(part, sizeof part, "%s rope", what);
    compare_dev(part, d_qkv, qkv, nq, R_ELEM);
    snprintf(part, sizeof part, "%s key cache", what);
    compare_dev(part, d_kc, kc, nc, R_ELEM);
    snprintf(part, sizeof part, "%s value cache", what);
    compare_dev(part, d_vc, vc, nc, R_ELEM);
    snprintf(part, sizeof part, "%s out", what);
    compare_dev(part, d_out + (size_t)P0 * O, out + (size_t)P0 * O, no - (size_t)P0 * O, R_RED);
    if (P0 > 0) {
        snprintf(part, sizeof part, "%s out below %d", what, P0);
        compare_dev(part, d_out, out, (size_t)P0 * O, R_EXACT);
    }
    const size_t nl = (size_t)last_n * O;
    float *d_again = backend_cuda_malloc(nl * sizeof(float), "decode again");
    gpu->attention_decode(d_again, d_qkv + (size_t)last * W, d_kc, d_vc, last_n, NULL, last, H, KVH,
                          hs);
    float *first = fetch(d_out + (size_t)last * O, nl), *again = fetch(d_again, nl);
    CHECK(memcmp(first, again, nl * sizeof *first) == 0, "%s: the last %d rows' bits again", what,
          last_n);
    free(first), free(again);
    gpu->release(d_at);
    free(qkv), free(out), free(kc), free(vc);
    backend_cuda_free(d_qkv), backend_cuda_free(d_out), backend_cuda_free(d_kc);
    backend_cuda_free(d_vc), backend_cuda_free(d_again);
}

/* decode_linear, each epilogue, against the decoder's CPU path (decode.c,
 * prenorm, linear and layer: the norm op, matmul_forward, then
 * gelu_forward or add; SwiGLU (up to 4 rows): the up projection's
 * matmul_forward and swiglu_forward).  out starts random: the residual reads it, the others overwrite
 * it.  norm: none, LayerNorm or RMSNorm (its rows recomputed in every
 * block); skew: the device's x and norm weight one float past 16 bytes
 * (the scalar loads).  x has a mean far from 0 (LayerNorm's shift
 * matters).  R_RED: the GEMV and the norm sum in their own order (n up to
 * 4), cuBLAS above. */
static void test_decode_linear(int n, int C, int OC, int bias, const char *norm, int skew)
{
    static const char *const epi_name[] = {"bias", "gelu", "residual", "swiglu"};
    const size_t nx = (size_t)n * C, nw = (size_t)OC * C, no = (size_t)n * OC;
    const int rms = !strcmp(norm, "rmsnorm"), ln = !strcmp(norm, "layernorm");
    const float eps = 1e-5f;
    float *x = hrand(nx, 1), *w = hrand(nw, 1), *b = bias ? hrand(OC, 1) : NULL;
    float *g = hrand(C, 1), *gb = hrand(C, 1), *xn = malloc(nx * sizeof *xn);
    float *mean = malloc((size_t)n * sizeof *mean), *rstd = malloc((size_t)n * sizeof *rstd);
    for (size_t i = 0; i < nx; i++)
        x[i] += 3.0f;
    float *d_xs = backend_cuda_malloc((nx + 1) * sizeof(float), "test buffer");
    float *d_gs = backend_cuda_malloc((size_t)(C + 1) * sizeof(float), "test buffer");
    float *d_x = d_xs + skew, *d_g = d_gs + skew;
    backend_cuda_to_device(d_x, x, nx * sizeof *x);
    backend_cuda_to_device(d_g, g, (size_t)C * sizeof *g);
    float *d_gb = dcopyf(gb, C), *d_w = dcopyf(w, nw), *d_b = bias ? dcopyf(b, OC) : NULL;
    float *up = hrand(nw, 1), *d_up = dcopyf(up, nw), *q = malloc(no * sizeof *q);
    const DecodeNorm nm = {d_g, rms ? NULL : d_gb, eps, rms};
    const float *in = x;
    if (ln)
        cpu->layernorm_forward(xn, mean, rstd, x, g, gb, n, C, eps);
    if (rms)
        cpu->rmsnorm_forward(xn, rstd, x, g, n, C, eps);
    if (ln || rms)
        in = xn;
    float *p = malloc(no * sizeof *p);
    cpu->matmul_forward(p, in, w, b, n, C, OC);
    cpu->matmul_forward(q, in, up, NULL, n, C, OC);
    const int last = n <= DECODE_GEMV_ROWS ? DECODE_SWIGLU : DECODE_RESIDUAL;
    for (int e = DECODE_BIAS; e <= last; e++) {
        float *out = hrand(no, 1), *d_out = dcopyf(out, no);
        if (e == DECODE_BIAS)
            memcpy(out, p, no * sizeof *out);
        else if (e == DECODE_GELU)
            cpu->gelu_forward(out, p, no);
        else if (e == DECODE_RESIDUAL)
            cpu->add(out, out, p, no);
        else
            cpu->swiglu_forward(out, p, q, no);
        gpu->decode_linear(d_out, d_x, ln || rms ? &nm : NULL, d_w,
                           e == DECODE_SWIGLU ? d_up : NULL, d_b, n, C, OC, (DecodeEpi)e);
        char what[160];
        snprintf(what, sizeof what, "decode_linear %s n=%d C=%d OC=%d%s%s%s%s", epi_name[e], n, C,
                 OC, bias ? "" : " no bias", ln || rms ? " " : "", ln || rms ? norm : "",
                 skew ? " skewed" : "");
        compare_dev(what, d_out, out, no, R_RED);
        free(out);
        backend_cuda_free(d_out);
    }
    free(x), free(w), free(b), free(p), free(g), free(gb), free(xn), free(mean), free(rstd);
    free(up), free(q);
    backend_cuda_free(d_xs), backend_cuda_free(d_gs), backend_cuda_free(d_gb);
    backend_cuda_free(d_w), backend_cuda_free(d_up);
    if (d_b)
        backend_cuda_free(d_b);
}

/* --------------------------------------------------------- crossentropy */

static void test_crossentropy(int N, int V, int Vp)
{
    char what[128];
    size_t n = (size_t)N * Vp;
    int32_t *tgt = malloc(N * sizeof *tgt);
    for (int r = 0; r < N; r++)
        tgt[r] = r % 5 == 1 ? -1 : r % 5 == 3 ? -7 : irand(0, V);
    tgt[N - 1] = V - 1; /* the last real column */
    float *logits = hrand(n, 4), *losses = hrand(N, 1);
    for (int r = 0; r < N; r++)
        for (int v = V; v < Vp; v++)
            logits[(size_t)r * Vp + v] = 30; /* would dominate if counted */
    int32_t *d_tgt = dcopy(tgt, N * sizeof *tgt);
    float *d_logits = dcopyf(logits, n), *d_losses = dcopyf(losses, N);

    cpu->crossentropy_forward(losses, logits, tgt, N, V, Vp);
    gpu->crossentropy_forward(d_losses, d_logits, d_tgt, N, V, Vp);
    snprintf(what, sizeof what, "crossentropy N=%d V=%d Vp=%d losses", N, V, Vp);
    compare_dev(what, d_losses, losses, N, R_RED);

    cpu->crossentropy_backward(logits, tgt, 0.7f, N, V, Vp);
    gpu->crossentropy_backward(d_logits, d_tgt, 0.7f, N, V, Vp);
    float *got = fetch(d_logits, n);
    snprintf(what, sizeof what, "crossentropy N=%d V=%d Vp=%d dlogits", N, V, Vp);
    compare(what, got, logits, n, R_RED);
    int zeros_ok = 1;
    for (int r = 0; r < N; r++)
        for (int v = 0; v < Vp; v++)
            if (tgt[r] < 0 || v >= V)
                zeros_ok &= got[(size_t)r * Vp + v] == 0;
    CHECK(zeros_ok, "crossentropy N=%d V=%d Vp=%d: ignored rows and padding get exactly 0", N, V,
          Vp);
    free(got), free(tgt), free(logits), free(losses);
    backend_cuda_free(d_tgt), backend_cuda_free(d_logits), backend_cuda_free(d_losses);
}

/* crossentropy_fused against the CPU's forward then backward (the
 * reference): per-row losses and dlogits in place, ignored rows and
 * padding exactly 0, with -inf logits (a thread's first column among
 * them) and a per-micro-batch dloss. */
static void test_crossentropy_fused(int N, int V, int Vp, float dloss)
{
    char what[128];
    size_t n = (size_t)N * Vp;
    int32_t *tgt = malloc(N * sizeof *tgt);
    for (int r = 0; r < N; r++)
        tgt[r] = r % 5 == 1 ? -1 : r % 5 == 3 ? -7 : irand(0, V);
    tgt[N - 1] = V - 1;
    float *logits = hrand(n, 4), *losses = hrand(N, 1);
    for (int r = 0; r < N; r++)
        for (int v = V; v < Vp; v++)
            logits[(size_t)r * Vp + v] = 30;
    for (int v = 0; v < V && v < 300; v += 3) /* row 0: masked columns */
        logits[v] = -INFINITY;
    tgt[0] = V > 1 ? 1 : 0;
    if (V > 1)
        logits[1] = 0.5f;
    int32_t *d_tgt = dcopy(tgt, N * sizeof *tgt);
    float *d_logits = dcopyf(logits, n), *d_losses = dcopyf(losses, N);
    cpu->crossentropy_forward(losses, logits, tgt, N, V, Vp);
    cpu->crossentropy_backward(logits, tgt, dloss, N, V, Vp);
    gpu->crossentropy_fused(d_losses, d_logits, d_tgt, dloss, N, V, Vp);
    snprintf(what, sizeof what, "crossentropy_fused N=%d V=%d Vp=%d losses", N, V, Vp);
    compare_dev(what, d_losses, losses, N, R_RED);
    float *got = fetch(d_logits, n);
    snprintf(what, sizeof what, "crossentropy_fused N=%d V=%d Vp=%d dlogits", N, V, Vp);
    compare(what, got, logits, n, R_RED);
    int zeros_ok = 1;
    for (int r = 0; r < N; r++)
        for (int v = 0; v < Vp; v++)
            if (tgt[r] < 0 || v >= V)
                zeros_ok &= got[(size_t)r * Vp + v] == 0;
    CHECK(zeros_ok, "crossentropy_fused N=%d V=%d Vp=%d: ignored rows and padding get exactly 0", N,
          V, Vp);
    free(got), free(tgt), free(logits), free(losses);
    backend_cuda_free(d_tgt), backend_cuda_free(d_logits), backend_cuda_free(d_losses);
}

/* ------------------------------------------ vocabulary-parallel loss */

/* Targets for a rank holding global ids [vocab_start, vocab_start + V):
 * the first rows are set so that every case is there whatever the draw
 * (its first and last id, the ids just outside it on both sides, two
 * ignored values), the rest drawn from [-2, vocab_start + V + 20). */
static int32_t *vocab_targets(int N, int V, int vocab_start)
{
    int32_t *tgt = malloc(N * sizeof *tgt);
    const int32_t set[] = {vocab_start, vocab_start + V - 1, vocab_start - 1, vocab_start + V, -1,
                           -7};
    for (int n = 0; n < N; n++) {
        if (n < 6) {
            tgt[n] = set[n];
            continue;
        }
        tgt[n] = irand(-2, vocab_start + V + 20);
        if (tgt[n] >= 0 && (tgt[n] < vocab_start || tgt[n] >= vocab_start + V))
            tgt[n] = tgt[n] % 2 ? tgt[n] : -1 - tgt[n] % 3; /* some more ignored */
    }
    /* With V == 0 or vocab_start == 0 some set entries become negative ids
     * or repeats: still ignored or valid targets. */
    return tgt;
}

/* Each op alone, the same inputs on both sides, with the all-reduces
 * between them simulated on the host (another rank's max, sum and target
 * logit folded in); each op then starts from the CPU's statistics, the
 * GPU's having just been checked. */
static void test_vocab(int N, int V, int Vp, int vocab_start)
{
    char what[160], shape[96];
    snprintf(shape, sizeof shape, "vocab N=%d V=%d Vp=%d start=%d", N, V, Vp, vocab_start);
    size_t n = (size_t)N * Vp;
    int32_t *tgt = vocab_targets(N, V, vocab_start);
    float *logits = hrand(n, 4), *stats = hrand(3 * (size_t)N, 1), *losses = hrand(N, 1);
    for (int r = 0; r < N; r++)
        for (int v = V; v < Vp; v++)
            logits[(size_t)r * Vp + v] = 30; /* would dominate if counted */
    int32_t *d_tgt = dcopy(tgt, N * sizeof *tgt);
    float *d_logits = dcopyf(logits, n), *d_stats = dcopyf(stats, 3 * (size_t)N);
    float *d_losses = dcopyf(losses, N);
    float *mx = stats, *sum = stats + N, *tg = stats + 2 * (size_t)N;

    /* the maximum is exact in any order */
    cpu->vocab_max(stats, logits, N, V, Vp);
    gpu->vocab_max(d_stats, d_logits, N, V, Vp);
    float *got = fetch(d_stats, 3 * (size_t)N);
    if (V > 0) {
        snprintf(what, sizeof what, "%s max", shape);
        compare(what, got, mx, N, R_EXACT);
    } else { /* compare() cannot judge infinities */
        int ok = 1;
        for (int r = 0; r < N; r++)
            ok &= got[r] == -INFINITY && mx[r] == -INFINITY;
        CHECK(ok, "%s: max is -inf without real columns", shape);
    }
    snprintf(what, sizeof what, "%s max leaves sum and tgt", shape);
    compare(what, got + N, sum, 2 * (size_t)N, R_EXACT);
    free(got);

    /* the all-reduce with max: another rank's maximum, sometimes larger */
    for (int r = 0; r < N; r++)
        mx[r] = fmaxf(mx[r], (float)(urand() * 4));
    backend_cuda_to_device(d_stats, stats, 3 * (size_t)N * sizeof(float));
    cpu->vocab_sumexp(stats, logits, tgt, N, V, Vp, vocab_start);
    gpu->vocab_sumexp(d_stats, d_logits, d_tgt, N, V, Vp, vocab_start);
    got = fetch(d_stats, 3 * (size_t)N);
    snprintf(what, sizeof what, "%s sumexp sum", shape);
    compare(what, got + N, sum, N, R_RED);
    snprintf(what, sizeof what, "%s sumexp tgt (a copied logit or 0: exact)", shape);
    compare(what, got + 2 * (size_t)N, tg, N, R_EXACT);
    snprintf(what, sizeof what, "%s sumexp leaves max", shape);
    compare(what, got, mx, N, R_EXACT);
    int local = 0;
    for (int r = 0; r < N; r++)
        local += tgt[r] >= vocab_start && tgt[r] < vocab_start + V;
    CHECK(V == 0 || (local > 0 && local < N), "%s: %d of %d targets here", shape, local, N);
    free(got);

    /* the all-reduce with sum: the other rank's exponentials, and the
     * target's logit where that rank holds it */
    for (int r = 0; r < N; r++) {
        sum[r] += (float)(1.5 + urand());
        if (tgt[r] >= 0 && (tgt[r] < vocab_start || tgt[r] >= vocab_start + V))
            tg[r] = (float)(urand() * 4);
    }
    backend_cuda_to_device(d_stats, stats, 3 * (size_t)N * sizeof(float));

    /* from the same statistics both are elementwise: a logf, an expf */
    cpu->vocab_loss(losses, stats, tgt, N);
    gpu->vocab_loss(d_losses, d_stats, d_tgt, N);
    snprintf(what, sizeof what, "%s losses", shape);
    compare_dev(what, d_losses, losses, N, R_ELEM);

    cpu->vocab_backward(logits, stats, tgt, 0.7f, N, V, Vp, vocab_start);
    gpu->vocab_backward(d_logits, d_stats, d_tgt, 0.7f, N, V, Vp, vocab_start);
    got = fetch(d_logits, n);
    snprintf(what, sizeof what, "%s dlogits", shape);
    compare(what, got, logits, n, R_ELEM);
    int zeros_ok = 1;
    for (int r = 0; r < N; r++)
        for (int v = 0; v < Vp; v++)
            if (tgt[r] < 0 || v >= V)
                zeros_ok &= got[(size_t)r * Vp + v] == 0;
    CHECK(zeros_ok, "%s: ignored rows and padding get exactly 0", shape);

    free(got), free(tgt), free(logits), free(stats), free(losses);
    backend_cuda_free(d_tgt), backend_cuda_free(d_logits), backend_cuda_free(d_stats);
    backend_cuda_free(d_losses);
}

/* tp = 2 in one process: the [N, Vp] logits of a vocabulary of V real ids
 * split into two [N, Vp/2] halves (rank 1 holds the padding, maybe nothing
 * else), the vocab ops run on each with the all-reduces done on the host,
 * against the CPU's plain cross-entropy of the whole logits. */
static void test_vocab_tp2(int N, int V, int Vp)
{
    char what[160];
    const int Vh = Vp / 2;
    size_t n = (size_t)N * Vp, nh = (size_t)N * Vh;
    int32_t *tgt = malloc(N * sizeof *tgt);
    for (int r = 0; r < N; r++)
        tgt[r] = r % 5 == 1 ? -1 : irand(0, V);
    tgt[0] = V - 1;               /* the last real id */
    tgt[N - 1] = V > Vh ? Vh : 0; /* rank 1's first id, when it has one */
    float *logits = hrand(n, 4), *losses = hrand(N, 1);
    for (int r = 0; r < N; r++)
        for (int v = V; v < Vp; v++)
            logits[(size_t)r * Vp + v] = 30;
    int32_t *d_tgt = dcopy(tgt, N * sizeof *tgt);
    float *half = malloc(nh * sizeof *half), *d_half[2], *d_stats[2], *d_loss[2];
    int start[2], Vr[2];
    for (int k = 0; k < 2; k++) {
        start[k] = k * Vh;
        Vr[k] = V - start[k] < 0 ? 0 : V - start[k] > Vh ? Vh : V - start[k];
        for (int r = 0; r < N; r++)
            memcpy(half + (size_t)r * Vh, logits + (size_t)r * Vp + start[k], Vh * sizeof(float));
        d_half[k] = dcopyf(half, nh);
        d_stats[k] = backend_cuda_calloc(3 * (size_t)N * sizeof(float), "test stats");
        d_loss[k] = dcopyf(losses, N);
    }

    /* pass 1, then the all-reduce with max */
    float *s[2], *stats = malloc(3 * (size_t)N * sizeof *stats);
    for (int k = 0; k < 2; k++)
        gpu->vocab_max(d_stats[k], d_half[k], N, Vr[k], Vh);
    for (int k = 0; k < 2; k++)
        s[k] = fetch(d_stats[k], 3 * (size_t)N);
    for (int r = 0; r < N; r++)
        stats[r] = fmaxf(s[0][r], s[1][r]);
    for (int k = 0; k < 2; k++) {
        backend_cuda_to_device(d_stats[k], stats, N * sizeof(float));
        free(s[k]);
    }
    /* pass 2, then the all-reduce with sum of (sum, tgt) */
    for (int k = 0; k < 2; k++)
        gpu->vocab_sumexp(d_stats[k], d_half[k], d_tgt, N, Vr[k], Vh, start[k]);
    for (int k = 0; k < 2; k++)
        s[k] = fetch(d_stats[k], 3 * (size_t)N);
    for (size_t i = N; i < 3 * (size_t)N; i++)
        stats[i] = s[0][i] + s[1][i];
    for (int k = 0; k < 2; k++) {
        backend_cuda_to_device(d_stats[k], stats, 3 * (size_t)N * sizeof(float));
        free(s[k]);
        gpu->vocab_loss(d_loss[k], d_stats[k], d_tgt, N);
    }

    cpu->crossentropy_forward(losses, logits, tgt, N, V, Vp);
    float *l0 = fetch(d_loss[0], N), *l1 = fetch(d_loss[1], N);
    snprintf(what, sizeof what, "vocab tp2 N=%d V=%d Vp=%d losses vs crossentropy", N, V, Vp);
    compare(what, l0, losses, N, R_RED);
    CHECK(memcmp(l0, l1, N * sizeof *l0) == 0, "vocab tp2 N=%d V=%d: both ranks' losses", N, V);
    free(l0), free(l1);

    /* backward on both halves, put together again */
    for (int k = 0; k < 2; k++)
        gpu->vocab_backward(d_half[k], d_stats[k], d_tgt, 0.7f, N, Vr[k], Vh, start[k]);
    float *got = malloc(n * sizeof *got);
    for (int k = 0; k < 2; k++) {
        backend_cuda_to_host(half, d_half[k], nh * sizeof *half);
        for (int r = 0; r < N; r++)
            memcpy(got + (size_t)r * Vp + start[k], half + (size_t)r * Vh, Vh * sizeof(float));
    }
    cpu->crossentropy_backward(logits, tgt, 0.7f, N, V, Vp);
    snprintf(what, sizeof what, "vocab tp2 N=%d V=%d Vp=%d dlogits vs crossentropy", N, V, Vp);
    compare(what, got, logits, n, R_RED);
    int zeros_ok = 1;
    for (int r = 0; r < N; r++)
        for (int v = 0; v < Vp; v++)
            if (tgt[r] < 0 || v >= V)
                zeros_ok &= got[(size_t)r * Vp + v] == 0;
    CHECK(zeros_ok, "vocab tp2 N=%d V=%d: ignored rows and padding get exactly 0", N, V);

    free(got), free(tgt), free(logits), free(losses), free(half), free(stats);
    backend_cuda_free(d_tgt);
    for (int k = 0; k < 2; k++) {
        backend_cuda_free(d_half[k]), backend_cuda_free(d_stats[k]);
        backend_cuda_free(d_loss[k]);
    }
}

/* ----------------------------------------------------------- vector ops */

/* y[r, c] += bias[c]: one addition per element, exact */
static void test_add_bias(int rows, int C)
{
    char what[96];
    size_t n = (size_t)rows * C;
    float *y = hrand(n, 1), *bias = hrand(C, 1);
    float *d_y = dcopyf(y, n), *d_bias = dcopyf(bias, C);
    cpu->add_bias(y, bias, rows, C);
    gpu->add_bias(d_y, d_bias, rows, C);
    snprintf(what, sizeof what, "add_bias rows=%d C=%d", rows, C);
    compare_dev(what, d_y, y, n, R_EXACT);
    gpu->add_bias(d_y, d_bias, 0, C); /* no rows: nothing changes */
    snprintf(what, sizeof what, "add_bias rows=0 C=%d leaves y", C);
    compare_dev(what, d_y, y, n, R_EXACT);
    free(y), free(bias);
    backend_cuda_free(d_y), backend_cuda_free(d_bias);
}

static void test_vector(size_t n)
{
    char what[96];
    float *a = hrand(n, 1), *b = hrand(n, 1), *y = hrand(n, 1);
    float *d_a = dcopyf(a, n), *d_b = dcopyf(b, n), *d_y = dcopyf(y, n);
    cpu->add(y, a, b, n);
    gpu->add(d_y, d_a, d_b, n);
    snprintf(what, sizeof what, "add n=%zu", n);
    compare_dev(what, d_y, y, n, R_EXACT);
    cpu->add(a, a, b, n); /* out aliasing a */
    gpu->add(d_a, d_a, d_b, n);
    snprintf(what, sizeof what, "add in place n=%zu", n);
    compare_dev(what, d_a, a, n, R_EXACT);
    cpu->accumulate(y, b, n);
    gpu->accumulate(d_y, d_b, n);
    snprintf(what, sizeof what, "accumulate n=%zu", n);
    compare_dev(what, d_y, y, n, R_EXACT);
    cpu->scale(y, 0.37f, n);
    gpu->scale(d_y, 0.37f, n);
    snprintf(what, sizeof what, "scale n=%zu", n);
    compare_dev(what, d_y, y, n, R_EXACT);

    double want = cpu->sumsq(y, n), got = gpu->sumsq(d_y, n), again = gpu->sumsq(d_y, n);
    CHECK_CLOSE(got, want, 1e-10, 0, "sumsq of random floats");
    CHECK(got == again, "sumsq n=%zu is deterministic: %.17g then %.17g", n, got, again);
    free(a), free(b), free(y);
    backend_cuda_free(d_a), backend_cuda_free(d_b), backend_cuda_free(d_y);
}

/* Adapter dropout (dropout_philox): the CPU's masks, bit for bit, on rows
 * at arbitrary places of the token stream and columns from col0 (not a
 * multiple of 4: a row-parallel rank's slice); every kept element is
 * x / (1 - p) in fp32, the dropped share is about p, and a few elements
 * are checked against rng_philox itself (core/rng.h). */
static void test_dropout(int N, int n, int col0, float p)
{
    char what[96];
    const size_t total = (size_t)N * (size_t)n;
    const uint64_t key = 0x9e3779b97f4a7c15ull ^ (uint64_t)col0;
    uint64_t *rows = malloc((size_t)N * sizeof *rows);
    for (int i = 0; i < N; i++)
        rows[i] = (uint64_t)irand(0, 1 << 30) * 4099u + (uint64_t)i;
    float *x = hrand(total, 1), *orig = malloc(total * sizeof *orig);
    memcpy(orig, x, total * sizeof *orig);
    float *d_x = dcopyf(x, total);
    uint64_t *d_rows = dcopy(rows, (size_t)N * sizeof *rows);
    cpu->dropout_philox(x, rows, N, n, col0, key, p);
    gpu->dropout_philox(d_x, d_rows, N, n, col0, key, p);
    snprintf(what, sizeof what, "dropout_philox N=%d n=%d col0=%d p=%g", N, n, col0, p);
    compare_dev(what, d_x, x, total, R_EXACT);
    size_t dropped = 0, bad = 0;
    for (size_t e = 0; e < total; e++) {
        dropped += x[e] == 0.0f && orig[e] != 0.0f;
        bad += x[e] != 0.0f && x[e] != orig[e] * (1.0f / (1.0f - p));
    }
    const double share = (double)dropped / (double)total;
    CHECK(bad == 0 && (total < 1000 || fabs(share - p) < 0.05),
          "%s: %zu elements neither 0 nor x / (1 - p), %.3f dropped", what, bad, share);
    for (int k = 0; k < 8; k++) {
        const int i = irand(0, N), j = irand(0, n);
        const uint64_t c = (uint64_t)col0 + (uint64_t)j;
        uint32_t r[4];
        rng_philox(r, rows[i], c / 4, key);
        const int drop = (double)r[c % 4] < (double)p * 4294967296.0;
        const float v = x[(size_t)i * (size_t)n + (size_t)j];
        CHECK(drop == (v == 0.0f), "%s: element (%d, %d) %s, rng_philox says %s", what, i, j,
              v == 0.0f ? "dropped" : "kept", drop ? "drop" : "keep");
    }
    free(rows), free(x), free(orig);
    backend_cuda_free(d_x), backend_cuda_free(d_rows);
}

/* sums of squares of integers: every partial sum is an integer below 2^53,
 * exact in any order, so the values are known exactly */
static void test_sumsq_exact(void)
{
    enum { n = 1000 };
    float x[n];
    for (int i = 0; i < n; i++)
        x[i] = (float)i;
    float *d = dcopyf(x, n);
    /* sum of i^2 for i < 1000 = 999*1000*1999/6 */
    CHECK(gpu->sumsq(d, n) == 332833500.0, "sumsq 0..999: %.17g", gpu->sumsq(d, n));
    CHECK(gpu->sumsq(d, 3) == 5.0, "sumsq of 3: %g", gpu->sumsq(d, 3));
    CHECK(gpu->sumsq(d, 0) == 0.0, "sumsq of nothing");
    float big = 1e8f; /* exact in fp32; its square only in double */
    backend_cuda_to_device(d, &big, sizeof big);
    CHECK(gpu->sumsq(d, 1) == 1e16, "sumsq accumulates in double: %.17g", gpu->sumsq(d, 1));
    backend_cuda_free(d);
}

/* sumsq_ranges: ranges with gaps, a range inside one element, an empty
 * range, ranges not in address order, and one range longer than the grid
 * (the grid-stride loop crosses range boundaries): against the CPU
 * reference (the per-range sums in order) and exactly on integers. */
static void test_sumsq_ranges(size_t n)
{
    float *x = hrand(n, 1), *d_x = dcopyf(x, n);
    const BackendRange r[] = {{3, 5, 0},   {5, 5, 0},      {n / 2, n - 7, 0},
                              {10, 11, 0}, {20, n / 3, 0}, {n - 1, n, 0}};
    const int k = sizeof r / sizeof r[0];
    double want = cpu->sumsq_ranges(x, r, k), got = gpu->sumsq_ranges(d_x, r, k);
    double again = gpu->sumsq_ranges(d_x, r, k);
    char what[80];
    snprintf(what, sizeof what, "sumsq_ranges n=%zu", n);
    CHECK_CLOSE(got, want, 1e-10, 0, what);
    CHECK(got == again, "%s is deterministic: %.17g then %.17g", what, got, again);
    double direct = 0;
    for (int j = 0; j < k; j++)
        direct += cpu->sumsq(x + r[j].lo, r[j].hi - r[j].lo);
    CHECK(want == direct, "cpu sumsq_ranges is the per-range sumsq in order");
    CHECK(gpu->sumsq_ranges(d_x, r, 0) == 0.0, "sumsq_ranges of no range");
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i % 1000);
    backend_cuda_to_device(d_x, x, n * sizeof *x);
    double exact = 0;
    for (int j = 0; j < k; j++)
        for (size_t i = r[j].lo; i < r[j].hi; i++)
            exact += (double)x[i] * x[i];
    got = gpu->sumsq_ranges(d_x, r, k);
    CHECK(got == exact, "sumsq_ranges of integers n=%zu: %.17g, want %.17g", n, got, exact);
    free(x), backend_cuda_free(d_x);
}

/* ------------------------------------------------------ the step state */

static BackendStepState fetch_state(const BackendStepState *d)
{
    BackendStepState h;
    backend_cuda_to_host(&h, d, sizeof h);
    return h;
}

/* loss_add (two micro-batches, shares, ignored rows, one with no counted
 * row) and grad_check (clipped, not clipped, no clipping, a non-finite
 * gradient, a non-finite loss) against the CPU's, which are the host
 * arithmetic of model.c and trainer.c. */
static void test_step_state(size_t n)
{
    const int N = 700;
    float *losses = hrand(N, 3);
    int32_t *tgt = malloc(N * sizeof *tgt), *none = malloc(N * sizeof *none);
    for (int r = 0; r < N; r++) {
        losses[r] = fabsf(losses[r]);
        tgt[r] = r % 7 == 2 ? -1 : r;
        none[r] = -1;
    }
    float *g = hrand(n, 0.01f);
    const BackendRange rg[] = {{3, 500, 1}, {600, n - 2, 0}};
    float *d_losses = dcopyf(losses, N), *d_g = dcopyf(g, n);
    int32_t *d_tgt = dcopy(tgt, N * sizeof *tgt), *d_none = dcopy(none, N * sizeof *none);
    BackendStepState *d_st = backend_cuda_malloc(sizeof *d_st, "step state");
    /* clip thresholds: below the norm (clipped), above it, 0 (off) */
    const float clips[] = {0.05f, 1e3f, 0.0f};
    for (int c = 0; c < 3; c++) {
        BackendStepState st = {0};
        backend_cuda_zero(d_st, sizeof *d_st);
        cpu->loss_add(&st, losses, tgt, N, 0.25f);
        gpu->loss_add(d_st, d_losses, d_tgt, N, 0.25f);
        cpu->loss_add(&st, losses, none, N, 0.5f); /* counts nothing: adds 0 */
        gpu->loss_add(d_st, d_losses, d_none, N, 0.5f);
        cpu->loss_add(&st, losses + 1, tgt + 1, N - 1, 0.25f);
        gpu->loss_add(d_st, d_losses + 1, d_tgt + 1, N - 1, 0.25f);
        cpu->grad_check(&st, g, rg, 2, clips[c]);
        gpu->grad_check(d_st, d_g, rg, 2, clips[c]);
        BackendStepState got = fetch_state(d_st);
        CHECK(fabs(got.loss - st.loss) <= 1e-6 * st.loss && st.loss > 0,
              "loss_add clip %g: gpu %.17g, cpu %.17g", clips[c], got.loss, st.loss);
        CHECK(fabs(got.sumsq - st.sumsq) <= 1e-10 * st.sumsq, "grad_check sumsq: %.17g, want %.17g",
              got.sumsq, st.sumsq);
        CHECK(got.skip == 0 && st.skip == 0, "grad_check clip %g: finite, not skipped", clips[c]);
        CHECK(fabs(got.grad_scale - st.grad_scale) <= 1e-6 * st.grad_scale &&
                  (c == 0 ? st.grad_scale < 1 : st.grad_scale == 1),
              "grad_check clip %g (norm %g): scale gpu %.9g, cpu %.9g", clips[c], sqrt(st.sumsq),
              got.grad_scale, st.grad_scale);
    }
    /* a NaN in the gradient, then an infinite loss: skipped, scale 1 */
    for (int k = 0; k < 2; k++) {
        BackendStepState st = {0};
        backend_cuda_zero(d_st, sizeof *d_st);
        if (k == 0) {
            g[700] = NAN;
        } else {
            g[700] = 0;
            losses[5] = INFINITY;
        }
        backend_cuda_to_device(d_g, g, n * sizeof *g);
        backend_cuda_to_device(d_losses, losses, N * sizeof *losses);
        cpu->loss_add(&st, losses, tgt, N, 1.0f);
        gpu->loss_add(d_st, d_losses, d_tgt, N, 1.0f);
        cpu->grad_check(&st, g, rg, 2, 0.05f);
        gpu->grad_check(d_st, d_g, rg, 2, 0.05f);
        BackendStepState got = fetch_state(d_st);
        CHECK(st.skip == 1 && got.skip == 1 && got.grad_scale == 1 && st.grad_scale == 1,
              "grad_check with a non-finite %s: skip gpu %g cpu %g, scale gpu %g",
              k ? "loss" : "gradient", got.skip, st.skip, got.grad_scale);
    }
    free(losses), free(tgt), free(none), free(g);
    backend_cuda_free(d_losses), backend_cuda_free(d_g), backend_cuda_free(d_tgt);
    backend_cuda_free(d_none), backend_cuda_free(d_st);
}

/* ---------------------------------------------------------------- adamw */

/* adamw_ranges against the CPU's adamw_ranges (itself adamw per range):
 * decay on some ranges, gaps that must stay untouched, fp32 and bf16. */
static void test_adamw_ranges(size_t n)
{
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const BackendRange r[] = {{0, 7, 1}, {7, 300, 0}, {310, n / 2, 1}, {n / 2, n - 3, 0}};
    const int k = sizeof r / sizeof r[0];
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        float *master = hrand(n, 1), *m = hrand(n, 1e-3f), *v = hrand(n, 1e-3f);
        float *param = hrand(n, 1), *grad = hrand(n, 1);
        for (size_t i = 0; i < n; i++)
            v[i] = fabsf(v[i]);
        float *d_master = dcopyf(master, n), *d_m = dcopyf(m, n), *d_v = dcopyf(v, n);
        float *d_param = dcopyf(param, n), *d_grad = dcopyf(grad, n);
        float *p = bf16 ? param : master, *d_p = bf16 ? d_param : d_master;
        for (int t = 1; t <= 2; t++) {
            cpu->adamw_ranges(p, master, grad, m, v, r, k, lr, b1, b2, eps, wd, 0.37f, t, bf16,
                              NULL);
            gpu->adamw_ranges(d_p, d_master, d_grad, d_m, d_v, r, k, lr, b1, b2, eps, wd, 0.37f, t,
                              bf16, NULL);
        }
        char what[80];
        snprintf(what, sizeof what, "adamw_ranges%s master", bf16 ? " (bf16)" : "");
        compare_dev(what, d_master, master, n, R_ELEM);
        snprintf(what, sizeof what, "adamw_ranges%s m", bf16 ? " (bf16)" : "");
        compare_dev(what, d_m, m, n, R_ELEM);
        snprintf(what, sizeof what, "adamw_ranges%s v", bf16 ? " (bf16)" : "");
        compare_dev(what, d_v, v, n, R_ELEM);
        if (bf16) {
            snprintf(what, sizeof what, "adamw_ranges (bf16) param");
            compare_dev(what, d_param, param, n, 1.0 / 128);
        }
        free(master), free(m), free(v), free(param), free(grad);
        backend_cuda_free(d_master), backend_cuda_free(d_m), backend_cuda_free(d_v);
        backend_cuda_free(d_param), backend_cuda_free(d_grad);
    }
}

static void test_adamw(size_t n)
{
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *master = hrand(n, 1), *m = calloc(n, 4), *v = calloc(n, 4), *param = hrand(n, 1);
    float *d_master = dcopyf(master, n), *d_m = dcopyf(m, n), *d_v = dcopyf(v, n);
    float *d_param = dcopyf(param, n);
    /* fp32 training (param aliasing master), then a bf16 working copy */
    for (int t = 1; t <= 4; t++) {
        int bf16 = t > 2;
        float *grad = hrand(n, t == 1 ? 1e-3f : 1), *d_grad = dcopyf(grad, n);
        const float gs = t == 2 ? 0.37f : 1.0f; /* clipping's factor, on one step */
        cpu->adamw(bf16 ? param : master, master, grad, m, v, n, lr, b1, b2, eps, wd, gs, t, bf16);
        gpu->adamw(bf16 ? d_param : d_master, d_master, d_grad, d_m, d_v, n, lr, b1, b2, eps, wd,
                   gs, t, bf16);
        char what[96];
        snprintf(what, sizeof what, "adamw step %d%s master", t, bf16 ? " (bf16)" : "");
        compare_dev(what, d_master, master, n, R_ELEM);
        snprintf(what, sizeof what, "adamw step %d m", t);
        compare_dev(what, d_m, m, n, R_ELEM);
        snprintf(what, sizeof what, "adamw step %d v", t);
        compare_dev(what, d_v, v, n, R_ELEM);
        if (bf16) { /* the working copy is the GPU's own master rounded */
            float *gm = fetch(d_master, n), *gp = fetch(d_param, n);
            int ok = 1;
            for (size_t i = 0; i < n; i++)
                ok &= gp[i] == bf16_round(gm[i]);
            CHECK(ok, "adamw step %d: param = bf16_round(master)", t);
            /* and within one bf16 step (2^-7 relative) of the CPU's */
            snprintf(what, sizeof what, "adamw step %d bf16 param", t);
            compare(what, gp, param, n, 1.0 / 128);
            free(gm), free(gp);
        }
        free(grad), backend_cuda_free(d_grad);
    }
    free(master), free(m), free(v), free(param);
    backend_cuda_free(d_master), backend_cuda_free(d_m), backend_cuda_free(d_v);
    backend_cuda_free(d_param);
}

/* The GPU's bf16 rounding on hand-chosen bits (those of test_ops.c): with
 * lr = 0 and zero gradients the step leaves master unchanged and param is
 * master rounded. */
static void test_bf16_rounding(void)
{
    static const uint32_t in[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
                                  0x3f807fffu, 0xbf808000u, 0xbf80c000u, 0x3fffffffu,
                                  0x7f7fffffu, 0x00000000u, 0x80000000u};
    static const uint32_t want[] = {0x3f800000u, 0x3f800000u, 0x3f820000u, 0x3f810000u,
                                    0x3f800000u, 0xbf800000u, 0xbf810000u, 0x40000000u,
                                    0x7f800000u, 0x00000000u, 0x80000000u};
    enum { n = sizeof in / sizeof in[0] };
    float w[n], zero[n] = {0}, p[n];
    memcpy(w, in, sizeof w);
    float *d_w = dcopyf(w, n), *d_z = dcopyf(zero, n), *d_m = dcopyf(zero, n);
    float *d_v = dcopyf(zero, n), *d_p = dcopyf(zero, n);
    gpu->adamw(d_p, d_w, d_z, d_m, d_v, n, 0.0f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1, 1);
    backend_cuda_to_host(p, d_p, sizeof p);
    for (int i = 0; i < n; i++) {
        uint32_t got;
        memcpy(&got, &p[i], sizeof got);
        CHECK(got == want[i], "gpu bf16 rounding of %08x: %08x, want %08x", in[i], got, want[i]);
    }
    backend_cuda_free(d_w), backend_cuda_free(d_z), backend_cuda_free(d_m);
    backend_cuda_free(d_v), backend_cuda_free(d_p);
}

/* adamw_ranges reading the step's decision from device memory: a clip
 * factor multiplies grad_scale (the CPU's adamw_ranges with the product
 * is the reference), and a skip leaves every buffer as it was. */
static void test_adamw_state(size_t n)
{
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const BackendRange r[] = {{0, 100, 1}, {100, n, 0}};
    float *master = hrand(n, 1), *m = hrand(n, 1e-3f), *v = hrand(n, 1e-3f), *grad = hrand(n, 1);
    for (size_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    float *d_master = dcopyf(master, n), *d_m = dcopyf(m, n), *d_v = dcopyf(v, n);
    float *d_grad = dcopyf(grad, n);
    BackendStepState skip = {.loss = NAN, .grad_scale = 1, .skip = 1};
    BackendStepState clip = {.grad_scale = 0.3, .skip = 0};
    BackendStepState *d_skip = dcopy(&skip, sizeof skip), *d_clip = dcopy(&clip, sizeof clip);
    gpu->adamw_ranges(d_master, d_master, d_grad, d_m, d_v, r, 2, lr, b1, b2, eps, wd, 0.5f, 3, 0,
                      d_skip);
    compare_dev("adamw_ranges skipped: master unchanged", d_master, master, n, 0);
    compare_dev("adamw_ranges skipped: m unchanged", d_m, m, n, 0);
    compare_dev("adamw_ranges skipped: v unchanged", d_v, v, n, 0);
    gpu->adamw_ranges(d_master, d_master, d_grad, d_m, d_v, r, 2, lr, b1, b2, eps, wd, 0.5f, 3, 0,
                      d_clip);
    cpu->adamw_ranges(master, master, grad, m, v, r, 2, lr, b1, b2, eps, wd, 0.5f * 0.3f, 3, 0,
                      NULL);
    compare_dev("adamw_ranges with a device clip factor: master", d_master, master, n, R_ELEM);
    compare_dev("adamw_ranges with a device clip factor: m", d_m, m, n, R_ELEM);
    free(master), free(m), free(v), free(grad);
    backend_cuda_free(d_master), backend_cuda_free(d_m), backend_cuda_free(d_v);
    backend_cuda_free(d_grad), backend_cuda_free(d_skip), backend_cuda_free(d_clip);
}

/* ----------------------------------------------------------------- main */

/* The mixture-of-experts ops (kernels/moe.cu): the router over N rows of
 * E logits (some rows tied: equal choices required), its backward, and
 * the dispatch, combine and their backward over R of the N*k slots in a
 * shuffled order (slots left out: dropped assignments). */
static void test_moe(int N, int E, int k, int C, int R)
{
    char what[96];
    float *logits = hrand((size_t)N * E, 3);
    for (int e = 0; e < E; e++) /* row 0: all tied; row 1: two tied on top */
        logits[e] = 0.5f;
    if (N > 1 && E > 2)
        logits[E + 1] = logits[E + 2] = 4.0f;
    float *probs = hrand((size_t)N * E, 1), *lse = hrand((size_t)N, 1),
          *w = hrand((size_t)N * k, 1);
    int32_t *idx = calloc((size_t)N * k, sizeof *idx), *gidx = calloc((size_t)N * k, sizeof *gidx);
    float *d_logits = dcopyf(logits, (size_t)N * E), *d_probs = dcopyf(probs, (size_t)N * E);
    float *d_lse = dcopyf(lse, (size_t)N), *d_w = dcopyf(w, (size_t)N * k);
    int32_t *d_idx = dcopy(idx, (size_t)N * k * sizeof *idx);
    cpu->moe_router_forward(probs, lse, idx, w, logits, N, E, k);
    gpu->moe_router_forward(d_probs, d_lse, d_idx, d_w, d_logits, N, E, k);
    backend_cuda_to_host(gidx, d_idx, (size_t)N * k * sizeof *gidx);
    int same = 1;
    for (int i = 0; i < N * k; i++)
        same &= gidx[i] == idx[i];
    CHECK(same, "moe router N=%d E=%d k=%d: the same experts chosen", N, E, k);
    snprintf(what, sizeof what, "moe router N=%d E=%d k=%d probs", N, E, k);
    compare_dev(what, d_probs, probs, (size_t)N * E, R_ELEM);
    snprintf(what, sizeof what, "moe router N=%d E=%d k=%d lse", N, E, k);
    compare_dev(what, d_lse, lse, (size_t)N, R_ELEM);
    snprintf(what, sizeof what, "moe router N=%d E=%d k=%d weights", N, E, k);
    compare_dev(what, d_w, w, (size_t)N * k, R_ELEM);

    float *dw = hrand((size_t)N * k, 1), *aux = hrand((size_t)E, 0.1f);
    float *dl = hrand((size_t)N * E, 1);
    float *d_dw = dcopyf(dw, (size_t)N * k), *d_aux = dcopyf(aux, (size_t)E);
    float *d_dl = dcopyf(dl, (size_t)N * E);
    cpu->moe_router_backward(dl, dw, probs, lse, idx, w, aux, 0.03f, N, E, k);
    gpu->moe_router_backward(d_dl, d_dw, d_probs, d_lse, d_idx, d_w, d_aux, 0.03f, N, E, k);
    snprintf(what, sizeof what, "moe router backward N=%d E=%d k=%d", N, E, k);
    compare_dev(what, d_dl, dl, (size_t)N * E, R_ELEM);

    /* R slots of the N*k, shuffled */
    int32_t *slot = malloc((size_t)N * k * sizeof *slot);
    for (int i = 0; i < N * k; i++)
        slot[i] = i;
    for (int i = N * k - 1; i > 0; i--) {
        const int j = irand(0, i + 1), t = slot[i];
        slot[i] = slot[j];
        slot[j] = t;
    }
    int32_t *d_slot = dcopy(slot, (size_t)R * sizeof *slot);
    float *x = hrand((size_t)N * C, 1), *xg = hrand((size_t)R * C, 1);
    float *d_x = dcopyf(x, (size_t)N * C), *d_xg = dcopyf(xg, (size_t)R * C);
    cpu->moe_gather(xg, x, slot, R, C, k);
    gpu->moe_gather(d_xg, d_x, d_slot, R, C, k);
    snprintf(what, sizeof what, "moe gather R=%d C=%d", R, C);
    compare_dev(what, d_xg, xg, (size_t)R * C, R_EXACT);
    cpu->moe_scatter_add(x, xg, slot, R, C, k);
    gpu->moe_scatter_add(d_x, d_xg, d_slot, R, C, k);
    snprintf(what, sizeof what, "moe scatter_add R=%d C=%d", R, C);
    compare_dev(what, d_x, x, (size_t)N * C, R_EXACT);
    cpu->moe_combine_forward(x, xg, w, slot, R, C, k);
    gpu->moe_combine_forward(d_x, d_xg, d_w, d_slot, R, C, k);
    snprintf(what, sizeof what, "moe combine R=%d C=%d", R, C);
    compare_dev(what, d_x, x, (size_t)N * C, R_ELEM);
    float *dy = hrand((size_t)R * C, 1), *d_dy = dcopyf(dy, (size_t)R * C);
    cpu->moe_combine_backward(dy, dw, x, xg, w, slot, R, C, k);
    gpu->moe_combine_backward(d_dy, d_dw, d_x, d_xg, d_w, d_slot, R, C, k);
    snprintf(what, sizeof what, "moe combine backward R=%d C=%d dy", R, C);
    compare_dev(what, d_dy, dy, (size_t)R * C, R_ELEM);
    snprintf(what, sizeof what, "moe combine backward R=%d C=%d dw", R, C);
    compare_dev(what, d_dw, dw, (size_t)N * k, R_RED);

    free(logits), free(probs), free(lse), free(w), free(idx), free(gidx), free(dw), free(aux);
    free(dl), free(slot), free(x), free(xg), free(dy);
    backend_cuda_free(d_logits), backend_cuda_free(d_probs), backend_cuda_free(d_lse);
    backend_cuda_free(d_w), backend_cuda_free(d_idx), backend_cuda_free(d_dw);
    backend_cuda_free(d_aux), backend_cuda_free(d_dl), backend_cuda_free(d_slot);
    backend_cuda_free(d_x), backend_cuda_free(d_xg), backend_cuda_free(d_dy);
}

static void test_table(void)
{
    const Backend *g = gpu;
    CHECK(g->matmul_forward && g->matmul_backward && g->embedding_forward &&
              g->embedding_backward && g->layernorm_forward && g->layernorm_backward &&
              g->rmsnorm_forward && g->rmsnorm_backward && g->gelu_forward && g->gelu_backward &&
              g->swiglu_forward && g->swiglu_backward && g->rope_forward && g->rope_backward &&
              g->attention_forward && g->attention_backward && g->crossentropy_forward &&
              g->crossentropy_backward && g->vocab_max && g->vocab_sumexp && g->vocab_loss &&
              g->vocab_backward && g->add_bias && g->add && g->accumulate && g->sumsq && g->scale &&
              g->adamw && g->sumsq_ranges && g->adamw_ranges && g->crossentropy_fused &&
              g->loss_add && g->grad_check && g->residual_norm_forward && g->dropout_philox &&
              g->moe_router_forward && g->moe_router_backward && g->moe_gather &&
              g->moe_scatter_add && g->moe_combine_forward && g->moe_combine_backward &&
              g->matmul_grouped_forward && g->matmul_grouped_backward,
          "the CUDA table fills every op");
    CHECK(strcmp(g->name, "cuda") == 0, "table name %s", g->name);
}

int main(void)
{
    if (backend_cuda_devices() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    char name[256];
    backend_cuda_set_device(0);
    backend_cuda_device_name(0, name, sizeof name);
    printf("cuda_ops: device 0: %s\n", name);
    cpu = backend_cpu();
    gpu = backend_cuda();
    test_table();

    /* fp32 GEMMs, then bf16 ones (cublasGemmEx on tensor cores) against
     * backend_cpu_bf16: the same rounded operands, each product exact in
     * fp32, the sums in another order (the same tolerance). */
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        cpu = bf16 ? backend_cpu_bf16() : backend_cpu();
        gpu = bf16 ? backend_cuda_bf16() : backend_cuda();
        matmul_tag = bf16 ? "bf16 " : "";
        test_matmul(6, 8, 5, 1);
        test_matmul(37, 75, 53, 0);
        test_matmul(37, 75, 53, 1);
        test_matmul(256, 384, 200, 1);
        test_matmul(1, 3, 1, 1);
        test_matmul(3100, 64, 77, 1); /* dbias over 3 uneven chunks of rows (common.cuh) */
        test_dbias_repeat(3000, 77);
        test_matmul_grouped_all();
    }
    /* the fused linear + GELU, bf16 only: cuBLASLt's epilogues (OC and C
     * multiples of 8), then the separate kernels (53, 75: aux leading
     * dimensions cuBLASLt refuses) */
    cpu = backend_cpu_bf16();
    gpu = backend_cuda_bf16();
    test_matmul_gelu(37, 64, 96);
    test_matmul_gelu(256, 384, 200);
    test_matmul_gelu(37, 75, 53);
    test_dbias_fused(37, 64, 96);
    test_dbias_fused(256, 384, 200);
    test_dbias_fused(3100, 64, 77); /* 3 chunks of rows and the finishing kernel */
    CHECK(!backend_cuda()->matmul_gelu_forward && !backend_cuda()->matmul_backward_dgelu,
          "fp32 CUDA keeps the unfused ops (cuBLAS pedantic, exact parity)");
    /* GEMM inputs stored in bf16 (the bf16 tables' *_x16 ops): shapes
     * with and without cuBLASLt's epilogues, one row, odd sizes */
    test_matmul_x16(6, 8, 5, 1);
    test_matmul_x16(37, 75, 53, 0);
    test_matmul_x16(256, 384, 200, 1);
    test_matmul_x16(1, 3, 1, 1);
    test_matmul_gelu_x16(37, 64, 96);
    test_matmul_gelu_x16(37, 75, 53);
    /* the bf16 weight copy: with cuBLASLt's epilogues and without */
    test_weights_bf16(37, 64, 96);
    test_weights_bf16(37, 75, 53);
    CHECK(!backend_cuda()->weights_bf16 && !backend_cpu_bf16()->weights_bf16,
          "the weight copy is the bf16 CUDA table's only");
    int nshapes[][2] = {{37, 75}, {5, 3}, {2, 4097}, {300, 768}};
    for (size_t s = 0; s < sizeof nshapes / sizeof nshapes[0]; s++)
        for (int residual = 0; residual <= 1; residual++) {
            test_norm_x16(nshapes[s][0], nshapes[s][1], residual, 1, 0);
            test_norm_x16(nshapes[s][0], nshapes[s][1], residual, 0, 0);
            test_norm_x16(nshapes[s][0], nshapes[s][1], residual, 0, 1);
        }
    test_swiglu_x16(1001);
    test_swiglu_x16(300000);
    test_swiglu_backward_x16(1001);
    test_swiglu_backward_x16(300000);
    test_head_x16(37, 64, 1000, 1024, 0.7f);
    test_head_x16(5, 75, 3, 3, 0.25f); /* odd sizes: cuBLASLt's bf16 D, or cublasGemmEx's */
    test_head_x16(8, 64, 5000, 5008, 1.0f / 4000);
    /* Where cuBLASLt offers no algorithm, the cuBLAS fallbacks: the head's
     * bf16 logits from cublasGemmEx with a bf16 C, the biases from the
     * broadcast kernel, the GELU and its gradient from their own kernels.
     * The emulation offers none under TRD_EMU_LT_NO_ALGO (a GPU ignores it
     * and runs the cuBLASLt paths again). */
    setenv("TRD_EMU_LT_NO_ALGO", "1", 1);
    matmul_tag = "bf16 no-cuBLASLt ";
    test_matmul(37, 64, 96, 1);
    test_matmul_gelu(37, 64, 96);
    test_matmul_x16(37, 64, 96, 1);
    test_matmul_gelu_x16(37, 64, 96);
    test_head_x16(37, 64, 1000, 1024, 0.7f);
    unsetenv("TRD_EMU_LT_NO_ALGO");
    matmul_tag = "";
    CHECK(!backend_cuda()->matmul_forward_x16 && !backend_cpu()->matmul_forward_x16 &&
              !backend_cuda()->head_forward_x16 && !backend_cpu()->head_forward_x16,
          "fp32 tables keep fp32 activations (no *_x16 ops)");
    cpu = backend_cpu();
    gpu = backend_cuda();

    test_moe(40, 4, 2, 24, 70);  /* 10 of the 80 assignments dropped */
    test_moe(33, 8, 1, 300, 33); /* top-1, every token kept, two blocks of columns */
    test_moe(5, 3, 3, 7, 12);    /* k = E */

    test_embedding(2, 4, 8, 3, 5, NULL);
    test_embedding(5, 8, 75, 20, 50, NULL);    /* odd sizes, vocab slice not at 0 */
    test_embedding(4, 64, 300, 0, 1000, NULL); /* several blocks of channels */
    int32_t *epos = doc_positions(4, 64, (const int[]){7, 30, 1, 50}, 4);
    test_embedding(4, 64, 300, 0, 1000, epos); /* packed documents */
    free(epos);
    /* 900 rows over 4 tiles of the grouping kernels, 30 tokens: long groups
     * that span tiles */
    test_embedding(3, 300, 40, 5, 30, NULL);
    epos = doc_positions(3, 300, (const int[]){100, 7, 250}, 3);
    test_embedding(3, 300, 40, 5, 30, epos);
    free(epos);

    /* 300 rows: each of the 32 row groups of the parameter gradients sums
     * several rows; 3100: the rows in 3 uneven chunks, summed by a second
     * kernel (common.cuh's column sums) */
    int shapes[][2] = {{37, 75}, {16, 1000}, {5, 3}, {3, 256}, {2, 4097}, {300, 75}, {3100, 75}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        test_layernorm(shapes[s][0], shapes[s][1], 1);
        test_layernorm(shapes[s][0], shapes[s][1], 0);
        test_rmsnorm(shapes[s][0], shapes[s][1]);
        test_residual_norm(shapes[s][0], shapes[s][1], 1, 0);
        test_residual_norm(shapes[s][0], shapes[s][1], 0, 0);
        test_residual_norm(shapes[s][0], shapes[s][1], 0, 1);
    }

    test_gelu(1001);
    test_gelu(300000);
    test_swiglu(1001);
    test_swiglu(300000);

    test_rope(2, 5, 4, 2, 4, (RopeFreq){.theta = 1e4}, 0, NULL);
    test_rope(1, 300, 8, 2, 64, (RopeFreq){.theta = 1e4}, 0,
              NULL); /* hs/2 = 32 pairs, long positions */
    test_rope(3, 7, 3, 3, 6, (RopeFreq){.theta = 5e5}, 0, NULL);    /* MHA, odd head count */
    test_rope(2, 9, 4, 1, 2, (RopeFreq){.theta = 1e4}, 0, NULL);    /* MQA, one pair per head */
    test_rope(2, 9, 4, 2, 4, (RopeFreq){.theta = 1e4}, 4096, NULL); /* a sequence shard at 4096 */
    int32_t *dpos = doc_positions(2, 9, (const int[]){4, 3}, 2);
    test_rope(2, 9, 4, 2, 4, (RopeFreq){.theta = 1e4}, 0, dpos); /* packed documents */
    /* Llama 3.1's scaling: 32 pairs over the three bands, long positions */
    test_rope(1, 300, 8, 2, 64,
              (RopeFreq){.theta = 5e5,
                         .factor = 8,
                         .low_freq_factor = 1,
                         .high_freq_factor = 4,
                         .original_max = 8192},
              7000, NULL);
    free(dpos);

    test_attention(2, 5, 4, 2, 4);      /* GQA */
    test_attention(1, 37, 6, 2, 16);    /* GQA, odd T */
    test_attention(2, 300, 4, 1, 64);   /* MQA, ten query and key tiles */
    test_attention(3, 17, 3, 3, 8);     /* MHA */
    test_attention(1, 1, 2, 1, 4);      /* a single position */
    test_attention(1, 70, 2, 2, 128);   /* the largest head size, partial last tile */
    test_attention(2, 64, 4, 2, 100);   /* hs not a multiple of 8, whole tiles */
    test_attention_blocks(2, 4, 2, 16); /* GQA */
    test_attention_blocks(1, 3, 3, 8);  /* MHA */

    /* bf16 on tensor cores (backend_cuda_bf16), head sizes 64 and 128 */
    test_mma();
    gpu = backend_cuda_bf16();
    CHECK(gpu->attention_forward != backend_cuda()->attention_forward &&
              gpu->attention_backward != backend_cuda()->attention_backward,
          "backend_cuda_bf16: attention through the tensor-core entry points");
    attn_tc = 1, attn_tag = " tc", attn_rtol = R_TC;
    test_attention(2, 70, 4, 2, 64);    /* GQA, B > 1, a partial second tile */
    test_attention(1, 70, 2, 1, 128);   /* MQA, the largest head size */
    test_attention(1, 200, 2, 2, 64);   /* MHA, four tiles: the softmax rescaled thrice */
    test_attention_blocks(1, 2, 1, 64); /* documents, offsets, packed keys, merge */
    test_attention_cudnn();
    attn_tag = " tc fallback", attn_rtol = R_RED;
    test_attention(1, 37, 6, 2, 16); /* another head size: the fp32 kernels */
    attn_tc = 0, attn_tag = "";
    gpu = backend_cuda();

    test_decode(9, 0, 4, 2, 16);             /* GQA */
    test_decode(40, 0, 2, 2, 128);           /* MHA, the largest head size */
    test_decode(7, 0, 6, 1, 36);             /* MQA, hs not a multiple of 32 */
    test_decode(140, 0, 4, 2, 64);           /* a 132-row prompt (one split a row), then split */
    test_decode(340, 300, 4, 2, 64);         /* 4 of 4 splits for 32 rows, 11 of 32 for one */
    test_decode(1100, 1090, 2, 1, 128);      /* all 32 splits, the largest head size */
    test_decode(200, 150, 3, 1, 6);          /* 2 lanes a position, hs not a multiple of 4 */
    test_decode(100, 60, 2, 2, 2);           /* 1 lane a position */
    test_decode_linear(1, 64, 96, 1, "", 0); /* one row, 16-byte loads */
    test_decode_linear(3, 75, 53, 1, "",
                       0); /* C not a multiple of 4: a float a lane; OC not of 8 */
    test_decode_linear(1, 70, 300, 0, "", 0); /* no bias (Llama) */
    test_decode_linear(3, 256, 40, 0, "", 0); /* three rows, 16-byte loads, two per lane */
    test_decode_linear(2, 64, 40, 1, "", 1);  /* x one float past 16 bytes: a float a lane */
    test_decode_linear(7, 64, 40, 1, "", 0); /* above the GEMV's rows: cuBLAS and the unfused ops */
    /* the norm before the linear, in the GEMV (n <= 4; more: the decoder's norm op) */
    for (int n = 1; n <= 4; n++) {
        test_decode_linear(n, 128, 72, 1, "layernorm", 0); /* 16-byte loads */
        test_decode_linear(n, 96, 40, 0, "rmsnorm", 0);
    }
    test_decode_linear(3, 75, 53, 1, "layernorm", 0); /* C not a multiple of 4: a float a lane */
    test_decode_linear(2, 75, 53, 0, "rmsnorm", 0);
    test_decode_linear(4, 64, 40, 1, "layernorm", 1); /* x and weight past 16 bytes */
    test_decode_linear(1, 64, 40, 0, "rmsnorm", 1);
    /* a column over S warps (decode.cu, gemv_split: S = 2, 4, 8), and over
     * several chunks of GEMV_UNROLL loads a lane (S = 1 at 2048 columns) */
    test_decode_linear(2, 600, 24, 1, "", 0);
    test_decode_linear(3, 1100, 40, 1, "layernorm", 0);
    test_decode_linear(1, 2056, 16, 0, "rmsnorm", 0);
    test_decode_linear(4, 1030, 19, 1, "", 0);
    test_decode_linear(1, 1100, 2048, 1, "layernorm", 0);
    test_decode_linear(2, 301, 2048, 0, "rmsnorm", 1);

    test_crossentropy(37, 1000, 1024);
    test_crossentropy(8, 50257, 50304); /* GPT-2 vocabulary, padded */
    test_crossentropy(5, 3, 3);         /* no padding, V below a warp */
    test_crossentropy_fused(37, 1000, 1024, 0.7f);
    test_crossentropy_fused(8, 50257, 50304, 1.0f / 4000); /* GPT-2, a micro-batch's share */
    test_crossentropy_fused(5, 3, 3, 0.25f);

    test_vocab(37, 1000, 1024, 1024);   /* slice not at 0, padded */
    test_vocab(300, 777, 800, 3000);    /* more rows than threads of a block */
    test_vocab(5, 0, 64, 1024);         /* a rank holding only padding */
    test_vocab(7, 3, 3, 0);             /* no padding, V below a warp */
    test_vocab(8, 25105, 25152, 25152); /* GPT-2, rank 1 of tp 2 */
    test_vocab_tp2(37, 1000, 1024);     /* rank 1: 488 of 512 real */
    test_vocab_tp2(9, 500, 1024);       /* rank 1: padding only */
    test_vocab_tp2(8, 50257, 50304);    /* GPT-2 */

    test_add_bias(37, 75);
    test_add_bias(5, 1);
    /* more than 65535 blocks of 256: the grid-stride loop wraps */
    test_add_bias(4099, 4097);

    test_vector(1001);
    test_dropout(37, 75, 0, 0.1f);
    test_dropout(64, 130, 390, 0.25f); /* a row-parallel rank's columns */
    test_dropout(5, 7, 3, 0.5f);       /* col0 inside a group of four */
    /* more than 65535 blocks of 256: the grid-stride loops wrap */
    test_vector((size_t)17 * 1000 * 1000 + 3);
    test_sumsq_exact();
    test_sumsq_ranges(1001);
    /* more elements than the 65536 threads of the reduction */
    test_sumsq_ranges((size_t)300 * 1000 + 11);

    test_adamw(10007);
    test_adamw_ranges(10007);
    test_adamw_state(5003);
    test_step_state(100003);
    test_bf16_rounding();

#ifdef TRD_CUDA_EMULATED
    /* The per-group fallback of the grouped linears: the emulated cuBLAS
     * refuses grouped GEMMs as a library without them does, and
     * kernels/matmul.cu goes on with per-group GEMMs (for the rest of the
     * process: so last). */
    setenv("TRIDENT_EMU_NO_GROUPED", "1", 1);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        cpu = bf16 ? backend_cpu_bf16() : backend_cpu();
        gpu = bf16 ? backend_cuda_bf16() : backend_cuda();
        matmul_tag = bf16 ? "per-group bf16 " : "per-group ";
        test_matmul_grouped_all();
    }
#endif

    backend_cuda_synchronize();
    return check_summary("cuda_ops");
}
