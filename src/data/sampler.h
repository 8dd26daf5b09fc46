/* sampler.h — the global order of training samples.
 *
 * Sample i is the token window [i*seq_len, i*seq_len + seq_len + 1) of the
 * dataset's stream (stream.h: its shards concatenated) (documents concatenated with their EOT separators, as
 * Megatron's GPT dataset does); there are (n_tokens - 1) / seq_len of them
 * per epoch.  The global stream of samples is position -> (epoch, slot) ->
 * sample, where the sample of a slot is a keyed pseudo-random permutation
 * of the epoch.  It depends on (seed, epoch, position) only, never on the
 * topology: rank r of any layout reads the positions its share of the
 * global batch covers, and a resumed run continues from a saved position.
 *
 * The permutation is a keyed Feistel network over the next power of two,
 * with cycle walking down to [0, n_samples) (docs/data.md says why): O(1)
 * memory and O(1) time per element, however many samples there are. */
#ifndef TRD_DATA_SAMPLER_H
#define TRD_DATA_SAMPLER_H

#include <stdint.h>

#include "config/config.h"
#include "data/stream.h"

typedef struct {
    uint64_t seed;
    int seq_len;
    uint64_t n_samples; /* per epoch */
} Sampler;

/* Error if the dataset has fewer than seq_len + 1 tokens. */
int sampler_init(Sampler *s, const TokenStream *ds, int seq_len, uint64_t seed, char err[CFG_ERR]);

/* Position in the global stream -> sample index in [0, n_samples);
 * epoch = position / n_samples. */
uint64_t sampler_index(const Sampler *s, uint64_t position);

/* The permutation itself: slot in [0, n) -> element of [0, n), a bijection
 * for every (n, key).  Exposed for tests and for other orderings. */
uint64_t sampler_permute(uint64_t slot, uint64_t n, uint64_t key);

/* Fill one sequence: tokens[t] = stream[i*seq_len + t], targets[t] =
 * stream[i*seq_len + t + 1], t < seq_len, i = sampler_index(position);
 * with a loss mask (instruction data), targets[t] = -1 (not counted in the
 * loss) where the mask of stream[i*seq_len + t + 1] is 0.
 * Returns -1 with err if a token >= vocab (names the shard, position and
 * value), or if a shard fails its checks when first mapped. */
int sampler_read(const Sampler *s, TokenStream *ds, uint64_t position, int vocab, int32_t *tokens,
                 int32_t *targets, char err[CFG_ERR]);

/* At start-up: -1 with err (the dataset, the first token >= vocab, its
 * position, what to do) when one of the first max_tokens tokens is outside
 * the vocabulary, so data made with a larger tokenizer (cl100k_base,
 * o200k_base: int32 tokens) is refused before training, not at the first
 * sample that happens to hold such a token.  sampler_read still checks
 * every token it reads. */
int sampler_check_vocab(TokenStream *ds, int vocab, uint64_t max_tokens, char err[CFG_ERR]);
#define SAMPLER_VOCAB_SCAN ((uint64_t)1 << 26) /* 64 Mi tokens: ~0.1 s from the page cache */

#endif
