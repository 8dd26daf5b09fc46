/* dataset.h — token datasets on disk, read with mmap, and their writers.
 *
 * Two formats (docs/data.md has the byte layouts):
 *   - Megatron-LM indexed datasets: PREFIX.bin holds the tokens of every
 *     document back to back, PREFIX.idx the sequence lengths, byte pointers
 *     and document boundaries.  Token dtype uint16 or int32.
 *   - llm.c token shards: one file, a header of 256 int32 (magic 20240520,
 *     version 1, token count) followed by uint16 tokens.
 *
 * Either way a TokenDataset is one flat stream of tokens (documents with
 * their EOT separators, concatenated); the sampler cuts samples from it.
 * Nothing is copied: the files are mapped read-only and shared through the
 * page cache by every rank of a node. */
#ifndef TRD_DATA_DATASET_H
#define TRD_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

typedef struct {
    char path[CFG_STR]; /* what was opened: the prefix (megatron) or the file (llmc) */
    DataFormat format;
    void *bin_map;
    size_t bin_bytes; /* mapping of the token file */
    void *idx_map;
    size_t idx_bytes;   /* megatron .idx mapping (NULL for llmc) */
    const void *tokens; /* first token */
    int token_bytes;    /* 2 (uint16) or 4 (int32) */
    uint64_t n_tokens;
    uint64_t n_docs; /* megatron: documents in the index; llmc: 1 per shard
                                  * (the format has no document index) */
    /* Megatron: the loss mask PREFIX.mask beside the pair when there is one
     * (prepare-data --template): a byte per token, 1 trained, 0 not. */
    int has_mask;
    void *mask_map;
    size_t mask_bytes;
    const uint8_t *mask; /* NULL when none */
} TokenDataset;

/* Open and validate a dataset.  Megatron: `path` is the prefix (a path
 * ending in .bin or .idx is accepted too).  llmc: `path` is one .bin shard.
 * Returns 0, or -1 with a message naming the file in err (nothing mapped). */
int dataset_open(TokenDataset *ds, const char *path, DataFormat fmt, char err[CFG_ERR]);
/* dataset_open for a file opened and checked before (check 0): the .idx
 * header and the sizes are checked again, the sequence table is not
 * walked, so mapping a large shard again costs no pass over its index. */
int dataset_reopen(TokenDataset *ds, const char *path, DataFormat fmt, int check,
                   char err[CFG_ERR]);
void dataset_close(TokenDataset *ds);

/* The header of a dataset only, nothing mapped: path, format, token width,
 * and counts (n_tokens from the .bin's size; dataset_open checks that the
 * index agrees).  The same errors as dataset_open for the header. */
int dataset_probe(TokenDataset *ds, const char *path, DataFormat fmt, char err[CFG_ERR]);

/* Token i of the stream (i < n_tokens).  int32 tokens are returned as their
 * bit pattern, so a negative id reads as a huge one and fails vocab checks. */
static inline uint32_t dataset_token(const TokenDataset *ds, uint64_t i)
{
    if (ds->token_bytes == 2)
        return ((const uint16_t *)ds->tokens)[i];
    return (uint32_t)((const int32_t *)ds->tokens)[i];
}

/* Token width a writer should use for a vocabulary: 2 when every id fits
 * in uint16, else 4. */
int dataset_token_bytes_for_vocab(int vocab);

/* Writer of Megatron-LM indexed datasets.  Each document is one sequence.
 * The files are written as PREFIX.bin.tmp / PREFIX.idx.tmp and renamed on
 * close, so a crash never leaves a half-written dataset under the real name. */
typedef struct DatasetWriter DatasetWriter;
DatasetWriter *dataset_writer_open(const char *prefix, int token_bytes, char err[CFG_ERR]);
int dataset_writer_add(DatasetWriter *w, const int32_t *tokens, size_t n,
                       char err[CFG_ERR]);                     /* one document */
int dataset_writer_close(DatasetWriter *w, char err[CFG_ERR]); /* frees w, also on error */

/* Writer of llm.c token shards: header of 256 int32 (magic 20240520,
 * version 1, token count), then uint16 tokens.  Errors on ids > 65535. */
int dataset_write_llmc(const char *path, const int32_t *tokens, size_t n, char err[CFG_ERR]);

/* Sequence i's length in tokens in a Megatron dataset (i below the .idx's
 * sequence count, which is n_docs for the datasets prepare-data writes: one
 * sequence per document); -1 for an llm.c shard or an i out of range. */
int64_t dataset_sequence_length(const TokenDataset *ds, uint64_t i);

/* One dataset written in parts by several processes at once (prepare-data
 * under MPI, docs/data.md).  Its totals are known before anything is
 * written, so each part has its place: its first document and first token.
 * One process makes the files at their final sizes (dataset_parts_create),
 * each writes its documents at their place (dataset_part_open, _add,
 * _close), and when all are done one process renames the files
 * (dataset_parts_publish).  Megatron: PREFIX.bin.tmp and PREFIX.idx.tmp,
 * renamed .bin first (the .idx makes the pair visible); llm.c (llmc):
 * PREFIX.bin.tmp, one shard, uint16 tokens. */
typedef struct {
    const char *prefix;
    int llmc, token_bytes;
    uint64_t docs, tokens; /* of the whole dataset */
} DatasetShape;
typedef struct DatasetPart DatasetPart;
int dataset_parts_create(const DatasetShape *s, char err[CFG_ERR]);
DatasetPart *dataset_part_open(const DatasetShape *s, uint64_t first_doc, uint64_t first_token,
                               char err[CFG_ERR]);
/* n_docs more documents: their lengths, and their tokens back to back
 * (token_bytes each, already in the file's width). */
int dataset_part_add(DatasetPart *p, const void *tokens, const int32_t *lengths, size_t n_docs,
                     char err[CFG_ERR]);
int dataset_part_close(DatasetPart *p, char err[CFG_ERR]); /* frees p, also on error */
int dataset_parts_publish(const DatasetShape *s, char err[CFG_ERR]);

#define DATASET_LLMC_MAGIC       20240520
#define DATASET_LLMC_VERSION     1
#define DATASET_LLMC_HEADER_INTS 256

#endif
