/* tensor_par.h — tensor parallelism (Megatron-style) and sequence
 * parallelism: the collectives around the parallel layers, and the
 * vocabulary-parallel embedding and cross-entropy.
 *
 * A TP group of `size` ranks splits every transformer layer:
 *   column-parallel linear (attn.qkv, mlp.fc / mlp.gate / mlp.up): weight
 *     rows (output features) split; the input [N, C] is needed whole; the
 *     bias is split like the rows.
 *   row-parallel linear (attn.proj, mlp.proj / mlp.down): weight columns
 *     split; each rank's output [N, C] is a partial sum; the (replicated)
 *     bias is added once, after the reduction.
 * Between them (attention heads, the MLP activation) everything is local.
 *
 * Which collective each boundary owns (N token rows, n = N / size):
 *
 *                          forward               backward
 *   column input, no SP    identity              all-reduce dx [N, C]
 *   column input, SP       all-gather [n]->[N]   reduce-scatter [N]->[n]
 *   row output,   no SP    all-reduce y [N, C]   identity
 *   row output,   SP       reduce-scatter        all-gather
 *
 * Sequence parallelism: the residual stream, the norms and the residual
 * additions hold only rows [rank*n, (rank+1)*n) of the b-major [B*T, C]
 * stream (a block of tokens, not a range of positions in every sequence:
 * norms and additions are per row, so any consistent split works; it needs
 * N % size == 0, which seq_len % tp == 0 guarantees).  The gathered [N, C]
 * norm output is what the column-parallel layers read.
 *
 * The vocabulary-parallel pieces (vocab_parallel.c) treat the vocabulary as
 * one more split dimension: each rank owns rows [vocab_start, vocab_start +
 * Vp) of the (padded) embedding and head, of which the first V are real.
 *
 * Everything here works on the backend's memory through the backend's ops
 * (host memory for the CPU backend, device memory for CUDA); a size-1 group
 * (or a NULL communicator) does no communication. */
#ifndef TRD_TENSOR_PAR_H
#define TRD_TENSOR_PAR_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"

typedef struct {
    const Backend *be; /* whose memory holds the buffers, whose ops the boundaries run */
    Comm *comm;        /* the TP group; NULL until attached (then size must be 1) */
    Comm kv;           /* the kv_share ranks holding the same replicated kv heads,
                     or comm_none() (kv_share 1) */
    int size, rank;
    int sp;       /* sequence parallel (only meaningful when size > 1) */
    int kv_share; /* TP ranks holding each kv head alike (tp / kv_heads, or 1) */
} TpGroup;

/* The layout of rank `rank` of `size` (no communicator yet): what a model
 * needs to size its buffers at creation. */
TpGroup tp_group_layout(const Backend *be, int size, int rank, int sequence_parallel, int kv_share);
/* Attach the TP communicator (its size and rank must match the layout) and
 * create the kv-sharing sub-communicator when kv_share > 1.  Collective
 * over tp when kv_share > 1. */
void tp_group_attach(TpGroup *g, Comm *tp);
void tp_group_free(TpGroup *g);
/* Fatal error unless a group of size > 1 has its communicator. */
void tp_group_check(const TpGroup *g);

static inline int tp_active(const TpGroup *g) { return g->size > 1; }
static inline int tp_sequence_parallel(const TpGroup *g) { return g->size > 1 && g->sp; }
/* Rows of the residual stream held here: N / size with SP, else N. */
int tp_stream_rows(const TpGroup *g, int N);
/* This rank's rows inside a whole [N, C] buffer: full + rank*n*C with SP,
 * else full. */
float *tp_my_rows(const TpGroup *g, float *full, int N, int C);

/* ---- the four boundaries (all in place) ---- */

/* Column input, forward: x [N, C] becomes whole on every rank.  With SP,
 * on entry this rank's rows (tp_my_rows) hold its slice: all-gather.
 * Without SP: identity. */
void tp_column_input_forward(TpGroup *g, float *x, int N, int C);
/* Column input, backward: dx [N, C] holds this rank's partial gradient (its
 * heads' or columns' contribution).  Without SP: all-reduce, dx whole.  With
 * SP: reduce-scatter, dx[0, n*C) holds this rank's rows of the sum. */
void tp_column_input_backward(TpGroup *g, float *dx, int N, int C);
/* Row output, forward: y [N, C] holds this rank's partial sum.  Without SP:
 * all-reduce; with SP: reduce-scatter into y[0, n*C).  Then bias (may be
 * NULL) is added once to the rows kept. */
void tp_row_output_forward(TpGroup *g, float *y, const float *bias, int N, int C);
/* Row output, backward: dy is the gradient of the rows kept ([n, C] with
 * SP, [N, C] without).  Returns the whole [N, C] gradient the layer's
 * backward reads: dy itself without SP; with SP, full after an all-gather
 * (full must not overlap dy). */
const float *tp_row_output_backward(TpGroup *g, const float *dy, float *full, int N, int C);

/* ---- replicated parameters ---- */

/* A replicated parameter whose gradient this rank computed from its part of
 * the tokens only (norm weights under SP, wpe under vocab parallelism):
 * partial[n] is all-reduced over TP, then ADDED into grad (which may hold
 * earlier micro-batches, already complete).  partial is clobbered. */
void tp_add_reduced_grad(TpGroup *g, float *grad, float *partial, size_t n);
/* Replicated kv rows: sum rows[n] over the ranks sharing them (in place). */
void tp_kv_allreduce(TpGroup *g, float *rows, size_t n);

/* ---- vocabulary-parallel embedding (vocab_parallel.c) ----
 * Each rank looks up the tokens of its vocabulary range (others give zero
 * rows, positions included), then the row-output boundary sums them: the
 * embedding is a row-parallel layer over the vocabulary.
 * out: [tp_stream_rows, C] (the residual stream entering layer 0);
 * full: [N, C] scratch, may equal out when not SP.  wpe may be NULL; pos
 * (packed documents' positions, backend.h) may be NULL. */
void tp_embedding_forward(const Backend *be, TpGroup *g, float *out, float *full,
                          const int32_t *tokens, const int32_t *pos, const float *wte,
                          const float *wpe, int N, int T, int C, int vocab_start, int Vp);
/* dout: the stream gradient [tp_stream_rows, C].  Adds into dwte (complete:
 * this rank's rows) and dwpe (may be NULL): each rank's position gradient is
 * partial (its tokens only), so with tp > 1 it goes through dwpe_scratch
 * [T, C] and tp_add_reduced_grad.  full: [N, C] scratch, not overlapping dout. */
void tp_embedding_backward(const Backend *be, TpGroup *g, float *dwte, float *dwpe,
                           float *dwpe_scratch, const float *dout, float *full,
                           const int32_t *tokens, const int32_t *pos, int N, int T, int C,
                           int vocab_start, int Vp);

/* ---- vocabulary-parallel cross-entropy (vocab_parallel.c) ----
 * logits [N, Vp]: this rank's columns, global vocabulary [vocab_start,
 * vocab_start + Vp), the first V of them real (V may be 0: all padding).
 * targets are global ids (< 0 ignored: loss 0, no gradient; >= vocab is
 * an error).  Forward: row max (max all-reduce), then the sum of
 * exponentials and the target logit (one all-reduce of [2N]).  losses[N]
 * come out whole and equal on every rank.  stats [3N] keeps row max, sum
 * of exponentials and target logit for backward, which is local:
 * logits are OVERWRITTEN with (softmax - onehot) * dloss, padding zero.
 * With one rank this is the backend's crossentropy, number for number.
 * targets are in the backend's memory, host_targets the same ids on the
 * host (checked against vocab there; equal pointers on the CPU). */
void tp_crossentropy_forward(TpGroup *g, float *losses, float *stats, const float *logits,
                             const int32_t *targets, const int32_t *host_targets, int N, int V,
                             int Vp, int vocab_start, int vocab);
void tp_crossentropy_backward(TpGroup *g, float *logits, const float *stats, const int32_t *targets,
                              float dloss, int N, int V, int Vp, int vocab_start);

#endif
