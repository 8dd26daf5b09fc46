/* cublas_v2.h (emulated) — cublasSgemm (and the bf16 cublasGemmEx) as documented (column-major,
 * C = alpha op(A) op(B) + beta C, the same argument checks), computed by
 * OpenBLAS's cblas_sgemm: it checks that kernels/matmul.cu passes the right
 * transposes and leading dimensions, and that A, B and C are device memory
 * large enough for the shapes given. */
#pragma once
#include <cuda_runtime.h>
typedef int cublasStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
};
/* the API emulated: cuBLAS 12.5's, the first with the grouped GEMMs */
#define CUBLAS_VERSION 120500
typedef struct emu_cublas *cublasHandle_t;
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH, CUBLAS_PEDANTIC_MATH } cublasMath_t;
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return 0; }
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return 0; }
/* The workspace must be device memory of the size given. */
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
inline const char *cublasGetStatusString(cublasStatus_t st)
{
    return st == CUBLAS_STATUS_INVALID_VALUE   ? "CUBLAS_STATUS_INVALID_VALUE (emulated)"
           : st == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED (emulated)"
                                               : "emulated cublas error";
}
/* cublasGemmEx with bf16 A and B, an fp32 or bf16 C and fp32 compute only
 * (what matmul.cu uses; a bf16 C: the head's logits where cuBLASLt offers
 * no algorithm): the bf16 values are widened and multiplied by
 * cblas_sgemm, which is exact for each product as a tensor core is; a bf16
 * C is the fp32 result rounded to nearest even. */
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                            int lda, const void *B, cudaDataType Btype, int ldb, const void *beta,
                            void *C, cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B,
                           int ldb, const float *beta, float *C, int ldc);
/* The grouped GEMMs (cuBLAS 12.5), emu.cpp: group i's problems are
 * cublasSgemm's with group i's sizes, transposes, leading dimensions,
 * alpha and beta (host arrays of group_count), the matrices from the
 * pointer arrays (device memory, one pointer a problem).
 * cublasGemmGroupedBatchedEx: fp32 A, B and C only (CUBLAS_COMPUTE_32F,
 * _PEDANTIC, _FAST_TF32); bf16 A and B with fp32 C answer
 * CUBLAS_STATUS_NOT_SUPPORTED, as cuBLAS documents no such combination. */
cublasStatus_t cublasSgemmGroupedBatched(cublasHandle_t h, const cublasOperation_t transa[],
                                         const cublasOperation_t transb[], const int m[],
                                         const int n[], const int k[], const float alpha[],
                                         const float *const A[], const int lda[],
                                         const float *const B[], const int ldb[],
                                         const float beta[], float *const C[], const int ldc[],
                                         int group_count, const int group_size[]);
cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t h, const cublasOperation_t transa[], const cublasOperation_t transb[],
    const int m[], const int n[], const int k[], const void *alpha, const void *const A[],
    cudaDataType Atype, const int lda[], const void *const B[], cudaDataType Btype, const int ldb[],
    const void *beta, void *const C[], cudaDataType Ctype, const int ldc[], int group_count,
    const int group_size[], cublasComputeType_t compute);
