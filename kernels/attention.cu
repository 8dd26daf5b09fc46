/* attention.cu — causal self-attention on the fused qkv buffer, written
 * plainly and with the interface of the CPU reference: att [B, H, T, T]
 * receives the softmax probabilities (zeros above the diagonal) and
 * backward reads them.  O(T^2) memory; the flash / cuDNN attention of
 * issue 8 replaces this later, with its own interface.
 *
 * Forward:  1. one block per (b, h, t) row: scores, causal softmax -> att;
 *           2. one thread per output element: out = att . v.
 * Backward: 1. one block per (b, h, t) row: datt = dout . v^T, turned in
 *              place into the gradient of the scores (softmax backward);
 *           2. one thread per dq element (owned by one query head);
 *           3. one thread per dk / dv element, summed over the query heads
 *              of its kv group: every gradient element has one writer, so
 *              no atomics and a fixed summation order. */
#include "ops.cuh"

enum { ATT_THREADS = 256 };

/* Offsets, inside a row of the fused qkv buffer, of query head h and of the
 * key head of group g (the value head follows the key head). */
__device__ inline size_t q_off(int h, int Q, int hs)
{
    return ((size_t)(h / Q) * (Q + 2) + h % Q) * hs;
}

__device__ inline size_t k_off(int g, int Q, int hs)
{
    return ((size_t)g * (Q + 2) + Q) * hs;
}

__device__ inline float dot(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Block (b, h, t) fills row t of att[b, h]. */
__global__ void attention_softmax_kernel(float *att, const float *qkv, int T, int H, int KVH,
                                         int hs, float scale)
{
    int t = blockIdx.x % T, h = (blockIdx.x / T) % H, b = blockIdx.x / (T * H);
    int Q = H / KVH, width = (H + 2 * KVH) * hs;
    const float *base = qkv + (size_t)b * T * width;
    const float *q = base + (size_t)t * width + q_off(h, Q, hs);
    const float *kh = base + k_off(h / Q, Q, hs);
    float *ar = att + (size_t)blockIdx.x * T; /* blocks are numbered as att's rows */
    float mx = -INFINITY;
    for (int u = threadIdx.x; u < T; u += blockDim.x) {
        if (u <= t) {
            float s = dot(q, kh + (size_t)u * width, hs) * scale;
            ar[u] = s;
            mx = fmaxf(mx, s);
        } else {
            ar[u] = 0; /* masked: att is a full, defined matrix */
        }
    }
    mx = block_max(mx);
    float sum = 0;
    for (int u = threadIdx.x; u <= t; u += blockDim.x) {
        float e = expf(ar[u] - mx);
        ar[u] = e;
        sum += e;
    }
    float inv = 1 / block_sum(sum);
    for (int u = threadIdx.x; u <= t; u += blockDim.x)
        ar[u] *= inv;
}

/* out[b, t, h, i] = sum_{u <= t} att[b, h, t, u] v[b, u, g(h), i] */
__global__ void attention_value_kernel(float *out, const float *att, const float *qkv,
                                       int B, int T, int H, int KVH, int hs)
{
    int Q = H / KVH, width = (H + 2 * KVH) * hs;
    size_t total = (size_t)B * T * H * hs;
    GRID_STRIDE(idx, total) {
        int i = (int)(idx % hs), h = (int)(idx / hs % H), t = (int)(idx / ((size_t)hs * H) % T);
        int b = (int)(idx / ((size_t)hs * H * T));
        const float *ar = att + (((size_t)b * H + h) * T + t) * T;
        const float *v = qkv + (size_t)b * T * width + k_off(h / Q, Q, hs) + hs + i;
        float o = 0;
        for (int u = 0; u <= t; u++)
            o += ar[u] * v[(size_t)u * width];
        out[idx] = o;
    }
}

/* Block (b, h, t): datt row t = att * (dp - sum_u att dp), dp = dout . v_u;
 * zeros above the diagonal. */
__global__ void attention_dscores_kernel(float *datt, const float *dout, const float *qkv,
                                         const float *att, int T, int H, int KVH, int hs)
{
    int t = blockIdx.x % T, h = (blockIdx.x / T) % H, b = blockIdx.x / (T * H);
    int Q = H / KVH, width = (H + 2 * KVH) * hs;
    const float *vh = qkv + (size_t)b * T * width + k_off(h / Q, Q, hs) + hs;
    const float *d = dout + ((size_t)b * T + t) * H * hs + (size_t)h * hs;
    const float *ar = att + (size_t)blockIdx.x * T;
    float *dar = datt + (size_t)blockIdx.x * T;
    float s = 0;
    for (int u = threadIdx.x; u < T; u += blockDim.x) {
        if (u <= t) {
            float dp = dot(d, vh + (size_t)u * width, hs);
            dar[u] = dp;
            s += ar[u] * dp;
        } else {
            dar[u] = 0;
        }
    }
    s = block_sum(s);
    /* softmax backward: dscore = p * (dp - sum_j p_j dp_j) */
    for (int u = threadIdx.x; u <= t; u += blockDim.x)
        dar[u] = ar[u] * (dar[u] - s);
}

/* dq[b, t, h, i] += scale * sum_{u <= t} dscore[t, u] k[u, i] */
__global__ void attention_dq_kernel(float *dqkv, const float *datt, const float *qkv, int B,
                                    int T, int H, int KVH, int hs, float scale)
{
    int Q = H / KVH, width = (H + 2 * KVH) * hs;
    size_t total = (size_t)B * T * H * hs;
    GRID_STRIDE(idx, total) {
        int i = (int)(idx % hs), h = (int)(idx / hs % H), t = (int)(idx / ((size_t)hs * H) % T);
        int b = (int)(idx / ((size_t)hs * H * T));
        const float *dar = datt + (((size_t)b * H + h) * T + t) * T;
        const float *k = qkv + (size_t)b * T * width + k_off(h / Q, Q, hs) + i;
        float acc = 0;
        for (int u = 0; u <= t; u++)
            acc += dar[u] * scale * k[(size_t)u * width];
        dqkv[((size_t)b * T + t) * width + q_off(h, Q, hs) + i] += acc;
    }
}

/* For key position u of group g, summed over the group's query heads h and
 * the query positions t >= u:
 *   dk[u, i] += scale * dscore[h, t, u] q[t, h, i]
 *   dv[u, i] += att[h, t, u] dout[t, h, i] */
__global__ void attention_dkv_kernel(float *dqkv, const float *datt, const float *att,
                                     const float *dout, const float *qkv, int B, int T, int H,
                                     int KVH, int hs, float scale)
{
    int Q = H / KVH, width = (H + 2 * KVH) * hs;
    size_t total = (size_t)B * T * KVH * hs;
    GRID_STRIDE(idx, total) {
        int i = (int)(idx % hs), g = (int)(idx / hs % KVH);
        int u = (int)(idx / ((size_t)hs * KVH) % T), b = (int)(idx / ((size_t)hs * KVH * T));
        float dk = 0, dv = 0;
        for (int h = g * Q; h < (g + 1) * Q; h++) {
            const float *q = qkv + (size_t)b * T * width + q_off(h, Q, hs) + i;
            const float *d = dout + (size_t)b * T * H * hs + (size_t)h * hs + i;
            const float *a = att + ((size_t)b * H + h) * T * T;
            const float *da = datt + ((size_t)b * H + h) * T * T;
            for (int t = u; t < T; t++) {
                dk += da[(size_t)t * T + u] * scale * q[(size_t)t * width];
                dv += a[(size_t)t * T + u] * d[(size_t)t * H * hs];
            }
        }
        float *dkp = dqkv + ((size_t)b * T + u) * width + k_off(g, Q, hs) + i;
        dkp[0] += dk;
        dkp[hs] += dv;
    }
}

static unsigned row_blocks(int B, int T, int H)
{
    size_t rows = (size_t)B * H * T;
    TRD_ASSERT(rows <= 0x7fffffffu); /* gridDim.x limit */
    return (unsigned)rows;
}

void cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int H,
                            int KVH, int hs)
{
    TRD_ASSERT(KVH > 0 && H % KVH == 0);
    if (B <= 0 || T <= 0 || H <= 0 || hs <= 0)
        return;
    float scale = 1 / sqrtf((float)hs);
    attention_softmax_kernel<<<row_blocks(B, T, H), ATT_THREADS, 0, cuda_stream()>>>(
        att, qkv, T, H, KVH, hs, scale);
    CUDA_CHECK_LAUNCH();
    attention_value_kernel<<<cuda_blocks((size_t)B * T * H * hs), CUDA_THREADS, 0,
                             cuda_stream()>>>(out, att, qkv, B, T, H, KVH, hs);
    CUDA_CHECK_LAUNCH();
}

void cuda_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                             const float *att, int B, int T, int H, int KVH, int hs)
{
    TRD_ASSERT(KVH > 0 && H % KVH == 0);
    if (B <= 0 || T <= 0 || H <= 0 || hs <= 0)
        return;
    float scale = 1 / sqrtf((float)hs);
    attention_dscores_kernel<<<row_blocks(B, T, H), ATT_THREADS, 0, cuda_stream()>>>(
        datt, dout, qkv, att, T, H, KVH, hs);
    CUDA_CHECK_LAUNCH();
    attention_dq_kernel<<<cuda_blocks((size_t)B * T * H * hs), CUDA_THREADS, 0,
                          cuda_stream()>>>(dqkv, datt, qkv, B, T, H, KVH, hs, scale);
    CUDA_CHECK_LAUNCH();
    attention_dkv_kernel<<<cuda_blocks((size_t)B * T * KVH * hs), CUDA_THREADS, 0,
                           cuda_stream()>>>(dqkv, datt, att, dout, qkv, B, T, H, KVH, hs,
                                            scale);
    CUDA_CHECK_LAUNCH();
}
