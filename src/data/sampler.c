#include "data/sampler.h"

#include <stdio.h>
#include <string.h>

#include "core/rng.h"

/* Rounds of the Feistel network.  Each round's function is Philox, so a
 * few rounds already give an order with no visible structure; 6 rounds keep
 * the cost per sample below a microsecond. */
enum { FEISTEL_ROUNDS = 6 };

int sampler_init(Sampler *s, const TokenStream *ds, int seq_len, uint64_t seed, char err[CFG_ERR])
{
    if (seq_len < 1) {
        snprintf(err, CFG_ERR, "%.400s: sequence length must be >= 1, got %d", ds->name, seq_len);
        return -1;
    }
    if (ds->n_tokens < (uint64_t)seq_len + 1) {
        snprintf(err, CFG_ERR,
                 "%.400s: %llu tokens are too few for one sample of seq_len %d (needs %lld tokens)",
                 ds->name, (unsigned long long)ds->n_tokens, seq_len, (long long)seq_len + 1);
        return -1;
    }
    s->seed = seed;
    s->seq_len = seq_len;
    s->n_samples = (ds->n_tokens - 1) / (uint64_t)seq_len;
    return 0;
}

/* One pass of the network over [0, 2^bits): x = (hi, lo) with lo the low
 * half = bits/2 bits.  Each round XORs one half with a keyed function of
 * the other, alternating halves; every round is its own inverse given the
 * other half, so the whole pass is a bijection of [0, 2^bits) whatever the
 * function, and unequal halves (odd bits) are no problem. */
static uint64_t feistel(uint64_t x, int bits, uint64_t key)
{
    int lo_bits = bits / 2, hi_bits = bits - lo_bits;
    uint64_t lo_mask = lo_bits ? (~0ull >> (64 - lo_bits)) : 0;
    uint64_t hi_mask = hi_bits ? (~0ull >> (64 - hi_bits)) : 0;
    uint64_t lo = x & lo_mask, hi = (x >> lo_bits) & hi_mask;
    for (int r = 0; r < FEISTEL_ROUNDS; r++) {
        uint32_t out[4];
        if (r % 2 == 0) {
            rng_philox(out, hi, (uint64_t)r, key);
            lo ^= (((uint64_t)out[0] << 32) | out[1]) & lo_mask;
        } else {
            rng_philox(out, lo, (uint64_t)r, key);
            hi ^= (((uint64_t)out[0] << 32) | out[1]) & hi_mask;
        }
    }
    return (hi << lo_bits) | lo;
}

uint64_t sampler_permute(uint64_t slot, uint64_t n, uint64_t key)
{
    if (n <= 1)
        return 0;
    int bits = 0;
    while (bits < 64 && (1ull << bits) < n)
        bits++;
    /* Cycle walking: apply the bijection of [0, 2^bits) until the value
     * lands inside [0, n).  Because the walk from a slot < n follows that
     * slot's own cycle, the result is a bijection of [0, n); since
     * 2^bits < 2n, fewer than two steps are needed on average. */
    uint64_t x = slot;
    do
        x = feistel(x, bits, key);
    while (x >= n);
    return x;
}

uint64_t sampler_index(const Sampler *s, uint64_t position)
{
    uint64_t epoch = position / s->n_samples;
    uint64_t slot = position % s->n_samples;
    return sampler_permute(slot, s->n_samples, rng_mix(s->seed, epoch));
}

/* The message for token v at stream position pos, for both checks: the
 * shard that holds it, and the position in the whole stream. */
static void vocab_error(const TokenStream *ds, uint32_t v, uint64_t pos, int vocab,
                        char err[CFG_ERR])
{
    const StreamShard *sh = &ds->shards[stream_shard_of(ds, pos)];
    long long id = sh->token_bytes == 4 ? (long long)(int32_t)v : (long long)v;
    snprintf(
        err, CFG_ERR,
        "%s: token %lld at stream position %llu is outside model.vocab = %d (ids 0..%d; "
        "the dataset holds %s tokens)\n---> the dataset was made with another tokenizer: "
        "set model.vocab to that tokenizer's vocabulary (gpt2 50257, cl100k_base 100277, "
        "o200k_base 200019, SentencePiece the model's pieces; at least %lld here), or prepare the data with the model's tokenizer",
        sh->path, id, (unsigned long long)pos, vocab, vocab - 1,
        sh->token_bytes == 4 ? "int32" : "uint16", id < 0 ? 0LL : id + 1);
}

int sampler_check_vocab(TokenStream *ds, int vocab, uint64_t max_tokens, char err[CFG_ERR])
{
    enum { CHUNK = 1 << 14 };
    uint32_t buf[CHUNK];
    uint64_t n = ds->n_tokens < max_tokens ? ds->n_tokens : max_tokens;
    for (uint64_t at = 0; at < n; at += CHUNK) {
        size_t m = n - at < CHUNK ? (size_t)(n - at) : CHUNK;
        if (stream_read(ds, at, m, buf, err) != 0)
            return -1;
        for (size_t i = 0; i < m; i++)
            if (buf[i] >= (uint32_t)vocab) {
                vocab_error(ds, buf[i], at + i, vocab, err);
                return -1;
            }
    }
    return 0;
}

int sampler_read(const Sampler *s, TokenStream *ds, uint64_t position, int vocab, int32_t *tokens,
                 int32_t *targets, char err[CFG_ERR])
{
    uint64_t start = sampler_index(s, position) * (uint64_t)s->seq_len;
    /* The window goes into targets shifted by one: tokens[0] first, then
     * targets[0..T) = stream[start+1 .. start+T]. */
    uint32_t first;
    if (stream_read(ds, start, 1, &first, err) != 0 ||
        stream_read(ds, start + 1, (size_t)s->seq_len, (uint32_t *)targets, err) != 0)
        return -1;
    for (int t = 0; t <= s->seq_len; t++) {
        uint32_t v = t == 0 ? first : (uint32_t)targets[t - 1];
        if (v >= (uint32_t)vocab) {
            vocab_error(ds, v, start + (uint64_t)t, vocab, err);
            return -1;
        }
    }
    tokens[0] = (int32_t)first;
    memcpy(tokens + 1, targets, (size_t)(s->seq_len - 1) * sizeof *tokens);
    if (ds->has_mask) {
        /* The mask is the predicted token's: target t is stream[start+t+1],
         * so its byte is mask[start+t+1]; an untrained one becomes -1,
         * which the loss does not count (the input token keeps its id). */
        enum { CHUNK = 4096 };
        uint8_t m[CHUNK];
        for (int t0 = 0; t0 < s->seq_len; t0 += CHUNK) {
            int k = s->seq_len - t0 < CHUNK ? s->seq_len - t0 : CHUNK;
            if (stream_read_mask(ds, start + 1 + (uint64_t)t0, (size_t)k, m, err) != 0)
                return -1;
            for (int t = 0; t < k; t++)
                if (!m[t])
                    targets[t0 + t] = -1;
        }
    }
    return 0;
}
