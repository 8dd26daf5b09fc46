/* rope.cu — rotary embedding in place on the q and k heads of a fused qkv
 * buffer (layout in backend.h), interleaved pairs (2i, 2i+1) turned by
 * pos * rope_inv_freq(rf, i, hs) (backend.h), pos = pos[n] (packed documents) or pos0 + n % T
 * (decoding: pos0 + n).  As on the CPU the angle, its cosine
 * and its sine are computed in double (pos * freq loses digits in fp32 at
 * long contexts) and rounded to fp32 once; backward turns by -angle. */
#include "ops.cuh"

/* One thread per (row n, pair i): one angle, applied to the pair i of the
 * Q query heads and the key head of every kv group (they are adjacent;
 * the value head after them is left alone). */
__global__ void rope_kernel(float *qkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                            int hs, RopeFreq rf, double sign)
{
    int half = hs / 2, Q = H / KVH, width = (H + 2 * KVH) * hs;
    size_t total = (size_t)N * half;
    GRID_STRIDE(idx, total)
    {
        int n = (int)(idx / half), i = (int)(idx % half);
        double ang = sign * (double)(pos ? pos[n] : pos0 + n % T) * rope_inv_freq(rf, i, hs);
        float c = (float)cos(ang), s = (float)sin(ang);
        float *row = qkv + (size_t)n * width;
        for (int g = 0; g < KVH; g++) {
            float *head = row + (size_t)g * (Q + 2) * hs;
            for (int j = 0; j <= Q; j++) {
                float *p = head + (size_t)j * hs + 2 * i;
                float x0 = p[0], x1 = p[1];
                p[0] = x0 * c - x1 * s;
                p[1] = x0 * s + x1 * c;
            }
        }
    }
}

static void rope_apply(float *qkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                       int hs, RopeFreq rf, double sign)
{
    TRD_ASSERT(KVH > 0 && H % KVH == 0 && hs % 2 == 0);
    if (N <= 0 || hs <= 0)
        return;
    rope_kernel<<<cuda_blocks((size_t)N * (hs / 2)), CUDA_THREADS, 0, cuda_stream()>>>(
        qkv, pos, N, T, pos0, H, KVH, hs, rf, sign);
    CUDA_CHECK_LAUNCH();
}

void cuda_rope_forward(float *qkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                       int hs, RopeFreq rf)
{
    rope_apply(qkv, pos, N, T, pos0, H, KVH, hs, rf, 1.0);
}

/* Rows of one sequence from position pos0 (decoding). */
void cuda_rope_decode(float *qkv, int n, int pos0, int H, int KVH, int hs, RopeFreq rf)
{
    rope_apply(qkv, NULL, n, n > 0 ? n : 1, pos0, H, KVH, hs, rf, 1.0);
}

/* In place: dqkv holds d(rotated) on entry and d(unrotated) on return. */
void cuda_rope_backward(float *dqkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                        int hs, RopeFreq rf)
{
    rope_apply(dqkv, pos, N, T, pos0, H, KVH, hs, rf, -1.0);
}
