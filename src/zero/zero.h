/* zero.h — data parallelism and ZeRO sharding over the DP group.
 *
 * The flat parameter buffer of a rank (P elements: its TP/PP piece of the
 * model) is sharded in blocks of S = ceil(P / dp) elements: DP rank r owns
 * [r*S, (r+1)*S) ∩ [0, P).  No padding is stored: the last ranks' parts are
 * just shorter.  What each stage keeps (P = parameters, N = dp):
 *
 *   stage  params      grads                      optimizer (m, v [, master])
 *   0      P           P, all-reduced in buckets  P
 *   1      P           P, reduce-scattered -> S   S   then params all-gathered
 *   2      P           layer slots -> S           S   then params all-gathered
 *   3      S (+slots)  layer slots -> S           S   layers gathered before use
 *
 * Stages 0 and 1 accumulate micro-batches locally and reduce once, on the
 * last micro-batch, bucket by bucket as backward finishes them (buckets of
 * about topology.bucket_mb MiB, whole layers, in backward order; a bucket
 * starts when all its layers have their final gradient), so the reduction
 * of late layers overlaps the backward of early ones.  Stages 2
 * and 3 keep no full gradient: each layer's gradient is computed into one
 * of two slots and reduce-scattered into the owners' shards on every
 * micro-batch (the ZeRO-2 trade: less memory, more traffic with
 * accumulation).  Stage 3 gathers each layer's parameters into one of two
 * slots just before its forward and its backward, prefetching the next
 * layer's; the outer tensors (embeddings, head) are gathered once a step.
 *
 * Gradients are pre-scaled by 1/(micro-batches * dp), so the sum over DP is
 * the mean over the global batch.
 *
 * topology.offload: optimizer+params (stage 3 only): the parameter shard S
 * is not in device memory but in the optimizer's page-locked host buffers
 * (optimizer.h).  What stays on the device: the gradient shard (the
 * reduce-scatters accumulate into it over micro-batches), the gradient and
 * parameter slots with their receive space, and nothing else of the
 * weights: a gather copies this rank's part of the layer from the host into
 * its place in the slot on the backend's copy stream and all-gathers in
 * place after that copy (comm_after).
 *
 * With any offload the gradients go to the optimizer's host staging
 * buffer part by part as they are final, on the backend's copy stream
 * (to_host_async) while backward goes on: stages 0-1 each bucket as its
 * reduction completes (data_par/grads.h: the whole bucket with ZeRO 0,
 * this rank's part of it with ZeRO 1), stages 2-3 each part of the
 * gradient shard as its last micro-batch's reduction is added.  The step
 * waits once for those copies instead of copying the gradients itself.
 * The updated weights go up on the copy stream too, and the compute
 * stream waits for them where they are first read (stage 0: each layer's
 * before its forward; stages 1-2: before the all-gather; stage 3: before
 * the first gather). */
#ifndef TRD_ZERO_H
#define TRD_ZERO_H

#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "config/config.h"
#include "model/model.h"
#include "zero/optimizer.h"

typedef struct Zero Zero;

/* What a stage keeps whole ([0, P) on every DP rank) and what it shards
 * (this rank's block only): the table above, as data.  The checkpoint's
 * view, the planner's memory and the engine itself all read it here. */
typedef struct {
    int params;    /* the weights */
    int grads;     /* a full gradient buffer (stages 0-1; stage 1 also keeps a shard) */
    int optimizer; /* m, v and the fp32 master weights */
} ZeroWhole;
ZeroWhole zero_stage_whole(int stage);

/* DP rank r's block of a P-element buffer over dp ranks: [r*S, (r+1)*S)
 * cut to [0, P), S = ceil(P / dp). */
void zero_block(size_t P, int dp, int r, size_t *lo, size_t *hi);

/* Byte counts of what the engine allocated. */
typedef struct {
    size_t params, grads, optimizer, buffers; /* buffers: slots and receive space */
    size_t host_optimizer; /* topology.offload: the state in host memory (optimizer is 0) */
} ZeroMemory;

/* Per-step timing: seconds spent waiting for communication that did not
 * overlap compute, and payload bytes handed to collectives. */
typedef struct {
    double exposed_comm_s;
    uint64_t bytes;
} ZeroStats;

/* The engine for this rank's shard sh: models[c] is chunk c's model, made
 * with model_create_unbound over params_chunk_shard(sh, c) (the caller
 * owns them and frees them after zero_free); the engine binds them to its
 * flat buffers, initialises the weights from the seed and makes the
 * optimizer state of its part.  dp is the data-parallel group; embed the
 * embedding group when this rank holds a tied embedding split over
 * pipeline stages (stages 0-1 only), else NULL; ep and edp the expert
 * (data) parallel groups, below.
 *
 * Where expert parallelism divides the experts' memory
 * (config_ep_divides: a MoE model, topology.ep > 1, no offload, no LoRA;
 * any stage) the trainer gives zero_create a shard with ep and ep_rank
 * set (params.h): a rank holds the weights, gradients and optimizer state
 * of its ep rank's E / ep experts only, in the flat buffers' expert region
 * [Pd, P), whose gradients are reduced over edp (topology.h: the dp / ep
 * ranks with the same ep rank), with the table above applied to the
 * region over edp:
 *   ZeRO 0: all-reduced, each layer's experts (PARAMS_EXPERTS(l)) as
 *     soon as the layer's backward of the step's last micro-batch is
 *     done, overlapped with the rest of backward (and counted in the
 *     gradient norm once over ep);
 *   ZeRO 1: reduce-scattered the same way, layer by layer, into blocks of
 *     the region over edp, which a second optimizer steps (its state in
 *     the same buffers, after the dense block's) and edp all-gathers;
 *   ZeRO 2: the same blocks and optimizer, but each layer's experts get
 *     a gradient slot beside the layer's and are reduce-scattered over
 *     edp per layer and micro-batch, overlapped, as the layer's are over
 *     dp;
 *   ZeRO 3: the weights too are kept as the rank's block of the region
 *     (after the dense block in the parameter shard), and each layer's
 *     experts are gathered over edp into parameter slots of their own
 *     beside the layer's, before its forward and its backward.
 * The dense region [0, Pd) is reduced and sharded over dp as without ep.
 * Else every rank holds every expert (Pd = P) and ep, edp may be NULL. */
Zero *zero_create(const Config *cfg, const Backend *be, const ParamShard *sh, Model *const *models,
                  Comm *dp, Comm *embed, Comm *ep, Comm *edp);
void zero_free(Zero *z);
/* The model of the first chunk (the only one unless interleaved). */
Model *zero_model(Zero *z);
int zero_chunks(const Zero *z);
Model *zero_chunk_model(Zero *z, int c);
/* The rank's parameter table: every chunk's layers, the flat buffers' layout. */
const ParamTable *zero_params(const Zero *z);
/* The backend whose memory holds every buffer of the engine and its models. */
const Backend *zero_backend(const Zero *z);

/* Start a step: zero gradients; stage 3 gathers the outer tensors. */
void zero_begin_step(Zero *z);
/* Forward and backward of one micro-batch; returns its mean loss.
 * last_micro tells stages 0-1 that gradients are final after this one. */
float zero_forward_backward(Zero *z, const int32_t *tokens, const int32_t *targets,
                            float loss_scale, int last_micro);
/* One micro-batch's pass over one model chunk (layers of model m) with the
 * engine's hooks around each part: the one protocol of the plain path
 * above and of a pipeline stage, which runs its chunks in the schedule's
 * order.  Forward: the embedding when tokens is given, the layers, the head
 * when targets is given (returns its mean loss, else 0).  Backward: the
 * head (head), the layers in reverse, the embedding (embed); the outer
 * tensors' reductions around them when the chunk holds either. */
float zero_chunk_forward(Zero *z, Model *m, LayerRange layers, const int32_t *tokens,
                         const int32_t *targets);
void zero_chunk_backward(Zero *z, Model *m, LayerRange layers, int head, int embed,
                         float loss_scale, int last_micro);

/* Finish every gradient reduction (stages 0-1: data_par's finalize, with a
 * tied embedding summed over the embedding group first). */
void zero_finish_grads(Zero *z);
/* Squared L2 norm of this model-parallel rank's part of the gradient
 * (reduced over DP when sharded; replicated TP elements counted on their
 * owner only): summed over the model-parallel group it is the whole
 * model's. */
double zero_grad_sumsq(Zero *z);
/* One rank holding the whole gradient (dp 1, no other model-parallel
 * rank): the gradient norm and the step's decision in backend memory
 * (params_grad_check into state), and the next zero_optimizer_step takes
 * its clip factor and skip decision from there, without the host waiting
 * (optimizer_use_state).  zero_optimizer_skipped: the host read a skip
 * decision after the step (optimizer_skipped). */
void zero_grad_check(Zero *z, BackendStepState *state, float clip);
void zero_optimizer_skipped(Zero *z);
/* The step is skipped without an optimizer step (a non-finite loss or
 * gradient seen on the host): with offload, the gradients already sent to
 * the host are dropped (optimizer_grads_dropped).  zero_begin_step does it
 * too; the trainer calls it at once, so that a checkpoint saved after the
 * skip reads the weights as they were. */
void zero_drop_grads(Zero *z);
/* Clipping: the next zero_optimizer_step reads the gradients times s
 * (applied inside its AdamW pass: optimizer_scale_grads). */
void zero_scale_grads(Zero *z, float s);
/* AdamW on the owned part, then make parameters whole again where the
 * stage keeps them whole (stages 1-2 all-gather). */
void zero_optimizer_step(Zero *z, float lr, const TrainingConfig *tc);
/* Forward only (validation): the mean loss of one micro-batch. */
float zero_forward(Zero *z, const int32_t *tokens, const int32_t *targets);

/* The state a checkpoint holds, as the buffers this rank keeps: params is
 * [P] for stages 0-2 and this rank's block for stage 3; master (NULL with
 * fp32), m and v cover the optimizer's range.  With divided experts a
 * block is the dense block, then the expert block (ckpt.h's second run):
 * the optimizer's at ZeRO 1-3, the weights' at ZeRO 3.  adam_t is the
 * step count of Adam's bias correction. */
typedef struct {
    float *params, *master, *m, *v;
    int *adam_t;
    int optimizer_on_host; /* topology.offload: master, m and v are host memory */
    int params_on_host;    /* optimizer+params: params (stage 3's block) is host memory */
} ZeroState;
ZeroState zero_state(Zero *z);
/* The weights were replaced after zero_create (a resume or
 * checkpoint.init_from wrote params): the optimizer's copies of them, where
 * it keeps any apart from the checkpoint's kinds, are read again
 * (optimizer_params_loaded). */
void zero_params_loaded(Zero *z);

ZeroMemory zero_memory(const Zero *z);
/* Statistics since the last call (resets them). */
ZeroStats zero_take_stats(Zero *z);

/* Gather the whole flat parameter buffer [P] onto every DP rank (for tests
 * and export; stage 3 assembles it from the shards). */
void zero_gather_params(Zero *z, float *out);

/* ---- for the planner (src/plan): the same rules, without allocating ----
 * What zero_create would allocate on DP rank dp_rank of dp for the shard
 * (zero_memory's figures), and the bytes the DP communicator counts (comm.h's
 * ring rule) in one training step of n_micro micro-batches: buckets or
 * per-layer reductions, the parameter all-gathers, the gradient-norm
 * all-reduce.  Validation and the first step's start-up all-gather are not
 * included.  Keep them in step with the engine: tests/test_plan_runs.sh compares
 * both against real runs. */
ZeroMemory zero_plan_memory(const Config *cfg, const ParamShard *sh, int dp, int dp_rank);
uint64_t zero_plan_step_bytes(const Config *cfg, const ParamShard *sh, int dp, int n_micro);
/* optimizer+params: the elements DP rank 0 copies from host to device
 * memory in one step, its part of every gather (0 for other settings). */
uint64_t zero_plan_host_gather_elems(const Config *cfg, const ParamShard *sh, int dp, int n_micro);

#endif
