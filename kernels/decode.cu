/* decode.cu — generation with a key/value cache (backend.h, "decoding"):
 * attention of a few new rows against the cache, and the next token chosen
 * on the device.  The position comes from device memory when the caller
 * says so (at): a captured step (docs/cuda.md, "Decoding") keeps the same
 * arguments from token to token.
 *
 * attention_decode: one warp per (new row, head), block t * H + h.  Lane c holds channels
 * c, c+32, c+64, c+96 of the query and of its running output; the cached
 * keys and values stream by one position at a time: a warp-wide dot
 * product, then the online softmax (running max m and sum l) rescales the
 * output.  The cost per new token is one pass over the cache, nothing of
 * the earlier rows is recomputed.  Head size up to 128.
 *
 * decode_linear, up to GEMV_ROWS rows: a GEMV, one warp per output
 * column o.  The warp streams w's row o once (16-byte loads, coalesced:
 * lane l reads floats 4l .. 4l+3 of each 128 in turn, or one float a lane
 * where C or a pointer does not allow them) against each input row, sums
 * its lanes (warp_sum), and lane 0 adds the bias and applies the epilogue.
 * One launch for what cuBLAS does in two (the bias broadcast, then the
 * GEMM with beta 1) plus the GELU or the residual add after it.  At one row
 * the op is the read of w (4 C OC bytes), so bandwidth-bound; the sums run
 * in another order than cuBLAS's (within fp32 rounding of them).  More
 * rows: cuBLAS, where the weights are read once for all of them.
 * With a norm (LayerNorm or RMSNorm before the linear), every block first
 * computes the statistics of the n input rows itself (block sums over C
 * floats, from L2: a few KB against the block's C * 8 * 4 bytes of
 * weights) and each warp norms the input elements as it reads them, so
 * the norm's kernel and its output's round trip leave the step. */
#include "ops.cuh"

enum { DEC_HS_MAX = 128, DEC_PER = DEC_HS_MAX / 32 };

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

__global__ void attention_decode_kernel(float *out, const float *qkv, const float *kcache,
                                        const float *vcache, const int32_t *at, int pos0, int H,
                                        int KVH, int hs)
{
    if (at)
        pos0 = *at;
    const int h = (int)(blockIdx.x % (unsigned)H), t = (int)(blockIdx.x / (unsigned)H);
    const int lane = threadIdx.x;
    const int Q = H / KVH, g = h / Q, width = (H + 2 * KVH) * hs, pos = pos0 + t;
    const float *q = qkv + (size_t)t * width + ((size_t)g * (Q + 2) + h % Q) * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    float qr[DEC_PER], acc[DEC_PER];
#pragma unroll
    for (int j = 0; j < DEC_PER; j++) {
        const int i = lane + 32 * j;
        qr[j] = i < hs ? q[i] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int u = 0; u <= pos; u++) {
        const float *k = kcache + ((size_t)u * KVH + g) * hs;
        const float *v = vcache + ((size_t)u * KVH + g) * hs;
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < DEC_PER; j++) {
            const int i = lane + 32 * j;
            part += i < hs ? qr[j] * k[i] : 0.0f;
        }
        const float s = warp_sum(part) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int j = 0; j < DEC_PER; j++) {
            const int i = lane + 32 * j;
            acc[j] = acc[j] * corr + (i < hs ? p * v[i] : 0.0f);
        }
        m = m_new;
    }
    float *o = out + (size_t)t * H * hs + (size_t)h * hs;
#pragma unroll
    for (int j = 0; j < DEC_PER; j++) {
        const int i = lane + 32 * j;
        if (i < hs)
            o[i] = acc[j] / l;
    }
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
    /* one block (a warp) per (new row, head): block t * H + h */
    attention_decode_kernel<<<(unsigned)n *(unsigned)H, 32, 0, cuda_stream()>>>(
        out, qkv, kcache, vcache, at, pos0, H, KVH, hs);
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

enum { GEMV_ROWS = DECODE_NORM_ROWS, GEMV_WARPS = 8 };
enum { NORM_NONE, NORM_LAYER, NORM_RMS };

/* The statistics of the block's input rows for decode_linear's norm,
 * computed by every block (n rows of C floats, read from L2), as norm.cu
 * does: LayerNorm's mean, then the mean square of x - mean; RMSNorm's mean
 * square.  Every thread of the block takes part and gets them. */
template <int NORM>
__device__ void gemv_norm_stats(float *mu, float *rs, const float *x, int n, int C, float eps)
{
    for (int r = 0; r < GEMV_ROWS && r < n; r++) {
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

/* Input element c of row r as the GEMV reads it: x, or its norm (norm.cu's
 * expressions: (x - mean) * rstd * w + b, x * rstd * w). */
template <int NORM>
__device__ inline float gemv_in(const float *x, int r, int c, int C, const float *mu,
                                const float *rs, const DecodeNorm &nm)
{
    const float v = x[(size_t)r * C + c];
    if (NORM == NORM_NONE)
        return v;
    if (NORM == NORM_RMS)
        return v * rs[r] * nm.w[c];
    const float y = (v - mu[r]) * rs[r] * nm.w[c];
    return nm.b ? y + nm.b[c] : y;
}

/* The same for the four elements 4c .. 4c+3 (16-byte loads). */
template <int NORM>
__device__ inline float4 gemv_in4(const float *x, int r, int c, int C, const float *mu,
                                  const float *rs, const DecodeNorm &nm)
{
    float4 v = ((const float4 *)(x + (size_t)r * C))[c];
    if (NORM == NORM_NONE)
        return v;
    const float4 g = ((const float4 *)nm.w)[c];
    if (NORM == NORM_RMS) {
        v.x = v.x * rs[r] * g.x, v.y = v.y * rs[r] * g.y;
        v.z = v.z * rs[r] * g.z, v.w = v.w * rs[r] * g.w;
        return v;
    }
    v.x = (v.x - mu[r]) * rs[r] * g.x, v.y = (v.y - mu[r]) * rs[r] * g.y;
    v.z = (v.z - mu[r]) * rs[r] * g.z, v.w = (v.w - mu[r]) * rs[r] * g.w;
    if (nm.b) {
        const float4 b = ((const float4 *)nm.b)[c];
        v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
    }
    return v;
}

/* Block: GEMV_WARPS warps, columns blockIdx.x * GEMV_WARPS + warp.  Every
 * warp shuffles, those past OC on zeros (no early return). */
template <int VEC, int NORM>
__global__ void decode_linear_kernel(float *out, const float *x, DecodeNorm nm, const float *w,
                                     const float *b, int n, int C, int OC, DecodeEpi epi)
{
    const int o = (int)(blockIdx.x * GEMV_WARPS + threadIdx.x / 32), lane = threadIdx.x % 32;
    float mu[GEMV_ROWS], rs[GEMV_ROWS];
    if (NORM != NORM_NONE)
        gemv_norm_stats<NORM>(mu, rs, x, n, C, nm.eps);
    float acc[GEMV_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (o < OC) {
        const float *wo = w + (size_t)o * C;
        if (VEC) {
            /* several loads in flight a lane: the weight's read is the op */
#pragma unroll 4
            for (int c = lane; c < C / 4; c += 32) {
                const float4 wv = ((const float4 *)wo)[c];
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++)
                    if (r < n) {
                        const float4 xv = gemv_in4<NORM>(x, r, c, C, mu, rs, nm);
                        acc[r] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
                    }
            }
        } else {
            for (int c = lane; c < C; c += 32) {
                const float wv = wo[c];
#pragma unroll
                for (int r = 0; r < GEMV_ROWS; r++)
                    if (r < n)
                        acc[r] += wv * gemv_in<NORM>(x, r, c, C, mu, rs, nm);
            }
        }
    }
    for (int r = 0; r < n; r++) {
        const float s = warp_sum(acc[r]);
        if (lane != 0 || o >= OC)
            continue;
        const float p = s + (b ? b[o] : 0.0f);
        float *y = out + (size_t)r * OC + o;
        if (epi == DECODE_GELU)
            *y = gelu_value(p);
        else if (epi == DECODE_RESIDUAL)
            *y += p;
        else
            *y = p;
    }
}

template <int VEC>
static void decode_linear_launch(float *out, const float *x, const DecodeNorm *norm, const float *w,
                                 const float *b, int n, int C, int OC, DecodeEpi epi)
{
    const unsigned blocks = (unsigned)((OC + GEMV_WARPS - 1) / GEMV_WARPS);
    const DecodeNorm nm = norm ? *norm : DecodeNorm{NULL, NULL, 0.0f, 0};
    if (!norm)
        decode_linear_kernel<VEC, NORM_NONE>
            <<<blocks, 32 * GEMV_WARPS, 0, cuda_stream()>>>(out, x, nm, w, b, n, C, OC, epi);
    else if (norm->rms)
        decode_linear_kernel<VEC, NORM_RMS>
            <<<blocks, 32 * GEMV_WARPS, 0, cuda_stream()>>>(out, x, nm, w, b, n, C, OC, epi);
    else
        decode_linear_kernel<VEC, NORM_LAYER>
            <<<blocks, 32 * GEMV_WARPS, 0, cuda_stream()>>>(out, x, nm, w, b, n, C, OC, epi);
    CUDA_CHECK_LAUNCH();
}

void cuda_decode_linear(float *out, const float *x, const DecodeNorm *norm, const float *w,
                        const float *b, int n, int C, int OC, DecodeEpi epi)
{
    if (n <= 0 || OC <= 0)
        return;
    TRD_ASSERT(!norm || n <= DECODE_NORM_ROWS);
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
    /* 16-byte loads where every vector read (x, w, the norm's) allows */
    uintptr_t at = (uintptr_t)x | (uintptr_t)w;
    if (norm)
        at |= (uintptr_t)norm->w | (uintptr_t)norm->b;
    if (C % 4 == 0 && at % 16 == 0)
        decode_linear_launch<1>(out, x, norm, w, b, n, C, OC, epi);
    else
        decode_linear_launch<0>(out, x, norm, w, b, n, C, OC, epi);
}
