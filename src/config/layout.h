/* layout.h — the rules a model and its layout over ranks must satisfy, in
 * one place.  Config validation (config_validate.c), the trainer, the model
 * (for models built without a validated config) and the planner all ask
 * these functions; none restates a rule.
 *
 * Each returns 0, or -1 with the rule that is violated, the values, and
 * the fix in e->msg, and in e->key the config key the fix changes first
 * (config validation puts the message at that key's place in the file). */
#ifndef TRD_CONFIG_LAYOUT_H
#define TRD_CONFIG_LAYOUT_H

#include "config/config.h"

typedef struct {
    const char *key; /* "topology.tp", "model.hidden", ... */
    char msg[CFG_ERR];
} LayoutError;

/* The model's shape alone: hidden / heads / kv_heads, and for llama an
 * even head size and a usable RoPE base. */
int layout_check_model(const ModelConfig *m, LayoutError *e);

/* The model split over tp ranks: heads, kv heads (split or replicated) and
 * ffn_hidden; with sequence parallelism the token rows of a micro-batch of
 * micro_batch sequences (0: of any micro-batch, i.e. of one sequence), of
 * which a rank holds 1/cp. */
int layout_check_tp(const ModelConfig *m, int tp, int sequence_parallel, int cp, int micro_batch,
                    LayoutError *e);

/* A whole layout: the model, tp, the pipeline's stages and virtual stages,
 * and the combinations the engine does not run (ZeRO-3 with pipelining,
 * interleaving without a pipeline, ZeRO-2 with pp > 1 and tied
 * embeddings).  t->dp may be 0 (auto). */
int layout_check(const ModelConfig *m, const TopologyConfig *t, LayoutError *e);

#endif
