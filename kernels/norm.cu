/* norm.cu — LayerNorm and RMSNorm over the C channels of each row.
 *
 * Per-row statistics: one block of NORM_THREADS per row, block reductions
 * in fp32 (the CPU also sums in fp32, in another order).  Weight and bias
 * gradients: column sums over the rows in groups (colsum_groups,
 * common.cuh), in a fixed order. */
#include "ops.cuh"

#include <cuda_bf16.h>

enum { NORM_THREADS = 256 };

/* A norm's output element: fp32, or bf16 (round to nearest even, the CPU's
 * bf16_bits) where the output is stored in bf16 for the GEMMs that read it
 * (cuda_norm_forward_x16). */
__device__ inline void norm_store(float *o, float v) { *o = v; }
__device__ inline void norm_store(__nv_bfloat16 *o, float v) { *o = __float2bfloat16(v); }

/* --------------------------------------------------------------- layernorm */

/* Row n of a LayerNorm from this thread's part s of the row's sum. */
template <typename T>
__device__ void layernorm_row(T *o, float *mean, float *rstd, const float *x, float s,
                              const float *weight, const float *bias, int C, float eps, int n)
{
    float mu = block_sum(s) / C;
    /* two passes: the variance of shifted values does not cancel */
    float v = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        v += (x[c] - mu) * (x[c] - mu);
    float rs = 1 / sqrtf(block_sum(v) / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float y = (x[c] - mu) * rs * weight[c];
        norm_store(&o[c], bias ? y + bias[c] : y);
    }
    if (threadIdx.x == 0) {
        mean[n] = mu;
        rstd[n] = rs;
    }
}

template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const float *inp,
                                         const float *weight, const float *bias, int C, float eps)
{
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C;
    float s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += x[c];
    layernorm_row(out + (size_t)n * C, mean, rstd, x, s, weight, bias, C, eps, n);
}

/* dx += rstd * (g - mean(g) - xh * mean(g*xh)), g = dout*w, xh = (x-mu)*rstd */
__global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                               const float *weight, const float *mean,
                                               const float *rstd, int C)
{
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float mu = mean[n], rs = rstd[n], sg = 0, sgx = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float g = d[c] * weight[c];
        sg += g;
        sgx += g * (x[c] - mu) * rs;
    }
    sg = block_sum(sg) / C;
    sgx = block_sum(sgx) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[c] += rs * (d[c] * weight[c] - sg - (x[c] - mu) * rs * sgx);
}

/* dweight[c] += sum_n dout*xh, dbias[c] += sum_n dout (either may be NULL),
 * over one chunk of the rows (colsum_put) */
__global__ void layernorm_backward_params_kernel(float *dweight, float *dbias, float *part,
                                                 const float *dout, const float *inp,
                                                 const float *mean, const float *rstd, int N, int C)
{
    int c = colsum_col(C), n0, n1;
    colsum_rows(N, C, &n0, &n1);
    float sw = 0, sb = 0;
    if (c < C)
        for (int n = n0 + colsum_group(); n < n1; n += COLSUM_GROUPS) {
            float d = dout[(size_t)n * C + c], x = inp[(size_t)n * C + c];
            sw += d * (x - mean[n]) * rstd[n];
            sb += d;
        }
    sw = colsum_groups(sw);
    sb = colsum_groups(sb);
    colsum_put(dweight, part, C, c, sw);
    colsum_put(dbias, part ? part + (size_t)colsum_nchunks(C) * C : NULL, C, c, sb);
}

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return;
    layernorm_forward_kernel<float>
        <<<N, NORM_THREADS, 0, cuda_stream()>>>(out, mean, rstd, inp, weight, bias, C, eps);
    CUDA_CHECK_LAUNCH();
}

void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    if (dinp) {
        layernorm_backward_dinp_kernel<<<N, NORM_THREADS, 0, cuda_stream()>>>(
            dinp, dout, inp, weight, mean, rstd, C);
        CUDA_CHECK_LAUNCH();
    }
    if (dweight || dbias) {
        const int R = colsum_chunks(N, C);
        float *part = cuda_colsum_scratch(R, C, 2);
        layernorm_backward_params_kernel<<<colsum_blocks(C) * R, COLSUM_COLS * COLSUM_GROUPS, 0,
                                           cuda_stream()>>>(dweight, dbias, part, dout, inp, mean,
                                                            rstd, N, C);
        CUDA_CHECK_LAUNCH();
        cuda_colsum_finish(dweight, dbias, part, R, C);
    }
}

/* ----------------------------------------------------------------- rmsnorm */

template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const float *inp, const float *weight,
                                       int C, float eps)
{
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C;
    T *o = out + (size_t)n * C;
    float s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += x[c] * x[c];
    float rs = 1 / sqrtf(block_sum(s) / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        norm_store(&o[c], x[c] * rs * weight[c]);
    if (threadIdx.x == 0)
        rstd[n] = rs;
}

/* y = x*r*w, r = (mean(x^2)+eps)^(-1/2):
 * dx += r*w*dout - x * r^3/C * sum(dout*w*x) */
__global__ void rmsnorm_backward_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                             const float *weight, const float *rstd, int C)
{
    int n = blockIdx.x;
    const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float rs = rstd[n], s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += d[c] * weight[c] * x[c];
    float k = block_sum(s) * rs * rs * rs / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[c] += rs * weight[c] * d[c] - x[c] * k;
}

__global__ void rmsnorm_backward_dweight_kernel(float *dweight, float *part, const float *dout,
                                                const float *inp, const float *rstd, int N, int C)
{
    int c = colsum_col(C), n0, n1;
    colsum_rows(N, C, &n0, &n1);
    float sw = 0;
    if (c < C)
        for (int n = n0 + colsum_group(); n < n1; n += COLSUM_GROUPS)
            sw += dout[(size_t)n * C + c] * inp[(size_t)n * C + c] * rstd[n];
    sw = colsum_groups(sw);
    colsum_put(dweight, part, C, c, sw);
}

void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps)
{
    if (N <= 0 || C <= 0)
        return;
    rmsnorm_forward_kernel<float>
        <<<N, NORM_THREADS, 0, cuda_stream()>>>(out, rstd, inp, weight, C, eps);
    CUDA_CHECK_LAUNCH();
}

void cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    if (dinp) {
        rmsnorm_backward_dinp_kernel<<<N, NORM_THREADS, 0, cuda_stream()>>>(dinp, dout, inp, weight,
                                                                            rstd, C);
        CUDA_CHECK_LAUNCH();
    }
    if (dweight) {
        const int R = colsum_chunks(N, C);
        float *part = cuda_colsum_scratch(R, C, 1);
        rmsnorm_backward_dweight_kernel<<<colsum_blocks(C) * R, COLSUM_COLS * COLSUM_GROUPS, 0,
                                          cuda_stream()>>>(dweight, part, dout, inp, rstd, N, C);
        CUDA_CHECK_LAUNCH();
        cuda_colsum_finish(dweight, NULL, part, R, C);
    }
}

/* ------------------------------------------- residual add + norm, fused */

/* res = a + b, then the norm of res (rms: RMSNorm, else LayerNorm): the
 * arithmetic of add_kernel and of the norm's forward kernel above, so the
 * bits of the unfused pair; each thread reads back only the res elements it
 * wrote itself (the same c), so no barrier is needed before the norm's
 * passes.  a and b are read once, res written once: the add's separate
 * pass (3 row reads and a write) becomes one. */
template <typename T>
__global__ void residual_norm_forward_kernel(float *res, T *out, float *mean, float *rstd,
                                             const float *a, const float *b, const float *weight,
                                             const float *bias, int C, float eps, int rms)
{
    int n = blockIdx.x;
    const float *xa = a + (size_t)n * C, *xb = b + (size_t)n * C;
    float *x = res + (size_t)n * C;
    T *o = out + (size_t)n * C;
    float s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float r = xa[c] + xb[c];
        x[c] = r;
        s += rms ? r * r : r;
    }
    if (rms) {
        float rs = 1 / sqrtf(block_sum(s) / C + eps);
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            norm_store(&o[c], x[c] * rs * weight[c]);
        if (threadIdx.x == 0)
            rstd[n] = rs;
        return;
    }
    layernorm_row(o, mean, rstd, x, s, weight, bias, C, eps, n);
}

void cuda_residual_norm_forward(float *res, float *out, float *mean, float *rstd, const float *a,
                                const float *b, const float *weight, const float *bias, int N,
                                int C, float eps, int rms)
{
    if (N <= 0 || C <= 0)
        return;
    residual_norm_forward_kernel<float><<<N, NORM_THREADS, 0, cuda_stream()>>>(
        res, out, mean, rstd, a, b, weight, bias, C, eps, rms);
    CUDA_CHECK_LAUNCH();
}

/* The norm (b NULL) or the residual add and the norm into a bf16 out: the
 * kernels above with their outputs rounded as they are stored, so the bits
 * bf16_bits gives of the fp32 ops' outputs. */
void cuda_norm_forward_x16(float *res, uint16_t *out, float *mean, float *rstd, const float *a,
                           const float *b, const float *weight, const float *bias, int N, int C,
                           float eps, int rms)
{
    if (N <= 0 || C <= 0)
        return;
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    if (b)
        residual_norm_forward_kernel<__nv_bfloat16><<<N, NORM_THREADS, 0, cuda_stream()>>>(
            res, o, mean, rstd, a, b, weight, bias, C, eps, rms);
    else if (rms)
        rmsnorm_forward_kernel<__nv_bfloat16>
            <<<N, NORM_THREADS, 0, cuda_stream()>>>(o, rstd, a, weight, C, eps);
    else
        layernorm_forward_kernel<__nv_bfloat16>
            <<<N, NORM_THREADS, 0, cuda_stream()>>>(o, mean, rstd, a, weight, bias, C, eps);
    CUDA_CHECK_LAUNCH();
}
