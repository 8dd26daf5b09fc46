/* cublaslt_emu.cpp — the emulated cuBLASLt behind cublasLt.h.
 *
 * cublasLtMatmul computes, column-major as documented,
 *     T = alpha op(A) op(B) + beta C          (fp32; C is not read when beta is 0)
 * then the epilogue, element (i, j) of the m x n result:
 *     DEFAULT        D = T
 *     BIAS           D = T + bias[i]           (bias: D's m rows, packed; "broadcast
 *                                               to all columns")
 *     GELU_AUX_BIAS  aux = T + bias[i];  D = gelu(aux)
 *     DGELU          D = T * gelu'(aux)        (aux: the GELU's input, given)
 * gelu is the tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))):
 * cublasLt.h names the epilogue GELU without a formula; llm.c, whose GELU
 * is this form, trains GPT-2 through GELU_AUX_BIAS and DGELU, and a GPU run
 * of cuda_ops compares the library's epilogue with the CPU reference.  It
 * is written here as the textbook tanh expression, not as the CPU
 * backend's x * sigmoid(2u), so cuda_ops compares two evaluations.
 *
 * The products: bf16 A and B widened to fp32 (exact) and multiplied by
 * OpenBLAS's cblas_sgemm in fp32, as a tensor core multiplies bf16 into an
 * fp32 accumulator.  D (and C) fp32 or bf16 (rounded to nearest even); the
 * auxiliary matrix in D's type unless EPILOGUE_AUX_DATA_TYPE says
 * otherwise; the bias in D's type unless BIAS_DATA_TYPE says otherwise.
 * Each call counts as one GEMM in the step counts (emu.cpp). */
#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <vector>

void emu_count_gemm(int m, int n, int k); /* emu.cpp */

static const char CALL[] = "cublasLtMatmul";
/* the one algorithm the heuristic offers, so that cublasLtMatmul can tell
 * an algorithm from the heuristic from an uninitialised one */
static const uint64_t ALGO_MAGIC = 0x656d752d6c74ull;

struct emu_lt {
    int x;
};
struct emu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType scale;
    int transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    int epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    void *aux = nullptr;
    int64_t aux_ld = 0;
    int aux_type = -1, bias_type = -1; /* -1: D's type */
};
struct emu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
struct emu_lt_pref {
    uint64_t max_workspace = 0;
    uint32_t align[4] = {256, 256, 256, 256}; /* A, B, C, D: bytes */
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = new emu_lt();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType scale)
{
    *d = new emu_lt_desc();
    (*d)->compute = compute;
    (*d)->scale = scale;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

/* An attribute's value, of exactly the size the library documents. */
template <typename T> static bool take(T *dst, const void *buf, size_t size)
{
    if (size != sizeof(T) || !buf)
        return false;
    memcpy(dst, buf, sizeof(T));
    return true;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size)
{
    bool ok = false;
    int32_t i32 = 0;
    uint32_t u32 = 0;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: /* int32_t (cublasOperation_t) */
        ok = take(&i32, buf, size) && (i32 == CUBLAS_OP_N || i32 == CUBLAS_OP_T);
        d->transa = i32;
        break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        ok = take(&i32, buf, size) && (i32 == CUBLAS_OP_N || i32 == CUBLAS_OP_T);
        d->transb = i32;
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: /* uint32_t */
        ok = take(&u32, buf, size);
        d->epilogue = (int)u32;
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        ok = take(&d->bias, buf, size);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        ok = take(&d->aux, buf, size);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: /* int64_t */
        ok = take(&d->aux_ld, buf, size);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: /* int32_t (cudaDataType) */
        ok = take(&d->aux_type, buf, size);
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        ok = take(&d->bias_type, buf, size);
        break;
    }
    if (!ok)
        fprintf(stderr,
                "emu: cublasLtMatmulDescSetAttribute(%d): a value of %zu bytes that "
                "cublasLt.h does not allow\n",
                (int)attr, size);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    *l = new emu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new emu_lt_pref();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size)
{
    uint32_t mode = 0;
    bool ok = false;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        ok = take(&p->max_workspace, buf, size);
    else if (attr == CUBLASLT_MATMUL_PREF_SEARCH_MODE)
        ok = take(&mode, buf, size);
    else if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
             attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
        ok = take(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

static size_t type_size(int t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 0; }

static bool epilogue_known(int e)
{
    return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

/* A column-major layout's extent in elements. */
static size_t layout_elems(const emu_lt_layout *l)
{
    return l->rows && l->cols ? (size_t)(l->cols - 1) * (size_t)l->ld + (size_t)l->rows : 0;
}

/* What both the heuristic and the matmul check: the types emulated, the
 * shapes (op(A) m x k, op(B) k x n, C and D m x n, each ld at least its
 * rows), and the epilogue's inputs (cublasLt.h: aux ld a multiple of 8 and
 * at least D's rows).  A message says what is wrong. */
static cublasStatus_t check_op(const char *call, cublasLtHandle_t h, const emu_lt_desc *d,
                               const emu_lt_layout *A, const emu_lt_layout *B,
                               const emu_lt_layout *C, const emu_lt_layout *D)
{
    if (!h || !d || !A || !B || !C || !D)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F || A->type != CUDA_R_16BF ||
        B->type != CUDA_R_16BF || !type_size(D->type) || C->type != D->type) {
        fprintf(stderr,
                "emu: %s: only bf16 A and B, fp32 compute and scale, and C and D of "
                "one type, fp32 or bf16, are emulated\n",
                call);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!epilogue_known(d->epilogue)) {
        fprintf(stderr,
                "emu: %s: epilogue %d is not emulated (DEFAULT, BIAS, GELU_AUX_BIAS, "
                "DGELU are)\n",
                call, d->epilogue);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const uint64_t m = D->rows, n = D->cols;
    const uint64_t k = d->transa == CUBLAS_OP_N ? A->cols : A->rows;
    const uint64_t am = d->transa == CUBLAS_OP_N ? A->rows : A->cols;
    const uint64_t bk = d->transb == CUBLAS_OP_N ? B->rows : B->cols;
    const uint64_t bn = d->transb == CUBLAS_OP_N ? B->cols : B->rows;
    bool ok = am == m && bk == k && bn == n && C->rows == m && C->cols == n;
    for (const emu_lt_layout *l : {A, B, C, D})
        ok = ok && l->ld >= (int64_t)std::max<uint64_t>(1, l->rows);
    if (!ok) {
        fprintf(stderr,
                "emu: %s: shapes do not agree: op(A) %llux%llu, op(B) %llux%llu, "
                "C %llux%llu, D %llux%llu (or an ld below its rows)\n",
                call, (unsigned long long)am, (unsigned long long)k, (unsigned long long)bk,
                (unsigned long long)bn, (unsigned long long)C->rows, (unsigned long long)C->cols,
                (unsigned long long)m, (unsigned long long)n);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const bool needs_bias = d->epilogue & CUBLASLT_EPILOGUE_BIAS;
    const bool needs_aux = d->epilogue & 128;
    const int aux_type = d->aux_type < 0 ? D->type : d->aux_type;
    const int bias_type = d->bias_type < 0 ? D->type : d->bias_type;
    if ((needs_bias && (!d->bias || !type_size(bias_type))) ||
        (needs_aux &&
         (!d->aux || !type_size(aux_type) || d->aux_ld < (int64_t)m || d->aux_ld % 8 != 0))) {
        fprintf(stderr,
                "emu: %s: epilogue %d needs %s%s (aux ld %lld: a multiple of 8, at "
                "least D's %llu rows)\n",
                call, d->epilogue, needs_bias ? "a bias pointer " : "",
                needs_aux ? "an aux pointer and ld" : "", (long long)d->aux_ld,
                (unsigned long long)m);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int *returned)
{
    *returned = 0;
    if (!pref || requested < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st =
        check_op("cublasLtMatmulAlgoGetHeuristic", h, op, Adesc, Bdesc, Cdesc, Ddesc);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    /* TRD_EMU_LT_NO_ALGO=1: none offered, as the library answers a shape or
     * epilogue it cannot serve, so that the callers' cuBLAS fallbacks run
     * (tests/test_cuda_ops.c) */
    const char *none = getenv("TRD_EMU_LT_NO_ALGO");
    if (none && *none && strcmp(none, "0") != 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    results[0] = cublasLtMatmulHeuristicResult_t{};
    results[0].algo.data[0] = ALGO_MAGIC;
    for (int i = 0; i < 4; i++) /* the alignments it was chosen for */
        results[0].algo.data[1 + i] = pref->align[i];
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float load(const void *p, int type, size_t i)
{
    return type == CUDA_R_32F ? ((const float *)p)[i]
                              : __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

static void store(void *p, int type, size_t i, float v)
{
    if (type == CUDA_R_32F)
        ((float *)p)[i] = v;
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
}

static std::vector<float> widen(const void *p, size_t n)
{
    std::vector<float> f(std::max<size_t>(n, 1));
    for (size_t i = 0; i < n; i++)
        f[i] = load(p, CUDA_R_16BF, i);
    return f;
}

static const float GELU_K = 0.7978845608028654f, GELU_A = 0.044715f;

static float gelu(float x) { return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x))); }

static float dgelu(float x)
{
    const float th = tanhf(GELU_K * (x + GELU_A * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3 * GELU_A * x * x);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                              cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t s)
{
    if (op && Adesc && Bdesc && Cdesc && Ddesc && algo &&
        emu_capture([=, a = *(const float *)alpha, b = *(const float *)beta, d = *op,
                     la = *Adesc, lb = *Bdesc, lc = *Cdesc, ld = *Ddesc, al = *algo]() mutable {
            cublasLtMatmul(h, &d, &a, A, &la, B, &lb, &b, C, &lc, D, &ld, &al, workspace,
                           workspace_bytes, s);
        }))
        return CUBLAS_STATUS_SUCCESS;
    cublasStatus_t st = check_op(CALL, h, op, Adesc, Bdesc, Cdesc, Ddesc);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!algo || algo->data[0] != ALGO_MAGIC) {
        fprintf(stderr,
                "emu: %s: the algorithm is not one cublasLtMatmulAlgoGetHeuristic "
                "returned\n",
                CALL);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const void *ptr[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptr[i] % algo->data[1 + i]) {
            fprintf(stderr,
                    "emu: %s: %c at %p is not aligned to the %llu bytes the algorithm "
                    "was chosen for (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)\n",
                    CALL, "ABCD"[i], ptr[i], (unsigned long long)algo -> data[1 + i], "ABCD"[i]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    const int m = (int)Ddesc->rows, n = (int)Ddesc->cols;
    const int k = (int)(op->transa == CUBLAS_OP_N ? Adesc->cols : Adesc->rows);
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    emu_check_host(CALL, "alpha", alpha, sizeof(float));
    emu_check_host(CALL, "beta", beta, sizeof(float));
    const float a = *(const float *)alpha, b = *(const float *)beta;
    const int dt = Ddesc->type;
    const size_t dsz = type_size(dt);
    if (workspace_bytes)
        emu_check_device(CALL, "workspace", workspace, workspace_bytes);
    if (k > 0) {
        emu_check_device(CALL, "A", A, layout_elems(Adesc) * 2);
        emu_check_device(CALL, "B", B, layout_elems(Bdesc) * 2);
    }
    if (b != 0)
        emu_check_device(CALL, "C", C, layout_elems(Cdesc) * dsz);
    emu_check_device(CALL, "D", D, layout_elems(Ddesc) * dsz);
    const int epi = op->epilogue;
    const int aux_type = op->aux_type < 0 ? dt : op->aux_type;
    const int bias_type = op->bias_type < 0 ? dt : op->bias_type;
    if (epi & CUBLASLT_EPILOGUE_BIAS)
        emu_check_device(CALL, "bias", op->bias, (size_t)m * type_size(bias_type));
    const emu_lt_layout aux_layout{(cudaDataType)aux_type, (uint64_t)m, (uint64_t)n, op->aux_ld};
    if (epi & 128)
        emu_check_device(CALL, "aux", op->aux, layout_elems(&aux_layout) * type_size(aux_type));

    emu_count_gemm(m, n, k);
    emu_device_scope open;
    /* T = beta C, then += alpha op(A) op(B), in fp32 with ld m */
    std::vector<float> t((size_t)m * n, 0.0f);
    if (b != 0)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++)
                t[(size_t)j * m + i] = b * load(C, dt, (size_t)j * Cdesc->ld + i);
    if (k > 0) {
        std::vector<float> fa = widen(A, layout_elems(Adesc));
        std::vector<float> fb = widen(B, layout_elems(Bdesc));
        cblas_sgemm(CblasColMajor, op->transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    op->transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, a, fa.data(),
                    (int)Adesc->ld, fb.data(), (int)Bdesc->ld, 1.0f, t.data(), m);
    }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float v = t[(size_t)j * m + i];
            const size_t xi = (size_t)j * (size_t)op->aux_ld + i;
            if (epi & CUBLASLT_EPILOGUE_BIAS)
                v += load(op->bias, bias_type, i);
            if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                store(op->aux, aux_type, xi, v);
                v = gelu(v);
            } else if (epi == CUBLASLT_EPILOGUE_DGELU) {
                v *= dgelu(load(op->aux, aux_type, xi));
            }
            store(D, dt, (size_t)j * Ddesc->ld + i, v);
        }
    return CUBLAS_STATUS_SUCCESS;
}
