/* ckpt.h — sharded HDF5 checkpoints in the global layout.
 *
 * A checkpoint is a directory <dir>/step_<8 digits>/ holding
 *   index.h5      names -> files, global shapes, dtypes, training state,
 *                 model, topology and the config (YAML text) of the run
 *   config.yaml   the same config, for people
 *   stage_<k>.h5  the tensors of pipeline stage k of the saving run
 * Every tensor (weights, or in bf16 training the fp32 master weights, whose
 * bf16 rounding the weights are; Adam m and v) is stored once with its GLOBAL shape and the real (unpadded)
 * vocabulary rows, so a checkpoint does not depend on the topology that wrote
 * it: any (tp, pp, dp, zero, stage_layers) reads exactly the hyperslabs it
 * needs.  Every dataset carries checksums of its row blocks (attributes,
 * computed by its writers together) that every read verifies.
 * docs/checkpoint.md documents the layout for h5py.
 *
 * Writing: each stage file is created by the ranks of that stage together
 * (MPI-IO); each rank writes its TP slice restricted to its ZeRO block, and
 * a piece held by several ranks has one writer.  The step becomes visible
 * only after every rank has closed its file: rank 0 then renames
 * step_X.tmp -> step_X and moves <dir>/latest (docs/design.md, invariant 2). */
#ifndef TRD_CKPT_H
#define TRD_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "config/config.h"
#include "model/params.h"

/* What a checkpoint stores per parameter; also the index of CkptShardView.part. */
typedef enum {
    CKPT_PARAMS = 0,
    CKPT_MASTER = 1,
    CKPT_ADAM_M = 2,
    CKPT_ADAM_V = 3,
    CKPT_KINDS = 4
} CkptKind;

/* One buffer over the flat range [lo, hi) of the local parameter table:
 * data[0] is flat element lo.  data == NULL: this rank has none of it (e.g.
 * no master weights in fp32, or a loader that only wants the weights). */
typedef struct {
    float *data;
    size_t lo, hi;
    /* A second run [xlo, xhi), stored in data after the first (hi - lo
     * floats on): a ZeRO 1-3 optimizer (and ZeRO 3's weights) with the
     * experts divided over ep owns a block of the dense region and one of
     * the expert region (zero.h).
     * Empty (xlo == xhi) otherwise.  Use ckpt_range_n and ckpt_range_at. */
    size_t xlo, xhi;
} CkptRange;

/* Floats held by r; where flat element i (in one of its runs) is. */
static inline size_t ckpt_range_n(const CkptRange *r) { return r->hi - r->lo + r->xhi - r->xlo; }
static inline float *ckpt_range_at(const CkptRange *r, size_t i)
{
    return i >= r->lo && i < r->hi ? r->data + (i - r->lo)
                                   : r->data + (r->hi - r->lo) + (i - r->xlo);
}

/* A rank's view of the state it holds, for save and load. */
typedef struct {
    const ParamTable *table; /* local table: TP slice, this stage's layers; rows
                                  a TP rank does not own (params_row_owned) are
                                  written by their owner */
    CkptRange part[CKPT_KINDS];
    /* The ZeRO block of this DP rank, [r*S, (r+1)*S) ∩ [0, P): on save a rank
     * writes part ∩ block only, so a range that all DP ranks hold (weights
     * under ZeRO 0-2, optimizer state under ZeRO 0) is written once, in
     * parallel, in dp pieces. */
    size_t block_lo, block_hi;
    /* Experts divided over ep (ParamTable.ep > 1): block is this rank's
     * block of the dense region [0, dense_numel) over dp, and xblock its
     * block of the expert region [dense_numel, P) over the dp / ep ranks
     * holding the same experts (dp rank / ep of dp / ep), through which
     * the expert tensors are written.  Else xblock is empty. */
    size_t xblock_lo, xblock_hi;
    int pp_rank;           /* the stage file this rank writes */
    int dp_rank, dp, zero; /* dp, zero recorded in the index (tp: from the table) */
    Comm *world;           /* every rank of the job (all take part in save/load) */
} CkptShardView;

/* The usual layouts of src/zero (zero.h): sets block from (dp_rank, dp),
 * part[].lo/hi for ZeRO `zero` (weights [0,P) for 0-2, the block for 3;
 * optimizer state [0,P) for 0, the block for 1-3; with the experts divided
 * over ep the blocks are the dense one, and xblock as part's second run)
 * and clears every data pointer: the caller then points part[k].data at
 * its buffers. */
void ckpt_view_init(CkptShardView *v, const ParamTable *t, int zero, int dp_rank, int dp,
                    int pp_rank, Comm *world);

/* Training state saved with the tensors. */
typedef struct {
    int64_t step;              /* optimizer steps completed */
    uint64_t sampler_position; /* next position of the global sample stream */
    int64_t lr_step;           /* LR schedule position */
    int64_t adam_t;            /* Adam bias-correction count (Optimizer.t) */
    uint64_t rng[4];           /* reserved for RNG states (none beyond seed+step today) */
} CkptState;

/* Save step st->step into <dir>/step_<8 digits>/, publish it and keep the
 * newest `keep` published steps (never removing the one just written).
 * Collective over v->world.  Returns 0, or -1 with the same message on every
 * rank: bad input (directory not creatable, existing non-directory), an I/O
 * failure (disk full: the path), or a non-finite value in a tensor (its
 * name).  Nothing is then published: step_X.tmp is removed, the previous
 * checkpoint and `latest` are untouched.  Steps found in a dir without
 * `latest` are never replaced or pruned (docs/checkpoint.md). */
int ckpt_save(const char *dir, const CkptShardView *v, const CkptState *st, const Config *cfg,
              int keep, char err[CFG_ERR]);

/* ---- checkpoint.async: the same save, written by a thread from a host
 * snapshot while training goes on (ckpt_async.c) ---- */
typedef struct CkptAsync CkptAsync;

/* What a finished background write took (MPI_Wtime seconds). */
typedef struct {
    int64_t step;
    double t_start, t_end; /* ckpt_save on the writer thread */
    double waited_s;       /* the caller blocked in ckpt_async_wait */
} CkptAsyncDone;

/* Host bytes of a snapshot of v: every part with data, fp32. */
size_t ckpt_async_bytes(const CkptShardView *v);
/* A snapshot shaped like v and a duplicate of v->world for the writer.
 * own: its buffers are allocated here (ckpt_async_bytes); else v's own
 * buffers are the snapshot (a device backend's host copies, which nothing
 * else touches between saves).  Needs MPI_THREAD_MULTIPLE (comm_threads).
 * Collective over v->world. */
CkptAsync *ckpt_async_create(const CkptShardView *v, int own);
/* Fill the snapshot, with no write in flight: src[k] over [part.lo,
 * part.hi) is copied in (NULL: the buffer holds it already, a device's host
 * copy), counting non-finite values on the way.  Returns 0, or -1 with the
 * same message on every rank naming the step and the first tensor holding
 * one (nothing is then to be written: a synchronous save refuses the same
 * step).  Collective over the world. */
int ckpt_async_snapshot(CkptAsync *a, const float *const src[CKPT_KINDS], int64_t step,
                        char err[CFG_ERR]);
/* Write the snapshot as step st->step into dir (ckpt_save's rules, keep)
 * on a thread and return at once.  No write may be in flight; cfg must
 * stay valid until the write is waited for.  Every rank calls it. */
void ckpt_async_start(CkptAsync *a, const char *dir, const CkptState *st, const Config *cfg,
                      int keep);
/* Whether a write was started and not yet waited for (a may be NULL). */
int ckpt_async_in_flight(const CkptAsync *a);
/* Whether this rank's writer has returned (or none is in flight); no MPI. */
int ckpt_async_finished(const CkptAsync *a);
/* Block until the write in flight has published its step or failed;
 * done gets its timings (step 0 when none was in flight).  Returns 0, or
 * -1 with ckpt_save's message, the same on every rank (nothing published,
 * `latest` unchanged).  Every rank calls it at the same point. */
int ckpt_async_wait(CkptAsync *a, CkptAsyncDone *done, char err[CFG_ERR]);
/* Wait for a write in flight, then free.  Collective over the world. */
void ckpt_async_free(CkptAsync *a);

/* Load a step directory into the view (any topology).  Reads part[k] where
 * data != NULL; padded vocabulary rows are not read.  A part that every DP
 * rank holds whole ([0, P), dp > 1) is read in ZeRO blocks, one per DP rank,
 * and all-gathered over the DP group (ranks with this pp_rank and tp rank),
 * so the files are read once, not dp times.  Fallbacks
 * across precisions: master wanted but not saved (fp32 run) -> the weights;
 * weights wanted without master but master saved, or weights not saved
 * (a bf16 run) -> the master weights, unrounded: a bf16 caller rounds
 * them (bf16_round), which gives its weights exactly.  Collective over v->world; st may be NULL.  Returns 0, or -1 with
 * the same message on every rank, naming the file and the tensor (missing
 * file, corrupted or truncated file, missing tensor, wrong shape), or the
 * index (training state failing its checksums or ranges, a model
 * hyper-parameter other than cfg's, run.seed or data.path changed without
 * cfg->checkpoint.allow_changes: both values named).  Rank 0 prints the
 * warnings of allowed changes and notes on what an older index lacks. */
int ckpt_load(const char *step_dir, const CkptShardView *v, CkptState *st, const Config *cfg,
              char err[CFG_ERR]);

/* The weights only of a step directory into the view (part[CKPT_PARAMS],
 * and part[CKPT_MASTER] where its data is set; the Adam parts are left as
 * they are), for checkpoint.init_from.  Any topology, as ckpt_load; the
 * model hyper-parameters must be cfg's (a mismatch names both values; the
 * sequence length only where a shape depends on it, gpt2's wpe), run.seed
 * and data.path may differ.  Collective over v->world.  Returns 0 or -1
 * with the same message on every rank. */
int ckpt_load_weights(const char *step_dir, const CkptShardView *v, const Config *cfg,
                      char err[CFG_ERR]);

/* `trident ckpt import --from hf`: the Hugging Face directory hf_dir
 * (config.json + model.safetensors, or shards and
 * model.safetensors.index.json; GPT2LMHeadModel or LlamaForCausalLM as the
 * export writes them) as a weights-only trident checkpoint at step 0 in
 * out_dir (step_00000000 and latest; an existing step 0 there is refused,
 * or with `replace` replaced: the temporary copies of generate and eval).
 * sets: n_sets "key=value" config overrides recorded with it; of the model
 * only model.seq_len (a gpt2 keeps that many position rows, <= n_positions).
 * Serial, no MPI; memory about two tensors.  Returns 0, or the exit code
 * (2 bad input, 1 an I/O failure) with err naming the file and tensor. */
int ckpt_hf_import(const char *hf_dir, const char *out_dir, char *const *sets, int n_sets,
                   int replace, char err[CFG_ERR]);

/* checkpoint.init_from's model: every model key cfg's file and --set left
 * out (config_model_given) is taken from the source, a Hugging Face
 * directory's config.json or a trident checkpoint's index; the keys given
 * stay, to be compared with the source when its weights are read.  No-op
 * without init_from.  Returns 0 or 2 with err (a source that is not
 * there or not a model trident has). */
int ckpt_fill_model(Config *cfg, char err[CFG_ERR]);

/* checkpoint.init_from of a Hugging Face directory (as ckpt_hf_import
 * reads it), without a converted copy: every rank reads, from the mapped
 * safetensors files, the tensors its view holds any of, converts each to
 * trident's global layout and keeps its pieces of part[CKPT_PARAMS] and
 * part[CKPT_MASTER] (where data is set; the weights unrounded: a bf16
 * caller rounds them).  Memory: one tensor beside the view.  want (the
 * config's model section) must be config.json's (a difference names both values);
 * model.seq_len may be below a gpt2's n_positions.  Collective over
 * v->world.  Returns 0, or the exit code (2 bad input) with the same
 * message on every rank, naming the file and tensor. */
int ckpt_hf_load_weights(const char *hf_dir, const CkptShardView *v, const ModelConfig *want,
                         char err[CFG_ERR]);

/* The step directory to resume from: kind AUTO -> <dir>/latest if it exists,
 * else the newest complete step_<N> whose index verifies (err then holds a
 * note saying which, to print), else none; NEVER -> none; PATH -> `path`
 * (must be a checkpoint; err names the path, the caller the key or
 * argument it came from).  Returns 1 with out set, 0 for none, -1 with err
 * (also: step directories but no latest, and none verifies).  No MPI: call
 * it on every rank or on rank 0 and broadcast. */
int ckpt_resolve(const char *dir, ResumeKind kind, const char *path, char out[CFG_STR],
                 char err[CFG_ERR]);

/* The training state a step directory records (its index.h5: step, sampler
 * and LR positions, Adam's count).  Serial, no MPI.  0, or -1 with err. */
int ckpt_read_state(const char *step_dir, CkptState *st, char err[CFG_ERR]);

/* ---- The `trident ckpt` tools (src/cli/ckpt_cli.c parses their
 * arguments).  `arg` is a step directory or a checkpoint.dir (its latest).
 * Serial, no MPI launcher needed; each prints its outcome (errors on
 * stderr) and returns the exit code: 0, 2 bad input, 1 a damaged
 * checkpoint or a failed write. ---- */

/* The saved step, state, model, topology, config and every dataset; with
 * verify also ckpt_verify's check. */
int ckpt_inspect(const char *arg, int verify);
/* Every block of every tensor read: checksums and finite values. */
int ckpt_verify(const char *arg);
/* The weights (fp32, global shapes, real vocabulary rows) as one HDF5 file
 * with a dataset per tensor; master: a bf16 run's fp32 master weights
 * (else their bf16 rounding). */
int ckpt_export_h5(const char *arg, const char *out, int master);
/* A Hugging Face model directory out_dir: fp32 or bf16 safetensors, in
 * shards of at most max_shard bytes (ckpt_hf.c). */
int ckpt_hf_export(const char *arg, const char *out_dir, int bf16, int64_t max_shard);
/* "5GB", "1MB", "100KiB", "12345": bytes (decimal units as HF, binary with
 * "iB"); -1 when it is not a positive size. */
int ckpt_hf_parse_size(const char *s, int64_t *out);

/* `trident ckpt export --format peft`: the adapters of a LoRA model (t: the
 * whole model's adapter table on one rank, data its values in host memory,
 * m its model config) as a PEFT adapter directory out_dir
 * (adapter_config.json, adapter_model.safetensors in PEFT's names for
 * Llama, fp32).  Returns 0 or the exit code with err. */
int ckpt_peft_export(const char *out_dir, const ParamTable *t, const float *data,
                     const ModelConfig *m, char err[CFG_ERR]);

#endif
