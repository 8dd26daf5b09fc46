/* matmul_lt.cuh — bf16 GEMMs through cuBLASLt with an epilogue
 * (matmul_lt.cu), for matmul.cu's bf16 path. */
#ifndef TRD_KERNELS_MATMUL_LT_CUH
#define TRD_KERNELS_MATMUL_LT_CUH

#include <cuda_bf16.h>

/* What cuBLASLt does to the product before it stores it (cublasLt.h's
 * epilogues of the same names); i is D's row (column-major), aux is
 * col-major like D with leading dimension ldaux. */
typedef enum {
    LT_PLAIN,     /* D = op(A) op(B) */
    LT_BIAS,      /* D = op(A) op(B) + bias[i] */
    LT_GELU_BIAS, /* aux = op(A) op(B) + bias[i]; D = gelu(aux) */
    LT_DGELU,     /* D = op(A) op(B) * gelu'(aux) */
} LtEpilogue;

/* D [m, n] (column-major, ldd, fp32) from bf16 A and B with fp32
 * accumulation (transa, transb: 1 for a transposed operand, as
 * cublasGemmEx's op T).  Only enqueues work; fatal on a cuBLASLt error.
 * Returns 0, having done nothing, when the library offers no algorithm
 * for it (the caller then runs the separate kernels), else 1. */
int lt_matmul_bf16(int transa, int transb, int m, int n, int k, const __nv_bfloat16 *A, int lda,
                   const __nv_bfloat16 *B, int ldb, float *D, int ldd, LtEpilogue epilogue,
                   const float *bias, float *aux, int ldaux);

/* The same, LT_PLAIN, with D stored in bf16: the fp32 accumulator rounded
 * to nearest even as it is stored (the head's bf16 logits). */
int lt_matmul_bf16_d16(int transa, int transb, int m, int n, int k, const __nv_bfloat16 *A, int lda,
                       const __nv_bfloat16 *B, int ldb, __nv_bfloat16 *D, int ldd);

/* Whether an epilogue's auxiliary matrix suits cuBLASLt (cublasLt.h: its
 * leading dimension a multiple of 8) and its vectors the alignment the
 * library's vector loads assume (16 bytes, as llm.c requires); where not,
 * the callers use the separate kernels. */
int lt_epilogue_ok(const float *bias, const float *aux, int ldaux);

#endif
