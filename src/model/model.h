/* model.h — GPT-2 and Llama-style decoder, forward and hand-written backward.
 *
 * GPT-2: learned positions, pre-LayerNorm, GELU MLP, biases, tied embeddings.
 * Llama: RMSNorm, SwiGLU MLP, RoPE, grouped-query attention, no biases,
 *        untied embeddings (unless model.tie_embeddings says otherwise).
 *
 * Memory is flat and explicit (docs/design.md): parameters and gradients are one
 * allocation each, carved by the parameter table; activations are one
 * allocation carved per layer from a fixed table of sizes.  The model never
 * allocates during a step.
 *
 * The model is written in three parts so that a pipeline stage can run only
 * its own: embed (first stage), the blocks of its one chunk of consecutive
 * layers (ParamShard.chunk[0]), head (final norm, logits, loss: last stage).
 * An interleaved stage holds one model per chunk (zero.h). */
#ifndef TRD_MODEL_H
#define TRD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "config/config.h"
#include "model/params.h"

/* Named byte counts per memory category, for the start-up report (bytes
 * the model itself allocated; buffers bound from outside are not counted). */
typedef struct {
    size_t params, grads, master, optimizer, buffers, activations, scratch;
    size_t frozen;         /* LoRA: the frozen base weights (params: the adapters) */
    size_t host_optimizer; /* topology.offload: optimizer state in host memory, not above */
} MemoryReport;

typedef struct Model Model;

/* The RoPE frequencies of a model config, computed once per model and
 * passed to the rope ops (arch llama; scaling only with
 * model.rope_scaling). */
RopeFreq model_rope_freq(const ModelConfig *mc);

/* Build a model for this shard and micro-batch size B (sequences of
 * cfg->model.seq_len, whole: no context parallelism, whatever the config
 * says; for inference and tests).  Parameters are initialised from
 * cfg->run.seed. */
Model *model_create(const Config *cfg, const Backend *be, const ParamShard *sh, int B);
void model_free(Model *m);

/* The same without parameter and gradient storage (ZeRO owns it): every
 * group must be bound with model_bind before it runs, and parameters are
 * not initialised here.  model_param_buffer/model_grad_buffer return NULL.
 * This is the trainer's model: with topology.cp > 1 it holds this rank's
 * two chunks of each of the B sequences (cp_attention.h's layout: the rows
 * of chunk 0 of every sequence, then those of chunk 1), needs
 * model_set_context_parallel and, before every forward, model_set_positions
 * with the global positions of its rows (or, with documents, their
 * positions in their document). */
Model *model_create_unbound(const Config *cfg, const Backend *be, const ParamShard *sh, int B);

/* Point a group's tensors (PARAMS_OUTER or a global layer index) at storage
 * holding the group's flat range [lo, hi) of params_group_range: tensor p is
 * then at params + (p->offset - lo).  NULL keeps that side's binding. */
void model_bind(Model *m, int group, float *params, float *grads);
/* With the experts divided over ep (ParamShard.ep > 1), layer l's stacked
 * experts are the group PARAMS_EXPERTS(l), bound apart from the layer:
 * params and grads hold its range (NULL: leave that binding).  A no-op for
 * a layer without divided experts. */
void model_bind_experts(Model *m, int l, float *params, float *grads);

const ParamTable *model_params(const Model *m);
/* LoRA (model.lora.rank > 0): the frozen base weights' table and their
 * buffer (backend memory, model_params' layout rules), which the caller
 * may overwrite (a base checkpoint) before the first forward; NULL
 * without LoRA. */
const ParamTable *model_base_params(const Model *m);
float *model_base_buffer(Model *m); /* NULL also with model.lora.base_dtype bf16 */
/* LoRA: set the frozen base from host memory (fp32 values, model_base_params'
 * layout): copied, or with model.lora.base_dtype bf16 rounded to bf16 (to
 * nearest even) and stored as such. */
void model_load_base(Model *m, const float *host);
/* The bytes model.lora's frozen base takes on a rank holding shard sh:
 * 4 per weight (fp32), or 2 per weight plus the fp32 scratch of its largest
 * group (bf16); 0 without LoRA.  The memory report and the planner both. */
size_t model_frozen_bytes(const ModelConfig *mc, const ParamShard *sh);
/* LoRA: add (alpha/r) B A into each adapted base weight and drop the
 * adapters from forward (generate and export run the merged model; no
 * backward after it).  Reads the bound adapters.  No-op without LoRA. */
void model_lora_merge(Model *m);
float *model_param_buffer(Model *m); /* [params.numel] */
float *model_grad_buffer(Model *m);  /* [params.numel] */
MemoryReport model_memory(const Model *m);

/* Forward one micro-batch: tokens and targets are [B*T].  Returns the mean
 * cross-entropy over the B*T positions (targets < 0 are ignored and not
 * counted).  Keeps the activations backward needs. */
float model_forward(Model *m, const int32_t *tokens, const int32_t *targets);

/* Backward of the last forward.  ADDS d(loss_scale * mean loss)/d(param)
 * into the gradient buffer, so micro-batches accumulate (loss_scale is
 * 1/micro_batches for gradient accumulation). */
void model_backward(Model *m, float loss_scale);

void model_zero_grad(Model *m);

/* The three parts model_forward/model_backward chain, for pipeline stages.
 * The residual stream [B*T, C] enters the chunk's first layer at
 * model_stage_input() (written by the embedding, or received from the
 * previous stage) and leaves its last layer at model_stage_output() (read by the head, or sent).
 * Backward carries d loss / d stream in model_grad_stream(): the head SETS
 * it, each block maps it from its output to its input in place, and the
 * embedding reads it; a middle stage receives its output gradient there
 * before its first block backward and sends it after its last.  l is the
 * global layer index.  Backward of the head overwrites the logits, so each
 * forward has exactly one backward. */
void model_embed_forward(Model *m, const int32_t *tokens);
void model_block_forward(Model *m, int l);
float model_head_forward(Model *m, const int32_t *targets); /* mean loss */
void model_head_backward(Model *m, float loss_scale);
/* Training: the next head forward's backward follows with loss_scale, so
 * the forward computes the loss and the logits' gradient in one pass
 * (the backend's crossentropy_fused; not with a vocabulary split over TP
 * ranks) and model_head_backward starts from there.  For the next head
 * forward only. */
void model_head_fuse(Model *m, float loss_scale);
/* s (backend memory, or NULL): a fused head forward (model_head_fuse)
 * adds loss_scale times its mean loss to s->loss (the backend's loss_add)
 * and returns 0, instead of reading the losses back to the host, which
 * waits for the device.  The trainer reads s once a step. */
void model_set_step_state(Model *m, BackendStepState *s);
/* Backend memory for that state, in the model's scratch (so in its memory
 * report and its plan), on the rank that holds the head; NULL elsewhere. */
BackendStepState *model_step_state(Model *m);
void model_block_backward(Model *m, int l);
void model_embed_backward(Model *m);
float *model_stage_input(Model *m);
float *model_stage_output(Model *m);
float *model_grad_stream(Model *m);

/* Mixture of experts (docs/moe.md).  The next backward's loss scale, for
 * the router's load-balancing and z-losses (which enter the gradient in
 * the MoE layers, on every pipeline stage, not through the head): set by
 * model_backward and by the ZeRO driver before each block backward. */
void model_set_loss_scale(Model *m, float loss_scale);

/* What the forwards of the MoE layers held here saw since the last call
 * (recomputation in backward not counted): sums over layers and
 * micro-batches, to be added over ranks before use. */
typedef struct {
    double aux_sum, z_sum; /* load-balancing and z-loss values, before coefficients */
    double layers;         /* (layer, micro-batch) pairs counted */
    double tokens_min;     /* fewest assignments one expert got in one (layer, micro-batch) */
    double tokens_max;     /* most */
    double dropped;        /* assignments over capacity */
} MoeStats;
MoeStats model_take_moe_stats(Model *m);

/* Local (tensor-parallel piece of the) padded vocabulary: logits columns. */
int model_vocab_padded(const Model *m);

/* Tensor parallelism.  A model built for a shard with tp > 1 (and, when
 * cfg->topology.sequence_parallel, with sequence parallelism: decided at
 * creation, since it sizes the buffers) needs its TP group's communicator
 * before the first step: tp->size and tp->rank must equal the shard's tp
 * and tp_rank.  Collective over tp (it may split off the group of ranks
 * sharing replicated kv heads); tp may be NULL for tp = 1.  The model keeps
 * the pointer: tp must outlive it (and model_free must run before
 * MPI_Finalize).  Forward returns the loss of the whole micro-batch, equal
 * on all TP ranks; after backward every replicated tensor's gradient is
 * complete and equal on all TP ranks (model.c says per tensor how). */
void model_set_tensor_parallel(Model *m, Comm *tp);

/* The context-parallel group (its size topology.cp of the config the model
 * was created with); it must outlive the model, like tp. */
void model_set_context_parallel(Model *m, Comm *cp);
/* The expert-parallel group (topology.ep of the config the model was
 * created with ranks; the trainer's TopologyComms.ep): each MoE layer runs
 * experts [rank * E / ep, (rank + 1) * E / ep) on the token rows every
 * member routed to them (all-to-all, src/model/moe.c).  Every member must
 * run the same forwards and backwards in the same order.  It must outlive
 * the model, like tp.  Without the call a model created with ep > 1 is a
 * configuration error at its first MoE forward. */
void model_set_expert_parallel(Model *m, Comm *ep);
/* Seconds its context-parallel exchange took since the last call. */
double model_take_cp_seconds(Model *m);

/* Activation sets: one per micro-batch a pipeline stage holds between its
 * forward and its backward (default 1).  Setting the count reallocates
 * them (call before training); model_use_activation_set(k) selects the set
 * the next forward fills or the next backward reads. */
void model_set_activation_sets(Model *m, int n);
void model_use_activation_set(Model *m, int k);

/* Packed documents (data.document_mask): pos [B*T] in host memory, each
 * token's position within its document (0 where one starts, see
 * batch_positions), for the next forward and backward of the selected
 * activation set: attention stays within a document, RoPE and learned
 * positions count from its start.  NULL: each sequence is one document. */
void model_set_positions(Model *m, const int32_t *pos);
/* LoRA adapter dropout (model.lora.dropout > 0; model.c: lora_dropout):
 * rows [N] (host memory the caller keeps until the micro-batch's backward
 * is done) gives each row of the next forward, in this model's row order,
 * its place in the token stream: (sample stream position) x seq_len +
 * (position in the sequence), which keys its dropout mask.  Kept in the
 * selected activation set for its backward.  model_set_positions clears
 * it: a forward that does not call this after it (validation) drops
 * nothing, as one never set (eval, generate). */
void model_set_dropout_rows(Model *m, const uint64_t *rows);

/* Rows of the residual stream this rank holds: B*T, or B*T / tp with
 * sequence parallelism (this rank's block of the b-major token rows).
 * model_stage_input/output and model_grad_stream are [rows, hidden]. */
int model_stream_rows(const Model *m);

/* Model FLOPs of one forward+backward over B*T tokens: 6 * (matmul params)
 * per token plus attention (12 * layers * T * hidden per token, causal
 * halving not applied, as in the PaLM/Megatron MFU convention). */
double model_flops_per_token(const ModelConfig *mc);

/* ---- Decoding: generation with a key/value cache (decode.c) ----
 * A Decoder runs a whole model (tp 1, one pipeline stage: model_create
 * with the shard of pp rank 0 of 1, and its weights) over one sequence of
 * at most max_len <= model.seq_len tokens.  decoder_step feeds n new
 * tokens at positions decoder_pos() .. +n-1 (a prompt at once, then one
 * token at a time) and returns the logits of the last one, [vocab] real
 * columns in host memory (valid until the next step).  Keys and values of
 * every layer stay in backend memory, so a token costs one pass over the
 * weights and the cache: the earlier tokens are not recomputed. */
typedef struct Decoder Decoder;
Decoder *decoder_create(Model *m, int max_len);
void decoder_free(Decoder *dc);
const float *decoder_step(Decoder *dc, const int32_t *tokens, int n);
int decoder_pos(const Decoder *dc);
int decoder_max_len(const Decoder *dc);
int decoder_vocab(const Decoder *dc);
/* Start a new sequence (the cache is overwritten from position 0). */
void decoder_reset(Decoder *dc);
/* A token drawn from softmax(logits / temperature) over [0, V) with the
 * uniform number u in [0, 1) (the argmax when temperature is 0). */
int decoder_sample(const float *logits, int V, float temperature, double u);
/* Tokens chosen on the backend (decode.c, decode_choose in backend.h), the
 * logits never read by the host.  decoder_sampling: how; temperature <= 0
 * the argmax, else draws with u[i] (host memory, max_len + 1 numbers in
 * [0, 1)) for the token at position i, as trident generate draws them
 * without top-k or top-p.  decoder_next feeds n tokens (host memory), or
 * with tokens NULL and n 1 the token it chose last, and returns the next
 * token.  A decoder_step in between must feed that token itself.
 * decoder_graphed: whether the one-row steps run as one CUDA graph. */
void decoder_sampling(Decoder *dc, double temperature, const double *u);
int decoder_next(Decoder *dc, const int32_t *tokens, int n);
int decoder_graphed(const Decoder *dc);
/* The logits the last token was chosen from, read back (for checks: a
 * copy and a wait), valid until the next step. */
const float *decoder_logits(Decoder *dc);

/* For the planner (src/plan): what model_create_unbound(cfg, be, sh, B)
 * followed by model_set_activation_sets(m, n_sets) allocates, computed
 * from the same size tables without allocating it.  Fills activations and
 * scratch as model_memory would report them (fp32 bytes); the rest is 0.
 * sh is one chunk, as for model_create_unbound. */
MemoryReport model_plan_memory(const Config *cfg, const ParamShard *sh, int B, int n_sets);

#endif
