/* decode.cu — generation with a key/value cache (backend.h, "decoding"):
 * attention of a few new rows against the cache, and the next token chosen
 * on the device.  The position comes from device memory when the caller
 * says so (at): a captured step (docs/cuda.md, "Decoding") keeps the same
 * arguments from token to token.
 *
 * attention_decode: the positions of one (new row, head) spread over
 * many threads (flash-decoding).  A block of DEC_WARPS warps takes one
 * split, a contiguous chunk of the positions; within it a lane group of
 * G lanes (4 channels a lane, G = 16 at head size 64, 32 at 128) takes
 * every (128 / G)-th position, DEC_UNROLL of them loaded before the first
 * is used, and keeps an online softmax (running max m, sum l, output).
 * The lane groups merge by shuffles, the warps in shared memory in warp
 * order.  One split: the block writes the row.  Several: each writes its
 * (m, l, output) partial to a scratch, and the last split of the (row,
 * head) to finish (an atomic count) adds up all of them in split order.
 * The splits a call launches depend on n H alone (DEC_TARGET blocks, at
 * most DEC_SPLITS_MAX); those in use on the length, read in the kernel
 * (at least DEC_MIN_CHUNK positions each; the others return at once).
 * Every sum runs in a fixed order: the same inputs give the same bits.
 * Head size up to 128.
 *
 * decode_linear, up to GEMV_ROWS rows: a GEMV, S warps (1, 2, 4 or 8)
 * per output column o, 8 warps a block.  The S warps stream w's row o once
 * as one row of 32 S lanes (16-byte loads, coalesced: lane l reads floats
 * 4l .. 4l+3 of each 128 S in turn, or one float a lane where C or a
 * pointer does not allow them) against each input row, GEMV_UNROLL loads
 * a lane issued before any is used, each warp sums its lanes (warp_sum),
 * and the column's first warp adds the S sums in order from shared
 * memory, then the bias and the epilogue.  S is the fewest warps that put
 * GEMV_GRID_WARPS warps in the grid (gemv_split): at GPT-2 124M's 768
 * outputs one warp a column gave 96 blocks for 132 SMs and ~16 KB of loads
 * in flight an SM where HBM wants ~32-64 KB.  One launch for what cuBLAS
 * does in two (the bias broadcast, then the GEMM with beta 1) plus the
 * GELU or the residual add after it.  At one row the op is the read of w
 * (4 C OC bytes), so bandwidth-bound; the sums run in another order than
 * cuBLAS's (within fp32 rounding of them), the same order every run.
 * More rows: cuBLAS, where the weights are read once for all of them.
 * With a norm (LayerNorm or RMSNorm before the linear), every block
 * computes the statistics of the n input rows itself (block sums over C
 * floats, from L2: a few KB against the block's C * 8 / S * 4 bytes of
 * weights, while its first weight loads are in flight) and each warp
 * norms the input elements as it reads them, so the norm's kernel and its
 * output's round trip leave the step. */
#include "ops.cuh"

enum {
    DEC_HS_MAX = 128,
    DEC_PART = DEC_HS_MAX + 2, /* a partial: the channels, m and l */
    DEC_WARPS = 4,
    DEC_THREADS = 32 * DEC_WARPS,
    DEC_UNROLL = 4,     /* positions a lane group loads before using them */
    DEC_MIN_CHUNK = 32, /* positions a split takes at the least */
    DEC_SPLITS_MAX = 32,
    DEC_TARGET = 512 /* blocks the splits aim at: ~4 per SM of an H100 / H200 */
};

/* The caches are [position][KVH][hs]; qkv rows in the fused layout. */
__global__ void cache_append_kernel(float *kcache, float *vcache, const float *qkv, int n,
                                    const int32_t *at, int pos0, int H, int KVH, int hs)
{
    if (at)
        pos0 = *at;
    const int Q = H / KVH, width = (H + 2 * KVH) * hs;
    const size_t total = (size_t)n * KVH * hs;
    GRID_STRIDE(idx, total)
    {
        const int i = (int)(idx % hs), g = (int)(idx / hs % KVH), t = (int)(idx / hs / KVH);
        const float *k = qkv + (size_t)t * width + ((size_t)g * (Q + 2) + Q) * hs;
        const size_t at = ((size_t)(pos0 + t) * KVH + g) * hs + i;
        kcache[at] = k[i];
        vcache[at] = k[hs + i];
    }
}

/* exp(x - M), and 0 for x = -inf: a lane group, warp or split that saw
 * no position (where exp(-inf - -inf) would be NaN) weighs nothing. */
__device__ inline float dec_weight(float x, float M) { return x == -INFINITY ? 0.0f : expf(x - M); }

/* A lane's running softmax over the positions it saw: the largest score m,
 * the sum l of exp(score - m) and the output channels acc (unnormalized). */
struct DecState {
    float m, l;
    float4 acc;
};

__device__ inline DecState dec_merge(DecState a, DecState b)
{
    const float M = fmaxf(a.m, b.m), wa = dec_weight(a.m, M), wb = dec_weight(b.m, M);
    return {M,
            a.l * wa + b.l * wb,
            {a.acc.x * wa + b.acc.x * wb, a.acc.y * wa + b.acc.y * wb, a.acc.z * wa + b.acc.z * wb,
             a.acc.w * wa + b.acc.w * wb}};
}

/* Channels c .. c+3 of a cached row (p: the row's channel c), zeros past
 * hs: one 16-byte load, or four where hs or the cache is not aligned. */
template <bool VEC> __device__ inline float4 dec_load(const float *p, int c, int hs)
{
    if (VEC)
        return c < hs ? *(const float4 *)p : float4{0.0f, 0.0f, 0.0f, 0.0f};
    return float4{c < hs ? p[0] : 0.0f, c + 1 < hs ? p[1] : 0.0f, c + 2 < hs ? p[2] : 0.0f,
                  c + 3 < hs ? p[3] : 0.0f};
}

/* Block rh * splits + s, rh = t * H + h: split s of the cache positions
 * 0 .. pos0 + t that row t's query head h sees (plan above). */
template <bool VEC>
__global__ void __launch_bounds__(DEC_THREADS)
    attention_decode_kernel(float *out, const float *qkv, const float *kcache, const float *vcache,
                            const int32_t *at, int pos0, int H, int KVH, int hs, int G, int splits,
                            int32_t *count, float *part)
{
    if (at)
        pos0 = *at;
    const int s = (int)(blockIdx.x % (unsigned)splits), rh = (int)(blockIdx.x / (unsigned)splits);
    const int h = rh % H, t = rh / H, len = pos0 + t + 1;
    /* the splits in use at this length: at least DEC_MIN_CHUNK positions
     * each (the last may hold fewer, or none) */
    const int want = (len + DEC_MIN_CHUNK - 1) / DEC_MIN_CHUNK,
              active = want < splits ? want : splits;
    if (s >= active)
        return;
    const int chunk = (len + active - 1) / active, lo = s * chunk,
              hi = lo + chunk < len ? lo + chunk : len;
    const int NG = DEC_THREADS / G, grp = (int)threadIdx.x / G, c = 4 * ((int)threadIdx.x % G);
    const int steps = hi > lo ? (hi - lo + NG * DEC_UNROLL - 1) / (NG * DEC_UNROLL) : 0;
    const int Q = H / KVH, g = h / Q, width = (H + 2 * KVH) * hs;
    const float *q = qkv + (size_t)t * width + ((size_t)g * (Q + 2) + h % Q) * hs + c;
    const float4 qr = dec_load<false>(q, c, hs);
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t stride = (size_t)KVH * hs;
    const float *kb = kcache + (size_t)g * hs + c, *vb = vcache + (size_t)g * hs + c;
    DecState st = {-INFINITY, 0.0f, float4{0.0f, 0.0f, 0.0f, 0.0f}};
    for (int it = 0; it < steps; it++) {
        /* DEC_UNROLL positions' loads in flight before the first is used */
        float4 kr[DEC_UNROLL], vr[DEC_UNROLL];
        int u[DEC_UNROLL];
#pragma unroll
        for (int j = 0; j < DEC_UNROLL; j++) {
            u[j] = lo + (it * DEC_UNROLL + j) * NG + grp;
            const float4 zero = float4{0.0f, 0.0f, 0.0f, 0.0f};
            kr[j] = u[j] < hi ? dec_load<VEC>(kb + (size_t)u[j] * stride, c, hs) : zero;
            vr[j] = u[j] < hi ? dec_load<VEC>(vb + (size_t)u[j] * stride, c, hs) : zero;
        }
        float sc[DEC_UNROLL], mx = st.m;
#pragma unroll
        for (int j = 0; j < DEC_UNROLL; j++) {
            const float d = qr.x * kr[j].x + qr.y * kr[j].y + qr.z * kr[j].z + qr.w * kr[j].w;
            sc[j] = lane_group_sum(d, G) * scale;
            if (u[j] >= hi)
                sc[j] = -INFINITY;
            mx = fmaxf(mx, sc[j]);
        }
        const float corr = dec_weight(st.m, mx);
        st.l *= corr;
        st.acc = float4{st.acc.x * corr, st.acc.y * corr, st.acc.z * corr, st.acc.w * corr};
#pragma unroll
        for (int j = 0; j < DEC_UNROLL; j++) {
            const float p = dec_weight(sc[j], mx);
            st.l += p;
            st.acc.x += p * vr[j].x, st.acc.y += p * vr[j].y;
            st.acc.z += p * vr[j].z, st.acc.w += p * vr[j].w;
        }
        st.m = mx;
    }
    /* the warp's lane groups into its first (lanes 0 .. G - 1) */
    for (int o = G; o < 32; o <<= 1) {
        const DecState other = {__shfl_xor_sync(0xffffffffu, st.m, o),
                                __shfl_xor_sync(0xffffffffu, st.l, o),
                                float4{__shfl_xor_sync(0xffffffffu, st.acc.x, o),
                                       __shfl_xor_sync(0xffffffffu, st.acc.y, o),
                                       __shfl_xor_sync(0xffffffffu, st.acc.z, o),
                                       __shfl_xor_sync(0xffffffffu, st.acc.w, o)}};
        st = dec_merge(st, other);
    }
    /* the warps, in order, by thread x for channel x */
    __shared__ float wsum[DEC_WARPS][DEC_PART];
    const int x = (int)threadIdx.x, lane = x % 32, warp = x / 32;
    if (lane < G) {
        const float a[4] = {st.acc.x, st.acc.y, st.acc.z, st.acc.w};
        for (int i = 0; i < 4 && c + i < hs; i++)
            wsum[warp][c + i] = a[i];
        if (lane == 0)
            wsum[warp][DEC_HS_MAX] = st.m, wsum[warp][DEC_HS_MAX + 1] = st.l;
    }
    __syncthreads();
    float M = -INFINITY, L = 0.0f, A = 0.0f;
    for (int w = 0; w < DEC_WARPS; w++)
        M = fmaxf(M, wsum[w][DEC_HS_MAX]);
    for (int w = 0; w < DEC_WARPS; w++) {
        const float wt = dec_weight(wsum[w][DEC_HS_MAX], M);
        L += wsum[w][DEC_HS_MAX + 1] * wt;
        if (x < hs)
            A += wsum[w][x] * wt;
    }
    float *o = out + (size_t)rh * hs;
    if (active == 1) {
        if (x < hs)
            o[x] = A / L;
        return;
    }
    /* the split's partial, then the last split of (t, h) to finish adds
     * all of them up in split order */
    float *mine = part + ((size_t)rh * splits + s) * (hs + 2);
    if (x < hs)
        mine[x] = A;
    if (x == 0)
        mine[hs] = M, mine[hs + 1] = L;
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (x == 0) {
        last = atomicAdd(count + rh, 1) == active - 1;
        __threadfence();
    }
    __syncthreads();
    if (!last)
        return;
    const float *all = part + (size_t)rh * splits * (hs + 2);
    M = -INFINITY, L = 0.0f, A = 0.0f;
    for (int i = 0; i < active; i++)
        M = fmaxf(M, __ldcg(all + (size_t)i * (hs + 2) + hs));
    for (int i = 0; i < active; i++) {
        const float *pi = all + (size_t)i * (hs + 2);
        const float wt = dec_weight(__ldcg(pi + hs), M);
        L += __ldcg(pi + hs + 1) * wt;
        if (x < hs)
            A += __ldcg(pi + x) * wt;
    }
    if (x < hs)
        o[x] = A / L;
    if (x == 0)
        count[rh] = 0; /* for the next call */
}

/* The splits' partials [n H][splits][hs + 2] and a count of finished
 * splits per (row, head), sized for the most any call needs (n H <
 * DEC_TARGET where splits > 1, and n H splits < DEC_TARGET + n H): one
 * size, so the scratch is made once, by the first call (the eager step
 * before a decode graph's capture), and never moves under a graph.  The
 * counts start at 0 and each call leaves them at 0. */
static void dec_scratch(int32_t **count, float **part)
{
    const size_t cbytes = DEC_TARGET * sizeof(int32_t);
    const size_t pbytes = (size_t)2 * DEC_TARGET * DEC_PART * sizeof(float);
    static char *buf;
    if (!buf) {
        buf = (char *)cuda_scratch(CUDA_SCRATCH_DECODE, cbytes + pbytes);
        CUDA_CHECK(cudaMemsetAsync(buf, 0, cbytes, cuda_stream()));
    }
    *count = (int32_t *)buf;
    *part = (float *)(buf + cbytes);
}

void cuda_attention_decode(float *out, const float *qkv, float *kcache, float *vcache, int n,
                           const int32_t *at, int pos0, int H, int KVH, int hs)
{
    TRD_ASSERT(KVH > 0 && H % KVH == 0 && pos0 >= 0);
    if (hs > DEC_HS_MAX)
        trd_fatal(TRD_EXIT_INPUT, "use a head size (model.hidden / model.heads) of at most 128",
                  "backend cuda: decoding supports head sizes up to %d, not %d", DEC_HS_MAX, hs);
    if (n <= 0)
        return;
    cache_append_kernel<<<cuda_blocks((size_t)n * KVH * hs), CUDA_THREADS, 0, cuda_stream()>>>(
        kcache, vcache, qkv, n, at, pos0, H, KVH, hs);
    CUDA_CHECK_LAUNCH();
    /* splits: a fixed function of n H (not of the length, which a graph's
     * replay reads from device memory, nor of the device), so the same
     * call gives the same bits everywhere */
    const int rows = n * H;
    const int splits = rows >= DEC_TARGET ? 1
                       : (DEC_TARGET + rows - 1) / rows < DEC_SPLITS_MAX
                           ? (DEC_TARGET + rows - 1) / rows
                           : DEC_SPLITS_MAX;
    int32_t *count = NULL;
    float *part = NULL;
    if (splits > 1)
        dec_scratch(&count, &part);
    int G = 1; /* lanes a position: 4 channels a lane */
    while (4 * G < hs)
        G *= 2;
    const unsigned blocks = (unsigned)rows * (unsigned)splits;
    if (hs % 4 == 0 && ((uintptr_t)kcache | (uintptr_t)vcache) % 16 == 0)
        attention_decode_kernel<true><<<blocks, DEC_THREADS, 0, cuda_stream()>>>(
            out, qkv, kcache, vcache, at, pos0, H, KVH, hs, G, splits, count, part);
    else
        attention_decode_kernel<false><<<blocks, DEC_THREADS, 0, cuda_stream()>>>(
            out, qkv, kcache, vcache, at, pos0, H, KVH, hs, G, splits, count, part);
    CUDA_CHECK_LAUNCH();
}

enum { CHOOSE_THREADS = 1024 };

/* The first token of the block's candidates: each thread offers one
 * (V: none), the smallest wins.  Ids are below 2^24, exact in a float. */
__device__ static int block_first(int v, int V) { return -(int)block_max(-(float)(v < V ? v : V)); }

/* One block (backend.h, decode_choose).  The argmax: each thread's first
 * maximum over its strided tokens, then the block's largest value and the
 * first token holding it.  The draw: thread t sums the weights of its
 * contiguous chunk in order; thread 0 adds the chunks up in order (the
 * chunk offsets); each thread walks its chunk from its offset, and the
 * first token whose running sum passes u * sum wins (V - 1 if none). */
__global__ void decode_choose_kernel(int32_t *state, const float *logits, int V, double temperature,
                                     const double *u, int n)
{
    __shared__ double off[CHOOSE_THREADS + 1];
    const int t = threadIdx.x, B = blockDim.x;
    int mine = V;
    for (int v = t; v < V; v += B)
        if (mine == V || logits[v] > logits[mine])
            mine = v;
    const float top = block_max(mine < V ? logits[mine] : -INFINITY);
    int next = block_first(mine < V && logits[mine] == top ? mine : V, V);
    if (temperature > 0) {
        const double mx = logits[next];
        const int chunk = (V + B - 1) / B, lo = t * chunk < V ? t * chunk : V;
        const int hi = lo + chunk < V ? lo + chunk : V;
        double part = 0;
        for (int v = lo; v < hi; v++)
            part += (float)exp((logits[v] - mx) / temperature);
        off[t + 1] = part;
        __syncthreads();
        if (t == 0) {
            off[0] = 0;
            for (int i = 1; i <= B; i++)
                off[i] += off[i - 1];
        }
        __syncthreads();
        const double target = u[state[0] + n] * off[B];
        double acc = off[t];
        int hit = V;
        for (int v = lo; v < hi && hit == V; v++) {
            acc += (float)exp((logits[v] - mx) / temperature);
            if (target < acc)
                hit = v;
        }
        next = block_first(hit, V);
        if (next == V)
            next = V - 1;
    }
    __syncthreads(); /* every thread has read state[0] */
    if (t == 0) {
        state[1] = next;
        state[0] += n;
    }
}

void cuda_decode_choose(int32_t *state, const float *logits, int V, double temperature,
                        const double *u, int n)
{
    TRD_ASSERT(V > 0 && V < (1 << 24));
    decode_choose_kernel<<<1, CHOOSE_THREADS, 0, cuda_stream()>>>(state, logits, V, temperature, u,
                                                                  n);
    CUDA_CHECK_LAUNCH();
}

enum { GEMV_ROWS = DECODE_GEMV_ROWS, GEMV_WARPS = 8, GEMV_UNROLL = 8, GEMV_GRID_WARPS = 2048 };
/* Blocks an SM the registers allow (__launch_bounds__: at most 85 a
 * thread; ptxas gives the 16-byte kernels 80): 24 warps an SM, so that
 * GEMV_GRID_WARPS and GPT-2 124M's grids (up to 384 blocks) run in one
 * wave on 132 SMs, where unbounded (up to 104) allowed 2. */
enum { GEMV_BLOCKS_SM = 3 };
enum { NORM_NONE, NORM_LAYER, NORM_RMS };

/* The statistics of the block's input rows for decode_linear's norm,
 * computed by every block (n rows of C floats, read from L2), as norm.cu
 * does: LayerNorm's mean, then the mean square of x - mean; RMSNorm's mean
 * square.  Every thread of the block takes part and gets them. */
template <int NORM>
__device__ void gemv_norm_stats(float *mu, float *rs, const float *x, int n, int C, float eps)
{
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) { /* unrolled: mu and rs stay in registers */
        if (r >= n)
            break;
        const float *xr = x + (size_t)r * C;
        float s = 0.0f;
        mu[r] = 0.0f;
        if (NORM == NORM_LAYER) {
            for (int c = threadIdx.x; c < C; c += blockDim.x)
                s += xr[c];
            mu[r] = block_sum(s) / C;
            s = 0.0f;
        }
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            s += (xr[c] - mu[r]) * (xr[c] - mu[r]);
        rs[r] = 1 / sqrtf(block_sum(s) / C + eps);
    }
}

/* One input element normed (norm.cu's expressions: (x - mean) * rstd * w
 * + b, x * rstd * w), or four. */
template <int NORM> __device__ inline float gemv_norm(float v, float g, float b, float mu, float rs)
{
    return NORM == NORM_RMS ? v * rs * g : (v - mu) * rs * g + b;
}

template <int NORM>
__device__ inline float4 gemv_norm(float4 v, float4 g, float4 b, float mu, float rs)
{
    v.x = gemv_norm<NORM>(v.x, g.x, b.x, mu, rs);
    v.y = gemv_norm<NORM>(v.y, g.y, b.y, mu, rs);
    v.z = gemv_norm<NORM>(v.z, g.z, b.z, mu, rs);
    v.w = gemv_norm<NORM>(v.w, g.w, b.w, mu, rs);
    return v;
}

template <typename T> __device__ inline T gemv_zero() { return T{}; }
__device__ inline float gemv_dot(float w, float x) { return w * x; }
__device__ inline float gemv_dot(float4 w, float4 x)
{
    return w.x * x.x + w.y * x.y + w.z * x.z + w.w * x.w;
}

/* Element c (a float, or floats 4c .. 4c+3) of an input row x as the GEMV
 * reads it: x, or its norm with weight g and bias b (NULL: 0, exact). */
template <int NORM, typename T>
__device__ inline T gemv_in(const T *x, const T *g, const T *b, int c, float mu, float rs)
{
    if (NORM == NORM_NONE)
        return x[c];
    return gemv_norm<NORM>(x[c], g[c], b ? b[c] : gemv_zero<T>(), mu, rs);
}

/* A lane's U weight loads of a chunk, c = at + u * step, all issued
 * before any is used (zeros past W) */
template <int U, typename T>
__device__ inline void gemv_load(T *wv, const T *wo, int at, int step, int W)
{
#pragma unroll
    for (int u = 0; u < U; u++)
        wv[u] = at + u * step < W ? wo[at + u * step] : gemv_zero<T>();
}

/* Block: GEMV_WARPS warps, S (1, 2, 4 or 8) a column: columns
 * blockIdx.x * GEMV_WARPS / S + warp / S.  The S warps of a column read
 * its C as one of 32 S lanes (lane k * 32 + l, k = warp % S), T a load
 * (float4: 16 bytes, or float), GEMV_UNROLL loads a lane in flight (GLU:
 * half of them from w, half from up), the first chunk's issued before the
 * norm's statistics.  Each warp sums its lanes (warp_sum), the column's
 * first warp adds the S sums in order from shared memory (lane r: row r),
 * then the bias and the epilogue: the same order every run.  Every warp
 * shuffles and reaches the barrier, those past OC on zeros. */
template <typename T, int NORM, int GLU>
__global__ void __launch_bounds__(32 * GEMV_WARPS, GEMV_BLOCKS_SM)
    decode_linear_kernel(float *out, const float *x, DecodeNorm nm, const float *w, const float *up,
                         const float *b, int n, int C, int OC, int S, DecodeEpi epi)
{
    enum { U = GLU ? GEMV_UNROLL / 2 : GEMV_UNROLL, M = GLU ? 2 : 1 };
    __shared__ float part[GEMV_WARPS][M][GEMV_ROWS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int o = (int)(blockIdx.x * (unsigned)(GEMV_WARPS / S)) + warp / S;
    const int per = (int)(sizeof(T) / sizeof(float)), at0 = warp % S * 32 + lane, step = 32 * S;
    const int W = o < OC ? C / per : 0; /* loads a row (none past OC) */
    const size_t row = (size_t)(o < OC ? o : 0) * C;
    const T *wo[M];
    T wv[M][U];
#pragma unroll
    for (int m = 0; m < M; m++) {
        wo[m] = (const T *)((m ? up : w) + row);
        gemv_load<U>(wv[m], wo[m], at0, step, W);
    }
    float mu[GEMV_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f}, rs[GEMV_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (NORM != NORM_NONE)
        gemv_norm_stats<NORM>(mu, rs, x, n, C, nm.eps);
    const T *g = (const T *)nm.w, *gb = (const T *)nm.b;
    float acc[M][GEMV_ROWS] = {};
    for (int at = at0; at < W; at += U * step) {
        if (at != at0) {
#pragma unroll
            for (int m = 0; m < M; m++)
                gemv_load<U>(wv[m], wo[m], at, step, W);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = at + u * step;
            if (c >= W)
                break;
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++)
                if (r < n) {
                    const T xv =
                        gemv_in<NORM>((const T *)(x + (size_t)r * C), g, gb, c, mu[r], rs[r]);
#pragma unroll
                    for (int m = 0; m < M; m++)
                        acc[m][r] += gemv_dot(wv[m][u], xv);
                }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) { /* unrolled: acc stays in registers */
        if (r >= n)
            break;
#pragma unroll
        for (int m = 0; m < M; m++) {
            const float s = warp_sum(acc[m][r]);
            if (lane == 0)
                part[warp][m][r] = s;
        }
    }
    __syncthreads();
    if (warp % S != 0 || lane >= n || o >= OC)
        return;
    const int r = lane;
    float p[M];
#pragma unroll
    for (int m = 0; m < M; m++) {
        p[m] = 0.0f;
        for (int k = 0; k < S; k++)
            p[m] += part[warp + k][m][r];
    }
    p[0] += b ? b[o] : 0.0f;
    float *y = out + (size_t)r * OC + o;
    if (GLU)
        *y = swiglu_value(p[0], p[M - 1]);
    else if (epi == DECODE_GELU)
        *y = gelu_value(p[0]);
    else if (epi == DECODE_RESIDUAL)
        *y += p[0];
    else
        *y = p[0];
}

/* Warps a column: the fewest for GEMV_GRID_WARPS warps in the grid (enough
 * loads in flight for HBM at 132 SMs: ~16 warps an SM, each up to
 * GEMV_UNROLL 16-byte loads a lane, ~64 KB an SM), while each warp keeps
 * two 16-byte loads a lane or more (C >= 256 S) */
static int gemv_split(int C, int OC)
{
    int S = 1;
    while (S < GEMV_WARPS && OC * S < GEMV_GRID_WARPS && C >= 256 * 2 * S)
        S *= 2;
    return S;
}

template <typename T, int GLU>
static void decode_linear_launch(float *out, const float *x, const DecodeNorm *norm, const float *w,
                                 const float *up, const float *b, int n, int C, int OC,
                                 DecodeEpi epi)
{
    const int S = gemv_split(C, OC), cols = GEMV_WARPS / S;
    const unsigned blocks = (unsigned)((OC + cols - 1) / cols);
    const DecodeNorm nm = norm ? *norm : DecodeNorm{NULL, NULL, 0.0f, 0};
    if (!norm)
        decode_linear_kernel<T, NORM_NONE, GLU>
            <<<blocks, 32 * GEMV_WARPS, 0, cuda_stream()>>>(out, x, nm, w, up, b, n, C, OC, S, epi);
    else if (norm->rms)
        decode_linear_kernel<T, NORM_RMS, GLU>
            <<<blocks, 32 * GEMV_WARPS, 0, cuda_stream()>>>(out, x, nm, w, up, b, n, C, OC, S, epi);
    else
        decode_linear_kernel<T, NORM_LAYER, GLU>
            <<<blocks, 32 * GEMV_WARPS, 0, cuda_stream()>>>(out, x, nm, w, up, b, n, C, OC, S, epi);
    CUDA_CHECK_LAUNCH();
}

void cuda_decode_linear(float *out, const float *x, const DecodeNorm *norm, const float *w,
                        const float *up, const float *b, int n, int C, int OC, DecodeEpi epi)
{
    const int glu = epi == DECODE_SWIGLU;
    if (n <= 0 || OC <= 0)
        return;
    TRD_ASSERT((!norm && !glu) || n <= DECODE_GEMV_ROWS);
    TRD_ASSERT(!glu == !up);
    if (n > GEMV_ROWS) { /* the unfused ops (a residual's GEMM adds into out) */
        if (epi == DECODE_RESIDUAL) {
            cuda_matmul_forward_acc(out, x, w, n, C, OC);
            if (b)
                cuda_add_bias(out, b, n, OC);
        } else {
            cuda_matmul_forward(out, x, w, b, n, C, OC);
            if (epi == DECODE_GELU)
                cuda_gelu_forward(out, out, (size_t)n * OC);
        }
        return;
    }
    /* 16-byte loads where every vector read (x, w, up, the norm's) allows */
    uintptr_t at = (uintptr_t)x | (uintptr_t)w | (uintptr_t)up;
    if (norm)
        at |= (uintptr_t)norm->w | (uintptr_t)norm->b;
    const int vec = C % 4 == 0 && at % 16 == 0;
    if (vec && glu)
        decode_linear_launch<float4, 1>(out, x, norm, w, up, b, n, C, OC, epi);
    else if (vec)
        decode_linear_launch<float4, 0>(out, x, norm, w, up, b, n, C, OC, epi);
    else if (glu)
        decode_linear_launch<float, 1>(out, x, norm, w, up, b, n, C, OC, epi);
    else
        decode_linear_launch<float, 0>(out, x, norm, w, up, b, n, C, OC, epi);
}
