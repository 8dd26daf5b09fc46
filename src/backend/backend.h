/* backend.h — the math of one rank, behind one table of functions.
 *
 * Every layer op has a forward and a hand-written backward next to it.  The
 * CPU backend (cpu.c: OpenBLAS + OpenMP) is the reference; a CUDA backend
 * fills the same table.  A layer in src/model is written once against this
 * table.
 *
 * Conventions (all tensors row-major, contiguous):
 *   N = number of token rows (B*T), C = channels, OC = output channels.
 *   Linear weights are [OC, C] (out = inp @ W^T + b), as in PyTorch.
 *   Backward functions ACCUMULATE (+=) into every gradient they produce
 *   (dinp, dweight, dbias): a gradient may have several contributions
 *   (residual branches, tied embeddings, micro-batches).  Callers zero
 *   gradient buffers when a new accumulation starts, or give the first
 *   contribution's op GRAD_SET (GradMode below) where it takes one.
 *   Attention works on a fused qkv buffer laid out per kv group:
 *   for each of KVH groups, (H/KVH) query heads, then one key head, then one
 *   value head, each of hs channels.  Splitting that dimension into
 *   contiguous pieces keeps whole groups together (tensor parallelism).
 */
#ifndef TRD_BACKEND_H
#define TRD_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* RoPE's frequencies, the same for every op that rotates (training,
 * decoding, both backends): pair i of a head of size hs turns by
 * pos * rope_inv_freq(rf, i, hs).  The parameters travel by value and the
 * frequency is computed where it is used, so there is no table to
 * allocate, upload or keep in step between backends (docs/design.md,
 * "RoPE frequencies"). */
typedef struct {
    double theta; /* base: the unscaled frequency of pair i is theta^(-2i/hs) */
    /* Llama 3's scaling (Hugging Face's rope_type "llama3"); factor 0: none.
     * Wavelengths 2 pi / f shorter than original_max / high_freq_factor
     * keep their frequency, those longer than original_max /
     * low_freq_factor are divided by factor, and those between are
     * interpolated, smooth in original_max / wavelength. */
    double factor, low_freq_factor, high_freq_factor, original_max;
} RopeFreq;

/* In CUDA code (nvcc, or the CPU emulation of it) the function is also a
 * device function. */
#if defined(__host__) && defined(__device__)
#define TRD_HOST_DEVICE __host__ __device__
#else
#define TRD_HOST_DEVICE
#endif

/* Hugging Face's _compute_llama3_parameters, one pair at a time, in double. */
TRD_HOST_DEVICE static inline double rope_inv_freq(RopeFreq rf, int i, int hs)
{
    const double f = pow(rf.theta, -2.0 * i / hs);
    if (!(rf.factor > 0))
        return f;
    const double wavelen = 6.283185307179586 / f;
    if (wavelen < rf.original_max / rf.high_freq_factor)
        return f; /* high frequencies: unchanged */
    if (wavelen > rf.original_max / rf.low_freq_factor)
        return f / rf.factor; /* low frequencies: scaled */
    const double s = (rf.original_max / wavelen - rf.low_freq_factor) /
                     (rf.high_freq_factor - rf.low_freq_factor);
    return (1 - s) * f / rf.factor + s * f;
}

/* How a backward op stores an input gradient: GRAD_ADD adds it to what
 * the buffer holds (+=, the convention above); GRAD_SET writes it (=), and
 * the buffer's old contents, garbage or NaN included, are never read.  The
 * first contribution to a fresh gradient SETs it, and the zeroing pass
 * before it goes (a memset of the whole buffer on a GPU); the model's
 * block backward does that for dln, datty, dqkv, dfc_act, dfc and dup.
 * Weight and bias gradients always ADD (micro-batches accumulate).  The CPU
 * backend SETs by zeroing and adding, the same arithmetic (and bits) as
 * the zero + GRAD_ADD it replaces; CUDA's GEMMs SET with beta 0 and its
 * elementwise and attention kernels store instead of adding. */
typedef enum { GRAD_ADD = 0, GRAD_SET = 1 } GradMode;

/* What decode_linear does with the product (backend.h, "decoding"). */
typedef enum { DECODE_BIAS, DECODE_GELU, DECODE_RESIDUAL, DECODE_SWIGLU } DecodeEpi;

/* The norm decode_linear applies to its input rows first: LayerNorm with
 * weight w and bias b (NULL: none), or with rms RMSNorm with weight w; eps
 * as in layernorm_forward / rmsnorm_forward.  With a norm or
 * DECODE_SWIGLU, decode_linear takes at most DECODE_GEMV_ROWS rows: more,
 * and the decoder runs the norm op, the linears and swiglu_forward apart. */
typedef struct {
    const float *w, *b;
    float eps;
    int rms;
} DecodeNorm;
enum { DECODE_GEMV_ROWS = 4 };

/* The attention of one call: which query rows, which key rows, which
 * pairs count.  Rows carry global positions within their sequence: query
 * row t (0 <= t < Tq) is at q_pos0 + t, key row u at k_pos0 + u.  Whole
 * sequences are q_pos0 = k_pos0 = 0, Tq = Tk = T; a sequence split into
 * blocks over ranks (context parallelism) attends block pairs, each call
 * with its own offsets, merged through lse.
 * A query sees key u when
 *   k_pos0 + u <= q_pos0 + t                        (causal), and
 *   k_pos0 + u >= q_pos0 + t - pos[b*Tq + t]        (its own document)
 * pos (backend memory, or NULL: one document per sequence) is the query
 * row's position within its document, as RoPE and learned positions use
 * it: a document starts where pos is 0, so packed documents never see
 * each other.  It is Hugging Face's position_ids of packed sequences. */
typedef struct {
    int B, Tq, Tk, H, KVH, hs;
    int q_pos0, k_pos0;
    const int32_t *pos;
    /* Layout of kv's rows: 0, the fused qkv layout (above); 1, only the
     * key and value heads, [KVH][key, value] of hs each (what a rank sends
     * when it shares its keys and values). */
    int kv_packed;
    /* attention_forward: 1 combines with the out and lse already there. */
    int merge;
    /* attention_backward: GRAD_SET writes every element of dq's query
     * heads and dkv's key and value heads (Tk > 0) instead of adding. */
    GradMode grad;
    /* attention_forward, or NULL: [B*Tq, H*hs] receives bf16_bits of every
     * element of out as the call leaves it (after its merge), in the same
     * pass: the attention projection's GEMM operand, stored in bf16 for
     * its *_x16 ops (Model.x16), with no conversion pass.  out is written
     * as without it (attention_backward reads the fp32 out).  The
     * backward ignores it. */
    uint16_t *out16;
} AttnArgs;

/* Whole sequences of T rows (no offsets, no documents, no merge; the
 * backward adds; no bf16 copy of out). */
static inline AttnArgs attn_args(int B, int T, int H, int KVH, int hs)
{
    AttnArgs a = {B, T, T, H, KVH, hs, 0, 0, NULL, 0, 0, GRAD_ADD, NULL};
    return a;
}

/* A run [lo, hi) of a flat buffer, in elements, for the ops that cover
 * many tensors in one pass (sumsq_ranges, adamw_ranges); `decay`: the
 * run's parameters take weight decay (adamw_ranges only). */
typedef struct {
    size_t lo, hi;
    int decay;
} BackendRange;

/* The scalars of a training step, kept in backend memory so that the host
 * waits for the device once a step, reading them at its end (CUDA: one
 * copy, one synchronization), while the device decides the update by
 * itself: loss_add sums the loss, grad_check the gradient norm, the clip
 * factor and the skip decision, which adamw_ranges reads.  The caller
 * zeroes it at the start of a step.  Doubles, so that the host reads the
 * same values the host path computes. */
typedef struct {
    double loss;       /* sum over loss_add calls: the step's mean loss */
    double sumsq;      /* the gradient's sum of squares (grad_check) */
    double grad_scale; /* clipping's factor (grad_check; 1: not clipped) */
    double skip;       /* 1: the loss or the gradient norm is not finite */
} BackendStepState;

typedef struct {
    const char *name;

    /* ---- memory ----
     * Every buffer an op reads or writes lives in the backend's memory:
     * host memory for the CPU backend, device memory for CUDA (device != 0),
     * where host code must never dereference it.  Code above the backend
     * allocates, clears and moves buffers only through these. */
    int device;
    /* `bytes` of zeroed memory; `what` names the buffer when it fails (fatal). */
    void *(*alloc)(size_t bytes, const char *what);
    void (*release)(void *p); /* NULL is a no-op */
    void (*zero)(void *p, size_t bytes);
    /* dst = src, both backend memory (they may not overlap). */
    void (*copy)(void *dst, const void *src, size_t bytes);
    /* Host <-> backend memory; both return once the host side may be reused
     * (to_host: once the data is there, after every op issued before it). */
    void (*to_backend)(void *dst, const void *host, size_t bytes);
    void (*to_host)(void *host, const void *src, size_t bytes);
    /* The copy stream (CUDA: a stream of its own beside the compute
     * stream, which the ops run on; the CPU backend copies at once and
     * waits for nothing).  Its events are opaque handles: event_create
     * makes one (never NULL), event_destroy frees it (NULL: no-op).
     *
     * to_host_async: start copying src to host (page-locked: host_alloc)
     * on the copy stream once `after` has happened: an event a
     * communicator's operation records when it completes
     * (comm_done_event), or NULL for every op issued before on the compute
     * stream.  The ops issued after it run meanwhile; host_copies_wait
     * returns once every copy on the copy stream is done.  Neither buffer
     * may change until then.  For the gradients of an offloaded optimizer,
     * streamed to the host as their reduction completes during backward.
     *
     * to_backend_copy: the same upward, after every op issued before on
     * the compute stream, recording `done` (an event, or NULL) after the
     * copy; the compute stream does not wait for it unless told
     * (wait_event), and the host buffer must stay unchanged until the next
     * host_copies_wait.  For the weights an offloaded optimizer updated
     * and the parameter shard gathered from host memory.
     *
     * wait_event: the ops issued on the compute stream from now on run
     * after event e's copy (or operation). */
    void *(*event_create)(void);
    void (*event_destroy)(void *e);
    void (*to_host_async)(void *host, const void *src, size_t bytes, const void *after);
    void (*to_backend_copy)(void *dst, const void *host, size_t bytes, void *done);
    void (*wait_event)(const void *e);
    void (*host_copies_wait)(void);
    /* Host memory that to_backend / to_host move fastest (CUDA: page-locked,
     * which the copy engines reach directly); ordinary host memory to the
     * host code.  For buffers that are reused, such as staging: pinning is
     * costly to allocate and limited.  host_release(NULL) is a no-op. */
    void *(*host_alloc)(size_t bytes, const char *what);
    void (*host_release)(void *p);

    /* ---- ops ---- */

    /* out[N,OC] = inp[N,C] @ weight[OC,C]^T (+ bias[OC] when not NULL) */
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC);
    /* dinp[N,C] += dout @ weight (= with dinp_mode GRAD_SET);
     * dweight[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout.  Any of
     * dinp, dweight, dbias may be NULL. */
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC,
                            GradMode dinp_mode);
    /* Grouped linears: G linears over one buffer of rows, in one call (the
     * experts of a MoE layer, src/model/moe.c; CUDA: one grouped GEMM
     * where cuBLAS has it, docs/moe.md).  Group g is rows [off[g],
     * off[g+1]) of inp [off[G], C] and out [off[G], OC] with its own
     * weight w[g] [OC, C] and bias b[g] [OC].  off (G + 1 ints, non-
     * decreasing, off[0] = 0) and the pointer arrays w, b, dw, db (G
     * pointers each) are host memory; the pointers are backend memory.
     * Groups may be empty.  The arithmetic is matmul_forward's and
     * matmul_backward's per group (the CPU backend calls them, group by
     * group, so the same bits as the loop).
     * matmul_grouped_forward: group g's out rows = its inp rows . w[g]^T
     * (+ b[g] when b != NULL).
     * matmul_grouped_backward: matmul_backward of each group, ADDING:
     * dinp's rows of g += dout's rows . w[g], dw[g] += dout^T . inp over
     * g's rows, db[g] += their column sums.  dinp, dw, db may be NULL.
     * Groups may share a gradient (dw[g] == dw[h]: one expert's rows from
     * several ranks under expert parallelism): theirs add, in group
     * order. */
    void (*matmul_grouped_forward)(float *out, const float *inp, const float *const *w,
                                   const float *const *b, const int *off, int G, int C, int OC);
    void (*matmul_grouped_backward)(float *dinp, float *const *dw, float *const *db,
                                    const float *dout, const float *inp, const float *const *w,
                                    const int *off, int G, int C, int OC);
    /* The linear layer and the GELU that reads its output, fused where the
     * backend can (CUDA bf16: one cuBLASLt GEMM with the GELU_AUX_BIAS
     * epilogue, and DGELU for the backward); optional, NULL: the model
     * calls the unfused ops.  The CPU reference is those ops in order, so
     * the same bits.
     * matmul_gelu_forward: pre[N,OC] = matmul_forward(inp, weight, bias)
     * (kept for the backward), out = gelu(pre).
     * matmul_backward_dgelu: matmul_backward of a linear whose input inp
     * [N,C] is gelu(pre): SETS dinp = gelu'(pre) * (dout @ weight), the
     * gradient at pre, where matmul_backward would add dout @ weight at
     * inp; dweight and dbias ADD as in matmul_backward (either may be
     * NULL). */
    void (*matmul_gelu_forward)(float *out, float *pre, const float *inp, const float *weight,
                                const float *bias, int N, int C, int OC);
    void (*matmul_backward_dgelu)(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *pre, const float *weight, int N,
                                  int C, int OC);

    /* ---- GEMM inputs stored in bf16 (docs/design.md, "bf16 activation
     * storage") ----
     * The bf16 tables' way to keep an activation whose every reader is a
     * bf16 GEMM operand (the norms' outputs, GELU(fc) and silu(gate)*up) in
     * 16 bits: its producer writes bf16 bits (bf16_bits of the fp32 value
     * the fp32-output op computes) and the GEMMs read them as they are.
     * A bf16 GEMM rounds its operands to bf16 anyway, so the results are
     * those of the fp32-output ops, bit for bit, with half the bytes and no
     * conversion pass.  Optional: NULL in the fp32 tables (the model keeps
     * fp32 activations there).
     * matmul_forward_x16, matmul_backward_x16, matmul_gelu_forward_x16,
     * matmul_backward_dgelu_x16: the ops above with inp in bf16 (and
     * matmul_gelu_forward_x16's out in bf16; pre stays fp32, since
     * gelu' reads it).  swiglu_forward_x16: swiglu_forward into bf16.
     * norm_forward_x16: residual_norm_forward with out in bf16, or with
     * b == NULL the norm of a alone (res not written). */
    void (*matmul_forward_x16)(float *out, const uint16_t *inp, const float *weight,
                               const float *bias, int N, int C, int OC);
    void (*matmul_backward_x16)(float *dinp, float *dweight, float *dbias, const float *dout,
                                const uint16_t *inp, const float *weight, int N, int C, int OC,
                                GradMode dinp_mode);
    void (*matmul_gelu_forward_x16)(uint16_t *out, float *pre, const uint16_t *inp,
                                    const float *weight, const float *bias, int N, int C, int OC);
    void (*matmul_backward_dgelu_x16)(float *dinp, float *dweight, float *dbias, const float *dout,
                                      const uint16_t *inp, const float *pre, const float *weight,
                                      int N, int C, int OC);
    void (*swiglu_forward_x16)(uint16_t *out, const float *gate, const float *up, size_t n);
    void (*norm_forward_x16)(float *res, uint16_t *out, float *mean, float *rstd, const float *a,
                             const float *b, const float *weight, const float *bias, int N, int C,
                             float eps, int rms);
    /* The head's logits stored in bf16 (docs/design.md, "bf16 activation
     * storage"): one rounding point more than the fp32-storage ops, the
     * logits rounded to bf16 before the softmax (as llm.c).
     * head_forward_x16: logits = bf16_bits(matmul_forward_x16's output,
     * no bias).  crossentropy_x16: on the widened logits, losses (when
     * losses != NULL) as crossentropy_forward, then with grad the logits
     * OVERWRITTEN with bf16_bits of crossentropy_backward's dlogits (max,
     * sum and losses in fp32).  matmul_backward_d16: matmul_backward_x16
     * with dout stored in bf16 (the head's dlogits; SwiGLU's dgate and dup
     * from swiglu_backward_x16), read as it is (no bias; dinp as
     * dinp_mode says).  swiglu_backward_x16: swiglu_backward's dgate and
     * dup SET, stored as their bf16 bits (what the GEMMs that read them
     * rounded them to: the same bits as converting the fp32 ones). */
    void (*head_forward_x16)(uint16_t *logits, const uint16_t *inp, const float *weight, int N,
                             int C, int OC);
    void (*crossentropy_x16)(float *losses, uint16_t *logits, const int32_t *targets, int grad,
                             float dloss, int N, int V, int Vp);
    void (*matmul_backward_d16)(float *dinp, float *dweight, const uint16_t *dout,
                                const uint16_t *inp, const float *weight, int N, int C, int OC,
                                GradMode dinp_mode);
    void (*swiglu_backward_x16)(uint16_t *dgate, uint16_t *dup, const float *dout,
                                const float *gate, const float *up, size_t n);

    /* out[n,c] = wte[tokens[n]-vocab_start, c] (+ wpe[p, c] when wpe != NULL,
     * p = pos[n] with packed documents, else n % T).  Tokens outside
     * [vocab_start, vocab_start+V) give zeros (vocab-parallel). */
    void (*embedding_forward)(float *out, const int32_t *tokens, const int32_t *pos,
                              const float *wte, const float *wpe, int N, int T, int C,
                              int vocab_start, int V);
    void (*embedding_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                               const int32_t *pos, int N, int T, int C, int vocab_start, int V);

    /* LayerNorm over C: out = (x-mean)*rstd*w + b; saves mean[N], rstd[N]. */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C, float eps);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);

    /* RMSNorm over C: out = x*rstd*w; saves rstd[N]. */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight, int N,
                            int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C);

    /* The residual add and the norm that reads its sum, in one pass where
     * the backend can (CUDA: one block per row reads a and b once and
     * writes res and out): res = a + b (add), then layernorm_forward of res
     * into out, mean, rstd (rms 0), or rmsnorm_forward of res into out,
     * rstd (rms 1: mean and bias unused).  res may alias a. */
    void (*residual_norm_forward)(float *res, float *out, float *mean, float *rstd, const float *a,
                                  const float *b, const float *weight, const float *bias, int N,
                                  int C, float eps, int rms);

    /* GELU, tanh approximation (GPT-2); backward: dinp += (or =, GRAD_SET)
     * gelu'(inp) * dout. */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n,
                          GradMode mode);

    /* SwiGLU: out = silu(gate) * up, elementwise over n; backward: dgate
     * and dup (either may be NULL) += (or =, GRAD_SET) their gradients. */
    void (*swiglu_forward)(float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n, GradMode mode);

    /* ---- mixture of experts (src/model/moe.c, docs/moe.md) ----
     * Optional: NULL in a backend without them (the model refuses MoE then).
     * moe_router_forward, per row n of logits [N, E]: probs = softmax,
     * lse = log-sum-exp; idx [N, k] the k experts of the largest
     * probabilities in descending order, ties to the lower expert index (so
     * the routing is a pure function of the logits); w [N, k] their
     * probabilities renormalised to sum 1 over the k (Mixtral's router). */
    void (*moe_router_forward)(float *probs, float *lse, int32_t *idx, float *w,
                               const float *logits, int N, int E, int k);
    /* SETS dlogits [N, E] = the gradient through the softmax of
     *   dw [N, k] (at w, through the renormalisation) plus aux_dp[e] on
     *   every row's d probs[n, e] (the load-balancing loss), plus
     *   z_scale * lse[n] * probs[n, e] added to dlogits (the z-loss
     *   c/N sum lse^2 has d/dlogit = 2c/N lse p: z_scale = 2c/N). */
    void (*moe_router_backward)(float *dlogits, const float *dw, const float *probs,
                                const float *lse, const int32_t *idx, const float *w,
                                const float *aux_dp, float z_scale, int N, int E, int k);
    /* Dispatch: out[r] = inp[slot[r] / k] for r < R (rows [*, C]; slot[r] =
     * n*k + j is token n's j-th choice). */
    void (*moe_gather)(float *out, const float *inp, const int32_t *slot, int R, int C, int k);
    /* Its backward: dinp[slot[r] / k] += dout[r], in order of r. */
    void (*moe_scatter_add)(float *dinp, const float *dout, const int32_t *slot, int R, int C,
                            int k);
    /* Combine: out[slot[r] / k] += w[slot[r]] * y[r], in order of r. */
    void (*moe_combine_forward)(float *out, const float *y, const float *w, const int32_t *slot,
                                int R, int C, int k);
    /* Its backward: SETS dy[r] = w[slot[r]] * dout[slot[r] / k] and
     * dw[slot[r]] = dout[slot[r] / k] . y[r] (slots not in slot[0 .. R) are
     * not written: the caller zeroes dw for dropped tokens). */
    void (*moe_combine_backward)(float *dy, float *dw, const float *dout, const float *y,
                                 const float *w, const int32_t *slot, int R, int C, int k);

    /* Rotary embedding, in place on the q and k heads of a qkv buffer
     * [N, (H + 2*KVH)*hs] (layout above).  Row n's position is pos[n] when
     * pos != NULL (packed documents: positions restart at each document),
     * else pos0 + n % T (pos0: the global position of a sequence shard's
     * first row; 0 for whole sequences).  Backward applies the inverse
     * rotation to dqkv in place. */
    void (*rope_forward)(float *qkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                         int hs, RopeFreq rf);
    void (*rope_backward)(float *dqkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                          int hs, RopeFreq rf);

    /* Causal self-attention, in the form of flash attention: nothing of size
     * Tq x Tk is kept.  One call attends the query rows of a qkv buffer q
     * [B*Tq, (H+2*KVH)*hs] (only its query heads are read) to the key and
     * value rows of kv [B*Tk, ...] (only their key and value heads are
     * read; the layout is AttnArgs.kv_packed's), which may be the same
     * buffer.  out [B*Tq, H*hs] (heads in order), scale 1/sqrt(hs).
     * Which keys a query sees is AttnArgs's rule (causal by global
     * position, within its document).  lse [B, H, Tq] receives each query
     * row's log-sum-exp of its scaled scores over the keys it sees,
     * log sum_u exp(q_t.k_u * scale) (-inf and out 0 where it sees none),
     * from which backward recomputes p[t,u] = exp(q_t.k_u * scale - lse[t]).
     * With a.merge, out and lse hold on entry the result over other keys
     * (an earlier block of a sequence split over ranks), and the two are
     * combined exactly: lse = log(exp(lse) + exp(lse_block)), out the
     * average of the two outputs weighted by exp(lse_part - lse).  With
     * a.out16, out's bf16 bits too (AttnArgs). */
    void (*attention_forward)(float *out, float *lse, const float *q, const float *kv,
                              const AttnArgs *a);
    /* dq (q's layout; query heads) and dkv (kv's layout; key and value
     * heads) += the gradient through one call's attention, given dout and
     * the FINAL out and lse (after every merge: then p and D_t = dout_t .
     * out_t = sum_u p dp are those of the whole softmax, and the gradients
     * of the blocks add up to the whole).  dq may equal dkv when q equals kv
     * (the heads written are disjoint).  a.merge is ignored; a.grad:
     * GRAD_SET writes dq and dkv instead. */
    void (*attention_backward)(float *dq, float *dkv, const float *dout, const float *q,
                               const float *kv, const float *out, const float *lse,
                               const AttnArgs *a);

    /* ---- decoding: generation with a key/value cache, one sequence ----
     * rope_decode: rope_forward's rotation of n qkv rows at positions
     * pos0 .. pos0 + n - 1.
     * attention_decode: n new qkv rows at positions p0 .. p0 + n - 1
     * (RoPE applied) write their key and value heads into the caches
     * kcache, vcache [positions][KVH][hs] at their positions, then each
     * row's query heads attend causally to cache rows 0 .. its own
     * position: out [n, H*hs], heads in order.  For those rows this is
     * attention_forward's output over the whole sequence, without
     * recomputing the earlier rows' keys and values.  p0 is *at (backend
     * memory, read by the op: a position the device advances, so that a
     * captured step's arguments do not change, docs/cuda.md "Decoding")
     * when at is not NULL, else pos0.
     * decode_choose: the next token from logits [V] (backend memory), into
     * state[1], and state[0] += n.  state (backend memory) is the decoder's
     * position (state[0]) and its next input id (state[1]).  temperature
     * <= 0: the argmax (the first of equal maxima); else the token drawn
     * from softmax(logits / temperature) with the uniform number
     * u[state[0] + n] (backend memory, doubles), as trident generate draws
     * one without top-k or top-p (generate.c, next_token: the weights
     * exp((logit - max) / temperature) rounded to float, summed in double,
     * the first token whose running sum passes u * sum, V - 1 if none).
     * The CPU backend sums in token order; CUDA sums in its own order, so
     * a draw within rounding (about 1e-16 of the sum) of a boundary may
     * fall the other way. */
    void (*rope_decode)(float *qkv, int n, int pos0, int H, int KVH, int hs, RopeFreq rf);
    void (*attention_decode)(float *out, const float *qkv, float *kcache, float *vcache, int n,
                             const int32_t *at, int pos0, int H, int KVH, int hs);
    void (*decode_choose)(int32_t *state, const float *logits, int V, double temperature,
                          const double *u, int n);
    /* The decoder's linear layer and what follows it, in one launch where
     * the backend can (CUDA, a few rows: a GEMV kernel, docs/cuda.md
     * "Decoding"); optional, NULL: the decoder runs matmul_forward, then
     * gelu_forward or add, in that order (the CPU backend, whose bits
     * generation keeps; the bf16 tables, whose GEMMs round to bf16).
     * p = x [n, C] . w [OC, C]^T (+ b [OC] when b != NULL), then
     * DECODE_BIAS: out = p; DECODE_GELU: out = gelu(p); DECODE_RESIDUAL:
     * out += p (the residual stream); DECODE_SWIGLU (n <= DECODE_GEMV_ROWS):
     * out = silu(p) * (x . up [OC, C]^T), swiglu_forward's (up NULL with
     * the others).  out [n, OC] does not overlap x.
     * norm not NULL (n <= DECODE_GEMV_ROWS): x's rows are normed first,
     * and p is the product of layernorm_forward's or rmsnorm_forward's
     * output (its mean and rstd are not kept), the norm computed inside
     * the op (CUDA: by every block, from L2), so a norm and the linear
     * after it are one launch. */
    void (*decode_linear)(float *out, const float *x, const DecodeNorm *norm, const float *w,
                          const float *up, const float *b, int n, int C, int OC, DecodeEpi epi);
    /* A CUDA graph of the ops issued between graph_begin and graph_end
     * (CUDA: stream capture of the ops' stream); optional, NULL where the
     * ops run as they are issued (the CPU backend).  While capturing, the
     * ops are recorded with their arguments, not run, and nothing may wait
     * for the device or copy.  graph_end returns the graph ready to launch,
     * or NULL when capture or instantiation failed (then nothing ran and
     * the caller issues the ops again); graph_launch runs it on the ops'
     * stream, in order with the ops around it; graph_free(NULL) is a no-op. */
    void (*graph_begin)(void);
    void *(*graph_end)(void);
    void (*graph_launch)(void *g);
    void (*graph_free)(void *g);

    /* Fused softmax + cross-entropy over a [N, Vp] logits buffer of which
     * only the first V columns are real (padding never counts).
     * losses[n] = -log softmax(logits[n])[targets[n]].  Targets < 0 are
     * ignored (loss 0, no gradient).  Backward OVERWRITES logits with
     * dlogits = (softmax - onehot) * dloss, so probabilities are never
     * stored separately. */
    void (*crossentropy_forward)(float *losses, const float *logits, const int32_t *targets, int N,
                                 int V, int Vp);
    void (*crossentropy_backward)(float *logits, const int32_t *targets, float dloss, int N, int V,
                                  int Vp);
    /* crossentropy_forward then crossentropy_backward with dloss, in one
     * pass per row where the backend can (CUDA: one kernel reads each row
     * of logits once for its max and sum and writes dlogits in place, as
     * llm.c's fused classifier): losses and dlogits as the two calls give
     * them, for a forward whose backward follows at once (training). */
    void (*crossentropy_fused)(float *losses, float *logits, const int32_t *targets, float dloss,
                               int N, int V, int Vp);
    /* s->loss += share * mean, mean the fp32 mean of losses[n] over the
     * rows with targets[n] >= 0 (summed in double; 0 when there is none):
     * model_head_forward's loss, kept in backend memory. */
    void (*loss_add)(BackendStepState *s, const float *losses, const int32_t *targets, int N,
                     float share);

    /* Vocabulary-parallel cross-entropy (src/tensor_par/vocab_parallel.c):
     * the loss over a vocabulary split across TP ranks, in passes around
     * two all-reduces of per-row statistics.  logits [N, Vp] hold this
     * rank's vocabulary rows; the first V columns are real and are global
     * ids [vocab_start, vocab_start + V).  stats is [3N]: mx, sum, tgt.
     *   vocab_max:      mx[n] = max of the V columns (-inf when V == 0);
     *                   then the caller all-reduces mx with max.
     *   vocab_sumexp:   sum[n] = sum over the V columns of exp(x - mx[n]);
     *                   tgt[n] = x[n, targets[n] - vocab_start] when that
     *                   column is here (targets[n] >= 0), else 0;
     *                   then the caller all-reduces sum and tgt (2N) with sum.
     *   vocab_loss:     losses[n] = targets[n] < 0 ? 0
     *                                : log(sum[n]) + mx[n] - tgt[n].
     *   vocab_backward: OVERWRITES logits with dlogits: for v < V
     *                   exp(x - mx[n]) * dloss / sum[n], minus dloss at the
     *                   target's column when it is here; 0 for v >= V; the
     *                   whole row 0 when targets[n] < 0. */
    void (*vocab_max)(float *stats, const float *logits, int N, int V, int Vp);
    void (*vocab_sumexp)(float *stats, const float *logits, const int32_t *targets, int N, int V,
                         int Vp, int vocab_start);
    void (*vocab_loss)(float *losses, const float *stats, const int32_t *targets, int N);
    void (*vocab_backward)(float *logits, const float *stats, const int32_t *targets, float dloss,
                           int N, int V, int Vp, int vocab_start);

    /* y[r, c] += bias[c] for r < rows: a replicated bias added once, after
     * the sum of a row-parallel layer. */
    void (*add_bias)(float *y, const float *bias, int rows, int C);
    /* out = a + b (residual), n elements; out may alias a. */
    void (*add)(float *out, const float *a, const float *b, size_t n);
    /* y += x */
    void (*accumulate)(float *y, const float *x, size_t n);
    /* sum of squares, accumulated in double */
    double (*sumsq)(const float *x, size_t n);
    /* The sum over ranges[0 .. n) (host memory) of sumsq(x + lo, hi - lo):
     * the gradient norm of many tensors in one pass (CUDA: one reduction
     * and one read, not one per tensor).  Deterministic: the same input
     * gives the same bits; the CPU adds the ranges' sumsq in order. */
    double (*sumsq_ranges)(const float *x, const BackendRange *ranges, int n);
    /* The step's gradient decision in backend memory, from sumsq_ranges
     * over the gradient g and the loss in s: s->sumsq = the sum of squares;
     * s->skip = 1 when s->loss or sqrt(s->sumsq) is not finite, else 0;
     * s->grad_scale = clip / (float)(norm + 1e-6) (in fp32) when clip > 0
     * and norm > clip and not skipped, else 1: the trainer's host
     * arithmetic (trainer.c), on the device. */
    void (*grad_check)(BackendStepState *s, const float *g, const BackendRange *ranges, int n,
                       float clip);
    /* x *= s */
    void (*scale)(float *x, float s, size_t n);
    /* dst[i] = the fp32 value of bf16 bits src[i] (exact: bf16 is fp32's
     * upper half), for weights stored in 16 bits (model.lora.base_dtype) */
    void (*widen_bf16)(float *dst, const uint16_t *src, size_t n);
    /* Dropout with counter-based masks (model.lora.dropout), in place on
     * x [N, n] (this rank's columns from global column col0): element
     * (i, j), global column c = col0 + j, is zeroed when word c % 4 of
     * rng_philox(counter = (rows[i], c / 4), key) is below p x 2^32, else
     * multiplied by 1 / (1 - p) (in fp32).  rows [N] (backend memory) are
     * the rows' places in the token stream.  A pure function of its
     * arguments: the CUDA kernel draws the CPU's masks, bit for bit. */
    void (*dropout_philox)(float *x, const uint64_t *rows, int N, int n, int col0, uint64_t key,
                           float p);

    /* AdamW on n elements, decoupled weight decay, with g = grad * grad_scale
     * (gradient clipping's factor, applied in this pass rather than in a
     * pass of its own over the gradients, which are left as they are):
     *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
     *   p -= lr * ( mhat / (sqrt(vhat) + eps) + wd * p )
     * with bias corrections for step t (1-based).  `master` holds fp32
     * master weights; `param` receives the updated weights (rounded to bf16
     * when round_bf16).  param may equal master (fp32 training). */
    void (*adamw)(float *param, float *master, const float *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t, int round_bf16);
    /* adamw over every range of the flat buffers (ranges in host memory,
     * offsets into param, master, grad, m and v), with weight_decay where
     * the range's decay is set and 0 elsewhere: the same arithmetic per
     * element as adamw, so the same bits, in one pass over all the tensors
     * (CUDA: one launch instead of one per tensor). */
    /* With state != NULL (backend memory, grad_check's): nothing changes
     * when state->skip, and the gradient scale is grad_scale *
     * (float)state->grad_scale: the update decided on the device. */
    void (*adamw_ranges)(float *param, float *master, const float *grad, float *m, float *v,
                         const BackendRange *ranges, int n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, float grad_scale, int t, int round_bf16,
                         const BackendStepState *state);

    /* A bf16 copy of the weights for the bf16 GEMMs (docs/cuda.md, "bf16
     * weight copy").  weights_bf16: convert [params, params + n) (backend
     * memory, the flat parameter buffer) to bf16 once, into a buffer of
     * the backend's; until weights_bf16_drop, a bf16 GEMM whose weight
     * lies wholly inside the range reads its place in the copy instead of
     * converting the weight itself (any other weight is converted as
     * before).  The same rounding either way, so the same results, as long
     * as the caller leaves the fp32 weights unchanged in between: the
     * trainer makes the copy before a step's first forward and drops it
     * before the optimizer step.  Optional: NULL where the GEMMs convert
     * nothing (the fp32 tables, the CPU). */
    void (*weights_bf16)(const float *params, size_t n);
    void (*weights_bf16_drop)(void);
} Backend;

/* The CPU reference backend. */
const Backend *backend_cpu(void);
/* The same with bf16 GEMMs (training.precision: bf16): matmul_forward and
 * matmul_backward multiply the operands rounded to bf16 (bf16_round: inp,
 * weight and dout), with fp32 products and sums, which is what a tensor
 * core does with bf16 inputs and fp32 accumulation.  A product of two bf16
 * values is exact in fp32, so a GPU's result differs from this one by the
 * order of the sums only.  dbias stays the fp32 sum of dout.  The other
 * ops are backend_cpu()'s. */
const Backend *backend_cpu_bf16(void);

/* Round an fp32 value to the nearest bf16 (ties to even), returned as fp32. */
float bf16_round(float x);
/* The same as bf16 bits (the upper half of bf16_round(x)'s). */
uint16_t bf16_bits(float x);

/* FLOPs of the matrix multiplies the CPU backend ran since the last reset
 * (2*N*C*OC per product, forward and each backward product): the shapes
 * executed, for checking model FLOP counts.  Not thread-safe; one add per
 * call. */
double backend_cpu_gemm_flops(void);
void backend_cpu_gemm_flops_reset(void);

#endif
