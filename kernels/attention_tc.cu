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
 * v and dout are rounded to bf16 where they are loaded; the scores
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
 * ldmatrix.trans gives it (mma.cuh). */
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

/* Rows r0 .. r0+63 of a head (fp32, the row at head + row * ld) rounded to
 * bf16 into sh (16-byte aligned: the fragment loads read 32 bits), zeros
 * for rows outside [0, n).  The padding of 8 bf16
 * puts consecutive rows 4 banks apart: the 8 rows x 4 pairs of a fragment
 * load land in 32 different banks.  Each thread issues its loads in
 * batches of TC_BATCH before it stores any: a store to shared memory
 * between two global loads would keep the second waiting for the first
 * (one memory latency per pair; the backward kernels, at two blocks a
 * multiprocessor, had little else to hide it behind).  A load takes four
 * floats: the head and the row stride are 16-byte aligned (tc_aligned). */
enum { TC_BATCH = 8 };
struct alignas(16) TcQuad { /* four floats in one 16-byte load */
    float x, y, z, w;
};
template <int HS>
__device__ inline void tc_stage(uint16_t (*sh)[HS + TC_PAD], const float *head, size_t ld, int r0,
                                int n)
{
    constexpr int PER = TC_ROWS * HS / 4 / TC_BLOCK; /* quads a thread */
    static_assert(PER % TC_BATCH == 0, "a thread's quads come in whole batches");
#pragma unroll
    for (int k0 = 0; k0 < PER; k0 += TC_BATCH) {
        TcQuad v[TC_BATCH];
#pragma unroll
        for (int k = 0; k < TC_BATCH; k++) {
            const int i = threadIdx.x + (k0 + k) * TC_BLOCK, row = r0 + i / (HS / 4);
            const int in = row >= 0 && row < n;
            v[k] = in ? *(const TcQuad *)(head + (size_t)row * ld + i % (HS / 4) * 4)
                      : TcQuad{0.0f, 0.0f, 0.0f, 0.0f};
        }
#pragma unroll
        for (int k = 0; k < TC_BATCH; k++) {
            const int i = threadIdx.x + (k0 + k) * TC_BLOCK;
            uint16_t *dst = &sh[i / (HS / 4)][i % (HS / 4) * 4];
            mma_st2(dst, mma_pack(v[k].x, v[k].y));
            mma_st2(dst + 2, mma_pack(v[k].z, v[k].w));
        }
    }
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
    attention_tc_forward_kernel(float *out, float *lse, const float *qkv, const float *kv, Shape s)
{
    __shared__ __align__(16) uint16_t ks[TC_ROWS][HS + TC_PAD], vs[TC_ROWS][HS + TC_PAD];
    int b, h, tile;
    block_coords(s.qtiles, s.H, 1, &b, &h, &tile);
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int r0 = tile * TC_ROWS + threadIdx.x / 32 * 16;
    const float *kh = kv + (size_t)b * s.Tk * s.kvw + kv_k_off(h / s.Q, s);

    uint32_t qa[HS / 16][4];
    tc_load_a<HS>(qa, qkv + (size_t)b * s.Tq * s.width + q_off(h, s.Q, HS), s.width, r0, s.Tq);
    int u0[2], u1[2], lo, hi;
    tc_row_keys(s, b, r0, u0, u1);
    tc_tile_keys(u0, u1, &lo, &hi);

    const float sl2 = s.scale * TC_LOG2E;
    float o[HS / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int k0 = lo; k0 < hi; k0 += TC_ROWS) {
        __syncthreads(); /* the previous tile is consumed */
        tc_stage<HS>(ks, kh, s.kvw, k0, s.Tk);
        tc_stage<HS>(vs, kh + HS, s.kvw, k0, s.Tk);
        __syncthreads();
        float p[8][4], mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f}, alpha[2];
        tc_scores<HS>(p, qa, ks);
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
 * kernel used to take it again for every key tile, with one thread a row). */
template <int HS>
__global__ void attention_tc_delta_kernel(float *D, const float *dout, const float *out, int B,
                                          Shape s)
{
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32, valid = row < (size_t)B * s.Tq * s.H;
    const int h = (int)(row % s.H), t = (int)(row / s.H % s.Tq), b = (int)(row / s.H / s.Tq);
    float part = 0;
    if (valid) {
        const float *d = dout + row * HS, *o = out + row * HS;
#pragma unroll
        for (int i = lane; i < HS; i += 32)
            part += bf16r(d[i]) * o[i];
    }
    part = warp_sum(part); /* every lane of the block (the emulation's shuffle is a barrier) */
    if (lane == 0 && valid)
        D[((size_t)b * s.H + h) * s.Tq + t] = part;
}

/* dq[t] += scale * sum_u dS[t,u] k_u, dS = P (dP - D_t), for the rows of
 * one query tile of head h. */
template <int HS>
__global__ void __launch_bounds__(TC_BLOCK)
    attention_tc_dq_kernel(float *dq_buf, const float *dout, const float *qkv, const float *kv,
                           const float *Dbuf, const float *lse, Shape s)
{
    __shared__ __align__(16) uint16_t ks[TC_ROWS][HS + TC_PAD], vs[TC_ROWS][HS + TC_PAD];
    int b, h, tile;
    block_coords(s.qtiles, s.H, 1, &b, &h, &tile);
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4, ow = s.H * HS;
    const int r0 = tile * TC_ROWS + threadIdx.x / 32 * 16;
    const float *kh = kv + (size_t)b * s.Tk * s.kvw + kv_k_off(h / s.Q, s);
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
    for (int k0 = lo; k0 < hi; k0 += TC_ROWS) {
        __syncthreads();
        tc_stage<HS>(ks, kh, s.kvw, k0, s.Tk);
        tc_stage<HS>(vs, kh + HS, s.kvw, k0, s.Tk);
        __syncthreads();
        float p[8][4], dp[8][4];
        tc_scores<HS>(p, qa, ks);
        tc_scores<HS>(dp, da, vs);
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

/* For the keys of one key tile of kv group kvg, summed over the group's
 * query heads and the query rows that see them:
 *   dk_u += scale * sum_t dS[t,u] q_t;  dv_u += sum_t P[t,u] dout_t
 * Query rows before the tile's first key position never see it (causal),
 * so the walk starts at the first that can. */
template <int HS>
__global__ void __launch_bounds__(TC_BLOCK)
    attention_tc_dkv_kernel(float *dkv, const float *dout, const float *qkv, const float *kv,
                            const float *Dbuf, const float *lse, Shape s)
{
    __shared__ __align__(16) uint16_t qs[TC_ROWS][HS + TC_PAD], dos[TC_ROWS][HS + TC_PAD];
    __shared__ float Ls[TC_ROWS], Ds[TC_ROWS];
    __shared__ int First[TC_ROWS],
        Qp[TC_ROWS]; /* per staged query row: first key position seen, own */
    int b, kvg, tile;
    block_coords(s.ktiles, s.KVH, 0, &b, &kvg, &tile);
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4, ow = s.H * HS;
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
    for (int h = kvg * s.Q; h < (kvg + 1) * s.Q; h++) {
        const size_t qbase = (size_t)b * s.Tq * s.width + q_off(h, s.Q, HS);
        const size_t obase = (size_t)b * s.Tq * ow + (size_t)h * HS;
        for (int t0 = tstart; t0 < s.Tq; t0 += TC_ROWS) {
            __syncthreads(); /* the previous tile is consumed */
            tc_stage<HS>(qs, qkv + qbase, s.width, t0, s.Tq);
            tc_stage<HS>(dos, dout + obase, ow, t0, s.Tq);
            if (threadIdx.x < TC_ROWS) {
                const int t = t0 + threadIdx.x, has = t < s.Tq, qp = s.q_pos0 + t;
                const size_t i = ((size_t)b * s.H + h) * s.Tq + t;
                Ds[threadIdx.x] = has ? Dbuf[i] : 0.0f;
                Ls[threadIdx.x] = has ? lse[i] * TC_LOG2E : 0.0f;
                Qp[threadIdx.x] = has ? qp : -1; /* a missing row sees no key */
                First[threadIdx.x] = has && s.pos ? qp - s.pos[(size_t)b * s.Tq + t] : 0;
            }
            __syncthreads();
            float p[8][4], dp[8][4];
            tc_scores<HS>(p, ka, qs);
            tc_scores<HS>(dp, va, dos);
            const int full = tc_tile_full(s, t0, tile * TC_ROWS);
#pragma unroll
            for (int j = 0; j < 8; j++)
                for (int i = 0; i < 4; i++) {
                    const int col = 8 * j + 2 * c + i % 2, r = i / 2;
                    const int ok = full || (kvalid[r] && kp[r] <= Qp[col] && kp[r] >= First[col]);
                    const float pr = ok ? exp2f(p[j][i] * sl2 - Ls[col]) : 0.0f;
                    p[j][i] = pr;
                    dp[j][i] = pr * (dp[j][i] - Ds[col]);
                }
            tc_accumulate<HS>(dv, p, dos);
            tc_accumulate<HS>(dk, dp, qs);
        }
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

/* The 16-byte loads of tc_stage: every staged buffer starts on 16 bytes
 * (device allocations and whole rows of them always do; a row stride is a
 * multiple of hs floats), else the fp32 kernels serve the call. */
static int tc_aligned(const void *a, const void *b, const void *c)
{
    return ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

template <int HS>
static void tc_forward(float *out, float *lse, const float *q, const float *kv, const AttnArgs *a,
                       const Shape &s)
{
    attention_tc_forward_kernel<HS>
        <<<tc_blocks(a->B, a->H, s.qtiles), TC_BLOCK, 0, cuda_stream()>>>(out, lse, q, kv, s);
    CUDA_CHECK_LAUNCH();
}

template <int HS>
static void tc_backward(float *dq, float *dkv, const float *dout, const float *q, const float *kv,
                        const float *out, const float *lse, const AttnArgs *a, const Shape &s)
{
    const size_t rows = (size_t)a->B * a->Tq * a->H;
    float *D = (float *)cuda_scratch(CUDA_SCRATCH_ATTN, rows * sizeof(float));
    attention_tc_delta_kernel<HS><<<(unsigned)((rows * 32 + CUDA_THREADS - 1) / CUDA_THREADS),
                                    CUDA_THREADS, 0, cuda_stream()>>>(D, dout, out, a->B, s);
    CUDA_CHECK_LAUNCH();
    attention_tc_dq_kernel<HS><<<tc_blocks(a->B, a->H, s.qtiles), TC_BLOCK, 0, cuda_stream()>>>(
        dq, dout, q, kv, D, lse, s);
    CUDA_CHECK_LAUNCH();
    attention_tc_dkv_kernel<HS><<<tc_blocks(a->B, a->KVH, s.ktiles), TC_BLOCK, 0, cuda_stream()>>>(
        dkv, dout, q, kv, D, lse, s);
    CUDA_CHECK_LAUNCH();
}

void cuda_attention_forward_bf16(float *out, float *lse, const float *q, const float *kv,
                                 const AttnArgs *a)
{
    if (cuda_attention_cudnn_forward(out, lse, q, kv, a))
        return; /* cuDNN took it (attention_cudnn.cu) */
    if (!cuda_attention_tc_serves(a) || !tc_aligned(q, kv, q)) {
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
    if (!cuda_attention_tc_serves(a) || !tc_aligned(q, kv, dout)) {
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
