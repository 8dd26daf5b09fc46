/* attention.cu — causal self-attention on the fused qkv buffer in the form
 * of flash attention: the T x T scores are never stored.  Forward keeps the
 * output and one log-sum-exp per query row; backward recomputes the
 * probabilities from them, tile by tile.
 *
 * Every kernel works on a tile of ROWS (32) rows of one (batch, head) and
 * gives each row 8 threads (a "row group", 8 neighbouring lanes of a warp):
 * thread c of a group holds channels c, c+8, c+16, ... of its row in
 * registers, so a dot product over the head is 8 partial sums and a 3-step
 * shuffle within the group.  The other operand walks through shared memory
 * one row at a time, the same row for every thread of the block.
 *
 *   forward:  block (b, h, query tile); keys stream through shared memory;
 *             online softmax per row (running max m and sum l).
 *   backward: two kernels, so that every gradient element has one writer,
 *             no atomics and a fixed summation order:
 *             dq:     block (b, h, query tile), keys streaming;
 *             dk, dv: block (b, kv group, key tile), the group's query heads
 *                     and their query rows streaming.
 * Both recompute p = exp(s - lse) and ds = p (dp - D), D = dout . out.
 *
 * Head size up to HS_MAX (128): the per-thread register arrays are sized
 * for it.  fp32 throughout, IEEE expf. */
#include "ops.cuh"

enum {
    ROWS = 32,                /* rows of a tile (queries or keys) */
    GROUP = 8,                /* threads per row */
    ATT_BLOCK = ROWS * GROUP, /* 256 threads */
    HS_MAX = 128,
    PER = HS_MAX / GROUP,   /* channels per thread, at most */
    STRIDE = HS_MAX + GROUP /* shared row stride: a warp's 4 rows x 8 lanes
                                 * land in 32 different banks */
};

/* Offsets, inside a row of the fused qkv buffer, of query head h and of the
 * key head of group g (the value head follows the key head). */
__device__ inline size_t q_off(int h, int Q, int hs)
{
    return ((size_t)(h / Q) * (Q + 2) + h % Q) * hs;
}

__device__ inline size_t k_off(int g, int Q, int hs) { return ((size_t)g * (Q + 2) + Q) * hs; }

__device__ inline int imin(int a, int b) { return a < b ? a : b; }

/* Sum over the 8 threads of a row group (lanes differing in the low 3 bits);
 * every thread of the block must call it together. */
__device__ inline float group_sum(float v)
{
    for (int o = GROUP / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* This thread's channels of a row: x[c + GROUP*j], zero past hs or when
 * the row does not exist (row == NULL). */
__device__ inline void load_row(float r[PER], const float *row, int c, int hs)
{
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = c + GROUP * j;
        r[j] = row && i < hs ? row[i] : 0.0f;
    }
}

/* Partial dot product of this thread's channels with shared row s. */
__device__ inline float part_dot(const float r[PER], const float *s, int c)
{
    float acc = 0;
#pragma unroll
    for (int j = 0; j < PER; j++)
        acc += r[j] * s[c + GROUP * j];
    return acc;
}

/* row[c + GROUP*j] += r[j] for this thread's channels below hs. */
__device__ inline void add_to_row(float *row, const float r[PER], int c, int hs)
{
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = c + GROUP * j;
        if (i < hs)
            row[i] += r[j];
    }
}

/* Thread (r, c) copies its channels of global row `row` (NULL: zeros) into
 * shared row r. */
__device__ inline void stage_row(float *sh, const float *row, int c, int hs)
{
    for (int i = c; i < HS_MAX; i += GROUP)
        sh[i] = row && i < hs ? row[i] : 0.0f;
}

struct Shape {
    int T, H, KVH, hs, Q, width, tiles;
    float scale;
};

/* The key and value rows k0 .. k0+ROWS-1 of the kv head at kh into ks, vs
 * (zeros past T), between barriers: the previous tile is consumed first. */
__device__ inline void stage_kv_tile(float *ks, float *vs, const float *kh, int k0, const Shape &s)
{
    const int r = threadIdx.x / GROUP, c = threadIdx.x % GROUP, u = k0 + r;
    const float *krow = u < s.T ? kh + (size_t)u * s.width : NULL;
    __syncthreads();
    stage_row(ks + r * STRIDE, krow, c, s.hs);
    stage_row(vs + r * STRIDE, krow ? krow + s.hs : NULL, c, s.hs);
    __syncthreads();
}

static Shape shape_of(int T, int H, int KVH, int hs)
{
    Shape s;
    s.T = T, s.H = H, s.KVH = KVH, s.hs = hs, s.Q = H / KVH;
    s.width = (H + 2 * KVH) * hs;
    s.tiles = (T + ROWS - 1) / ROWS;
    s.scale = 1 / sqrtf((float)hs);
    return s;
}

/* Block -> (b, head, tile), the costliest tiles first: a causal query tile
 * costs more the later it is (heavy = the last tile first), a key tile the
 * earlier it is. */
__device__ inline void block_coords(const Shape &s, int heads, int last_first, int *b, int *head,
                                    int *tile)
{
    int k = blockIdx.x % s.tiles;
    *tile = last_first ? s.tiles - 1 - k : k;
    *head = blockIdx.x / s.tiles % heads;
    *b = blockIdx.x / (s.tiles * heads);
}

__global__ void __launch_bounds__(ATT_BLOCK)
    attention_forward_kernel(float *out, float *lse, const float *qkv, Shape s)
{
    __shared__ float ks[ROWS * STRIDE], vs[ROWS * STRIDE];
    int b, h, tile;
    block_coords(s, s.H, 1, &b, &h, &tile);
    const int r = threadIdx.x / GROUP, c = threadIdx.x % GROUP, hs = s.hs;
    const int t = tile * ROWS + r, valid = t < s.T;
    const float *base = qkv + (size_t)b * s.T * s.width;
    const float *kh = base + k_off(h / s.Q, s.Q, hs);

    float q[PER], o[PER];
    load_row(q, valid ? base + (size_t)t * s.width + q_off(h, s.Q, hs) : NULL, c, hs);
#pragma unroll
    for (int j = 0; j < PER; j++)
        o[j] = 0;
    float m = -INFINITY, l = 0;

    /* the tile's last query row sees the keys up to it */
    const int last = imin(s.T, (tile + 1) * ROWS) - 1;
    for (int k0 = 0; k0 <= last; k0 += ROWS) {
        stage_kv_tile(ks, vs, kh, k0, s);
        const int n = imin(ROWS, last + 1 - k0);
        for (int j = 0; j < n; j++) {
            float sc = group_sum(part_dot(q, ks + j * STRIDE, c)) * s.scale;
            if (!valid || k0 + j > t)
                continue;
            float m_new = fmaxf(m, sc);
            float alpha = expf(m - m_new), p = expf(sc - m_new);
            l = l * alpha + p;
            const float *v = vs + j * STRIDE;
#pragma unroll
            for (int i = 0; i < PER; i++)
                o[i] = o[i] * alpha + p * v[c + GROUP * i];
            m = m_new;
        }
    }
    if (!valid)
        return;
    float *orow = out + ((size_t)b * s.T + t) * s.H * hs + (size_t)h * hs;
    float inv = 1 / l;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = c + GROUP * j;
        if (i < hs)
            orow[i] = o[j] * inv;
    }
    if (c == 0)
        lse[((size_t)b * s.H + h) * s.T + t] = m + logf(l);
}

/* dq[t] += scale * sum_{u <= t} p (dp - D_t) k_u for the rows of one query
 * tile of head h. */
__global__ void __launch_bounds__(ATT_BLOCK)
    attention_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *out,
                        const float *lse, Shape s)
{
    __shared__ float ks[ROWS * STRIDE], vs[ROWS * STRIDE];
    int b, h, tile;
    block_coords(s, s.H, 1, &b, &h, &tile);
    const int r = threadIdx.x / GROUP, c = threadIdx.x % GROUP, hs = s.hs;
    const int t = tile * ROWS + r, valid = t < s.T, ow = s.H * hs;
    const float *base = qkv + (size_t)b * s.T * s.width;
    const float *kh = base + k_off(h / s.Q, s.Q, hs);
    const size_t orow = ((size_t)b * s.T + t) * ow + (size_t)h * hs;

    float q[PER], d[PER], dq[PER];
    load_row(q, valid ? base + (size_t)t * s.width + q_off(h, s.Q, hs) : NULL, c, hs);
    load_row(d, valid ? dout + orow : NULL, c, hs);
    load_row(dq, valid ? out + orow : NULL, c, hs); /* out, for D; then dq */
    float D = 0;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        D += d[j] * dq[j];
        dq[j] = 0;
    }
    D = group_sum(D);
    const float L = valid ? lse[((size_t)b * s.H + h) * s.T + t] : 0.0f;

    const int last = imin(s.T, (tile + 1) * ROWS) - 1;
    for (int k0 = 0; k0 <= last; k0 += ROWS) {
        stage_kv_tile(ks, vs, kh, k0, s);
        const int n = imin(ROWS, last + 1 - k0);
        for (int j = 0; j < n; j++) {
            const float *k = ks + j * STRIDE;
            float sc = group_sum(part_dot(q, k, c)) * s.scale;
            float dp = group_sum(part_dot(d, vs + j * STRIDE, c));
            if (!valid || k0 + j > t)
                continue;
            float ds = expf(sc - L) * (dp - D) * s.scale;
#pragma unroll
            for (int i = 0; i < PER; i++)
                dq[i] += ds * k[c + GROUP * i];
        }
    }
    if (!valid)
        return;
    add_to_row(dqkv + ((size_t)b * s.T + t) * s.width + q_off(h, s.Q, hs), dq, c, hs);
}

/* For the keys of one key tile of kv group g, summed over the group's query
 * heads and the query rows t >= u:
 *   dk_u += scale * p (dp - D_t) q_t;  dv_u += p dout_t */
__global__ void __launch_bounds__(ATT_BLOCK)
    attention_dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *out,
                         const float *lse, Shape s)
{
    __shared__ float qs[ROWS * STRIDE], ds_[ROWS * STRIDE];
    __shared__ float Ls[ROWS], Ds[ROWS];
    int b, g, tile;
    block_coords(s, s.KVH, 0, &b, &g, &tile);
    const int r = threadIdx.x / GROUP, c = threadIdx.x % GROUP, hs = s.hs;
    const int u = tile * ROWS + r, valid = u < s.T, ow = s.H * hs;
    const float *base = qkv + (size_t)b * s.T * s.width;
    const float *krow = valid ? base + (size_t)u * s.width + k_off(g, s.Q, hs) : NULL;

    float k[PER], v[PER], dk[PER], dv[PER];
    load_row(k, krow, c, hs);
    load_row(v, krow ? krow + hs : NULL, c, hs);
#pragma unroll
    for (int j = 0; j < PER; j++)
        dk[j] = dv[j] = 0;

    for (int h = g * s.Q; h < (g + 1) * s.Q; h++) {
        const size_t qo = q_off(h, s.Q, hs);
        for (int t0 = tile * ROWS; t0 < s.T; t0 += ROWS) {
            /* Stage query rows t0.. of head h: q, dout, and per row lse and D. */
            __syncthreads();
            const int t_r = t0 + r, has = t_r < s.T;
            const size_t orow = ((size_t)b * s.T + t_r) * ow + (size_t)h * hs;
            stage_row(qs + r * STRIDE, has ? base + (size_t)t_r * s.width + qo : NULL, c, hs);
            stage_row(ds_ + r * STRIDE, has ? dout + orow : NULL, c, hs);
            float o[PER];
            load_row(o, has ? out + orow : NULL, c, hs);
            float D = group_sum(part_dot(o, ds_ + r * STRIDE, c));
            if (c == 0) {
                Ds[r] = D;
                Ls[r] = has ? lse[((size_t)b * s.H + h) * s.T + t_r] : 0.0f;
            }
            __syncthreads();
            const int n = imin(ROWS, s.T - t0);
            for (int j = 0; j < n; j++) {
                const float *qr = qs + j * STRIDE, *dr = ds_ + j * STRIDE;
                float sc = group_sum(part_dot(k, qr, c)) * s.scale;
                float dp = group_sum(part_dot(v, dr, c));
                if (!valid || t0 + j < u)
                    continue;
                float p = expf(sc - Ls[j]), dsc = p * (dp - Ds[j]) * s.scale;
#pragma unroll
                for (int i = 0; i < PER; i++) {
                    dk[i] += dsc * qr[c + GROUP * i];
                    dv[i] += p * dr[c + GROUP * i];
                }
            }
        }
    }
    if (!valid)
        return;
    float *gk = dqkv + ((size_t)b * s.T + u) * s.width + k_off(g, s.Q, hs);
    add_to_row(gk, dk, c, hs);
    add_to_row(gk + hs, dv, c, hs);
}

/* The grid: one block per (b, head, tile), within gridDim.x's limit. */
static unsigned tile_blocks(int B, int heads, const Shape &s)
{
    size_t n = (size_t)B * (size_t)heads * (size_t)s.tiles;
    TRD_ASSERT(n <= 0x7fffffffu);
    return (unsigned)n;
}

static void check_shape(int H, int KVH, int hs)
{
    TRD_ASSERT(KVH > 0 && H % KVH == 0);
    if (hs > HS_MAX)
        trd_fatal(TRD_EXIT_INPUT, "use hidden / heads <= 128 with backend: cuda",
                  "attention: head size %d is larger than the CUDA kernels' limit %d", hs,
                  (int)HS_MAX);
}

void cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int H, int KVH,
                            int hs)
{
    check_shape(H, KVH, hs);
    if (B <= 0 || T <= 0 || H <= 0 || hs <= 0)
        return;
    const Shape s = shape_of(T, H, KVH, hs);
    attention_forward_kernel<<<tile_blocks(B, H, s), ATT_BLOCK, 0, cuda_stream()>>>(out, lse, qkv,
                                                                                    s);
    CUDA_CHECK_LAUNCH();
}

void cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int B, int T, int H, int KVH, int hs)
{
    check_shape(H, KVH, hs);
    if (B <= 0 || T <= 0 || H <= 0 || hs <= 0)
        return;
    const Shape s = shape_of(T, H, KVH, hs);
    attention_dq_kernel<<<tile_blocks(B, H, s), ATT_BLOCK, 0, cuda_stream()>>>(dqkv, dout, qkv, out,
                                                                               lse, s);
    CUDA_CHECK_LAUNCH();
    attention_dkv_kernel<<<tile_blocks(B, KVH, s), ATT_BLOCK, 0, cuda_stream()>>>(dqkv, dout, qkv,
                                                                                  out, lse, s);
    CUDA_CHECK_LAUNCH();
}
