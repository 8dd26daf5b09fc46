/* stream.h — one dataset made of many shards, opened lazily.
 *
 * A TokenStream is the concatenation, in a fixed order, of the token
 * streams of its shards: Megatron prefixes or llm.c shards, given as a
 * comma-separated list of paths and quoted glob patterns ("data/web-*",
 * "a,b").  A pattern expands to its matches in byte order (for Megatron, a
 * prefix per .bin/.idx pair); the list keeps the order it is given in.
 *
 * Opening reads each shard's header only (a few bytes and a stat), so a
 * dataset of 10,000 shards maps nothing at start.  A shard is mapped and
 * fully checked (dataset_open) when a read first touches it, and at most
 * STREAM_MAX_MAPPED shards stay mapped: the least recently used is
 * unmapped first (mapped again later without walking its index again).  Not thread-safe: one reader per stream. */
#ifndef TRD_DATA_STREAM_H
#define TRD_DATA_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "data/dataset.h"

#define STREAM_MAX_MAPPED 1024 /* two mappings each: well inside vm.max_map_count */

typedef struct {
    char *path;     /* the prefix (megatron) or the file (llmc) */
    uint64_t first; /* stream position of its first token */
    uint64_t n_tokens, n_docs;
    int token_bytes;
    TokenDataset *ds; /* NULL while not mapped */
    uint64_t used;    /* last use, for the LRU */
    int checked;      /* its index was walked once: later maps skip that */
    int has_mask;     /* a loss mask beside it (dataset.h) */
} StreamShard;

typedef struct {
    char name[CFG_PATHS]; /* the spec it was opened from, for messages */
    DataFormat format;
    StreamShard *shards;
    int n_shards;
    uint64_t n_tokens, n_docs;
    int token_bytes;        /* the widest shard's */
    int n_mapped, n_opened; /* mapped now; mappings made so far */
    uint64_t clock;
    int last;     /* shard of the last read: reads are mostly local */
    int has_mask; /* every shard has a loss mask (all or none may) */
} TokenStream;

/* Expand spec and read every shard's header.  0, or -1 with a message
 * naming the pattern or file in err (nothing left open). */
int stream_open(TokenStream *s, const char *spec, DataFormat fmt, char err[CFG_ERR]);
void stream_close(TokenStream *s);

/* Tokens [first, first + n) of the stream into out (ids as uint32: an
 * int32 token that is negative reads as a huge id).  Maps shards as
 * needed; -1 with err when a shard fails its checks on first use. */
int stream_read(TokenStream *s, uint64_t first, size_t n, uint32_t *out, char err[CFG_ERR]);

/* The loss mask of tokens [first, first + n) into out (0 or 1; all 1 for
 * a stream without masks).  Maps shards as stream_read does. */
int stream_read_mask(TokenStream *s, uint64_t first, size_t n, uint8_t *out, char err[CFG_ERR]);

/* The shard holding stream position pos (pos < n_tokens). */
int stream_shard_of(const TokenStream *s, uint64_t pos);

#endif
