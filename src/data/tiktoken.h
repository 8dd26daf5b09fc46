/* tiktoken.h — tiktoken-format byte-level BPE (internal to src/data; the
 * public face is tokenizer.h): cl100k_base (GPT-3.5/4) and o200k_base
 * (GPT-4o) read from a `.tiktoken` ranks file.
 *
 * A ranks file has one token per line: its bytes in base64, a space, its
 * rank (= id).  The encoding names the pre-tokenizer pattern and the
 * special tokens, which the file does not hold.  Encoding splits the text
 * with the pattern, then merges each piece's bytes: repeatedly the adjacent
 * pair whose concatenation has the lowest rank (leftmost on a tie), as
 * tiktoken and the reference js-tiktoken do.  Text that spells a special
 * token is encoded as ordinary text (tiktoken's encode_ordinary), so a
 * document cannot inject an EOT. */
#ifndef TRD_DATA_TIKTOKEN_H
#define TRD_DATA_TIKTOKEN_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "data/strmap.h"

typedef enum { TIKTOKEN_CL100K = 0, TIKTOKEN_O200K } TiktokenPattern;

typedef struct {
    const char *name; /* "cl100k_base" */
    TiktokenPattern pattern;
    int vocab, eot;           /* ids 0..vocab-1; eot = <|endoftext|> */
    int32_t byte_rank[256];   /* token of each single byte */
    StrMap ranks;             /* token bytes -> rank */
    unsigned char *tok_bytes; /* bytes of id i: [tok_off[i], tok_off[i+1]); empty for gaps */
    size_t *tok_off;          /* vocab + 1 entries */
    StrMap cache;             /* piece bytes -> offset << 24 | count in cache_ids */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
    size_t *part;        /* merge scratch: part boundaries */
    uint32_t *part_rank; /* and the rank of each pair of parts */
    size_t part_cap;
} Tiktoken;

/* Names of the encodings, for messages: "cl100k_base or o200k_base". */
extern const char tiktoken_encodings[];

/* Read a ranks file for an encoding.  0, or -1 with err naming the file
 * (and line) when it is missing or malformed, or does not fit the
 * encoding (rank count, special ids). */
int tiktoken_load(Tiktoken *t, const char *ranks_path, const char *encoding, char err[CFG_ERR]);
void tiktoken_free(Tiktoken *t);
/* The id of the special token spelled by text[0..len) ("<|endofprompt|>"),
 * or -1 when the encoding has none of that name. */
int tiktoken_special(const Tiktoken *t, const char *text, size_t len);
/* Append the ids of len bytes of text (ill-formed UTF-8 reads as U+FFFD).
 * 0, or -1 when out of memory. */
int tiktoken_encode(Tiktoken *t, const char *text, size_t len, int32_t **ids, size_t *n,
                    size_t *cap);

#endif
