/* cp_attention.h — attention over a sequence split across the ranks of a
 * context-parallel group (the first piece of topology.cp; docs/design.md).
 *
 * Each of B sequences of T = 2 * cp * L positions is cut into 2cp chunks of
 * L rows; rank r holds chunks r and 2cp-1-r, so that under the causal mask
 * every rank has the same work (an early chunk sees few keys, its partner
 * many).  A rank's buffers hold its two chunks one after the other, each a
 * whole [B, L] block: qkv [2][B*L][(H+2KVH)*hs], out [2][B*L][H*hs],
 * lse [2][B][H][L], pos (packed documents, or NULL) [2][B*L].
 *
 * Scheme: all-gather of the keys and values (as Llama 3 trained long
 * context): every rank gathers the group's qkv rows once per layer, then
 * attends each of its query chunks to every key chunk at or before it,
 * merging by log-sum-exp in order of position (AttnArgs.merge).  Backward
 * needs the gathered rows again: it reuses them when they are still those
 * of its qkv (the layer's forward just before: a single layer, or
 * recomputation), else gathers them once more, since keeping every layer's
 * gathered rows would cost cp x the layer's qkv activations.  Each rank's
 * key/value gradients for every chunk are then reduce-scattered back to
 * their owners.  Exact: the result equals one rank's attention over the
 * whole sequence up to the order of sums (tests/test_cp.c).
 *
 * Bytes a rank sends per layer (ring algorithms), n = B * 2L * (H+2KVH) * hs
 * floats: (cp-1) n for the forward all-gather, (cp-1) n for the backward's
 * reduce-scatter, and (cp-1) n for the backward's all-gather when it
 * gathers again: in a model of L layers without recompute, every layer's
 * backward but the last one's, (3L-1) (cp-1) n per micro-batch; with
 * recompute, or a pipeline that runs other micro-batches in between,
 * 3L (cp-1) n.  The gathered rows are whole qkv rows; gathering only the key
 * and value heads (AttnArgs.kv_packed) would cut that by (H+2KVH) / (2KVH). */
#ifndef TRD_CONTEXT_PAR_CP_ATTENTION_H
#define TRD_CONTEXT_PAR_CP_ATTENTION_H

#include "backend/backend.h"
#include "comm/comm.h"

/* One block of a rank's attention: its query chunk c (0 or 1) against
 * chunk d of rank s's rows; merge 0 for the first block of c. */
typedef struct {
    int c, s, d, merge;
} CpBlock;

typedef struct {
    const Backend *be;
    Comm *cp;
    int B, L, H, KVH, hs;
    float *kv;             /* [cp][2][B*L][width]: every rank's qkv rows, gathered */
    float *dkv;            /* the same shape: key and value gradients for every rank's rows */
    const float *gathered; /* the qkv whose rows kv holds (backward re-gathers others) */
    double comm_s;         /* seconds in the exchange so far (the caller resets it) */
    CpBlock *blocks;       /* the 2cp + 1 blocks in the order they run */
    int n_blocks, n_local; /* the first n_local need no gathered rows */
} CpAttention;

/* Bytes of the two buffers for a group of cp (0 when cp is 1). */
size_t cp_attention_bytes(int cp, int B, int L, int H, int KVH, int hs);

/* The chunk (0 .. 2cp-1) that rank r's local chunk c (0 or 1) is. */
static inline int cp_chunk(int cp, int r, int c) { return c == 0 ? r : 2 * cp - 1 - r; }

/* Buffers in the backend's memory for a group cp (which must outlive it). */
void cp_attention_init(CpAttention *a, const Backend *be, Comm *cp, int B, int L, int H, int KVH,
                       int hs);
void cp_attention_free(CpAttention *a);

/* out, lse = attention of this rank's query rows over the whole sequence;
 * out16 (or NULL): out's bf16 bits too (AttnArgs.out16). */
void cp_attention_forward(CpAttention *a, float *out, uint16_t *out16, float *lse, const float *qkv,
                          const int32_t *pos);
/* dqkv += the gradient through cp_attention_forward (from its out, lse). */
void cp_attention_backward(CpAttention *a, float *dqkv, const float *dout, const float *qkv,
                           const float *out, const float *lse, const int32_t *pos);

#endif
