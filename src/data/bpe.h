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

/* A slot of the merge table: the pair of ids (a, b) as one integer,
 * (a << 32 | b) + 1 (0: an empty slot), and rank << 32 | merged id.  The
 * merge loop looks pairs up many times per new word: an integer key needs
 * no bytes hashed or compared, and a slot is one read. */
typedef struct {
    uint64_t key, val;
} BpePair;

static inline uint64_t bpe_pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
}

/* The slot a key's probe starts at, in a table of 1 << bits slots. */
static inline size_t bpe_pair_slot(uint64_t key, int bits)
{
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> (64 - bits));
}

typedef struct {
    int vocab, eot;
    int32_t byte_id[256];     /* token of each single byte */
    unsigned char *tok_bytes; /* raw bytes of token i: [tok_off[i], tok_off[i+1]) */
    size_t *tok_off;          /* vocab + 1 entries */
    BpePair *pairs;           /* merge table, open addressing: (a, b) -> rank << 32 | merged id */
    int pair_bits;            /* 1 << pair_bits slots, at least twice the pairs */
    StrMap cache;             /* word bytes -> offset << 24 | count in cache_ids */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
    int32_t *work; /* symbols of the word being merged */
    size_t work_cap;
} Bpe;

/* Read encoder.json and vocab.bpe.  0, or -1 with err naming the file. */
int bpe_load(Bpe *b, const char *encoder_json, const char *vocab_bpe, char err[CFG_ERR]);
/* The same tables from a Hugging Face tokenizer.json of GPT-2's kind
 * (model BPE, pre_tokenizer ByteLevel with GPT-2's pattern): model.vocab,
 * model.merges and added_tokens.  Other kinds (WordPiece, Unigram, other
 * pre-tokenizers) are refused naming them.  0, or -1 with err. */
int bpe_load_hf(Bpe *b, const char *tokenizer_json, char err[CFG_ERR]);
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
