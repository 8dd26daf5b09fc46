/* attention_tc.cu — the attention of training.precision: bf16 on tensor
 * cores (backend_cuda_bf16): flash attention with bf16 operands and fp32
 * accumulation through mma.sync m16n8k16 (mma.cuh), for head sizes 64 and
 * 128.  Every other head size goes to attention.cu's fp32 kernels, which
 * stay the reference and serve fp32 training.  The call's semantics are
 * AttnArgs's (backend.h): offsets of a sequence split over ranks, packed
 * documents, GQA, the lse and the merge; the kernels follow attention.cu's
 * plan (forward; backward as a dq kernel and a dk/dv kernel, one writer per
 * gradient element, no atomics, after a kernel that takes each row's
 * D = dout . out once) with its key rule (attention.cuh).
 *
 * Rounding (what the tolerance of tests/test_cuda_ops.c rests on): q, k,
 * v and dout are rounded to bf16 once (the A fragments where they are
 * loaded, the streamed tiles in bf16 copies made per call:
 * tc_convert_kernel, and dout's by the delta kernel); the scores
 * S = q.k, dP = dout.v, the softmax statistics (running max, sum, lse),
 * D = dout . out and every accumulator stay fp32; the probabilities P and
 * dS = P (dP - D) are rounded to bf16 once, as the A operand of the second
 * product (O += P V, dq += dS k, dv += P^T dout, dk += dS^T q).  The sum l
 * of the softmax is taken over the unrounded P.
 *
 * A block is 4 warps, a tile of 64 rows, 16 per warp: query rows in the
 * forward and dq kernels, key rows in the dk/dv kernel; the other operand
 * streams through shared memory as bf16 in tiles of 64 rows.  A warp keeps
 * its rows' A fragments (q; or k and v) in registers for the whole block,
 * and its results in mma accumulators: each lane holds rows g and g+8 of
 * its warp's 16 (g = lane / 4), columns 2c, 2c+1 of each 8-wide tile
 * (c = lane % 4), so a row's statistics are sums over the 4 lanes of a
 * quad.  The B operands come from the staged tiles: along a row (32-bit
 * loads) for q.k-like products, down a column for P.v-like ones, as
 * ldmatrix.trans gives it (mma.cuh).
 *
 * Staging is a software pipeline: the tiles come from the bf16 copies by
 * cp.async (mma.cuh), each issued as soon as its buffer is consumed, so
 * its copy runs during the products of the other operand's tile (one
 * buffer an operand, the shared memory of before): the block waits for
 * memory only where a copy takes longer than a product. */
#include "attention.cuh"
#include "mma.cuh"

enum {
    TC_ROWS = 64,           /* rows of a tile, of either operand */
    TC_BLOCK = 4 * 32,      /* 4 warps of 16 rows */
    TC_PAD = 8,             /* bf16 padding of a shared row (see tc_stage) */
    TC_STEPS = TC_ROWS / 16 /* k-steps of 16 over a tile of 64 */
};

__device__ inline float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__device__ inline float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ inline float bf16r(float x) { return __bfloat162float(__float2bfloat16(x)); }

/* The softmax runs in base 2: scores scaled by scale * log2(e), then
 * exp2f (one ex2 instruction and a little handling; expf reduces its
 * argument first), the running max in the same units; lse leaves in
 * natural units (m ln 2 + ln l) and comes back scaled by log2(e). */
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2   0.6931471805599453f

/* Rows r0 .. r0+63 of a head of a bf16 copy (the row at head + row * ld)
 * into sh, zeros for rows outside [0, n), by cp.async (mma.cuh): the
 * caller commits the group and waits for it.  The padding of 8 bf16 puts
 * consecutive rows 4 banks apart: the 8 rows x 4 pairs of a fragment load
 * land in 32 different banks.  The copies are 16 bytes: sh's rows, the
 * copies (cuda_scratch), a head's offset and the row stride are
 * multiples of 8 bf16. */
template <int HS>
__device__ inline void tc_stage(uint16_t (*sh)[HS + TC_PAD], const uint16_t *head, size_t ld,
                                int r0, int n)
{
    constexpr int CH = HS / 8, PER = TC_ROWS * CH / TC_BLOCK; /* 16-byte pieces: a row, a thread */
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * TC_BLOCK, row = r0 + i / CH, in = row >= 0 && row < n;
        mma_cp16(&sh[i / CH][i % CH * 8], head + (size_t)(in ? row : 0) * ld + i % CH * 8, in);
    }
}

/* The row width of the bf16 copy of k and v (tc_convert_kernel): each
 * group's key head, then its value head, as kv_packed lays them out. */
__device__ inline size_t tc_kv16_width(const Shape &s) { return (size_t)2 * s.KVH * s.hs; }

/* The bf16 copies the tiles stream from, rounded once per call (round to
 * nearest even, as the A fragments are: the same bits as rounding where
 * a tile is loaded): q16 [B, Tq, H, HS] of the query heads of qkv (when
 * nq4 > 0: that many quads, 4 floats each, then the key's), kv16
 * [B, Tk, KVH, 2 HS] of kv's key and value heads.  Only the heads are
 * read: GPT-2's forward reads 2/3 of qkv. */
template <int HS>
__global__ void tc_convert_kernel(uint16_t *q16, uint16_t *kv16, const float *qkv, const float *kv,
                                  size_t nq4, size_t n4, Shape s)
{
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n4)
        return;
    const int isq = e < nq4, heads = isq ? s.H : s.KVH, w = isq ? HS / 4 : HS / 2;
    const size_t k = isq ? e : e - nq4, row = k / ((size_t)heads * w);
    const int head = (int)(k / w % heads), j = (int)(k % w) * 4;
    const float *src =
        isq ? qkv + row * s.width + q_off(head, s.Q, HS) : kv + row * s.kvw + kv_k_off(head, s);
    const float4 v = *(const float4 *)(src + j);
    uint16_t *dst = (isq ? q16 : kv16) + k * 4;
    mma_st2(dst, mma_pack(v.x, v.y));
    mma_st2(dst + 2, mma_pack(v.z, v.w));
}

/* This lane's A fragments of rows r0 .. r0+15 of a head (zeros outside
 * [0, n)) rounded to bf16: a[kk] covers channels 16kk .. 16kk+15. */
template <int HS>
__device__ inline void tc_load_a(uint32_t (&a)[HS / 16][4], const float *head, size_t ld, int r0,
                                 int n)
{
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    for (int half = 0; half < 2; half++) {
        const int row = r0 + g + 8 * half;
        const float *p = row < n ? head + (size_t)row * ld : NULL;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            const int j = 16 * kk + 2 * c;
            a[kk][half] = p ? mma_pack(p[j], p[j + 1]) : 0u;
            a[kk][2 + half] = p ? mma_pack(p[j + 8], p[j + 9]) : 0u;
        }
    }
}

/* s = A X^T for this warp's 16 rows against the 64 rows of a staged tile
 * xs (HS channels): s[j] is the 16 x 8 block of rows 8j .. 8j+7 of xs. */
template <int HS>
__device__ inline void tc_scores(float (&s)[8][4], const uint32_t (&a)[HS / 16][4],
                                 const uint16_t (*xs)[HS + TC_PAD])
{
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int j = 0; j < 8; j++)
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint16_t *row = &xs[8 * j + g][16 * kk + 2 * c];
            const uint32_t bf[2] = {mma_ld2(row), mma_ld2(row + 8)};
            mma_bf16_16816(s[j], a[kk], bf);
        }
}

/* acc += P X for this warp's 16 rows: P (16 x 64, in the layout of
 * tc_scores's result) rounded to bf16, X the staged tile xs (64 x HS). */
template <int HS>
__device__ inline void tc_accumulate(float (&acc)[HS / 8][4], const float (&p)[8][4],
                                     const uint16_t (*xs)[HS + TC_PAD])
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < TC_STEPS; kk++) {
        const uint32_t a[4] = {mma_pack(p[2 * kk][0], p[2 * kk][1]),
                               mma_pack(p[2 * kk][2], p[2 * kk][3]),
                               mma_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               mma_pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            uint32_t bf[2];
            mma_ldmatrix_x2_trans(bf, &xs[16 * kk + lane % 16][8 * n]);
            mma_bf16_16816(acc[n], a, bf);
        }
    }
}

/* The union [*lo, *hi) of the key ranges of a query tile's 64 rows (this
 * lane's two rows: [u0[i], u1[i])), the same for every thread. */
__device__ inline void tc_tile_keys(const int (&u0)[2], const int (&u1)[2], int *lo, int *hi)
{
    __shared__ int lo_s[TC_ROWS], hi_s[TC_ROWS];
    const int lane = threadIdx.x % 32, first = threadIdx.x / 32 * 16 + lane / 4;
    __syncthreads();
    if (lane % 4 == 0)
        for (int i = 0; i < 2; i++) {
            lo_s[first + 8 * i] = u0[i] < u1[i] ? u0[i] : 0x7fffffff;
            hi_s[first + 8 * i] = u0[i] < u1[i] ? u1[i] : 0;
        }
    __syncthreads();
    int l = 0x7fffffff, h = 0;
    for (int i = 0; i < TC_ROWS; i++) {
        l = imin(l, lo_s[i]);
        h = imax(h, hi_s[i]);
    }
    *lo = l, *hi = h;
}

/* The key ranges of this lane's two query rows r0 + g, r0 + g + 8 (empty
 * past Tq). */
__device__ inline void tc_row_keys(const Shape &s, int b, int r0, int (&u0)[2], int (&u1)[2])
{
    const int g = threadIdx.x % 32 / 4;
    for (int i = 0; i < 2; i++) {
        const int t = r0 + g + 8 * i;
        u0[i] = u1[i] = 0;
        if (t < s.Tq)
            key_range(s, b, t, &u0[i], &u1[i]);
    }
}

/* Whether each of the 64 query rows from t0 sees each of the 64 keys from
 * k0, so that a tile needs no mask: no packed documents (AttnArgs.pos
 * NULL: a row sees every key up to its own position), both tiles whole,
 * and the last key no later than the first query row.  The same for the
 * whole block: the branch never diverges. */
__device__ inline int tc_tile_full(const Shape &s, int t0, int k0)
{
    return !s.pos && t0 + TC_ROWS <= s.Tq && k0 + TC_ROWS <= s.Tk &&
           s.k_pos0 + k0 + TC_ROWS - 1 <= s.q_pos0 + t0;
}

template <int HS>
__global__ void __launch_bounds__(TC_BLOCK)
    attention_tc_forward_kernel(float *out, float *lse, const float *qkv, const uint16_t *kv16,
                                Shape s)
{
    __shared__ __align__(16) uint16_t ks[TC_ROWS][HS + TC_PAD], vs[TC_ROWS][HS + TC_PAD];
    int b, h, tile;
    block_coords(s.qtiles, s.H, 1, &b, &h, &tile);
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int r0 = tile * TC_ROWS + threadIdx.x / 32 * 16;
    const size_t kw = tc_kv16_width(s);
    const uint16_t *kh = kv16 + (size_t)b * s.Tk * kw + (size_t)(h / s.Q) * 2 * HS;

    uint32_t qa[HS / 16][4];
    tc_load_a<HS>(qa, qkv + (size_t)b * s.Tq * s.width + q_off(h, s.Q, HS), s.width, r0, s.Tq);
    int u0[2], u1[2], lo, hi;
    tc_row_keys(s, b, r0, u0, u1);
    tc_tile_keys(u0, u1, &lo, &hi);

    const float sl2 = s.scale * TC_LOG2E;
    float o[HS / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    /* The pipeline: V of a tile is copied during its scores, K of the next
     * during its softmax and P V; one buffer each. */
    if (lo < hi)
        tc_stage<HS>(ks, kh, kw, lo, s.Tk);
    mma_cp_commit();
    for (int k0 = lo; k0 < hi; k0 += TC_ROWS) {
        mma_cp_wait<0>();
        __syncthreads(); /* K is in; vs is consumed (the last tile's P V) */
        tc_stage<HS>(vs, kh + HS, kw, k0, s.Tk);
        mma_cp_commit();
        float p[8][4], mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f}, alpha[2];
        tc_scores<HS>(p, qa, ks);
        __syncthreads(); /* ks is consumed */
        if (k0 + TC_ROWS < hi)
            tc_stage<HS>(ks, kh, kw, k0 + TC_ROWS, s.Tk);
        mma_cp_commit();
        if (tc_tile_full(s, tile * TC_ROWS, k0)) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                for (int i = 0; i < 4; i++) {
                    p[j][i] *= sl2;
                    mx[i / 2] = fmaxf(mx[i / 2], p[j][i]);
                }
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                for (int i = 0; i < 4; i++) {
                    const int u = k0 + 8 * j + 2 * c + i % 2, r = i / 2;
                    p[j][i] = u >= u0[r] && u < u1[r] ? p[j][i] * sl2 : -INFINITY;
                    mx[r] = fmaxf(mx[r], p[j][i]);
                }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float mn = fmaxf(m[r], quad_max(mx[r]));
            alpha[r] = mn == -INFINITY ? 1.0f : exp2f(m[r] - mn);
            m[r] = mn;
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) {
                const int r = i / 2;
                p[j][i] = m[r] == -INFINITY ? 0.0f : exp2f(p[j][i] - m[r]);
                sum[r] += p[j][i];
            }
        for (int r = 0; r < 2; r++)
            l[r] = l[r] * alpha[r] + sum[r];
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            for (int i = 0; i < 4; i++)
                o[n][i] *= alpha[i / 2];
        mma_cp_wait<1>(); /* V is in (the next K may be on its way) */
        __syncthreads();
        tc_accumulate<HS>(o, p, vs);
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = r0 + g + 8 * r, valid = t < s.Tq;
        const float lr = quad_sum(l[r]);
        float *lrow = lse + ((size_t)b * s.H + h) * s.Tq + t;
        /* the lse merged into, read by lane c == 0 of the quad and summed
         * over it (every lane reads it before that lane writes the new) */
        const float la = s.merge ? quad_sum(valid && c == 0 ? *lrow : 0.0f) : 0.0f;
        if (!valid)
            continue;
        const float inv = lr > 0 ? 1 / lr : 0.0f,
                    lb = lr > 0 ? m[r] * TC_LN2 + logf(lr) : -INFINITY;
        float wa = 0, wb = 1, ltot = lb;
        float *orow = out + ((size_t)b * s.Tq + t) * s.H * HS + (size_t)h * HS;
        uint16_t *o16 = out16_row(s, out, orow);
        if (s.merge) {
            const float mx = fmaxf(la, lb);
            if (mx == -INFINITY) { /* neither saw a key: out stays 0, its copy written too */
                for (int n = 0; n < HS / 8 && o16; n++)
                    for (int e = 0; e < 2; e++)
                        o16[8 * n + 2 * c + e] = bf16_bits_of(orow[8 * n + 2 * c + e]);
                continue;
            }
            const float ea = expf(la - mx), eb = expf(lb - mx), tot = ea + eb;
            wa = ea / tot, wb = eb / tot, ltot = mx + logf(tot);
        }
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            for (int e = 0; e < 2; e++) {
                const int i = 8 * n + 2 * c + e;
                const float v = (s.merge ? wa * orow[i] : 0.0f) + wb * (o[n][2 * r + e] * inv);
                orow[i] = v;
                if (o16)
                    o16[i] = bf16_bits_of(v);
            }
        if (c == 0)
            *lrow = ltot;
    }
}

/* D[b, h, t] = dout (rounded to bf16) . out over the head's channels, for
 * the two backward kernels: a warp per (b, t, h) row, read once (the dk/dv
 * kernel used to take it again for every key tile, with one thread a row);
 * and dout16, dout's bf16 copy (dout's layout) the dk/dv kernel streams. */
template <int HS>
__global__ void attention_tc_delta_kernel(float *D, uint16_t *dout16, const float *dout,
                                          const float *out, int B, Shape s)
{
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32, valid = row < (size_t)B * s.Tq * s.H;
    const int h = (int)(row % s.H), t = (int)(row / s.H % s.Tq), b = (int)(row / s.H / s.Tq);
    float part = 0;
    if (valid) {
        const float *d = dout + row * HS, *o = out + row * HS;
#pragma unroll
        for (int i = lane; i < HS; i += 32) {
            part += bf16r(d[i]) * o[i];
            dout16[row * HS + i] = bf16_bits_of(d[i]);
        }
    }
    part = warp_sum(part); /* every lane of the block (the emulation's shuffle is a barrier) */
    if (lane == 0 && valid)
        D[((size_t)b * s.H + h) * s.Tq + t] = part;
}

/* dq[t] += scale * sum_u dS[t,u] k_u, dS = P (dP - D_t), for the rows of
 * one query tile of head h. */
template <int HS>
__global__ void __launch_bounds__(TC_BLOCK)
    attention_tc_dq_kernel(float *dq_buf, const float *dout, const float *qkv, const uint16_t *kv16,
                           const float *Dbuf, const float *lse, Shape s)
{
    __shared__ __align__(16) uint16_t ks[TC_ROWS][HS + TC_PAD], vs[TC_ROWS][HS + TC_PAD];
    int b, h, tile;
    block_coords(s.qtiles, s.H, 1, &b, &h, &tile);
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4, ow = s.H * HS;
    const int r0 = tile * TC_ROWS + threadIdx.x / 32 * 16;
    const size_t kw = tc_kv16_width(s);
    const uint16_t *kh = kv16 + (size_t)b * s.Tk * kw + (size_t)(h / s.Q) * 2 * HS;
    const size_t qbase = (size_t)b * s.Tq * s.width + q_off(h, s.Q, HS);
    const size_t obase = (size_t)b * s.Tq * ow + (size_t)h * HS;

    uint32_t qa[HS / 16][4], da[HS / 16][4];
    tc_load_a<HS>(qa, qkv + qbase, s.width, r0, s.Tq);
    tc_load_a<HS>(da, dout + obase, ow, r0, s.Tq);
    float D[2], L[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = r0 + g + 8 * r;
        const size_t i = ((size_t)b * s.H + h) * s.Tq + t;
        D[r] = t < s.Tq ? Dbuf[i] : 0.0f;
        L[r] = t < s.Tq ? lse[i] * TC_LOG2E : 0.0f;
    }
    int u0[2], u1[2], lo, hi;
    tc_row_keys(s, b, r0, u0, u1);
    tc_tile_keys(u0, u1, &lo, &hi);

    const float sl2 = s.scale * TC_LOG2E;
    float dq[HS / 8][4] = {};
    /* The pipeline: V of the next tile is copied during this tile's q.K and
     * dq += dS K, K of the next during the next's dout.V; one buffer each. */
    if (lo < hi) {
        tc_stage<HS>(vs, kh + HS, kw, lo, s.Tk);
        mma_cp_commit();
        tc_stage<HS>(ks, kh, kw, lo, s.Tk);
    }
    mma_cp_commit();
    for (int k0 = lo; k0 < hi; k0 += TC_ROWS) {
        const int next = k0 + TC_ROWS < hi;
        mma_cp_wait<1>(); /* V is in (K may be on its way) */
        __syncthreads();
        float p[8][4], dp[8][4];
        tc_scores<HS>(dp, da, vs);
        __syncthreads(); /* vs is consumed */
        if (next)
            tc_stage<HS>(vs, kh + HS, kw, k0 + TC_ROWS, s.Tk);
        mma_cp_commit();
        mma_cp_wait<1>(); /* K is in */
        __syncthreads();
        tc_scores<HS>(p, qa, ks);
        if (tc_tile_full(s, tile * TC_ROWS, k0)) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                for (int i = 0; i < 4; i++)
                    p[j][i] = exp2f(p[j][i] * sl2 - L[i / 2]) * (dp[j][i] - D[i / 2]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                for (int i = 0; i < 4; i++) {
                    const int u = k0 + 8 * j + 2 * c + i % 2, r = i / 2;
                    p[j][i] = u >= u0[r] && u < u1[r]
                                  ? exp2f(p[j][i] * sl2 - L[r]) * (dp[j][i] - D[r])
                                  : 0.0f;
                }
        }
        tc_accumulate<HS>(dq, p, ks);
        __syncthreads(); /* ks is consumed */
        if (next)
            tc_stage<HS>(ks, kh, kw, k0 + TC_ROWS, s.Tk);
        mma_cp_commit();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = r0 + g + 8 * r;
        if (t >= s.Tq)
            continue;
        float *row = dq_buf + qbase + (size_t)t * s.width;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            for (int e = 0; e < 2; e++)
                grad_put(row + 8 * n + 2 * c + e, s.scale * dq[n][2 * r + e], s.set);
    }
}

/* What the dk/dv kernel stages per query tile besides q and dout, a row
 * each: lse, D and, with packed documents, the row's position in its
 * document (zeros for rows past Tq), copied; then (tc_rows_ready) lse in
 * base 2, the row's own key position and the first it sees. */
struct TcRows {
    float L[TC_ROWS], D[TC_ROWS];
    int32_t first[TC_ROWS], qp[TC_ROWS];
};

/* A staged TcRows made ready, by each of the first 64 threads for the row
 * it copied, after its wait for its copies and before the barrier that
 * shows them to the block: lse scaled here, stored, so its rounding stays
 * apart from the subtraction that reads it (no fused multiply-add). */
__device__ inline void tc_rows_ready(TcRows *rows, int t0, const Shape &s)
{
    if (threadIdx.x >= TC_ROWS)
        return;
    const int x = threadIdx.x, t = t0 + x, has = t < s.Tq, qp = s.q_pos0 + t;
    rows->L[x] *= TC_LOG2E;
    rows->qp[x] = has ? qp : -1; /* a missing row sees no key */
    rows->first[x] = has && s.pos ? qp - rows->first[x] : 0;
}

/* Query tile j of the dk/dv kernel's walk (the group's heads in turn, each
 * from row tstart in tiles of nt): its q and dout rows into qs and dos
 * (dos only when !q, qs and the rows' TcRows otherwise), by cp.async. */
template <int HS>
__device__ inline void tc_stage_query(uint16_t (*sh)[HS + TC_PAD], TcRows *rows, int q, int j,
                                      int nt, int tstart, int b, int kvg, const uint16_t *q16,
                                      const uint16_t *dout16, const float *Dbuf, const float *lse,
                                      const Shape &s)
{
    const int h = kvg * s.Q + j / nt, t0 = tstart + j % nt * TC_ROWS, ow = s.H * HS;
    const size_t base = (size_t)b * s.Tq * ow + (size_t)h * HS;
    tc_stage<HS>(sh, (q ? q16 : dout16) + base, ow, t0, s.Tq);
    if (q && threadIdx.x < TC_ROWS) {
        const int t = t0 + threadIdx.x, in = t < s.Tq;
        const size_t i = ((size_t)b * s.H + h) * s.Tq + (in ? t : 0);
        mma_cp4(&rows->L[threadIdx.x], lse + i, in);
        mma_cp4(&rows->D[threadIdx.x], Dbuf + i, in);
        if (s.pos)
            mma_cp4(&rows->first[threadIdx.x], s.pos + (size_t)b * s.Tq + (in ? t : 0), in);
    }
}

/* For the keys of one key tile of kv group kvg, summed over the group's
 * query heads and the query rows that see them:
 *   dk_u += scale * sum_t dS[t,u] q_t;  dv_u += sum_t P[t,u] dout_t
 * Query rows before the tile's first key position never see it (causal),
 * so the walk starts at the first that can.  The pipeline: dout of the
 * next query tile is copied during this tile's dk += dS q, q (and the
 * rows' lse, D, positions) of the next during the next's v.dout; one
 * buffer each. */
template <int HS>
__global__ void __launch_bounds__(TC_BLOCK)
    attention_tc_dkv_kernel(float *dkv, const float *kv, const uint16_t *q16,
                            const uint16_t *dout16, const float *Dbuf, const float *lse, Shape s)
{
    __shared__ __align__(16) uint16_t qs[TC_ROWS][HS + TC_PAD], dos[TC_ROWS][HS + TC_PAD];
    __shared__ __align__(16) TcRows rows;
    int b, kvg, tile;
    block_coords(s.ktiles, s.KVH, 0, &b, &kvg, &tile);
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int r0 = tile * TC_ROWS + threadIdx.x / 32 * 16;
    const size_t kbase = (size_t)b * s.Tk * s.kvw + kv_k_off(kvg, s);

    uint32_t ka[HS / 16][4], va[HS / 16][4];
    tc_load_a<HS>(ka, kv + kbase, s.kvw, r0, s.Tk);
    tc_load_a<HS>(va, kv + kbase + HS, s.kvw, r0, s.Tk);
    int kp[2], kvalid[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        kvalid[r] = r0 + g + 8 * r < s.Tk;
        kp[r] = s.k_pos0 + r0 + g + 8 * r;
    }
    const float sl2 = s.scale * TC_LOG2E;
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};

    const int tstart = imax(0, s.k_pos0 + tile * TC_ROWS - s.q_pos0);
    const int nt = tstart < s.Tq ? (s.Tq - tstart + TC_ROWS - 1) / TC_ROWS : 0, walk = s.Q * nt;
    if (walk > 0) {
        tc_stage_query<HS>(dos, &rows, 0, 0, nt, tstart, b, kvg, q16, dout16, Dbuf, lse, s);
        mma_cp_commit();
        tc_stage_query<HS>(qs, &rows, 1, 0, nt, tstart, b, kvg, q16, dout16, Dbuf, lse, s);
    }
    mma_cp_commit();
    for (int j = 0; j < walk; j++) {
        const int t0 = tstart + j % nt * TC_ROWS;
        mma_cp_wait<1>(); /* dout is in (q may be on its way) */
        __syncthreads();
        float p[8][4], dp[8][4];
        tc_scores<HS>(dp, va, dos);
        mma_cp_wait<0>(); /* q and the rows are in */
        tc_rows_ready(&rows, t0, s);
        __syncthreads();
        tc_scores<HS>(p, ka, qs);
        const int full = tc_tile_full(s, t0, tile * TC_ROWS);
#pragma unroll
        for (int jj = 0; jj < 8; jj++)
            for (int i = 0; i < 4; i++) {
                const int col = 8 * jj + 2 * c + i % 2, r = i / 2;
                const int ok =
                    full || (kvalid[r] && kp[r] <= rows.qp[col] && kp[r] >= rows.first[col]);
                const float pr = ok ? exp2f(p[jj][i] * sl2 - rows.L[col]) : 0.0f;
                p[jj][i] = pr;
                dp[jj][i] = pr * (dp[jj][i] - rows.D[col]);
            }
        tc_accumulate<HS>(dv, p, dos);
        __syncthreads(); /* dos is consumed */
        if (j + 1 < walk)
            tc_stage_query<HS>(dos, &rows, 0, j + 1, nt, tstart, b, kvg, q16, dout16, Dbuf, lse, s);
        mma_cp_commit();
        tc_accumulate<HS>(dk, dp, qs);
        __syncthreads(); /* qs and the rows are consumed */
        if (j + 1 < walk)
            tc_stage_query<HS>(qs, &rows, 1, j + 1, nt, tstart, b, kvg, q16, dout16, Dbuf, lse, s);
        mma_cp_commit();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!kvalid[r])
            continue;
        float *row = dkv + kbase + (size_t)(r0 + g + 8 * r) * s.kvw;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            for (int e = 0; e < 2; e++) {
                grad_put(row + 8 * n + 2 * c + e, s.scale * dk[n][2 * r + e], s.set);
                grad_put(row + HS + 8 * n + 2 * c + e, dv[n][2 * r + e], s.set);
            }
    }
}

/* The grid: one block per (b, head, tile), within gridDim.x's limit. */
static unsigned tc_blocks(int B, int heads, int tiles)
{
    size_t n = (size_t)B * (size_t)heads * (size_t)tiles;
    TRD_ASSERT(n <= 0x7fffffffu);
    return (unsigned)n;
}

int cuda_attention_tc_serves(const AttnArgs *a) { return a->hs == 64 || a->hs == 128; }

/* The 16-byte loads of tc_convert_kernel: q and kv start on 16 bytes
 * (device allocations and whole rows of them always do; a row stride is a
 * multiple of hs floats), else the fp32 kernels serve the call. */
static int tc_aligned(const void *q, const void *kv)
{
    return ((uintptr_t)q | (uintptr_t)kv) % 16 == 0;
}

/* tc_convert_kernel over q (when q16) and kv's heads: one launch. */
template <int HS>
static void tc_convert(uint16_t *q16, uint16_t *kv16, const float *q, const float *kv,
                       const AttnArgs *a, const Shape &s)
{
    const size_t nq4 = q16 ? (size_t)a->B * a->Tq * a->H * HS / 4 : 0;
    const size_t n4 = nq4 + (size_t)a->B * a->Tk * a->KVH * 2 * HS / 4;
    PROFILE_PART("tc_convert", 24.0 * (double)n4, 0, {
        tc_convert_kernel<HS>
            <<<cuda_blocks(n4), CUDA_THREADS, 0, cuda_stream()>>>(q16, kv16, q, kv, nq4, n4, s);
        CUDA_CHECK_LAUNCH();
    });
}

/* The bytes of the bf16 copies of kv's heads and of q's (or dout's) */
static size_t tc_kv16_bytes(const AttnArgs *a)
{
    return (size_t)a->B * a->Tk * a->KVH * 2 * a->hs * sizeof(uint16_t);
}

static size_t tc_q16_bytes(const AttnArgs *a)
{
    return (size_t)a->B * a->Tq * a->H * a->hs * sizeof(uint16_t);
}

template <int HS>
static void tc_forward(float *out, float *lse, const float *q, const float *kv, const AttnArgs *a,
                       const Shape &s)
{
    uint16_t *kv16 = (uint16_t *)cuda_scratch(CUDA_SCRATCH_ATTN, tc_kv16_bytes(a));
    tc_convert<HS>(NULL, kv16, q, kv, a, s);
    PROFILE_PART("tc_forward", 0, 0, {
        attention_tc_forward_kernel<HS>
            <<<tc_blocks(a->B, a->H, s.qtiles), TC_BLOCK, 0, cuda_stream()>>>(out, lse, q, kv16, s);
        CUDA_CHECK_LAUNCH();
    });
}

/* The backward's scratch: kv16, q16, dout16 (multiples of 16 bytes: hs
 * bf16 a head), then D (a float a row). */
template <int HS>
static void tc_backward(float *dq, float *dkv, const float *dout, const float *q, const float *kv,
                        const float *out, const float *lse, const AttnArgs *a, const Shape &s)
{
    const size_t rows = (size_t)a->B * a->Tq * a->H, kvb = tc_kv16_bytes(a), qb = tc_q16_bytes(a);
    char *scratch = (char *)cuda_scratch(CUDA_SCRATCH_ATTN, kvb + 2 * qb + rows * sizeof(float));
    uint16_t *kv16 = (uint16_t *)scratch, *q16 = (uint16_t *)(scratch + kvb),
             *dout16 = (uint16_t *)(scratch + kvb + qb);
    float *D = (float *)(scratch + kvb + 2 * qb);
    tc_convert<HS>(q16, kv16, q, kv, a, s);
    PROFILE_PART("tc_delta", (double)rows * HS * 10 + 4.0 * (double)rows, 0, {
        attention_tc_delta_kernel<HS>
            <<<(unsigned)((rows * 32 + CUDA_THREADS - 1) / CUDA_THREADS), CUDA_THREADS, 0,
               cuda_stream()>>>(D, dout16, dout, out, a->B, s);
        CUDA_CHECK_LAUNCH();
    });
    PROFILE_PART("tc_dq", 0, 0, {
        attention_tc_dq_kernel<HS><<<tc_blocks(a->B, a->H, s.qtiles), TC_BLOCK, 0, cuda_stream()>>>(
            dq, dout, q, kv16, D, lse, s);
        CUDA_CHECK_LAUNCH();
    });
    PROFILE_PART("tc_dkv", 0, 0, {
        attention_tc_dkv_kernel<HS>
            <<<tc_blocks(a->B, a->KVH, s.ktiles), TC_BLOCK, 0, cuda_stream()>>>(dkv, kv, q16,
                                                                                dout16, D, lse, s);
        CUDA_CHECK_LAUNCH();
    });
}

void cuda_attention_forward_bf16(float *out, float *lse, const float *q, const float *kv,
                                 const AttnArgs *a)
{
    if (cuda_attention_cudnn_forward(out, lse, q, kv, a))
        return; /* cuDNN took it (attention_cudnn.cu) */
    if (!cuda_attention_tc_serves(a) || !tc_aligned(q, kv)) {
        cuda_attention_forward(out, lse, q, kv, a);
        return;
    }
    attn_check_args(a);
    if (a->B <= 0 || a->Tq <= 0 || a->H <= 0)
        return;
    const Shape s = attn_shape(a, TC_ROWS);
    if (a->hs == 64)
        tc_forward<64>(out, lse, q, kv, a, s);
    else
        tc_forward<128>(out, lse, q, kv, a, s);
}

void cuda_attention_backward_bf16(float *dq, float *dkv, const float *dout, const float *q,
                                  const float *kv, const float *out, const float *lse,
                                  const AttnArgs *a)
{
    if (cuda_attention_cudnn_backward(dq, dkv, dout, q, kv, out, lse, a))
        return; /* cuDNN took it (attention_cudnn.cu) */
    if (!cuda_attention_tc_serves(a) || !tc_aligned(q, kv)) {
        cuda_attention_backward(dq, dkv, dout, q, kv, out, lse, a);
        return;
    }
    attn_check_args(a);
    TRD_ASSERT(a->grad != GRAD_SET || a->Tk > 0);
    if (a->B <= 0 || a->Tq <= 0 || a->Tk <= 0 || a->H <= 0)
        return;
    const Shape s = attn_shape(a, TC_ROWS);
    if (a->hs == 64)
        tc_backward<64>(dq, dkv, dout, q, kv, out, lse, a, s);
    else
        tc_backward<128>(dq, dkv, dout, q, kv, out, lse, a, s);
}
