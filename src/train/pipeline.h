/* pipeline.h — one pipeline stage of the trainer: the model's parts for
 * this stage's layers, driven by a schedule (src/pipeline_par) and the
 * ZeRO engine's per-part hooks.
 *
 * The schedule knows micro-batches and stages; this file knows which model
 * part runs for an instruction and where its activations live.  Chunk c of
 * the rank (one unless topology.virtual_stages > 1) is its own model over
 * its layers (zero.h: all bound to one flat buffer); micro-batch mb of chunk
 * c uses that model's activation set mb % slots[c], where slots[c] is what
 * the schedule needs (pp_schedule_chunk_slots: pp - rank for 1F1B, m for
 * GPipe). */
#ifndef TRD_PIPELINE_H
#define TRD_PIPELINE_H

#include <stdint.h>

#include "comm/comm.h"
#include "model/params.h"
#include "config/config.h"
#include "pipeline_par/executor.h"
#include "zero/zero.h"

typedef struct PipeStage PipeStage;

/* The stage of pipeline rank pp->rank for n_micro micro-batches per step.
 * Returns NULL with a message in err for a schedule it cannot run. */
PipeStage *pipe_create(const Config *cfg, Zero *z, Comm *pp, int n_micro, char err[CFG_ERR]);
void pipe_free(PipeStage *p);

/* Layers [*begin, *end) of model stage `stage` (0 .. pp * virtual_stages - 1):
 * topology.stage_layers, or an even split with the first stages taking one
 * more when it is uneven. */
void pipe_stage_layers(const Config *cfg, int stage, int *begin, int *end);

/* What pipeline rank pp_rank holds: chunk c is model stage c * pp + pp_rank
 * (schedule.h), the embeddings on rank 0, the head on the last rank. */
ParamShard pipe_shard(const Config *cfg, int pp_rank, int tp, int tp_rank);

/* Forward and backward of every micro-batch of a step, as the schedule
 * orders them.  tokens/targets hold n_micro micro-batches of B*T each (read
 * by the first and the last stage).  `reduce` runs once every backward and
 * send is done.  Returns the sum over micro-batches of their mean loss on
 * the last stage, 0 on the others. */
double pipe_step(PipeStage *p, const int32_t *tokens, const int32_t *targets, float loss_scale,
                 void (*reduce)(void *), void *reduce_ctx);

/* Forward only, one micro-batch through all stages in turn (validation).
 * Returns its mean loss on the last stage, 0 elsewhere. */
double pipe_forward(PipeStage *p, const int32_t *tokens, const int32_t *targets);

/* Timing of the last pipe_step: compute and waiting per rank, and spans. */
const PpExecStats *pipe_stats(const PipeStage *p);
/* Bytes of the buffers the stage holds for gradients it sends back (one
 * message a micro-batch in flight, for every chunk but the first model
 * stage): activation memory beside the model's (memory report). */
size_t pipe_memory(const PipeStage *p);

#endif
