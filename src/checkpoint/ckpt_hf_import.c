/* ckpt_hf_import.c — `trident ckpt import --from hf HF_DIR --out CKPTDIR`:
 * a Hugging Face model directory (as our export writes it) read back into a
 * weights-only trident checkpoint at step 0, the inverse of ckpt_hf.c.
 *
 * The safetensors reader trusts nothing in the files: the header length is
 * bounded by the file and by 100 MB before anything is allocated, the JSON
 * goes through cJSON, every tensor's dtype and shape must be what
 * config.json implies, its data_offsets must lie inside the file and not
 * overlap another's, and the data is read at those checked offsets (a
 * short read is a truncated file).  Bad input is exit 2 naming the file
 * and the tensor; so is a tensor named twice in a header.
 *
 * MixtralForCausalLM is a llama with model.moe (every layer, no shared
 * experts): each layer's E experts' w1, w3 and w2 are stacked into
 * trident's moe.experts.gate, .up and .down (expert e's rows at e x rows).
 *
 * Driven by trident's parameter table for the model config.json describes
 * (params_build, one rank): each trident tensor is made from its HF
 * source(s), checked finite, and written with its checksum blocks into
 * stage_0.h5.  `ckpt import` plans every read first (the same mapping, run
 * dry) and a CkptSource reads them ahead with O_DIRECT; a tensor taken as
 * it is goes through in pieces of 2 checksum blocks, a converted one
 * (transposed, the qkv) is made whole in one of two buffers, written from
 * there while the next is made.  `checkpoint.init_from` reads with pread,
 * each rank the tensors it holds a piece of.  Layout: docs/checkpoint.md,
 * "Import from Hugging Face". */
#include "checkpoint/ckpt_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors is little-endian: the reader takes the bytes as host floats"
#endif

#define ST_MAX_HEADER  (100LL * 1000 * 1000)
#define ST_MAX_SHARDS  256
#define HF_NAME_IMPORT 128

/* ---- safetensors ------------------------------------------------------ */

/* The dtypes read: published checkpoints come in all three.  Each is
 * widened exactly to fp32 (every BF16 and F16 value is an fp32 value). */
typedef enum { ST_F32, ST_BF16, ST_F16 } StDtype;
static const char *const st_dtype_names[] = {"F32", "BF16", "F16"};
static const char *const st_torch_names[] = {"float32", "bfloat16", "float16"};

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[2];   /* shape[1] == 1 when ndim == 1 */
    int64_t begin, end; /* absolute file offsets */
} StTensor;

typedef struct {
    char path[CKPT_FILE_PATH];
    int fd;
    int fd_direct; /* O_DIRECT, or -1 (ckpt import's reads ahead) */
    int64_t size;
    StTensor *t;
    int n;
} StFile;

typedef struct {
    char dir[CKPT_FILE_PATH];
    StFile f[ST_MAX_SHARDS];
    int n_files;
    cJSON *weight_map; /* NULL: one model.safetensors */
    cJSON *index_doc;
    int want_dtype; /* an StDtype, or -1: config.json does not say */
    /* Planning: st_get only appends the tensor's bytes to the plan
     * (returning ST_PLANNED); a source then reads the plan ahead of the
     * st_get calls that follow, made in the same order. */
    int planning;
    CkptSourceRead *plan;
    const StTensor **plan_t; /* the tensor of each read, to check the order */
    int n_plan, plan_cap;
    CkptSource *src; /* NULL: st_get reads with pread */
    int held;        /* a view into the source's ring awaits st_done */
    void *raw;       /* without a source: a tensor's bytes */
    float *wide;     /* a BF16 or F16 tensor widened */
    size_t raw_cap, wide_cap;
} StSet;

/* What st_get returns while planning: the tensor's bytes were planned,
 * none were read.  Not an exit code. */
enum { ST_PLANNED = -1 };

/* Bytes per element. */
static int64_t st_size(const StTensor *t) { return t->dtype == ST_F32 ? 4 : 2; }

/* IEEE half to float, exactly: normal numbers rebias the exponent,
 * subnormals are normalised (fp32 holds them as normal numbers), Inf and
 * NaN keep their payload. */
static uint32_t st_half_bits(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)
        return sign | 0x7f800000u | man << 13;
    if (exp)
        return sign | (exp + 112) << 23 | man << 13;
    if (!man)
        return sign;
    exp = 113; /* 2^-14 is exponent 113; shift until the leading bit is bit 10 */
    while (!(man & 0x400u)) {
        man <<= 1;
        exp--;
    }
    return sign | exp << 23 | (man & 0x3ffu) << 13;
}

static int tensor_cmp(const void *a, const void *b)
{
    const StTensor *x = a, *y = b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
                                 : (x->end > y->end) - (x->end < y->end);
}

/* An integer JSON number in [lo, hi], or -1 into *ok. */
static int64_t json_int(const cJSON *v, int64_t lo, int64_t hi, int *ok)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
        *ok = 0;
        return 0;
    }
    return (int64_t)v->valuedouble;
}

static void st_close(StFile *f)
{
    for (int i = 0; i < f->n; i++)
        free(f->t[i].name);
    free(f->t);
    if (f->fd >= 0)
        close(f->fd);
    if (f->fd_direct >= 0)
        close(f->fd_direct);
    f->fd = f->fd_direct = -1;
    f->t = NULL;
    f->n = 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A name twice in one header (JSON allows it; which entry a reader takes
 * is its own choice): exit 2 naming it. */
static int st_unique_names(const StFile *f, char err[CFG_ERR])
{
    const char **names = trd_malloc((size_t)f->n * sizeof *names, "safetensors names");
    for (int i = 0; i < f->n; i++)
        names[i] = f->t[i].name;
    qsort(names, (size_t)f->n, sizeof *names, name_cmp);
    int code = TRD_EXIT_OK;
    for (int i = 1; i < f->n && code == TRD_EXIT_OK; i++)
        if (!strcmp(names[i], names[i - 1])) {
            ckpt_err(err, "%s: tensor '%s' appears twice in the header", f->path, names[i]);
            code = TRD_EXIT_INPUT;
        }
    free(names);
    return code;
}

/* Open and validate one safetensors file (header and offsets; the data is
 * read later).  Returns 0, or an exit code with err. */
static int st_open(StFile *f, const char *path, char err[CFG_ERR])
{
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    f->fd_direct = f->fd >= 0 ? open(path, O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    struct stat st;
    if (f->fd < 0 || fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ckpt_err(err, "%s: cannot open: %s", path, f->fd < 0 ? strerror(errno) : "not a file");
        return TRD_EXIT_INPUT;
    }
    f->size = st.st_size;
    uint64_t hlen = 0;
    if (f->size < 8 || pread(f->fd, &hlen, 8, 0) != 8) {
        ckpt_err(err, "%s: truncated: %lld bytes, shorter than the 8-byte header length", path,
                 (long long)f->size);
        return TRD_EXIT_INPUT;
    }
    if (hlen > (uint64_t)ST_MAX_HEADER || hlen > (uint64_t)(f->size - 8)) {
        ckpt_err(err,
                 "%s: header length %llu is absurd (file %lld bytes, limit %lld): not a "
                 "safetensors file, or truncated",
                 path, (unsigned long long)hlen, (long long)f->size, ST_MAX_HEADER);
        return TRD_EXIT_INPUT;
    }
    char *text = trd_malloc(hlen + 1, "safetensors header");
    if (pread(f->fd, text, hlen, 8) != (ssize_t)hlen) {
        free(text);
        ckpt_err(err, "%s: cannot read the %llu-byte header: %s", path, (unsigned long long)hlen,
                 strerror(errno));
        return TRD_EXIT_INPUT;
    }
    text[hlen] = '\0';
    cJSON *doc = cJSON_ParseWithLength(text, hlen);
    free(text);
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        ckpt_err(err, "%s: the header is not a JSON object (malformed JSON)", path);
        return TRD_EXIT_INPUT;
    }
    const int64_t data0 = 8 + (int64_t)hlen, data_len = f->size - data0;
    int n = cJSON_GetArraySize(doc), code = TRD_EXIT_OK;
    f->t = trd_calloc((size_t)(n ? n : 1), sizeof(StTensor), "safetensors header");
    const cJSON *o;
    cJSON_ArrayForEach(o, doc)
    {
        if (!strcmp(o->string, "__metadata__"))
            continue;
        StTensor *t = &f->t[f->n++];
        t->name = strdup(o->string);
        TRD_ASSERT(t->name);
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2) {
            ckpt_err(err,
                     "%s: tensor '%s': header entry lacks dtype, shape or a "
                     "[begin, end] data_offsets",
                     path, t->name);
            code = TRD_EXIT_INPUT;
            break;
        }
        int kind = -1;
        for (int k = 0; k < 3; k++)
            if (!strcmp(dt->valuestring, st_dtype_names[k]))
                kind = k;
        if (kind < 0) {
            ckpt_err(err, "%s: tensor '%s': dtype %s (trident reads F32, F16 and BF16)", path,
                     t->name, dt->valuestring);
            code = TRD_EXIT_INPUT;
            break;
        }
        t->dtype = (StDtype)kind;
        t->ndim = cJSON_GetArraySize(sh);
        int ok = t->ndim == 1 || t->ndim == 2;
        t->shape[1] = 1;
        for (int d = 0; d < t->ndim && ok; d++)
            t->shape[d] = json_int(cJSON_GetArrayItem(sh, d), 0, 1LL << 40, &ok);
        /* Bounded by the file, so the byte count below cannot overflow. */
        if (ok && t->shape[1] > 0 && t->shape[0] > f->size / t->shape[1])
            ok = 0;
        if (!ok) {
            ckpt_err(err,
                     "%s: tensor '%s': shape must be 1 or 2 non-negative integers whose "
                     "product fits in the file",
                     path, t->name);
            code = TRD_EXIT_INPUT;
            break;
        }
        const int64_t b = json_int(cJSON_GetArrayItem(off, 0), 0, INT64_MAX / 2, &ok);
        const int64_t e = json_int(cJSON_GetArrayItem(off, 1), 0, INT64_MAX / 2, &ok);
        const int64_t want = t->shape[0] * t->shape[1] * st_size(t);
        if (!ok || e < b) {
            ckpt_err(err, "%s: tensor '%s': data_offsets are not integers 0 <= begin <= end", path,
                     t->name);
            code = TRD_EXIT_INPUT;
            break;
        }
        if (e > data_len) {
            ckpt_err(err,
                     "%s: tensor '%s': data_offsets [%lld, %lld] past the end of the file "
                     "(data section %lld bytes): truncated?",
                     path, t->name, (long long)b, (long long)e, (long long)data_len);
            code = TRD_EXIT_INPUT;
            break;
        }
        if (e - b != want) {
            ckpt_err(err,
                     "%s: tensor '%s': data_offsets span %lld bytes, its shape and dtype "
                     "need %lld",
                     path, t->name, (long long)(e - b), (long long)want);
            code = TRD_EXIT_INPUT;
            break;
        }
        t->begin = data0 + b;
        t->end = data0 + e;
    }
    cJSON_Delete(doc);
    if (code == TRD_EXIT_OK && f->n > 1)
        code = st_unique_names(f, err);
    if (code == TRD_EXIT_OK && f->n > 1) {
        /* Overlaps: sorted by begin, each non-empty tensor must start at or
         * after the furthest end so far (an empty one between two others
         * must not hide their overlap). */
        StTensor *s = trd_malloc((size_t)f->n * sizeof *s, "safetensors header");
        memcpy(s, f->t, (size_t)f->n * sizeof *s);
        qsort(s, (size_t)f->n, sizeof *s, tensor_cmp);
        int64_t reach = 0;
        int last = -1;
        for (int i = 0; i < f->n && code == TRD_EXIT_OK; i++) {
            if (s[i].end == s[i].begin)
                continue;
            if (last >= 0 && s[i].begin < reach) {
                ckpt_err(err, "%s: tensor '%s': data_offsets overlap those of tensor '%s'", path,
                         s[i].name, s[last].name);
                code = TRD_EXIT_INPUT;
            }
            if (s[i].end > reach) {
                reach = s[i].end;
                last = i;
            }
        }
        free(s);
    }
    return code;
}

static const StTensor *st_find_in(const StFile *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name))
            return &f->t[i];
    return NULL;
}

/* A plain file name in the HF directory (no path: an index cannot send the
 * reader elsewhere). */
static int plain_name(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static int read_json(const char *path, cJSON **doc, char err[CFG_ERR])
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        ckpt_err(err, "%s: cannot open: %s", path, strerror(errno));
        return TRD_EXIT_INPUT;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    char chunk[1 << 14];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0 && n <= (size_t)ST_MAX_HEADER) {
        if (n + got + 1 > cap) {
            cap = 2 * (n + got + 1);
            buf = realloc(buf, cap);
            TRD_ASSERT(buf);
        }
        memcpy(buf + n, chunk, got);
        n += got;
    }
    fclose(f);
    *doc = buf ? cJSON_ParseWithLength(buf, n) : NULL;
    free(buf);
    if (!cJSON_IsObject(*doc)) {
        cJSON_Delete(*doc);
        *doc = NULL;
        ckpt_err(err, "%s: not a JSON object (malformed JSON)", path);
        return TRD_EXIT_INPUT;
    }
    return TRD_EXIT_OK;
}

static int st_set_open(StSet *s, const char *dir, char err[CFG_ERR])
{
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    char path[CKPT_FILE_PATH + 64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        int code = read_json(path, &s->index_doc, err);
        if (code)
            return code;
        s->weight_map = cJSON_GetObjectItemCaseSensitive(s->index_doc, "weight_map");
        if (!cJSON_IsObject(s->weight_map)) {
            ckpt_err(err, "%s: no \"weight_map\" object", path);
            return TRD_EXIT_INPUT;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, s->weight_map)
        {
            if (!cJSON_IsString(e) || !plain_name(e->valuestring)) {
                ckpt_err(err, "%s: tensor '%s': the shard must be a file name in %s", path,
                         e->string, dir);
                return TRD_EXIT_INPUT;
            }
            int have = 0;
            for (int i = 0; i < s->n_files && !have; i++)
                have = !strcmp(strrchr(s->f[i].path, '/') + 1, e->valuestring);
            if (have)
                continue;
            if (s->n_files == ST_MAX_SHARDS) {
                ckpt_err(err, "%s: more than %d shards", path, ST_MAX_SHARDS);
                return TRD_EXIT_INPUT;
            }
            char shard[CKPT_FILE_PATH + 64];
            snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
            if (stat(shard, &st) != 0) {
                ckpt_err(err, "%s: shard %s (of tensor '%s') is missing", path, shard, e->string);
                return TRD_EXIT_INPUT;
            }
            code = st_open(&s->f[s->n_files++], shard, err);
            if (code)
                return code;
        }
        return TRD_EXIT_OK;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &st) != 0) {
        ckpt_err(err, "%s: neither model.safetensors nor model.safetensors.index.json", dir);
        return TRD_EXIT_INPUT;
    }
    s->n_files = 1;
    return st_open(&s->f[0], path, err);
}

/* The view st_get gave is done with (its bytes in the source's ring go
 * back to the reads ahead). */
static void st_done(StSet *s)
{
    if (s->held)
        ckpt_source_release(s->src);
    s->held = 0;
}

static void st_set_close(StSet *s)
{
    for (int i = 0; i < s->n_files; i++)
        st_close(&s->f[i]);
    cJSON_Delete(s->index_doc);
    free(s->plan);
    free(s->plan_t);
    free(s->raw);
    free(s->wide);
}

/* A Mixtral's expert tensors must be those of its config.json: one named
 * for an expert or a layer it does not have is refused (exit 2, named),
 * not left unread. */
static int st_check_experts(const StSet *s, const ModelConfig *m, char err[CFG_ERR])
{
    for (int i = 0; i < s->n_files; i++)
        for (int j = 0; j < s->f[i].n; j++) {
            const char *name = s->f[i].t[j].name;
            int l, e, at = 0;
            if (sscanf(name, "model.layers.%d.block_sparse_moe.experts.%d.%n", &l, &e, &at) != 2 ||
                !at)
                continue;
            if (l < 0 || l >= m->layers || e < 0 || e >= m->moe_experts) {
                ckpt_err(err,
                         "%s: tensor '%s': config.json has %d layers of %d experts "
                         "(num_hidden_layers, num_local_experts)",
                         s->f[i].path, name, m->layers, m->moe_experts);
                return TRD_EXIT_INPUT;
            }
        }
    return TRD_EXIT_OK;
}

int ckpt_hf_check_safetensors(const char *dir, char err[CFG_ERR])
{
    StSet *s = trd_calloc(1, sizeof *s, "safetensors files");
    const int code = st_set_open(s, dir, err);
    st_set_close(s);
    free(s);
    return code;
}

/* HF tensor `name` and its file, checked to have shape [r, c] (c == 0: a
 * vector of r) and config.json's dtype.  Planning checks the same: the
 * plan sizes its reads (and the read-ahead ring) from [r, c], config.json's
 * shape, so a tensor that is missing or of another shape must stop it
 * before anything of that size is allocated (issue 34). */
static int st_lookup(StSet *s, const char *name, int64_t r, int64_t c, StFile **file,
                     const StTensor **tensor, char err[CFG_ERR])
{
    StFile *f = NULL;
    if (s->weight_map) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(s->weight_map, name);
        for (int i = 0; e && i < s->n_files && !f; i++)
            if (!strcmp(strrchr(s->f[i].path, '/') + 1, e->valuestring))
                f = &s->f[i];
        if (!f) {
            ckpt_err(err, "%s/model.safetensors.index.json: required tensor '%s' is missing",
                     s->dir, name);
            return TRD_EXIT_INPUT;
        }
    } else {
        f = &s->f[0];
    }
    const StTensor *t = st_find_in(f, name);
    *file = f;
    *tensor = t;
    if (!t) {
        ckpt_err(err, "%s: required tensor '%s' is missing", f->path, name);
        return TRD_EXIT_INPUT;
    }
    const int ndim = c ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != r || (ndim == 2 && t->shape[1] != c)) {
        char want[64], got[64];
        snprintf(want, sizeof want, c ? "[%lld, %lld]" : "[%lld]", (long long)r, (long long)c);
        snprintf(got, sizeof got, t->ndim == 2 ? "[%lld, %lld]" : "[%lld]", (long long)t->shape[0],
                 (long long)t->shape[1]);
        ckpt_err(err, "%s: tensor '%s' has shape %s, config.json implies %s", f->path, name, got,
                 want);
        return TRD_EXIT_INPUT;
    }
    if (s->want_dtype >= 0 && (int)t->dtype != s->want_dtype) {
        ckpt_err(err, "%s: tensor '%s' is %s, config.json's torch_dtype says %s", f->path, name,
                 st_dtype_names[t->dtype], st_torch_names[s->want_dtype]);
        return TRD_EXIT_INPUT;
    }
    return TRD_EXIT_OK;
}

/* Plan the read of elements [e0, e0 + n) of t. */
static void st_plan(StSet *s, const StFile *f, const StTensor *t, int64_t e0, int64_t n)
{
    const int64_t size = st_size(t);
    if (s->n_plan == s->plan_cap) {
        s->plan_cap = s->plan_cap ? 2 * s->plan_cap : 64;
        s->plan = realloc(s->plan, (size_t)s->plan_cap * sizeof *s->plan);
        s->plan_t = realloc(s->plan_t, (size_t)s->plan_cap * sizeof *s->plan_t);
        TRD_ASSERT(s->plan && s->plan_t);
    }
    s->plan_t[s->n_plan] = t;
    s->plan[s->n_plan++] =
        (CkptSourceRead){f->fd, f->fd_direct, t->begin + e0 * size, (size_t)(n * size)};
}

/* Elements [e0, e0 + n) of t as fp32 (BF16 widened exactly: its bits are
 * the upper half; F16 by st_half_bits): into out when out is given, else *view points at them
 * until st_done.  From the source (the plan's next read, which must be
 * these bytes), or read with pread. */
static int st_fetch(StSet *s, StFile *f, const StTensor *t, int64_t e0, int64_t n, float *out,
                    const float **view, char err[CFG_ERR])
{
    const int narrow = t->dtype != ST_F32;
    const int64_t bytes = n * st_size(t), begin = t->begin + e0 * st_size(t);
    const void *src = NULL;
    off_t fail = begin;
    int why = 0; /* an errno, or -1: the file ends */
    if (s->src) {
        const int64_t k = s->src->taken;
        TRD_ASSERT(k < s->n_plan && s->plan_t[k] == t && s->plan[k].at == begin &&
                   s->plan[k].n == (size_t)bytes);
        why = ckpt_source_take(s->src, &src, &fail);
        s->held = 1;
    } else {
        char *dst = (char *)out; /* F32 into out as it is */
        if (narrow || !out)
            dst = s->raw =
                ckpt_io_grow(s->raw, &s->raw_cap, (size_t)bytes + 1, "safetensors tensor");
        for (int64_t at = 0; at < bytes && !why;) {
            const ssize_t got = pread(f->fd, dst + at, (size_t)(bytes - at), begin + at);
            if (got <= 0) {
                why = got < 0 ? errno : -1;
                fail = begin + at;
            }
            at += got > 0 ? got : 0;
        }
        src = dst;
    }
    if (why) {
        st_done(s);
        ckpt_err(err, "%s: tensor '%s': %s at byte %lld: truncated?", f->path, t->name,
                 why > 0 ? strerror(why) : "end of file", (long long)fail);
        return TRD_EXIT_INPUT;
    }
    if ((uintptr_t)src % (uintptr_t)st_size(t) && (narrow || !out)) {
        /* The data of a file whose header is not padded to 8 bytes: its
         * values are loaded from aligned memory. */
        s->raw = ckpt_io_grow(s->raw, &s->raw_cap, (size_t)bytes + 1, "safetensors tensor");
        memcpy(s->raw, src, (size_t)bytes);
        st_done(s);
        src = s->raw;
    }
    if (narrow) {
        float *dst = out;
        if (!dst)
            dst = s->wide = ckpt_io_grow(s->wide, &s->wide_cap, (size_t)n * 4, "widened tensor");
        const uint16_t *h = src;
        if (t->dtype == ST_BF16)
            for (int64_t i = 0; i < n; i++) {
                const uint32_t bits = (uint32_t)h[i] << 16;
                memcpy(&dst[i], &bits, 4);
            }
        else
            for (int64_t i = 0; i < n; i++) {
                const uint32_t bits = st_half_bits(h[i]);
                memcpy(&dst[i], &bits, 4);
            }
        st_done(s);
        src = dst;
    } else if (out && src != out) {
        memcpy(out, src, (size_t)bytes);
        st_done(s);
    }
    if (view)
        *view = src;
    return TRD_EXIT_OK;
}

/* HF tensor `name` of shape [r, c] (c == 0: a vector of r), whole, as
 * st_fetch gives it; while planning, its read is planned (ST_PLANNED). */
static int st_get(StSet *s, const char *name, int64_t r, int64_t c, float *out, const float **view,
                  char err[CFG_ERR])
{
    StFile *f;
    const StTensor *t;
    const int code = st_lookup(s, name, r, c, &f, &t, err);
    if (code)
        return code;
    if (s->planning) {
        st_plan(s, f, t, 0, r * (c ? c : 1));
        return ST_PLANNED;
    }
    return st_fetch(s, f, t, 0, r * (c ? c : 1), out, view, err);
}

/* Into out (see st_get). */
static int st_read(StSet *s, const char *name, int64_t r, int64_t c, float *out, char err[CFG_ERR])
{
    return st_get(s, name, r, c, out, NULL, err);
}

/* ---- config.json -> the model ---------------------------------------- */

static int cfg_int(const cJSON *doc, const char *path, const char *key, int def, int *out,
                   char err[CFG_ERR])
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < 0) {
            ckpt_err(err, "%s: \"%s\" is missing", path, key);
            return TRD_EXIT_INPUT;
        }
        *out = def;
        return 0;
    }
    int ok = 1;
    *out = (int)json_int(v, 1, 1 << 30, &ok);
    if (!ok) {
        ckpt_err(err, "%s: \"%s\" must be a positive integer", path, key);
        return TRD_EXIT_INPUT;
    }
    return 0;
}

static int cfg_num(const cJSON *doc, const char *path, const char *key, double def, float *out,
                   char err[CFG_ERR])
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, key);
    if (!v && def < 0) {
        ckpt_err(err, "%s: \"%s\" is missing", path, key);
        return TRD_EXIT_INPUT;
    }
    if (!v) {
        *out = (float)def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
        ckpt_err(err, "%s: \"%s\" must be a positive number", path, key);
        return TRD_EXIT_INPUT;
    }
    *out = (float)v->valuedouble;
    return 0;
}

static int cfg_bool(const cJSON *doc, const char *key, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* config.json's rope_scaling into m: absent, null or rope_type "default"
 * is none; "llama3" takes its four parameters; any other kind (linear,
 * dynamic, yarn, longrope...) is refused by name. */
static int read_rope_scaling(const cJSON *doc, const char *path, ModelConfig *m, char err[CFG_ERR])
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(doc, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        return 0;
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!rt) /* the older name */
        rt = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsObject(rs) || !cJSON_IsString(rt)) {
        ckpt_err(err, "%s: rope_scaling must be null or an object with a rope_type", path);
        return TRD_EXIT_INPUT;
    }
    if (!strcmp(rt->valuestring, "default"))
        return 0;
    if (strcmp(rt->valuestring, "llama3")) {
        ckpt_err(err,
                 "%s: rope_scaling rope_type \"%.40s\": trident scales RoPE the Llama 3 way "
                 "(rope_type llama3) only",
                 path, rt->valuestring);
        return TRD_EXIT_INPUT;
    }
    m->rope_scaling = ROPE_SCALING_LLAMA3;
    char where[CKPT_FILE_PATH + 64];
    snprintf(where, sizeof where, "%s: rope_scaling", path);
    int code = cfg_num(rs, where, "factor", -1, &m->rope_factor, err);
    code = code ? code : cfg_num(rs, where, "low_freq_factor", -1, &m->rope_low_freq_factor, err);
    code = code ? code : cfg_num(rs, where, "high_freq_factor", -1, &m->rope_high_freq_factor, err);
    code = code ? code
                : cfg_int(rs, where, "original_max_position_embeddings", -1,
                          &m->rope_original_max_position_embeddings, err);
    if (!code && !(m->rope_factor >= 1 && m->rope_high_freq_factor > m->rope_low_freq_factor)) {
        ckpt_err(err,
                 "%s: rope_scaling llama3: factor %g must be >= 1 and high_freq_factor %g "
                 "greater than low_freq_factor %g",
                 path, m->rope_factor, m->rope_high_freq_factor, m->rope_low_freq_factor);
        code = TRD_EXIT_INPUT;
    }
    return code;
}

/* MixtralForCausalLM's experts into m->moe_*: every layer a MoE layer
 * without shared experts, an expert as wide as intermediate_size (which is
 * also model.ffn_hidden, used by no layer), dropless, the load-balancing
 * coefficient router_aux_loss_coef (HF's default 0.001 when absent), the
 * z-loss trident's default.  A sliding window shorter than the context is
 * refused: trident's attention is full. */
static int read_mixtral(const cJSON *doc, const char *path, ModelConfig *m, char err[CFG_ERR])
{
    int code = cfg_int(doc, path, "num_local_experts", -1, &m->moe_experts, err);
    code = code ? code : cfg_int(doc, path, "num_experts_per_tok", 2, &m->moe_top_k, err);
    if (code)
        return code;
    if (m->moe_experts > MOE_MAX_EXPERTS || m->moe_top_k > m->moe_experts) {
        ckpt_err(err,
                 "%s: num_local_experts %d, num_experts_per_tok %d: trident takes 1 to %d "
                 "experts and at most that many per token",
                 path, m->moe_experts, m->moe_top_k, MOE_MAX_EXPERTS);
        return TRD_EXIT_INPUT;
    }
    const cJSON *aux = cJSON_GetObjectItemCaseSensitive(doc, "router_aux_loss_coef");
    if (aux && !(cJSON_IsNumber(aux) && aux->valuedouble >= 0 && aux->valuedouble <= 1e30)) {
        ckpt_err(err, "%s: \"router_aux_loss_coef\" must be a number >= 0", path);
        return TRD_EXIT_INPUT;
    }
    m->moe_aux_loss_coef = aux ? (float)aux->valuedouble : 0.001f;
    m->moe_every = 1;
    m->moe_ffn_hidden = m->ffn_hidden;
    m->moe_shared_experts = 0;
    m->moe_capacity_factor = 0;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(doc, "sliding_window");
    if (sw && !cJSON_IsNull(sw) && !(cJSON_IsNumber(sw) && sw->valuedouble >= (double)m->seq_len)) {
        ckpt_err(err,
                 "%s: sliding_window %g < max_position_embeddings %d: trident's attention "
                 "is full (a window as long as the context, or null, imports)",
                 path, cJSON_IsNumber(sw) ? sw->valuedouble : -1.0, m->seq_len);
        return TRD_EXIT_INPUT;
    }
    return TRD_EXIT_OK;
}

/* The model of config.json into m (trident's names). */
int ckpt_hf_read_model(const char *dir, ModelConfig *m, int *want_dtype, char err[CFG_ERR])
{
    char path[CKPT_FILE_PATH + 16];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *doc = NULL;
    int code = read_json(path, &doc, err);
    if (code)
        return code;
    const cJSON *arch =
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "architectures"), 0);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(doc, "model_type");
    const char *a = cJSON_IsString(arch) ? arch->valuestring : "(none)";
    const char *t = cJSON_IsString(type) ? type->valuestring : "(none)";
    const int gpt2 = !strcmp(a, "GPT2LMHeadModel") && !strcmp(t, "gpt2");
    const int mixtral = !strcmp(a, "MixtralForCausalLM") && !strcmp(t, "mixtral");
    const int llama = (!strcmp(a, "LlamaForCausalLM") && !strcmp(t, "llama")) || mixtral;
    if (!gpt2 && !llama) {
        ckpt_err(err,
                 "%s: architectures [\"%s\"], model_type \"%s\": trident imports "
                 "GPT2LMHeadModel (gpt2), LlamaForCausalLM (llama) and MixtralForCausalLM "
                 "(mixtral)",
                 path, a, t);
        cJSON_Delete(doc);
        return TRD_EXIT_INPUT;
    }
    m->arch = gpt2 ? ARCH_GPT2 : ARCH_LLAMA;
    m->rope_scaling = ROPE_SCALING_NONE;
    m->rope_factor = m->rope_low_freq_factor = m->rope_high_freq_factor = 0;
    m->rope_original_max_position_embeddings = 0;
    m->moe_experts = 0;
    if (gpt2) {
        code = cfg_int(doc, path, "vocab_size", -1, &m->vocab, err);
        code = code ? code : cfg_int(doc, path, "n_positions", -1, &m->seq_len, err);
        code = code ? code : cfg_int(doc, path, "n_embd", -1, &m->hidden, err);
        code = code ? code : cfg_int(doc, path, "n_layer", -1, &m->layers, err);
        code = code ? code : cfg_int(doc, path, "n_head", -1, &m->heads, err);
        code = code ? code : cfg_int(doc, path, "n_inner", 4 * m->hidden, &m->ffn_hidden, err);
        code = code ? code : cfg_num(doc, path, "layer_norm_epsilon", 1e-5, &m->norm_eps, err);
        m->kv_heads = m->heads;
        m->tie_embeddings = cfg_bool(doc, "tie_word_embeddings", 1);
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(doc, "activation_function");
        if (!code && cJSON_IsString(act) && strcmp(act->valuestring, "gelu_new")) {
            ckpt_err(err, "%s: activation_function \"%s\": trident's GELU is gelu_new (tanh)", path,
                     act->valuestring);
            code = TRD_EXIT_INPUT;
        }
    } else {
        code = cfg_int(doc, path, "vocab_size", -1, &m->vocab, err);
        code = code ? code : cfg_int(doc, path, "max_position_embeddings", -1, &m->seq_len, err);
        code = code ? code : cfg_int(doc, path, "hidden_size", -1, &m->hidden, err);
        code = code ? code : cfg_int(doc, path, "num_hidden_layers", -1, &m->layers, err);
        code = code ? code : cfg_int(doc, path, "num_attention_heads", -1, &m->heads, err);
        code = code ? code : cfg_int(doc, path, "num_key_value_heads", m->heads, &m->kv_heads, err);
        code = code ? code : cfg_int(doc, path, "intermediate_size", -1, &m->ffn_hidden, err);
        code = code ? code : cfg_num(doc, path, "rms_norm_eps", 1e-5, &m->norm_eps, err);
        code = code ? code : cfg_num(doc, path, "rope_theta", 10000.0, &m->rope_theta, err);
        m->tie_embeddings = cfg_bool(doc, "tie_word_embeddings", 0);
        int hd = 0;
        code = code ? code : cfg_int(doc, path, "head_dim", m->hidden / m->heads, &hd, err);
        if (code)
            ; /* reported above */
        else if (hd * m->heads != m->hidden) {
            ckpt_err(err,
                     "%s: head_dim %d x heads %d != hidden %d: trident's head size is "
                     "hidden / heads",
                     path, hd, m->heads, m->hidden);
            code = TRD_EXIT_INPUT;
        } else if ((code = read_rope_scaling(doc, path, m, err)) != 0)
            ; /* reported */
        else if (cfg_bool(doc, "attention_bias", 0) || cfg_bool(doc, "mlp_bias", 0)) {
            ckpt_err(err, "%s: %s true: trident's Llama has no biases", path,
                     cfg_bool(doc, "attention_bias", 0) ? "attention_bias" : "mlp_bias");
            code = TRD_EXIT_INPUT;
        } else if (mixtral)
            code = read_mixtral(doc, path, m, err);
    }
    if (!code && (m->hidden % m->heads || m->heads % m->kv_heads || (m->hidden / m->heads) % 2)) {
        ckpt_err(err,
                 "%s: hidden %d, heads %d, kv_heads %d: heads must divide hidden (an even "
                 "head size) and kv_heads divide heads",
                 path, m->hidden, m->heads, m->kv_heads);
        code = TRD_EXIT_INPUT;
    }
    /* The sizes a trident config may have, before anything proportional to
     * them is built (the import's parameter table, its buffers). */
    char why[CFG_ERR];
    if (!code && config_model_sizes(m, why) != 0) {
        ckpt_err(err, "%s: %s", path, why);
        code = TRD_EXIT_INPUT;
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(doc, "torch_dtype");
    *want_dtype = -1;
    for (int k = 0; k < 3 && cJSON_IsString(dt); k++)
        if (!strcmp(dt->valuestring, st_torch_names[k]))
            *want_dtype = k;
    if (!code && cJSON_IsString(dt) && *want_dtype < 0) {
        ckpt_err(err, "%s: torch_dtype \"%s\" (trident reads float32, float16 and bfloat16)", path,
                 dt->valuestring);
        code = TRD_EXIT_INPUT;
    }
    cJSON_Delete(doc);
    return code;
}

/* ---- one trident tensor from its HF source(s) --------------------------- */

typedef struct {
    StSet st;
    const ModelConfig *m;
    int64_t hs;
    int64_t n_positions; /* config.json's (gpt2 wpe rows); m->seq_len may be fewer */
    char err[CFG_ERR];
} Imp;

/* HF [r, c] read and stored transposed into out [c, r] (GPT-2's Conv1D). */
static int read_t(Imp *im, const char *name, int64_t r, int64_t c, float *out)
{
    const float *w;
    const int code = st_get(&im->st, name, r, c, NULL, &w, im->err);
    if (code == 0)
        ckpt_transpose(w, r, c, NULL, NULL, out);
    st_done(&im->st);
    return code;
}

/* The fused qkv (weight, or bias when C == 0) of layer l into out. */
static int read_qkv(Imp *im, int l, int bias, float *out)
{
    const ModelConfig *m = im->m;
    const int64_t H = m->heads, KV = m->kv_heads, hs = im->hs, C = m->hidden;
    char name[HF_NAME_IMPORT];
    if (m->arch == ARCH_GPT2) {
        /* c_attn: [C, 3A] weight (column j = trident row src(j)), [3A] bias. */
        const int64_t A3 = 3 * H * hs;
        snprintf(name, sizeof name, "transformer.h.%d.attn.c_attn.%s", l, bias ? "bias" : "weight");
        const float *w;
        const int code = st_get(&im->st, name, bias ? A3 : C, bias ? 0 : A3, NULL, &w, im->err);
        if (code)
            return code;
        int64_t *row = trd_malloc((size_t)A3 * sizeof *row, "c_attn row map");
        for (int64_t j = 0; j < A3; j++)
            row[j] = ckpt_hf_qkv_src_row(H, KV, hs, QKV_ALL, j);
        for (int64_t j = 0; bias && j < A3; j++)
            out[row[j]] = w[j];
        if (!bias) /* [C, 3A]: column j is trident row row[j] */
            ckpt_transpose(w, C, A3, NULL, row, out);
        free(row);
        st_done(&im->st);
        return 0;
    }
    static const char *const proj[3] = {"q_proj", "k_proj", "v_proj"};
    for (int part = QKV_Q; part <= QKV_V; part++) {
        const int64_t rows = (part == QKV_Q ? H : KV) * hs;
        snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, proj[part]);
        const float *w;
        const int code = st_get(&im->st, name, rows, C, NULL, &w, im->err);
        if (code == ST_PLANNED)
            continue; /* plan k and v too */
        if (code)
            return code;
        for (int64_t j = 0; j < rows; j++)
            memcpy(out + ckpt_hf_qkv_src_row(H, KV, hs, part, j) * C, w + j * C,
                   (size_t)C * sizeof(float));
        st_done(&im->st);
    }
    return im->st.planning ? ST_PLANNED : 0;
}

/* Where trident tensor p comes from: one HF tensor as it is (COPY), its
 * transpose (GPT-2's Conv1D), its first rows (GPT-2's wpe, when seq_len
 * is below n_positions), the q, k and v of layer `layer` (QKV), or the E
 * experts' tensors of a Mixtral layer stacked (EXPERTS). */
typedef enum { SRC_COPY, SRC_TRANSPOSE, SRC_FIRST_ROWS, SRC_QKV, SRC_EXPERTS } SrcOp;
typedef struct {
    SrcOp op;
    char name[HF_NAME_IMPORT]; /* the HF tensor (not for SRC_QKV, SRC_EXPERTS) */
    int64_t r, c;              /* its shape (c == 0: a vector of r); SRC_EXPERTS: one expert's */
    int layer, bias;           /* SRC_QKV: the layer, the bias or the weight */
    const char *expert;        /* SRC_EXPERTS: w1, w3 or w2 (of `layer`) */
} Src;

/* The E experts' `s->expert` tensors of layer s->layer, stacked into out. */
static int read_experts(Imp *im, const Src *s, float *out)
{
    const int64_t n = s->r * s->c;
    char name[HF_NAME_IMPORT];
    for (int e = 0; e < im->m->moe_experts; e++) {
        snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight",
                 s->layer, e, s->expert);
        const int code = st_read(&im->st, name, s->r, s->c, out ? out + e * n : NULL, im->err);
        if (code == ST_PLANNED)
            continue; /* plan every expert's read */
        if (code)
            return code;
    }
    return im->st.planning ? ST_PLANNED : 0;
}

/* The source of p (global shape [rows, cols], real rows only): 0, or exit
 * 2 for a tensor with none. */
static int resolve(Imp *im, const ParamSpec *p, int64_t rows, Src *s)
{
    const int g = im->m->arch == ARCH_GPT2;
    const int64_t cols = p->ndim == 2 ? p->shape[1] : 0;
    char rest[PARAM_NAME];
    int l;
    memset(s, 0, sizeof *s);
    s->op = SRC_COPY;
    s->r = rows;
    s->c = cols;
    if (!strcmp(p->name, "embed.wte.weight")) {
        snprintf(s->name, sizeof s->name,
                 g ? "transformer.wte.weight" : "model.embed_tokens.weight");
        return TRD_EXIT_OK;
    }
    if (!strcmp(p->name, "embed.wpe.weight")) {
        snprintf(s->name, sizeof s->name, "transformer.wpe.weight");
        s->op = SRC_FIRST_ROWS;
        s->r = im->n_positions;
        return TRD_EXIT_OK;
    }
    if (!strcmp(p->name, "head.weight")) {
        snprintf(s->name, sizeof s->name, "lm_head.weight");
        return TRD_EXIT_OK;
    }
    if (!strncmp(p->name, "final_norm.", 11)) {
        snprintf(s->name, sizeof s->name, "%s.%s", g ? "transformer.ln_f" : "model.norm",
                 p->name + 11);
        return TRD_EXIT_OK;
    }
    if (sscanf(p->name, "layers.%d.%63s", &l, rest) != 2) {
        ckpt_err(im->err, "tensor '%s' has no Hugging Face source", p->name);
        return TRD_EXIT_INPUT;
    }
    if (!strcmp(rest, "attn.qkv.weight") || !strcmp(rest, "attn.qkv.bias")) {
        s->op = SRC_QKV;
        s->layer = l;
        s->bias = p->ndim == 1;
        return TRD_EXIT_OK;
    }
    if (!g && !strcmp(rest, "moe.router.weight")) {
        snprintf(s->name, sizeof s->name, "model.layers.%d.block_sparse_moe.gate.weight", l);
        return TRD_EXIT_OK;
    }
    static const char *const experts[][2] = {{"moe.experts.gate.weight", "w1"},
                                             {"moe.experts.up.weight", "w3"},
                                             {"moe.experts.down.weight", "w2"}};
    for (int k = 0; !g && im->m->moe_experts > 0 && k < 3; k++)
        if (!strcmp(rest, experts[k][0])) {
            s->op = SRC_EXPERTS;
            s->layer = l;
            s->expert = experts[k][1];
            s->r = rows / im->m->moe_experts;
            return TRD_EXIT_OK;
        }
    static const struct {
        const char *trd, *gpt2, *llama;
        int transpose;
    } map[] = {
        {"ln1.weight", "ln_1.weight", "input_layernorm.weight", 0},
        {"ln1.bias", "ln_1.bias", NULL, 0},
        {"ln2.weight", "ln_2.weight", "post_attention_layernorm.weight", 0},
        {"ln2.bias", "ln_2.bias", NULL, 0},
        {"attn.proj.weight", "attn.c_proj.weight", "self_attn.o_proj.weight", 1},
        {"attn.proj.bias", "attn.c_proj.bias", NULL, 0},
        {"mlp.fc.weight", "mlp.c_fc.weight", NULL, 1},
        {"mlp.fc.bias", "mlp.c_fc.bias", NULL, 0},
        {"mlp.proj.weight", "mlp.c_proj.weight", NULL, 1},
        {"mlp.proj.bias", "mlp.c_proj.bias", NULL, 0},
        {"mlp.gate.weight", NULL, "mlp.gate_proj.weight", 0},
        {"mlp.up.weight", NULL, "mlp.up_proj.weight", 0},
        {"mlp.down.weight", NULL, "mlp.down_proj.weight", 0},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        const char *src = g ? map[i].gpt2 : map[i].llama;
        if (strcmp(rest, map[i].trd) || !src)
            continue;
        snprintf(s->name, sizeof s->name, g ? "transformer.h.%d.%s" : "model.layers.%d.%s", l, src);
        if (g && map[i].transpose) { /* Conv1D: HF [in, out] = trident [out, in]^T */
            s->op = SRC_TRANSPOSE;
            s->r = cols;
            s->c = rows;
        }
        return TRD_EXIT_OK;
    }
    ckpt_err(im->err, "tensor '%s' has no Hugging Face source", p->name);
    return TRD_EXIT_INPUT;
}

/* Trident tensor p (global shape [rows, cols], real rows only) into out. */
static int fill(Imp *im, const ParamSpec *p, int64_t rows, float *out)
{
    Src s;
    int code = resolve(im, p, rows, &s);
    if (code)
        return code;
    const float *w;
    switch (s.op) {
    case SRC_COPY:
        return st_read(&im->st, s.name, s.r, s.c, out, im->err);
    case SRC_TRANSPOSE:
        return read_t(im, s.name, s.r, s.c, out);
    case SRC_FIRST_ROWS:
        code = st_get(&im->st, s.name, s.r, s.c, NULL, &w, im->err);
        if (code == 0)
            memcpy(out, w, (size_t)(rows * s.c) * sizeof(float));
        st_done(&im->st);
        return code;
    case SRC_QKV:
        return read_qkv(im, s.layer, s.bias, out);
    case SRC_EXPERTS:
        return read_experts(im, &s, out);
    }
    return TRD_EXIT_INPUT;
}

/* fill, then refuse a tensor holding NaN or Inf (exit 2, named). */
static int fill_finite(Imp *im, const ParamSpec *p, int64_t rows, float *out, const char *dir)
{
    int code = fill(im, p, rows, out);
    int64_t bad = 0;
    for (int64_t j = 0; code == 0 && j < rows * p->shape[1]; j++)
        bad += !isfinite(out[j]);
    if (bad) {
        ckpt_err(im->err, "%s: tensor '%s' has %lld non-finite values", dir, p->name,
                 (long long)bad);
        code = TRD_EXIT_INPUT;
    }
    return code;
}

/* ---- writing the checkpoint ------------------------------------------- */

/* A tensor being written: its dataset, created contiguous, allocated now
 * and never filled (the values go straight to the dataset's bytes in the
 * file, ckpt_raw.c, as a save writes them, by the sink's thread while the
 * next tensor is read and converted), and its checksums. */
typedef struct {
    hid_t d;
    off_t at;
    uint64_t *sums;
    int64_t block_rows;
} OutTensor;

static int out_open(hid_t group, const CkptEntry *e, OutTensor *o)
{
    const int64_t nb = ckpt_n_blocks(e->ndim, e->shape);
    o->sums = trd_calloc((size_t)(nb ? nb : 1), sizeof(uint64_t), "checksums");
    o->block_rows = ckpt_block_rows(e->ndim, e->shape);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_layout(dcpl, H5D_CONTIGUOUS);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    hid_t space = ckpt_space(e->ndim, e->shape);
    o->d = H5Dcreate2(group, e->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    const haddr_t at = o->d >= 0 ? H5Dget_offset(o->d) : HADDR_UNDEF;
    H5Sclose(space);
    H5Pclose(dcpl);
    o->at = (off_t)at;
    return at != HADDR_UNDEF ? 0 : -1;
}

/* The checksums of rows [r0, r0 + n) (whole checksum blocks, or the
 * tensor's last rows), held at w, added to o's; returns how many of the
 * values are NaN or Inf (found in the same pass, as a save finds them). */
static int64_t out_sums(OutTensor *o, const CkptEntry *e, const float *w, int64_t r0, int64_t n)
{
    const CkptSlab rows = {.b = {{r0, 0, n, e->shape[1]}}, .n = 1};
    return ckpt_checksum_slab(&rows, e->shape[1], o->block_rows, w, o->sums);
}

static void out_drop(OutTensor *o)
{
    if (o->d >= 0)
        H5Dclose(o->d);
    free(o->sums);
}

/* Store the checksums (when ok) and close: TRD_EXIT_OK, or exit 1 with a
 * message in im->err. */
static int out_close(Imp *im, CkptSink *sink, const CkptEntry *e, OutTensor *o, int ok,
                     const char *path)
{
    ok = ok && ckpt_put_checksums(o->d, e, o->sums) == 0;
    const int saved = errno;
    out_drop(o);
    if (ok)
        return TRD_EXIT_OK;
    /* A write behind us that failed (a full disk) is the cause of whatever
     * failed here, HDF5's allocation included. */
    const int behind = ckpt_sink_error(sink);
    char why[256];
    ckpt_h5_reason(why, sizeof why);
    if (behind)
        ckpt_err(im->err, "%s: cannot write: %s", path, strerror(behind));
    else
        ckpt_err(im->err, "%s: cannot write tensor '%s': %s", path, e->name,
                 why[0] ? why : strerror(saved));
    return TRD_EXIT_RUNTIME;
}

/* Tensors below this size are copied into the sink's buffers; larger ones
 * are written from their own buffer, which then stays busy until *ticket. */
enum { SINK_COPY_BELOW = 1 << 20 };

/* Tensor e, converted whole into w (fill), into the file; a tensor with
 * NaN or Inf is refused (exit 2, named). */
static int write_tensor(Imp *im, hid_t group, CkptSink *sink, const CkptEntry *e, const float *w,
                        const char *path, const char *dir, int64_t *ticket)
{
    OutTensor o;
    int ok = out_open(group, e, &o) == 0;
    *ticket = 0;
    if (ok) {
        const int64_t bad = out_sums(&o, e, w, 0, e->shape[0]);
        if (bad) {
            out_drop(&o);
            ckpt_err(im->err, "%s: tensor '%s' has %lld non-finite values", dir, e->name,
                     (long long)bad);
            return TRD_EXIT_INPUT;
        }
        if (e->nbytes < SINK_COPY_BELOW)
            ok = ckpt_sink_seek(sink, o.at) == 0 && ckpt_sink_put(sink, w, (size_t)e->nbytes) == 0;
        else
            ok = (*ticket = ckpt_sink_write_ref(sink, w, (size_t)e->nbytes, o.at)) > 0;
    }
    return out_close(im, sink, e, &o, ok, path);
}

/* A SRC_COPY tensor goes from the source's ring to the sink's buffers a
 * piece of this many checksum blocks at a time (about 8 MiB): its write
 * starts before the rest of it is read, and it is never whole in memory. */
enum { STREAM_BLOCKS = 2 };

static int64_t stream_rows(const CkptEntry *e)
{
    return STREAM_BLOCKS * ckpt_block_rows(e->ndim, e->shape);
}

/* Plan the reads of stream_tensor: 0, or the lookup's error. */
static int plan_stream(Imp *im, const Src *src, const CkptEntry *e)
{
    StFile *f;
    const StTensor *t;
    const int code = st_lookup(&im->st, src->name, src->r, src->c, &f, &t, im->err);
    if (code != TRD_EXIT_OK)
        return code;
    const int64_t step = stream_rows(e), cols = e->shape[1];
    for (int64_t r0 = 0; r0 < e->shape[0]; r0 += step)
        st_plan(&im->st, f, t, r0 * cols,
                (step < e->shape[0] - r0 ? step : e->shape[0] - r0) * cols);
    return TRD_EXIT_OK;
}

/* Tensor e, an HF tensor as it is (SRC_COPY), read, checked finite and
 * written a piece at a time. */
static int stream_tensor(Imp *im, hid_t group, CkptSink *sink, const CkptEntry *e, const Src *src,
                         const char *path, const char *dir)
{
    StFile *f;
    const StTensor *t;
    int code = st_lookup(&im->st, src->name, src->r, src->c, &f, &t, im->err);
    if (code)
        return code;
    OutTensor o;
    int ok = out_open(group, e, &o) == 0 && ckpt_sink_seek(sink, o.at) == 0;
    const int64_t step = stream_rows(e), cols = e->shape[1];
    int64_t bad = 0;
    for (int64_t r0 = 0; ok && r0 < e->shape[0]; r0 += step) {
        const int64_t n = step < e->shape[0] - r0 ? step : e->shape[0] - r0;
        const float *w;
        code = st_fetch(&im->st, f, t, r0 * cols, n * cols, NULL, &w, im->err);
        if (code)
            break;
        bad += out_sums(&o, e, w, r0, n);
        ok = ckpt_sink_put(sink, w, (size_t)(n * cols) * sizeof(float)) == 0;
        st_done(&im->st);
    }
    if (code) { /* a read failed: its message stands */
        out_drop(&o);
        return code;
    }
    code = out_close(im, sink, e, &o, ok, path);
    if (code == TRD_EXIT_OK && bad) {
        ckpt_err(im->err, "%s: tensor '%s' has %lld non-finite values", dir, e->name,
                 (long long)bad);
        code = TRD_EXIT_INPUT;
    }
    return code;
}

/* The reads of tensors t (their entries e), in the order the import makes
 * them, into im->st's plan (nothing read, nothing converted): 0, or exit 2
 * with im->err for the first tensor that has no source of the shape and
 * dtype config.json implies. */
static int plan(Imp *im, const ParamTable *t, const CkptEntry *e)
{
    int code = TRD_EXIT_OK;
    im->st.planning = 1;
    for (int i = 0; i < t->n && code == TRD_EXIT_OK; i++) {
        Src src;
        code = resolve(im, &t->p[i], e[i].shape[0], &src);
        if (code == TRD_EXIT_OK && src.op == SRC_COPY)
            code = plan_stream(im, &src, &e[i]);
        else if (code == TRD_EXIT_OK &&
                 (code = fill(im, &t->p[i], e[i].shape[0], NULL)) == ST_PLANNED)
            code = TRD_EXIT_OK;
    }
    im->st.planning = 0;
    return code;
}

static int dir_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int ckpt_hf_import(const char *hf_dir, const char *out_dir, char *const *sets, int n_sets,
                   int replace, char err[CFG_ERR])
{
    ckpt_h5_quiet();
    err[0] = '\0';
    Config cfg;
    config_defaults(&cfg);
    int seq_len = 0;
    for (int i = 0; i < n_sets; i++) {
        const int seq = !strncmp(sets[i], "model.seq_len=", 14);
        if (!strncmp(sets[i], "model.", 6) && !seq) {
            ckpt_err(err,
                     "--set %s: the model comes from %s/config.json (only model.seq_len "
                     "may be set)",
                     sets[i], hf_dir);
            return TRD_EXIT_INPUT;
        }
        if (config_set(&cfg, sets[i], err) != 0)
            return TRD_EXIT_INPUT;
        if (seq)
            seq_len = cfg.model.seq_len;
    }
    Imp im;
    memset(&im, 0, sizeof im);
    ModelConfig *m = &cfg.model;
    int code = ckpt_hf_read_model(hf_dir, m, &im.st.want_dtype, err);
    if (code)
        return code;
    /* A shorter context than the model's: gpt2 keeps the first seq_len rows
     * of its position embedding (n_positions is an upper bound); llama's
     * RoPE has no such table. */
    im.n_positions = m->seq_len;
    if (seq_len > 0 && m->arch == ARCH_GPT2 && seq_len > m->seq_len) {
        ckpt_err(err,
                 "model.seq_len %d > n_positions %d of %s/config.json: gpt2 has no "
                 "position embedding beyond it",
                 seq_len, m->seq_len, hf_dir);
        return TRD_EXIT_INPUT;
    }
    if (seq_len > 0)
        m->seq_len = seq_len;
    im.m = m;
    im.hs = m->hidden / m->heads;
    if (strlen(out_dir) >= CFG_STR) {
        ckpt_err(err, "--out %s: longer than %d characters", out_dir, CFG_STR - 1);
        return TRD_EXIT_INPUT;
    }
    char name[32], final[CKPT_PATH], tmp[CKPT_PATH + 8];
    ckpt_step_name(name, sizeof name, 0);
    snprintf(final, sizeof final, "%s/%s", out_dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    if (!replace && dir_exists(final)) {
        ckpt_err(err, "--out %s: already holds %s: not overwritten (choose another --out)", out_dir,
                 name);
        return TRD_EXIT_INPUT;
    }
    code = st_set_open(&im.st, hf_dir, err);
    if (!code && m->moe_experts > 0)
        code = st_check_experts(&im.st, m, err);
    ParamTable t = {0};
    CkptEntry *e = NULL;
    /* Buffers: two for the large tensors, taken in turn, one written from
     * (by the sink's thread) while the next large tensor fills the other;
     * the third for the small ones, which the sink copies at once. */
    float *w[3] = {NULL, NULL, NULL};
    size_t w_cap[3] = {0, 0, 0};
    int64_t w_ticket[3] = {0, 0, 0};
    int n_large = 0;
    CkptSink sink;
    CkptSource src;
    int sink_open = 0;
    hid_t f = -1, group = -1;
    char path[CKPT_FILE_PATH];
    if (code)
        goto done;
    ParamShard sh = params_full_shard(m);
    params_build(&t, m, &sh);
    e = trd_calloc((size_t)t.n, sizeof *e, "checkpoint index");
    for (int i = 0; i < t.n; i++) {
        const ParamSpec *p = &t.p[i];
        CkptEntry *x = &e[i];
        snprintf(x->name, sizeof x->name, "%s", p->name);
        snprintf(x->kind, sizeof x->kind, "%s", ckpt_kind_names[CKPT_PARAMS]);
        snprintf(x->file, sizeof x->file, "stage_0.h5");
        snprintf(x->dtype, sizeof x->dtype, "float32");
        x->ndim = p->ndim;
        x->shape[0] = p->real_rows;
        x->shape[1] = p->shape[1];
        x->nbytes = x->shape[0] * x->shape[1] * (int64_t)sizeof(float);
    }
    /* Every tensor's source, shape and dtype checked (the plan of the
     * reads) before anything is created or allocated for it. */
    if ((code = plan(&im, &t, e)) != TRD_EXIT_OK) {
        snprintf(err, CFG_ERR, "%s", im.err);
        goto done;
    }
    if (ckpt_prepare_tmp(out_dir, tmp, err) != 0) {
        code = TRD_EXIT_INPUT;
        goto done;
    }
    snprintf(path, sizeof path, "%s/stage_0.h5", tmp);
    hid_t fapl = ckpt_serial_fapl();
    TRD_ASSERT(ckpt_fapl_tensor_layout(fapl) == 0);
    f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    group = f >= 0
                ? H5Gcreate2(f, ckpt_kind_names[CKPT_PARAMS], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)
                : -1;
    if (group < 0 || ckpt_sink_open(&sink, path) != 0) {
        ckpt_err(err, "%s: cannot create", path);
        code = TRD_EXIT_RUNTIME;
        goto done;
    }
    sink_open = 1;
    /* A thread reads the sources ahead of the conversion (ckpt_raw.c). */
    ckpt_source_open(&src, im.st.plan, im.st.n_plan, 0);
    im.st.src = &src;
    for (int i = 0; i < t.n && code == TRD_EXIT_OK; i++) {
        const ParamSpec *p = &t.p[i];
        const CkptEntry *x = &e[i];
        Src from;
        code = resolve(&im, p, x->shape[0], &from);
        if (code == TRD_EXIT_OK && from.op == SRC_COPY) {
            code = stream_tensor(&im, group, &sink, x, &from, path, hf_dir);
        } else if (code == TRD_EXIT_OK) {
            /* Converted whole into buffers reused across tensors (a fresh
             * one each time, freed back to the kernel, was page faults and
             * zeroing of the whole model), aligned like the tensor's place
             * in the file (ckpt_fapl_tensor_layout) so that the direct
             * writes need no staging copy. */
            const int k = x->nbytes < SINK_COPY_BELOW ? 2 : n_large++ & 1;
            ckpt_sink_wait(&sink, w_ticket[k]);
            w[k] = ckpt_io_grow(w[k], &w_cap[k], (size_t)x->nbytes, "import tensor");
            code = fill(&im, p, x->shape[0], w[k]);
            if (code == TRD_EXIT_OK)
                code = write_tensor(&im, group, &sink, x, w[k], path, hf_dir, &w_ticket[k]);
        }
        if (code)
            snprintf(err, CFG_ERR, "%s", im.err);
    }
    H5Gclose(group);
    group = -1;
    sink_open = 0;
    if (ckpt_sink_close(&sink, code == 0) != 0 && code == 0) {
        ckpt_err(err, "%s: cannot write: %s", path, strerror(errno));
        code = TRD_EXIT_RUNTIME;
    }
    /* A failed import is removed below.  Its tensor bytes go first: on a
     * full disk HDF5's close must still write its metadata, and a close
     * that fails leaves the library to crash in its exit handler. */
    if (code)
        (void)truncate(path, 0);
    if (H5Fclose(f) < 0 && code == 0) {
        ckpt_err(err, "%s: cannot close", path);
        code = TRD_EXIT_RUNTIME;
    }
    f = -1;
    if (code)
        goto done;
    /* The index: step 0, fresh state, the model; this "run" is one rank. */
    snprintf(path, sizeof path, "%s/config.yaml", tmp);
    if (config_write_yaml(&cfg, path, err) != 0) {
        code = TRD_EXIT_RUNTIME;
        goto done;
    }
    CkptIndex ix;
    memset(&ix, 0, sizeof ix);
    ckpt_index_describe(&ix, &cfg, PREC_FP32);
    ix.tp = ix.pp = ix.dp = ix.world = 1;
    ix.stage_layers[0] = m->layers;
    FILE *yf = fopen(path, "rb");
    ix.yaml = trd_calloc(1 << 16, 1, "config text");
    if (yf) {
        size_t got = fread(ix.yaml, 1, (1 << 16) - 1, yf);
        ix.yaml[got] = '\0';
        fclose(yf);
    }
    ix.n = t.n;
    ix.e = e;
    snprintf(path, sizeof path, "%s/index.h5", tmp);
    if (ckpt_index_write(path, &ix, err) != 0)
        code = TRD_EXIT_RUNTIME;
    free(ix.yaml);
    if (code == 0 && (ckpt_publish_dir(out_dir, 0, tmp, final, err) != 0 ||
                      ckpt_write_latest(out_dir, name, err) != 0))
        code = TRD_EXIT_RUNTIME;
    if (code == 0)
        printf("imported %d tensors (%s, %d layers, hidden %d, heads %d, kv_heads %d, vocab %d, "
               "%s%s) from %s to %s (step 0, weights only)\n",
               t.n, config_arch_name(m->arch), m->layers, m->hidden, m->heads, m->kv_heads,
               m->vocab, m->tie_embeddings ? "tied" : "untied",
               m->moe_experts ? ", Mixtral's experts as model.moe" : "", hf_dir, final);
done:
    if (im.st.src)
        ckpt_source_close(im.st.src);
    if (sink_open)
        ckpt_sink_close(&sink, 0);
    if (group >= 0)
        H5Gclose(group);
    if (f >= 0)
        H5Fclose(f);
    if (code && dir_exists(tmp))
        ckpt_rm_tree(tmp);
    free(e);
    for (int k = 0; k < 3; k++)
        free(w[k]);
    params_free(&t);
    st_set_close(&im.st);
    return code;
}

/* ---- checkpoint.init_from: each rank reads its own pieces --------------- */

/* The run's model against config.json's: a difference names both values. */
static int same_model(const char *dir, const ModelConfig *hf, const ModelConfig *m,
                      char err[CFG_ERR])
{
    if (hf->arch != m->arch) {
        ckpt_err(err, "model.arch is %s in %s/config.json, %s in the config",
                 config_arch_name(hf->arch), dir, config_arch_name(m->arch));
        return TRD_EXIT_INPUT;
    }
    const struct {
        const char *key;
        int hf, ours;
    } ints[] = {{"layers", hf->layers, m->layers},
                {"hidden", hf->hidden, m->hidden},
                {"heads", hf->heads, m->heads},
                {"kv_heads", hf->kv_heads, m->kv_heads},
                {"ffn_hidden", hf->ffn_hidden, m->ffn_hidden},
                {"vocab", hf->vocab, m->vocab},
                {"tie_embeddings", hf->tie_embeddings, m->tie_embeddings}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].hf != ints[i].ours) {
            ckpt_err(err, "model.%s is %d in %s/config.json, %d in the config", ints[i].key,
                     ints[i].hf, dir, ints[i].ours);
            return TRD_EXIT_INPUT;
        }
    const int eps = hf->norm_eps != m->norm_eps;
    if (eps || hf->rope_theta != m->rope_theta) {
        ckpt_err(err, "model.%s is %.9g in %s/config.json, %.9g in the config",
                 eps ? "norm_eps" : "rope_theta", eps ? hf->norm_eps : hf->rope_theta, dir,
                 eps ? m->norm_eps : m->rope_theta);
        return TRD_EXIT_INPUT;
    }
    const struct {
        const char *key;
        int hf, ours;
    } moe[] = {{"experts", hf->moe_experts, m->moe_experts},
               {"top_k", hf->moe_top_k, m->moe_top_k},
               {"every", hf->moe_every, m->moe_every},
               {"ffn_hidden", config_moe_ffn(hf), config_moe_ffn(m)},
               {"shared_experts", hf->moe_shared_experts, m->moe_shared_experts}};
    for (size_t i = 0; (hf->moe_experts || m->moe_experts) && i < sizeof moe / sizeof *moe; i++)
        if (moe[i].hf != moe[i].ours) {
            ckpt_err(err, "model.moe.%s is %d in %s/config.json, %d in the config", moe[i].key,
                     moe[i].hf, dir, moe[i].ours);
            return TRD_EXIT_INPUT;
        }
    if (!config_rope_scaling_same(hf, m)) {
        char a[160], b[160];
        config_rope_scaling_text(hf, a, sizeof a);
        config_rope_scaling_text(m, b, sizeof b);
        ckpt_err(err, "model.rope_scaling is %s in %s/config.json, %s in the config", a, dir, b);
        return TRD_EXIT_INPUT;
    }
    return TRD_EXIT_OK;
}

/* Copy the slab s of the global tensor g ([rows, cols]) to dst, in slab
 * order. */
static void copy_slab(const CkptSlab *s, const float *g, int64_t cols, float *dst)
{
    for (int i = 0; i < s->n; i++) {
        const CkptBlock *b = &s->b[i];
        for (int64_t r = b->r; r < b->r + b->nr; r++, dst += b->nc)
            memcpy(dst, g + r * cols + b->c, (size_t)b->nc * sizeof(float));
    }
}

/* This rank's pieces of part[PARAMS] and part[MASTER] (where set), one
 * global tensor at a time. */
static int read_pieces(Imp *im, const CkptShardView *v, const char *dir, char err[CFG_ERR])
{
    float *g = NULL;
    size_t g_cap = 0;
    int code = TRD_EXIT_OK;
    for (int i = 0; i < v->table->n && code == TRD_EXIT_OK; i++) {
        const ParamSpec *p = &v->table->p[i];
        const int64_t rows = p->real_rows, cols = p->shape[1];
        CkptSlab slabs[2][CKPT_MAX_RUNS];
        int64_t first_row[CKPT_MAX_RUNS];
        int ns[2] = {0, 0}, any = 0;
        for (int k = 0; k < 2; k++) {
            const CkptRange *r = &v->part[k == 0 ? CKPT_PARAMS : CKPT_MASTER];
            if (r->data)
                ns[k] = ckpt_slabs(p, rows, r->lo, r->hi, slabs[k], first_row);
            any |= ns[k];
        }
        if (!any)
            continue;
        if ((size_t)(rows * cols) > g_cap) {
            free(g);
            g_cap = (size_t)(rows * cols);
            g = trd_malloc(g_cap * sizeof(float), p->name);
        }
        code = fill_finite(im, p, rows, g, dir);
        for (int k = 0; code == 0 && k < 2; k++) {
            const CkptRange *r = &v->part[k == 0 ? CKPT_PARAMS : CKPT_MASTER];
            for (int j = 0; j < ns[k]; j++)
                copy_slab(&slabs[k][j], g, cols, ckpt_range_at(r, slabs[k][j].first));
        }
    }
    free(g);
    if (code)
        snprintf(err, CFG_ERR, "%s", im->err);
    return code;
}

int ckpt_hf_load_weights(const char *hf_dir, const CkptShardView *v, const ModelConfig *want,
                         char err[CFG_ERR])
{
    err[0] = '\0';
    Config hf;
    config_defaults(&hf);
    Imp im;
    memset(&im, 0, sizeof im);
    ModelConfig *m = &hf.model;
    int code = ckpt_hf_read_model(hf_dir, m, &im.st.want_dtype, err);
    /* gpt2 keeps the first seq_len rows of its position embedding
     * (n_positions is an upper bound); llama's RoPE has no such table. */
    im.n_positions = m->seq_len;
    if (!code && m->arch == ARCH_GPT2 && want->seq_len > m->seq_len) {
        ckpt_err(err,
                 "model.seq_len %d > n_positions %d of %s/config.json: gpt2 has no "
                 "position embedding beyond it",
                 want->seq_len, m->seq_len, hf_dir);
        code = TRD_EXIT_INPUT;
    }
    m->seq_len = want->seq_len;
    im.m = m;
    im.hs = m->heads ? m->hidden / m->heads : 0;
    if (!code)
        code = same_model(hf_dir, m, want, err);
    if (!code)
        code = st_set_open(&im.st, hf_dir, err);
    if (!code && m->moe_experts > 0)
        code = st_check_experts(&im.st, m, err);
    if (!code)
        code = read_pieces(&im, v, hf_dir, err);
    st_set_close(&im.st);
    /* Every rank reads: the lowest failing rank's message for all. */
    int worst = code;
    comm_allreduce_max_i32(v->world, &worst, 1);
    return ckpt_agree(v->world, code, err) != 0 ? worst : TRD_EXIT_OK;
}

/* ---- the model of checkpoint.init_from's source ------------------------- */

/* A trident checkpoint's model, from its index. */
static int index_model(const char *src, ModelConfig *m, char err[CFG_ERR])
{
    char step[CFG_STR], path[CKPT_FILE_PATH];
    if (ckpt_resolve(NULL, RESUME_PATH, src, step, err) != 1)
        return TRD_EXIT_INPUT;
    snprintf(path, sizeof path, "%s/index.h5", step);
    CkptIndex ix;
    if (ckpt_index_read(path, &ix, err) != 0)
        return TRD_EXIT_INPUT;
    m->arch = !strcmp(ix.arch, "llama") ? ARCH_LLAMA : ARCH_GPT2;
    m->layers = ix.layers;
    m->hidden = ix.hidden;
    m->heads = ix.heads;
    m->kv_heads = ix.kv_heads;
    m->ffn_hidden = ix.ffn_hidden;
    m->vocab = ix.vocab;
    m->seq_len = ix.seq_len;
    m->tie_embeddings = ix.tie_embeddings;
    if (ix.has_norms) {
        m->norm_eps = (float)ix.norm_eps;
        m->rope_theta = (float)ix.rope_theta;
    }
    ckpt_index_rope_scaling(&ix, m);
    ckpt_index_moe(&ix, m);
    ckpt_index_free(&ix);
    return TRD_EXIT_OK;
}

int ckpt_fill_model(Config *cfg, char err[CFG_ERR])
{
    /* LoRA: the model is its base's (init_from may name adapters). */
    const int lora = cfg->model.lora.rank > 0 && cfg->model.lora.base[0];
    const char *src = lora ? cfg->model.lora.base : cfg->checkpoint.init_from;
    const char *key = lora ? "model.lora.base" : "checkpoint.init_from";
    static const char *const keys[] = {
        "arch",  "layers",  "hidden",         "heads",    "kv_heads",   "ffn_hidden",
        "vocab", "seq_len", "tie_embeddings", "norm_eps", "rope_theta", "rope_scaling"};
    int missing = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        missing += !config_model_given(cfg, keys[i]);
    /* A config that gives every key does not need the source here (a
     * resumed run whose source has gone still starts). */
    struct stat st;
    /* A LoRA base that is not there (yet): the config's own keys, for
     * `plan` and `topology`; training says what is missing when it reads
     * the base. */
    if (!src[0] || !missing || (lora && stat(src, &st) != 0))
        return TRD_EXIT_OK;
    char json[CKPT_FILE_PATH + 16];
    snprintf(json, sizeof json, "%s/config.json", src);
    ModelConfig m = cfg->model;
    int code, dtype;
    char why[CFG_ERR];
    if (stat(json, &st) == 0)
        code = ckpt_hf_read_model(src, &m, &dtype, why);
    else if (stat(src, &st) == 0 && S_ISDIR(st.st_mode))
        code = index_model(src, &m, why);
    else {
        ckpt_err(why, "%s: no such directory", src);
        code = TRD_EXIT_INPUT;
    }
    if (code) {
        ckpt_err(err, "%s: %s", key, why);
        return code;
    }
    /* What the config says stays (a difference is reported, naming both
     * values, when the weights are read); the rest is the source's. */
    ModelConfig *c = &cfg->model;
#define TAKE(f)                                                                                    \
    if (!config_model_given(cfg, #f))                                                              \
        c->f = m.f;
    TAKE(arch)
    TAKE(layers)
    TAKE(hidden)
    TAKE(heads)
    TAKE(kv_heads)
    TAKE(ffn_hidden)
    TAKE(vocab)
    TAKE(seq_len)
    TAKE(tie_embeddings)
    TAKE(norm_eps)
    TAKE(rope_theta)
    /* the scaling's parameters go with it */
    if (!config_model_given(cfg, "rope_scaling")) {
        c->rope_scaling = m.rope_scaling;
        c->rope_factor = m.rope_factor;
        c->rope_low_freq_factor = m.rope_low_freq_factor;
        c->rope_high_freq_factor = m.rope_high_freq_factor;
        c->rope_original_max_position_embeddings = m.rope_original_max_position_embeddings;
    }
    if (!config_model_given(cfg, "moe.experts") && m.moe_experts > 0) { /* the experts, whole */
        c->moe_experts = m.moe_experts;
        c->moe_top_k = m.moe_top_k;
        c->moe_every = m.moe_every;
        c->moe_ffn_hidden = m.moe_ffn_hidden;
        c->moe_shared_experts = m.moe_shared_experts;
        c->moe_aux_loss_coef = m.moe_aux_loss_coef;
        c->moe_z_loss_coef = m.moe_z_loss_coef;
        c->moe_capacity_factor = m.moe_capacity_factor;
    }
#undef TAKE
    return TRD_EXIT_OK;
}
