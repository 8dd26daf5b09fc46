/* The CPU ops (src/backend).
 *
 * Every backward is checked in double precision (cpu_f64.h: the same source
 * compiled with real = double) against central finite differences of a
 * random projection loss L = sum(out * r), for every input and parameter,
 * with the gradient buffers pre-filled with random values (a backward that
 * overwrites instead of accumulating fails) and called twice (twice the
 * gradient).  Forwards are checked against naive loops written here from
 * the definitions in backend.h.  Then the fp32 Backend table is checked
 * against the double functions on the same inputs, and the optimizer,
 * bf16 rounding and cross-entropy against values computed by hand. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu_f64.h"
#include "check.h"
#include "doc_positions.h"

/* ------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* uniform in [-1, 1): xorshift64*, good enough for test data */
static double urand(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545f4914f6cdd1dull;
    return (double)(r >> 11) / (double)(1ull << 52) - 1.0;
}

static double *rnd(size_t n)
{
    double *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = urand();
    return x;
}

static double *zeros(size_t n) { return calloc(n, sizeof(double)); }

static double *copy(const double *x, size_t n)
{
    double *y = malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

static float *tof(const double *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = (float)x[i];
    return y;
}

static double dotd(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* One check per array: the worst element against |a-b| <= atol + rtol|b|. */
static void check_arrays(const char *what, const double *got, const double *want, size_t n,
                         double rtol, double atol)
{
    size_t worst = 0;
    double worst_excess = -1;
    for (size_t i = 0; i < n; i++) {
        double excess = fabs(got[i] - want[i]) - (atol + rtol * fabs(want[i]));
        if (excess > worst_excess || isnan(got[i])) {
            worst_excess = isnan(got[i]) ? INFINITY : excess;
            worst = i;
        }
    }
    CHECK(n > 0 && worst_excess <= 0, "%s: element %zu: got %.12g, want %.12g", what, worst,
          n ? got[worst] : 0.0, n ? want[worst] : 0.0);
}

/* fp32 results against the double ones */
static void check_f32(const char *what, const float *got, const double *want, size_t n, double rtol,
                      double atol)
{
    double *g = malloc(n * sizeof *g);
    for (size_t i = 0; i < n; i++)
        g[i] = got[i];
    check_arrays(what, g, want, n, rtol, atol);
    free(g);
}

/* ----------------------------------------------- finite-difference harness */

/* A differentiable input: its values and its gradient buffer. */
typedef struct {
    const char *name;
    double *x, *grad;
    size_t n;
} Var;

/* loss(): forward at the current values, returns L = sum(out * r).
 * backward(): accumulates dL/dx into every Var's grad. */
typedef double (*LossFn)(void);
typedef void (*BackFn)(void);

static void check_grads(const char *op, LossFn loss, BackFn backward, Var *vars, int nv,
                        int accumulates)
{
    double *g0[8], *an[8];
    for (int k = 0; k < nv; k++) { /* random prefill: += must keep it */
        g0[k] = rnd(vars[k].n);
        memcpy(vars[k].grad, g0[k], vars[k].n * sizeof(double));
    }
    loss(); /* saved activations of the current values */
    backward();
    for (int k = 0; k < nv; k++) {
        an[k] = malloc(vars[k].n * sizeof(double));
        for (size_t i = 0; i < vars[k].n; i++)
            an[k][i] = vars[k].grad[i] - g0[k][i];
    }
    if (accumulates) {
        backward();
        for (int k = 0; k < nv; k++) {
            char what[128];
            double *want = malloc(vars[k].n * sizeof(double));
            for (size_t i = 0; i < vars[k].n; i++)
                want[i] = g0[k][i] + 2 * an[k][i];
            snprintf(what, sizeof what, "%s: d%s after two backward calls", op, vars[k].name);
            check_arrays(what, vars[k].grad, want, vars[k].n, 1e-12, 1e-12);
            free(want);
        }
    }
    const double h = 1e-5;
    for (int k = 0; k < nv; k++) {
        double *fd = malloc(vars[k].n * sizeof(double)), fdmax = 0;
        for (size_t i = 0; i < vars[k].n; i++) {
            double x0 = vars[k].x[i];
            vars[k].x[i] = x0 + h;
            double lp = loss();
            vars[k].x[i] = x0 - h;
            double lm = loss();
            vars[k].x[i] = x0;
            fd[i] = (lp - lm) / (2 * h);
            fdmax = fmax(fdmax, fabs(fd[i]));
        }
        char what[128];
        snprintf(what, sizeof what, "%s: d%s vs finite differences", op, vars[k].name);
        check_arrays(what, an[k], fd, vars[k].n, 1e-6, 1e-7);
        CHECK(fdmax > 1e-3, "%s: d%s is all zero: the check would be vacuous", op, vars[k].name);
        free(fd);
        free(an[k]);
        free(g0[k]);
    }
    loss(); /* leave activations of the unperturbed values behind */
}

/* The shapes and buffers of the op under test (one op at a time). */
static struct {
    int N, C, OC, B, T, H, KVH, hs, vocab_start, V, Vp;
    float dloss;
    RopeFreq rf;
    double *inp, *weight, *bias, *out, *r, *mean, *rstd, *att, *tmp; /* att: lse */
    double *dinp, *dweight, *dbias, *inp2, *dinp2;
    int32_t *tokens;
    const int32_t *pos; /* embedding: positions in documents, or NULL */
} S;

/* --------------------------------------------------------------- matmul */

static double mm_loss(void)
{
    cpu_matmul_forward_f64(S.out, S.inp, S.weight, S.bias, S.N, S.C, S.OC);
    return dotd(S.out, S.r, (size_t)S.N * S.OC);
}

static void mm_back(void)
{
    cpu_matmul_backward_f64(S.dinp, S.dweight, S.bias ? S.dbias : NULL, S.r, S.inp, S.weight, S.N,
                            S.C, S.OC);
}

static void test_matmul(int with_bias)
{
    const Backend *cpu = backend_cpu();
    int N = 6, C = 8, OC = 5;
    S.N = N, S.C = C, S.OC = OC;
    S.inp = rnd(N * C), S.weight = rnd(OC * C), S.bias = with_bias ? rnd(OC) : NULL;
    S.out = zeros(N * OC), S.r = rnd(N * OC);
    S.dinp = zeros(N * C), S.dweight = zeros(OC * C), S.dbias = zeros(OC);
    const char *op = with_bias ? "matmul+bias" : "matmul";

    mm_loss();
    double *want = zeros(N * OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = S.bias ? S.bias[o] : 0;
            for (int c = 0; c < C; c++)
                s += S.inp[n * C + c] * S.weight[o * C + c];
            want[n * OC + o] = s;
        }
    check_arrays(op, S.out, want, N * OC, 1e-13, 1e-13);

    Var vars[] = {{"inp", S.inp, S.dinp, N * C},
                  {"weight", S.weight, S.dweight, OC * C},
                  {"bias", S.bias, S.dbias, OC}};
    check_grads(op, mm_loss, mm_back, vars, with_bias ? 3 : 2, 1);

    /* fp32 against fp64, from zeroed gradients */
    float *fi = tof(S.inp, N * C), *fw = tof(S.weight, OC * C);
    float *fb = S.bias ? tof(S.bias, OC) : NULL, *fo = malloc(N * OC * sizeof *fo);
    float *fr = tof(S.r, N * OC);
    float *fdi = calloc(N * C, 4), *fdw = calloc(OC * C, 4), *fdb = calloc(OC, 4);
    cpu->matmul_forward(fo, fi, fw, fb, N, C, OC);
    check_f32("matmul fp32 out", fo, S.out, N * OC, 1e-5, 1e-5);
    memset(S.dinp, 0, N * C * 8), memset(S.dweight, 0, OC * C * 8), memset(S.dbias, 0, OC * 8);
    mm_back();
    cpu->matmul_backward(fdi, fdw, fb ? fdb : NULL, fr, fi, fw, N, C, OC, GRAD_ADD);
    check_f32("matmul fp32 dinp", fdi, S.dinp, N * C, 1e-5, 1e-5);
    check_f32("matmul fp32 dweight", fdw, S.dweight, OC * C, 1e-5, 1e-5);
    if (fb)
        check_f32("matmul fp32 dbias", fdb, S.dbias, OC, 1e-5, 1e-5);
    /* NULL gradients are skipped, the others still produced */
    memset(fdw, 0, OC * C * 4);
    cpu->matmul_backward(NULL, fdw, NULL, fr, fi, fw, N, C, OC, GRAD_ADD);
    check_f32("matmul fp32 dweight alone", fdw, S.dweight, OC * C, 1e-5, 1e-5);

    free(fi), free(fw), free(fb), free(fo), free(fr), free(fdi), free(fdw), free(fdb);
    free(want), free(S.inp), free(S.weight), free(S.bias), free(S.out), free(S.r);
    free(S.dinp), free(S.dweight), free(S.dbias);
}

/* GEMMs big enough to be split over threads (by rows of the output when
 * it has more rows than columns, else by columns), against naive loops,
 * with 2 and 3 threads (uneven blocks). */
static void test_matmul_split(int N, int C, int OC, int threads)
{
    const Backend *cpu = backend_cpu();
    omp_set_num_threads(threads);
    char what[96];
    double *inp = rnd((size_t)N * C), *w = rnd((size_t)OC * C), *b = rnd(OC);
    double *dout = rnd((size_t)N * OC), *out = zeros((size_t)N * OC);
    double *dinp = rnd((size_t)N * C), *dw = rnd((size_t)OC * C), *db = rnd(OC);
    double *want_out = zeros((size_t)N * OC), *want_dinp = copy(dinp, (size_t)N * C);
    double *want_dw = copy(dw, (size_t)OC * C), *want_db = copy(db, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b[o], g = dout[n * OC + o];
            for (int c = 0; c < C; c++) {
                s += inp[n * C + c] * w[o * C + c];
                want_dinp[n * C + c] += g * w[o * C + c];
                want_dw[o * C + c] += g * inp[n * C + c];
            }
            want_out[n * OC + o] = s;
            want_db[o] += g;
        }
    float *fi = tof(inp, (size_t)N * C), *fw = tof(w, (size_t)OC * C), *fb = tof(b, OC);
    float *fd = tof(dout, (size_t)N * OC), *fo = malloc((size_t)N * OC * 4);
    float *fdi = tof(dinp, (size_t)N * C), *fdw = tof(dw, (size_t)OC * C), *fdb = tof(db, OC);
    cpu_matmul_forward_f64(out, inp, w, b, N, C, OC);
    cpu_matmul_backward_f64(dinp, dw, db, dout, inp, w, N, C, OC);
    cpu->matmul_forward(fo, fi, fw, fb, N, C, OC);
    cpu->matmul_backward(fdi, fdw, fdb, fd, fi, fw, N, C, OC, GRAD_ADD);
    snprintf(what, sizeof what, "matmul %dx%dx%d, %d threads", N, C, OC, threads);
    check_arrays(what, out, want_out, (size_t)N * OC, 1e-12, 1e-12);
    check_arrays(what, dinp, want_dinp, (size_t)N * C, 1e-12, 1e-12);
    check_arrays(what, dw, want_dw, (size_t)OC * C, 1e-12, 1e-12);
    check_arrays(what, db, want_db, OC, 1e-12, 1e-12);
    check_f32(what, fo, want_out, (size_t)N * OC, 1e-4, 1e-4);
    check_f32(what, fdi, want_dinp, (size_t)N * C, 1e-4, 1e-4);
    check_f32(what, fdw, want_dw, (size_t)OC * C, 1e-4, 1e-4);
    check_f32(what, fdb, want_db, OC, 1e-4, 1e-4);
    free(inp), free(w), free(b), free(dout), free(out), free(dinp), free(dw), free(db);
    free(want_out), free(want_dinp), free(want_dw), free(want_db);
    free(fi), free(fw), free(fb), free(fd), free(fo), free(fdi), free(fdw), free(fdb);
    omp_set_num_threads(2);
}

/* backend_cpu_bf16's GEMMs against double loops over the operands rounded
 * to bf16 (each product exact, so only the fp32 sums differ), and not
 * against the unrounded ones: the rounding must happen.  dbias is the sum
 * of the unrounded dout. */
static void test_matmul_bf16(int N, int C, int OC)
{
    const Backend *bf = backend_cpu_bf16();
    const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    double *inp = rnd(ni), *w = rnd(nw), *b = rnd(OC), *dout = rnd(no);
    float *fi = tof(inp, ni), *fw = tof(w, nw), *fb = tof(b, OC), *fd = tof(dout, no);
    double *ri = zeros(ni), *rw = zeros(nw), *rd = zeros(no);
    for (size_t i = 0; i < ni; i++)
        ri[i] = bf16_round(fi[i]);
    for (size_t i = 0; i < nw; i++)
        rw[i] = bf16_round(fw[i]);
    for (size_t i = 0; i < no; i++)
        rd[i] = bf16_round(fd[i]);
    double *out = zeros(no), *raw_out = zeros(no), *dinp = zeros(ni), *dw = zeros(nw);
    double *db = zeros(OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = fb[o], raw = fb[o], g = rd[(size_t)n * OC + o];
            for (int c = 0; c < C; c++) {
                s += ri[(size_t)n * C + c] * rw[(size_t)o * C + c];
                raw += (double)fi[(size_t)n * C + c] * fw[(size_t)o * C + c];
                dinp[(size_t)n * C + c] += g * rw[(size_t)o * C + c];
                dw[(size_t)o * C + c] += g * ri[(size_t)n * C + c];
            }
            out[(size_t)n * OC + o] = s;
            raw_out[(size_t)n * OC + o] = raw;
            db[o] += fd[(size_t)n * OC + o];
        }
    float *fo = calloc(no, sizeof(float)), *fdi = calloc(ni, sizeof(float));
    float *fdw = calloc(nw, sizeof(float)), *fdb = calloc(OC, sizeof(float));
    bf->matmul_forward(fo, fi, fw, fb, N, C, OC);
    bf->matmul_backward(fdi, fdw, fdb, fd, fi, fw, N, C, OC, GRAD_ADD);
    char what[96];
    snprintf(what, sizeof what, "bf16 matmul %dx%dx%d", N, C, OC);
    check_f32(what, fo, out, no, 1e-5, 1e-5);
    check_f32(what, fdi, dinp, ni, 1e-5, 1e-5);
    check_f32(what, fdw, dw, nw, 1e-5, 1e-5);
    check_f32(what, fdb, db, OC, 1e-5, 1e-5);
    double off = 0;
    for (size_t i = 0; i < no; i++)
        off = fmax(off, fabs(fo[i] - raw_out[i]));
    CHECK(off > 1e-3, "%s: max difference from the unrounded product %.2g: not rounded?", what,
          off);
    free(inp), free(w), free(b), free(dout), free(fi), free(fw), free(fb), free(fd);
    free(ri), free(rw), free(rd), free(out), free(raw_out), free(dinp), free(dw), free(db);
    free(fo), free(fdi), free(fdw), free(fdb);
}

/* The fused linear + GELU ops of the CPU tables (fp32 and bf16) against
 * the ops they fuse, called in order as the model called them before:
 * matmul_forward then gelu_forward; and for the backward, matmul_backward
 * into a zeroed dfc_act, then gelu_backward into a zeroed dfc.  The same
 * arithmetic, so equal values (compared with ==: 0 + -0 is +0).  dinp
 * starts random (the fused backward SETS it); dweight and dbias start
 * random on both sides (they add). */
static void test_matmul_gelu(const Backend *be, const char *tag, int N, int C, int OC)
{
    const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    double *inp = rnd(ni), *w = rnd(nw), *b = rnd(OC), *dout = rnd(ni), *w2 = rnd(nw);
    double *dw0 = rnd(nw), *db0 = rnd(C), *junk = rnd(no);
    float *fi = tof(inp, ni), *fw = tof(w, nw), *fb = tof(b, OC), *fd = tof(dout, ni);
    float *fw2 = tof(w2, nw);
    float *pre = tof(junk, no), *out = tof(junk, no), *dpre = tof(junk, no);
    float *pre_ref = calloc(no, sizeof(float)), *out_ref = calloc(no, sizeof(float));
    float *dact = calloc(no, sizeof(float)), *dpre_ref = calloc(no, sizeof(float));
    float *dw = tof(dw0, nw), *db = tof(db0, C), *dw_ref = tof(dw0, nw), *db_ref = tof(db0, C);

    be->matmul_gelu_forward(out, pre, fi, fw, fb, N, C, OC);
    be->matmul_forward(pre_ref, fi, fw, fb, N, C, OC);
    be->gelu_forward(out_ref, pre_ref, no);
    /* the next linear, w2 [C, OC], reads out [N, OC]: its backward to pre */
    be->matmul_backward_dgelu(dpre, dw, db, fd, out, pre, fw2, N, OC, C);
    be->matmul_backward(dact, dw_ref, db_ref, fd, out_ref, fw2, N, OC, C, GRAD_ADD);
    be->gelu_backward(dpre_ref, pre_ref, dact, no, GRAD_ADD);

    size_t bad[5] = {0};
    for (size_t i = 0; i < no; i++) {
        bad[0] += pre[i] != pre_ref[i];
        bad[1] += out[i] != out_ref[i];
        bad[2] += dpre[i] != dpre_ref[i];
    }
    for (size_t i = 0; i < nw; i++)
        bad[3] += dw[i] != dw_ref[i];
    for (int i = 0; i < C; i++)
        bad[4] += db[i] != db_ref[i];
    const char *names[5] = {"pre", "out", "dpre", "dweight", "dbias"};
    for (int k = 0; k < 5; k++)
        CHECK(bad[k] == 0, "%smatmul+gelu %dx%dx%d %s: %zu elements differ from the unfused ops",
              tag, N, C, OC, names[k], bad[k]);
    free(inp), free(w), free(b), free(dout), free(w2), free(dw0), free(db0), free(junk);
    free(fi), free(fw), free(fb), free(fd), free(fw2), free(pre), free(out), free(dpre);
    free(pre_ref), free(out_ref), free(dact), free(dpre_ref), free(dw), free(db), free(dw_ref);
    free(db_ref);
}

/* GRAD_SET (backend.h) on a CPU table: each op that takes it, on an output
 * filled with NaN, gives the bits of GRAD_ADD on a zeroed one (the
 * zeroing it replaces in the model), the other gradients added as before. */
static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

static void nan_fill_f(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

static float *filled(size_t n, float v)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    return x;
}

static void test_grad_set(const Backend *be, const char *tag)
{
    const int N = 19, C = 24, OC = 13, B = 2, T = 7, H = 4, KVH = 2, hs = 6;
    const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    double *inp = rnd(ni), *w = rnd(nw), *dout = rnd(no), *g0 = rnd(nw + OC);
    float *fi = tof(inp, ni), *fw = tof(w, nw), *fd = tof(dout, no);
    float *set = filled(ni, NAN), *add = filled(ni, 0), *gs = tof(g0, nw + OC),
          *ga = tof(g0, nw + OC);
    be->matmul_backward(set, gs, gs + nw, fd, fi, fw, N, C, OC, GRAD_SET);
    be->matmul_backward(add, ga, ga + nw, fd, fi, fw, N, C, OC, GRAD_ADD);
    CHECK(same_bits(set, add, ni) && same_bits(gs, ga, nw + OC),
          "%smatmul_backward: GRAD_SET over NaN = GRAD_ADD onto 0 (dinp), dweight and dbias added",
          tag);
    if (be->matmul_backward_x16) {
        uint16_t *x = malloc(ni * sizeof *x);
        for (size_t i = 0; i < ni; i++)
            x[i] = bf16_bits(fi[i]);
        float *set16 = filled(ni, NAN);
        memset(add, 0, ni * sizeof *add);
        be->matmul_backward_x16(set16, NULL, NULL, fd, x, fw, N, C, OC, GRAD_SET);
        be->matmul_backward_x16(add, NULL, NULL, fd, x, fw, N, C, OC, GRAD_ADD);
        CHECK(same_bits(set16, add, ni), "%smatmul_backward_x16: GRAD_SET = GRAD_ADD onto 0", tag);
        uint16_t *d16 = malloc(no * sizeof *d16);
        for (size_t i = 0; i < no; i++)
            d16[i] = bf16_bits(fd[i]);
        nan_fill_f(set16, ni), memset(add, 0, ni * sizeof *add);
        be->matmul_backward_d16(set16, NULL, d16, x, fw, N, C, OC, GRAD_SET);
        be->matmul_backward_d16(add, NULL, d16, x, fw, N, C, OC, GRAD_ADD);
        CHECK(same_bits(set16, add, ni), "%smatmul_backward_d16: GRAD_SET = GRAD_ADD onto 0", tag);
        free(x), free(d16), free(set16);
    }

    /* elementwise: gelu into dinp, swiglu into dgate and dup */
    float *set2 = filled(ni, NAN), *add2 = filled(ni, 0);
    nan_fill_f(set, ni), memset(add, 0, ni * sizeof *add);
    be->gelu_backward(set, fi, fi, ni, GRAD_SET);
    be->gelu_backward(add, fi, fi, ni, GRAD_ADD);
    CHECK(same_bits(set, add, ni), "%sgelu_backward: GRAD_SET = GRAD_ADD onto 0", tag);
    nan_fill_f(set, ni), memset(add, 0, ni * sizeof *add);
    be->swiglu_backward(set, set2, fi, fi, fi, ni, GRAD_SET);
    be->swiglu_backward(add, add2, fi, fi, fi, ni, GRAD_ADD);
    CHECK(same_bits(set, add, ni) && same_bits(set2, add2, ni),
          "%sswiglu_backward: GRAD_SET = GRAD_ADD onto 0", tag);

    /* attention: dq and dkv one buffer, every element written */
    AttnArgs a = attn_args(B, T, H, KVH, hs);
    const size_t nq = (size_t)B * T * (H + 2 * KVH) * hs, nout = (size_t)B * T * H * hs;
    double *q = rnd(nq), *d = rnd(nout);
    float *fq = tof(q, nq), *fdo = tof(d, nout), *out = malloc(nout * sizeof *out);
    float *lse = malloc((size_t)B * H * T * sizeof *lse), *qs = filled(nq, NAN),
          *qa = filled(nq, 0);
    be->attention_forward(out, lse, fq, fq, &a);
    be->attention_backward(qa, qa, fdo, fq, fq, out, lse, &a);
    a.grad = GRAD_SET;
    be->attention_backward(qs, qs, fdo, fq, fq, out, lse, &a);
    CHECK(same_bits(qs, qa, nq), "%sattention_backward: GRAD_SET over NaN = GRAD_ADD onto 0", tag);

    free(inp), free(w), free(dout), free(g0), free(fi), free(fw), free(fd), free(set), free(add);
    free(gs), free(ga), free(set2), free(add2), free(q), free(d), free(fq), free(fdo), free(out);
    free(lse), free(qs), free(qa);
}

/* ------------------------------------------------------------ embedding */

static double emb_loss(void)
{
    cpu_embedding_forward_f64(S.out, S.tokens, S.pos, S.weight, S.bias, S.N, S.T, S.C,
                              S.vocab_start, S.V);
    return dotd(S.out, S.r, (size_t)S.N * S.C);
}

static void emb_back(void)
{
    cpu_embedding_backward_f64(S.dweight, S.bias ? S.dbias : NULL, S.r, S.tokens, S.pos, S.N, S.T,
                               S.C, S.vocab_start, S.V);
}

static void test_embedding(void)
{
    const Backend *cpu = backend_cpu();
    /* this rank owns tokens [3, 8); 3 repeats; 8 (the first one past the
     * slice), 2, 10 and -1 are not ours */
    int32_t tokens[] = {3, 7, 8, 3, 2, 5, 10, -1};
    int B = 2, T = 4, N = B * T, C = 8, V = 5;
    S.N = N, S.T = T, S.C = C, S.V = V, S.vocab_start = 3, S.tokens = tokens;
    S.weight = rnd(V * C), S.bias = rnd(T * C); /* wte, wpe */
    S.out = zeros(N * C), S.r = rnd(N * C);
    S.dweight = zeros(V * C), S.dbias = zeros(T * C);

    emb_loss();
    int exact = 1;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            int r = tokens[n] - 3;
            double want = (r >= 0 && r < V) ? S.weight[r * C + c] + S.bias[(n % T) * C + c] : 0;
            exact &= S.out[n * C + c] == want;
        }
    CHECK(exact, "embedding forward: rows are wte[tok-vocab_start]+wpe, zero outside");

    Var vars[] = {{"wte", S.weight, S.dweight, V * C}, {"wpe", S.bias, S.dbias, T * C}};
    check_grads("embedding", emb_loss, emb_back, vars, 2, 1);
    /* token rows 1 and 3 (tokens 4 and 6, absent) get no gradient, nor
     * position 2, which holds only foreign tokens (8 and 10) */
    memset(S.dweight, 0, V * C * 8), memset(S.dbias, 0, T * C * 8);
    emb_back();
    int untouched = 1;
    for (int c = 0; c < C; c++)
        untouched &= S.dweight[1 * C + c] == 0 && S.dweight[3 * C + c] == 0 &&
                     S.dbias[2 * C + c] == 0 && S.dbias[1 * C + c] != 0;
    CHECK(untouched, "embedding backward: foreign tokens give no gradient");

    /* packed documents: row n takes position pos[n] */
    int32_t pos[] = {0, 1, 0, 1, 2, 0, 1, 2};
    S.pos = pos;
    emb_loss();
    exact = 1;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            int r = tokens[n] - 3;
            double want = (r >= 0 && r < V) ? S.weight[r * C + c] + S.bias[pos[n] * C + c] : 0;
            exact &= S.out[n * C + c] == want;
        }
    CHECK(exact, "embedding forward with document positions: rows take wpe[pos[n]]");
    check_grads("embedding (documents)", emb_loss, emb_back, vars, 2, 1);
    S.pos = NULL;

    /* without positions */
    double *saved_wpe = S.bias;
    S.bias = NULL;
    emb_loss();
    CHECK(S.out[0] == S.weight[0] && S.out[4 * C] == 0, "embedding without wpe");
    Var v1[] = {{"wte(no wpe)", S.weight, S.dweight, V * C}};
    check_grads("embedding", emb_loss, emb_back, v1, 1, 1);
    S.bias = saved_wpe;

    /* fp32: exact copies and sums, so equal */
    float *fwte = tof(S.weight, V * C), *fwpe = tof(S.bias, T * C), *fr = tof(S.r, N * C);
    float *fo = malloc(N * C * 4), *fdwte = calloc(V * C, 4), *fdwpe = calloc(T * C, 4);
    emb_loss();
    cpu->embedding_forward(fo, tokens, NULL, fwte, fwpe, N, T, C, 3, V);
    check_f32("embedding fp32 out", fo, S.out, N * C, 1e-6, 1e-6);
    memset(S.dweight, 0, V * C * 8), memset(S.dbias, 0, T * C * 8);
    emb_back();
    cpu->embedding_backward(fdwte, fdwpe, fr, tokens, NULL, N, T, C, 3, V);
    check_f32("embedding fp32 dwte", fdwte, S.dweight, V * C, 1e-6, 1e-6);
    check_f32("embedding fp32 dwpe", fdwpe, S.dbias, T * C, 1e-6, 1e-6);
    free(fwte), free(fwpe), free(fr), free(fo), free(fdwte), free(fdwpe);
    free(S.weight), free(S.bias), free(S.out), free(S.r), free(S.dweight), free(S.dbias);
}

/* ------------------------------------------------------- layernorm, rms */

static double ln_loss(void)
{
    cpu_layernorm_forward_f64(S.out, S.mean, S.rstd, S.inp, S.weight, S.bias, S.N, S.C, 1e-5f);
    return dotd(S.out, S.r, (size_t)S.N * S.C);
}

static void ln_back(void)
{
    cpu_layernorm_backward_f64(S.dinp, S.dweight, S.dbias, S.r, S.inp, S.weight, S.mean, S.rstd,
                               S.N, S.C);
}

static double rms_loss(void)
{
    cpu_rmsnorm_forward_f64(S.out, S.rstd, S.inp, S.weight, S.N, S.C, 1e-5f);
    return dotd(S.out, S.r, (size_t)S.N * S.C);
}

static void rms_back(void)
{
    cpu_rmsnorm_backward_f64(S.dinp, S.dweight, S.r, S.inp, S.weight, S.rstd, S.N, S.C);
}

static void test_norms(void)
{
    const Backend *cpu = backend_cpu();
    int N = 6, C = 8;
    S.N = N, S.C = C;
    S.inp = rnd(N * C), S.weight = rnd(C), S.bias = rnd(C);
    S.out = zeros(N * C), S.r = rnd(N * C), S.mean = zeros(N), S.rstd = zeros(N);
    S.dinp = zeros(N * C), S.dweight = zeros(C), S.dbias = zeros(C);
    for (int i = 0; i < N * C; i++)
        S.inp[i] = 2 * S.inp[i] + 0.5; /* a nonzero mean to remove */

    /* naive forwards */
    double *want = zeros(N * C);
    for (int n = 0; n < N; n++) {
        const double *x = S.inp + n * C;
        double mu = 0, var = 0, ms = 0;
        for (int c = 0; c < C; c++)
            mu += x[c] / C, ms += x[c] * x[c] / C;
        for (int c = 0; c < C; c++)
            var += (x[c] - mu) * (x[c] - mu) / C;
        for (int c = 0; c < C; c++)
            want[n * C + c] = (x[c] - mu) / sqrt(var + 1e-5) * S.weight[c] + S.bias[c];
    }
    ln_loss();
    check_arrays("layernorm forward", S.out, want, N * C, 1e-9, 1e-12);
    Var vars[] = {{"inp", S.inp, S.dinp, N * C},
                  {"weight", S.weight, S.dweight, C},
                  {"bias", S.bias, S.dbias, C}};
    check_grads("layernorm", ln_loss, ln_back, vars, 3, 1);

    float *fi = tof(S.inp, N * C), *fw = tof(S.weight, C), *fb = tof(S.bias, C);
    float *fr = tof(S.r, N * C), *fo = malloc(N * C * 4), *fm = malloc(N * 4), *fs = malloc(N * 4);
    float *fdi = calloc(N * C, 4), *fdw = calloc(C, 4), *fdb = calloc(C, 4);
    cpu->layernorm_forward(fo, fm, fs, fi, fw, fb, N, C, 1e-5f);
    check_f32("layernorm fp32 out", fo, S.out, N * C, 1e-5, 1e-5);
    memset(S.dinp, 0, N * C * 8), memset(S.dweight, 0, C * 8), memset(S.dbias, 0, C * 8);
    ln_back();
    cpu->layernorm_backward(fdi, fdw, fdb, fr, fi, fw, fm, fs, N, C);
    check_f32("layernorm fp32 dinp", fdi, S.dinp, N * C, 1e-4, 1e-5);
    check_f32("layernorm fp32 dweight", fdw, S.dweight, C, 1e-4, 1e-5);
    check_f32("layernorm fp32 dbias", fdb, S.dbias, C, 1e-4, 1e-5);

    /* RMSNorm */
    for (int n = 0; n < N; n++) {
        const double *x = S.inp + n * C;
        double ms = 0;
        for (int c = 0; c < C; c++)
            ms += x[c] * x[c] / C;
        for (int c = 0; c < C; c++)
            want[n * C + c] = x[c] / sqrt(ms + 1e-5) * S.weight[c];
    }
    rms_loss();
    check_arrays("rmsnorm forward", S.out, want, N * C, 1e-9, 1e-12);
    check_grads("rmsnorm", rms_loss, rms_back, vars, 2, 1);
    cpu->rmsnorm_forward(fo, fs, fi, fw, N, C, 1e-5f);
    check_f32("rmsnorm fp32 out", fo, S.out, N * C, 1e-5, 1e-5);
    memset(S.dinp, 0, N * C * 8), memset(S.dweight, 0, C * 8);
    memset(fdi, 0, N * C * 4), memset(fdw, 0, C * 4);
    rms_back();
    cpu->rmsnorm_backward(fdi, fdw, fr, fi, fw, fs, N, C);
    check_f32("rmsnorm fp32 dinp", fdi, S.dinp, N * C, 1e-4, 1e-5);
    check_f32("rmsnorm fp32 dweight", fdw, S.dweight, C, 1e-4, 1e-5);

    free(fi), free(fw), free(fb), free(fr), free(fo), free(fm), free(fs);
    free(fdi), free(fdw), free(fdb), free(want);
    free(S.inp), free(S.weight), free(S.bias), free(S.out), free(S.r), free(S.mean);
    free(S.rstd), free(S.dinp), free(S.dweight), free(S.dbias);
}

/* ----------------------------------------------------------- activations */

static double gelu_loss(void)
{
    cpu_gelu_forward_f64(S.out, S.inp, (size_t)S.N);
    return dotd(S.out, S.r, (size_t)S.N);
}

static void gelu_back(void) { cpu_gelu_backward_f64(S.dinp, S.inp, S.r, (size_t)S.N); }

static double swiglu_loss(void)
{
    cpu_swiglu_forward_f64(S.out, S.inp, S.inp2, (size_t)S.N);
    return dotd(S.out, S.r, (size_t)S.N);
}

static void swiglu_back(void)
{
    cpu_swiglu_backward_f64(S.dinp, S.dinp2, S.r, S.inp, S.inp2, (size_t)S.N);
}

static void test_activations(void)
{
    const Backend *cpu = backend_cpu();
    int n = 48;
    S.N = n;
    S.inp = rnd(n), S.inp2 = rnd(n), S.out = zeros(n), S.r = rnd(n);
    S.dinp = zeros(n), S.dinp2 = zeros(n);
    for (int i = 0; i < n; i++)
        S.inp[i] *= 4; /* both tails of the curve */

    /* GELU(1) with the tanh approximation, from its formula */
    double one = 1.0, g1;
    cpu_gelu_forward_f64(&g1, &one, 1);
    CHECK_CLOSE(g1, 0.5 * (1 + tanh(sqrt(2 / M_PI) * (1 + 0.044715))), 1e-14, 0, "gelu(1)");
    CHECK_CLOSE(g1, 0.8411919906082768, 1e-12, 0, "gelu(1) literal");
    Var vg[] = {{"inp", S.inp, S.dinp, n}};
    check_grads("gelu", gelu_loss, gelu_back, vg, 1, 1);

    swiglu_loss();
    double *want = zeros(n);
    for (int i = 0; i < n; i++)
        want[i] = S.inp[i] / (1 + exp(-S.inp[i])) * S.inp2[i];
    check_arrays("swiglu forward", S.out, want, n, 1e-14, 1e-15);
    Var vs[] = {{"gate", S.inp, S.dinp, n}, {"up", S.inp2, S.dinp2, n}};
    check_grads("swiglu", swiglu_loss, swiglu_back, vs, 2, 1);

    /* fp32 */
    float *fi = tof(S.inp, n), *fu = tof(S.inp2, n), *fr = tof(S.r, n), *fo = malloc(n * 4);
    float *fdi = calloc(n, 4), *fdu = calloc(n, 4);
    gelu_loss();
    cpu->gelu_forward(fo, fi, n);
    check_f32("gelu fp32 out", fo, S.out, n, 1e-5, 1e-6);
    memset(S.dinp, 0, n * 8);
    gelu_back();
    cpu->gelu_backward(fdi, fi, fr, n, GRAD_ADD);
    check_f32("gelu fp32 dinp", fdi, S.dinp, n, 1e-5, 1e-6);
    swiglu_loss();
    cpu->swiglu_forward(fo, fi, fu, n);
    check_f32("swiglu fp32 out", fo, S.out, n, 1e-5, 1e-6);
    memset(S.dinp, 0, n * 8), memset(S.dinp2, 0, n * 8), memset(fdi, 0, n * 4);
    swiglu_back();
    cpu->swiglu_backward(fdi, fdu, fr, fi, fu, n, GRAD_ADD);
    check_f32("swiglu fp32 dgate", fdi, S.dinp, n, 1e-5, 1e-6);
    check_f32("swiglu fp32 dup", fdu, S.dinp2, n, 1e-5, 1e-6);

    free(fi), free(fu), free(fr), free(fo), free(fdi), free(fdu), free(want);
    free(S.inp), free(S.inp2), free(S.out), free(S.r), free(S.dinp), free(S.dinp2);
}

/* ------------------------------------------------------------------ rope */

static size_t qkv_size(void) { return (size_t)S.B * S.T * (S.H + 2 * S.KVH) * S.hs; }

static double rope_loss(void)
{
    memcpy(S.out, S.inp, qkv_size() * sizeof(double));
    cpu_rope_forward_f64(S.out, NULL, S.B * S.T, S.T, 0, S.H, S.KVH, S.hs, S.rf);
    return dotd(S.out, S.r, qkv_size());
}

/* rope_backward works in place on the incoming gradient; accumulate here */
static void rope_back(void)
{
    memcpy(S.tmp, S.r, qkv_size() * sizeof(double));
    cpu_rope_backward_f64(S.tmp, NULL, S.B * S.T, S.T, 0, S.H, S.KVH, S.hs, S.rf);
    for (size_t i = 0; i < qkv_size(); i++)
        S.dinp[i] += S.tmp[i];
}

/* inv_freq[i]: the expected frequency of pair i (from outside the code
 * under test). */
static void test_rope(RopeFreq rf, int hs, const double *inv_freq, const char *what)
{
    const Backend *cpu = backend_cpu();
    S.B = 2, S.T = 5, S.H = 4, S.KVH = 2, S.hs = hs, S.rf = rf;
    int Q = S.H / S.KVH, W = (S.H + 2 * S.KVH) * S.hs, N = S.B * S.T;
    size_t n = qkv_size();
    S.inp = rnd(n), S.out = zeros(n), S.r = rnd(n), S.tmp = zeros(n), S.dinp = zeros(n);

    /* forward from the definition: pair (2i, 2i+1) of q and k heads turned
     * by pos * inv_freq[i]; value heads untouched */
    rope_loss();
    double *want = copy(S.inp, n);
    for (int row = 0; row < N; row++)
        for (int g = 0; g < S.KVH; g++)
            for (int j = 0; j <= Q; j++) /* Q query heads, then the key head */
                for (int i = 0; i < S.hs / 2; i++) {
                    double a = (row % S.T) * inv_freq[i];
                    double *p = want + (size_t)row * W + (g * (Q + 2) + j) * S.hs + 2 * i;
                    double x0 = p[0], x1 = p[1];
                    p[0] = x0 * cos(a) - x1 * sin(a);
                    p[1] = x0 * sin(a) + x1 * cos(a);
                }
    char name[96];
    snprintf(name, sizeof name, "rope%s forward", what);
    check_arrays(name, S.out, want, n, 1e-13, 1e-14);
    /* one spot value: row 1 (pos 1), first query head, pair 0, angle 1 rad
     * (pair 0 is never scaled: the shortest wavelength) */
    double x0 = S.inp[W], x1 = S.inp[W + 1];
    CHECK_CLOSE(S.out[W], x0 * cos(1.0) - x1 * sin(1.0), 1e-13, 1e-14, "rope pos 1");
    Var v[] = {{"qkv", S.inp, S.dinp, n}};
    snprintf(name, sizeof name, "rope%s", what);
    check_grads(name, rope_loss, rope_back, v, 1, 0);

    float *fq = tof(S.inp, n), *fr = tof(S.r, n);
    cpu->rope_forward(fq, NULL, N, S.T, 0, S.H, S.KVH, S.hs, S.rf);
    check_f32("rope fp32 forward", fq, S.out, n, 1e-5, 1e-6);
    memcpy(S.tmp, S.r, n * 8);
    cpu_rope_backward_f64(S.tmp, NULL, N, S.T, 0, S.H, S.KVH, S.hs, S.rf);
    cpu->rope_backward(fr, NULL, N, S.T, 0, S.H, S.KVH, S.hs, S.rf);
    check_f32("rope fp32 backward", fr, S.tmp, n, 1e-5, 1e-6);
    free(fq), free(fr), free(want);
    free(S.inp), free(S.out), free(S.r), free(S.tmp), free(S.dinp);
}

/* ------------------------------------------------------------- attention */

static double att_loss(void)
{
    const AttnArgs a = attn_args(S.B, S.T, S.H, S.KVH, S.hs);
    cpu_attention_forward_f64(S.out, S.att, S.inp, S.inp, &a);
    return dotd(S.out, S.r, (size_t)S.B * S.T * S.H * S.hs);
}

/* From the out and lse of the forward just before (check_grads's order). */
static void att_back(void)
{
    const AttnArgs a = attn_args(S.B, S.T, S.H, S.KVH, S.hs);
    cpu_attention_backward_f64(S.dinp, S.dinp, S.r, S.inp, S.inp, S.out, S.att, &a);
}

/* Causal softmax attention written directly from backend.h: out, and the
 * log-sum-exp of each row's scaled scores. */
static void ref_attention(double *out, double *lse, const double *qkv)
{
    int Q = S.H / S.KVH, W = (S.H + 2 * S.KVH) * S.hs, hs = S.hs;
    for (int b = 0; b < S.B; b++)
        for (int h = 0; h < S.H; h++) {
            int g = h / Q, qcol = (g * (Q + 2) + h % Q) * hs, kcol = (g * (Q + 2) + Q) * hs;
            for (int t = 0; t < S.T; t++) {
                double p[16], sum = 0;
                const double *q = qkv + (size_t)(b * S.T + t) * W + qcol;
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + (size_t)(b * S.T + u) * W + kcol;
                    sum += p[u] = exp(dotd(q, k, hs) / sqrt(hs));
                }
                lse[(b * S.H + h) * S.T + t] = log(sum);
                double *o = out + (size_t)(b * S.T + t) * S.H * hs + h * hs;
                for (int i = 0; i < hs; i++) {
                    o[i] = 0;
                    for (int u = 0; u <= t; u++)
                        o[i] += p[u] / sum * qkv[(size_t)(b * S.T + u) * W + kcol + hs + i];
                }
            }
        }
}

/* Decoding (backend.h): the sequence fed in pieces (a prompt of 5 rows,
 * then one row at a time, then the T - 8 left) through rope_decode and
 * attention_decode gives the rows of rope_forward + attention_forward over
 * the whole sequence (B = 1): the same products in the same order.  A
 * large last piece is split over threads. */
static void test_decode(int H, int KVH, int hs, int T)
{
    const Backend *cpu = backend_cpu();
    const int W = (H + 2 * KVH) * hs, O = H * hs;
    double *raw = rnd((size_t)T * W);
    float *full = tof(raw, (size_t)T * W), *pieces = tof(raw, (size_t)T * W);
    float *out_full = calloc((size_t)T * O, sizeof(float)), *lse = calloc((size_t)H * T, 4);
    float *out = calloc((size_t)T * O, sizeof(float));
    float *kc = calloc((size_t)T * KVH * hs, 4), *vc = calloc((size_t)T * KVH * hs, 4);
    cpu->rope_forward(full, NULL, T, T, 0, H, KVH, hs, (RopeFreq){.theta = 1e4});
    const AttnArgs a = attn_args(1, T, H, KVH, hs);
    cpu->attention_forward(out_full, lse, full, full, &a);
    const int cut[] = {0, 5, 6, 7, 8, T};
    for (int i = 0; i + 1 < (int)(sizeof cut / sizeof *cut); i++) {
        const int pos = cut[i], n = cut[i + 1] - cut[i];
        cpu->rope_decode(pieces + (size_t)pos * W, n, pos, H, KVH, hs, (RopeFreq){.theta = 1e4});
        cpu->attention_decode(out + (size_t)pos * O, pieces + (size_t)pos * W, kc, vc, n, NULL, pos,
                              H, KVH, hs);
    }
    double *want = calloc((size_t)T * O, sizeof(double)), *wq = calloc((size_t)T * W, 8);
    for (size_t i = 0; i < (size_t)T * O; i++)
        want[i] = out_full[i];
    for (size_t i = 0; i < (size_t)T * W; i++)
        wq[i] = full[i];
    char what[96];
    snprintf(what, sizeof what, "rope_decode in pieces = rope_forward (H %d, KVH %d)", H, KVH);
    check_f32(what, pieces, wq, (size_t)T * W, 0, 0);
    snprintf(what, sizeof what, "attention_decode in pieces = attention_forward (H %d, KVH %d)", H,
             KVH);
    check_f32(what, out, want, (size_t)T * O, 0, 0);
    /* the cache holds every position's key and value heads */
    const int Q = H / KVH;
    int cache_ok = 1;
    for (int t = 0; t < T; t++)
        for (int g = 0; g < KVH; g++)
            for (int c = 0; c < hs; c++) {
                const float *k = full + (size_t)t * W + ((size_t)g * (Q + 2) + Q) * hs;
                cache_ok &= kc[((size_t)t * KVH + g) * hs + c] == k[c] &&
                            vc[((size_t)t * KVH + g) * hs + c] == k[hs + c];
            }
    CHECK(cache_ok, "attention_decode: the cache holds the keys and values (H %d, KVH %d)", H, KVH);
    free(raw), free(full), free(pieces), free(out_full), free(lse), free(out), free(kc), free(vc),
        free(want), free(wq);
}

static void test_attention(int H, int KVH)
{
    const Backend *cpu = backend_cpu();
    S.B = 2, S.T = 5, S.H = H, S.KVH = KVH, S.hs = 4;
    char op[64];
    snprintf(op, sizeof op, "attention H=%d KVH=%d", H, KVH);
    size_t n = qkv_size(), no = (size_t)S.B * S.T * H * S.hs, nl = (size_t)S.B * H * S.T;
    S.inp = rnd(n), S.out = zeros(no), S.r = rnd(no), S.dinp = zeros(n);
    S.att = zeros(nl);
    for (size_t i = 0; i < n; i++)
        S.inp[i] *= 2; /* peaked enough softmaxes */

    att_loss();
    double *want = zeros(no), *want_lse = zeros(nl);
    ref_attention(want, want_lse, S.inp);
    check_arrays(op, S.out, want, no, 1e-12, 1e-13);
    snprintf(op, sizeof op, "attention H=%d KVH=%d lse", H, KVH);
    check_arrays(op, S.att, want_lse, nl, 1e-12, 1e-13);
    snprintf(op, sizeof op, "attention H=%d KVH=%d", H, KVH);
    Var v[] = {{"qkv", S.inp, S.dinp, n}};
    check_grads(op, att_loss, att_back, v, 1, 1);

    float *fq = tof(S.inp, n), *fr = tof(S.r, no), *fo = malloc(no * 4);
    float *fl = malloc(nl * 4), *fd = calloc(n, 4);
    att_loss();
    const AttnArgs a = attn_args(S.B, S.T, H, KVH, S.hs);
    cpu->attention_forward(fo, fl, fq, fq, &a);
    check_f32("attention fp32 out", fo, S.out, no, 1e-5, 1e-6);
    check_f32("attention fp32 lse", fl, S.att, nl, 1e-5, 1e-6);
    memset(S.dinp, 0, n * 8);
    att_back();
    cpu->attention_backward(fd, fd, fr, fq, fq, fo, fl, &a);
    check_f32("attention fp32 dqkv", fd, S.dinp, n, 1e-4, 1e-5);
    free(fq), free(fr), free(fo), free(fl), free(fd), free(want), free(want_lse);
    free(S.inp), free(S.out), free(S.r), free(S.dinp), free(S.att);
}

/* Rows r0 .. r0+n-1 of each of B sequences of T rows of width W. */
static double *rows_of(const double *x, int B, int T, int W, int r0, int n)
{
    double *y = malloc((size_t)B * n * W * sizeof *y);
    for (int b = 0; b < B; b++)
        memcpy(y + (size_t)b * n * W, x + ((size_t)b * T + r0) * W, (size_t)n * W * sizeof *y);
    return y;
}

/* Packed documents (AttnArgs.pos): each document of a packed window,
 * attended on its own as a whole sequence, gives the packed window's rows
 * of out, lse and dqkv exactly, and RoPE turns its rows as positions from 0. */
static void test_attention_documents(int H, int KVH)
{
    const int B = 2, T = 13, hs = 4, W = (H + 2 * KVH) * hs, O = H * hs;
    const int lens[] = {5, 1, 4, 3, 7};
    int32_t *pos = doc_positions(B, T, lens, 5);
    size_t n = (size_t)B * T * W, no = (size_t)B * T * O, nl = (size_t)B * H * T;
    double *qkv = rnd(n), *out = zeros(no), *lse = zeros(nl), *dout = rnd(no), *dqkv = zeros(n);
    for (size_t i = 0; i < n; i++)
        qkv[i] *= 2;
    double *roped = copy(qkv, n);
    cpu_rope_forward_f64(roped, pos, B * T, T, 0, H, KVH, hs, (RopeFreq){.theta = 1e4});
    AttnArgs a = attn_args(B, T, H, KVH, hs);
    a.pos = pos;
    cpu_attention_forward_f64(out, lse, qkv, qkv, &a);
    cpu_attention_backward_f64(dqkv, dqkv, dout, qkv, qkv, out, lse, &a);

    int docs = 0, ok = 1;
    for (int b = 0; b < B; b++)
        for (int s = 0; s < T;) {
            int e = s + 1;
            while (e < T && pos[(size_t)b * T + e] != 0)
                e++;
            const int L = e - s;
            double *q1 = rows_of(qkv + (size_t)b * T * W, 1, T, W, s, L),
                   *r1 = copy(q1, (size_t)L * W);
            double *o1 = zeros((size_t)L * O), *l1 = zeros((size_t)H * L),
                   *g1 = zeros((size_t)L * W);
            double *d1 = rows_of(dout + (size_t)b * T * O, 1, T, O, s, L);
            AttnArgs one = attn_args(1, L, H, KVH, hs);
            cpu_attention_forward_f64(o1, l1, q1, q1, &one);
            cpu_attention_backward_f64(g1, g1, d1, q1, q1, o1, l1, &one);
            cpu_rope_forward_f64(r1, NULL, L, L, 0, H, KVH, hs, (RopeFreq){.theta = 1e4});
            for (int t = 0; t < L; t++) {
                const size_t row = (size_t)b * T + s + t;
                ok &= !memcmp(o1 + (size_t)t * O, out + row * O, (size_t)O * sizeof(double));
                ok &= !memcmp(g1 + (size_t)t * W, dqkv + row * W, (size_t)W * sizeof(double));
                ok &= !memcmp(r1 + (size_t)t * W, roped + row * W, (size_t)W * sizeof(double));
                for (int h = 0; h < H; h++)
                    ok &= l1[(size_t)h * L + t] == lse[((size_t)b * H + h) * T + s + t];
            }
            free(q1), free(r1), free(o1), free(l1), free(g1), free(d1);
            docs++, s = e;
        }
    CHECK(ok && docs == 7,
          "attention H=%d KVH=%d: %d packed documents equal each document on its own "
          "(out, lse, dqkv, rope; bitwise)",
          H, KVH, docs);
    free(pos), free(qkv), free(roped), free(out), free(lse), free(dout), free(dqkv);
}

/* A sequence split into 3 blocks of rows, as ranks of a context-parallel
 * group hold it: query block i attends to key blocks 0, 1, 2 (those after
 * it see nothing) in calls with their global offsets, merged through lse,
 * keys in the fused or the packed layout, with or without documents; the
 * merged out and lse equal one call over the whole sequence, and the
 * gradients of the block pairs, from the final out and lse, add up to the
 * whole one's. */
static void test_attention_split(int H, int KVH, int packed, int documents)
{
    enum { B = 2, P = 3, R = 5, T = P * R };
    const int hs = 4, W = (H + 2 * KVH) * hs, O = H * hs, KW = packed ? 2 * KVH * hs : W;
    const int Q = H / KVH, lens[] = {4, 9, 2, 6};
    int32_t *pos = documents ? doc_positions(B, T, lens, 4) : NULL;
    size_t n = (size_t)B * T * W, no = (size_t)B * T * O, nl = (size_t)B * H * T;
    double *qkv = rnd(n), *out = zeros(no), *lse = zeros(nl), *dout = rnd(no), *dqkv = zeros(n);
    for (size_t i = 0; i < n; i++)
        qkv[i] *= 2;
    AttnArgs a = attn_args(B, T, H, KVH, hs);
    a.pos = pos;
    cpu_attention_forward_f64(out, lse, qkv, qkv, &a);
    cpu_attention_backward_f64(dqkv, dqkv, dout, qkv, qkv, out, lse, &a);

    double *q[P], *kv[P], *o[P], *l[P], *d[P], *dq[P], *dkv[P];
    int32_t *bpos[P];
    for (int i = 0; i < P; i++) {
        q[i] = rows_of(qkv, B, T, W, i * R, R);
        kv[i] = calloc((size_t)B * R * KW, sizeof(double));
        for (size_t r = 0; r < (size_t)B * R; r++) /* its key and value heads */
            for (int g = 0; g < KVH; g++)
                memcpy(
                    kv[i] + r * KW + (packed ? (size_t)g * 2 * hs : ((size_t)g * (Q + 2) + Q) * hs),
                    q[i] + r * W + ((size_t)g * (Q + 2) + Q) * hs, 2 * (size_t)hs * sizeof(double));
        o[i] = zeros((size_t)B * R * O), l[i] = zeros((size_t)B * H * R);
        d[i] = rows_of(dout, B, T, O, i * R, R);
        dq[i] = zeros((size_t)B * R * W), dkv[i] = zeros((size_t)B * R * KW);
        bpos[i] = NULL;
        if (pos) {
            bpos[i] = malloc((size_t)B * R * sizeof(int32_t));
            for (int b = 0; b < B; b++)
                memcpy(bpos[i] + b * R, pos + (size_t)b * T + i * R, R * sizeof(int32_t));
        }
    }
    for (int i = 0; i < P; i++)
        for (int j = 0; j < P; j++) {
            AttnArgs c = attn_args(B, R, H, KVH, hs);
            c.q_pos0 = i * R, c.k_pos0 = j * R, c.pos = bpos[i], c.kv_packed = packed,
            c.merge = j > 0;
            cpu_attention_forward_f64(o[i], l[i], q[i], kv[j], &c);
        }
    for (int i = 0; i < P; i++)
        for (int j = 0; j < P; j++) {
            AttnArgs c = attn_args(B, R, H, KVH, hs);
            c.q_pos0 = i * R, c.k_pos0 = j * R, c.pos = bpos[i], c.kv_packed = packed;
            cpu_attention_backward_f64(dq[i], dkv[j], d[i], q[i], kv[j], o[i], l[i], &c);
        }
    /* the pieces back in the whole layout */
    double *got_o = zeros(no), *got_l = zeros(nl), *got_d = zeros(n);
    for (int i = 0; i < P; i++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < R; t++) {
                const size_t row = (size_t)b * T + i * R + t, r = (size_t)b * R + t;
                memcpy(got_o + row * O, o[i] + r * O, (size_t)O * sizeof(double));
                for (int h = 0; h < H; h++)
                    got_l[((size_t)b * H + h) * T + i * R + t] = l[i][((size_t)b * H + h) * R + t];
                for (int k = 0; k < W; k++) /* dq[i] holds the query heads, zeros elsewhere */
                    got_d[row * W + k] += dq[i][r * W + k];
                for (int g = 0; g < KVH; g++)
                    for (int k = 0; k < 2 * hs; k++)
                        got_d[row * W + ((size_t)g * (Q + 2) + Q) * hs + k] +=
                            dkv[i]
                               [r * KW +
                                (packed ? (size_t)g * 2 * hs : ((size_t)g * (Q + 2) + Q) * hs) + k];
            }
    char what[128];
    snprintf(what, sizeof what, "attention H=%d KVH=%d in %d blocks, packed %d, documents %d: out",
             H, KVH, P, packed, documents);
    check_arrays(what, got_o, out, no, 1e-12, 1e-13);
    snprintf(what, sizeof what, "attention H=%d KVH=%d in %d blocks, packed %d, documents %d: lse",
             H, KVH, P, packed, documents);
    check_arrays(what, got_l, lse, nl, 1e-12, 1e-13);
    snprintf(what, sizeof what, "attention H=%d KVH=%d in %d blocks, packed %d, documents %d: dqkv",
             H, KVH, P, packed, documents);
    check_arrays(what, got_d, dqkv, n, 1e-11, 1e-12);
    for (int i = 0; i < P; i++)
        free(q[i]), free(kv[i]), free(o[i]), free(l[i]), free(d[i]), free(dq[i]), free(dkv[i]),
            free(bpos[i]);
    free(pos), free(qkv), free(out), free(lse), free(dout), free(dqkv), free(got_o), free(got_l),
        free(got_d);
}

/* ---------------------------------------------------------- crossentropy */

static double ce_loss(void)
{
    cpu_crossentropy_forward_f64(S.out, S.inp, S.tokens, S.N, S.V, S.Vp);
    double s = 0;
    for (int n = 0; n < S.N; n++)
        s += S.out[n];
    return s * S.dloss;
}

/* backward overwrites the logits it is given: work on a copy */
static void ce_back(void)
{
    size_t n = (size_t)S.N * S.Vp;
    memcpy(S.tmp, S.inp, n * sizeof(double));
    cpu_crossentropy_backward_f64(S.tmp, S.tokens, S.dloss, S.N, S.V, S.Vp);
    for (size_t i = 0; i < n; i++)
        S.dinp[i] += S.tmp[i];
}

static void test_crossentropy(void)
{
    const Backend *cpu = backend_cpu();
    /* a hand case: logits (1, 2, 3) and target 2:
     * -log softmax = log(e^1 + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2) */
    double l3[3] = {1, 2, 3}, loss1;
    int32_t t3 = 2;
    cpu_crossentropy_forward_f64(&loss1, l3, &t3, 1, 3, 3);
    CHECK_CLOSE(loss1, 0.40760596444438, 1e-12, 0, "crossentropy (1,2,3)->2");
    float f3[4] = {1, 2, 3, 1000}, fl; /* padded column must not count */
    cpu->crossentropy_forward(&fl, f3, &t3, 1, 3, 4);
    CHECK_CLOSE(fl, 0.40760596444438, 1e-6, 0, "crossentropy fp32 padded");

    int32_t targets[] = {1, -1, 4, 0};
    int N = 4, V = 5, Vp = 8;
    S.N = N, S.V = V, S.Vp = Vp, S.tokens = targets, S.dloss = 0.7f;
    size_t n = (size_t)N * Vp;
    S.inp = rnd(n), S.out = zeros(N), S.tmp = zeros(n), S.dinp = zeros(n);
    for (int r = 0; r < N; r++)
        for (int v = V; v < Vp; v++)
            S.inp[r * Vp + v] = 30; /* padding that would dominate if counted */
    ce_loss();
    double want0 = 0;
    for (int v = 0; v < V; v++)
        want0 += exp(S.inp[v]);
    CHECK_CLOSE(S.out[0], log(want0) - S.inp[1], 1e-13, 0, "crossentropy row 0");
    CHECK(S.out[1] == 0, "crossentropy: ignored target gives loss 0");
    Var v[] = {{"logits", S.inp, S.dinp, n}};
    check_grads("crossentropy", ce_loss, ce_back, v, 1, 0);
    memset(S.dinp, 0, n * 8);
    ce_back();
    int zero_ok = 1;
    for (int c = 0; c < Vp; c++)
        zero_ok &= S.dinp[1 * Vp + c] == 0;
    for (int r = 0; r < N; r++)
        for (int c = V; c < Vp; c++)
            zero_ok &= S.dinp[r * Vp + c] == 0;
    CHECK(zero_ok, "crossentropy: ignored row and padding get exactly zero gradient");

    float *fl4 = tof(S.inp, n), *floss = malloc(N * 4);
    cpu->crossentropy_forward(floss, fl4, targets, N, V, Vp);
    check_f32("crossentropy fp32 losses", floss, S.out, N, 1e-5, 1e-6);
    cpu->crossentropy_backward(fl4, targets, S.dloss, N, V, Vp);
    check_f32("crossentropy fp32 dlogits", fl4, S.dinp, n, 1e-5, 1e-6);
    free(fl4), free(floss), free(S.inp), free(S.out), free(S.tmp), free(S.dinp);
}

/* ------------------------------------------------------- vector helpers */

static void test_vector_ops(void)
{
    const Backend *cpu = backend_cpu();
    enum { n = 1000 };
    static float a[n], b[n], y[n];
    for (int i = 0; i < n; i++)
        a[i] = (float)i, b[i] = 0.5f * i, y[i] = 1;
    cpu->add(y, a, b, n);
    CHECK(y[10] == 15 && y[999] == 1498.5f, "add: %g %g", y[10], y[999]);
    cpu->add(a, a, b, n); /* out aliasing a */
    CHECK(a[10] == 15, "add in place: %g", a[10]);
    cpu->accumulate(y, b, n);
    CHECK(y[10] == 20, "accumulate: %g", y[10]);
    cpu->scale(y, 0.25f, n);
    CHECK(y[10] == 5, "scale: %g", y[10]);
    /* sum of i^2 for i < 1000 = 999*1000*1999/6 (exact in double) */
    for (int i = 0; i < n; i++)
        a[i] = (float)i;
    CHECK(cpu->sumsq(a, n) == 332833500.0, "sumsq: %.17g", cpu->sumsq(a, n));
    CHECK(cpu->sumsq(a, 3) == 5.0, "sumsq of 3: %g", cpu->sumsq(a, 3));
    double d[3] = {1, 2, 3};
    CHECK(cpu_sumsq_f64(d, 3) == 14.0, "sumsq f64");
    /* 1e8 = 0x1.7d784p26 is exact in fp32; its square only in double */
    float big = 1e8f;
    CHECK(cpu->sumsq(&big, 1) == 1e16, "sumsq accumulates in double");
}

/* ----------------------------------------------------------------- adamw */

static void test_adamw(void)
{
    const Backend *cpu = backend_cpu();
    const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    double w[3] = {0.5, -1.0, 2.0}, m[3] = {0}, v[3] = {0};
    double g[2][3] = {{0.1, -0.2, 0.0}, {0.3, 0.1, -0.5}};
    float fw[3], fm[3] = {0}, fv[3] = {0}, fg[3], fp[3];
    double dw[3], dm[3] = {0}, dv[3] = {0}, dp[3];
    for (int i = 0; i < 3; i++)
        fw[i] = (float)w[i], dw[i] = w[i];
    for (int t = 1; t <= 2; t++) {
        /* the step, written out (hyper-parameters as the fp32 values) */
        for (int i = 0; i < 3; i++) {
            m[i] = (double)b1 * m[i] + (1 - (double)b1) * g[t - 1][i];
            v[i] = (double)b2 * v[i] + (1 - (double)b2) * g[t - 1][i] * g[t - 1][i];
            double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
            w[i] -= (double)lr * (mhat / (sqrt(vhat) + (double)eps) + (double)wd * w[i]);
            fg[i] = (float)g[t - 1][i];
        }
        cpu->adamw(fp, fw, fg, fm, fv, 3, lr, b1, b2, eps, wd, 1.0f, t, 0);
        cpu_adamw_f64(dp, dw, g[t - 1], dm, dv, 3, lr, b1, b2, eps, wd, 1.0f, t, 0);
        for (int i = 0; i < 3; i++) {
            CHECK_CLOSE(fw[i], w[i], 1e-6, 1e-7, "adamw fp32 master");
            CHECK(fp[i] == fw[i], "adamw fp32 param = master without rounding");
            CHECK_CLOSE(fm[i], m[i], 1e-6, 1e-9, "adamw fp32 m");
            CHECK_CLOSE(fv[i], v[i], 1e-6, 1e-12, "adamw fp32 v");
            CHECK_CLOSE(dw[i], w[i], 1e-12, 1e-15, "adamw f64 master");
            CHECK_CLOSE(dm[i], m[i], 1e-12, 1e-15, "adamw f64 m");
            CHECK_CLOSE(dv[i], v[i], 1e-12, 1e-15, "adamw f64 v");
        }
    }
    /* at t=1 the update is lr*(sign(g) + wd*w): a value to read off */
    CHECK_CLOSE(0.5 - 0.01 * (1 + 0.1 * 0.5), 0.48950, 1e-12, 0, "hand value");
    /* param aliasing master (fp32 training) */
    float pw[2] = {1.0f, -2.0f}, pg[2] = {0.5f, 0.25f}, pm[2] = {0}, pv[2] = {0};
    cpu->adamw(pw, pw, pg, pm, pv, 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1, 0);
    CHECK_CLOSE(pw[0], 0.9, 1e-6, 0, "adamw aliased 0");
    CHECK_CLOSE(pw[1], -2.1, 1e-6, 0, "adamw aliased 1");
    /* bf16 working copy: param is master rounded, master keeps fp32 bits */
    float bw[1] = {1.0f}, bp[1], bg[1] = {1.0f}, bm[1] = {0}, bv[1] = {0};
    cpu->adamw(bp, bw, bg, bm, bv, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1, 1);
    CHECK_CLOSE(bw[0], 0.999, 1e-6, 0, "adamw bf16 master");
    CHECK(bp[0] == bf16_round(bw[0]) && bp[0] == 1.0f,
          "adamw bf16 param: %.9g (1 - 1e-3 rounds to 1 in bf16)", bp[0]);
    /* grad_scale (clipping inside the pass) = scale() then AdamW, bit for
     * bit, and the gradient is left unscaled */
    float sw[3] = {0.5f, -1.0f, 2.0f}, sg[3] = {0.3f, -0.7f, 1e-3f}, sm[3] = {0.01f, 0, -0.02f},
          sv[3] = {1e-4f, 0, 2e-4f};
    float rw[3], rg[3], rm[3], rv[3];
    memcpy(rw, sw, sizeof sw), memcpy(rg, sg, sizeof sg), memcpy(rm, sm, sizeof sm);
    memcpy(rv, sv, sizeof sv);
    cpu->scale(rg, 0.37f, 3);
    cpu->adamw(rw, rw, rg, rm, rv, 3, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 3, 0);
    cpu->adamw(sw, sw, sg, sm, sv, 3, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.37f, 3, 0);
    CHECK(!memcmp(sw, rw, sizeof sw) && !memcmp(sm, rm, sizeof sm) && !memcmp(sv, rv, sizeof sv),
          "adamw grad_scale = scale, then adamw (bits)");
    CHECK(sg[0] == 0.3f && sg[1] == -0.7f, "adamw grad_scale leaves the gradient as it is");
}

/* ------------------------------------------------------------------ bf16 */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_bf16(void)
{
    struct {
        uint32_t in, out;
        const char *what;
    } cases[] = {
        {0x3f800000u, 0x3f800000u, "1.0 exact"},
        {0x3f808000u, 0x3f800000u, "1+2^-8: tie, kept half even -> down"},
        {0x3f818000u, 0x3f820000u, "1+3*2^-8: tie, kept half odd -> up"},
        {0x3f808001u, 0x3f810000u, "just above the tie -> up"},
        {0x3f807fffu, 0x3f800000u, "just below the tie -> down"},
        {0xbf808000u, 0xbf800000u, "-(1+2^-8) -> -1"},
        {0xbf80c000u, 0xbf810000u, "negative, above the tie -> away from 0"},
        {0x3fffffffu, 0x40000000u, "carry into the exponent"},
        {0x7f7fffffu, 0x7f800000u, "max float rounds to inf"},
        {0x7f800000u, 0x7f800000u, "+inf"},
        {0xff800000u, 0xff800000u, "-inf"},
        {0x00000000u, 0x00000000u, "+0"},
        {0x80000000u, 0x80000000u, "-0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t got = bits(bf16_round(from_bits(cases[i].in)));
        CHECK(got == cases[i].out, "bf16 %s: %08x -> %08x, want %08x", cases[i].what, cases[i].in,
              got, cases[i].out);
    }
    CHECK(isnan(bf16_round(NAN)), "bf16 NaN stays NaN");
    CHECK(isnan(bf16_round(from_bits(0x7f800001u))), "bf16 low-payload NaN stays NaN");
    CHECK((bits(bf16_round(from_bits(0x7fc12345u))) & 0xffffu) == 0, "bf16 NaN low bits");
}

int main(void)
{
    test_matmul(1);
    test_matmul(0);
    test_matmul_split(100, 96, 70, 2); /* forward split by rows */
    test_matmul_split(64, 96, 130, 3); /* forward split by columns */
    test_matmul_bf16(33, 70, 45);
    test_matmul_gelu(backend_cpu(), "", 33, 70, 45);
    test_matmul_gelu(backend_cpu_bf16(), "bf16 ", 33, 70, 45);
    test_grad_set(backend_cpu(), "");
    test_grad_set(backend_cpu_bf16(), "bf16 ");
    test_embedding();
    test_norms();
    test_activations();
    test_rope((RopeFreq){.theta = 1e4}, 4, (const double[]){1, 1e-2}, "");
    /* Llama 3's scaling with a short original context, so that the four
     * pairs fall in all three bands (wavelengths 6.3 and 63 against 25 and
     * 100: unchanged, interpolated, scaled twice).  The frequencies are
     * Hugging Face's formula in numpy:
     *   tests/rope_llama3_ref.py 10000 8 8 1 4 100 */
    test_rope((RopeFreq){.theta = 1e4,
                         .factor = 8,
                         .low_freq_factor = 1,
                         .high_freq_factor = 4,
                         .original_max = 100},
              8, (const double[]){1, 0.02975352506846948, 0.00125, 0.000125}, " llama3");
    test_attention(4, 4); /* multi-head */
    test_attention(4, 2); /* grouped-query */
    test_attention(4, 1); /* multi-query */
    test_attention_documents(4, 2);
    test_attention_documents(3, 3);
    for (int packed = 0; packed < 2; packed++)
        for (int documents = 0; documents < 2; documents++) {
            test_attention_split(4, 2, packed, documents);
            test_attention_split(2, 1, packed, documents);
        }
    test_decode(4, 4, 8, 11);
    test_decode(4, 2, 6, 11);
    test_decode(4, 1, 4, 11);
    test_decode(12, 4, 64, 96); /* the last piece on several threads */
    test_crossentropy();
    test_vector_ops();
    test_adamw();
    test_bf16();
    return check_summary("ops");
}
