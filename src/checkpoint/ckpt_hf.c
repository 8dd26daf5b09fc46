/* ckpt_hf.c — `trident ckpt export --format hf --out DIR CKPT`: a checkpoint
 * as a Hugging Face model directory (config.json, generation_config.json,
 * safetensors weights, the GPT-2 tokenizer files) that
 * transformers' from_pretrained(DIR) loads as GPT2LMHeadModel,
 * LlamaForCausalLM or (a llama with model.moe) MixtralForCausalLM.
 *
 * Streaming: the safetensors header is computed from the index alone
 * (every shape is known before any data is read), then each tensor is read
 * through its checksum blocks and written at its offset.  Under mpiexec -n
 * N the tensors are split between the ranks (about even in bytes): rank 0
 * creates the shard files at their full size, every rank writes its own
 * tensors in place, rank 0 publishes.  A reader thread reads ahead of
 * the conversion and a writer thread writes behind it (hf_pipe_start,
 * ckpt_sink_open): a plain copy holds a few checksum blocks (about 4 MiB each);
 * a transform that needs the whole source (Conv1D transposes, the qkv
 * split, an expert's rows of the stacked experts) holds two tensors at most.  The reader takes the tensors' bytes
 * from a CkptSource, which reads them at their datasets' offsets with
 * O_DIRECT ahead of it (hf_plan_raw); HDF5 reads a dataset that is not
 * where trident puts it.  Layout and conventions:
 * docs/checkpoint.md, "Export to Hugging Face". */
#include "checkpoint/ckpt_internal.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/error.h"
#include "data/inputs.h"
#include "data/prepare.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors is little-endian: the exporter writes host floats as they are"
#endif

#define HF_NAME    128
#define GPT2_VOCAB 50257
#define GPT2_EOT   50256

/* How an output tensor is made from its trident source. */
typedef enum {
    HF_COPY,      /* the same values, row by row (streamed per checksum block) */
    HF_TRANSPOSE, /* GPT-2 Conv1D: HF stores [in, out], trident [out, in] */
    HF_QKV,       /* rows picked out of the fused per-kv-group qkv (below) */
    HF_EXPERT,    /* expert `part`'s rows of a stacked [E x rows, cols] expert tensor */
} HfOp;

typedef struct {
    char name[HF_NAME]; /* HF name */
    const CkptEntry *src;
    HfOp op;
    int part; /* HF_QKV: QKV_*; HF_EXPERT: the expert */
    int ndim;
    int64_t shape[2];      /* HF shape; shape[1] == 1 when ndim == 1 */
    int64_t bytes, offset; /* in its shard's data section */
    int shard;
    int owner; /* the rank that writes it */
} HfTensor;

typedef struct {
    const CkptIndex *ix;
    const char *step_dir, *out_dir;
    CkptKind kind; /* master weights when saved, else params */
    int bf16, gpt2;
    int64_t hs, heads, kv_heads;
    int64_t experts, expert_ffn; /* Mixtral: E, an expert's width (0: a dense model) */
    HfTensor *t;
    int n, cap;
    int n_shards;
    /* The sources, read ahead by a thread (below); the last whole one
     * taken from it (the qkv feeds three outputs). */
    struct HfPipe *pipe;
    const CkptEntry *cached;
    const float *cache;
    /* Transposed tensors, two in turn: one written by the sink's thread
     * straight from its buffer while the next is transposed into the
     * other (each aligned as its place in the file, so no copy is made). */
    char *tbuf[2];
    size_t tbuf_cap[2];
    int64_t tbuf_ticket[2];
    int n_tbuf;
    /* Output staging for one row (converted) and file accounting. */
    void *stage;
    size_t stage_cap;
    int64_t written;
    /* Under mpiexec -n N: tensors are split between the ranks (owner). */
    int rank, size;
    Comm world; /* size > 1: the ranks the tensors are split over */
    char err[CFG_ERR];
} Hf;

/* ---- the plan: HF names, shapes, sources ------------------------------ */

static int hf_add(Hf *h, const char *src, HfOp op, int part, int ndim, int64_t r, int64_t c,
                  const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static int hf_add(Hf *h, const char *src, HfOp op, int part, int ndim, int64_t r, int64_t c,
                  const char *fmt, ...)
{
    const CkptEntry *e = ckpt_index_find(h->ix, src, h->kind);
    if (!e) {
        ckpt_err(h->err,
                 "%s: tensor '%s' (%s) is not in the checkpoint: not a %s model as "
                 "trident writes it",
                 h->step_dir, src, ckpt_kind_names[h->kind], h->ix->arch);
        return -1;
    }
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        h->t = realloc(h->t, (size_t)h->cap * sizeof *h->t);
        TRD_ASSERT(h->t);
    }
    HfTensor *t = &h->t[h->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->src = e;
    t->op = op;
    t->part = part;
    t->ndim = ndim;
    t->shape[0] = r;
    t->shape[1] = ndim == 2 ? c : 1;
    t->bytes = r * t->shape[1] * (h->bf16 ? 2 : 4);
    /* The source must have the shape this mapping expects (transposed for
     * Conv1D; the whole fused qkv for a qkv part). */
    int64_t want0 = r, want1 = t->shape[1];
    if (op == HF_TRANSPOSE) {
        want0 = c;
        want1 = r;
    } else if (op == HF_QKV) {
        want0 = (h->heads + 2 * h->kv_heads) * h->hs;
        want1 = ndim == 2 ? (part == QKV_ALL ? r : c) : 1;
    } else if (op == HF_EXPERT) {
        want0 = h->experts * r;
    }
    if (e->ndim != ndim || e->shape[0] != want0 || e->shape[1] != want1) {
        ckpt_err(h->err,
                 "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld] for "
                 "the model the index describes",
                 h->step_dir, src, (long long)e->shape[0], (long long)e->shape[1], (long long)want0,
                 (long long)want1);
        return -1;
    }
    return 0;
}

/* Mixtral's MoE block of layer l: the router as it is, and each expert's
 * w1 (gate, [Fe, C]), w3 (up, [Fe, C]) and w2 (down, [C, Fe]) sliced out of
 * trident's stacked experts (expert e's rows e x R .. (e + 1) x R - 1),
 * source by source so that each stacked tensor is read once. */
static int hf_plan_mixtral(Hf *h, int l)
{
    const int64_t C = h->ix->hidden, Fe = h->expert_ffn;
    static const struct {
        const char *src, *hf;
        int down;
    } part[] = {{"gate", "w1", 0}, {"up", "w3", 0}, {"down", "w2", 1}};
    char s[PARAM_NAME];
    snprintf(s, sizeof s, "layers.%d.moe.router.weight", l);
    int rc = hf_add(h, s, HF_COPY, 0, 2, h->experts, C,
                    "model.layers.%d.block_sparse_moe.gate.weight", l);
    for (int k = 0; k < 3 && rc == 0; k++) {
        snprintf(s, sizeof s, "layers.%d.moe.experts.%s.weight", l, part[k].src);
        for (int e = 0; e < h->experts && rc == 0; e++)
            rc |= hf_add(h, s, HF_EXPERT, e, 2, part[k].down ? C : Fe, part[k].down ? Fe : C,
                         "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e, part[k].hf);
    }
    return rc;
}

static int hf_plan(Hf *h)
{
    const CkptIndex *ix = h->ix;
    const int64_t C = ix->hidden, F = ix->ffn_hidden, V = ix->vocab, A = h->heads * h->hs;
    const int64_t KV = h->kv_heads * h->hs;
    int rc = 0;
    if (h->gpt2) {
        rc |= hf_add(h, "embed.wte.weight", HF_COPY, 0, 2, V, C, "transformer.wte.weight");
        rc |=
            hf_add(h, "embed.wpe.weight", HF_COPY, 0, 2, ix->seq_len, C, "transformer.wpe.weight");
        for (int l = 0; l < ix->layers && rc == 0; l++) {
            char s[PARAM_NAME];
#define SRC(x) (snprintf(s, sizeof s, "layers.%d." x, l), s)
            rc |= hf_add(h, SRC("ln1.weight"), HF_COPY, 0, 1, C, 0, "transformer.h.%d.ln_1.weight",
                         l);
            rc |= hf_add(h, SRC("ln1.bias"), HF_COPY, 0, 1, C, 0, "transformer.h.%d.ln_1.bias", l);
            rc |= hf_add(h, SRC("attn.qkv.weight"), HF_QKV, QKV_ALL, 2, C, 3 * A,
                         "transformer.h.%d.attn.c_attn.weight", l);
            rc |= hf_add(h, SRC("attn.qkv.bias"), HF_QKV, QKV_ALL, 1, 3 * A, 0,
                         "transformer.h.%d.attn.c_attn.bias", l);
            rc |= hf_add(h, SRC("attn.proj.weight"), HF_TRANSPOSE, 0, 2, A, C,
                         "transformer.h.%d.attn.c_proj.weight", l);
            rc |= hf_add(h, SRC("attn.proj.bias"), HF_COPY, 0, 1, C, 0,
                         "transformer.h.%d.attn.c_proj.bias", l);
            rc |= hf_add(h, SRC("ln2.weight"), HF_COPY, 0, 1, C, 0, "transformer.h.%d.ln_2.weight",
                         l);
            rc |= hf_add(h, SRC("ln2.bias"), HF_COPY, 0, 1, C, 0, "transformer.h.%d.ln_2.bias", l);
            rc |= hf_add(h, SRC("mlp.fc.weight"), HF_TRANSPOSE, 0, 2, C, F,
                         "transformer.h.%d.mlp.c_fc.weight", l);
            rc |= hf_add(h, SRC("mlp.fc.bias"), HF_COPY, 0, 1, F, 0,
                         "transformer.h.%d.mlp.c_fc.bias", l);
            rc |= hf_add(h, SRC("mlp.proj.weight"), HF_TRANSPOSE, 0, 2, F, C,
                         "transformer.h.%d.mlp.c_proj.weight", l);
            rc |= hf_add(h, SRC("mlp.proj.bias"), HF_COPY, 0, 1, C, 0,
                         "transformer.h.%d.mlp.c_proj.bias", l);
        }
        rc |= hf_add(h, "final_norm.weight", HF_COPY, 0, 1, C, 0, "transformer.ln_f.weight");
        rc |= hf_add(h, "final_norm.bias", HF_COPY, 0, 1, C, 0, "transformer.ln_f.bias");
    } else {
        rc |= hf_add(h, "embed.wte.weight", HF_COPY, 0, 2, V, C, "model.embed_tokens.weight");
        for (int l = 0; l < ix->layers && rc == 0; l++) {
            char s[PARAM_NAME];
            rc |= hf_add(h, SRC("ln1.weight"), HF_COPY, 0, 1, C, 0,
                         "model.layers.%d.input_layernorm.weight", l);
            rc |= hf_add(h, SRC("attn.qkv.weight"), HF_QKV, QKV_Q, 2, A, C,
                         "model.layers.%d.self_attn.q_proj.weight", l);
            rc |= hf_add(h, SRC("attn.qkv.weight"), HF_QKV, QKV_K, 2, KV, C,
                         "model.layers.%d.self_attn.k_proj.weight", l);
            rc |= hf_add(h, SRC("attn.qkv.weight"), HF_QKV, QKV_V, 2, KV, C,
                         "model.layers.%d.self_attn.v_proj.weight", l);
            rc |= hf_add(h, SRC("attn.proj.weight"), HF_COPY, 0, 2, C, A,
                         "model.layers.%d.self_attn.o_proj.weight", l);
            rc |= hf_add(h, SRC("ln2.weight"), HF_COPY, 0, 1, C, 0,
                         "model.layers.%d.post_attention_layernorm.weight", l);
            if (h->experts > 0) {
                rc |= hf_plan_mixtral(h, l);
                continue;
            }
            rc |= hf_add(h, SRC("mlp.gate.weight"), HF_COPY, 0, 2, F, C,
                         "model.layers.%d.mlp.gate_proj.weight", l);
            rc |= hf_add(h, SRC("mlp.up.weight"), HF_COPY, 0, 2, F, C,
                         "model.layers.%d.mlp.up_proj.weight", l);
            rc |= hf_add(h, SRC("mlp.down.weight"), HF_COPY, 0, 2, C, F,
                         "model.layers.%d.mlp.down_proj.weight", l);
#undef SRC
        }
        rc |= hf_add(h, "final_norm.weight", HF_COPY, 0, 1, C, 0, "model.norm.weight");
    }
    /* Tied: HF ties lm_head to the input embedding itself
     * (tie_word_embeddings in config.json), so only an untied head is stored. */
    if (rc == 0 && !ix->tie_embeddings)
        rc |= hf_add(h, "head.weight", HF_COPY, 0, 2, V, C, "lm_head.weight");
    return rc ? -1 : 0;
}

/* HF's shard split: tensors in order, a new shard when the next tensor
 * would take the current one past max (a tensor larger than max gets a
 * shard of its own). */
static void hf_shard(Hf *h, int64_t max)
{
    int64_t used = 0;
    int shard = 0;
    for (int i = 0; i < h->n; i++) {
        HfTensor *t = &h->t[i];
        if (used > 0 && used + t->bytes > max) {
            shard++;
            used = 0;
        }
        t->shard = shard;
        t->offset = used;
        used += t->bytes;
    }
    h->n_shards = h->n ? shard + 1 : 0;
}

static void hf_shard_name(const Hf *h, int shard, char *out, size_t n)
{
    if (h->n_shards == 1)
        snprintf(out, n, "model.safetensors");
    else
        snprintf(out, n, "model-%05d-of-%05d.safetensors", shard + 1, h->n_shards);
}

/* ---- reading the checkpoint: a thread ahead of the writer ------------- */

/* What this rank reads, in the order its writer uses it: a HF_COPY source a
 * checksum block at a time, any other source whole (once for consecutive
 * outputs of one source: the q, k and v of a fused qkv). */
typedef struct {
    const CkptEntry *e;
    int whole;
    /* Found before the reader starts (hf_plan_raw): e's float32 values lie
     * at base in its stage file, open as fd (and fd_direct), and sums are
     * its checksums.  base < 0: read through HDF5 by the reader. */
    int64_t base;
    int fd, fd_direct;
    uint64_t *sums;
} HfRead;

/* A reader thread reads and verifies the sources while the main thread
 * converts and writes the ones before, as dd streams: serially the disk sat
 * idle during every write and the writes during every read.  Two pools of
 * slots, each used in order: blocks (a few checksum blocks ahead) and whole
 * tensors (the one being converted and the next), so memory stays a few
 * blocks and two tensors whatever the model.  Only the reader calls HDF5
 * while it runs (HDF5 is not thread-safe here). */
enum { HF_BLOCK_SLOTS = 4, HF_WHOLE_SLOTS = 2, HF_POOLS = 2 };

typedef struct {
    float *buf;
    size_t cap; /* bytes; kept across uses (no page faults anew) */
    int code;   /* the read failed: the reader's err says why */
} HfSlot;

typedef struct {
    HfSlot slot[HF_WHOLE_SLOTS > HF_BLOCK_SLOTS ? HF_WHOLE_SLOTS : HF_BLOCK_SLOTS];
    int n;
    int64_t filled, used; /* slots handed over, slots given back */
} HfPool;

typedef struct HfPipe {
    HfRead *reads;
    int n_reads;
    /* The raw reads' bytes, read ahead with O_DIRECT by a CkptSource
     * (ckpt_raw.c): through the page cache a cold read cost as much CPU
     * as the conversion.  One source read per whole tensor or block. */
    CkptSourceRead *plan;
    int n_plan;
    CkptSource src;
    int src_open;
    int *fds; /* the stage files opened for it: pairs fd, fd_direct */
    int n_fds;
    HfPool pool[HF_POOLS]; /* [0] blocks, [1] whole tensors */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop; /* the writer failed: the reader ends */
    pthread_t thread;
    int running;
    char err[CFG_ERR]; /* the reader's first error */
} HfPipe;

/* The reader's next free slot of pool k (NULL: the writer stopped). */
static HfSlot *pipe_free_slot(HfPipe *p, int k)
{
    HfPool *q = &p->pool[k];
    pthread_mutex_lock(&p->mu);
    while (!p->stop && q->filled - q->used == q->n)
        pthread_cond_wait(&p->cv, &p->mu);
    HfSlot *s = p->stop ? NULL : &q->slot[q->filled % q->n];
    pthread_mutex_unlock(&p->mu);
    return s;
}

static void pipe_hand_over(HfPipe *p, int k)
{
    pthread_mutex_lock(&p->mu);
    p->pool[k].filled++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* The writer's next slot of pool k, once the reader has filled it. */
static HfSlot *pipe_take(HfPipe *p, int k)
{
    HfPool *q = &p->pool[k];
    pthread_mutex_lock(&p->mu);
    while (q->filled == q->used)
        pthread_cond_wait(&p->cv, &p->mu);
    HfSlot *s = &q->slot[q->used % q->n];
    pthread_mutex_unlock(&p->mu);
    return s;
}

static void pipe_give_back(HfPipe *p, int k)
{
    pthread_mutex_lock(&p->mu);
    p->pool[k].used++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Read source r into slots, verifying every block: each block into a slot
 * of its own, or the whole tensor into one.  The bytes come from the
 * source read ahead (r->base >= 0: a block, or the whole tensor at its
 * first block, copied out of the ring), else through HDF5.  Returns 0; or
 * -1 when the writer stopped; or an exit code (1: an unreadable file, a
 * checksum mismatch), with p->err naming the file and tensor, after
 * handing over a slot marked with it, so the writer meets the error where
 * it would have read that data. */
static int hf_read_source(const Hf *h, HfPipe *p, const HfRead *r)
{
    const CkptEntry *e = r->e;
    const int k = r->whole, raw = r->base >= 0;
    char path[CKPT_FILE_PATH], dset[CKPT_PATH_NAME], why[256];
    snprintf(path, sizeof path, "%s/%s", h->step_dir, e->file);
    snprintf(dset, sizeof dset, "%s/%s", e->kind, e->name);
    int code = TRD_EXIT_OK;
    hid_t f = -1, d = -1;
    uint64_t *sums = r->sums;
    if (!raw) {
        hid_t fapl = ckpt_serial_fapl();
        f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
        H5Pclose(fapl);
        if (f < 0) {
            ckpt_h5_reason(why, sizeof why);
            ckpt_err(p->err,
                     "%s: cannot open (missing, truncated or corrupted?) for tensor '%s': %s", path,
                     e->name, why);
            code = TRD_EXIT_RUNTIME;
        } else if ((d = H5Dopen2(f, dset, H5P_DEFAULT)) < 0) {
            ckpt_err(p->err, "%s: tensor '%s': no dataset '/%s'", path, e->name, dset);
            code = TRD_EXIT_RUNTIME;
        } else if (ckpt_get_checksums(d, e, &sums) != 0) {
            ckpt_err(p->err, "%s: tensor '%s' (dataset '/%s') has no valid checksum attributes",
                     path, e->name, dset);
            code = TRD_EXIT_RUNTIME;
        }
    }
    const int64_t R = ckpt_block_rows(e->ndim, e->shape), cols = e->shape[1];
    hid_t fs = d >= 0 ? H5Dget_space(d) : -1;
    HfSlot *s = k ? pipe_free_slot(p, k) : NULL;
    if (k && !s)
        code = -1;
    else if (k)
        s->buf =
            ckpt_io_grow(s->buf, &s->cap, (size_t)(e->shape[0] * cols) * sizeof(float), e->name);
    const char *ring = NULL; /* raw and whole: the tensor's bytes in the ring */
    for (int64_t r0 = 0; code == TRD_EXIT_OK && r0 < e->shape[0]; r0 += R) {
        const int64_t n = r0 + R < e->shape[0] ? R : e->shape[0] - r0;
        if (!s && !(s = pipe_free_slot(p, k))) {
            code = -1;
            break;
        }
        if (!k)
            s->buf = ckpt_io_grow(s->buf, &s->cap, (size_t)(n * cols) * sizeof(float), e->name);
        float *buf = s->buf + (k ? r0 * cols : 0);
        int failed = 0;
        if (raw) {
            const void *bytes = NULL;
            off_t at = 0;
            const int err = !k || r0 == 0 ? ckpt_source_take(&p->src, &bytes, &at) : 0;
            if (!k || r0 == 0)
                ring = bytes;
            if (!err) /* (the ring's bytes need not be aligned for floats) */
                memcpy(buf, ring + (k ? r0 * cols * (int64_t)sizeof(float) : 0),
                       (size_t)(n * cols) * sizeof(float));
            if (err || !k || r0 + n == e->shape[0])
                ckpt_source_release(&p->src);
            if (err)
                snprintf(why, sizeof why, "%s at byte %lld",
                         err > 0 ? strerror(err) : "the file ends", (long long)at);
            failed = err != 0;
        } else {
            hsize_t start[2] = {(hsize_t)r0, 0}, count[2] = {(hsize_t)n, (hsize_t)cols};
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
            hid_t ms = H5Screate_simple(e->ndim, count, NULL);
            failed = H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, buf) < 0;
            H5Sclose(ms);
            if (failed)
                ckpt_h5_reason(why, sizeof why);
        }
        if (failed) { /* (a whole tensor from the ring is one read of all its rows) */
            const int64_t hi = raw && k ? e->shape[0] : r0 + n;
            ckpt_err(p->err, "%s: cannot read tensor '%s' (dataset '/%s') rows %lld..%lld: %s",
                     path, e->name, dset, (long long)r0, (long long)hi, why);
            code = TRD_EXIT_RUNTIME;
        } else if (ckpt_checksum_rows(buf, r0, n, cols) != sums[r0 / R]) {
            ckpt_err(p->err,
                     "%s: tensor '%s' (dataset '/%s'): checksum mismatch in the block "
                     "at row %lld — the file is corrupted",
                     path, e->name, dset, (long long)r0);
            code = TRD_EXIT_RUNTIME;
        } else if (!k) {
            s->code = TRD_EXIT_OK;
            pipe_hand_over(p, k);
            s = NULL;
        }
    }
    if (code > 0 && !s)
        s = pipe_free_slot(p, k);
    if (s && code >= 0) { /* a whole tensor, or the slot marked with the error */
        s->code = code;
        pipe_hand_over(p, k);
    }
    if (fs >= 0)
        H5Sclose(fs);
    if (!raw)
        free(sums);
    if (d >= 0)
        H5Dclose(d);
    if (f >= 0)
        H5Fclose(f);
    return code;
}

static void *hf_reader(void *arg)
{
    const Hf *h = arg;
    HfPipe *p = h->pipe;
    for (int i = 0; i < p->n_reads && hf_read_source(h, p, &p->reads[i]) == TRD_EXIT_OK; i++)
        ;
    return NULL;
}

/* The raw place of each read, in order, while every step so far has one:
 * the dataset is float32, contiguous and allocated (as trident writes every
 * tensor, ckpt_raw.c), and its checksums are readable.  The first read
 * without one, and all after it, go through HDF5 (which also reports what
 * is wrong with them, where the writer meets them). */
static void hf_plan_raw(const Hf *h, HfPipe *p)
{
    char path[CKPT_FILE_PATH], dset[CKPT_PATH_NAME];
    int cap = 0;
    for (int i = 0; i < p->n_reads; i++)
        p->reads[i].base = -1;
    for (int i = 0; i < p->n_reads; i++) {
        HfRead *r = &p->reads[i];
        const CkptEntry *e = r->e;
        snprintf(path, sizeof path, "%s/%s", h->step_dir, e->file);
        snprintf(dset, sizeof dset, "%s/%s", e->kind, e->name);
        hid_t fapl = ckpt_serial_fapl();
        hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
        H5Pclose(fapl);
        hid_t d = f >= 0 ? H5Dopen2(f, dset, H5P_DEFAULT) : -1;
        hid_t type = d >= 0 ? H5Dget_type(d) : -1;
        haddr_t base = HADDR_UNDEF;
        if (type >= 0 && H5Tequal(type, H5T_IEEE_F32LE) > 0 &&
            ckpt_get_checksums(d, e, &r->sums) == 0)
            base = H5Dget_offset(d);
        if (type >= 0)
            H5Tclose(type);
        if (d >= 0)
            H5Dclose(d);
        if (f >= 0)
            H5Fclose(f);
        /* Each stage file once. */
        int fd = -1, fd_direct = -1;
        for (int j = 0; j < i && fd < 0; j++)
            if (p->reads[j].base >= 0 && !strcmp(p->reads[j].e->file, e->file)) {
                fd = p->reads[j].fd;
                fd_direct = p->reads[j].fd_direct;
            }
        if (base != HADDR_UNDEF && fd < 0 && (fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
            fd_direct = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
            p->fds = realloc(p->fds, (size_t)(p->n_fds + 2) * sizeof *p->fds);
            TRD_ASSERT(p->fds);
            p->fds[p->n_fds++] = fd;
            p->fds[p->n_fds++] = fd_direct;
        }
        if (base == HADDR_UNDEF || fd < 0) {
            free(r->sums);
            r->sums = NULL;
            break;
        }
        r->base = (int64_t)base;
        r->fd = fd;
        r->fd_direct = fd_direct;
        const int64_t R = ckpt_block_rows(e->ndim, e->shape), row = e->shape[1] * 4;
        for (int64_t r0 = 0; r0 < e->shape[0]; r0 += r->whole ? e->shape[0] : R) {
            const int64_t n =
                r->whole ? e->shape[0] : (r0 + R < e->shape[0] ? R : e->shape[0] - r0);
            if (p->n_plan == cap) {
                cap = cap ? 2 * cap : 64;
                p->plan = realloc(p->plan, (size_t)cap * sizeof *p->plan);
                TRD_ASSERT(p->plan);
            }
            p->plan[p->n_plan++] =
                (CkptSourceRead){fd, fd_direct, (off_t)(r->base + r0 * row), (size_t)(n * row)};
        }
    }
}

/* Start the reader over this rank's reads (their order is hf_write_mine's). */
static void hf_pipe_start(Hf *h, HfPipe *p)
{
    memset(p, 0, sizeof *p);
    p->reads = trd_calloc((size_t)(h->n ? h->n : 1), sizeof *p->reads, "export reads");
    const CkptEntry *last_whole = NULL;
    for (int shard = 0; shard < h->n_shards; shard++)
        for (int i = 0; i < h->n; i++) {
            const HfTensor *t = &h->t[i];
            if (t->shard != shard || t->owner != h->rank)
                continue;
            const int whole = t->op != HF_COPY;
            if (whole && t->src == last_whole)
                continue;
            p->reads[p->n_reads++] = (HfRead){t->src, whole, -1, -1, -1, NULL};
            if (whole)
                last_whole = t->src;
        }
    p->pool[0].n = HF_BLOCK_SLOTS;
    p->pool[1].n = HF_WHOLE_SLOTS;
    hf_plan_raw(h, p);
    if (p->n_plan) {
        ckpt_source_open(&p->src, p->plan, p->n_plan, 0);
        p->src_open = 1;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    h->pipe = p;
    p->running = pthread_create(&p->thread, NULL, hf_reader, h) == 0;
    TRD_ASSERT(p->running);
}

/* Stop the reader (when the writer ends early) and free the slots. */
static void hf_pipe_end(Hf *h, HfPipe *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->running)
        pthread_join(p->thread, NULL);
    if (p->src_open)
        ckpt_source_close(&p->src);
    for (int i = 0; i < p->n_fds; i++)
        if (p->fds[i] >= 0)
            close(p->fds[i]);
    free(p->fds);
    free(p->plan);
    for (int i = 0; i < p->n_reads; i++)
        free(p->reads[i].sums);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    for (int k = 0; k < HF_POOLS; k++)
        for (int i = 0; i < p->pool[k].n; i++)
            free(p->pool[k].slot[i].buf);
    free(p->reads);
    h->pipe = NULL;
}

/* The next slot of pool k from the reader, or its error (into h->err). */
static int hf_take(Hf *h, int k, HfSlot **slot)
{
    *slot = pipe_take(h->pipe, k);
    if ((*slot)->code != TRD_EXIT_OK) {
        snprintf(h->err, CFG_ERR, "%s", h->pipe->err);
        return (*slot)->code;
    }
    return TRD_EXIT_OK;
}

/* The whole tensor e into h->cache (kept until another one is asked for). */
static int hf_whole(Hf *h, const CkptEntry *e)
{
    if (h->cached == e)
        return TRD_EXIT_OK;
    if (h->cached)
        pipe_give_back(h->pipe, 1);
    h->cached = NULL;
    HfSlot *s;
    const int code = hf_take(h, 1, &s);
    if (code != TRD_EXIT_OK) {
        pipe_give_back(h->pipe, 1);
        return code;
    }
    h->cached = e;
    h->cache = s->buf;
    return TRD_EXIT_OK;
}

/* ---- writing ----------------------------------------------------------- */

/* The export's failure to write a shard (the sink's errno). */
static int sink_failed(Hf *h, const CkptSink *s)
{
    ckpt_err(h->err, "%s: cannot write: %s", s->path, strerror(errno));
    return TRD_EXIT_RUNTIME;
}

/* n floats, converted to the export dtype: fp32 as they are, bf16 rounded
 * to nearest even by the same bf16_round the trainer uses (the upper 16 bits
 * of the rounded float are the bf16). */
static int hf_emit(Hf *h, CkptSink *s, const float *x, size_t n)
{
    const size_t bytes = n * (h->bf16 ? 2 : 4);
    const void *src = x;
    if (h->bf16) {
        if (h->stage_cap < bytes) {
            free(h->stage);
            h->stage = trd_malloc(bytes, "export staging");
            h->stage_cap = bytes;
        }
        uint16_t *o = h->stage;
        for (size_t i = 0; i < n; i++) {
            const float r = bf16_round(x[i]);
            uint32_t bits;
            memcpy(&bits, &r, 4);
            o[i] = (uint16_t)(bits >> 16);
        }
        src = o;
    }
    if (ckpt_sink_put(s, src, bytes) != 0)
        return sink_failed(h, s);
    h->written += (int64_t)bytes;
    return TRD_EXIT_OK;
}

/* Head dimension d of HF's half-split RoPE convention holds what trident's
 * interleaved-pair dimension rope_src(d) holds.  trident rotates pairs
 * (2i, 2i+1) by angle pos * theta^(-2i/hs); HF's rotate_half pairs (i, i +
 * hs/2) with the same angle for i < hs/2.  So HF's dimension i is trident's
 * 2i and HF's i + hs/2 is trident's 2i + 1: with the q and k rows of every
 * head reordered that way, HF's rotation of the reordered vectors is
 * trident's rotation reordered, and the scores q.k are unchanged. */
static int64_t rope_src(int64_t d, int64_t hs) { return d < hs / 2 ? 2 * d : 2 * (d - hs / 2) + 1; }

/* Row of trident's fused qkv (per kv group g: its Q = heads/kv_heads query
 * heads, then k, then v; backend.h) holding dimension d of query head h
 * (part QKV_Q), of kv head h (QKV_K, QKV_V). */
static int64_t qkv_row(int64_t heads, int64_t kv_heads, int64_t hs, int part, int64_t head,
                       int64_t d)
{
    const int64_t Q = heads / kv_heads;
    if (part == QKV_Q)
        return (head / Q) * (Q + 2) * hs + (head % Q) * hs + d;
    return head * (Q + 2) * hs + (Q + (part == QKV_V)) * hs + d;
}

/* Output row j of a qkv part: the source row it comes from.  GPT-2's
 * c_attn columns are [Q | K | V], each heads x hs in head order; Llama's
 * q_proj / k_proj rows are permuted per head for RoPE (rope_src), v_proj's
 * are not.  Also the import's map (ckpt_hf_import.c), read the other way. */
int64_t ckpt_hf_qkv_src_row(int64_t heads, int64_t kv_heads, int64_t hs, int part, int64_t j)
{
    if (part == QKV_ALL) {
        const int64_t A = heads * hs, which = j / A, in = j % A;
        return qkv_row(heads, kv_heads, hs, (int)which, in / hs, in % hs);
    }
    const int64_t head = j / hs, d = j % hs;
    return qkv_row(heads, kv_heads, hs, part, head, part == QKV_V ? d : rope_src(d, hs));
}

static int64_t qkv_src_row(const Hf *h, int part, int64_t j)
{
    return ckpt_hf_qkv_src_row(h->heads, h->kv_heads, h->hs, part, j);
}

/* Tensor t, at file offset at of the shard s writes. */
static int hf_write_tensor(Hf *h, const HfTensor *t, CkptSink *s, off_t at)
{
    const CkptEntry *e = t->src;
    if (t->op == HF_COPY) {
        /* A checksum block at a time, as the reader hands them over. */
        const int64_t R = ckpt_block_rows(e->ndim, e->shape);
        int code = TRD_EXIT_OK;
        for (int64_t r0 = 0; code == TRD_EXIT_OK && r0 < e->shape[0]; r0 += R) {
            const int64_t n = r0 + R < e->shape[0] ? R : e->shape[0] - r0;
            HfSlot *b;
            code = hf_take(h, 0, &b);
            if (code == TRD_EXIT_OK)
                code = hf_emit(h, s, b->buf, (size_t)(n * e->shape[1]));
            pipe_give_back(h->pipe, 0);
        }
        return code;
    }
    int code = hf_whole(h, e);
    if (code != TRD_EXIT_OK)
        return code;
    const float *w = h->cache;
    const int64_t cols = e->shape[1];
    if (t->op == HF_EXPERT) /* its rows, as they are */
        return hf_emit(h, s, w + t->part * t->shape[0] * cols, (size_t)(t->shape[0] * cols));
    /* One output row at a time: [rows, cols] of the HF shape (a vector is
     * one row of its length). */
    const int64_t orows = t->ndim == 2 ? t->shape[0] : 1;
    const int64_t ocols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    if (t->ndim == 2 && (t->op == HF_TRANSPOSE || t->part == QKV_ALL)) {
        /* Output column j is source row src[j] (Conv1D: j itself; c_attn:
         * the qkv row it comes from), read down its length: the whole
         * tensor at once, in 8 x 8 blocks.  A column walk per output row
         * misses the cache on every element (a GPT-2 MLP matrix's rows are
         * 4096 floats apart), which was most of the export's time. */
        int64_t *src = trd_malloc((size_t)ocols * sizeof *src, "export column map");
        for (int64_t j = 0; j < ocols; j++)
            src[j] = t->op == HF_TRANSPOSE ? j : qkv_src_row(h, QKV_ALL, j);
        const int k = h->n_tbuf++ & 1;
        ckpt_sink_wait(s, h->tbuf_ticket[k]);
        const size_t n = (size_t)(orows * ocols), need = n * sizeof(float) + CKPT_RAW_ALIGN;
        h->tbuf[k] = ckpt_io_grow(h->tbuf[k], &h->tbuf_cap[k], need, "export transpose");
        float *o = (float *)(h->tbuf[k] + at % CKPT_RAW_ALIGN);
        TRD_ASSERT(orows == cols); /* o[i * ocols + j] = w[src[j] * cols + i] */
        ckpt_transpose(w, ocols, cols, src, NULL, o);
        free(src);
        if (h->bf16)
            return hf_emit(h, s, o, n);
        h->tbuf_ticket[k] = ckpt_sink_write_ref(s, o, n * sizeof(float), at);
        if (h->tbuf_ticket[k] < 0)
            return sink_failed(h, s);
        h->written += (int64_t)(n * sizeof(float));
        return TRD_EXIT_OK;
    }
    float *row = trd_malloc((size_t)ocols * sizeof(float), "export row");
    for (int64_t i = 0; i < orows && code == TRD_EXIT_OK; i++) {
        if (t->op == HF_TRANSPOSE) {
            for (int64_t j = 0; j < ocols; j++)
                row[j] = w[j * cols + i];
        } else if (t->ndim == 1) { /* the c_attn bias */
            for (int64_t j = 0; j < ocols; j++)
                row[j] = w[qkv_src_row(h, t->part, j)];
        } else if (t->part == QKV_ALL) { /* c_attn: [C, 3A], column j = qkv row */
            for (int64_t j = 0; j < ocols; j++)
                row[j] = w[qkv_src_row(h, QKV_ALL, j) * cols + i];
        } else { /* q/k/v_proj: whole rows */
            memcpy(row, w + qkv_src_row(h, t->part, i) * cols, (size_t)cols * sizeof(float));
        }
        code = hf_emit(h, s, row, (size_t)ocols);
    }
    free(row);
    return code;
}

/* The safetensors header of one shard: JSON padded with spaces to a
 * multiple of 8 bytes, so the data starts aligned. */
static char *hf_header(const Hf *h, int shard, uint64_t *len)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    for (int i = 0; i < h->n; i++) {
        const HfTensor *t = &h->t[i];
        if (t->shard != shard)
            continue;
        cJSON *o = cJSON_AddObjectToObject(root, t->name);
        cJSON_AddStringToObject(o, "dtype", h->bf16 ? "BF16" : "F32");
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *off = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)t->offset));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(t->offset + t->bytes)));
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    TRD_ASSERT(text);
    const size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    char *out = trd_malloc(padded + 1, "safetensors header");
    memcpy(out, text, n);
    memset(out + n, ' ', padded - n);
    out[padded] = '\0';
    cJSON_free(text);
    *len = padded;
    return out;
}

/* A shard is written as NAME.tmp and renamed once every shard is complete
 * (hf_publish), so a killed export never leaves a truncated NAME that
 * from_pretrained would try to read. */
static void hf_shard_path(const Hf *h, int shard, int tmp, char *out, size_t n)
{
    char name[64];
    hf_shard_name(h, shard, name, sizeof name);
    snprintf(out, n, "%s/%s%s", h->out_dir, name, tmp ? ".tmp" : "");
}

static int hf_publish(Hf *h)
{
    for (int s = 0; s < h->n_shards; s++) {
        char from[CKPT_FILE_PATH], to[CKPT_FILE_PATH];
        hf_shard_path(h, s, 1, from, sizeof from);
        hf_shard_path(h, s, 0, to, sizeof to);
        if (rename(from, to) != 0) {
            ckpt_err(h->err, "cannot rename %s to %s: %s", from, to, strerror(errno));
            return TRD_EXIT_RUNTIME;
        }
    }
    return TRD_EXIT_OK;
}

/* Rank 0 creates shard .tmp files at their full size, the header in place,
 * so every rank can then write its tensors at their offsets. */
static int hf_create_shard(Hf *h, int shard)
{
    char path[CKPT_FILE_PATH];
    hf_shard_path(h, shard, 1, path, sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        ckpt_err(h->err, "%s: cannot create: %s", path, strerror(errno));
        return TRD_EXIT_RUNTIME;
    }
    uint64_t len;
    char *head = hf_header(h, shard, &len);
    int64_t data = 0;
    for (int i = 0; i < h->n; i++)
        if (h->t[i].shard == shard)
            data += h->t[i].bytes;
    int ok = fwrite(&len, 8, 1, f) == 1 && fwrite(head, 1, len, f) == len &&
             ftruncate(fileno(f), (off_t)(8 + len + (uint64_t)data)) == 0;
    free(head);
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        ckpt_err(h->err, "%s: cannot write: %s", path, strerror(errno));
        return TRD_EXIT_RUNTIME;
    }
    return TRD_EXIT_OK;
}

/* This rank's tensors, each written at its place in its shard. */
static int hf_write_shards(Hf *h)
{
    int code = TRD_EXIT_OK;
    for (int shard = 0; shard < h->n_shards && code == TRD_EXIT_OK; shard++) {
        int mine = 0;
        for (int i = 0; i < h->n; i++)
            mine |= h->t[i].shard == shard && h->t[i].owner == h->rank;
        if (!mine)
            continue;
        char path[CKPT_FILE_PATH];
        hf_shard_path(h, shard, 1, path, sizeof path);
        CkptSink s;
        if (ckpt_sink_open(&s, path) != 0) {
            ckpt_err(h->err, "%s: cannot open for writing: %s", path, strerror(errno));
            return TRD_EXIT_RUNTIME;
        }
        uint64_t len;
        free(hf_header(h, shard, &len));
        h->tbuf_ticket[0] = h->tbuf_ticket[1] = 0; /* tickets of this sink */
        for (int i = 0; i < h->n && code == TRD_EXIT_OK; i++) {
            const HfTensor *t = &h->t[i];
            if (t->shard != shard || t->owner != h->rank)
                continue;
            const off_t at = (off_t)(8 + len + (uint64_t)t->offset);
            code = ckpt_sink_seek(&s, at) == 0 ? TRD_EXIT_OK : sink_failed(h, &s);
            if (code == TRD_EXIT_OK)
                code = hf_write_tensor(h, t, &s, at);
        }
        if (ckpt_sink_close(&s, code == TRD_EXIT_OK) != 0 && code == TRD_EXIT_OK)
            code = sink_failed(h, &s);
    }
    return code;
}

/* The same, with the reader thread running ahead. */
static int hf_write_mine(Hf *h)
{
    HfPipe p;
    hf_pipe_start(h, &p);
    const int code = hf_write_shards(h);
    hf_pipe_end(h, &p);
    h->cached = NULL;
    h->cache = NULL;
    return code;
}

/* Tensors to ranks: each to the rank with the fewest bytes so far, in
 * order, so the split is the same on every rank and about even. */
static void hf_assign(Hf *h)
{
    int64_t *load = trd_calloc((size_t)h->size, sizeof *load, "export split");
    for (int i = 0; i < h->n; i++) {
        int best = 0;
        for (int r = 1; r < h->size; r++)
            best = load[r] < load[best] ? r : best;
        h->t[i].owner = best;
        load[best] += h->t[i].bytes;
    }
    free(load);
}

/* The worst code of all ranks, and rank `from`'s message where it failed. */
static int hf_agree(Hf *h, int code)
{
    if (h->size == 1)
        return code;
    int worst = code, from = code ? h->rank : h->size;
    comm_allreduce_max_i32(&h->world, &worst, 1);
    comm_allreduce_min_i32(&h->world, &from, 1);
    if (worst != TRD_EXIT_OK && from < h->size)
        comm_broadcast(&h->world, h->err, CFG_ERR, from);
    return worst;
}

/* Write a cJSON document as DIR/name (pretty-printed, as HF writes them). */
static int hf_write_json(Hf *h, const char *name, cJSON *doc)
{
    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/%s", h->out_dir, name);
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    TRD_ASSERT(text);
    FILE *f = fopen(path, "w");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    ok = f && fclose(f) == 0 && ok;
    cJSON_free(text);
    if (!ok) {
        ckpt_err(h->err, "%s: cannot write: %s", path, strerror(errno));
        return TRD_EXIT_RUNTIME;
    }
    return TRD_EXIT_OK;
}

static int hf_write_index(Hf *h)
{
    cJSON *doc = cJSON_CreateObject();
    int64_t total = 0;
    for (int i = 0; i < h->n; i++)
        total += h->t[i].bytes;
    cJSON *meta = cJSON_AddObjectToObject(doc, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(doc, "weight_map");
    for (int i = 0; i < h->n; i++) {
        char name[64];
        hf_shard_name(h, h->t[i].shard, name, sizeof name);
        cJSON_AddStringToObject(map, h->t[i].name, name);
    }
    return hf_write_json(h, "model.safetensors.index.json", doc);
}

static int hf_write_configs(Hf *h)
{
    const CkptIndex *ix = h->ix;
    const int gpt2_vocab = ix->vocab == GPT2_VOCAB;
    /* Older indexes lack norm_eps and rope_theta: trident's defaults then
     * (config.c), which those runs could not change. */
    const double eps = ix->has_norms ? ix->norm_eps : (double)1e-5f;
    const double theta = ix->has_norms ? ix->rope_theta : 10000.0;
    cJSON *c = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
    if (h->gpt2) {
        cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
        cJSON_AddStringToObject(c, "model_type", "gpt2");
        cJSON_AddNumberToObject(c, "vocab_size", ix->vocab);
        cJSON_AddNumberToObject(c, "n_positions", ix->seq_len);
        cJSON_AddNumberToObject(c, "n_ctx", ix->seq_len);
        cJSON_AddNumberToObject(c, "n_embd", ix->hidden);
        cJSON_AddNumberToObject(c, "n_layer", ix->layers);
        cJSON_AddNumberToObject(c, "n_head", ix->heads);
        cJSON_AddNumberToObject(c, "n_inner", ix->ffn_hidden);
        /* trident's GELU is the tanh approximation (backend.h), HF's gelu_new. */
        cJSON_AddStringToObject(c, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(c, "layer_norm_epsilon", eps);
        cJSON_AddNumberToObject(c, "resid_pdrop", 0);
        cJSON_AddNumberToObject(c, "embd_pdrop", 0);
        cJSON_AddNumberToObject(c, "attn_pdrop", 0);
        cJSON_AddBoolToObject(c, "scale_attn_weights", 1);
    } else {
        const int mixtral = h->experts > 0;
        cJSON_AddItemToArray(
            arch, cJSON_CreateString(mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM"));
        cJSON_AddStringToObject(c, "model_type", mixtral ? "mixtral" : "llama");
        cJSON_AddNumberToObject(c, "vocab_size", ix->vocab);
        cJSON_AddNumberToObject(c, "hidden_size", ix->hidden);
        /* Mixtral's intermediate_size is an expert's width. */
        cJSON_AddNumberToObject(c, "intermediate_size",
                                mixtral ? (double)h->expert_ffn : ix->ffn_hidden);
        if (mixtral) {
            cJSON_AddNumberToObject(c, "num_local_experts", (double)h->experts);
            cJSON_AddNumberToObject(c, "num_experts_per_tok", ix->moe[1]);
            cJSON_AddNumberToObject(c, "router_aux_loss_coef", ix->moe_coefs[0]);
            cJSON_AddBoolToObject(c, "output_router_logits", 0);
            cJSON_AddNumberToObject(c, "router_jitter_noise", 0);
            cJSON_AddNullToObject(c, "sliding_window"); /* full attention, as trident's */
        }
        cJSON_AddNumberToObject(c, "num_hidden_layers", ix->layers);
        cJSON_AddNumberToObject(c, "num_attention_heads", ix->heads);
        cJSON_AddNumberToObject(c, "num_key_value_heads", ix->kv_heads);
        cJSON_AddNumberToObject(c, "head_dim", (double)h->hs);
        cJSON_AddNumberToObject(c, "max_position_embeddings", ix->seq_len);
        cJSON_AddStringToObject(c, "hidden_act", "silu");
        cJSON_AddNumberToObject(c, "rms_norm_eps", eps);
        cJSON_AddNumberToObject(c, "rope_theta", theta);
        if (ix->rope_llama3) {
            cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
            cJSON_AddStringToObject(rs, "rope_type", "llama3");
            cJSON_AddNumberToObject(rs, "factor", ix->rope_params[0]);
            cJSON_AddNumberToObject(rs, "low_freq_factor", ix->rope_params[1]);
            cJSON_AddNumberToObject(rs, "high_freq_factor", ix->rope_params[2]);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", ix->rope_params[3]);
        } else
            cJSON_AddNullToObject(c, "rope_scaling");
        if (!mixtral) {
            cJSON_AddBoolToObject(c, "attention_bias", 0);
            cJSON_AddBoolToObject(c, "mlp_bias", 0);
        }
        cJSON_AddNumberToObject(c, "attention_dropout", 0);
    }
    cJSON_AddBoolToObject(c, "tie_word_embeddings", ix->tie_embeddings);
    cJSON_AddStringToObject(c, "torch_dtype", h->bf16 ? "bfloat16" : "float32");
    if (gpt2_vocab) {
        cJSON_AddNumberToObject(c, "bos_token_id", GPT2_EOT);
        cJSON_AddNumberToObject(c, "eos_token_id", GPT2_EOT);
    }
    int code = hf_write_json(h, "config.json", c);
    if (code == TRD_EXIT_OK) {
        cJSON *g = cJSON_CreateObject();
        if (gpt2_vocab) {
            cJSON_AddNumberToObject(g, "bos_token_id", GPT2_EOT);
            cJSON_AddNumberToObject(g, "eos_token_id", GPT2_EOT);
        }
        cJSON_AddNumberToObject(g, "max_length", ix->seq_len);
        code = hf_write_json(h, "generation_config.json", g);
    }
    return code;
}

static int copy_file(Hf *h, const char *from, const char *to_name)
{
    char to[CKPT_FILE_PATH];
    snprintf(to, sizeof to, "%s/%s", h->out_dir, to_name);
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    char buf[1 << 16];
    size_t n;
    int ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        ok = 0;
    if (!ok) {
        ckpt_err(h->err, "cannot copy %s to %s: %s", from, to, strerror(errno));
        return TRD_EXIT_RUNTIME;
    }
    return TRD_EXIT_OK;
}

/* The GPT-2 vocabulary's files, as HF's GPT2Tokenizer reads them
 * (vocab.json = encoder.json, merges.txt = vocab.bpe).  Returns 0 with
 * *wrote = 0 when the files are not installed (a note is printed). */
static int hf_write_tokenizer(Hf *h, int *wrote)
{
    *wrote = 0;
    if (h->ix->vocab != GPT2_VOCAB)
        return TRD_EXIT_OK;
    char vbuf[CKPT_FILE_PATH], mbuf[CKPT_FILE_PATH];
    const char *vocab = inputs_repo_file(DATA_GPT2_ENCODER_DEFAULT, vbuf, sizeof vbuf);
    const char *merges = inputs_repo_file(DATA_GPT2_MERGES_DEFAULT, mbuf, sizeof mbuf);
    struct stat st;
    if (stat(vocab, &st) != 0 || stat(merges, &st) != 0) {
        printf("note: %s not found: no tokenizer files written (scripts/get_corpus.sh "
               "installs them)\n",
               vocab);
        return TRD_EXIT_OK;
    }
    int code = copy_file(h, vocab, "vocab.json");
    if (code == TRD_EXIT_OK)
        code = copy_file(h, merges, "merges.txt");
    if (code == TRD_EXIT_OK) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "tokenizer_class", "GPT2Tokenizer");
        cJSON_AddStringToObject(t, "bos_token", "<|endoftext|>");
        cJSON_AddStringToObject(t, "eos_token", "<|endoftext|>");
        cJSON_AddStringToObject(t, "unk_token", "<|endoftext|>");
        cJSON_AddBoolToObject(t, "add_prefix_space", 0);
        cJSON_AddNumberToObject(t, "model_max_length", h->ix->seq_len);
        code = hf_write_json(h, "tokenizer_config.json", t);
    }
    *wrote = code == TRD_EXIT_OK;
    return code;
}

/* Weights of an earlier export into the same DIR would be found by
 * from_pretrained next to (or instead of) the new ones: model.safetensors
 * wins over an index, a stale index names stale shards.  Also the .tmp
 * shards of a failed or killed export. */
static void hf_remove_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        int a, b;
        char tail[32];
        const int shard =
            sscanf(de->d_name, "model-%5d-of-%5d.safetensor%31s", &a, &b, tail) == 3 &&
            (!strcmp(tail, "s") || !strcmp(tail, "s.tmp"));
        if (shard || !strcmp(de->d_name, "model.safetensors") ||
            !strcmp(de->d_name, "model.safetensors.tmp") ||
            !strcmp(de->d_name, "model.safetensors.index.json")) {
            char path[CKPT_FILE_PATH];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            remove(path);
        }
    }
    closedir(d);
}

/* DIR exists (created if missing, one level) and is a writable directory. */
static int hf_prepare_dir(const char *dir, char err[CFG_ERR])
{
    struct stat st;
    if (stat(dir, &st) != 0 && mkdir(dir, 0777) != 0) {
        ckpt_err(err, "--out %s: cannot create the directory: %s", dir, strerror(errno));
        return -1;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        ckpt_err(err, "--out %s: exists and is not a directory", dir);
        return -1;
    }
    char probe[CKPT_FILE_PATH];
    snprintf(probe, sizeof probe, "%s/.trident-export-probe", dir);
    FILE *f = fopen(probe, "w");
    if (!f) {
        ckpt_err(err, "--out %s: cannot write into the directory: %s", dir, strerror(errno));
        return -1;
    }
    fclose(f);
    remove(probe);
    return 0;
}

int ckpt_hf_parse_size(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || errno || !(v > 0))
        return -1;
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1e3},
                 {"MB", 1e6},
                 {"GB", 1e9},
                 {"TB", 1e12},
                 {"KIB", 1024.0},
                 {"MIB", 1048576.0},
                 {"GIB", 1073741824.0},
                 {"TIB", 1099511627776.0}};
    char suf[8] = {0};
    size_t n = strlen(end);
    if (n >= sizeof suf)
        return -1;
    for (size_t i = 0; i < n; i++)
        suf[i] = (char)toupper((unsigned char)end[i]);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(suf, units[i].suffix)) {
            const double b = v * units[i].mult;
            if (b < 1 || b > 9e18)
                return -1;
            *out = (int64_t)b;
            return 0;
        }
    return -1;
}

/* A MoE checkpoint exports as MixtralForCausalLM: a llama whose every
 * layer is a MoE layer without shared experts (h->experts set), else exit
 * 2 naming what Mixtral cannot express.  A capacity factor exports (it is
 * a training-time drop; Hugging Face runs Mixtral dropless): a note says so. */
static int hf_mixtral_check(Hf *h, const char *step_dir)
{
    const CkptIndex *ix = h->ix;
    const char *why = NULL;
    char buf[160];
    if (h->gpt2)
        why = "arch gpt2: the Hugging Face MoE layout trident writes is MixtralForCausalLM, "
              "a Llama (train with model.arch: llama)";
    else if (ix->moe[4] > 0) {
        snprintf(buf, sizeof buf,
                 "model.moe.shared_experts %d: MixtralForCausalLM has no shared experts",
                 ix->moe[4]);
        why = buf;
    } else if (ix->moe[2] != 1) {
        snprintf(buf, sizeof buf,
                 "model.moe.every %d: every layer of MixtralForCausalLM is a MoE layer "
                 "(every 1)",
                 ix->moe[2]);
        why = buf;
    }
    if (why) {
        ckpt_err(h->err, "%s: no Hugging Face export of a mixture-of-experts model with %s",
                 step_dir, why);
        return -1;
    }
    h->experts = ix->moe[0];
    h->expert_ffn = ix->moe[3] > 0 ? ix->moe[3] : ix->ffn_hidden;
    if (ix->moe_coefs[2] > 0 && h->rank == 0)
        printf("note: trained with model.moe.capacity_factor %g (tokens over it dropped); "
               "Hugging Face's Mixtral runs dropless, as trident generate does\n",
               ix->moe_coefs[2]);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ckpt_hf_export(const char *arg, const char *out_dir, int bf16, int64_t max_shard)
{
    ckpt_h5_quiet();
    Hf h = {.out_dir = out_dir, .bf16 = bf16};
    char step_dir[CFG_STR];
    CkptIndex ix;
    const double t0 = now_s();
    /* Under an MPI launcher with several ranks, the tensors are split
     * between them; otherwise serial, without MPI. */
    const char *pmi = getenv("PMI_SIZE");
    if (pmi && atoi(pmi) > 1) {
        int argc0 = 0;
        char **argv0 = NULL;
        comm_init(&argc0, &argv0);
        h.world = comm_world();
        h.rank = h.world.rank;
        h.size = h.world.size;
    } else {
        h.size = 1;
    }
    if (ckpt_resolve(NULL, RESUME_PATH, arg, step_dir, h.err) != 1)
        goto input;
    char path[CKPT_FILE_PATH];
    snprintf(path, sizeof path, "%s/index.h5", step_dir);
    if (ckpt_index_read(path, &ix, h.err) != 0)
        goto input;
    h.ix = &ix;
    h.step_dir = step_dir;
    h.gpt2 = !strcmp(ix.arch, "gpt2");
    h.heads = ix.heads;
    h.kv_heads = ix.kv_heads;
    h.hs = ix.heads > 0 ? ix.hidden / ix.heads : 0;
    int code = TRD_EXIT_INPUT;
    if (ix.moe[0] > 0 && hf_mixtral_check(&h, step_dir) != 0)
        goto fail;
    if (!h.gpt2 && strcmp(ix.arch, "llama")) {
        ckpt_err(h.err, "%s: arch '%s' has no Hugging Face mapping (gpt2, llama)", step_dir,
                 ix.arch);
        goto fail;
    }
    if (h.gpt2 && ix.kv_heads != ix.heads) {
        ckpt_err(h.err,
                 "%s: a gpt2 model with kv_heads %d < heads %d (grouped-query "
                 "attention) has no GPT2LMHeadModel equivalent; use arch llama",
                 step_dir, ix.kv_heads, ix.heads);
        goto fail;
    }
    /* fp32 values from the master weights when the run kept them (bf16
     * training), which are the values the optimizer holds; else the weights. */
    h.kind = ix.n && ckpt_index_find(&ix, ix.e[0].name, CKPT_MASTER) ? CKPT_MASTER : CKPT_PARAMS;
    if (hf_plan(&h) != 0)
        goto fail;
    if (hf_agree(&h,
                 h.rank == 0 && hf_prepare_dir(out_dir, h.err) != 0 ? TRD_EXIT_INPUT : TRD_EXIT_OK))
        goto fail;
    hf_shard(&h, max_shard);
    hf_assign(&h);
    code = TRD_EXIT_OK;
    if (h.rank == 0) {
        hf_remove_stale(out_dir);
        for (int s = 0; s < h.n_shards && code == TRD_EXIT_OK; s++)
            code = hf_create_shard(&h, s);
    }
    code = hf_agree(&h, code);
    if (code == TRD_EXIT_OK)
        code = hf_agree(&h, hf_write_mine(&h));
    int tok = 0;
    if (h.rank == 0 && code == TRD_EXIT_OK) {
        code = hf_publish(&h);
        if (code == TRD_EXIT_OK && h.n_shards > 1)
            code = hf_write_index(&h);
        if (code == TRD_EXIT_OK)
            code = hf_write_configs(&h);
        if (code == TRD_EXIT_OK)
            code = hf_write_tokenizer(&h, &tok);
    }
    code = hf_agree(&h, code);
    if (code != TRD_EXIT_OK) {
        /* No half-written weights that from_pretrained would pick up. */
        if (h.rank == 0)
            hf_remove_stale(out_dir);
        goto fail;
    }
    if (h.size > 1) {
        uint64_t w = (uint64_t)h.written;
        comm_allreduce_sum_u64(&h.world, &w, 1);
        h.written = (int64_t)w;
    }
    const double dt = now_s() - t0;
    if (h.rank == 0)
        printf("exported %d tensors of step %lld (%s, %s) to %s: %s, %.1f MiB in %d file%s%s, "
               "%.2f s (%.0f MB/s%s)\n",
               h.n, (long long)ix.state.step, ix.arch, ckpt_kind_names[h.kind], out_dir,
               bf16 ? "bf16" : "fp32", trd_mib((size_t)h.written), h.n_shards,
               h.n_shards > 1 ? "s + model.safetensors.index.json" : "",
               tok ? ", tokenizer files" : "", dt, dt > 0 ? 1e-6 * (double)h.written / dt : 0.0,
               h.size > 1 ? ", tensors split over the ranks" : "");
fail:
    free(h.t);
    free(h.tbuf[0]);
    free(h.tbuf[1]);
    free(h.stage);
    ckpt_index_free(&ix);
    if (code != TRD_EXIT_OK && h.rank == 0)
        fprintf(stderr, "trident: error: %s\n", h.err);
    if (h.size > 1)
        comm_finalize();
    return code;
input:
    if (h.rank == 0)
        fprintf(stderr, "trident: error: %s\n", h.err);
    if (h.size > 1)
        comm_finalize();
    return TRD_EXIT_INPUT;
}
