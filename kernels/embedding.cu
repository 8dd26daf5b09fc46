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

/* The embedding gradients in parallel and with the CPU's bits: every
 * gradient element receives its rows' terms in row order, added one by
 * one onto its value, by one thread (no atomics).
 *
 * dwpe: one thread per (t, c) adds rows t, T + t, 2T + t, ... (the rows of
 * position t, in order).  With packed documents (pos) the rows of a
 * position are chained as the rows of a token are (emb_pos_links_kernel).
 *
 * dwte: the rows of one token form a chain, linked by emb_links_kernel
 * (next[n]: the next row with the same in-range token, -1 at the end;
 * first[n]: n starts its chain); then one thread per (chain start, c)
 * walks its chain.  Work is one pass over dout, spread over the distinct
 * tokens x C threads; a frequent token's chain is walked serially. */
__global__ void emb_links_kernel(int *next, int *first, const int32_t *tokens, int N,
                                 int vocab_start, int V)
{
    GRID_STRIDE(i, (size_t)N)
    {
        int n = (int)i, r = emb_row(tokens[n], vocab_start, V), nx = -1, fst = r >= 0;
        if (r >= 0) {
            for (int m = n + 1; m < N && nx < 0; m++)
                if (tokens[m] == tokens[n])
                    nx = m;
            for (int m = n - 1; m >= 0 && fst; m--)
                if (tokens[m] == tokens[n])
                    fst = 0;
        }
        next[n] = nx;
        first[n] = fst;
    }
}

__global__ void emb_dwte_kernel(float *dwte, const float *dout, const int32_t *tokens,
                                const int *next, const int *first, int N, int C, int vocab_start,
                                int V)
{
    GRID_STRIDE(i, (size_t)N * C)
    {
        int n = (int)(i / C), c = (int)(i % C);
        if (!first[n])
            continue;
        float *g = dwte + (size_t)emb_row(tokens[n], vocab_start, V) * C + c;
        float acc = *g;
        for (int m = n; m >= 0; m = next[m])
            acc += dout[(size_t)m * C + c];
        *g = acc;
    }
}

__global__ void emb_dwpe_kernel(float *dwpe, const float *dout, const int32_t *tokens, int N, int T,
                                int C, int vocab_start, int V)
{
    GRID_STRIDE(i, (size_t)T * C)
    {
        int t = (int)(i / C), c = (int)(i % C);
        float acc = dwpe[i];
        for (int n = t; n < N; n += T)
            if (emb_row(tokens[n], vocab_start, V) >= 0)
                acc += dout[(size_t)n * C + c];
        dwpe[i] = acc;
    }
}

/* Packed documents: the in-range rows of one position pos[n] chained in
 * row order, as emb_links_kernel chains a token's rows (the CPU adds a
 * position's rows in row order, skipping foreign tokens). */
__global__ void emb_pos_links_kernel(int *next, int *first, const int32_t *tokens,
                                     const int32_t *pos, int N, int vocab_start, int V)
{
    GRID_STRIDE(i, (size_t)N)
    {
        int n = (int)i, nx = -1, fst = emb_row(tokens[n], vocab_start, V) >= 0;
        if (fst) {
            for (int m = n + 1; m < N && nx < 0; m++)
                if (pos[m] == pos[n] && emb_row(tokens[m], vocab_start, V) >= 0)
                    nx = m;
            for (int m = n - 1; m >= 0 && fst; m--)
                if (pos[m] == pos[n] && emb_row(tokens[m], vocab_start, V) >= 0)
                    fst = 0;
        }
        next[n] = nx;
        first[n] = fst;
    }
}

__global__ void emb_dwpe_chain_kernel(float *dwpe, const float *dout, const int32_t *pos,
                                      const int *next, const int *first, int N, int C)
{
    GRID_STRIDE(i, (size_t)N * C)
    {
        int n = (int)(i / C), c = (int)(i % C);
        if (!first[n])
            continue;
        float *g = dwpe + (size_t)pos[n] * C + c;
        float acc = *g;
        for (int m = n; m >= 0; m = next[m])
            acc += dout[(size_t)m * C + c];
        *g = acc;
    }
}

void cuda_embedding_forward(float *out, const int32_t *tokens, const int32_t *pos, const float *wte,
                            const float *wpe, int N, int T, int C, int vocab_start, int V)
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
    /* next and first of the token chains, then of the position chains (2N
     * ints each): a few KiB of cuda_scratch */
    int *links = (int *)cuda_scratch(CUDA_SCRATCH_EMB, 4 * (size_t)N * sizeof(int));
    if (dwpe && pos) {
        int *pl = links + 2 * (size_t)N;
        emb_pos_links_kernel<<<cuda_blocks((size_t)N), CUDA_THREADS, 0, cuda_stream()>>>(
            pl, pl + N, tokens, pos, N, vocab_start, V);
        CUDA_CHECK_LAUNCH();
        emb_dwpe_chain_kernel<<<cuda_blocks((size_t)N * C), CUDA_THREADS, 0, cuda_stream()>>>(
            dwpe, dout, pos, pl, pl + N, N, C);
        CUDA_CHECK_LAUNCH();
    } else if (dwpe) {
        size_t n = (size_t)(T < N ? T : N) * C;
        emb_dwpe_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dwpe, dout, tokens, N,
                                                                            T, C, vocab_start, V);
        CUDA_CHECK_LAUNCH();
    }
    if (!dwte)
        return;
    emb_links_kernel<<<cuda_blocks((size_t)N), CUDA_THREADS, 0, cuda_stream()>>>(
        links, links + N, tokens, N, vocab_start, V);
    CUDA_CHECK_LAUNCH();
    emb_dwte_kernel<<<cuda_blocks((size_t)N * C), CUDA_THREADS, 0, cuda_stream()>>>(
        dwte, dout, tokens, links, links + N, N, C, vocab_start, V);
    CUDA_CHECK_LAUNCH();
}
