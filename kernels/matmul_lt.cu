/* matmul_lt.cu — bf16 GEMMs through cuBLASLt (cublasLtMatmul) with the
 * bias, GELU and GELU-gradient epilogues, as llm.c's matmul_cublaslt: the
 * bias add and the activation happen as the tile is written, instead of a
 * broadcast kernel before the GEMM and an elementwise pass after it.
 *
 * Per call, as llm.c does: a matmul descriptor with the transposes and the
 * epilogue, four matrix layouts, a preference stating the workspace limit
 * and the pointers' real alignment (cuBLASLt otherwise assumes 256 bytes),
 * one algorithm from the heuristic (none offered: the caller runs the
 * separate kernels, with a warning once).  These are host objects only; the one
 * device buffer is the workspace, grown to the largest an algorithm asked
 * for (so after the first step nothing is allocated) and freed in stream
 * order.  Compute and scale fp32; A and B bf16; C and D fp32 with beta 0
 * (C is D's layout and is not read). */
#include "matmul_lt.cuh"
#include "ops.cuh"

#include <cublasLt.h>
#include <stdio.h>

#define LT_CHECK(call)                                                                             \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            trd_fatal(TRD_EXIT_RUNTIME,                                                            \
                      "check the GPU (nvidia-smi), free memory and the shapes; "                   \
                      "training.precision: fp32 avoids cuBLASLt",                                  \
                      "%s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusString(st_));     \
    } while (0)

/* llm.c's size for Hopper; algorithms that need none are offered too. */
static const size_t LT_MAX_WORKSPACE = (size_t)32 << 20;

static cublasLtHandle_t lt_handle(void)
{
    static cublasLtHandle_t h;
    if (!h)
        LT_CHECK(cublasLtCreate(&h));
    return h;
}

/* The workspace of at least `bytes`, grown in stream order. */
static void *lt_workspace(size_t bytes)
{
    static void *ws;
    static size_t cap;
    if (bytes > cap) {
        cuda_free_async(ws);
        ws = cuda_malloc_async(bytes, "cuBLASLt workspace");
        cap = bytes;
    }
    return ws;
}

/* The largest power of two up to 256 that divides the address. */
static uint32_t lt_alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a)
        a /= 2;
    return a;
}

int lt_epilogue_ok(const float *bias, const float *aux, int ldaux)
{
    return (uintptr_t)bias % 16 == 0 && (uintptr_t)aux % 16 == 0 && ldaux % 8 == 0;
}

static cublasLtEpilogue_t lt_epilogue(LtEpilogue e)
{
    switch (e) {
    case LT_BIAS:
        return CUBLASLT_EPILOGUE_BIAS;
    case LT_GELU_BIAS:
        return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LT_DGELU:
        return CUBLASLT_EPILOGUE_DGELU;
    default:
        return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

static void lt_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void *v,
                   size_t size)
{
    LT_CHECK(cublasLtMatmulDescSetAttribute(d, attr, v, size));
}

/* lt_matmul_bf16 and lt_matmul_bf16_d16: D of type dtype. */
static int lt_matmul(int transa, int transb, int m, int n, int k, const __nv_bfloat16 *A, int lda,
                     const __nv_bfloat16 *B, int ldb, void *D, cudaDataType dtype, int ldd,
                     LtEpilogue epilogue, const float *bias, float *aux, int ldaux)
{
    cublasLtMatmulDesc_t op;
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint32_t epi = lt_epilogue(epilogue);
    lt_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    lt_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    lt_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (epilogue == LT_BIAS || epilogue == LT_GELU_BIAS) /* fp32, D's type: the default */
        lt_set(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (epilogue == LT_GELU_BIAS || epilogue == LT_DGELU) {
        const int64_t ld = ldaux;
        lt_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
        lt_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    }
    /* the stored shapes: op(A) is m x k, op(B) k x n */
    cublasLtMatrixLayout_t la, lb, ld_;
    LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, transa ? k : m, transa ? m : k, lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, transb ? n : k, transb ? k : n, ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&ld_, dtype, m, n, ldd));

    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_ws = LT_MAX_WORKSPACE;
    const uint32_t align[4] = {lt_alignment(A), lt_alignment(B), lt_alignment(D), lt_alignment(D)};
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &max_ws, sizeof max_ws));
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        LT_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]));

    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_handle(), op, la, lb, ld_, ld_, pref, 1, &res, &found);
    const int ran = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ran) {
        const float alpha = 1, beta = 0;
        void *ws = lt_workspace(res.workspaceSize);
        const double dm = m, dn = n, dk = k, out = dtype == CUDA_R_16BF ? 2 : 4;
        PROFILE_PART(
            "gemm_lt", 2 * (dm * dk + dk * dn) + out * dm * dn, 2 * dm * dn * dk,
            LT_CHECK(cublasLtMatmul(lt_handle(), op, &alpha, A, la, B, lb, &beta, D, ld_, D, ld_,
                                    &res.algo, ws, res.workspaceSize, cuda_stream())));
    } else {
        static int told; /* once: the run goes on, slower, on the separate kernels */
        if (!told) {
            told = 1;
            fprintf(stderr,
                    "warning: cuBLASLt offers no algorithm for m %d n %d k %d (transa %d, "
                    "transb %d, epilogue %d): %s; using cuBLAS and separate kernels there\n",
                    m, n, k, transa, transb, (int)epilogue, cublasGetStatusString(st));
        }
    }
    LT_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    LT_CHECK(cublasLtMatrixLayoutDestroy(ld_));
    LT_CHECK(cublasLtMatrixLayoutDestroy(lb));
    LT_CHECK(cublasLtMatrixLayoutDestroy(la));
    LT_CHECK(cublasLtMatmulDescDestroy(op));
    return ran;
}

int lt_matmul_bf16(int transa, int transb, int m, int n, int k, const __nv_bfloat16 *A, int lda,
                   const __nv_bfloat16 *B, int ldb, float *D, int ldd, LtEpilogue epilogue,
                   const float *bias, float *aux, int ldaux)
{
    return lt_matmul(transa, transb, m, n, k, A, lda, B, ldb, D, CUDA_R_32F, ldd, epilogue, bias,
                     aux, ldaux);
}

int lt_matmul_bf16_d16(int transa, int transb, int m, int n, int k, const __nv_bfloat16 *A, int lda,
                       const __nv_bfloat16 *B, int ldb, __nv_bfloat16 *D, int ldd)
{
    return lt_matmul(transa, transb, m, n, k, A, lda, B, ldb, D, CUDA_R_16BF, ldd, LT_PLAIN, NULL,
                     NULL, 0);
}
