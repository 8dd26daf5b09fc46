/* cp_attention.c — attention across a context-parallel group by
 * all-gathered keys and values (cp_attention.h). */
#include "context_par/cp_attention.h"

#include <stdlib.h>

#include "core/error.h"

static size_t chunk_rows(const CpAttention *a) { return (size_t)a->B * (size_t)a->L; }

static size_t width(const CpAttention *a) { return (size_t)(a->H + 2 * a->KVH) * (size_t)a->hs; }

/* Floats of one rank's two chunks of qkv rows. */
static size_t rank_elems(const CpAttention *a) { return 2 * chunk_rows(a) * width(a); }

size_t cp_attention_bytes(int cp, int B, int L, int H, int KVH, int hs)
{
    if (cp <= 1)
        return 0;
    return 2 * (size_t)cp * 2 * (size_t)B * (size_t)L * (size_t)(H + 2 * KVH) * (size_t)hs *
           sizeof(float);
}

/* Rank s's chunk d that holds key chunk k (0 .. 2cp-1). */
static void owner_of(int cp, int k, int *s, int *d)
{
    *d = k >= cp;
    *s = *d ? 2 * cp - 1 - k : k;
}

/* Each query chunk attends to the key chunks at or before it.  The blocks
 * whose keys this rank holds run first, while the other ranks' rows are
 * gathered, the rest once they are here; the log-sum-exp merge makes the
 * order immaterial up to rounding. */
static void plan_blocks(CpAttention *a)
{
    const int cp = a->cp->size, r = a->cp->rank;
    a->blocks = trd_calloc(2 * (size_t)cp + 1, sizeof *a->blocks, "context-parallel blocks");
    int n = 0, first[2] = {1, 1};
    for (int local = 1; local >= 0; local--) {
        if (!local)
            a->n_local = n;
        for (int c = 0; c < 2; c++)
            for (int k = 0; k <= cp_chunk(cp, r, c); k++) {
                int s, d;
                owner_of(cp, k, &s, &d);
                if ((s == r) != local)
                    continue;
                a->blocks[n++] = (CpBlock){.c = c, .s = s, .d = d, .merge = !first[c]};
                first[c] = 0;
            }
    }
    a->n_blocks = n;
    TRD_ASSERT(n == 2 * cp + 1);
}

void cp_attention_init(CpAttention *a, const Backend *be, Comm *cp, int B, int L, int H, int KVH,
                       int hs)
{
    TRD_ASSERT(B > 0 && L > 0 && KVH > 0 && H % KVH == 0 && hs > 0);
    *a = (CpAttention){.be = be, .cp = cp, .B = B, .L = L, .H = H, .KVH = KVH, .hs = hs};
    const size_t bytes = (size_t)cp->size * rank_elems(a) * sizeof(float);
    a->kv = be->alloc(bytes, "context-parallel keys and values");
    a->dkv = be->alloc(bytes, "context-parallel key and value gradients");
    plan_blocks(a);
}

void cp_attention_free(CpAttention *a)
{
    a->be->release(a->kv);
    a->be->release(a->dkv);
    a->kv = a->dkv = NULL;
    a->gathered = NULL;
    free(a->blocks);
    a->blocks = NULL;
}

/* Every rank's rows of qkv into a->kv, started (finish_gather waits). */
static CommHandle start_gather(CpAttention *a, const float *qkv)
{
    const size_t n = rank_elems(a), cp = (size_t)a->cp->size;
    float *mine = a->kv + (size_t)a->cp->rank * n;
    a->be->copy(mine, qkv, n * sizeof(float));
    const double t0 = comm_wtime();
    CommHandle h = comm_iallgather_range_f32(a->cp, mine, a->kv, 0, cp * n, n);
    a->comm_s += comm_wtime() - t0;
    a->gathered = qkv;
    return h;
}

static void finish_gather(CpAttention *a, CommHandle *h)
{
    const double t0 = comm_wtime();
    comm_wait(h);
    a->comm_s += comm_wtime() - t0;
}

/* The arguments of query chunk c of this rank against chunk d of rank s. */
static AttnArgs block_args(const CpAttention *a, int c, int s, int d, const int32_t *pos)
{
    const int cp = a->cp->size;
    AttnArgs x = attn_args(a->B, a->L, a->H, a->KVH, a->hs);
    x.q_pos0 = cp_chunk(cp, a->cp->rank, c) * a->L;
    x.k_pos0 = cp_chunk(cp, s, d) * a->L;
    x.pos = pos ? pos + (size_t)c * chunk_rows(a) : NULL;
    return x;
}

static const float *kv_block(const CpAttention *a, const float *all, int s, int d)
{
    return all + ((size_t)s * 2 + (size_t)d) * chunk_rows(a) * width(a);
}

/* The key/value rows of rank s's chunk d: this rank's own from qkv (usable
 * while the gather is in flight), the others' from the gathered all. */
static const float *kv_rows(const CpAttention *a, const float *all, const float *qkv, int s, int d)
{
    if (s == a->cp->rank)
        return qkv + (size_t)d * chunk_rows(a) * width(a);
    return kv_block(a, all, s, d);
}

/* Every block call writes its chunk's out16 (the merged out so far), so
 * the last one leaves the bits of the final out. */
void cp_attention_forward(CpAttention *a, float *out, uint16_t *out16, float *lse, const float *qkv,
                          const int32_t *pos)
{
    CommHandle h = start_gather(a, qkv);
    const size_t qn = chunk_rows(a) * width(a), on = chunk_rows(a) * (size_t)a->H * a->hs;
    const size_t ln = (size_t)a->B * a->H * a->L;
    for (int i = 0; i < a->n_blocks; i++) {
        const CpBlock *b = &a->blocks[i];
        if (i == a->n_local)
            finish_gather(a, &h);
        AttnArgs x = block_args(a, b->c, b->s, b->d, pos);
        x.merge = b->merge;
        x.out16 = out16 ? out16 + b->c * on : NULL;
        a->be->attention_forward(out + b->c * on, lse + b->c * ln, qkv + b->c * qn,
                                 kv_rows(a, a->kv, qkv, b->s, b->d), &x);
    }
}

void cp_attention_backward(CpAttention *a, float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *lse, const int32_t *pos)
{
    const size_t n = rank_elems(a);
    const size_t qn = chunk_rows(a) * width(a), on = chunk_rows(a) * (size_t)a->H * a->hs;
    const size_t ln = (size_t)a->B * a->H * a->L;
    /* the rows gathered again unless the last forward was this layer's */
    const int again = a->gathered != qkv;
    CommHandle h = again ? start_gather(a, qkv) : comm_handle_none();
    a->be->zero(a->dkv, (size_t)a->cp->size * n * sizeof(float));
    for (int i = 0; i < a->n_blocks; i++) {
        const CpBlock *b = &a->blocks[i];
        if (i == a->n_local && again)
            finish_gather(a, &h);
        const AttnArgs x = block_args(a, b->c, b->s, b->d, pos);
        a->be->attention_backward(dqkv + b->c * qn, (float *)kv_block(a, a->dkv, b->s, b->d),
                                  dout + b->c * on, qkv + b->c * qn,
                                  kv_rows(a, a->kv, qkv, b->s, b->d), out + b->c * on,
                                  lse + b->c * ln, &x);
    }
    /* every rank's key and value gradients of my rows, summed, into dkv[0, n) */
    const double t0 = comm_wtime();
    comm_reduce_scatter_block_f32(a->cp, a->dkv, n);
    a->comm_s += comm_wtime() - t0;
    a->be->accumulate(dqkv, a->dkv, n);
}
