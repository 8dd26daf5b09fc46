/* ckpt_internal.h — shared by the files of src/checkpoint, not exported.
 *
 *   ckpt_layout.c  flat ranges -> hyperslabs of the global tensor (pure)
 *   ckpt_index.c   index.h5: write, read, (de)serialise for a broadcast
 *   ckpt_save.c    collective write, publish, keep
 *   ckpt_load.c    resolve and load for any topology
 *   ckpt_cli.c     trident ckpt inspect / export */
#ifndef TRD_CKPT_INTERNAL_H
#define TRD_CKPT_INTERNAL_H

#include <hdf5.h>
#include <stdarg.h>

#include "checkpoint/ckpt.h"

#define CKPT_FORMAT "trident-checkpoint"
#define CKPT_VERSION 1
#define CKPT_KIND_NAME 8
#define CKPT_FILE_NAME 16
#define CKPT_DTYPE_NAME 8
#define CKPT_PATH_NAME (PARAM_NAME + 16)

/* HDF5 group of each kind inside a stage file: "/params/<tensor name>". */
extern const char *const ckpt_kind_names[CKPT_KINDS];

/* ---- layout (ckpt_layout.c) ---- */

/* A 2-D block of the global tensor: rows [r, r+nr), columns [c, c+nc). */
typedef struct {
    int64_t r, c, nr, nc;
} CkptBlock;

/* The part of a tensor that a flat range [a, b) of the local table covers:
 * up to three blocks (partial first row, full middle rows, partial last
 * row), in row-major order, which is also the order of the local elements.
 * Rows at or beyond `real_rows` (vocabulary padding) are cut off: they are a
 * suffix of the local elements, so the kept elements are the contiguous
 * local range [first, first + count). */
typedef struct {
    CkptBlock b[3];
    int n;
    size_t first, count;   /* flat elements of the local table */
} CkptSlab;

/* Global rows stored for p: the unpadded vocabulary for the vocabulary
 * tensors (embeddings, untied head), else shape[0]. */
int64_t ckpt_real_rows(const ParamSpec *p, const ModelConfig *m);

/* The slab of p covered by the flat range [lo, hi) of the local table
 * (n == 0 when they do not meet). */
CkptSlab ckpt_slab(const ParamSpec *p, int64_t real_rows, size_t lo, size_t hi);

/* Chunk shape of a stored tensor: whole rows, about 4 MiB, the same for any
 * topology. */
void ckpt_chunk_dims(int ndim, const int64_t shape[2], hsize_t chunk[2]);

/* ---- index (ckpt_index.c) ---- */

/* One dataset of the checkpoint; also the compound record of /tensors. */
typedef struct {
    char name[PARAM_NAME];
    char kind[CKPT_KIND_NAME];     /* "params", "master", "adam_m", "adam_v" */
    char file[CKPT_FILE_NAME];     /* "stage_0.h5" */
    char dtype[CKPT_DTYPE_NAME];   /* "float32" */
    int32_t ndim, stage;
    int64_t shape[2];              /* global; shape[1] == 1 when ndim == 1 */
    int64_t nbytes;
} CkptEntry;

typedef struct {
    CkptState state;
    uint64_t seed;
    char arch[16], precision[16];
    int layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, tie_embeddings;
    int tp, pp, dp, zero, world;
    int stage_layers[CFG_MAX_STAGES];
    int n;
    CkptEntry *e;
    char *yaml;                    /* the config, NUL-terminated */
} CkptIndex;

/* Write index.h5 (serial; rank 0). Returns 0 or -1 with err. */
int ckpt_index_write(const char *path, const CkptIndex *ix, char err[CFG_ERR]);
/* Read index.h5. Returns 0 or -1 with err naming the file. */
int ckpt_index_read(const char *path, CkptIndex *ix, char err[CFG_ERR]);
void ckpt_index_free(CkptIndex *ix);
/* The entry of (name, kind), or NULL. */
const CkptEntry *ckpt_index_find(const CkptIndex *ix, const char *name, CkptKind kind);
/* One buffer holding ix, for a broadcast, and back (ix owns new memory). */
void *ckpt_index_pack(const CkptIndex *ix, size_t *bytes);
void ckpt_index_unpack(CkptIndex *ix, const void *buf);
/* One line describing the saved model, for error messages. */
void ckpt_index_model_line(const CkptIndex *ix, char *out, size_t n);

/* ---- HDF5 helpers (ckpt_index.c) ---- */

/* Silence HDF5's own error printing while we report errors ourselves. */
void ckpt_h5_quiet(void);
/* The innermost HDF5 error message, for the user ("checksum failed"...). */
void ckpt_h5_reason(char *out, size_t n);
/* Formatted error into err (snprintf semantics, always terminated). */
void ckpt_err(char err[CFG_ERR], const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A dataspace of rank ndim over shape. */
hid_t ckpt_space(int ndim, const int64_t shape[2]);
/* Select the blocks of a slab in a file dataspace (none when empty). */
void ckpt_select(hid_t space, const CkptSlab *s);

#endif
