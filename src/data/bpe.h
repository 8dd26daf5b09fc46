/* bpe.h — GPT-2 byte-level BPE (internal to src/data; the public face is
 * tokenizer.h).  Symbols are token ids from the start: a word's bytes map
 * to the ids of their one-byte tokens, and the merge table maps a pair of
 * ids to (rank, merged id). */
#ifndef TRD_DATA_BPE_H
#define TRD_DATA_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "data/strmap.h"

typedef struct {
    int vocab, eot;
    int32_t byte_id[256];     /* token of each single byte */
    unsigned char *tok_bytes; /* raw bytes of token i: [tok_off[i], tok_off[i+1]) */
    size_t *tok_off;          /* vocab + 1 entries */
    StrMap pairs;             /* (int32 a, int32 b) -> rank << 32 | merged id */
    StrMap cache;             /* word bytes -> offset << 24 | count in cache_ids */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
    int32_t *work; /* symbols of the word being merged */
    size_t work_cap;
} Bpe;

/* Read encoder.json and vocab.bpe.  0, or -1 with err naming the file. */
int bpe_load(Bpe *b, const char *encoder_json, const char *vocab_bpe, char err[CFG_ERR]);
void bpe_free(Bpe *b);
/* Pre-tokenize with GPT-2's pattern, merge each piece, append the ids. */
int bpe_encode(Bpe *b, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap);

/* GPT-2's reversible map from bytes to printable code points: the
 * printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map
 * to themselves, the other 68 bytes to U+0100.. in byte order. */
uint32_t bpe_byte_to_cp(unsigned char b);
/* The inverse: the byte of a code point, or -1 when cp is not one. */
int bpe_cp_to_byte(uint32_t cp);

#endif
