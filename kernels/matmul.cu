/* matmul.cu — the linear layer: GEMMs through cuBLAS in strict fp32, the
 * bias broadcast and the bias gradient as small kernels.
 *
 * cuBLAS is column-major and backend.h row-major.  A row-major [R, K]
 * matrix is the same memory as a column-major [K, R] one (its transpose),
 * so each row-major product Y = A . B is computed as Y^T = B^T . A^T with
 * the operands swapped and no copies.
 *
 * Precision: CUBLAS_PEDANTIC_MATH keeps every product in IEEE fp32 (no TF32
 * tensor cores, which round inputs to 10 mantissa bits; no reduced-
 * precision reductions), so the results stay within reduction-order noise
 * of the CPU reference.
 *
 * bf16 (cuda_matmul_*_bf16, training.precision: bf16): each operand is
 * converted to bf16 (round to nearest even) into a workspace, and
 * cuBLAS multiplies bf16 by bf16 into fp32 with fp32 accumulation on the
 * tensor cores, as backend_cpu_bf16() defines.  The forward GEMMs go
 * through cuBLASLt (matmul_lt.cu) with the bias, and for GPT-2's MLP the
 * GELU, in the epilogue; the MLP projection's input gradient through the
 * GELU-gradient epilogue; the other backward GEMMs are cublasGemmEx.  The
 * *_x16 ops (backend.h) take an activation stored in bf16 by its producer
 * and read it as it is (the norms' outputs, the MLP projection's input,
 * the attention output, whose kernel writes a bf16 copy beside the fp32
 * one); a weight inside the step's bf16 weight copy (cuda_weights_bf16,
 * made by the trainer once a step) is read from there; every other
 * operand (other weights, output gradients) is stored in fp32 and
 * converted, a pass over it (an output gradient's with its bias gradient,
 * the column sums, in the same pass: dout_bf16), and the workspace is the
 * bf16 copies of the largest GEMM's two operands (device memory beside the
 * report's categories, as is the weight copy). */
#include "matmul_lt.cuh"
#include "ops.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            trd_fatal(TRD_EXIT_RUNTIME, "check the GPU (nvidia-smi), free memory and the shapes",  \
                      "%s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusString(st_));     \
    } while (0)

/* Bind h to the ops' stream (it changes while a graph is captured,
 * backend.cu) with a workspace of our own: setting the stream resets it,
 * and cuBLAS must not allocate one while capturing. */
static cublasHandle_t blas_bind(cublasHandle_t h, cudaStream_t *bound, int *made)
{
    if (!*made || *bound != cuda_stream()) {
        CUBLAS_CHECK(cublasSetStream(h, cuda_stream()));
        CUBLAS_CHECK(cublasSetWorkspace(h, cuda_blas_workspace(), CUDA_BLAS_WORKSPACE));
        *bound = cuda_stream();
        *made = 1;
    }
    return h;
}

/* One handle per process, made on first use, bound to the ops' stream. */
static cublasHandle_t blas_handle(void)
{
    static cublasHandle_t h;
    static cudaStream_t bound;
    static int made;
    if (!h) {
        CUBLAS_CHECK(cublasCreate(&h));
        CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    }
    return blas_bind(h, &bound, &made);
}

/* For bf16 GEMMs: the default math mode, where bf16 inputs use tensor cores. */
static cublasHandle_t blas_handle_bf16(void)
{
    static cublasHandle_t h;
    static cudaStream_t bound;
    static int made;
    if (!h)
        CUBLAS_CHECK(cublasCreate(&h));
    return blas_bind(h, &bound, &made);
}

/* out[n, o] = bias[o]: the GEMM then adds onto it (beta = 1), as the CPU
 * reference does. */
__global__ void bias_broadcast_kernel(float *out, const float *bias, int N, int OC)
{
    size_t total = (size_t)N * OC;
    GRID_STRIDE(i, total)
    out[i] = bias[i % OC];
}

/* dbias[o] += sum_n dout[n, o]: the column sum (colsum_groups: rows in
 * groups, a fixed order) in a register first, then added once, or a
 * chunk's part of it (colsum_put). */
__global__ void col_sum_acc_kernel(float *acc, float *part, const float *x, int N, int W)
{
    int c = colsum_col(W), n0, n1;
    colsum_rows(N, W, &n0, &n1);
    float s = 0;
    if (c < W)
        for (int n = n0 + colsum_group(); n < n1; n += COLSUM_GROUPS)
            s += x[(size_t)n * W + c];
    s = colsum_groups(s);
    colsum_put(acc, part, W, c, s);
}

/* acc[o] += sum_n x[n, o] (deterministic, common.cuh's column sums) */
void cuda_col_sum_acc(float *acc, const float *x, int N, int W)
{
    const int R = colsum_chunks(N, W);
    float *part = cuda_colsum_scratch(R, W, 1);
    col_sum_acc_kernel<<<colsum_blocks(W) * R, COLSUM_COLS * COLSUM_GROUPS, 0, cuda_stream()>>>(
        acc, part, x, N, W);
    CUDA_CHECK_LAUNCH();
    cuda_colsum_finish(acc, NULL, part, R, W);
}

void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    float alpha = 1, beta = 0;
    if (bias) {
        bias_broadcast_kernel<<<cuda_blocks((size_t)N * OC), CUDA_THREADS, 0, cuda_stream()>>>(
            out, bias, N, OC);
        CUDA_CHECK_LAUNCH();
        beta = 1;
    }
    /* out^T[OC, N] = weight[OC, C] . inp^T[C, N]; weight is col-major
     * [C, OC] (op T), inp col-major [C, N] (op N). */
    CUBLAS_CHECK(cublasSgemm(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &alpha, weight, C,
                             inp, C, &beta, out, OC));
}

/* out[N,OC] += inp[N,C] @ weight[OC,C]^T: cuda_matmul_forward's GEMM with
 * beta 1 (decode.c's residual linear above the GEMV's rows, decode.cu). */
void cuda_matmul_forward_acc(float *out, const float *inp, const float *weight, int N, int C,
                             int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    const float alpha = 1, beta = 1;
    CUBLAS_CHECK(cublasSgemm(blas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &alpha, weight, C,
                             inp, C, &beta, out, OC));
}

/* The GEMM's beta for an input gradient: 0 writes it (GRAD_SET: C is not
 * read, so old garbage or NaN in it is harmless), 1 adds to it. */
static float dinp_beta(GradMode mode) { return mode == GRAD_SET ? 0.0f : 1.0f; }

/* An input gradient of an empty product (OC == 0): 0, SET, or nothing to add. */
static void dinp_empty(float *dinp, GradMode mode, int N, int C)
{
    if (dinp && mode == GRAD_SET && N > 0 && C > 0)
        backend_cuda_zero(dinp, (size_t)N * C * sizeof(float));
}

void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC,
                          GradMode dinp_mode)
{
    /* beta = 1 for dweight: gradients accumulate (backend.h); dinp's as
     * dinp_mode says. */
    float alpha = 1, beta = 1, beta_in = dinp_beta(dinp_mode);
    if (OC <= 0)
        dinp_empty(dinp, dinp_mode, N, C);
    if (N <= 0 || C <= 0 || OC <= 0)
        return;
    if (dinp) /* dinp^T[C, N] (+)= weight^T[C, OC] . dout^T[OC, N] */
        CUBLAS_CHECK(cublasSgemm(blas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &alpha, weight,
                                 C, dout, OC, &beta_in, dinp, C));
    if (dweight) /* dweight^T[C, OC] += inp^T[C, N] . dout[N, OC] */
        CUBLAS_CHECK(cublasSgemm(blas_handle(), CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &alpha, inp, C,
                                 dout, OC, &beta, dweight, C));
    if (dbias) {
        cuda_col_sum_acc(dbias, dout, N, OC);
    }
}

/* ---- bf16 GEMMs ---- */

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    GRID_STRIDE(i, n)
    dst[i] = __float2bfloat16(src[i]);
}

/* Workspace slot k (0 or 1: a GEMM reads two operands) for n bf16 values.
 * A slot grows to the largest operand it has held, so after the first step
 * nothing is allocated; in stream order, a slot is rewritten (or freed,
 * stream-ordered: no device-wide wait while NCCL runs) only after the GEMM
 * that read it. */
static __nv_bfloat16 *bf16_slot(int k, size_t n)
{
    static __nv_bfloat16 *slot[2];
    static size_t cap[2];
    if (n > cap[k]) {
        cuda_free_async(slot[k]);
        slot[k] =
            (__nv_bfloat16 *)cuda_malloc_async(n * sizeof(__nv_bfloat16), "bf16 GEMM operand");
        cap[k] = n;
    }
    return slot[k];
}

/* The bf16 copy of n floats of src in workspace slot k. */
static __nv_bfloat16 *to_bf16(int k, const float *src, size_t n)
{
    __nv_bfloat16 *dst = bf16_slot(k, n);
    PROFILE_PART("to_bf16", 6.0 * (double)n, 0, {
        to_bf16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dst, src, n);
        CUDA_CHECK_LAUNCH();
    });
    return dst;
}

/* dst = x rounded to bf16 (to_bf16_kernel's rounding) and acc += x's column
 * sums, in one read of x [N, W]: col_sum_acc_kernel's walk over the
 * elements (its rows, groups and chunks), so the sums, and the bits of acc,
 * are cuda_col_sum_acc's. */
__global__ void to_bf16_col_sum_kernel(__nv_bfloat16 *dst, float *acc, float *part, const float *x,
                                       int N, int W)
{
    int c = colsum_col(W), n0, n1;
    colsum_rows(N, W, &n0, &n1);
    float s = 0;
    if (c < W)
        for (int n = n0 + colsum_group(); n < n1; n += COLSUM_GROUPS) {
            const float v = x[(size_t)n * W + c];
            dst[(size_t)n * W + c] = __float2bfloat16(v);
            s += v;
        }
    s = colsum_groups(s);
    colsum_put(acc, part, W, c, s);
}

/* dout [N, OC]'s bf16 copy in slot 0 for a backward's GEMMs; with dbias,
 * dbias += its column sums in the same pass (the fp32 sum of dout, as
 * backend_cpu_bf16; the bits of cuda_col_sum_acc), where a conversion and
 * a column sum read dout twice. */
static const __nv_bfloat16 *dout_bf16(float *dbias, const float *dout, int N, int OC)
{
    const size_t n = (size_t)N * OC;
    if (!dbias)
        return to_bf16(0, dout, n);
    __nv_bfloat16 *d = bf16_slot(0, n);
    const int R = colsum_chunks(N, OC);
    float *part = cuda_colsum_scratch(R, OC, 1);
    PROFILE_PART("dout_bf16_dbias", 6.0 * (double)n + 8.0 * OC, 0, {
        to_bf16_col_sum_kernel<<<colsum_blocks(OC) * R, COLSUM_COLS * COLSUM_GROUPS, 0,
                                 cuda_stream()>>>(d, dbias, part, dout, N, OC);
        CUDA_CHECK_LAUNCH();
        cuda_colsum_finish(dbias, NULL, part, R, OC);
    });
    return d;
}

/* The step's bf16 copy of the weights (backend.h weights_bf16): the flat
 * parameter buffer [params, params + n) converted once, read by every bf16
 * GEMM whose weight lies inside it while valid.  The conversion is the
 * same kernel as to_bf16's, so a GEMM reads the same bf16 values either
 * way, as long as the fp32 weights do not change while it is valid (the
 * trainer drops it before the optimizer step). */
static struct {
    const float *params;
    size_t n, cap;
    __nv_bfloat16 *copy;
    int valid;
} wcopy;

void cuda_weights_bf16(const float *params, size_t n)
{
    if (n > wcopy.cap) { /* the first step only: the buffer's size is the model's */
        cuda_free_async(wcopy.copy);
        wcopy.copy =
            (__nv_bfloat16 *)cuda_malloc_async(n * sizeof(__nv_bfloat16), "bf16 weight copy");
        wcopy.cap = n;
    }
    if (n > 0) {
        to_bf16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(wcopy.copy, params, n);
        CUDA_CHECK_LAUNCH();
    }
    wcopy.params = params;
    wcopy.n = n;
    wcopy.valid = 1;
}

void cuda_weights_bf16_drop(void) { wcopy.valid = 0; }

/* The bf16 weight [n] for a GEMM: its place in the step's copy where the
 * copy is valid and holds all of it, else converted into slot k. */
static const __nv_bfloat16 *weight_bf16(int k, const float *weight, size_t n)
{
    const uintptr_t w = (uintptr_t)weight, p = (uintptr_t)wcopy.params;
    if (wcopy.valid && w >= p && n <= wcopy.n && (w - p) / sizeof(float) <= wcopy.n - n)
        return wcopy.copy + (w - p) / sizeof(float);
    return to_bf16(k, weight, n);
}

/* The column-major product of matmul.cu's comment, bf16 A and B, fp32 C. */
static void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb, float beta,
                      float *C, int ldc)
{
    const float alpha = 1;
    const double dm = m, dn = n, dk = k;
    PROFILE_PART(
        "gemm", 2 * (dm * dk + dk * dn) + 4 * dm * dn * (beta != 0 ? 2 : 1), 2 * dm * dn * dk,
        CUBLAS_CHECK(cublasGemmEx(blas_handle_bf16(), ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda,
                                  B, CUDA_R_16BF, ldb, &beta, C, CUDA_R_32F, ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)));
}

/* out = a . weight^T + bias, a the bf16 activation [N, C] (NULL when C is
 * 0): the weight converted, the bias in cuBLASLt's epilogue. */
static void forward_bf16(float *out, const __nv_bfloat16 *a, const float *weight, const float *bias,
                         int N, int C, int OC)
{
    const __nv_bfloat16 *w = C > 0 ? weight_bf16(0, weight, (size_t)OC * C) : NULL;
    /* out^T[OC, N] = weight[OC, C] . inp^T[C, N] + bias, the bias in
     * cuBLASLt's epilogue (a vector over D's OC rows): no broadcast
     * kernel, and out is written once instead of read and written. */
    if (C > 0 && lt_epilogue_ok(bias, NULL, 0) &&
        lt_matmul_bf16(1, 0, OC, N, C, w, C, a, C, out, OC, bias ? LT_BIAS : LT_PLAIN, bias, NULL,
                       0))
        return;
    float beta = 0;
    if (bias) {
        bias_broadcast_kernel<<<cuda_blocks((size_t)N * OC), CUDA_THREADS, 0, cuda_stream()>>>(
            out, bias, N, OC);
        CUDA_CHECK_LAUNCH();
        beta = 1;
    }
    if (C <= 0) {
        if (!bias)
            backend_cuda_zero(out, (size_t)N * OC * sizeof(float));
        return;
    }
    gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, a, C, beta, out, OC);
}

void cuda_matmul_forward_bf16(float *out, const float *inp, const float *weight, const float *bias,
                              int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    forward_bf16(out, C > 0 ? to_bf16(1, inp, (size_t)N * C) : NULL, weight, bias, N, C, OC);
}

/* The same with inp stored in bf16: no conversion of it. */
void cuda_matmul_forward_x16(float *out, const uint16_t *inp, const float *weight,
                             const float *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    forward_bf16(out, (const __nv_bfloat16 *)inp, weight, bias, N, C, OC);
}

/* dweight and dbias of a bf16 backward, d the bf16 copy of dout (slot 0);
 * the input as bf16 x where it is stored so, else converted from inp. */
static void backward_weight_bias_bf16(float *dweight, float *dbias, const __nv_bfloat16 *d,
                                      const float *dout, const float *inp, const __nv_bfloat16 *x,
                                      int N, int C, int OC)
{
    if (dweight) /* dweight^T[C, OC] += inp^T[C, N] . dout[N, OC] */
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x ? x : to_bf16(1, inp, (size_t)N * C), C, d,
                  OC, 1, dweight, C);
    if (dbias) { /* the fp32 sum of dout, as backend_cpu_bf16 */
        cuda_col_sum_acc(dbias, dout, N, OC);
    }
}

/* d16: dout stored in bf16 (the head's dlogits), read as it is; else dout
 * converted. */
static void backward_bf16(float *dinp, GradMode dinp_mode, float *dweight, float *dbias,
                          const float *dout, const __nv_bfloat16 *d16, const float *inp,
                          const __nv_bfloat16 *x, const float *weight, int N, int C, int OC)
{
    if (OC <= 0)
        dinp_empty(dinp, dinp_mode, N, C);
    if (N <= 0 || C <= 0 || OC <= 0)
        return;
    const __nv_bfloat16 *d = d16;
    if (!d && (dinp || dweight)) {
        d = dout_bf16(dbias, dout, N, OC);
        dbias = NULL; /* summed in that pass */
    }
    if (dinp) /* dinp^T[C, N] (+)= weight^T[C, OC] . dout^T[OC, N] */
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight_bf16(1, weight, (size_t)OC * C), C, d,
                  OC, dinp_beta(dinp_mode), dinp, C);
    backward_weight_bias_bf16(dweight, dbias, d, dout, inp, x, N, C, OC);
}

void cuda_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int N, int C, int OC,
                               GradMode dinp_mode)
{
    backward_bf16(dinp, dinp_mode, dweight, dbias, dout, NULL, inp, NULL, weight, N, C, OC);
}

void cuda_matmul_backward_x16(float *dinp, float *dweight, float *dbias, const float *dout,
                              const uint16_t *inp, const float *weight, int N, int C, int OC,
                              GradMode dinp_mode)
{
    backward_bf16(dinp, dinp_mode, dweight, dbias, dout, NULL, NULL, (const __nv_bfloat16 *)inp,
                  weight, N, C, OC);
}

/* The head in bf16 (backend.h): logits^T[OC, N] = weight . inp^T stored in
 * bf16 by the GEMM (no fp32 logits, no conversion pass); the backward
 * reads the bf16 dlogits as they are. */
void cuda_head_forward_x16(uint16_t *logits, const uint16_t *inp, const float *weight, int N, int C,
                           int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    if (C <= 0) {
        backend_cuda_zero(logits, (size_t)N * OC * sizeof(uint16_t));
        return;
    }
    const __nv_bfloat16 *w = weight_bf16(0, weight, (size_t)OC * C);
    const __nv_bfloat16 *a = (const __nv_bfloat16 *)inp;
    __nv_bfloat16 *out = (__nv_bfloat16 *)logits;
    if (lt_matmul_bf16_d16(1, 0, OC, N, C, w, C, a, C, out, OC))
        return;
    const float alpha = 1, beta = 0;
    CUBLAS_CHECK(cublasGemmEx(blas_handle_bf16(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &alpha, w,
                              CUDA_R_16BF, C, a, CUDA_R_16BF, C, &beta, out, CUDA_R_16BF, OC,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void cuda_matmul_backward_d16(float *dinp, float *dweight, const uint16_t *dout,
                              const uint16_t *inp, const float *weight, int N, int C, int OC,
                              GradMode dinp_mode)
{
    backward_bf16(dinp, dinp_mode, dweight, NULL, NULL, (const __nv_bfloat16 *)dout, NULL,
                  (const __nv_bfloat16 *)inp, weight, N, C, OC);
}

/* ---- the linear layer fused with GELU (backend.h), cuBLASLt epilogues ---- */

void cuda_matmul_gelu_forward_bf16(float *out, float *pre, const float *inp, const float *weight,
                                   const float *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    if (C > 0 && bias && lt_epilogue_ok(bias, pre, OC)) {
        /* pre^T[OC, N] = weight . inp^T + bias (the epilogue's aux output),
         * out^T = gelu(pre^T) (D): one GEMM, no bias or GELU kernel. */
        const __nv_bfloat16 *w = weight_bf16(0, weight, (size_t)OC * C);
        const __nv_bfloat16 *a = to_bf16(1, inp, (size_t)N * C);
        if (lt_matmul_bf16(1, 0, OC, N, C, w, C, a, C, out, OC, LT_GELU_BIAS, bias, pre, OC))
            return;
    }
    cuda_matmul_forward_bf16(pre, inp, weight, bias, N, C, OC); /* the two ops */
    cuda_gelu_forward(out, pre, (size_t)N * OC);
}

/* inp and out in bf16, pre in fp32 (gelu' reads it): the GEMM with the bias
 * epilogue into pre, then GELU into bf16 out.  Not the GELU_AUX_BIAS
 * epilogue: cuBLASLt stores its aux in D's type (a bf16 D would round pre,
 * a rounding point the CPU reference does not have), and out is 2 bytes
 * written where the fused fp32 path wrote 4 and then converted them. */
void cuda_matmul_gelu_forward_x16(uint16_t *out, float *pre, const uint16_t *inp,
                                  const float *weight, const float *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    cuda_matmul_forward_x16(pre, inp, weight, bias, N, C, OC);
    cuda_gelu_forward_x16(out, pre, (size_t)N * OC);
}

/* dinp = gelu'(pre) * (dout . weight), SET; x: inp in bf16, or NULL */
static void backward_dgelu_bf16(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const __nv_bfloat16 *x, const float *pre,
                                const float *weight, int N, int C, int OC)
{
    if (N <= 0 || C <= 0)
        return;
    if (OC <= 0) { /* an empty product: the gradient is 0 */
        backend_cuda_zero(dinp, (size_t)N * C * sizeof(float));
        return;
    }
    const __nv_bfloat16 *d = dout_bf16(dbias, dout, N, OC);
    dbias = NULL; /* summed in that pass */
    const __nv_bfloat16 *w = weight_bf16(1, weight, (size_t)OC * C);
    /* dinp^T[C, N] = (weight^T . dout^T) * gelu'(pre^T): DGELU with pre
     * as the aux input; beta 0, as backend.h's SETS.  Else the product,
     * then the gradient through the GELU in place. */
    if (!lt_epilogue_ok(NULL, pre, C) ||
        !lt_matmul_bf16(0, 0, C, N, OC, w, C, d, OC, dinp, C, LT_DGELU, NULL, (float *)pre, C)) {
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, d, OC, 0, dinp, C);
        cuda_gelu_backward_inplace(dinp, pre, (size_t)N * C);
    }
    backward_weight_bias_bf16(dweight, dbias, d, dout, inp, x, N, C, OC);
}

void cuda_matmul_backward_dgelu_bf16(float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *pre, const float *weight, int N,
                                     int C, int OC)
{
    backward_dgelu_bf16(dinp, dweight, dbias, dout, inp, NULL, pre, weight, N, C, OC);
}

void cuda_matmul_backward_dgelu_x16(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const uint16_t *inp, const float *pre, const float *weight,
                                    int N, int C, int OC)
{
    backward_dgelu_bf16(dinp, dweight, dbias, dout, NULL, (const __nv_bfloat16 *)inp, pre, weight,
                        N, C, OC);
}

/* ---- grouped linears (backend.h's matmul_grouped_*, src/model/moe.c's
 * experts) ----
 *
 * Each product of an op is one call of cuBLAS's grouped GEMM (cuBLAS >=
 * 12.5) over the non-empty groups, each a group of one problem in the
 * API's terms.  fp32: cublasSgemmGroupedBatched on the strict-fp32 handle.
 * bf16: cuBLAS documents cublasGemmGroupedBatchedEx with bf16 A and B only
 * for a bf16 C, not the fp32 C (fp32 outputs and accumulated gradients)
 * that the bf16 GEMMs here write; so the operands are rounded to bf16 in
 * fp32 (to_bf16_kernel's rounding, kept in 32 bits) and multiplied with
 * fp32 A, B and C under CUBLAS_COMPUTE_32F_FAST_TF32, which the
 * documentation lists: a bf16 value is exact in TF32 (7 mantissa bits of
 * 10), so the tensor cores multiply the same bf16 values into fp32 sums as
 * cublasGemmEx's bf16 path, reading twice the bytes.  The rounded weights
 * of all the groups are a workspace of one linear's weights in fp32.
 *
 * cuBLAS reads the matrices' pointer arrays from device memory: an op
 * builds its tables (pointers, the groups' rows) on the host and uploads
 * them in one copy.  The biases are kernels: each group's bias broadcast
 * to its rows before the GEMM (beta 1, as cuda_matmul_forward), and each
 * group's column sum of dout (col_sum_acc_kernel's order within a group,
 * one chunk).  Groups that share a weight gradient (expert parallelism:
 * one expert's rows from several ranks) would be overlapping outputs of
 * one grouped GEMM, which cuBLAS does not allow: the weight and bias
 * gradients run in rounds, round r holding the r-th group of each
 * gradient, so they add in group order.
 *
 * Where cuBLAS refuses a grouped call (CUBLAS_STATUS_NOT_SUPPORTED or
 * INVALID_VALUE: a library without it, a type it lacks), the op says so
 * once on stderr and runs the table's per-group GEMMs from then on in
 * that precision (TRIDENT_EMU_NO_GROUPED=1 makes the emulation refuse). */

/* one group's rows of the buffer, [r0, r0 + n) */
struct GroupRows {
    int r0, n;
};

/* The index of the group holding row r (the last with r0 <= r; groups
 * non-empty, in row order). */
__device__ inline int group_find(const GroupRows *g, int np, int r)
{
    int a = 0, b = np - 1;
    while (a < b) {
        int m = (a + b + 1) / 2;
        if (g[m].r0 <= r)
            a = m;
        else
            b = m - 1;
    }
    return a;
}

/* out[r, o] = bias[g][o], g the group of row r: what the GEMM adds onto */
__global__ void grouped_bias_broadcast_kernel(float *out, const float *const *bias,
                                              const GroupRows *rows, int np, int R, int OC)
{
    GRID_STRIDE(i, (size_t)R * OC)
    out[i] = bias[group_find(rows, np, (int)(i / OC))][i % OC];
}

/* acc[j][c] += the sum of x's column c over group j's rows: block (j,
 * column block) as col_sum_acc_kernel's blocks, one chunk per group. */
__global__ void grouped_col_sum_kernel(float *const *acc, const float *x, const GroupRows *rows,
                                       int W)
{
    const int cb = (W + COLSUM_COLS - 1) / COLSUM_COLS, j = blockIdx.x / cb;
    const int c = blockIdx.x % cb * COLSUM_COLS + threadIdx.x % COLSUM_COLS;
    const int n0 = rows[j].r0, n1 = n0 + rows[j].n;
    float s = 0;
    if (c < W)
        for (int n = n0 + colsum_group(); n < n1; n += COLSUM_GROUPS)
            s += x[(size_t)n * W + c];
    s = colsum_groups(s);
    if (colsum_group() == 0 && c < W)
        acc[j][c] += s;
}

/* dst[j * per + i] = bf16_round(src[j][i]) for the np tensors of per
 * floats: the groups' weights rounded, in one launch */
__global__ void grouped_round_kernel(float *dst, const float *const *src, size_t per, int np)
{
    GRID_STRIDE(i, per * np)
    dst[i] = __bfloat162float(__float2bfloat16(src[i / per][i % per]));
}

__global__ void round_bf16_kernel(float *dst, const float *src, size_t n)
{
    GRID_STRIDE(i, n)
    dst[i] = __bfloat162float(__float2bfloat16(src[i]));
}

/* fp32 workspace slot k (0..2) of n floats, grown like to_bf16's */
static float *round_slot(int k, size_t n)
{
    static float *slot[3];
    static size_t cap[3];
    if (n > cap[k]) {
        cuda_free_async(slot[k]);
        slot[k] = (float *)cuda_malloc_async(n * sizeof(float), "bf16-rounded GEMM operand");
        cap[k] = n;
    }
    return slot[k];
}

/* n floats of src rounded to bf16 values in slot k */
static const float *rounded_rows(int k, const float *src, size_t n)
{
    float *d = round_slot(k, n);
    round_bf16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(d, src, n);
    CUDA_CHECK_LAUNCH();
    return d;
}

/* The tables of one grouped op, built on the host and uploaded in one
 * copy: PTR_ARRAYS arrays of np pointers, then ROW_ARRAYS arrays of np
 * GroupRows.  The device copy is sized for G groups (every call of an op
 * site passes the same G), so steady steps allocate nothing. */
enum { PTR_ARRAYS = 8, ROW_ARRAYS = 2 };

static struct {
    void **host; /* [PTR_ARRAYS][np] pointers, then [ROW_ARRAYS][np] GroupRows */
    char *dev;
    int *idx, *round, *order, *start; /* the backward's rounds (host; G + 1 each) */
    size_t cap;                       /* groups */
    int np;
} gt;

static size_t table_bytes(size_t np)
{
    return np * (PTR_ARRAYS * sizeof(void *) + ROW_ARRAYS * sizeof(GroupRows));
}

static void table_reserve(int G)
{
    if ((size_t)G <= gt.cap)
        return;
    free(gt.host);
    free(gt.idx);
    gt.host = (void **)malloc(table_bytes((size_t)G));
    gt.idx = (int *)malloc(4 * ((size_t)G + 1) * sizeof(int));
    gt.round = gt.idx + G + 1, gt.order = gt.round + G + 1, gt.start = gt.order + G + 1;
    if (!gt.host || !gt.idx)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of host memory for a grouped GEMM's table");
    gt.dev = (char *)cuda_scratch(CUDA_SCRATCH_GROUPED, table_bytes((size_t)G));
    gt.cap = (size_t)G;
}

/* array a of the table, host side and device side */
static void **table_ptrs(int a) { return gt.host + (size_t)a * gt.np; }
static void *const *table_ptrs_dev(int a)
{
    return (void *const *)(gt.dev + (size_t)a * gt.np * sizeof(void *));
}
static GroupRows *table_rows(int a)
{
    return (GroupRows *)(gt.host + (size_t)PTR_ARRAYS * gt.np) + (size_t)a * gt.np;
}
static const GroupRows *table_rows_dev(int a)
{
    return (const GroupRows *)(gt.dev + (size_t)PTR_ARRAYS * gt.np * sizeof(void *)) +
           (size_t)a * gt.np;
}

/* from pageable memory: staged by the driver before the call returns, so
 * the host table may be rebuilt at once; the device copy is rewritten only
 * after the work that read it, in stream order */
static void table_upload(void)
{
    CUDA_CHECK(cudaMemcpyAsync(gt.dev, gt.host, table_bytes((size_t)gt.np), cudaMemcpyHostToDevice,
                               cuda_stream()));
}

/* The non-empty groups of off[0..G] into table_rows(0) (in group order);
 * their indices into gt.idx.  Returns their number. */
static int table_groups(const int *off, int G)
{
    table_reserve(G);
    int *idx = gt.idx, np = 0;
    for (int g = 0; g < G; g++)
        if (off[g + 1] > off[g])
            idx[np++] = g;
    gt.np = np;
    for (int j = 0; j < np; j++)
        table_rows(0)[j] = GroupRows{off[idx[j]], off[idx[j] + 1] - off[idx[j]]};
    return np;
}

/* 1 while cuBLAS has taken this precision's grouped calls ([bf16]) */
static int grouped_on[2] = {1, 1};

/* st from a grouped call: 0 done; 1 refused (said once, the per-group path
 * from now on); any other failure is fatal, as CUBLAS_CHECK's */
static int grouped_refused(cublasStatus_t st, int bf16, const char *call)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 0;
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
        trd_fatal(TRD_EXIT_RUNTIME, "check the GPU (nvidia-smi), free memory and the shapes",
                  "%s: %s", call, cublasGetStatusString(st));
    grouped_on[bf16] = 0;
    fprintf(stderr,
            "warning: grouped GEMM not supported for %s (%s: %s); per-expert GEMMs from now on\n",
            bf16 ? "bf16" : "fp32", call, cublasGetStatusString(st));
    return 1;
}

/* One grouped product over np problems, column-major as cuBLAS: problem j
 * is C_j = op(A_j) op(B_j) + beta C_j with A_j, B_j, C_j from the device
 * pointer arrays A, B, C, sizes m, n, k except that the one named by vary
 * (0 m, 1 n, 2 k) is rows[j].n.  Returns 1 when cuBLAS refused it. */
static int gemm_grouped(int bf16, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                        int vary, const GroupRows *rows, void *const *A, int lda, void *const *B,
                        int ldb, float beta, void *const *C, int ldc, int np)
{
#if CUBLAS_VERSION >= 120500
    static struct {
        cublasOperation_t *ta, *tb;
        int *m, *n, *k, *lda, *ldb, *ldc, *size;
        float *alpha, *beta;
        int cap;
    } h;
    if (np > h.cap) {
        free(h.ta);
        h.cap = np;
        /* one allocation: the operations, then the ints, then the floats */
        char *p = (char *)malloc(
            (size_t)np * (2 * sizeof(cublasOperation_t) + 7 * sizeof(int) + 2 * sizeof(float)));
        if (!p)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of host memory for a grouped GEMM");
        h.ta = (cublasOperation_t *)p;
        h.tb = h.ta + np;
        h.m = (int *)(h.tb + np);
        h.n = h.m + np, h.k = h.n + np, h.lda = h.k + np, h.ldb = h.lda + np;
        h.ldc = h.ldb + np, h.size = h.ldc + np;
        h.alpha = (float *)(h.size + np);
        h.beta = h.alpha + np;
    }
    for (int j = 0; j < np; j++) {
        h.ta[j] = ta, h.tb[j] = tb;
        h.m[j] = vary == 0 ? rows[j].n : m;
        h.n[j] = vary == 1 ? rows[j].n : n;
        h.k[j] = vary == 2 ? rows[j].n : k;
        h.lda[j] = lda, h.ldb[j] = ldb, h.ldc[j] = ldc, h.size[j] = 1;
        h.alpha[j] = 1, h.beta[j] = beta;
    }
    cublasStatus_t st;
    const char *call;
    if (bf16) {
        call = "cublasGemmGroupedBatchedEx";
        st = cublasGemmGroupedBatchedEx(
            blas_handle_bf16(), h.ta, h.tb, h.m, h.n, h.k, h.alpha, (const void *const *)A,
            CUDA_R_32F, h.lda, (const void *const *)B, CUDA_R_32F, h.ldb, h.beta, C, CUDA_R_32F,
            h.ldc, np, h.size, CUBLAS_COMPUTE_32F_FAST_TF32);
    } else {
        call = "cublasSgemmGroupedBatched";
        st = cublasSgemmGroupedBatched(blas_handle(), h.ta, h.tb, h.m, h.n, h.k, h.alpha,
                                       (const float *const *)A, h.lda, (const float *const *)B,
                                       h.ldb, h.beta, (float *const *)C, h.ldc, np, h.size);
    }
    return grouped_refused(st, bf16, call);
#else
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)vary, (void)rows, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc, (void)np;
    return grouped_refused(CUBLAS_STATUS_NOT_SUPPORTED, bf16, "grouped GEMM (cuBLAS < 12.5)");
#endif
}

/* The bf16 call's FAST compute type asks its matrices to be 16-byte
 * aligned where a column is a multiple of 16 bytes (cuBLAS's
 * documentation), which a group's rows at r0 * C floats are only for C
 * (and OC) multiples of 4: other widths (none of a real model's) take the
 * per-group path. */
static int grouped_aligned(int bf16, int C, int OC) { return !bf16 || (C % 4 == 0 && OC % 4 == 0); }

typedef void (*MatmulForwardFn)(float *, const float *, const float *, const float *, int, int,
                                int);
typedef void (*MatmulBackwardFn)(float *, float *, float *, const float *, const float *,
                                 const float *, int, int, int, GradMode);

/* The per-group path: the table's matmul on each group's rows. */
static void forward_per_group(MatmulForwardFn mm, float *out, const float *inp,
                              const float *const *w, const float *const *b, const int *off, int G,
                              int C, int OC)
{
    for (int g = 0; g < G; g++)
        if (off[g + 1] > off[g])
            mm(out + (size_t)off[g] * OC, inp + (size_t)off[g] * C, w[g], b ? b[g] : NULL,
               off[g + 1] - off[g], C, OC);
}

static void backward_per_group(MatmulBackwardFn mm, float *dinp, float *const *dw, float *const *db,
                               const float *dout, const float *inp, const float *const *w,
                               const int *off, int G, int C, int OC)
{
    for (int g = 0; g < G; g++)
        if (off[g + 1] > off[g])
            mm(dinp ? dinp + (size_t)off[g] * C : NULL, dw ? dw[g] : NULL, db ? db[g] : NULL,
               dout + (size_t)off[g] * OC, inp + (size_t)off[g] * C, w[g], off[g + 1] - off[g], C,
               OC, GRAD_ADD);
}

/* table arrays of the forward */
enum { F_A, F_B, F_C, F_BIAS, F_WSRC };

static void grouped_forward(int bf16, float *out, const float *inp, const float *const *w,
                            const float *const *b, const int *off, int G, int C, int OC)
{
    MatmulForwardFn per = bf16 ? cuda_matmul_forward_bf16 : cuda_matmul_forward;
    TRD_ASSERT(off[0] == 0); /* backend.h: the groups cover rows [0, off[G]) */
    const int R = off[G];
    if (R <= 0 || OC <= 0)
        return;
    if (!grouped_on[bf16] || C <= 0 || !grouped_aligned(bf16, C, OC)) {
        forward_per_group(per, out, inp, w, b, off, G, C, OC);
        return;
    }
    const int np = table_groups(off, G), *idx = gt.idx;
    const size_t per_w = (size_t)OC * C;
    /* bf16: the weights and inp rounded to bf16 values, in fp32 */
    float *ws = bf16 ? round_slot(0, per_w * np) : NULL;
    const float *x = bf16 ? rounded_rows(1, inp, (size_t)R * C) : inp;
    for (int j = 0; j < np; j++) {
        const int g = idx[j], r0 = table_rows(0)[j].r0;
        table_ptrs(F_A)[j] = bf16 ? (void *)(ws + per_w * j) : (void *)w[g];
        table_ptrs(F_B)[j] = (void *)(x + (size_t)r0 * C);
        table_ptrs(F_C)[j] = out + (size_t)r0 * OC;
        table_ptrs(F_BIAS)[j] = b ? (void *)b[g] : NULL;
        table_ptrs(F_WSRC)[j] = (void *)w[g];
    }
    table_upload();
    if (bf16) {
        grouped_round_kernel<<<cuda_blocks(per_w * np), CUDA_THREADS, 0, cuda_stream()>>>(
            ws, (const float *const *)table_ptrs_dev(F_WSRC), per_w, np);
        CUDA_CHECK_LAUNCH();
    }
    if (b) {
        grouped_bias_broadcast_kernel<<<cuda_blocks((size_t)R * OC), CUDA_THREADS, 0,
                                        cuda_stream()>>>(
            out, (const float *const *)table_ptrs_dev(F_BIAS), table_rows_dev(0), np, R, OC);
        CUDA_CHECK_LAUNCH();
    }
    /* out^T[OC, n] = W[OC, C] . inp^T[C, n] per group (cuda_matmul_forward's) */
    if (gemm_grouped(bf16, CUBLAS_OP_T, CUBLAS_OP_N, OC, 0, C, 1, table_rows(0),
                     table_ptrs_dev(F_A), C, table_ptrs_dev(F_B), C, b ? 1.0f : 0.0f,
                     table_ptrs_dev(F_C), OC, np))
        forward_per_group(per, out, inp, w, b, off, G, C, OC);
}

/* table arrays of the backward: the input gradient's product (group
 * order), the weight gradient's (round order), the bias pointers (round
 * order), the weights to round (group order) */
enum { B_DA, B_DB, B_DC, B_WA, B_WB, B_WC, B_BIAS, B_WSRC };

static void grouped_backward(int bf16, float *dinp, float *const *dw, float *const *db,
                             const float *dout, const float *inp, const float *const *w,
                             const int *off, int G, int C, int OC)
{
    MatmulBackwardFn per = bf16 ? cuda_matmul_backward_bf16 : cuda_matmul_backward;
    TRD_ASSERT(off[0] == 0);
    const int R = off[G];
    if (R <= 0 || C <= 0 || OC <= 0)
        return;
    if (!grouped_on[bf16] || !grouped_aligned(bf16, C, OC)) {
        backward_per_group(per, dinp, dw, db, dout, inp, w, off, G, C, OC);
        return;
    }
    const int np = table_groups(off, G), *idx = gt.idx;
    /* Round of group j: how many earlier groups share its gradient (dw,
     * else db); order: the groups by round, in group order within one;
     * start[r]: where round r begins in it. */
    int *round_of = gt.round, *order = gt.order, *start = gt.start, rounds = 0;
    for (int j = 0; j < np; j++) {
        round_of[j] = 0;
        for (int i = 0; i < j; i++)
            round_of[j] += dw ? dw[idx[i]] == dw[idx[j]] : db ? db[idx[i]] == db[idx[j]] : 0;
        rounds = round_of[j] + 1 > rounds ? round_of[j] + 1 : rounds;
    }
    for (int r = 0, k = 0; r < rounds; r++) {
        start[r] = k;
        for (int j = 0; j < np; j++)
            if (round_of[j] == r)
                order[k++] = j;
    }
    start[rounds] = np;
    const size_t per_w = (size_t)OC * C;
    const float *d = bf16 ? rounded_rows(0, dout, (size_t)R * OC) : dout;
    const float *x = bf16 && dw ? rounded_rows(1, inp, (size_t)R * C) : inp;
    float *ws = bf16 && dinp ? round_slot(2, per_w * np) : NULL;
    for (int j = 0; j < np; j++) {
        const GroupRows gr = table_rows(0)[j];
        const int g = idx[j];
        table_ptrs(B_DA)[j] = bf16 ? (void *)(ws ? ws + per_w * j : NULL) : (void *)w[g];
        table_ptrs(B_DB)[j] = (void *)(d + (size_t)gr.r0 * OC);
        table_ptrs(B_DC)[j] = dinp ? dinp + (size_t)gr.r0 * C : NULL;
        table_ptrs(B_WSRC)[j] = (void *)w[g];
        const int o = order[j], go = idx[o]; /* the round order */
        const GroupRows ro = table_rows(0)[o];
        table_rows(1)[j] = ro;
        table_ptrs(B_WA)[j] = (void *)(x + (size_t)ro.r0 * C);
        table_ptrs(B_WB)[j] = (void *)(d + (size_t)ro.r0 * OC);
        table_ptrs(B_WC)[j] = dw ? dw[go] : NULL;
        table_ptrs(B_BIAS)[j] = db ? db[go] : NULL;
    }
    table_upload();
    if (dinp) {
        if (bf16) {
            grouped_round_kernel<<<cuda_blocks(per_w * np), CUDA_THREADS, 0, cuda_stream()>>>(
                ws, (const float *const *)table_ptrs_dev(B_WSRC), per_w, np);
            CUDA_CHECK_LAUNCH();
        }
        /* dinp^T[C, n] += W^T[C, OC] . dout^T[OC, n] per group */
        if (gemm_grouped(bf16, CUBLAS_OP_N, CUBLAS_OP_N, C, 0, OC, 1, table_rows(0),
                         table_ptrs_dev(B_DA), C, table_ptrs_dev(B_DB), OC, 1, table_ptrs_dev(B_DC),
                         C, np))
            backward_per_group(per, dinp, NULL, NULL, dout, inp, w, off, G, C, OC);
    }
    for (int r = 0; r < rounds; r++) {
        const int j0 = start[r], nr = start[r + 1] - j0;
        /* dW^T[C, OC] += inp^T[C, n] . dout[n, OC] per group */
        if (dw && (!grouped_on[bf16] ||
                   gemm_grouped(bf16, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, 0, 2, table_rows(1) + j0,
                                table_ptrs_dev(B_WA) + j0, C, table_ptrs_dev(B_WB) + j0, OC, 1,
                                table_ptrs_dev(B_WC) + j0, C, nr))) {
            /* refused: this round and the later ones per group, in order */
            for (int k = j0; k < np; k++) {
                const int g = idx[order[k]], n = off[g + 1] - off[g];
                per(NULL, dw[g], db ? db[g] : NULL, dout + (size_t)off[g] * OC,
                    inp + (size_t)off[g] * C, w[g], n, C, OC, GRAD_ADD);
            }
            return;
        }
        if (db) { /* the fp32 sum of dout, bf16 or not (backend_cpu_bf16) */
            grouped_col_sum_kernel<<<colsum_blocks(OC) * nr, COLSUM_COLS * COLSUM_GROUPS, 0,
                                     cuda_stream()>>>((float *const *)table_ptrs_dev(B_BIAS) + j0,
                                                      dout, table_rows_dev(1) + j0, OC);
            CUDA_CHECK_LAUNCH();
        }
    }
}

void cuda_matmul_grouped_forward(float *out, const float *inp, const float *const *w,
                                 const float *const *b, const int *off, int G, int C, int OC)
{
    grouped_forward(0, out, inp, w, b, off, G, C, OC);
}

void cuda_matmul_grouped_backward(float *dinp, float *const *dw, float *const *db,
                                  const float *dout, const float *inp, const float *const *w,
                                  const int *off, int G, int C, int OC)
{
    grouped_backward(0, dinp, dw, db, dout, inp, w, off, G, C, OC);
}

void cuda_matmul_grouped_forward_bf16(float *out, const float *inp, const float *const *w,
                                      const float *const *b, const int *off, int G, int C, int OC)
{
    grouped_forward(1, out, inp, w, b, off, G, C, OC);
}

void cuda_matmul_grouped_backward_bf16(float *dinp, float *const *dw, float *const *db,
                                       const float *dout, const float *inp, const float *const *w,
                                       const int *off, int G, int C, int OC)
{
    grouped_backward(1, dinp, dw, db, dout, inp, w, off, G, C, OC);
}
