/* blend.c — the sample stream over one dataset or a weighted blend (blend.h). */
#include "data/blend.h"

#include <stdio.h>
#include <string.h>

#include "core/rng.h"

uint64_t blend_seed(uint64_t seed, int d)
{
    return d == 0 ? seed : rng_mix(seed, 0x626c656e64000000ull + (uint64_t)d); /* "blend" */
}

int blend_open(Blend *b, const BlendSpec *spec, DataFormat fmt, int seq_len, uint64_t seed,
               int vocab, char err[CFG_ERR])
{
    memset(b, 0, sizeof *b);
    b->vocab = vocab;
    double total = 0;
    for (int d = 0; d < spec->n; d++)
        total += spec->weight[d];
    for (int d = 0; d < spec->n; d++) {
        if (stream_open(&b->data[d], spec->path[d], fmt, err) != 0) {
            blend_close(b);
            return -1;
        }
        b->n = d + 1;
        b->weight[d] = spec->weight[d] / total;
        if (sampler_init(&b->sampler[d], &b->data[d], seq_len, blend_seed(seed, d), err) != 0 ||
            sampler_check_vocab(&b->data[d], vocab, SAMPLER_VOCAB_SCAN, err) != 0) {
            blend_close(b);
            return -1;
        }
    }
    return 0;
}

void blend_close(Blend *b)
{
    for (int d = 0; d < b->n; d++)
        stream_close(&b->data[d]);
    b->n = 0;
}

/* Move the cursor to position p (back to 0 first when p is behind it). */
static void seek(Blend *b, uint64_t p)
{
    if (p < b->pos) {
        b->pos = 0;
        memset(b->count, 0, sizeof b->count);
    }
    if (b->n == 1) { /* every position is dataset 0's */
        b->count[0] = b->pos = p;
        return;
    }
    for (; b->pos < p; b->pos++) {
        int best = 0;
        double best_lag = -1e300;
        for (int d = 0; d < b->n; d++) {
            double lag = b->weight[d] * (double)(b->pos + 1) - (double)b->count[d];
            if (lag > best_lag) {
                best_lag = lag;
                best = d;
            }
        }
        b->count[best]++;
    }
}

int blend_pick(Blend *b, uint64_t p, uint64_t *k)
{
    seek(b, p);
    uint64_t before[CFG_MAX_BLEND];
    memcpy(before, b->count, sizeof before);
    seek(b, p + 1);
    for (int d = 0; d < b->n; d++)
        if (b->count[d] != before[d]) {
            *k = before[d];
            return d;
        }
    *k = 0;
    return 0; /* not reached: position p went to some dataset */
}

void blend_counts(Blend *b, uint64_t p, uint64_t *count)
{
    seek(b, p);
    memcpy(count, b->count, (size_t)b->n * sizeof *count);
}

int blend_read(Blend *b, uint64_t p, int32_t *tokens, int32_t *targets, char err[CFG_ERR])
{
    uint64_t k;
    int d = blend_pick(b, p, &k);
    return sampler_read(&b->sampler[d], &b->data[d], k, b->vocab, tokens, targets, err);
}

void batch_positions(const int32_t *tokens, int B, int T, int eot, int32_t *pos)
{
    for (size_t b = 0; b < (size_t)B; b++) {
        const int32_t *tok = tokens + b * (size_t)T;
        int32_t *p = pos + b * (size_t)T;
        for (int t = 0; t < T; t++)
            p[t] = t == 0 || tok[t - 1] == eot ? 0 : p[t - 1] + 1;
    }
}
