/* activation.cu — GELU (tanh approximation) and SwiGLU, elementwise, with
 * the formulas of the CPU reference (cpu_ops.inc): GELU as x*sigmoid(2u),
 * which saturates to 0 without NaN when exp overflows. */
#include "ops.cuh"

#include <cuda_bf16.h>

__global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n) { out[i] = gelu_value(inp[i]); }
}

/* d/dx [x s(2u)] = s + 2 x s (1 - s) du/dx */
/* (set: dinp is written, GRAD_SET, and its old contents never read) */
__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, size_t n,
                                     int set)
{
    GRID_STRIDE(i, n)
    {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        float s = 1 / (1 + expf(-2 * u));
        float du = GELU_K * (1 + 3 * GELU_A * x * x);
        const float g = (s + 2 * x * s * (1 - s) * du) * dout[i];
        dinp[i] = set ? g : dinp[i] + g;
    }
}

/* dx = gelu'(inp) * dx, in place (cpu_ops.inc's gelu_backward_inplace) */
__global__ void gelu_backward_inplace_kernel(float *dx, const float *inp, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float x = inp[i];
        float u = GELU_K * (x + GELU_A * x * x * x);
        float s = 1 / (1 + expf(-2 * u));
        float du = GELU_K * (1 + 3 * GELU_A * x * x);
        dx[i] = (s + 2 * x * s * (1 - s) * du) * dx[i];
    }
}

/* silu(a) * up (swiglu_value) */
__global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up, size_t n)
{
    GRID_STRIDE(i, n) { out[i] = swiglu_value(gate[i], up[i]); }
}

/* d silu / da = s + a s (1 - s); either gradient may be NULL (set: both
 * written, as gelu_backward_kernel) */
/* SwiGLU's gradients at element i: at the gate (*dg) and at up (*du) */
__device__ inline void swiglu_grads(const float *dout, const float *gate, const float *up, size_t i,
                                    float *dg, float *du)
{
    const float a = gate[i], s = 1 / (1 + expf(-a));
    *dg = dout[i] * up[i] * (s + a * s * (1 - s));
    *du = dout[i] * a * s;
}

__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout,
                                       const float *gate, const float *up, size_t n, int set)
{
    GRID_STRIDE(i, n)
    {
        float dg, du;
        swiglu_grads(dout, gate, up, i, &dg, &du);
        if (dgate)
            dgate[i] = set ? dg : dgate[i] + dg;
        if (dup)
            dup[i] = set ? du : dup[i] + du;
    }
}

void cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    if (!n)
        return;
    gelu_forward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(out, inp, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_gelu_backward_inplace(float *dx, const float *inp, size_t n)
{
    if (n == 0)
        return;
    gelu_backward_inplace_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dx, inp, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, GradMode mode)
{
    if (!n)
        return;
    gelu_backward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dinp, inp, dout, n,
                                                                             mode == GRAD_SET);
    CUDA_CHECK_LAUNCH();
}

void cuda_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    if (!n)
        return;
    swiglu_forward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(out, gate, up, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, size_t n, GradMode mode)
{
    if (!n || (!dgate && !dup))
        return;
    swiglu_backward_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        dgate, dup, dout, gate, up, n, mode == GRAD_SET);
    CUDA_CHECK_LAUNCH();
}

/* ---- outputs stored in bf16 for the GEMM that reads them (backend.h's
 * *_x16): the same fp32 arithmetic, rounded to nearest even as stored ---- */

__global__ void gelu_forward_x16_kernel(__nv_bfloat16 *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n) { out[i] = __float2bfloat16(gelu_value(inp[i])); }
}

__global__ void swiglu_forward_x16_kernel(__nv_bfloat16 *out, const float *gate, const float *up,
                                          size_t n)
{
    GRID_STRIDE(i, n) { out[i] = __float2bfloat16(swiglu_value(gate[i], up[i])); }
}

/* swiglu_backward_kernel's gradients (SET), stored as bf16 for the gate's
 * and up's backward GEMMs (cuda_matmul_backward_d16) */
__global__ void swiglu_backward_x16_kernel(__nv_bfloat16 *dgate, __nv_bfloat16 *dup,
                                           const float *dout, const float *gate, const float *up,
                                           size_t n)
{
    GRID_STRIDE(i, n)
    {
        float dg, du;
        swiglu_grads(dout, gate, up, i, &dg, &du);
        dgate[i] = __float2bfloat16(dg);
        dup[i] = __float2bfloat16(du);
    }
}

void cuda_swiglu_backward_x16(uint16_t *dgate, uint16_t *dup, const float *dout, const float *gate,
                              const float *up, size_t n)
{
    if (!n)
        return;
    swiglu_backward_x16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        (__nv_bfloat16 *)dgate, (__nv_bfloat16 *)dup, dout, gate, up, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_gelu_forward_x16(uint16_t *out, const float *inp, size_t n)
{
    if (!n)
        return;
    gelu_forward_x16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        (__nv_bfloat16 *)out, inp, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_swiglu_forward_x16(uint16_t *out, const float *gate, const float *up, size_t n)
{
    if (!n)
        return;
    swiglu_forward_x16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
        (__nv_bfloat16 *)out, gate, up, n);
    CUDA_CHECK_LAUNCH();
}
