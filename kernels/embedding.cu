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
 * The rows that add into one gradient row form a group: the rows of one
 * in-range token (dwte), or of one position (dwpe with packed documents;
 * without documents position t's rows are t, T + t, ..., which
 * emb_dwpe_kernel walks directly).  The groups are laid out in `order`,
 * each group's rows consecutive and in row order, groups in the order of
 * their first row, by two passes that compare every row's key with every
 * other's from shared memory (emb_rank_kernel, emb_place_kernel: N^2 / 2
 * comparisons spread over N threads, no serial scan of the rows, no
 * sort); then one thread per (group, c) adds its group's rows
 * (emb_group_sum_kernel), whose reads do not wait on each other as a
 * linked list's would. */
enum { EMB_TILE = 256 };

/* Row n's group key: its token (pos_key 0) or its position (pos_key 1)
 * when its token is in range, else -1 (no group). */
__device__ inline int emb_key(const int32_t *tokens, const int32_t *pos, int pos_key, int n,
                              int vocab_start, int V)
{
    if (emb_row(tokens[n], vocab_start, V) < 0)
        return -1;
    return pos_key ? pos[n] : tokens[n];
}

/* Per row n with a key: rank[n] = the rows before n with its key, first[n]
 * = the first row with its key, count[n] = the rows with its key. */
__global__ void emb_rank_kernel(int *rank, int *first, int *count, const int32_t *tokens,
                                const int32_t *pos, int pos_key, int N, int vocab_start, int V)
{
    __shared__ int tile[EMB_TILE];
    int n = blockIdx.x * EMB_TILE + threadIdx.x;
    int key = n < N ? emb_key(tokens, pos, pos_key, n, vocab_start, V) : -1;
    int before = 0, total = 0, fst = n;
    for (int m0 = 0; m0 < N; m0 += EMB_TILE) {
        int m = m0 + (int)threadIdx.x;
        tile[threadIdx.x] = m < N ? emb_key(tokens, pos, pos_key, m, vocab_start, V) : -1;
        __syncthreads();
        if (key >= 0)
            for (int j = 0; j < EMB_TILE && m0 + j < N; j++)
                if (tile[j] == key) {
                    total++;
                    before += m0 + j < n;
                    fst = m0 + j < fst ? m0 + j : fst;
                }
        __syncthreads();
    }
    if (n < N) {
        rank[n] = key >= 0 ? before : -1;
        first[n] = fst;
        count[n] = total;
    }
}

/* Row n's place in order: the rows of the groups that start before its
 * group's first row, plus its rank; slot[n] keeps it (a group's first row
 * then holds where the group starts). */
__global__ void emb_place_kernel(int *order, int *slot, const int *rank, const int *first, int N)
{
    __shared__ int tile[EMB_TILE];
    int n = blockIdx.x * EMB_TILE + threadIdx.x;
    int mine = n < N && rank[n] >= 0 ? first[n] : -1, at = 0;
    for (int m0 = 0; m0 < N; m0 += EMB_TILE) {
        int m = m0 + (int)threadIdx.x;
        tile[threadIdx.x] = m < N && rank[m] >= 0 ? first[m] : N; /* N: never before */
        __syncthreads();
        if (mine >= 0)
            for (int j = 0; j < EMB_TILE && m0 + j < N; j++)
                at += tile[j] < mine;
        __syncthreads();
    }
    if (mine >= 0) {
        order[at + rank[n]] = n;
        slot[n] = at + rank[n];
    }
}

/* One thread per (group, c): the group's first row g0 adds its rows'
 * dout[., c] in row order onto grad[row(g0), c], row() the token's row of
 * dwte (pos_key 0) or the position's row of dwpe (pos_key 1). */
__global__ void emb_group_sum_kernel(float *grad, const float *dout, const int32_t *tokens,
                                     const int32_t *pos, int pos_key, const int *rank,
                                     const int *count, const int *slot, const int *order, int N,
                                     int C, int vocab_start, int V)
{
    GRID_STRIDE(i, (size_t)N * C)
    {
        int n = (int)(i / C), c = (int)(i % C);
        if (rank[n] != 0)
            continue;
        int row = pos_key ? pos[n] : emb_row(tokens[n], vocab_start, V);
        float *g = grad + (size_t)row * C + c;
        const int *rows = order + slot[n];
        float acc = *g;
        for (int j = 0; j < count[n]; j++)
            acc += dout[(size_t)rows[j] * C + c];
        *g = acc;
    }
}

/* grad += the groups' sums (pos_key: above), in five ints of scratch a row. */
static void emb_grouped_backward(float *grad, const float *dout, const int32_t *tokens,
                                 const int32_t *pos, int pos_key, int N, int C, int vocab_start,
                                 int V)
{
    int *rank = (int *)cuda_scratch(CUDA_SCRATCH_EMB, 5 * (size_t)N * sizeof(int));
    int *first = rank + N, *count = first + N, *slot = count + N, *order = slot + N;
    unsigned tiles = (unsigned)((N + EMB_TILE - 1) / EMB_TILE);
    emb_rank_kernel<<<tiles, EMB_TILE, 0, cuda_stream()>>>(rank, first, count, tokens, pos, pos_key,
                                                           N, vocab_start, V);
    CUDA_CHECK_LAUNCH();
    emb_place_kernel<<<tiles, EMB_TILE, 0, cuda_stream()>>>(order, slot, rank, first, N);
    CUDA_CHECK_LAUNCH();
    emb_group_sum_kernel<<<cuda_blocks((size_t)N * C), CUDA_THREADS, 0, cuda_stream()>>>(
        grad, dout, tokens, pos, pos_key, rank, count, slot, order, N, C, vocab_start, V);
    CUDA_CHECK_LAUNCH();
}

/* dwpe without documents: position t's rows are t, T + t, 2T + t, ... */
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
    if (dwpe && pos) {
        emb_grouped_backward(dwpe, dout, tokens, pos, 1, N, C, vocab_start, V);
    } else if (dwpe) {
        size_t n = (size_t)(T < N ? T : N) * C;
        emb_dwpe_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dwpe, dout, tokens, N,
                                                                            T, C, vocab_start, V);
        CUDA_CHECK_LAUNCH();
    }
    if (dwte)
        emb_grouped_backward(dwte, dout, tokens, pos, 0, N, C, vocab_start, V);
}
