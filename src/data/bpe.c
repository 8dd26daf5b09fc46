/* bpe.c — GPT-2 encoding: split the text into pieces with GPT-2's pattern,
 * then merge each piece's bytes by rank.  The pattern, as the reference
 * (a JavaScript regex with the u flag) applies it, first alternative wins:
 *
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * written out by hand below (pretoken_end). */
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"
#include "data/unicode.h"

/* Word cache limits: past these the cache is emptied and refilled, which
 * bounds memory on huge corpora without changing any result. */
enum { CACHE_MAX_WORDS = 1 << 20, CACHE_MAX_IDS = 1 << 24, CACHE_MAX_WORD_IDS = (1 << 24) - 1 };

static UnicodeClass class_at(const unsigned char *s, size_t len, size_t i, size_t *next)
{
    if (s[i] < 0x80) {
        *next = i + 1;
        return unicode_class_ascii(s[i]);
    }
    uint32_t cp;
    *next = i + (size_t)unicode_decode(s + i, len - i, &cp);
    return unicode_class(cp);
}

/* The contractions: 's 't 'm 'd (2 bytes), 're 've 'll (3 bytes). */
static size_t contraction(const unsigned char *s, size_t len, size_t i)
{
    if (s[i] != '\'' || i + 1 >= len)
        return 0;
    unsigned char a = s[i + 1], b = i + 2 < len ? s[i + 2] : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* End of the piece that starts at i (i < len); s is well-formed UTF-8. */
static size_t pretoken_end(const unsigned char *s, size_t len, size_t i)
{
    size_t k = contraction(s, len, i);
    if (k)
        return i + k;
    size_t j, next;
    UnicodeClass c = class_at(s, len, i, &next);
    /* " ?X+" for X = letters, numbers, or neither-space-letter-number:
     * a leading ASCII space joins the run of the class that follows it. */
    if (s[i] == ' ' && next < len) {
        size_t after;
        UnicodeClass c2 = class_at(s, len, next, &after);
        if (c2 != UCLASS_SPACE) {
            c = c2;
            next = after;
        }
    }
    if (c != UCLASS_SPACE) {
        for (j = next; j < len; j = next)
            if (class_at(s, len, j, &next) != c)
                break;
        return j;
    }
    /* Whitespace: "\s+(?!\S)" takes the run up to the end of the text, or
     * all but its last character when text follows (that character then
     * leads the next piece); a run of one before text is "\s+". */
    size_t last = i;
    for (j = next; j < len; j = next) {
        if (class_at(s, len, j, &next) != UCLASS_SPACE)
            break;
        last = j;
    }
    if (j == len || last == i)
        return j;
    return last;
}

static int grow_ids(int32_t **ids, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    int32_t *p = realloc(*ids, c * sizeof *p);
    if (!p)
        return -1;
    *ids = p;
    *cap = c;
    return 0;
}

/* The merge table's entry for the pair (x, y): 1 and *v, or 0. */
static int pair_get(const Bpe *b, int32_t x, int32_t y, uint64_t *v)
{
    const uint64_t k = bpe_pair_key(x, y);
    const size_t mask = ((size_t)1 << b->pair_bits) - 1;
    for (size_t i = bpe_pair_slot(k, b->pair_bits); b->pairs[i].key != 0; i = (i + 1) & mask)
        if (b->pairs[i].key == k) {
            *v = b->pairs[i].val;
            return 1;
        }
    return 0;
}

/* Merge the symbols w[0..n) in place; returns the new count.  Each round
 * merges every occurrence (left to right, non-overlapping) of the pair of
 * lowest rank; among pairs of equal rank the last one in the word is
 * chosen, which the reference does (its rank -> pair table keeps the last
 * pair seen) and which matters only for the comma aliases of bpe_load.c. */
static size_t merge_word(const Bpe *b, int32_t *w, size_t n)
{
    while (n > 1) {
        uint64_t best = UINT64_MAX;
        int32_t first = 0, second = 0, merged = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            uint64_t v;
            if (pair_get(b, w[i], w[i + 1], &v) && (v >> 32) <= best) {
                best = v >> 32;
                first = w[i];
                second = w[i + 1];
                merged = (int32_t)(uint32_t)v;
            }
        }
        if (best == UINT64_MAX)
            break;
        size_t out = 0;
        for (size_t i = 0; i < n;) {
            if (i + 1 < n && w[i] == first && w[i + 1] == second) {
                w[out++] = merged;
                i += 2;
            } else {
                w[out++] = w[i++];
            }
        }
        n = out;
    }
    return n;
}

static int cache_add(Bpe *b, const unsigned char *word, size_t len, const int32_t *w, size_t n)
{
    if (n > CACHE_MAX_WORD_IDS)
        return 0;
    if (b->cache.count >= CACHE_MAX_WORDS || b->cache_n + n > CACHE_MAX_IDS) {
        strmap_clear(&b->cache);
        b->cache_n = 0;
    }
    if (grow_ids(&b->cache_ids, &b->cache_cap, b->cache_n + n) != 0)
        return -1;
    memcpy(b->cache_ids + b->cache_n, w, n * sizeof *w);
    if (strmap_put(&b->cache, word, len, (uint64_t)b->cache_n << 24 | n) != 0)
        return -1;
    b->cache_n += n;
    return 0;
}

/* Ids of one piece, appended to out. */
static int encode_word(Bpe *b, const unsigned char *word, size_t len, uint64_t h, int32_t **ids,
                       size_t *n, size_t *cap)
{
    uint64_t v;
    if (strmap_get_hashed(&b->cache, h, word, len, &v)) {
        size_t off = v >> 24, k = v & CACHE_MAX_WORD_IDS;
        if (grow_ids(ids, cap, *n + k) != 0)
            return -1;
        memcpy(*ids + *n, b->cache_ids + off, k * sizeof **ids);
        *n += k;
        return 0;
    }
    if (grow_ids(&b->work, &b->work_cap, len) != 0)
        return -1;
    for (size_t i = 0; i < len; i++)
        b->work[i] = b->byte_id[word[i]];
    size_t k = merge_word(b, b->work, len);
    if (grow_ids(ids, cap, *n + k) != 0)
        return -1;
    memcpy(*ids + *n, b->work, k * sizeof **ids);
    *n += k;
    return cache_add(b, word, len, b->work, k);
}

int bpe_encode(Bpe *b, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap)
{
    int clean;
    size_t rlen = len;
    unsigned char *repaired = unicode_repair((const unsigned char *)text, len, &rlen, &clean);
    if (!clean && !repaired)
        return -1;
    const unsigned char *s = clean ? (const unsigned char *)text : repaired;
    /* Pieces in batches: split, hash and prefetch a batch's cache slots,
     * then encode it, so that the cache misses overlap (docs/data.md,
     * "Speed"). */
    enum { BATCH = 32 };
    size_t start[BATCH + 1];
    uint64_t hash[BATCH];
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < rlen;) {
        int k = 0;
        for (; k < BATCH && i < rlen; k++) {
            start[k] = i;
            i = pretoken_end(s, rlen, i);
            hash[k] = strmap_hash(s + start[k], i - start[k]);
            strmap_prefetch(&b->cache, hash[k]);
        }
        start[k] = i;
        for (int p = 0; p < k; p++)
            strmap_prefetch_key(&b->cache, hash[p]);
        for (int p = 0; rc == 0 && p < k; p++)
            rc = encode_word(b, s + start[p], start[p + 1] - start[p], hash[p], ids, n, cap);
    }
    free(repaired);
    return rc;
}
