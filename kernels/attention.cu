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
 * One call attends query rows to key rows as AttnArgs (backend.h) says:
 * by global position (blocks of a sequence split over ranks) and within
 * documents (packed sequences); a query row's keys are one contiguous
 * range [u0, u1), so a query tile walks the union of its rows' ranges and
 * each pair outside the row's own range is skipped.
 *
 * Head size up to ATT_HS_MAX (128).  Each kernel is compiled for PER = 4, 8
 * and 16 channels per thread (head sizes up to 32, 64 and 128) and the
 * smallest that holds the head runs: register arrays and shared rows sized
 * for 128 would spend half of every dot product and shared-memory load on
 * zero padding at GPT-2's 64.  fp32 throughout, IEEE expf. */
#include "attention.cuh"

enum {
    ROWS = 32,               /* rows of a tile (queries or keys) */
    GROUP = 8,               /* threads per row */
    ATT_BLOCK = ROWS * GROUP /* 256 threads */
};

/* Shared row stride for PER channels per thread: PER * GROUP + GROUP, so a
 * warp's 4 rows x 8 lanes land in 32 different banks. */
#define STRIDE (PER * GROUP + GROUP)

/* Sum over the 8 threads of a row group (lanes differing in the low 3 bits);
 * every thread of the block must call it together. */
__device__ inline float group_sum(float v) { return lane_group_sum(v, GROUP); }

/* This thread's channels of a row: x[c + GROUP*j], zero past hs or when
 * the row does not exist (row == NULL). */
template <int PER> __device__ inline void load_row(float (&r)[PER], const float *row, int c, int hs)
{
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = c + GROUP * j;
        r[j] = row && i < hs ? row[i] : 0.0f;
    }
}

/* Partial dot product of this thread's channels with shared row s. */
template <int PER> __device__ inline float part_dot(const float (&r)[PER], const float *s, int c)
{
    float acc = 0;
#pragma unroll
    for (int j = 0; j < PER; j++)
        acc += r[j] * s[c + GROUP * j];
    return acc;
}

/* A row held in registers by a row group (its threads' channels), shared
 * for group_dot.  On the GPU nothing: group_dot's shuffles read the
 * lanes' registers.  In the emulation, where every shuffle is a barrier
 * (a fiber switch of each of the block's 256 threads, for every key of a
 * tile), the group's channels are published to the block once (one
 * barrier; every thread of the block calls it together), and group_dot
 * reads them instead.  SLOT: one buffer per row a kernel shares. */
template <int PER> using GroupRegs = const float (*)[PER];
template <int PER, int SLOT> __device__ inline GroupRegs<PER> group_share(const float (&r)[PER])
{
#if defined(TRD_CUDA_EMULATED) /* blocks run one at a time: one buffer serves all */
    static float all[ATT_BLOCK][PER];
    for (int j = 0; j < PER; j++)
        all[threadIdx.x][j] = r[j];
    __syncthreads();
    return &all[threadIdx.x - threadIdx.x % GROUP];
#else
    (void)r;
    return NULL;
#endif
}

/* group_sum(part_dot(r, s, c)): the dot product of the group's row with
 * shared row s.  The emulation computes the group's 8 partial sums from
 * the shared registers (grp, from group_share) and adds them by
 * group_sum's butterfly: the same operations on the same values, so the
 * same result bit for bit, without a barrier.  The butterfly of a sum
 * leaves the same value in every lane (each step adds a pair in both
 * orders), so the first thread of a group to make its n-th call keeps the
 * result for the others (a ring of the last calls per group, tagged with
 * n and s; every thread of a group makes the same calls, as the GPU's
 * shuffles require): one computation per group instead of one per thread. */
template <int PER>
__device__ inline float group_dot(const float (&r)[PER], GroupRegs<PER> grp, const float *s, int c)
{
#if defined(TRD_CUDA_EMULATED)
    (void)r;
    enum { RING = 128 }; /* > the calls of one barrier interval: 2 a key, ROWS keys */
    static long calls[ATT_BLOCK];
    static struct {
        long n;
        const float *s;
        float v;
    } ring[ATT_BLOCK / GROUP][RING];
    const long n = ++calls[threadIdx.x];
    auto &e = ring[threadIdx.x / GROUP][n % RING];
    if (e.n == n && e.s == s)
        return e.v;
    float x[GROUP];
    for (int l = 0; l < GROUP; l++)
        x[l] = part_dot(grp[l], s, l);
    emu_butterfly(
        x, GROUP, [](float a, float b) { return a + b; }, GROUP / 2);
    e.n = n, e.s = s, e.v = x[c];
    return x[c];
#else
    (void)grp;
    return group_sum(part_dot(r, s, c));
#endif
}

/* row[c + GROUP*j] += r[j] (= when set) for this thread's channels below hs. */
template <int PER>
__device__ inline void put_row(float *row, const float (&r)[PER], int c, int hs, int set)
{
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = c + GROUP * j;
        if (i < hs)
            grad_put(row + i, r[j], set);
    }
}

/* Thread (r, c) copies its channels of global row `row` (NULL: zeros) into
 * shared row r. */
template <int PER> __device__ inline void stage_row(float *sh, const float *row, int c, int hs)
{
    for (int i = c; i < PER * GROUP; i += GROUP)
        sh[i] = row && i < hs ? row[i] : 0.0f;
}

/* The key and value rows k0 .. k0+ROWS-1 of the kv head at kh into ks, vs
 * (zeros past Tk), between barriers: the previous tile is consumed first. */
template <int PER>
__device__ inline void stage_kv_tile(float *ks, float *vs, const float *kh, int k0, const Shape &s)
{
    const int r = threadIdx.x / GROUP, c = threadIdx.x % GROUP, u = k0 + r;
    const float *krow = u < s.Tk ? kh + (size_t)u * s.kvw : NULL;
    __syncthreads();
    stage_row<PER>(ks + r * STRIDE, krow, c, s.hs);
    stage_row<PER>(vs + r * STRIDE, krow ? krow + s.hs : NULL, c, s.hs);
    __syncthreads();
}

/* The keys a query tile needs: the union [*lo, *hi) of its rows' ranges
 * (empty: *lo >= *hi), the same for every thread of the block. */
__device__ inline void tile_key_range(int u0, int u1, int *lo, int *hi)
{
    __shared__ int lo_s[ROWS], hi_s[ROWS];
    const int r = threadIdx.x / GROUP;
    __syncthreads();
    if (threadIdx.x % GROUP == 0) {
        lo_s[r] = u0 < u1 ? u0 : 0x7fffffff;
        hi_s[r] = u0 < u1 ? u1 : 0;
    }
    __syncthreads();
    int l = 0x7fffffff, h = 0;
    for (int i = 0; i < ROWS; i++) {
        l = imin(l, lo_s[i]);
        h = imax(h, hi_s[i]);
    }
    *lo = l, *hi = h;
}

template <int PER>
__global__ void __launch_bounds__(ATT_BLOCK)
    attention_forward_kernel(float *out, float *lse, const float *qkv, const float *kv, Shape s)
{
    __shared__ float ks[ROWS * STRIDE], vs[ROWS * STRIDE];
    int b, h, tile;
    block_coords(s.qtiles, s.H, 1, &b, &h, &tile);
    const int r = threadIdx.x / GROUP, c = threadIdx.x % GROUP, hs = s.hs;
    const int t = tile * ROWS + r, valid = t < s.Tq;
    const float *kh = kv + (size_t)b * s.Tk * s.kvw + kv_k_off(h / s.Q, s);

    float q[PER], o[PER];
    load_row(q, valid ? qkv + ((size_t)b * s.Tq + t) * s.width + q_off(h, s.Q, hs) : NULL, c, hs);
#pragma unroll
    for (int j = 0; j < PER; j++)
        o[j] = 0;
    const GroupRegs<PER> qg = group_share<PER, 0>(q);
    float m = -INFINITY, l = 0;

    int u0 = 0, u1 = 0, lo, hi;
    if (valid)
        key_range(s, b, t, &u0, &u1);
    tile_key_range(u0, u1, &lo, &hi);
    for (int k0 = lo; k0 < hi; k0 += ROWS) {
        stage_kv_tile<PER>(ks, vs, kh, k0, s);
        const int n = imin(ROWS, hi - k0);
        for (int j = 0; j < n; j++) {
            float sc = group_dot(q, qg, ks + j * STRIDE, c) * s.scale;
            if (k0 + j < u0 || k0 + j >= u1)
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
    float *lrow = lse + ((size_t)b * s.H + h) * s.Tq + t;
    /* The lse merged into, read by thread 0 of the row and shared (every
     * thread reads it before thread 0 writes the new one). */
    const float la = s.merge ? group_sum(valid && c == 0 ? *lrow : 0.0f) : 0.0f;
    if (!valid)
        return;
    float *orow = out + ((size_t)b * s.Tq + t) * s.H * hs + (size_t)h * hs;
    uint16_t *o16 = out16_row(s, out, orow);
    /* this block's result: o * inv, log-sum-exp lb (-inf and 0: no key) */
    float inv = l > 0 ? 1 / l : 0.0f, lb = l > 0 ? m + logf(l) : -INFINITY, wa = 0, wb = 1;
    float ltot = lb;
    if (s.merge) { /* log-sum-exp merge with what out and lse hold */
        const float mx = fmaxf(la, lb);
        if (mx == -INFINITY) { /* neither saw a key: out stays 0, its copy written too */
#pragma unroll
            for (int j = 0; j < PER; j++)
                if (o16 && c + GROUP * j < hs)
                    o16[c + GROUP * j] = bf16_bits_of(orow[c + GROUP * j]);
            return;
        }
        const float ea = expf(la - mx), eb = expf(lb - mx), tot = ea + eb;
        wa = ea / tot, wb = eb / tot, ltot = mx + logf(tot);
    }
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int i = c + GROUP * j;
        if (i >= hs)
            continue;
        const float v = (s.merge ? wa * orow[i] : 0.0f) + wb * (o[j] * inv);
        orow[i] = v;
        if (o16)
            o16[i] = bf16_bits_of(v);
    }
    if (c == 0)
        *lrow = ltot;
}

/* dq[t] += scale * sum_u p (dp - D_t) k_u over the keys u row t sees, for
 * the rows of one query tile of head h (= with s.set: every row t < Tq of
 * the head is some block's, so all of dq's query heads are written). */
template <int PER>
__global__ void __launch_bounds__(ATT_BLOCK)
    attention_dq_kernel(float *dq_buf, const float *dout, const float *qkv, const float *kv,
                        const float *out, const float *lse, Shape s)
{
    __shared__ float ks[ROWS * STRIDE], vs[ROWS * STRIDE];
    int b, h, tile;
    block_coords(s.qtiles, s.H, 1, &b, &h, &tile);
    const int r = threadIdx.x / GROUP, c = threadIdx.x % GROUP, hs = s.hs;
    const int t = tile * ROWS + r, valid = t < s.Tq, ow = s.H * hs;
    const size_t qrow = ((size_t)b * s.Tq + t) * s.width + q_off(h, s.Q, hs);
    const float *kh = kv + (size_t)b * s.Tk * s.kvw + kv_k_off(h / s.Q, s);
    const size_t orow = ((size_t)b * s.Tq + t) * ow + (size_t)h * hs;

    float q[PER], d[PER], dq[PER];
    load_row(q, valid ? qkv + qrow : NULL, c, hs);
    load_row(d, valid ? dout + orow : NULL, c, hs);
    load_row(dq, valid ? out + orow : NULL, c, hs); /* out, for D; then dq */
    float D = 0;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        D += d[j] * dq[j];
        dq[j] = 0;
    }
    D = group_sum(D);
    const GroupRegs<PER> qg = group_share<PER, 0>(q), dg = group_share<PER, 1>(d);
    const float L = valid ? lse[((size_t)b * s.H + h) * s.Tq + t] : 0.0f;

    int u0 = 0, u1 = 0, lo, hi;
    if (valid)
        key_range(s, b, t, &u0, &u1);
    tile_key_range(u0, u1, &lo, &hi);
    for (int k0 = lo; k0 < hi; k0 += ROWS) {
        stage_kv_tile<PER>(ks, vs, kh, k0, s);
        const int n = imin(ROWS, hi - k0);
        for (int j = 0; j < n; j++) {
            const float *k = ks + j * STRIDE;
            float sc = group_dot(q, qg, k, c) * s.scale;
            float dp = group_dot(d, dg, vs + j * STRIDE, c);
            if (k0 + j < u0 || k0 + j >= u1)
                continue;
            float ds = expf(sc - L) * (dp - D) * s.scale;
#pragma unroll
            for (int i = 0; i < PER; i++)
                dq[i] += ds * k[c + GROUP * i];
        }
    }
    if (!valid)
        return;
    put_row(dq_buf + qrow, dq, c, hs, s.set);
}

/* For the keys of one key tile of kv group g, summed over the group's query
 * heads and the query rows that see them:
 *   dk_u += scale * p (dp - D_t) q_t;  dv_u += p dout_t
 * Query rows before the tile's first key position never see it (causal),
 * so the walk starts at the first that can. */
template <int PER>
__global__ void __launch_bounds__(ATT_BLOCK)
    attention_dkv_kernel(float *dkv, const float *dout, const float *qkv, const float *kv,
                         const float *out, const float *lse, Shape s)
{
    __shared__ float qs[ROWS * STRIDE], ds_[ROWS * STRIDE];
    __shared__ float Ls[ROWS], Ds[ROWS];
    __shared__ int First[ROWS], Qp[ROWS]; /* per staged query row: first key position seen, own */
    int b, g, tile;
    block_coords(s.ktiles, s.KVH, 0, &b, &g, &tile);
    const int r = threadIdx.x / GROUP, c = threadIdx.x % GROUP, hs = s.hs;
    const int u = tile * ROWS + r, valid = u < s.Tk, ow = s.H * hs, kp = s.k_pos0 + u;
    const size_t krow_at = ((size_t)b * s.Tk + u) * s.kvw + kv_k_off(g, s);
    const float *krow = valid ? kv + krow_at : NULL;

    float k[PER], v[PER], dk[PER], dv[PER];
    load_row(k, krow, c, hs);
    load_row(v, krow ? krow + hs : NULL, c, hs);
#pragma unroll
    for (int j = 0; j < PER; j++)
        dk[j] = dv[j] = 0;
    const GroupRegs<PER> kg = group_share<PER, 0>(k), vg = group_share<PER, 1>(v);

    /* the first query row at or after the tile's first key position */
    const int tstart = imax(0, s.k_pos0 + tile * ROWS - s.q_pos0);
    for (int h = g * s.Q; h < (g + 1) * s.Q; h++) {
        const size_t qo = q_off(h, s.Q, hs);
        for (int t0 = tstart; t0 < s.Tq; t0 += ROWS) {
            /* Stage query rows t0.. of head h: q, dout, and per row lse, D
             * and the positions that bound the keys it sees. */
            __syncthreads();
            const int t_r = t0 + r, has = t_r < s.Tq;
            const size_t orow = ((size_t)b * s.Tq + t_r) * ow + (size_t)h * hs;
            stage_row<PER>(qs + r * STRIDE,
                           has ? qkv + ((size_t)b * s.Tq + t_r) * s.width + qo : NULL, c, hs);
            stage_row<PER>(ds_ + r * STRIDE, has ? dout + orow : NULL, c, hs);
            float o[PER];
            load_row(o, has ? out + orow : NULL, c, hs);
            float D = group_sum(part_dot(o, ds_ + r * STRIDE, c));
            if (c == 0) {
                const int qp = s.q_pos0 + t_r;
                Ds[r] = D;
                Ls[r] = has ? lse[((size_t)b * s.H + h) * s.Tq + t_r] : 0.0f;
                Qp[r] = has ? qp : -1; /* a missing row sees no key */
                First[r] = has && s.pos ? qp - s.pos[(size_t)b * s.Tq + t_r] : 0;
            }
            __syncthreads();
            const int n = imin(ROWS, s.Tq - t0);
            for (int j = 0; j < n; j++) {
                const float *qr = qs + j * STRIDE, *dr = ds_ + j * STRIDE;
                float sc = group_dot(k, kg, qr, c) * s.scale;
                float dp = group_dot(v, vg, dr, c);
                if (!valid || kp > Qp[j] || kp < First[j])
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
    put_row(dkv + krow_at, dk, c, hs, s.set);
    put_row(dkv + krow_at + hs, dv, c, hs, s.set);
}

/* The grid: one block per (b, head, tile), within gridDim.x's limit. */
static unsigned tile_blocks(int B, int heads, int tiles)
{
    size_t n = (size_t)B * (size_t)heads * (size_t)tiles;
    TRD_ASSERT(n <= 0x7fffffffu);
    return (unsigned)n;
}

/* The kernels for PER channels per thread. */
template <int PER>
static void forward_launch(float *out, float *lse, const float *q, const float *kv,
                           const AttnArgs *a, const Shape &s)
{
    attention_forward_kernel<PER>
        <<<tile_blocks(a->B, a->H, s.qtiles), ATT_BLOCK, 0, cuda_stream()>>>(out, lse, q, kv, s);
    CUDA_CHECK_LAUNCH();
}

template <int PER>
static void backward_launch(float *dq, float *dkv, const float *dout, const float *q,
                            const float *kv, const float *out, const float *lse, const AttnArgs *a,
                            const Shape &s)
{
    attention_dq_kernel<PER><<<tile_blocks(a->B, a->H, s.qtiles), ATT_BLOCK, 0, cuda_stream()>>>(
        dq, dout, q, kv, out, lse, s);
    CUDA_CHECK_LAUNCH();
    attention_dkv_kernel<PER><<<tile_blocks(a->B, a->KVH, s.ktiles), ATT_BLOCK, 0, cuda_stream()>>>(
        dkv, dout, q, kv, out, lse, s);
    CUDA_CHECK_LAUNCH();
}

void cuda_attention_forward(float *out, float *lse, const float *q, const float *kv,
                            const AttnArgs *a)
{
    attn_check_args(a);
    if (a->B <= 0 || a->Tq <= 0 || a->H <= 0 || a->hs <= 0)
        return;
    const Shape s = attn_shape(a, ROWS);
    if (a->hs <= 4 * GROUP)
        forward_launch<4>(out, lse, q, kv, a, s);
    else if (a->hs <= 8 * GROUP)
        forward_launch<8>(out, lse, q, kv, a, s);
    else
        forward_launch<16>(out, lse, q, kv, a, s);
}

void cuda_attention_backward(float *dq, float *dkv, const float *dout, const float *q,
                             const float *kv, const float *out, const float *lse, const AttnArgs *a)
{
    attn_check_args(a);
    TRD_ASSERT(a->grad != GRAD_SET || a->Tk > 0); /* else no kernel would write dq */
    if (a->B <= 0 || a->Tq <= 0 || a->Tk <= 0 || a->H <= 0 || a->hs <= 0)
        return;
    const Shape s = attn_shape(a, ROWS);
    if (a->hs <= 4 * GROUP)
        backward_launch<4>(dq, dkv, dout, q, kv, out, lse, a, s);
    else if (a->hs <= 8 * GROUP)
        backward_launch<8>(dq, dkv, dout, q, kv, out, lse, a, s);
    else
        backward_launch<16>(dq, dkv, dout, q, kv, out, lse, a, s);
}
