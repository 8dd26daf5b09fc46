#include "data/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"
#include "data/spm_shim.h"
#include "data/tiktoken.h"

typedef enum { TOK_BYTE, TOK_GPT2, TOK_TIKTOKEN, TOK_SPM } TokKind;

struct Tokenizer {
    TokKind kind;
    int vocab, eot;
    Bpe bpe;       /* gpt2 only */
    Tiktoken tik;  /* tiktoken only */
    SpmModel *spm; /* sentencepiece only */
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

Tokenizer *tokenizer_hf_json(const char *tokenizer_json, char err[CFG_ERR])
{
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, CFG_ERR, "out of memory for the tokenizer");
        return NULL;
    }
    if (bpe_load_hf(&t->bpe, tokenizer_json, err) != 0) {
        free(t);
        return NULL;
    }
    t->kind = TOK_GPT2; /* GPT-2's algorithm, this file's vocabulary */
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

Tokenizer *tokenizer_sentencepiece(const char *model_path, char err[CFG_ERR])
{
    char why[CFG_ERR];
    if (!model_path) {
        snprintf(err, CFG_ERR, "no SentencePiece model file (--model FILE.model)");
        return NULL;
    }
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, CFG_ERR, "out of memory for the tokenizer");
        return NULL;
    }
    if (!(t->spm = spm_load(model_path, why, sizeof why))) {
        snprintf(err, CFG_ERR, "cannot load the SentencePiece model %.300s: %.400s", model_path,
                 why);
        free(t);
        return NULL;
    }
    /* EOT follows every document (Megatron's append-eod): the model's </s>. */
    if (spm_eos_id(t->spm) < 0) {
        snprintf(err, CFG_ERR,
                 "the SentencePiece model %.300s has no end-of-sentence piece (eos_id -1); "
                 "trident puts it after each document: train the model with an eos_id",
                 model_path);
        spm_free(t->spm);
        free(t);
        return NULL;
    }
    t->kind = TOK_SPM;
    t->vocab = spm_piece_size(t->spm);
    t->eot = spm_eos_id(t->spm);
    return t;
}

void tokenizer_free(Tokenizer *t)
{
    if (!t)
        return;
    if (t->kind == TOK_SPM)
        spm_free(t->spm);
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
    return t->kind == TOK_GPT2       ? "gpt2"
           : t->kind == TOK_TIKTOKEN ? t->tik.name
           : t->kind == TOK_SPM      ? "sentencepiece"
                                     : "byte";
}

int tokenizer_special(const Tokenizer *t, const char *text, size_t len)
{
    if (t->kind == TOK_TIKTOKEN)
        return tiktoken_special(&t->tik, text, len);
    if (t->kind == TOK_SPM)
        return spm_special_id(t->spm, text, len);
    return len == sizeof eot_text - 1 && !memcmp(text, eot_text, len) ? t->eot : -1;
}

int tokenizer_encode(Tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                     size_t *cap)
{
    if (t->kind == TOK_GPT2)
        return bpe_encode(&t->bpe, text, len, ids, n, cap);
    if (t->kind == TOK_TIKTOKEN)
        return tiktoken_encode(&t->tik, text, len, ids, n, cap);
    if (t->kind == TOK_SPM)
        return spm_encode(t->spm, text, len, ids, n, cap);
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

/* SentencePiece text is not the concatenation of its pieces (U+2581 is a
 * space, the first one is dropped, byte pieces join into characters): the
 * library decodes each run of ids in the vocabulary; an id outside it is
 * U+FFFD, and the run after it decodes as a text of its own. */
static char *spm_decode_runs(const Tokenizer *t, const int32_t *ids, size_t n)
{
    static const char fffd[] = "\xEF\xBF\xBD";
    char *out = NULL;
    size_t len = 0, cap = 0, i = 0;
    if (spm_decode(t->spm, ids, 0, &out, &len, &cap) != 0) /* "" when n is 0 */
        return NULL;
    while (i < n) {
        size_t j = i;
        while (j < n && ids[j] >= 0 && ids[j] < t->vocab)
            j++;
        if (j > i && spm_decode(t->spm, ids + i, j - i, &out, &len, &cap) != 0)
            goto fail;
        for (; j < n && (ids[j] < 0 || ids[j] >= t->vocab); j++) {
            if (len + sizeof fffd > cap) {
                char *p = realloc(out, 2 * cap + sizeof fffd);
                if (!p)
                    goto fail;
                out = p;
                cap = 2 * cap + sizeof fffd;
            }
            memcpy(out + len, fffd, sizeof fffd); /* with its NUL */
            len += sizeof fffd - 1;
        }
        i = j;
    }
    return out;
fail:
    free(out);
    return NULL;
}

char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n)
{
    if (t->kind == TOK_SPM)
        return spm_decode_runs(t, ids, n);
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
