/* pp_stage.h — one pipeline rank of the trainer: the model chunks of its
 * stages as the executor's PpChunkOps (executor.h), run in the schedule's
 * order (pp_schedule.h) with the ZeRO engine's hooks around each chunk
 * (zero_chunk_forward / zero_chunk_backward, the same protocol as the plain
 * path's).
 *
 * The schedule knows micro-batches and stages; this file knows which model
 * part runs for an instruction and where its activations live.  Chunk c of
 * the rank (one unless topology.virtual_stages > 1) is its own model over
 * its layers (zero.h: all bound to one flat buffer); micro-batch mb of chunk
 * c uses that model's activation set mb % slots[c], where slots[c] is what
 * the schedule needs (pp_schedule_chunk_slots: pp - rank for 1F1B, m for
 * GPipe). */
#ifndef TRD_PP_STAGE_H
#define TRD_PP_STAGE_H

#include <stdint.h>

#include "comm/comm.h"
#include "model/params.h"
#include "config/config.h"
#include "pipeline_par/executor.h"
#include "zero/zero.h"

typedef struct PpStage PpStage;

/* The stage of pipeline rank pp->rank for n_micro micro-batches per step.
 * Returns NULL with a message in err for a schedule it cannot run. */
PpStage *pp_stage_create(const Config *cfg, Zero *z, Comm *pp, int n_micro, char err[CFG_ERR]);
void pp_stage_free(PpStage *p);

/* Forward and backward of every micro-batch of a step, as the schedule
 * orders them.  tokens/targets hold n_micro micro-batches of B*T each (read
 * by the first and the last stage); pos and drop_rows (model.lora.dropout:
 * model_set_dropout_rows) as many rows, or NULL.  Once every backward and send is done
 * (PP_REDUCE) the engine finishes the gradients' reduction
 * (zero_finish_grads).  Returns the sum over micro-batches of their mean
 * loss on the last stage, 0 on the others. */
double pp_stage_step(PpStage *p, const int32_t *tokens, const int32_t *targets, const int32_t *pos,
                     const uint64_t *drop_rows, const float *loss_scale);

/* Forward only, one micro-batch through all stages in turn (validation).
 * Returns its mean loss on the last stage, 0 elsewhere. */
double pp_stage_forward(PpStage *p, const int32_t *tokens, const int32_t *targets,
                        const int32_t *pos);

/* Timing of the last pp_stage_step: compute and waiting per rank, and spans. */
const PpExecStats *pp_stage_stats(const PpStage *p);
/* Bytes of the buffers the stage holds for gradients it sends back (one
 * message a micro-batch in flight, for every chunk but the first model
 * stage): activation memory beside the model's (memory report). */
size_t pp_stage_memory(const PpStage *p);

#endif
