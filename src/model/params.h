/* params.h — the parameter table: the one place a parameter's layout is said.
 *
 * Every parameter has a name ("layers.7.attn.qkv.weight"), a global shape,
 * the dimension split over tensor parallelism, the layer it belongs to (which
 * decides its pipeline stage), and how it is initialised.  Local shapes,
 * offsets in the flat buffers, gradient buckets, optimizer shards and
 * checkpoint hyperslabs are all derived from this table (docs/design.md).
 *
 * Order in the flat buffer: the "outer" tensors first (embeddings, final
 * norm, head), then layer 0..L-1, each layer contiguous.  Backward finishes
 * layers last to first and the outer tensors at the very end (a tied
 * embedding gets its last gradient from the embedding backward), so the
 * buffer's tail is ready first: what gradient buckets and ZeRO want.
 * Where expert parallelism divides the experts (ParamShard.ep > 1) their
 * stacked tensors come after all that, in an expert region of their own
 * (ParamSpec.ep_region, ParamTable.dense_numel). */
#ifndef TRD_PARAMS_H
#define TRD_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "config/config.h"

#define PARAM_NAME 64

/* INIT_UNIFORM: uniform in [-std, std) (LoRA's A, as PEFT's kaiming_uniform_
 * with a = sqrt(5) draws it: bound 1/sqrt(in)). */
typedef enum { INIT_NORMAL = 0, INIT_ZEROS = 1, INIT_ONES = 2, INIT_UNIFORM = 3 } InitKind;
typedef enum { ROLE_EMBED = 0, ROLE_BLOCK = 1, ROLE_HEAD = 2 } ParamRole;

typedef struct {
    char name[PARAM_NAME];
    int ndim;         /* 1 or 2 */
    int64_t shape[2]; /* global shape (vocabulary rows padded) */
    int split_dim;    /* split over TP: -1 replicated, 0 rows, 1 columns */
    ParamRole role;   /* embeddings: first stage; head: last stage */
    int layer;        /* transformer layer for ROLE_BLOCK, else -1 */
    int decay;        /* AdamW weight decay applies (not norms, biases) */
    InitKind init;
    float std; /* for INIT_NORMAL */

    /* This rank's piece. */
    int64_t local_shape[2];
    int64_t local_start[2]; /* first global row/column held */
    size_t numel;           /* local elements */
    size_t offset;          /* element offset in the rank's flat buffers */

    /* Replicated kv heads (the fused qkv weight and bias when tp > kv_heads,
     * tp % kv_heads == 0).  Each rank holds its query heads' rows, then the
     * k and v rows of their kv group, which kv_share = tp / kv_heads
     * consecutive TP ranks hold alike: local rows [0, kv_row) are global rows
     * local_start[0] + r, local rows [kv_row, local_shape[0]) are global rows
     * kv_start + (r - kv_row).  Otherwise kv_share = 1, kv_row =
     * local_shape[0] (every row is contiguous).  Use params_global_row. */
    int kv_share;
    int64_t real_rows; /* global rows that carry information: the vocabulary
                               * for wte/head (rows past it are padding, zero from
                               * init on and never updated), else shape[0] */
    int tied_copy;     /* the last stage's copy of a tied embedding: owned by
                               * the first stage (params_row_owned says 0 here) */
    int64_t kv_row, kv_start;
    /* A MoE layer's stacked experts split over TP by the rows of each
     * expert (fc, gate, up weights, the fc bias): the global rows are
     * row_blocks equal blocks (one per expert) and this rank holds rows
     * [local_start[0], local_start[0] + local_shape[0] / row_blocks) of each
     * block, in block order; block_rows global rows apart (R, an expert's
     * rows).  Else 1.  Use params_global_row. */
    int row_blocks;
    int64_t block_rows;
    /* A stacked experts tensor of a table whose experts are divided over
     * expert parallelism (ParamShard.ep > 1): this rank holds the rows of
     * its ep_rank's E / ep experts only (each split over TP as above), and
     * the tensor is stored after every dense one, in the expert region
     * [dense_numel, numel) of the flat buffer. */
    int ep_region;
} ParamSpec;

/* Which part of the model this rank holds: its tensor-parallel piece of
 * one or more model chunks.  A plain pipeline stage holds one chunk of
 * consecutive layers; an interleaved one (topology.virtual_stages v) holds
 * v chunks, ascending and disjoint (pp_schedule.h: chunk c of pipeline rank r
 * is the model stage c * pp + r).  The flat buffers hold the outer tensors,
 * then the held layers in ascending order. */
typedef struct {
    int begin, end; /* transformer layers [begin, end) */
} LayerRange;

typedef struct {
    int tp, tp_rank;
    int n_chunks; /* >= 1 */
    LayerRange chunk[CFG_MAX_VIRTUAL];
    int has_embed, has_head; /* embeddings (first model stage) / final norm
                                    and head (last model stage) */
    /* Expert parallelism dividing the experts' memory (config_ep_divides):
     * ep > 1 holds experts [ep_rank * E/ep, (ep_rank + 1) * E/ep) of every
     * MoE layer only (ParamSpec.ep_region).  1 (or 0): every expert. */
    int ep, ep_rank;
} ParamShard;

/* The one-chunk shard of chunk c of sh: its layers, the embeddings if c is
 * the first chunk and sh has them, the head if c is the last and sh has it. */
ParamShard params_chunk_shard(const ParamShard *sh, int c);

/* Layers held over all chunks. */
int params_shard_layers(const ParamShard *sh);

/* The chunk of sh holding layer l, or -1. */
int params_shard_chunk_of(const ParamShard *sh, int l);

typedef struct {
    ParamSpec *p;
    int n;
    size_t numel;        /* total local elements */
    size_t global_numel; /* elements of the whole (unsharded) model */
    int tp, tp_rank;     /* of the shard the table was built for */
    int ep, ep_rank;     /* ditto (ParamShard.ep; 1: every expert held) */
    size_t dense_numel;  /* elements before the expert region (numel unless ep > 1) */
} ParamTable;

/* The single-rank shard: everything. */
ParamShard params_full_shard(const ModelConfig *m);

/* Padded vocabulary: a multiple of tp * vocab_pad_multiple. */
int params_padded_vocab(const ModelConfig *m, int tp);

/* Build the table for this shard (allocates t->p): the TRAINED parameters.
 * Without LoRA (model.lora.rank 0) the whole model; with LoRA only the
 * adapters, per layer and target (LORA_* order) "layers.L.<base>.lora_A"
 * [r, in] and ".lora_B" [out, r] (base: attn.qkv, attn.proj, mlp.fc or
 * mlp.gate, mlp.up, mlp.proj or mlp.down).  A column-parallel base (qkv,
 * fc/gate, up: rows split) has B split like its rows and A replicated; a
 * row-parallel one (proj, down: columns split) has A split by columns and
 * B replicated.  B starts at zero, A uniform in +-1/sqrt(in) (PEFT's
 * default), so the adapted model starts as its base. */
void params_build(ParamTable *t, const ModelConfig *m, const ParamShard *sh);
/* The model's weights whatever model.lora says: with LoRA the frozen base
 * the adapters apply to (same names and layout as a plain model's table). */
void params_build_base(ParamTable *t, const ModelConfig *m, const ParamShard *sh);
void params_free(ParamTable *t);

/* Groups of the flat buffer that are gathered, bound and reduced together:
 * PARAMS_OUTER (embeddings, final norm, head) or a global layer index. */
#define PARAMS_OUTER (-1)
/* With the experts divided over ep (ParamSpec.ep_region), a layer's group
 * is its dense tensors; its stacked experts are the group
 * PARAMS_EXPERTS(l), in the expert region (empty when not divided). */
#define PARAMS_EXPERTS(l) (-2 - (l))
/* Flat range [lo, hi) of a group on this rank (empty when not held). */
void params_group_range(const ParamTable *t, int group, size_t *lo, size_t *hi);

/* Find a parameter by name (NULL when this rank does not hold it). */
const ParamSpec *params_find(const ParamTable *t, const char *name);

/* Initialise this rank's piece: element (r, c) of the global tensor gets a
 * value that is a pure function of (seed, name, r*cols + c). */
void params_init(const ParamTable *t, float *buf, uint64_t seed);
/* The same for the flat range [lo, hi) only, written to buf[0 .. hi-lo)
 * (a ZeRO-3 shard initialises just what it owns). */
void params_init_range(const ParamTable *t, float *buf, uint64_t seed, size_t lo, size_t hi);

/* Global row of local row r (see kv_share above; columns are always
 * local_start[1] + c). */
static inline int64_t params_global_row(const ParamSpec *p, int64_t r)
{
    if (p->row_blocks > 1) {
        const int64_t mine = p->local_shape[0] / p->row_blocks;
        return r / mine * p->block_rows + p->local_start[0] + r % mine;
    }
    return r < p->kv_row ? p->local_start[0] + r : p->kv_start + (r - p->kv_row);
}

/* Is this TP rank the one owner of local row r of p?  Split rows have one
 * holder; replicated tensors (split_dim -1) are owned by TP rank 0, and
 * replicated kv rows by the first of the kv_share ranks holding them.
 * Checkpoint writers and the gradient norm count each element once this way. */
int params_row_owned(const ParamTable *t, const ParamSpec *p, int64_t r);

/* Sum of squares (in double) of a gradient over the flat range [lo, hi) of
 * this rank's buffers, g[0] being element lo (in be's memory), counting only
 * the elements this TP rank owns (params_row_owned).  Summed over the TP
 * group (and the pipeline stages, and ZeRO's shards) it is the squared norm
 * of the whole model's gradient, replicated tensors counted once. */
double params_grad_sumsq(const ParamTable *t, const Backend *be, const float *g, size_t lo,
                         size_t hi);
/* The same sum into state->sumsq, with the step's decision from it (the
 * backend's grad_check, clip the gradient clipping threshold): all of it
 * in be's memory, for a run whose whole gradient is this rank's (one rank:
 * no sum over other ranks to wait for). */
void params_grad_check(const ParamTable *t, const Backend *be, const float *g, size_t lo, size_t hi,
                       BackendStepState *state, float clip);

/* Parameters of the whole model that actually carry information (padding
 * rows excluded), for reporting and FLOP counts. */
size_t params_count_real(const ModelConfig *m);
/* Of those, the ones a token goes through: with model.moe, top_k of the
 * experts of each MoE layer (and its router and shared experts); the
 * whole model for a dense one. */
size_t params_count_active(const ModelConfig *m);

#endif
