/* cp_attention.c — attention across a context-parallel group by
 * all-gathered keys and values (cp_attention.h). */
#include "context_par/cp_attention.h"

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

void cp_attention_init(CpAttention *a, const Backend *be, Comm *cp, int B, int L, int H, int KVH,
                       int hs)
{
    TRD_ASSERT(B > 0 && L > 0 && KVH > 0 && H % KVH == 0 && hs > 0);
    *a = (CpAttention){.be = be, .cp = cp, .B = B, .L = L, .H = H, .KVH = KVH, .hs = hs};
    const size_t bytes = (size_t)cp->size * rank_elems(a) * sizeof(float);
    a->kv = be->alloc(bytes, "context-parallel keys and values");
    a->dkv = be->alloc(bytes, "context-parallel key and value gradients");
}

void cp_attention_free(CpAttention *a)
{
    a->be->release(a->kv);
    a->be->release(a->dkv);
    a->kv = a->dkv = NULL;
    a->gathered = NULL;
}

/* Every rank's rows of qkv into a->kv. */
static void gather(CpAttention *a, const float *qkv)
{
    const size_t n = rank_elems(a);
    a->be->copy(a->kv + (size_t)a->cp->rank * n, qkv, n * sizeof(float));
    const double t0 = comm_wtime();
    comm_allgather_block_f32(a->cp, a->kv, n);
    a->comm_s += comm_wtime() - t0;
    a->gathered = qkv;
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

/* Rank s's chunk d that holds key chunk k (0 .. 2cp-1). */
static void owner_of(int cp, int k, int *s, int *d)
{
    *d = k >= cp;
    *s = *d ? 2 * cp - 1 - k : k;
}

static const float *kv_block(const CpAttention *a, const float *all, int s, int d)
{
    return all + ((size_t)s * 2 + (size_t)d) * chunk_rows(a) * width(a);
}

void cp_attention_forward(CpAttention *a, float *out, float *lse, const float *qkv,
                          const int32_t *pos)
{
    const int cp = a->cp->size, r = a->cp->rank;
    gather(a, qkv);
    const size_t qn = chunk_rows(a) * width(a), on = chunk_rows(a) * (size_t)a->H * a->hs;
    for (int c = 0; c < 2; c++) {
        /* key chunks in order of position, up to this query chunk's own */
        for (int k = 0; k <= cp_chunk(cp, r, c); k++) {
            int s, d;
            owner_of(cp, k, &s, &d);
            AttnArgs x = block_args(a, c, s, d, pos);
            x.merge = k > 0;
            a->be->attention_forward(out + (size_t)c * on,
                                     lse + (size_t)c * (size_t)a->B * a->H * a->L, qkv + c * qn,
                                     kv_block(a, a->kv, s, d), &x);
        }
    }
}

void cp_attention_backward(CpAttention *a, float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *lse, const int32_t *pos)
{
    const int cp = a->cp->size, r = a->cp->rank;
    const size_t n = rank_elems(a);
    const size_t qn = chunk_rows(a) * width(a), on = chunk_rows(a) * (size_t)a->H * a->hs;
    if (a->gathered != qkv) /* the last forward was another layer's */
        gather(a, qkv);
    a->be->zero(a->dkv, (size_t)cp * n * sizeof(float));
    for (int c = 0; c < 2; c++)
        for (int k = 0; k <= cp_chunk(cp, r, c); k++) {
            int s, d;
            owner_of(cp, k, &s, &d);
            const AttnArgs x = block_args(a, c, s, d, pos);
            a->be->attention_backward(dqkv + c * qn, (float *)kv_block(a, a->dkv, s, d),
                                      dout + c * on, qkv + c * qn, kv_block(a, a->kv, s, d),
                                      out + c * on, lse + (size_t)c * (size_t)a->B * a->H * a->L,
                                      &x);
        }
    /* every rank's key and value gradients of my rows, summed, into dkv[0, n) */
    const double t0 = comm_wtime();
    comm_reduce_scatter_block_f32(a->cp, a->dkv, n);
    a->comm_s += comm_wtime() - t0;
    a->be->accumulate(dqkv, a->dkv, n);
}
