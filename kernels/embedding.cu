/* embedding.cu — token (+ position) embedding, vocab-parallel: this rank
 * holds rows [vocab_start, vocab_start + V) of wte; other tokens give zero
 * rows and no gradient at all (see cpu_ops.inc for why positions too). */
#include "ops.cuh"

/* The local row of a token owned by this rank's vocabulary slice, or -1. */
__device__ inline int emb_row(int32_t token, int vocab_start, int V)
{
    int r = (int)token - vocab_start;
    return (token >= 0 && r >= 0 && r < V) ? r : -1;
}

/* One thread per output element. */
__global__ void embedding_forward_kernel(float *out, const int32_t *tokens, const int32_t *pos,
                                         const float *wte, const float *wpe, int N, int T, int C,
                                         int vocab_start, int V)
{
    size_t total = (size_t)N * C;
    GRID_STRIDE(i, total)
    {
        int n = (int)(i / C), c = (int)(i % C);
        int r = emb_row(tokens[n], vocab_start, V);
        if (r < 0)
            out[i] = 0;
        else if (wpe)
            out[i] = wte[(size_t)r * C + c] + wpe[(size_t)(pos ? pos[n] : n % T) * C + c];
        else
            out[i] = wte[(size_t)r * C + c];
    }
}

/* One thread per channel c walks the rows in order: rows holding the same
 * token (or position) add into the same gradient element, and no two
 * threads ever touch the same element, so no atomics are needed and each
 * element receives its terms in row order, exactly as on the CPU (same
 * bits).  Slow for long sequences; a sorted-token kernel comes later. */
__global__ void embedding_backward_kernel(float *dwte, float *dwpe, const float *dout,
                                          const int32_t *tokens, const int32_t *pos, int N, int T,
                                          int C, int vocab_start, int V)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int n = 0; n < N; n++) {
        int r = emb_row(tokens[n], vocab_start, V);
        if (r < 0)
            continue;
        float d = dout[(size_t)n * C + c];
        if (dwte)
            dwte[(size_t)r * C + c] += d;
        if (dwpe)
            dwpe[(size_t)(pos ? pos[n] : n % T) * C + c] += d;
    }
}

void cuda_embedding_forward(float *out, const int32_t *tokens, const int32_t *pos,
                            const float *wte, const float *wpe, int N, int T, int C,
                            int vocab_start, int V)
{
    if (N <= 0 || C <= 0)
        return;
    embedding_forward_kernel<<<cuda_blocks((size_t)N * C), CUDA_THREADS, 0, cuda_stream()>>>(
        out, tokens, pos, wte, wpe, N, T, C, vocab_start, V);
    CUDA_CHECK_LAUNCH();
}

void cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             const int32_t *pos, int N, int T, int C, int vocab_start, int V)
{
    if (N <= 0 || C <= 0 || (!dwte && !dwpe))
        return;
    embedding_backward_kernel<<<(C + CUDA_THREADS - 1) / CUDA_THREADS, CUDA_THREADS, 0,
                                cuda_stream()>>>(dwte, dwpe, dout, tokens, pos, N, T, C, vocab_start,
                                                                 V);
    CUDA_CHECK_LAUNCH();
}
