/* tiktoken.c — the tiktoken BPE (see tiktoken.h): loading a `.tiktoken`
 * ranks file, the pre-tokenizer patterns of cl100k_base and o200k_base
 * written out by hand, and the merge by rank.
 *
 * The patterns, as the reference (js-tiktoken 1.0.21, JavaScript regexes
 * with the u flag) applies them, first alternative wins; C is the
 * contraction group ('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|...|'ll|...|'d|'D):
 *
 *   cl100k_base: C|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
 *                |\s*[\r\n]+|\s+(?!\S)|\s+
 *   o200k_base:  [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+C?
 *                |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*C?
 *                |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *
 * (tiktoken's own Rust patterns use possessive quantifiers and
 * \s*[\r\n] where these have \s*[\r\n]+; both give the same pieces.) */
#include "data/tiktoken.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/unicode.h"

#define RANKS_HINT                                                                                 \
    "---> run scripts/get_tiktoken.sh (it writes .cache/tiktoken/ENCODING.tiktoken), "             \
    "or pass --ranks FILE"

enum { CACHE_MAX_WORDS = 1 << 20, CACHE_MAX_IDS = 1 << 24, CACHE_MAX_WORD_IDS = (1 << 24) - 1 };

typedef struct {
    const char *text;
    int id;
} Special;

typedef struct {
    const char *name;
    TiktokenPattern pattern;
    int n_ranks; /* tokens in the ranks file: ids 0..n_ranks-1 */
    const Special *specials;
    int n_specials;
} Encoding;

static const Special cl100k_specials[] = {
    {"<|endoftext|>", 100257},  {"<|fim_prefix|>", 100258},  {"<|fim_middle|>", 100259},
    {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276},
};
static const Special o200k_specials[] = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};

static const Encoding encodings[] = {
    {"cl100k_base", TIKTOKEN_CL100K, 100256, cl100k_specials, 5},
    {"o200k_base", TIKTOKEN_O200K, 199998, o200k_specials, 2},
};

const char tiktoken_encodings[] = "cl100k_base or o200k_base";

/* ---- loading ------------------------------------------------------------ */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Standard base64 with padding; returns the byte count or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4)
        return -1;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad || (v[k] = b64_value((unsigned char)s[i + k])) < 0) {
                return -1;
            }
        }
        uint32_t w =
            (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (unsigned char)(w >> 16);
        if (pad < 2)
            out[o++] = (unsigned char)(w >> 8);
        if (pad < 1)
            out[o++] = (unsigned char)w;
    }
    return o;
}

static char *slurp(const char *path, size_t *len, char err[CFG_ERR])
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        trd_errorf(err, "cannot open %s: %s\n%s", path, strerror(errno), RANKS_HINT);
        return NULL;
    }
    size_t cap = 1 << 22, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(b, 2 * cap + 1);
        if (!nb)
            free(b);
        b = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        trd_errorf(err, bad ? "cannot read %s" : "%s: out of memory reading the file", path);
        return NULL;
    }
    b[n] = '\0';
    *len = n;
    return b;
}

static int load_fail(Tiktoken *t, char *text)
{
    free(text);
    tiktoken_free(t);
    return -1;
}

int tiktoken_load(Tiktoken *t, const char *path, const char *encoding, char err[CFG_ERR])
{
    memset(t, 0, sizeof *t);
    const Encoding *e = NULL;
    for (size_t i = 0; i < sizeof encodings / sizeof *encodings; i++)
        if (!strcmp(encodings[i].name, encoding))
            e = &encodings[i];
    if (!e)
        return trd_errorf(err, "unknown tiktoken encoding '%s' (%s)", encoding, tiktoken_encodings);
    size_t len;
    char *text = slurp(path, &len, err);
    if (!text)
        return -1;
    t->name = e->name;
    t->pattern = e->pattern;
    t->vocab = e->n_ranks;
    for (int i = 0; i < e->n_specials; i++)
        if (e->specials[i].id >= t->vocab)
            t->vocab = e->specials[i].id + 1;
    t->eot = e->specials[0].id;
    /* Token bytes by id, for decoding: the ranks file's bytes are at most
     * 3/4 of its size; the specials' text is added at the end. */
    t->tok_off = calloc((size_t)t->vocab + 1, sizeof *t->tok_off);
    t->tok_bytes = malloc(len + 256);
    size_t *start = calloc((size_t)t->vocab, sizeof *start),
           *tlen = calloc((size_t)t->vocab, sizeof *tlen);
    if (!t->tok_off || !t->tok_bytes || !start || !tlen ||
        strmap_init(&t->ranks, (size_t)e->n_ranks) != 0 || strmap_init(&t->cache, 1 << 16) != 0) {
        free(start);
        free(tlen);
        trd_errorf(err, "out of memory loading %s", path);
        return load_fail(t, text);
    }
    for (int b = 0; b < 256; b++)
        t->byte_rank[b] = -1;
    size_t used = 0;
    int line = 0, count = 0, rc = 0;
    for (char *p = text; p < text + len && rc == 0;) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p)), *end = nl ? nl : text + len;
        line++;
        char *sp = memchr(p, ' ', (size_t)(end - p));
        if (end == p) { /* blank line (a trailing one, say) */
            p = end + 1;
            continue;
        }
        long nb = sp ? b64_decode(p, (size_t)(sp - p), t->tok_bytes + used) : -1;
        char *rend;
        errno = 0;
        long rank = sp && sp + 1 < end ? strtol(sp + 1, &rend, 10) : -1;
        if (nb <= 0 || rank < 0 || errno || (rend != end && !(rend + 1 == end && *rend == '\r'))) {
            rc = trd_errorf(err, "%s:%d: expected 'BASE64 RANK' (a .tiktoken ranks file)", path,
                            line);
            break;
        }
        if (rank >= e->n_ranks) {
            rc = trd_errorf(err,
                            "%s:%d: rank %ld, but %s has ranks 0..%d\n---> check --encoding "
                            "(%s) against the ranks file",
                            path, line, rank, e->name, e->n_ranks - 1, tiktoken_encodings);
            break;
        }
        uint64_t old;
        if (tlen[rank] || strmap_get(&t->ranks, t->tok_bytes + used, (size_t)nb, &old)) {
            rc = trd_errorf(err, "%s:%d: duplicate %s (rank %ld)", path, line,
                            tlen[rank] ? "rank" : "token", rank);
            break;
        }
        if (strmap_put(&t->ranks, t->tok_bytes + used, (size_t)nb, (uint64_t)rank) != 0) {
            rc = trd_errorf(err, "out of memory loading %s", path);
            break;
        }
        if (nb == 1)
            t->byte_rank[t->tok_bytes[used]] = (int32_t)rank;
        start[rank] = used;
        tlen[rank] = (size_t)nb;
        used += (size_t)nb;
        count++;
        p = end + 1;
    }
    if (rc == 0 && count != e->n_ranks)
        rc = trd_errorf(err,
                        "%s: %d ranks, %s has %d\n---> check --encoding (%s) against the "
                        "ranks file",
                        path, count, e->name, e->n_ranks, tiktoken_encodings);
    for (int b = 0; rc == 0 && b < 256; b++)
        if (t->byte_rank[b] < 0)
            rc = trd_errorf(err, "%s: no token for the byte 0x%02X: not a byte-level BPE", path, b);
    if (rc != 0) {
        free(start);
        free(tlen);
        return load_fail(t, text);
    }
    /* Lay the bytes out by id; the ranks map keeps its own copy of the keys. */
    unsigned char *by_id = malloc(used + 256);
    size_t o = 0;
    if (!by_id) {
        free(start);
        free(tlen);
        trd_errorf(err, "out of memory loading %s", path);
        return load_fail(t, text);
    }
    for (int i = 0; i < t->vocab; i++) {
        t->tok_off[i] = o;
        const char *sp = NULL;
        for (int k = 0; k < e->n_specials; k++)
            if (e->specials[k].id == i)
                sp = e->specials[k].text;
        if (sp) {
            memcpy(by_id + o, sp, strlen(sp));
            o += strlen(sp);
        } else if (i < e->n_ranks) {
            memcpy(by_id + o, t->tok_bytes + start[i], tlen[i]);
            o += tlen[i];
        }
    }
    t->tok_off[t->vocab] = o;
    free(t->tok_bytes);
    t->tok_bytes = by_id;
    free(start);
    free(tlen);
    free(text);
    return 0;
}

int tiktoken_special(const Tiktoken *t, const char *text, size_t len)
{
    for (size_t e = 0; e < sizeof encodings / sizeof *encodings; e++) {
        if (strcmp(encodings[e].name, t->name))
            continue;
        for (int k = 0; k < encodings[e].n_specials; k++)
            if (strlen(encodings[e].specials[k].text) == len &&
                !memcmp(encodings[e].specials[k].text, text, len))
                return encodings[e].specials[k].id;
    }
    return -1;
}

void tiktoken_free(Tiktoken *t)
{
    strmap_free(&t->ranks);
    strmap_free(&t->cache);
    free(t->tok_bytes);
    free(t->tok_off);
    free(t->cache_ids);
    free(t->part);
    free(t->part_rank);
    memset(t, 0, sizeof *t);
}

/* ---- pre-tokenization --------------------------------------------------- */

#define BIT(c) (1u << (c))
enum {
    CAT_L = BIT(UCAT_LU) | BIT(UCAT_LL) | BIT(UCAT_LT) | BIT(UCAT_LM) | BIT(UCAT_LO),
    CAT_N = BIT(UCAT_N),
    CAT_UPPER = BIT(UCAT_LU) | BIT(UCAT_LT) | BIT(UCAT_LM) | BIT(UCAT_LO) | BIT(UCAT_M),
    CAT_LOWER = BIT(UCAT_LL) | BIT(UCAT_LM) | BIT(UCAT_LO) | BIT(UCAT_M),
    /* [^\s\p{L}\p{N}] */
    CAT_PUNCT = ~(BIT(UCAT_SPACE) | CAT_L | CAT_N),
};

typedef struct {
    const unsigned char *s;
    size_t len;
} Text;

/* Category bit of the code point at i, its end in *next; 0 at the end. */
static unsigned cat_at(Text x, size_t i, size_t *next)
{
    if (i >= x.len) {
        *next = i;
        return 0;
    }
    if (x.s[i] < 0x80) {
        *next = i + 1;
        return BIT(unicode_category_ascii(x.s[i]));
    }
    uint32_t cp;
    *next = i + (size_t)unicode_decode(x.s + i, x.len - i, &cp);
    return BIT(unicode_category(cp));
}

/* [^\r\n\p{L}\p{N}]: the optional first character of a letter run. */
static int is_prefix(Text x, size_t i, unsigned cat)
{
    return cat && !(cat & (CAT_L | CAT_N)) && x.s[i] != '\r' && x.s[i] != '\n';
}

/* End of the run of characters in mask from i. */
static size_t run(Text x, size_t i, unsigned mask)
{
    size_t next;
    while (i < x.len && (cat_at(x, i, &next) & mask))
        i = next;
    return i;
}

/* The contractions 's 't 'm 'd (2 bytes), 're 've 'll (3 bytes), any case. */
static size_t contraction(Text x, size_t i)
{
    if (i + 1 >= x.len || x.s[i] != '\'')
        return 0;
    unsigned char a = x.s[i + 1] | 0x20, b = i + 2 < x.len ? x.s[i + 2] | 0x20 : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s*[\r\n]+|\s+(?!\S)|\s+ at i, a whitespace character. */
static size_t space_end(Text x, size_t i)
{
    size_t j = i, next, last = i, after_newline = 0;
    int count = 0;
    while (j < x.len && (cat_at(x, j, &next) & BIT(UCAT_SPACE))) {
        if (x.s[j] == '\r' || x.s[j] == '\n')
            after_newline = next;
        last = j;
        count++;
        j = next;
    }
    if (after_newline) /* \s*[\r\n]+: up to the last line break */
        return after_newline;
    if (j == x.len || count == 1) /* \s+(?!\S) to the end, or \s+ of one */
        return j;
    return last; /* \s+(?!\S): the last space leads the next piece */
}

/* ` ?[^\s\p{L}\p{N}]+` then line breaks (and slashes for o200k). */
static size_t punct_end(Text x, size_t i, unsigned c0, size_t next1, int slash)
{
    size_t j;
    if (c0 & CAT_PUNCT) {
        j = run(x, next1, CAT_PUNCT);
    } else if (x.s[i] == ' ' && (cat_at(x, next1, &j) & CAT_PUNCT)) {
        j = run(x, j, CAT_PUNCT);
    } else {
        return 0;
    }
    while (j < x.len && (x.s[j] == '\r' || x.s[j] == '\n' || (slash && x.s[j] == '/')))
        j++;
    return j;
}

/* \p{N}{1,3} */
static size_t number_end(Text x, size_t next1)
{
    size_t j = next1, next;
    for (int k = 1; k < 3 && (cat_at(x, j, &next) & CAT_N); k++)
        j = next;
    return j;
}

static size_t cl100k_end(Text x, size_t i)
{
    size_t k = contraction(x, i), next1, next2;
    if (k)
        return i + k;
    unsigned c0 = cat_at(x, i, &next1);
    if (c0 & CAT_L)
        return run(x, next1, CAT_L);
    if (is_prefix(x, i, c0) && (cat_at(x, next1, &next2) & CAT_L))
        return run(x, next2, CAT_L);
    if (c0 & CAT_N)
        return number_end(x, next1);
    if ((k = punct_end(x, i, c0, next1, 0)))
        return k;
    return space_end(x, i);
}

/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ at p, with
 * the regex's backtracking: the upper run as long as possible, then the
 * lower run; when no lower character follows the upper run, the run gives
 * back characters up to its last one that is also "lower" (Lm, Lo, M),
 * which then forms the lower part alone.  0 when it does not match. */
static size_t upper_lower_end(Text x, size_t p)
{
    size_t q = p, next, last_lower_end = 0;
    unsigned c;
    while ((c = cat_at(x, q, &next)) & CAT_UPPER) {
        if (c & CAT_LOWER)
            last_lower_end = next;
        q = next;
    }
    if (c & CAT_LOWER) /* an Ll after the upper run */
        return run(x, next, CAT_LOWER);
    return last_lower_end;
}

static size_t o200k_end(Text x, size_t i)
{
    size_t next1, next2, j;
    unsigned c0 = cat_at(x, i, &next1);
    /* P?U*W+C? */
    if (is_prefix(x, i, c0) && (j = upper_lower_end(x, next1)))
        return j + contraction(x, j);
    if ((j = upper_lower_end(x, i)))
        return j + contraction(x, j);
    /* P?U+W*C? */
    size_t p = SIZE_MAX;
    if (is_prefix(x, i, c0) && (cat_at(x, next1, &next2) & CAT_UPPER))
        p = next1;
    else if (c0 & CAT_UPPER)
        p = i;
    if (p != SIZE_MAX) {
        j = run(x, run(x, p, CAT_UPPER), CAT_LOWER);
        return j + contraction(x, j);
    }
    if (c0 & CAT_N)
        return number_end(x, next1);
    if ((j = punct_end(x, i, c0, next1, 1)))
        return j;
    return space_end(x, i);
}

/* ---- merging ------------------------------------------------------------- */

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

static uint32_t rank_of(const Tiktoken *t, const unsigned char *b, size_t n)
{
    uint64_t v;
    return strmap_get(&t->ranks, b, n, &v) ? (uint32_t)v : UINT32_MAX;
}

static int cache_add(Tiktoken *t, const unsigned char *word, size_t len, const int32_t *w, size_t n)
{
    if (n > CACHE_MAX_WORD_IDS)
        return 0;
    if (t->cache.count >= CACHE_MAX_WORDS || t->cache_n + n > CACHE_MAX_IDS) {
        strmap_clear(&t->cache);
        t->cache_n = 0;
    }
    if (grow_ids(&t->cache_ids, &t->cache_cap, t->cache_n + n) != 0)
        return -1;
    memcpy(t->cache_ids + t->cache_n, w, n * sizeof *w);
    if (strmap_put(&t->cache, word, len, (uint64_t)t->cache_n << 24 | n) != 0)
        return -1;
    t->cache_n += n;
    return 0;
}

/* The merge of a piece of len >= 2 bytes (none of it a token): the
 * boundaries of its final parts into t->part[0..m] (part[m] = len);
 * returns m, or 0 when out of memory.  merge_short is the reference's
 * loop: part_rank[k] is the rank of parts k and k+1 together; each step
 * scans for the lowest (leftmost on a tie) and merges it, O(n^2) for n
 * bytes.  merge_long makes the same choices from a heap, O(n log n), for
 * the long pieces (runs of spaces or punctuation) where that matters. */
enum { MERGE_HEAP_MIN = 256 };

static size_t merge_short(Tiktoken *t, const unsigned char *b, size_t len)
{
    size_t *part = t->part, m = len; /* m parts; part[m] = len */
    uint32_t *rank = t->part_rank;
    for (size_t k = 0; k <= len; k++)
        part[k] = k;
    for (size_t k = 0; k + 1 < m; k++)
        rank[k] = rank_of(t, b + k, 2);
    while (m > 1) {
        size_t best = 0;
        uint32_t r = UINT32_MAX;
        for (size_t k = 0; k + 1 < m; k++)
            if (rank[k] < r) {
                r = rank[k];
                best = k;
            }
        if (r == UINT32_MAX)
            break;
        /* Parts best and best+1 become one: drop boundary best+1. */
        memmove(part + best + 1, part + best + 2, (m - best - 1) * sizeof *part);
        memmove(rank + best + 1, rank + best + 2, (m > best + 3 ? m - best - 3 : 0) * sizeof *rank);
        m--;
        if (best + 1 < m)
            rank[best] = rank_of(t, b + part[best], part[best + 2] - part[best]);
        if (best > 0)
            rank[best - 1] = rank_of(t, b + part[best - 1], part[best + 1] - part[best - 1]);
    }
    return m;
}

/* A pair of adjacent parts [s, mid) [mid, e) and the rank of [s, e). */
typedef struct {
    uint32_t rank;
    size_t s, e;
} PairAt;

static int pair_before(PairAt a, PairAt b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.s < b.s);
}

static void heap_push(PairAt *h, size_t *n, PairAt x)
{
    size_t i = (*n)++;
    for (; i > 0 && pair_before(x, h[(i - 1) / 2]); i = (i - 1) / 2)
        h[i] = h[(i - 1) / 2];
    h[i] = x;
}

static PairAt heap_pop(PairAt *h, size_t *n)
{
    PairAt top = h[0], x = h[--*n];
    size_t i = 0;
    for (size_t c; (c = 2 * i + 1) < *n; i = c) {
        if (c + 1 < *n && pair_before(h[c + 1], h[c]))
            c++;
        if (!pair_before(h[c], x))
            break;
        h[i] = h[c];
    }
    h[i] = x;
    return top;
}

/* Parts are a list over their start bytes: nxt[s] is where the part that
 * starts at s ends (0 once it was merged into the part before it), prv[s]
 * where the one before starts.  A heap entry is stale once its left part
 * is gone or its right part no longer ends at e; every current pair that
 * is a token has one live entry, so the lowest live entry is the pair the
 * scan of merge_short would choose. */
static size_t merge_long(Tiktoken *t, const unsigned char *b, size_t len)
{
    size_t *nxt = malloc(2 * len * sizeof *nxt), *prv = nxt ? nxt + len : NULL, hn = 0;
    PairAt *heap = malloc(3 * len * sizeof *heap); /* len - 1 pairs, then 2 per merge */
    if (!nxt || !heap) {
        free(nxt);
        free(heap);
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        nxt[i] = i + 1;
        prv[i] = i ? i - 1 : SIZE_MAX;
    }
    uint32_t r;
    for (size_t i = 0; i + 1 < len; i++)
        if ((r = rank_of(t, b + i, 2)) != UINT32_MAX)
            heap_push(heap, &hn, (PairAt){r, i, i + 2});
    while (hn) {
        const PairAt p = heap_pop(heap, &hn);
        const size_t s = p.s, mid = nxt[s], e = p.e;
        if (mid == 0 || mid >= len || nxt[mid] != e)
            continue; /* stale */
        nxt[s] = e;
        nxt[mid] = 0;
        if (e < len) {
            prv[e] = s;
            if ((r = rank_of(t, b + s, nxt[e] - s)) != UINT32_MAX)
                heap_push(heap, &hn, (PairAt){r, s, nxt[e]});
        }
        if (prv[s] != SIZE_MAX && (r = rank_of(t, b + prv[s], e - prv[s])) != UINT32_MAX)
            heap_push(heap, &hn, (PairAt){r, prv[s], e});
    }
    size_t m = 0;
    for (size_t i = 0; i < len; i = nxt[i])
        t->part[m++] = i;
    t->part[m] = len;
    free(nxt);
    free(heap);
    return m;
}

/* Ids of one piece appended to *ids.  A piece that is a token is that
 * token (the reference checks this first); else its bytes are merged: the
 * adjacent pair of parts whose bytes form the lowest-ranked token, leftmost
 * on a tie, until no pair is a token.  part[k] is where part k starts,
 * part_rank[k] the rank of parts k and k+1 together. */
static int encode_piece(Tiktoken *t, const unsigned char *b, size_t len, uint64_t h, int32_t **ids,
                        size_t *n, size_t *cap)
{
    uint64_t v;
    if (grow_ids(ids, cap, *n + len) != 0)
        return -1;
    if (len == 1) {
        (*ids)[(*n)++] = t->byte_rank[b[0]];
        return 0;
    }
    if (strmap_get_hashed(&t->ranks, h, b, len, &v)) {
        (*ids)[(*n)++] = (int32_t)v;
        return 0;
    }
    if (strmap_get_hashed(&t->cache, h, b, len, &v)) {
        size_t off = v >> 24, k = v & CACHE_MAX_WORD_IDS;
        memcpy(*ids + *n, t->cache_ids + off, k * sizeof **ids);
        *n += k;
        return 0;
    }
    if (len + 1 > t->part_cap) {
        size_t c = t->part_cap ? t->part_cap : 256;
        while (c < len + 1)
            c *= 2;
        size_t *p = realloc(t->part, c * sizeof *p);
        if (p)
            t->part = p;
        uint32_t *r = realloc(t->part_rank, c * sizeof *r);
        if (r)
            t->part_rank = r;
        if (!p || !r)
            return -1;
        t->part_cap = c;
    }
    size_t m = len >= MERGE_HEAP_MIN ? merge_long(t, b, len) : merge_short(t, b, len);
    if (m == 0)
        return -1;
    const size_t *part = t->part;
    int32_t *out = *ids + *n;
    for (size_t k = 0; k < m; k++)
        out[k] = (int32_t)rank_of(t, b + part[k], part[k + 1] - part[k]);
    *n += m;
    return cache_add(t, b, len, out, m);
}

int tiktoken_encode(Tiktoken *t, const char *text, size_t len, int32_t **ids, size_t *n,
                    size_t *cap)
{
    int clean;
    size_t rlen = len;
    unsigned char *repaired = unicode_repair((const unsigned char *)text, len, &rlen, &clean);
    if (!clean && !repaired)
        return -1;
    Text x = {clean ? (const unsigned char *)text : repaired, rlen};
    /* Pieces in batches: split, hash and prefetch a batch's slots in the
     * ranks and the cache, then encode it, so that the cache misses of
     * the lookups overlap (docs/data.md, "Speed"). */
    enum { BATCH = 32 };
    size_t start[BATCH + 1];
    uint64_t hash[BATCH];
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < x.len;) {
        int k = 0;
        for (; k < BATCH && i < x.len; k++) {
            start[k] = i;
            i = t->pattern == TIKTOKEN_O200K ? o200k_end(x, i) : cl100k_end(x, i);
            hash[k] = strmap_hash(x.s + start[k], i - start[k]);
            strmap_prefetch(&t->ranks, hash[k]);
            strmap_prefetch(&t->cache, hash[k]);
        }
        start[k] = i;
        for (int p = 0; p < k; p++)
            strmap_prefetch_key(&t->ranks, hash[p]);
        for (int p = 0; rc == 0 && p < k; p++)
            rc = encode_piece(t, x.s + start[p], start[p + 1] - start[p], hash[p], ids, n, cap);
    }
    free(repaired);
    return rc;
}
