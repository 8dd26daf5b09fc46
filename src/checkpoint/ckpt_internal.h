/* ckpt_internal.h — shared by the files of src/checkpoint, not exported.
 *
 *   ckpt_layout.c  flat ranges -> hyperslabs of the global tensor (pure)
 *   ckpt_index.c   index.h5: write, read, (de)serialise for a broadcast;
 *                  HDF5 helpers, checksum attributes
 *   ckpt_save.c    the stage files, written by each stage's ranks; ckpt_save
 *   ckpt_publish.c rank 0's file-system steps: .tmp, rename, latest, keep
 *   ckpt_load.c    resolve and load for any topology
 *   ckpt_tools.c   trident ckpt inspect / verify / export (src/cli parses)
 *   ckpt_hf.c      trident ckpt export --format hf (Hugging Face directory)
 *   ckpt_hf_import.c  safetensors reader; trident ckpt import --from hf */
#ifndef TRD_CKPT_INTERNAL_H
#define TRD_CKPT_INTERNAL_H

#include <hdf5.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/types.h>

#include "checkpoint/ckpt.h"

#define CKPT_FORMAT     "trident-checkpoint"
#define CKPT_VERSION    1
#define CKPT_KIND_NAME  8
#define CKPT_FILE_NAME  16
#define CKPT_DTYPE_NAME 8
#define CKPT_PATH_NAME  (PARAM_NAME + 16)
/* Paths: a directory given by the user is < CFG_STR; a step directory adds
 * "/step_XXXXXXXX.tmp", a file in it "/index.h5" and the like. */
#define CKPT_PATH      (CFG_STR + 64)
#define CKPT_FILE_PATH (CKPT_PATH + 64)

/* HDF5 group of each kind inside a stage file: "/params/<tensor name>". */
extern const char *const ckpt_kind_names[CKPT_KINDS];

/* ---- layout (ckpt_layout.c) ---- */

/* A 2-D block of the global tensor: rows [r, r+nr), columns [c, c+nc). */
typedef struct {
    int64_t r, c, nr, nc;
} CkptBlock;

/* The part of a tensor that a flat range [a, b) of the local table covers,
 * for a tensor whose local rows are consecutive global rows:
 * up to three blocks (partial first row, full middle rows, partial last
 * row), in row-major order, which is also the order of the local elements.
 * Rows at or beyond `real_rows` (vocabulary padding) are cut off: they are a
 * suffix of the local elements, so the kept elements are the contiguous
 * local range [first, first + count). */
typedef struct {
    CkptBlock b[3];
    int n;
    size_t first, count; /* flat elements of the local table */
    int contiguous;      /* whole rows held: global elements [gfirst, gfirst + count) */
    int64_t gfirst;
} CkptSlab;

/* The slab of p covered by the flat range [lo, hi) of the local table
 * (n == 0 when they do not meet). */
CkptSlab ckpt_slab(const ParamSpec *p, int64_t real_rows, size_t lo, size_t hi);

/* Runs of consecutive global rows a local tensor can have: one per expert
 * of a MoE tensor split over TP by each expert's rows (row_blocks). */
#define CKPT_MAX_RUNS MOE_MAX_EXPERTS

/* The same for any ParamSpec: one slab per run of local rows that are
 * consecutive global rows (two for a qkv tensor whose kv heads are
 * replicated over TP ranks: the query rows, then the k and v rows; one per
 * expert for stacked experts split over TP; see params.h).  Returns the
 * number of non-empty slabs; first_row[i] is the first local row of slab i
 * (for params_row_owned). */
int ckpt_slabs(const ParamSpec *p, int64_t real_rows, size_t lo, size_t hi,
               CkptSlab out[CKPT_MAX_RUNS], int64_t first_row[CKPT_MAX_RUNS]);

/* The tensors' bytes, written by trident beside HDF5 at a contiguous,
 * early-allocated, never-filled dataset's H5Dget_offset (ckpt_raw.c):
 * whole 4 KiB blocks with O_DIRECT through an aligned staging buffer, the
 * rest through the page cache; all of it through the page cache where the
 * file system refuses O_DIRECT. */
enum { CKPT_RAW_ALIGN = 4096, CKPT_RAW_STAGE = 8 << 20 };
typedef struct {
    int fd;        /* buffered */
    int fd_direct; /* O_DIRECT, or -1 */
    char *stage;   /* CKPT_RAW_STAGE bytes aligned to CKPT_RAW_ALIGN (with fd_direct) */
} CkptRaw;
/* 0, or -1 with errno (the file must exist: HDF5 created it). */
int ckpt_raw_open(CkptRaw *w, const char *path);
/* n bytes of src at file offset at: 0, or -1 with errno (ENOSPC for a
 * short write of a full disk). */
int ckpt_raw_write(CkptRaw *w, const char *src, size_t n, off_t at);
/* fsync (when sync) and close: 0, or -1 with errno. */
int ckpt_raw_close(CkptRaw *w, int sync);

/* A buffer of n bytes that direct I/O reads into or writes from, aligned
 * to CKPT_RAW_ALIGN; from 2 MiB on, aligned to 2 MiB and backed by
 * transparent huge pages where the kernel allows it (MADV_HUGEPAGE): 512x
 * fewer page faults when it is first filled and fewer pages to pin for
 * every transfer.  On the development VM, where fresh memory is costly,
 * the import's conversion buffers on huge pages made it 11% faster.  Exits
 * (1) when there is no memory; free with free(). */
void *ckpt_io_alloc(size_t n, const char *what);
/* buf, or a new buffer of n bytes (ckpt_io_alloc) in its place when it holds
 * fewer (*cap): reused from tensor to tensor instead of faulted in anew. */
void *ckpt_io_grow(void *buf, size_t *cap, size_t n, const char *what);

/* Reading the other way: bytes [at, at + n) of a file into dst, memory
 * aligned to CKPT_RAW_ALIGN with room for ckpt_raw_span(at, n) bytes.  With
 * O_DIRECT through fd_direct where that works (the whole blocks around the
 * bytes), else with pread through fd; either way the bytes land at dst + at
 * % CKPT_RAW_ALIGN.  Returns 0, an errno, or -1 when the file ends before
 * at + n, with *fail the offset where it went wrong. */
enum { CKPT_RAW_READ_CHUNK = 16 << 20 };
size_t ckpt_raw_span(off_t at, size_t n);
int ckpt_raw_read(int fd, int fd_direct, off_t at, size_t n, char *dst, off_t *fail);

/* A file's bytes through CkptRaw, written behind the caller by a thread of
 * the sink.  put() copies into one of CKPT_SINK_BUFS buffers of 32 MiB,
 * aligned as the file is (buf[lead] holds offset
 * `at`, lead = at % CKPT_RAW_ALIGN, so whole blocks go out with O_DIRECT
 * and no other copy), and a full buffer goes to the writer while the next
 * fills; write_ref() hands over the caller's own bytes, uncopied.  A direct
 * write returns only when its bytes are on the disk: done in line, it held
 * up the work that makes the next bytes (an export's conversion, an
 * import's reads and transposes).  Each call returns 0, or -1 with errno:
 * the first failure of any write so far. */
enum { CKPT_SINK_CAP = (32 << 20) + CKPT_RAW_ALIGN, CKPT_SINK_BUFS = 3, CKPT_SINK_JOBS = 16 };
typedef struct {
    const char *src;
    size_t n;
    off_t at;
} CkptSinkJob;
typedef struct {
    CkptRaw raw;
    const char *path;
    char *buf; /* being filled, or NULL: bufs[n_bufs % CKPT_SINK_BUFS] is next */
    size_t lead, n;
    off_t at;
    char *bufs[CKPT_SINK_BUFS];         /* CKPT_SINK_CAP bytes each, aligned */
    int64_t buf_ticket[CKPT_SINK_BUFS]; /* the job that last wrote each */
    int64_t n_bufs;                     /* buffers taken so far */
    CkptSinkJob job[CKPT_SINK_JOBS];    /* a ring: job t at t % CKPT_SINK_JOBS */
    int64_t queued, done; /* jobs handed to the writer, written (ticket t: the t-th) */
    int closing, err_no;  /* err_no: the first write's failure */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
} CkptSink;
/* Open path (which must exist) and start the writer. */
int ckpt_sink_open(CkptSink *s, const char *path);
/* The next bytes go to file offset at (what was put before is handed over). */
int ckpt_sink_seek(CkptSink *s, off_t at);
int ckpt_sink_put(CkptSink *s, const void *src, size_t bytes);
/* n bytes of the caller's src at file offset at, written by the thread
 * from src itself (no copy; whole blocks go out directly when src is
 * aligned as the file is): what was put before is handed over first.
 * Returns a ticket (> 0) for ckpt_sink_wait, or -1 with errno.  src must
 * stay untouched until then. */
int64_t ckpt_sink_write_ref(CkptSink *s, const void *src, size_t n, off_t at);
/* Wait until the write of ticket t is done (t <= 0: nothing to wait for). */
void ckpt_sink_wait(CkptSink *s, int64_t t);
/* The first failed write's errno, or 0, once the buffers handed to the
 * writer so far are written. */
int ckpt_sink_error(CkptSink *s);

/* Hand over the rest, wait for every write, end the thread, fsync (when
 * sync) and close. */
int ckpt_sink_close(CkptSink *s, int sync);

/* Reads ahead of the caller: the byte ranges of a plan, in its order, read
 * by CKPT_SOURCE_THREADS threads of the source (reads in flight at once)
 * into one ring buffer with O_DIRECT where the file system allows it
 * (through the page cache a cold read cost the import as much CPU as its
 * transposes: page allocation and a copy of every byte).  The caller takes
 * the reads in the plan's order and releases each (oldest first) when done
 * with its bytes; the threads read on while there is room.  The ring is
 * 128 MiB: with 256 MiB the import took 1.09-1.2x and the export 1.04x
 * the time on the development VM (fresh memory is costly there, and every
 * page is zeroed on its first read); 64 to 160 MiB were as fast as 128. */
enum { CKPT_SOURCE_RING = 128 << 20, CKPT_SOURCE_THREADS = 2 };
typedef struct {
    int fd;        /* buffered */
    int fd_direct; /* O_DIRECT on the same file, or -1 */
    off_t at;
    size_t n;
} CkptSourceRead;
typedef struct {
    const CkptSourceRead *plan;
    int n;
    char *ring; /* cap bytes, aligned */
    size_t cap;
    int64_t *pos;     /* per read: its first aligned block's place (ring + pos % cap) */
    int *err;         /* per read: 0, an errno, or -1 (the file ends before the read) */
    off_t *err_at;    /* per read: the file offset where it failed */
    char *done;       /* per read: read (or failed) */
    int64_t claimed;  /* reads a thread has taken on */
    int64_t placed;   /* reads given their place in the ring, in order */
    int64_t wpos;     /* the end of the last read placed */
    int64_t freed;    /* the end of the last read released */
    int64_t read;     /* reads done, all those before too */
    int64_t released; /* reads the caller released, in order */
    int64_t taken;    /* reads the caller took */
    int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread[CKPT_SOURCE_THREADS];
} CkptSource;
/* Start reading plan[0..n) (which must outlive the source) into a ring of
 * ring bytes (0: CKPT_SOURCE_RING), or of the largest read when larger. */
void ckpt_source_open(CkptSource *s, const CkptSourceRead *plan, int n, size_t ring);
/* The next read of the plan: *bytes points at its n bytes (valid until it
 * is released).  Returns 0, or its error (see err above) with *at. */
int ckpt_source_take(CkptSource *s, const void **bytes, off_t *at);
/* The oldest read taken and not yet released is done with. */
void ckpt_source_release(CkptSource *s);
/* Stop reading (reads not yet taken are dropped) and free the ring. */
void ckpt_source_close(CkptSource *s);

/* out[(omap ? omap[j] : j) * r + i] = in[(imap ? imap[i] : i) * c + j] for
 * i < r, j < c: a transpose with optional row maps (the Hugging Face
 * layouts: Conv1D weights, c_attn's [Q|K|V] columns), in 8 x 8 blocks. */
void ckpt_transpose(const float *in, int64_t r, int64_t c, const int64_t *imap, const int64_t *omap,
                    float *out);

/* Checksums.  A stored tensor is cut into blocks of ckpt_block_rows() whole
 * rows (about 4 MiB, the same for any topology); block b's checksum is
 *   sum over its elements of fmix64((gidx * 0x9E3779B97F4A7C15) ^ bits)
 * modulo 2^64, gidx = row * cols + col in the global (unpadded) tensor and
 * bits the fp32 value's bit pattern.  A sum, so writers holding any pieces
 * of a block add their parts and reduce; stored per dataset as attributes
 * "checksum" (uint64[blocks]) and "checksum_rows" (docs/checkpoint.md). */
int64_t ckpt_block_rows(int ndim, const int64_t shape[2]);
int64_t ckpt_n_blocks(int ndim, const int64_t shape[2]);
/* Add the hashes of a slab's elements (src in slab order) into sums[block]
 * (cols: global columns, 1 for a vector).  Returns how many of them are
 * not finite (NaN, Inf): a save refuses to publish those. */
int64_t ckpt_checksum_slab(const CkptSlab *s, int64_t cols, int64_t block_rows, const float *src,
                           uint64_t *sums);
/* The checksum of nrows whole rows starting at row0, held in buf. */
uint64_t ckpt_checksum_rows(const float *buf, int64_t row0, int64_t nrows, int64_t cols);

/* ---- index (ckpt_index.c) ---- */

/* One dataset of the checkpoint; also the compound record of /tensors. */
typedef struct {
    char name[PARAM_NAME];
    char kind[CKPT_KIND_NAME];   /* "params", "master", "adam_m", "adam_v" */
    char file[CKPT_FILE_NAME];   /* "stage_0.h5" */
    char dtype[CKPT_DTYPE_NAME]; /* "float32" */
    int32_t ndim, stage;
    int64_t shape[2]; /* global; shape[1] == 1 when ndim == 1 */
    int64_t nbytes;
} CkptEntry;

/* The attributes of /state, in the order of their checksums (/state
 * attribute "checksum", uint64[CKPT_STATE_ATTRS]). */
#define CKPT_STATE_ATTRS 7
extern const char *const ckpt_state_attr_names[CKPT_STATE_ATTRS];

typedef struct {
    CkptState state;
    uint64_t seed;
    char data_path[CFG_PATHS]; /* data.blend or data.path of the saving run */
    int has_run;               /* data_path recorded (older checkpoints: 0) */
    int state_checked;         /* /state had checksums and they matched */
    char arch[16], precision[16];
    int layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, tie_embeddings;
    double norm_eps, rope_theta;
    int has_norms; /* norm_eps, rope_theta recorded (older: 0) */
    /* model.rope_scaling: the attribute rope_scaling_llama3 (factor,
     * low_freq_factor, high_freq_factor, original_max_position_embeddings)
     * exists only for llama3; none (and older indexes) have none. */
    int rope_llama3;
    double rope_params[4];
    /* model.moe: the attributes moe (experts, top_k, every, ffn_hidden,
     * shared_experts) and moe_coefs (aux_loss_coef, z_loss_coef,
     * capacity_factor) exist only for a mixture of experts; 0 without. */
    int moe[5];
    double moe_coefs[3];
    int tp, pp, dp, zero, world;
    int stage_layers[CFG_MAX_STAGES];
    int n;
    CkptEntry *e;
    char *yaml; /* the config, NUL-terminated */
} CkptIndex;

/* Write index.h5 (serial; rank 0). Returns 0 or -1 with err. */
int ckpt_index_write(const char *path, const CkptIndex *ix, char err[CFG_ERR]);
/* Read index.h5. Returns 0 or -1 with err naming the file. */
int ckpt_index_read(const char *path, CkptIndex *ix, char err[CFG_ERR]);
/* The ranges ckpt_index_read checks the values read against, on values in
 * memory (the fuzz harness ckpt_index_values calls it as the reader does):
 * /state (step, lr_step, adam_t, sampler_position), /topology (sizes,
 * world, stage layers) and /model (heads dividing hidden, the sizes a
 * config may have: config_model_sizes).  0, or -1 with err naming path
 * and the attribute. */
int ckpt_index_check(const char *path, const CkptIndex *ix, char err[CFG_ERR]);
/* The run and model fields of an index from cfg (seed, data path, arch,
 * precision, the model's shape, eps and RoPE base). */
void ckpt_index_describe(CkptIndex *ix, const Config *cfg, Precision precision);
void ckpt_index_free(CkptIndex *ix);
/* The entry of (name, kind), or NULL. */
const CkptEntry *ckpt_index_find(const CkptIndex *ix, const char *name, CkptKind kind);
/* One buffer holding ix, for a broadcast, and back (ix owns new memory). */
void *ckpt_index_pack(const CkptIndex *ix, size_t *bytes);
void ckpt_index_unpack(CkptIndex *ix, const void *buf);
/* One line describing the saved model, for error messages. */
void ckpt_index_model_line(const CkptIndex *ix, char *out, size_t n);
/* The index's RoPE scaling into m's model.rope_* fields. */
void ckpt_index_rope_scaling(const CkptIndex *ix, ModelConfig *m);
/* model.moe of the index into m (all zero for a dense model). */
void ckpt_index_moe(const CkptIndex *ix, ModelConfig *m);

/* ---- file system, rank 0 (ckpt_publish.c) ---- */

/* "step_%08d" */
void ckpt_step_name(char *out, size_t n, int64_t step);
/* Remove a directory tree (0 when it is gone). */
int ckpt_rm_tree(const char *path);
int ckpt_fsync_path(const char *path, int dir);
/* A fresh, empty <dir>/step_X.tmp (dir created when missing). */
int ckpt_prepare_tmp(const char *dir, const char *tmp, char err[CFG_ERR]);
/* "step_<digits>" -> the step; -1 for any other name (.tmp, .kept, files). */
int64_t ckpt_parse_step(const char *name);
/* Append a step to a growing list (*steps with *n of *cap used): every
 * step of a directory is listed, however many. */
void ckpt_push_step(int64_t **steps, int *n, int *cap, int64_t step);
/* Before the first save into dir: with no <dir>/latest, its step_X are not
 * this job's; publish and prune then never replace or remove them. */
void ckpt_note_foreign(const char *dir);
/* step_X.tmp -> step_X, replacing an existing step_X (one that is not this
 * job's is renamed step_X.kept). */
int ckpt_publish_dir(const char *dir, int64_t step, const char *tmp, const char *final,
                     char err[CFG_ERR]);
/* <dir>/latest := name, through latest.tmp, fsync and rename. */
int ckpt_write_latest(const char *dir, const char *name, char err[CFG_ERR]);
/* Remove published steps beyond `keep` (never `current`) and stale .tmp. */
void ckpt_prune(const char *dir, int keep, int64_t current);

/* ---- MPI (ckpt_save.c) ---- */

/* Collective over world: returns 0 when rc == 0 on every rank, else -1 with
 * the message of the lowest failing rank copied into err on every rank. */
int ckpt_agree(Comm *world, int rc, char err[CFG_ERR]);

/* ---- HDF5 helpers (ckpt_index.c) ---- */

/* File access properties for serial opens (index, tools): sec2 driver,
 * no file locking. */
hid_t ckpt_serial_fapl(void);
/* A stage file's layout (on a file access list): metadata in 4 MiB
 * blocks, tensors of 64 KiB or more on CKPT_RAW_ALIGN boundaries.  0, or
 * -1 when HDF5 refuses. */
int ckpt_fapl_tensor_layout(hid_t fapl);
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
/* Attributes of a stored dataset: create its checksums, or read and check
 * them against its shape (0, or -1 when missing or malformed; *sums is
 * malloc'd). */
int ckpt_put_checksums(hid_t d, const CkptEntry *e, const uint64_t *sums);
/* Overwrite the values of an existing "checksum" attribute. */
int ckpt_set_checksums(hid_t d, const uint64_t *sums);
int ckpt_get_checksums(hid_t d, const CkptEntry *e, uint64_t **sums);

/* ---- Hugging Face export (ckpt_hf.c): ckpt_hf_export, in ckpt.h ---- */

/* Parts of the fused qkv in Hugging Face's layout: Llama's q_proj, k_proj,
 * v_proj, or GPT-2's c_attn [Q|K|V]. */
enum { QKV_Q = 0, QKV_K = 1, QKV_V = 2, QKV_ALL = 3 };
/* Row j of HF tensor `part` is row ckpt_hf_qkv_src_row(...) of trident's
 * fused per-kv-group qkv (RoPE rows of q and k reordered from interleaved
 * pairs to HF's half split). */
int64_t ckpt_hf_qkv_src_row(int64_t heads, int64_t kv_heads, int64_t hs, int part, int64_t j);

/* ---- Hugging Face import (ckpt_hf_import.c): ckpt_hf_import, in ckpt.h ---- */

/* The parsers of an HF directory, as ckpt_hf_import and checkpoint.init_from
 * run them first (also the entry points of tests/fuzz).  Each returns 0, or
 * TRD_EXIT_INPUT with a message naming the file in err. */
/* dir/config.json into m (trident's names); *want_dtype (an StDtype) from torch_dtype
 * (-1: not given). */
int ckpt_hf_read_model(const char *dir, ModelConfig *m, int *want_dtype, char err[CFG_ERR]);
/* dir/model.safetensors, or dir/model.safetensors.index.json and its
 * shards: every header read and checked (dtypes, shapes, offsets inside
 * the file, no overlaps), then closed. */
int ckpt_hf_check_safetensors(const char *dir, char err[CFG_ERR]);

#endif
