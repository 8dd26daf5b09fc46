/* attention.cuh — what the two attention files share: the shape of a
 * call (AttnArgs, backend.h) as the kernels read it, where a head lies in
 * a row, which keys a query row sees, and the order of the blocks.
 * attention.cu: fp32 on CUDA cores, every head size up to 128 (the
 * reference of the CUDA path); attention_tc.cu: bf16 on tensor cores for
 * head sizes 64 and 128 (training.precision: bf16). */
#ifndef TRD_KERNELS_ATTENTION_CUH
#define TRD_KERNELS_ATTENTION_CUH

#include "ops.cuh"

#include <cuda_bf16.h>

enum { ATT_HS_MAX = 128 }; /* the largest head size the kernels take */

/* Offsets, inside a row of the fused qkv buffer, of query head h and of the
 * key head of group g (the value head follows the key head). */
__device__ inline size_t q_off(int h, int Q, int hs)
{
    return ((size_t)(h / Q) * (Q + 2) + h % Q) * hs;
}

__device__ inline size_t k_off(int g, int Q, int hs) { return ((size_t)g * (Q + 2) + Q) * hs; }

__device__ inline int imin(int a, int b) { return a < b ? a : b; }
__device__ inline int imax(int a, int b) { return a > b ? a : b; }

struct Shape {
    int Tq, Tk, H, KVH, hs, Q, width, kvw, qtiles, ktiles, q_pos0, k_pos0, kv_packed, merge;
    int set; /* backward: GRAD_SET, the gradients written rather than added to */
    const int32_t *pos;
    uint16_t *out16; /* forward: AttnArgs.out16, or NULL */
    float scale;
};

/* out16's copy of a row of out (AttnArgs.out16) at the same offset, or
 * NULL without one */
__device__ inline uint16_t *out16_row(const Shape &s, const float *out, const float *orow)
{
    return s.out16 ? s.out16 + (orow - out) : NULL;
}

/* The bf16 bits of v (round to nearest even, to_bf16_kernel's rounding:
 * backend.h's bf16_bits) */
__device__ inline uint16_t bf16_bits_of(float v)
{
    return __bfloat16_as_ushort(__float2bfloat16(v));
}

/* A backward's gradient element: written (set: its old value, maybe
 * garbage, never read) or added to. */
__device__ inline void grad_put(float *p, float v, int set) { *p = set ? v : *p + v; }

/* Offset, in a row of kv, of group g's key head (the value head follows). */
__device__ inline size_t kv_k_off(int g, const Shape &s)
{
    return s.kv_packed ? (size_t)g * 2 * s.hs : k_off(g, s.Q, s.hs);
}

/* The keys [*u0, *u1) of the key block that query row t of sequence b sees
 * (AttnArgs's rule); *u0 >= *u1 when none. */
__device__ inline void key_range(const Shape &s, int b, int t, int *u0, int *u1)
{
    const int qp = s.q_pos0 + t;
    const int first = s.pos ? qp - s.pos[(size_t)b * s.Tq + t] : 0;
    *u0 = imax(first - s.k_pos0, 0);
    *u1 = imin(qp - s.k_pos0 + 1, s.Tk);
}

inline Shape attn_shape(const AttnArgs *a, int rows)
{
    Shape s;
    s.Tq = a->Tq, s.Tk = a->Tk, s.H = a->H, s.KVH = a->KVH, s.hs = a->hs, s.Q = a->H / a->KVH;
    s.width = (a->H + 2 * a->KVH) * a->hs;
    s.kvw = a->kv_packed ? 2 * a->KVH * a->hs : s.width;
    s.qtiles = (a->Tq + rows - 1) / rows;
    s.ktiles = (a->Tk + rows - 1) / rows;
    s.q_pos0 = a->q_pos0, s.k_pos0 = a->k_pos0;
    s.kv_packed = a->kv_packed, s.merge = a->merge;
    s.set = a->grad == GRAD_SET;
    s.pos = a->pos;
    s.out16 = a->out16;
    s.scale = 1 / sqrtf((float)a->hs);
    return s;
}

/* Block -> (b, head, tile), the costliest tiles first across the whole
 * grid (the grid is the B * heads * tiles blocks): a causal query tile
 * costs more the later it is (heavy = the last tile first), a key tile the
 * earlier it is.  The tile is the slowest-varying part of blockIdx.x, so
 * the blocks the scheduler starts last are light ones of every (b, head);
 * tile-fastest order put a heavy tile of the last heads into the last wave. */
__device__ inline void block_coords(int tiles, int heads, int last_first, int *b, int *head,
                                    int *tile)
{
    const int bh = (int)(gridDim.x / tiles), k = (int)(blockIdx.x / bh), r = (int)(blockIdx.x % bh);
    *tile = last_first ? tiles - 1 - k : k;
    *head = r % heads;
    *b = r / heads;
}

inline void attn_check_args(const AttnArgs *a)
{
    TRD_ASSERT(a->KVH > 0 && a->H % a->KVH == 0);
    TRD_ASSERT(a->B >= 0 && a->Tq >= 0 && a->Tk >= 0 && a->q_pos0 >= 0 && a->k_pos0 >= 0);
    if (a->hs > ATT_HS_MAX)
        trd_fatal(TRD_EXIT_INPUT, "use hidden / heads <= 128 with backend: cuda",
                  "attention: head size %d is larger than the CUDA kernels' limit %d", a->hs,
                  (int)ATT_HS_MAX);
}

#endif
