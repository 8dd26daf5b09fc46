/* adamw.cu — the AdamW step, elementwise, exactly the arithmetic of the
 * CPU reference (cpu_ops.inc): fp32 state, bias corrections computed in
 * double on the host and rounded to fp32 once, fp32 master weights and a
 * working copy optionally rounded to bf16 (the bits of bf16_round). */
#include "ops.cuh"

/* bf16_round of cpu.c on the bits: round to nearest, ties to even;
 * infinities unchanged, NaNs kept NaN (quiet). */
__device__ inline float bf16_round_dev(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u = (u | 0x00400000u) & 0xffff0000u;
    else
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u);
}

/* One element of AdamW, the arithmetic of the CPU reference. */
__device__ inline void adamw_one(float *param, float *master, const float *grad, float *m, float *v,
                                 size_t i, float lr, float b1, float b2, float eps, float wd,
                                 float gs, float bc1, float bc2, int round_bf16)
{
    float g = grad[i] * gs; /* clipping's factor (backend.h) */
    float mi = b1 * m[i] + (1 - b1) * g;
    float vi = b2 * v[i] + (1 - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float w = master[i];
    w -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * w);
    master[i] = w;
    /* master stays fp32; only the working copy is rounded */
    param[i] = round_bf16 ? bf16_round_dev(w) : w;
}

/* every range of r[0 .. nr) in one grid: thread-stride over the ranges'
 * concatenation (total elements), weight decay per range */
__global__ void adamw_ranges_kernel(float *param, float *master, const float *grad, float *m,
                                    float *v, const CudaRange *r, int nr, size_t total, float lr,
                                    float b1, float b2, float eps, float wd, float gs, float bc1,
                                    float bc2, int round_bf16, const BackendStepState *st)
{
    if (st) { /* the step decided on the device (backend.h grad_check) */
        if (st->skip)
            return;
        gs *= (float)st->grad_scale;
    }
    int k = -1;
    GRID_STRIDE(i, total)
    {
        /* i only grows: search once, then step forward */
        if (k < 0)
            k = cuda_range_find(r, nr, i);
        while (i >= r[k].vstart + (r[k].hi - r[k].lo))
            k++;
        adamw_one(param, master, grad, m, v, r[k].lo + (i - r[k].vstart), lr, b1, b2, eps,
                  r[k].decay ? wd : 0.0f, gs, bc1, bc2, round_bf16);
    }
}

__global__ void adamw_kernel(float *param, float *master, const float *grad, float *m, float *v,
                             size_t n, float lr, float b1, float b2, float eps, float wd, float gs,
                             float bc1, float bc2, int round_bf16)
{
    GRID_STRIDE(i, n)
    adamw_one(param, master, grad, m, v, i, lr, b1, b2, eps, wd, gs, bc1, bc2, round_bf16);
}

void cuda_adamw(float *param, float *master, const float *grad, float *m, float *v, size_t n,
                float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                int t, int round_bf16)
{
    if (!n)
        return;
    /* bias corrections in double: 1 - beta2^t is small for small t */
    float bc1 = (float)(1.0 - pow((double)beta1, t));
    float bc2 = (float)(1.0 - pow((double)beta2, t));
    adamw_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        param, master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2,
        round_bf16);
    CUDA_CHECK_LAUNCH();
}

void cuda_adamw_ranges(float *param, float *master, const float *grad, float *m, float *v,
                       const BackendRange *ranges, int n, float lr, float beta1, float beta2,
                       float eps, float weight_decay, float grad_scale, int t, int round_bf16,
                       const BackendStepState *state)
{
    static CudaRanges table;
    size_t total = 0;
    const CudaRange *r = cuda_ranges_upload(&table, ranges, n, &total);
    if (!total)
        return;
    float bc1 = (float)(1.0 - pow((double)beta1, t));
    float bc2 = (float)(1.0 - pow((double)beta2, t));
    adamw_ranges_kernel<<<cuda_blocks(total), CUDA_THREADS, 0, cuda_stream()>>>(
        param, master, grad, m, v, r, n, total, lr, beta1, beta2, eps, weight_decay, grad_scale,
        bc1, bc2, round_bf16, state);
    CUDA_CHECK_LAUNCH();
}
