/* blend.h — the sample stream of a run: one dataset, or a weighted blend
 * of several (data.blend).
 *
 * Position p of the global sample stream goes to the dataset whose share
 * lags its weight most: d = argmax_d (w_d * (p + 1) - n_d(p)), ties to the
 * lower index, where n_d(p) counts the samples dataset d got before p
 * (Megatron-LM's error-minimizing assignment).  So after every prefix of
 * the stream each dataset's count is within one sample of w_d * p.  The
 * k-th sample a dataset gets is position k of its own sample order
 * (sampler.h), with its own epochs: a small dataset repeats while a large
 * one is still in its first epoch.  Dataset 0 keeps the run's seed, the
 * others get seeds of their own, so a blend of one dataset is exactly that
 * dataset.
 *
 * Everything is a function of (seed, weights, datasets, position): every
 * rank of any layout computes the same assignment, and a resumed run
 * continues it from the saved position.  The assignment is computed by a
 * cursor that moves forward (O(datasets) per position); reading an
 * earlier position starts it again from 0, as a resume does once. */
#ifndef TRD_DATA_BLEND_H
#define TRD_DATA_BLEND_H

#include <stdint.h>

#include "config/config.h"
#include "data/sampler.h"
#include "data/stream.h"

typedef struct {
    int n;
    TokenStream data[CFG_MAX_BLEND];
    Sampler sampler[CFG_MAX_BLEND];
    double weight[CFG_MAX_BLEND]; /* normalized: they sum to 1 */
    int vocab;
    uint64_t pos;                  /* the cursor: positions assigned so far */
    uint64_t count[CFG_MAX_BLEND]; /* samples of each dataset before pos */
} Blend;

/* Open the datasets of spec, check their first tokens against vocab and
 * set up their samplers.  0, or -1 with err naming the dataset. */
int blend_open(Blend *b, const BlendSpec *spec, DataFormat fmt, int seq_len, uint64_t seed,
               int vocab, char err[CFG_ERR]);
void blend_close(Blend *b);

/* The dataset of position p and the index of that sample among the
 * dataset's own (its k-th). */
int blend_pick(Blend *b, uint64_t p, uint64_t *k);

/* How many of positions [0, p) each dataset got (count[n]). */
void blend_counts(Blend *b, uint64_t p, uint64_t *count);

/* The sample at position p: tokens[t], targets[t], t < seq_len. */
int blend_read(Blend *b, uint64_t p, int32_t *tokens, int32_t *targets, char err[CFG_ERR]);

/* Packed documents: pos[b*T + t] = token t's position within its document
 * in each of B sequences of T tokens, where a document ends with the token
 * eot (which belongs to it): 0 at t = 0 and after each eot, else one more
 * than the token before.  Megatron's reset_position_ids; the attention
 * mask follows from it (backend.h, AttnArgs). */
void batch_positions(const int32_t *tokens, int B, int T, int eot, int32_t *pos);

/* The seed of dataset d's sample order. */
uint64_t blend_seed(uint64_t seed, int d);

#endif
