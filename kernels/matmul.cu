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
 * and read it as it is; every other operand (weights, output gradients,
 * the attention output) is stored in fp32 and converted, a pass over it,
 * and the workspace is the bf16 copies of the largest GEMM's two operands
 * (device memory beside the report's categories). */
#include "matmul_lt.cuh"
#include "ops.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            trd_fatal(TRD_EXIT_RUNTIME, "check the GPU (nvidia-smi), free memory and the shapes",  \
                      "%s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusString(st_));     \
    } while (0)

/* One handle per process, made on first use, bound to the ops' stream. */
static cublasHandle_t blas_handle(void)
{
    static cublasHandle_t h;
    if (!h) {
        CUBLAS_CHECK(cublasCreate(&h));
        CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
        CUBLAS_CHECK(cublasSetStream(h, cuda_stream()));
    }
    return h;
}

/* For bf16 GEMMs: the default math mode, where bf16 inputs use tensor cores. */
static cublasHandle_t blas_handle_bf16(void)
{
    static cublasHandle_t h;
    if (!h) {
        CUBLAS_CHECK(cublasCreate(&h));
        CUBLAS_CHECK(cublasSetStream(h, cuda_stream()));
    }
    return h;
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

/* The bf16 copy of n floats of src in workspace slot k (0 or 1: a GEMM reads
 * two operands).  A slot grows to the largest operand it has held, so after
 * the first step nothing is allocated; in stream order, a slot is rewritten
 * (or freed, stream-ordered: no device-wide wait while NCCL runs) only
 * after the GEMM that read it. */
static __nv_bfloat16 *to_bf16(int k, const float *src, size_t n)
{
    static __nv_bfloat16 *slot[2];
    static size_t cap[2];
    if (n > cap[k]) {
        cuda_free_async(slot[k]);
        slot[k] =
            (__nv_bfloat16 *)cuda_malloc_async(n * sizeof(__nv_bfloat16), "bf16 GEMM operand");
        cap[k] = n;
    }
    to_bf16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(slot[k], src, n);
    CUDA_CHECK_LAUNCH();
    return slot[k];
}

/* The column-major product of matmul.cu's comment, bf16 A and B, fp32 C. */
static void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B, int ldb, float beta,
                      float *C, int ldc)
{
    const float alpha = 1;
    CUBLAS_CHECK(cublasGemmEx(blas_handle_bf16(), ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B,
                              CUDA_R_16BF, ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

/* out = a . weight^T + bias, a the bf16 activation [N, C] (NULL when C is
 * 0): the weight converted, the bias in cuBLASLt's epilogue. */
static void forward_bf16(float *out, const __nv_bfloat16 *a, const float *weight, const float *bias,
                         int N, int C, int OC)
{
    const __nv_bfloat16 *w = C > 0 ? to_bf16(0, weight, (size_t)OC * C) : NULL;
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
    const __nv_bfloat16 *d = d16 ? d16 : dinp || dweight ? to_bf16(0, dout, (size_t)N * OC) : NULL;
    if (dinp) /* dinp^T[C, N] (+)= weight^T[C, OC] . dout^T[OC, N] */
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, to_bf16(1, weight, (size_t)OC * C), C, d, OC,
                  dinp_beta(dinp_mode), dinp, C);
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
    const __nv_bfloat16 *w = to_bf16(0, weight, (size_t)OC * C);
    const __nv_bfloat16 *a = (const __nv_bfloat16 *)inp;
    __nv_bfloat16 *out = (__nv_bfloat16 *)logits;
    if (lt_matmul_bf16_d16(1, 0, OC, N, C, w, C, a, C, out, OC))
        return;
    const float alpha = 1, beta = 0;
    CUBLAS_CHECK(cublasGemmEx(blas_handle_bf16(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &alpha, w,
                              CUDA_R_16BF, C, a, CUDA_R_16BF, C, &beta, out, CUDA_R_16BF, OC,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void cuda_head_backward_x16(float *dinp, float *dweight, const uint16_t *dlogits,
                            const uint16_t *inp, const float *weight, int N, int C, int OC,
                            GradMode dinp_mode)
{
    backward_bf16(dinp, dinp_mode, dweight, NULL, NULL, (const __nv_bfloat16 *)dlogits, NULL,
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
        const __nv_bfloat16 *w = to_bf16(0, weight, (size_t)OC * C);
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
    const __nv_bfloat16 *d = to_bf16(0, dout, (size_t)N * OC);
    const __nv_bfloat16 *w = to_bf16(1, weight, (size_t)OC * C);
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
