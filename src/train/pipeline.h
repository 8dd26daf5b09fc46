/* pipeline.h — one pipeline stage of the trainer: the model's parts for
 * this stage's layers, driven by a schedule (src/pipeline_par) and the
 * ZeRO engine's per-part hooks.
 *
 * The schedule knows micro-batches and stages; this file knows which model
 * part runs for an instruction and where its activations live: micro-batch
 * mb uses the model's activation set mb % slots, where slots is what the
 * schedule needs (pp_schedule_slots: pp - rank for 1F1B, m for GPipe). */
#ifndef TRD_PIPELINE_H
#define TRD_PIPELINE_H

#include <stdint.h>

#include "comm/comm.h"
#include "config/config.h"
#include "pipeline_par/executor.h"
#include "zero/zero.h"

typedef struct PipeStage PipeStage;

/* The stage of pipeline rank pp->rank for n_micro micro-batches per step.
 * Returns NULL with a message in err for a schedule it cannot run. */
PipeStage *pipe_create(const Config *cfg, Zero *z, Comm *pp, int n_micro, char err[CFG_ERR]);
void pipe_free(PipeStage *p);

/* Layers [*begin, *end) of pipeline stage `stage`: topology.stage_layers, or
 * an even split with the first stages taking one more when it is uneven. */
void pipe_stage_layers(const Config *cfg, int stage, int *begin, int *end);

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

#endif
