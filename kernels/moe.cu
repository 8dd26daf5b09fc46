/* moe.cu — the mixture-of-experts ops (backend.h, src/model/moe.c), with the
 * CPU reference's arithmetic (src/backend/cpu.c): the router per row in
 * double, the same top-k selection (ties to the lower index); the rows
 * that may repeat (a token's k choices) are summed in order of r, one
 * thread per column, so the result does not depend on scheduling.  Simple
 * and exact rather than fast: the experts' GEMMs dominate a MoE layer. */
#include "ops.cuh"

/* One thread per row: E and k are small (E <= MOE_MAX_EXPERTS). */
__global__ void moe_router_forward_kernel(float *probs, float *lse, int32_t *idx, float *w,
                                          const float *logits, int N, int E, int k)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    const float *x = logits + (size_t)n * E;
    float *p = probs + (size_t)n * E;
    float mx = x[0];
    for (int e = 1; e < E; e++)
        mx = x[e] > mx ? x[e] : mx;
    double sum = 0;
    for (int e = 0; e < E; e++)
        sum += exp((double)x[e] - mx);
    for (int e = 0; e < E; e++)
        p[e] = (float)(exp((double)x[e] - mx) / sum);
    lse[n] = (float)(mx + log(sum));
    int32_t *id = idx + (size_t)n * k;
    double chosen = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= id[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        id[j] = best;
        chosen += p[best];
    }
    for (int j = 0; j < k; j++)
        w[(size_t)n * k + j] = (float)(p[id[j]] / chosen);
}

__global__ void moe_router_backward_kernel(float *dlogits, const float *dw, const float *probs,
                                           const float *lse, const int32_t *idx, const float *w,
                                           const float *aux_dp, float z_scale, int N, int E, int k)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    const float *p = probs + (size_t)n * E;
    float *dl = dlogits + (size_t)n * E;
    const int32_t *id = idx + (size_t)n * k;
    const float *wn = w + (size_t)n * k, *dwn = dw + (size_t)n * k;
    double S = 0, dot = 0;
    for (int j = 0; j < k; j++) {
        S += p[id[j]];
        dot += (double)dwn[j] * wn[j];
    }
    for (int e = 0; e < E; e++)
        dl[e] = aux_dp ? aux_dp[e] : 0.0f;
    for (int j = 0; j < k; j++)
        dl[id[j]] += (float)(((double)dwn[j] - dot) / S);
    double pd = 0;
    for (int e = 0; e < E; e++)
        pd += (double)p[e] * dl[e];
    for (int e = 0; e < E; e++)
        dl[e] = (float)(p[e] * (dl[e] - pd) + (double)z_scale * lse[n] * p[e]);
}

__global__ void moe_gather_kernel(float *out, const float *inp, const int32_t *slot, int R, int C,
                                  int k)
{
    GRID_STRIDE(i, (size_t)R * C)
    {
        const size_t r = i / C, c = i % C;
        out[i] = inp[(size_t)(slot[r] / k) * C + c];
    }
}

/* Column c of every row, in order of r (rows repeat). */
__global__ void moe_scatter_add_kernel(float *dinp, const float *dout, const int32_t *slot, int R,
                                       int C, int k)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int r = 0; r < R; r++)
        dinp[(size_t)(slot[r] / k) * C + c] += dout[(size_t)r * C + c];
}

__global__ void moe_combine_forward_kernel(float *out, const float *y, const float *w,
                                           const int32_t *slot, int R, int C, int k)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int r = 0; r < R; r++)
        out[(size_t)(slot[r] / k) * C + c] += w[slot[r]] * y[(size_t)r * C + c];
}

/* One thread per row r: its dy row and its weight's gradient (each slot once). */
__global__ void moe_combine_backward_kernel(float *dy, float *dw, const float *dout, const float *y,
                                            const float *w, const int32_t *slot, int R, int C,
                                            int k)
{
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R)
        return;
    const float *g = dout + (size_t)(slot[r] / k) * C, *yr = y + (size_t)r * C;
    float *d = dy + (size_t)r * C;
    const float wr = w[slot[r]];
    double dot = 0;
    for (int c = 0; c < C; c++) {
        d[c] = wr * g[c];
        dot += (double)g[c] * yr[c];
    }
    dw[slot[r]] = (float)dot;
}

static unsigned blocks_of(int n) { return (unsigned)((n + CUDA_THREADS - 1) / CUDA_THREADS); }

void cuda_moe_router_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits,
                             int N, int E, int k)
{
    if (N <= 0)
        return;
    moe_router_forward_kernel<<<blocks_of(N), CUDA_THREADS, 0, cuda_stream()>>>(probs, lse, idx, w,
                                                                                logits, N, E, k);
    CUDA_CHECK_LAUNCH();
}

void cuda_moe_router_backward(float *dlogits, const float *dw, const float *probs, const float *lse,
                              const int32_t *idx, const float *w, const float *aux_dp,
                              float z_scale, int N, int E, int k)
{
    if (N <= 0)
        return;
    moe_router_backward_kernel<<<blocks_of(N), CUDA_THREADS, 0, cuda_stream()>>>(
        dlogits, dw, probs, lse, idx, w, aux_dp, z_scale, N, E, k);
    CUDA_CHECK_LAUNCH();
}

void cuda_moe_gather(float *out, const float *inp, const int32_t *slot, int R, int C, int k)
{
    if (R <= 0 || C <= 0)
        return;
    moe_gather_kernel<<<cuda_blocks((size_t)R * C), CUDA_THREADS, 0, cuda_stream()>>>(
        out, inp, slot, R, C, k);
    CUDA_CHECK_LAUNCH();
}

void cuda_moe_scatter_add(float *dinp, const float *dout, const int32_t *slot, int R, int C, int k)
{
    if (R <= 0 || C <= 0)
        return;
    moe_scatter_add_kernel<<<blocks_of(C), CUDA_THREADS, 0, cuda_stream()>>>(dinp, dout, slot, R, C,
                                                                             k);
    CUDA_CHECK_LAUNCH();
}

void cuda_moe_combine_forward(float *out, const float *y, const float *w, const int32_t *slot,
                              int R, int C, int k)
{
    if (R <= 0 || C <= 0)
        return;
    moe_combine_forward_kernel<<<blocks_of(C), CUDA_THREADS, 0, cuda_stream()>>>(out, y, w, slot, R,
                                                                                 C, k);
    CUDA_CHECK_LAUNCH();
}

void cuda_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y,
                               const float *w, const int32_t *slot, int R, int C, int k)
{
    if (R <= 0)
        return;
    moe_combine_backward_kernel<<<blocks_of(R), CUDA_THREADS, 0, cuda_stream()>>>(dy, dw, dout, y,
                                                                                  w, slot, R, C, k);
    CUDA_CHECK_LAUNCH();
}
