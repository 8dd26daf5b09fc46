#include "data/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"
#include "data/tiktoken.h"

typedef enum { TOK_BYTE, TOK_GPT2, TOK_TIKTOKEN } TokKind;

struct Tokenizer {
    TokKind kind;
    int vocab, eot;
    Bpe bpe;      /* gpt2 only */
    Tiktoken tik; /* tiktoken only */
};

static const char eot_text[] = "<|endoftext|>";

Tokenizer *tokenizer_byte(void)
{
    Tokenizer *t = calloc(1, sizeof *t);
    if (t) {
        t->kind = TOK_BYTE;
        t->vocab = 257;
        t->eot = 256;
    }
    return t;
}

Tokenizer *tokenizer_gpt2(const char *encoder_json, const char *vocab_bpe, char err[CFG_ERR])
{
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, CFG_ERR, "out of memory for the tokenizer");
        return NULL;
    }
    if (bpe_load(&t->bpe, encoder_json, vocab_bpe, err) != 0) {
        free(t);
        return NULL;
    }
    t->kind = TOK_GPT2;
    t->vocab = t->bpe.vocab;
    t->eot = t->bpe.eot;
    return t;
}

Tokenizer *tokenizer_tiktoken(const char *ranks, const char *encoding, char err[CFG_ERR])
{
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, CFG_ERR, "out of memory for the tokenizer");
        return NULL;
    }
    if (tiktoken_load(&t->tik, ranks, encoding, err) != 0) {
        free(t);
        return NULL;
    }
    t->kind = TOK_TIKTOKEN;
    t->vocab = t->tik.vocab;
    t->eot = t->tik.eot;
    return t;
}

void tokenizer_free(Tokenizer *t)
{
    if (!t)
        return;
    if (t->kind == TOK_GPT2)
        bpe_free(&t->bpe);
    if (t->kind == TOK_TIKTOKEN)
        tiktoken_free(&t->tik);
    free(t);
}

int tokenizer_vocab(const Tokenizer *t) { return t->vocab; }
int tokenizer_eot(const Tokenizer *t) { return t->eot; }
const char *tokenizer_name(const Tokenizer *t)
{
    return t->kind == TOK_GPT2 ? "gpt2" : t->kind == TOK_TIKTOKEN ? t->tik.name : "byte";
}

int tokenizer_encode(Tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                     size_t *cap)
{
    if (t->kind == TOK_GPT2)
        return bpe_encode(&t->bpe, text, len, ids, n, cap);
    if (t->kind == TOK_TIKTOKEN)
        return tiktoken_encode(&t->tik, text, len, ids, n, cap);
    if (*n + len > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *n + len)
            c *= 2;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p)
            return -1;
        *ids = p;
        *cap = c;
    }
    for (size_t i = 0; i < len; i++)
        (*ids)[(*n)++] = (unsigned char)text[i];
    return 0;
}

/* The bytes of one id (a pointer into static or tokenizer memory). */
static const unsigned char *token_bytes(const Tokenizer *t, int32_t id, size_t *len,
                                        unsigned char *scratch)
{
    if (id < 0 || id >= t->vocab) {
        *len = 3;
        return (const unsigned char *)"\xEF\xBF\xBD"; /* U+FFFD */
    }
    if (t->kind == TOK_GPT2) {
        *len = t->bpe.tok_off[id + 1] - t->bpe.tok_off[id];
        return t->bpe.tok_bytes + t->bpe.tok_off[id];
    }
    if (t->kind == TOK_TIKTOKEN) {
        *len = t->tik.tok_off[id + 1] - t->tik.tok_off[id];
        return t->tik.tok_bytes + t->tik.tok_off[id];
    }
    if (id == t->eot) {
        *len = sizeof eot_text - 1;
        return (const unsigned char *)eot_text;
    }
    *scratch = (unsigned char)id;
    *len = 1;
    return scratch;
}

char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n)
{
    size_t total = 0, len;
    unsigned char scratch;
    for (size_t i = 0; i < n; i++) {
        token_bytes(t, ids[i], &len, &scratch);
        total += len;
    }
    char *out = malloc(total + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = token_bytes(t, ids[i], &len, &scratch);
        memcpy(out + o, p, len);
        o += len;
    }
    out[o] = '\0';
    return out;
}
