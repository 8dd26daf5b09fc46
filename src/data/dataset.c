#include "core/error.h"
#include "data/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MISSING_HINT "---> make it with `trident prepare-data` (see docs/data.md)"

/* Megatron-LM .idx header: 9-byte magic, uint64 version, uint8 dtype code,
 * uint64 sequence count, uint64 document count (34 bytes, little endian). */
static const char idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { IDX_HEADER_BYTES = 9 + 8 + 1 + 8 + 8 };
/* Megatron's DType codes (megatron/core/datasets/indexed_dataset.py). */
enum {
    DTYPE_UINT8 = 1,
    DTYPE_INT8,
    DTYPE_INT16,
    DTYPE_INT32,
    DTYPE_INT64,
    DTYPE_FLOAT64,
    DTYPE_FLOAT32,
    DTYPE_UINT16
};

static const char *dtype_name(int code)
{
    static const char *names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                  "int64", "float64", "float32", "uint16"};
    return code >= 1 && code <= 8 ? names[code] : "unknown";
}

/* The .idx arrays sit at offsets 34, 34 + 4n, ...: not aligned for their
 * types, so they are read through memcpy rather than by casting pointers. */
static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int32_t get_i32(const unsigned char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Open a dataset file for reading: its descriptor and stat, or -1 with err
 * (missing, with the hint to make it; not a regular file). */
static int open_regular(const char *path, struct stat *st, char err[CFG_ERR])
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return trd_errorf(err, "cannot open dataset file %s: %s\n%s", path, strerror(errno),
                          MISSING_HINT);
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return trd_errorf(err, "dataset file %s is not a regular file", path);
    }
    return fd;
}

/* Map a whole file read-only.  An empty file gives map NULL, bytes 0. */
static int map_file(const char *path, void **map, size_t *bytes, char err[CFG_ERR])
{
    *map = NULL;
    *bytes = 0;
    struct stat st;
    int fd = open_regular(path, &st, err);
    if (fd < 0)
        return -1;
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return trd_errorf(err, "cannot mmap dataset file %s (%lld bytes): %s", path,
                              (long long)st.st_size, strerror(e));
        }
        *map = m;
        *bytes = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

static void unmap(void **map, size_t *bytes)
{
    if (*map)
        munmap(*map, *bytes);
    *map = NULL;
    *bytes = 0;
}

/* Accept "PREFIX", "PREFIX.bin" or "PREFIX.idx" and give back PREFIX. */
static int megatron_prefix(const char *path, char prefix[CFG_STR], char err[CFG_ERR])
{
    size_t len = strlen(path);
    if (len + 5 > CFG_STR)
        return trd_errorf(err, "dataset path is too long (%zu bytes, max %d): %s", len, CFG_STR - 5,
                          path);
    memcpy(prefix, path, len + 1);
    if (len > 4 && (strcmp(path + len - 4, ".bin") == 0 || strcmp(path + len - 4, ".idx") == 0)) {
        char idx[CFG_STR + 8];
        snprintf(idx, sizeof idx, "%s.idx", path);
        if (access(idx, F_OK) != 0)
            prefix[len - 4] = '\0';
    }
    return 0;
}

/* ds->path = the prefix of path, and its .idx and .bin file names. */
static int megatron_paths(TokenDataset *ds, const char *path, char idx_path[CFG_STR + 8],
                          char bin_path[CFG_STR + 8], char err[CFG_ERR])
{
    char prefix[CFG_STR];
    if (megatron_prefix(path, prefix, err) != 0)
        return -1;
    snprintf(idx_path, CFG_STR + 8, "%s.idx", prefix);
    snprintf(bin_path, CFG_STR + 8, "%s.bin", prefix);
    snprintf(ds->path, sizeof ds->path, "%s", prefix);
    return 0;
}

/* Check the header and sizes of a mapped .idx; fill the dtype and counts. */
static int megatron_check_idx(const char *idx_path, const unsigned char *p, size_t bytes,
                              int *token_bytes, uint64_t *n_seq, uint64_t *n_doc, char err[CFG_ERR])
{
    if (bytes < sizeof idx_magic || memcmp(p, idx_magic, sizeof idx_magic) != 0)
        return trd_errorf(
            err, "%s: not a Megatron .idx file (the first 9 bytes are not \"MMIDIDX\\0\\0\")",
            idx_path);
    if (bytes < IDX_HEADER_BYTES)
        return trd_errorf(err, "%s: truncated .idx: %zu bytes, the header alone needs %d", idx_path,
                          bytes, IDX_HEADER_BYTES);
    uint64_t version = get_u64(p + 9);
    if (version != 1)
        return trd_errorf(err, "%s: unsupported .idx version %llu (trident reads version 1)",
                          idx_path, (unsigned long long)version);
    int code = p[17];
    if (code == DTYPE_UINT16)
        *token_bytes = 2;
    else if (code == DTYPE_INT32)
        *token_bytes = 4;
    else
        return trd_errorf(
            err, "%s: unsupported token dtype code %d (%s); trident reads uint16 (8) and int32 (4)",
            idx_path, code, dtype_name(code));
    *n_seq = get_u64(p + 18);
    *n_doc = get_u64(p + 26);
    /* Counts beyond the file size cannot be right; checking first keeps the
     * size arithmetic below free of overflow. */
    if (*n_seq > bytes || *n_doc > bytes)
        return trd_errorf(
            err,
            "%s: truncated .idx: header says %llu sequences and %llu document indices, file has %zu bytes",
            idx_path, (unsigned long long)*n_seq, (unsigned long long)*n_doc, bytes);
    uint64_t need = IDX_HEADER_BYTES + *n_seq * (4 + 8) + *n_doc * 8;
    /* Multimodal datasets append one int8 mode per sequence; those are
     * readable as plain token streams too. */
    if (bytes != need && bytes != need + *n_seq)
        return trd_errorf(
            err,
            "%s: %s .idx: header says %llu sequences and %llu document indices (%llu bytes), file has %zu bytes",
            idx_path, bytes < need ? "truncated" : "inconsistent", (unsigned long long)*n_seq,
            (unsigned long long)*n_doc, (unsigned long long)need, bytes);
    return 0;
}

/* Walk the sequence table: lengths must be >= 0 and the byte pointers
 * contiguous (the dataset is read as one stream), document indices must
 * run from 0 to the sequence count.  Returns the token count in *n_tokens. */
static int megatron_check_tables(const char *idx_path, const unsigned char *p, uint64_t n_seq,
                                 uint64_t n_doc, int token_bytes, uint64_t *n_tokens,
                                 char err[CFG_ERR])
{
    const unsigned char *lengths = p + IDX_HEADER_BYTES;
    const unsigned char *pointers = lengths + 4 * n_seq;
    const unsigned char *docs = pointers + 8 * n_seq;
    uint64_t tokens = 0;
    for (uint64_t i = 0; i < n_seq; i++) {
        int32_t len = get_i32(lengths + 4 * i);
        uint64_t ptr = get_u64(pointers + 8 * i);
        if (len < 0)
            return trd_errorf(err, "%s: sequence %llu has negative length %d", idx_path,
                              (unsigned long long)i, len);
        if (ptr != tokens * (uint64_t)token_bytes)
            return trd_errorf(err,
                              "%s: sequence %llu starts at byte %llu, expected %llu: trident reads "
                              "datasets whose sequences are stored back to back",
                              idx_path, (unsigned long long)i, (unsigned long long)ptr,
                              (unsigned long long)(tokens * (uint64_t)token_bytes));
        tokens += (uint64_t)len;
    }
    /* At least one document boundary past the start when there are sequences. */
    if (n_doc < 1 || (n_seq > 0 && n_doc < 2) || get_u64(docs) != 0 ||
        get_u64(docs + 8 * (n_doc - 1)) != n_seq)
        return trd_errorf(err, "%s: document indices must run from 0 to the sequence count %llu",
                          idx_path, (unsigned long long)n_seq);
    for (uint64_t d = 1; d < n_doc; d++)
        if (get_u64(docs + 8 * d) < get_u64(docs + 8 * (d - 1)))
            return trd_errorf(err, "%s: document index %llu decreases", idx_path,
                              (unsigned long long)d);
    *n_tokens = tokens;
    return 0;
}

/* PREFIX.mask: its size (bytes), or -1 when there is none. */
static int64_t mask_size(const char *prefix)
{
    char path[CFG_STR + 8];
    struct stat st;
    snprintf(path, sizeof path, "%s.mask", prefix);
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static int mask_mismatch(const TokenDataset *ds, int64_t bytes, char err[CFG_ERR])
{
    return trd_errorf(err,
                      "%s.mask does not match its tokens: %lld bytes, the dataset has %llu "
                      "tokens (a byte each)\n---> make the dataset and its mask together with "
                      "`trident prepare-data --template`",
                      ds->path, (long long)bytes, (unsigned long long)ds->n_tokens);
}

/* The loss mask beside a Megatron pair, when there is one: a byte per
 * token; with check, every byte 0 or 1. */
static int open_mask(TokenDataset *ds, int check, char err[CFG_ERR])
{
    char path[CFG_STR + 8];
    int64_t bytes = mask_size(ds->path);
    if (bytes < 0)
        return 0;
    if ((uint64_t)bytes != ds->n_tokens)
        return mask_mismatch(ds, bytes, err);
    snprintf(path, sizeof path, "%s.mask", ds->path);
    if (map_file(path, &ds->mask_map, &ds->mask_bytes, err) != 0)
        return -1;
    ds->has_mask = 1;
    ds->mask = ds->mask_map;
    for (size_t i = 0; check && i < ds->mask_bytes; i++)
        if (ds->mask[i] > 1)
            return trd_errorf(err,
                              "%s: byte %zu is %d; a loss mask holds 0 (not trained) or 1 "
                              "(trained)",
                              path, i, ds->mask[i]);
    return 0;
}

static int open_megatron(TokenDataset *ds, const char *path, int check_tables, char err[CFG_ERR])
{
    char idx_path[CFG_STR + 8], bin_path[CFG_STR + 8];
    if (megatron_paths(ds, path, idx_path, bin_path, err) != 0)
        return -1;

    if (map_file(idx_path, &ds->idx_map, &ds->idx_bytes, err) != 0)
        return -1;
    uint64_t n_seq = 0, n_doc = 0;
    const unsigned char *p = ds->idx_map;
    if (megatron_check_idx(idx_path, p, ds->idx_bytes, &ds->token_bytes, &n_seq, &n_doc, err) !=
            0 ||
        (check_tables && megatron_check_tables(idx_path, p, n_seq, n_doc, ds->token_bytes,
                                               &ds->n_tokens, err) != 0) ||
        map_file(bin_path, &ds->bin_map, &ds->bin_bytes, err) != 0)
        return -1;
    if (!check_tables) /* checked on an earlier open of the same file */
        ds->n_tokens = ds->bin_bytes / (size_t)ds->token_bytes;
    /* The .idx must describe the .bin exactly: a longer .bin is as wrong as
     * a shorter one (an .idx of another, smaller dataset, or a .bin
     * rewritten without its index), and training on it would silently skip
     * or misread documents. */
    uint64_t need = ds->n_tokens * (uint64_t)ds->token_bytes;
    if (ds->bin_bytes != need)
        return trd_errorf(
            err,
            "%s does not match %s: the index describes %llu sequences of %llu tokens in all (%llu bytes of %s), the .bin has %zu bytes (%s); the pair comes from different datasets or one was cut short",
            bin_path, idx_path, (unsigned long long)n_seq, (unsigned long long)ds->n_tokens,
            (unsigned long long)need, ds->token_bytes == 2 ? "uint16" : "int32", ds->bin_bytes,
            ds->bin_bytes < need ? "shorter" : "longer");
    ds->tokens = ds->bin_map;
    ds->n_docs = n_doc - 1;
    return open_mask(ds, check_tables, err);
}

static int open_llmc(TokenDataset *ds, const char *path, char err[CFG_ERR])
{
    if (strlen(path) >= CFG_STR)
        return trd_errorf(err, "dataset path is too long (max %d bytes): %s", CFG_STR - 1, path);
    snprintf(ds->path, sizeof ds->path, "%s", path);
    if (map_file(path, &ds->bin_map, &ds->bin_bytes, err) != 0)
        return -1;
    const size_t header = DATASET_LLMC_HEADER_INTS * sizeof(int32_t);
    int32_t h[3] = {0, 0, 0};
    if (ds->bin_bytes >= sizeof h)
        memcpy(h, ds->bin_map, sizeof h);
    if (h[0] != DATASET_LLMC_MAGIC)
        return trd_errorf(err, "%s: not an llm.c token shard (magic %d, expected %d)", path, h[0],
                          DATASET_LLMC_MAGIC);
    if (ds->bin_bytes < header)
        return trd_errorf(err, "%s: truncated llm.c shard: %zu bytes, the header alone needs %zu",
                          path, ds->bin_bytes, header);
    if (h[1] != DATASET_LLMC_VERSION)
        return trd_errorf(
            err, "%s: unsupported llm.c shard version %d (trident reads version 1, uint16 tokens)",
            path, h[1]);
    if (h[2] < 0)
        return trd_errorf(err, "%s: llm.c shard header has a negative token count %d", path, h[2]);
    uint64_t have = (ds->bin_bytes - header) / 2;
    if (have != (uint64_t)h[2] || (ds->bin_bytes - header) % 2 != 0)
        return trd_errorf(
            err,
            "%s: token count mismatch: header says %d tokens, file holds %zu bytes of tokens (%s)",
            path, h[2], ds->bin_bytes - header,
            have < (uint64_t)h[2] ? "truncated" : "trailing bytes");
    ds->tokens = (const unsigned char *)ds->bin_map + header;
    ds->token_bytes = 2;
    ds->n_tokens = (uint64_t)h[2];
    ds->n_docs = 1;
    return 0;
}

/* Read the first n bytes of path into buf and its size into *size. */
static int read_head(const char *path, void *buf, size_t n, uint64_t *size, char err[CFG_ERR])
{
    struct stat st;
    int fd = open_regular(path, &st, err);
    if (fd < 0)
        return -1;
    *size = (uint64_t)st.st_size;
    memset(buf, 0, n);
    ssize_t got = pread(fd, buf, n, 0);
    int e = errno;
    close(fd);
    if (got < 0)
        return trd_errorf(err, "cannot read dataset file %s: %s", path, strerror(e));
    return 0;
}

int dataset_probe(TokenDataset *ds, const char *path, DataFormat fmt, char err[CFG_ERR])
{
    memset(ds, 0, sizeof *ds);
    ds->format = fmt;
    uint64_t size = 0;
    if (fmt == DATA_LLMC) {
        if (strlen(path) >= CFG_STR)
            return trd_errorf(err, "dataset path is too long (max %d bytes): %s", CFG_STR - 1,
                              path);
        snprintf(ds->path, sizeof ds->path, "%s", path);
        int32_t h[3];
        if (read_head(path, h, sizeof h, &size, err) != 0)
            return -1;
        const uint64_t header = DATASET_LLMC_HEADER_INTS * sizeof(int32_t);
        if (h[0] != DATASET_LLMC_MAGIC)
            return trd_errorf(err, "%s: not an llm.c token shard (magic %d, expected %d)", path,
                              h[0], DATASET_LLMC_MAGIC);
        if (size < header || h[2] < 0 || size != header + 2 * (uint64_t)h[2])
            return trd_errorf(err,
                              "%s: token count mismatch: header says %d tokens, the file has "
                              "%llu bytes (a shard of %d tokens has %llu)",
                              path, h[2], (unsigned long long)size, h[2],
                              (unsigned long long)(header + 2 * (uint64_t)(h[2] < 0 ? 0 : h[2])));
        ds->token_bytes = 2;
        ds->n_tokens = (uint64_t)h[2];
        ds->n_docs = 1;
        return 0;
    }
    char idx_path[CFG_STR + 8], bin_path[CFG_STR + 8];
    if (megatron_paths(ds, path, idx_path, bin_path, err) != 0)
        return -1;
    unsigned char h[IDX_HEADER_BYTES];
    uint64_t n_seq = 0, n_doc = 0, bin_size = 0;
    if (read_head(idx_path, h, sizeof h, &size, err) != 0 ||
        megatron_check_idx(idx_path, h, (size_t)size, &ds->token_bytes, &n_seq, &n_doc, err) != 0 ||
        read_head(bin_path, h, 0, &bin_size, err) != 0)
        return -1;
    if (bin_size % (uint64_t)ds->token_bytes)
        return trd_errorf(err, "%s: %llu bytes is not a whole number of %s tokens", bin_path,
                          (unsigned long long)bin_size, ds->token_bytes == 2 ? "uint16" : "int32");
    ds->n_tokens = bin_size / (uint64_t)ds->token_bytes;
    ds->n_docs = n_doc ? n_doc - 1 : 0;
    const int64_t mask = mask_size(ds->path);
    if (mask >= 0 && (uint64_t)mask != ds->n_tokens)
        return mask_mismatch(ds, mask, err);
    ds->has_mask = mask >= 0;
    return 0;
}

int dataset_open(TokenDataset *ds, const char *path, DataFormat fmt, char err[CFG_ERR])
{
    return dataset_reopen(ds, path, fmt, 1, err);
}

int dataset_reopen(TokenDataset *ds, const char *path, DataFormat fmt, int check, char err[CFG_ERR])
{
    memset(ds, 0, sizeof *ds);
    ds->format = fmt;
    int rc = fmt == DATA_LLMC ? open_llmc(ds, path, err)
             : fmt == DATA_MEGATRON
                 ? open_megatron(ds, path, check, err)
                 : trd_errorf(err, "%s: unknown dataset format %d", path, (int)fmt);
    if (rc != 0)
        dataset_close(ds);
    return rc;
}

void dataset_close(TokenDataset *ds)
{
    unmap(&ds->bin_map, &ds->bin_bytes);
    unmap(&ds->idx_map, &ds->idx_bytes);
    unmap(&ds->mask_map, &ds->mask_bytes);
    ds->mask = NULL;
    ds->has_mask = 0;
    ds->tokens = NULL;
    ds->n_tokens = 0;
    ds->n_docs = 0;
}

int dataset_token_bytes_for_vocab(int vocab) { return vocab <= 65536 ? 2 : 4; }

/* ---- writers ----------------------------------------------------------- */

struct DatasetWriter {
    char bin_path[CFG_STR + 8], idx_path[CFG_STR + 8];
    char bin_tmp[CFG_STR + 16], idx_tmp[CFG_STR + 16];
    FILE *bin;
    int token_bytes;
    int32_t *lengths; /* one per document (= sequence) */
    size_t n_docs, cap;
    uint64_t n_tokens;
    unsigned char buf[1 << 16]; /* conversion buffer for one write */
};

DatasetWriter *dataset_writer_open(const char *prefix, int token_bytes, char err[CFG_ERR])
{
    if (token_bytes != 2 && token_bytes != 4) {
        trd_errorf(err, "%s: token width must be 2 or 4 bytes, got %d", prefix, token_bytes);
        return NULL;
    }
    if (strlen(prefix) + 5 > CFG_STR) {
        trd_errorf(err, "dataset prefix is too long (max %d bytes): %s", CFG_STR - 5, prefix);
        return NULL;
    }
    DatasetWriter *w = calloc(1, sizeof *w);
    if (!w) {
        trd_errorf(err, "%s: out of memory for the dataset writer", prefix);
        return NULL;
    }
    w->token_bytes = token_bytes;
    snprintf(w->bin_path, sizeof w->bin_path, "%s.bin", prefix);
    snprintf(w->idx_path, sizeof w->idx_path, "%s.idx", prefix);
    snprintf(w->bin_tmp, sizeof w->bin_tmp, "%s.tmp", w->bin_path);
    snprintf(w->idx_tmp, sizeof w->idx_tmp, "%s.tmp", w->idx_path);
    w->bin = fopen(w->bin_tmp, "wb");
    if (!w->bin) {
        trd_errorf(err, "cannot create %s: %s", w->bin_tmp, strerror(errno));
        free(w);
        return NULL;
    }
    return w;
}

int dataset_writer_add(DatasetWriter *w, const int32_t *tokens, size_t n, char err[CFG_ERR])
{
    if (n > INT32_MAX)
        return trd_errorf(err, "%s: a document of %zu tokens does not fit the int32 length field",
                          w->bin_path, n);
    const int64_t max_id = w->token_bytes == 2 ? 65535 : INT32_MAX;
    size_t per = sizeof w->buf / (size_t)w->token_bytes;
    for (size_t at = 0; at < n; at += per) {
        size_t k = n - at < per ? n - at : per;
        for (size_t i = 0; i < k; i++) {
            int32_t t = tokens[at + i];
            if (t < 0 || t > max_id)
                return trd_errorf(err, "%s: token %d (document %zu, position %zu) does not fit %s",
                                  w->bin_path, t, w->n_docs, at + i,
                                  w->token_bytes == 2 ? "uint16" : "int32");
            if (w->token_bytes == 2) {
                uint16_t v = (uint16_t)t;
                memcpy(w->buf + 2 * i, &v, 2);
            } else {
                memcpy(w->buf + 4 * i, &t, 4);
            }
        }
        if (fwrite(w->buf, (size_t)w->token_bytes, k, w->bin) != k)
            return trd_errorf(err, "cannot write %s: %s", w->bin_tmp, strerror(errno));
    }
    if (w->n_docs == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 1024;
        int32_t *l = realloc(w->lengths, cap * sizeof *l);
        if (!l)
            return trd_errorf(err, "%s: out of memory for the document table", w->bin_path);
        w->lengths = l;
        w->cap = cap;
    }
    w->lengths[w->n_docs++] = (int32_t)n;
    w->n_tokens += n;
    return 0;
}

static int write_all(FILE *f, const void *p, size_t bytes)
{
    return bytes == 0 || fwrite(p, 1, bytes, f) == bytes ? 0 : -1; /* p may be NULL then */
}

/* The index: header, int32 lengths, int64 byte pointers, int64 document
 * indices 0..n (one sequence per document). */
static int write_idx(const DatasetWriter *w, FILE *f)
{
    uint64_t version = 1, n_seq = w->n_docs, n_doc = w->n_docs + 1;
    unsigned char code = w->token_bytes == 2 ? DTYPE_UINT16 : DTYPE_INT32;
    if (write_all(f, idx_magic, sizeof idx_magic) || write_all(f, &version, 8) ||
        write_all(f, &code, 1) || write_all(f, &n_seq, 8) || write_all(f, &n_doc, 8) ||
        write_all(f, w->lengths, w->n_docs * sizeof(int32_t)))
        return -1;
    int64_t ptr = 0;
    for (size_t i = 0; i < w->n_docs; i++) {
        if (write_all(f, &ptr, 8))
            return -1;
        ptr += (int64_t)w->lengths[i] * w->token_bytes;
    }
    for (int64_t d = 0; d <= (int64_t)w->n_docs; d++)
        if (write_all(f, &d, 8))
            return -1;
    return 0;
}

int dataset_writer_close(DatasetWriter *w, char err[CFG_ERR])
{
    int rc = 0;
    if (fclose(w->bin) != 0)
        rc = trd_errorf(err, "cannot write %s: %s", w->bin_tmp, strerror(errno));
    FILE *f = rc == 0 ? fopen(w->idx_tmp, "wb") : NULL;
    if (rc == 0 && !f)
        rc = trd_errorf(err, "cannot create %s: %s", w->idx_tmp, strerror(errno));
    if (f) {
        int wr = write_idx(w, f);
        if (fclose(f) != 0 || wr != 0)
            rc = trd_errorf(err, "cannot write %s: %s", w->idx_tmp, strerror(errno));
    }
    /* .bin first: a reader only trusts a .bin through its .idx, so the
     * pair becomes visible when the .idx is renamed. */
    if (rc == 0 && rename(w->bin_tmp, w->bin_path) != 0)
        rc =
            trd_errorf(err, "cannot rename %s to %s: %s", w->bin_tmp, w->bin_path, strerror(errno));
    if (rc == 0 && rename(w->idx_tmp, w->idx_path) != 0)
        rc =
            trd_errorf(err, "cannot rename %s to %s: %s", w->idx_tmp, w->idx_path, strerror(errno));
    if (rc != 0) {
        remove(w->bin_tmp);
        remove(w->idx_tmp);
    }
    free(w->lengths);
    free(w);
    return rc;
}

int dataset_write_llmc(const char *path, const int32_t *tokens, size_t n, char err[CFG_ERR])
{
    if (n > INT32_MAX)
        return trd_errorf(err, "%s: %zu tokens do not fit the int32 count of an llm.c shard", path,
                          n);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] > 65535)
            return trd_errorf(
                err, "%s: token %d at position %zu does not fit uint16 (llm.c shards hold uint16)",
                path, tokens[i], i);
    char tmp[CFG_STR + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return trd_errorf(err, "cannot create %s: %s", tmp, strerror(errno));
    int32_t header[DATASET_LLMC_HEADER_INTS] = {DATASET_LLMC_MAGIC, DATASET_LLMC_VERSION,
                                                (int32_t)n};
    int rc = write_all(f, header, sizeof header);
    uint16_t buf[4096];
    for (size_t at = 0; rc == 0 && at < n; at += 4096) {
        size_t k = n - at < 4096 ? n - at : 4096;
        for (size_t i = 0; i < k; i++)
            buf[i] = (uint16_t)tokens[at + i];
        rc = write_all(f, buf, k * sizeof buf[0]);
    }
    if (fclose(f) != 0 || rc != 0) {
        remove(tmp);
        return trd_errorf(err, "cannot write %s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return trd_errorf(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    }
    return 0;
}

int64_t dataset_sequence_length(const TokenDataset *ds, uint64_t i)
{
    if (ds->format != DATA_MEGATRON || !ds->idx_map ||
        i >= get_u64((const unsigned char *)ds->idx_map + 18))
        return -1;
    return get_i32((const unsigned char *)ds->idx_map + IDX_HEADER_BYTES + 4 * i);
}

/* ---- one dataset written in parts ------------------------------------ */

struct DatasetPart {
    DatasetShape s;
    char bin_tmp[CFG_STR + 16], idx_tmp[CFG_STR + 16];
    int bin, idx;
    uint64_t first_doc, first_token, n_docs, n_tokens; /* n_*: written so far */
    int32_t *lengths;
    size_t cap;
};

static void parts_paths(const DatasetShape *s, char *bin, char *idx, size_t n)
{
    snprintf(bin, n, "%s.bin.tmp", s->prefix);
    snprintf(idx, n, "%s.idx.tmp", s->prefix);
}

static size_t llmc_header_bytes(void) { return DATASET_LLMC_HEADER_INTS * sizeof(int32_t); }

/* All of p[0..n) at file offset off. */
static int pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n < (1u << 30) ? n : (1u << 30), (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p = (const char *)p + k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* A file of `size` bytes whose first `n` bytes are `head`. */
static int create_sized(const char *path, uint64_t size, const void *head, size_t n,
                        char err[CFG_ERR])
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0)
        return trd_errorf(err, "cannot create %s: %s", path, strerror(errno));
    int rc = ftruncate(fd, (off_t)size) == 0 && pwrite_all(fd, head, n, 0) == 0 ? 0 : -1;
    if (close(fd) != 0)
        rc = -1;
    return rc ? trd_errorf(err, "cannot write %s: %s", path, strerror(errno)) : 0;
}

int dataset_parts_create(const DatasetShape *s, char err[CFG_ERR])
{
    char bin[CFG_STR + 16], idx[CFG_STR + 16];
    if (strlen(s->prefix) + 9 > CFG_STR)
        return trd_errorf(err, "dataset prefix is too long (max %d bytes): %s", CFG_STR - 9,
                          s->prefix);
    parts_paths(s, bin, idx, sizeof bin);
    if (s->llmc) {
        if (s->tokens > INT32_MAX)
            return trd_errorf(err, "%s: %llu tokens do not fit the int32 count of an llm.c shard",
                              s->prefix, (unsigned long long)s->tokens);
        int32_t h[DATASET_LLMC_HEADER_INTS] = {DATASET_LLMC_MAGIC, DATASET_LLMC_VERSION,
                                               (int32_t)s->tokens};
        return create_sized(bin, llmc_header_bytes() + 2 * s->tokens, h, sizeof h, err);
    }
    /* The header, and the last entry of the document index (the parts
     * write the others): magic, version, dtype, sequences, documents + 1. */
    unsigned char head[IDX_HEADER_BYTES];
    uint64_t version = 1, n_seq = s->docs, n_doc = s->docs + 1;
    head[17] = s->token_bytes == 2 ? DTYPE_UINT16 : DTYPE_INT32;
    memcpy(head, idx_magic, 9);
    memcpy(head + 9, &version, 8);
    memcpy(head + 18, &n_seq, 8);
    memcpy(head + 26, &n_doc, 8);
    const uint64_t size = IDX_HEADER_BYTES + 20 * s->docs + 8;
    if (create_sized(bin, s->tokens * (uint64_t)s->token_bytes, NULL, 0, err) != 0 ||
        create_sized(idx, size, head, sizeof head, err) != 0)
        return -1;
    int fd = open(idx, O_WRONLY);
    int rc = fd >= 0 && pwrite_all(fd, &s->docs, 8, size - 8) == 0 ? 0 : -1;
    if (fd >= 0 && close(fd) != 0)
        rc = -1;
    return rc ? trd_errorf(err, "cannot write %s: %s", idx, strerror(errno)) : 0;
}

DatasetPart *dataset_part_open(const DatasetShape *s, uint64_t first_doc, uint64_t first_token,
                               char err[CFG_ERR])
{
    DatasetPart *p = calloc(1, sizeof *p);
    if (!p) {
        trd_errorf(err, "%s: out of memory for a dataset part", s->prefix);
        return NULL;
    }
    p->s = *s;
    p->first_doc = first_doc;
    p->first_token = first_token;
    p->idx = -1;
    parts_paths(s, p->bin_tmp, p->idx_tmp, sizeof p->bin_tmp);
    p->bin = open(p->bin_tmp, O_WRONLY);
    if (p->bin >= 0 && !s->llmc)
        p->idx = open(p->idx_tmp, O_WRONLY);
    if (p->bin < 0 || (!s->llmc && p->idx < 0)) {
        trd_errorf(err, "cannot open %s: %s", p->bin < 0 ? p->bin_tmp : p->idx_tmp,
                   strerror(errno));
        if (p->bin >= 0)
            close(p->bin);
        free(p);
        return NULL;
    }
    return p;
}

int dataset_part_add(DatasetPart *p, const void *tokens, const int32_t *lengths, size_t n_docs,
                     char err[CFG_ERR])
{
    uint64_t n = 0;
    for (size_t i = 0; i < n_docs; i++)
        n += (uint64_t)lengths[i];
    if (p->first_doc + p->n_docs + n_docs > p->s.docs ||
        p->first_token + p->n_tokens + n > p->s.tokens)
        return trd_errorf(err, "%s: a part writes past the dataset's %llu documents, %llu tokens",
                          p->s.prefix, (unsigned long long)p->s.docs,
                          (unsigned long long)p->s.tokens);
    const uint64_t tb = (uint64_t)p->s.token_bytes;
    const uint64_t at = (p->s.llmc ? llmc_header_bytes() : 0) + (p->first_token + p->n_tokens) * tb;
    if (pwrite_all(p->bin, tokens, (size_t)(n * tb), at) != 0)
        return trd_errorf(err, "cannot write %s: %s", p->bin_tmp, strerror(errno));
    if (!p->s.llmc) { /* the index is written at close */
        if (p->n_docs + n_docs > p->cap) {
            size_t cap = p->cap ? 2 * p->cap : 1024;
            while (cap < p->n_docs + n_docs)
                cap *= 2;
            int32_t *l = realloc(p->lengths, cap * sizeof *l);
            if (!l)
                return trd_errorf(err, "%s: out of memory for the document table", p->s.prefix);
            p->lengths = l;
            p->cap = cap;
        }
        memcpy(p->lengths + p->n_docs, lengths, n_docs * sizeof *lengths);
    }
    p->n_docs += n_docs;
    p->n_tokens += n;
    return 0;
}

/* This part's rows of the three index tables: lengths (int32), byte
 * pointers (int64) and document indices (int64), through a buffer. */
static int part_write_idx(const DatasetPart *p)
{
    const uint64_t D = p->s.docs, d0 = p->first_doc;
    if (p->n_docs &&
        pwrite_all(p->idx, p->lengths, p->n_docs * sizeof(int32_t), IDX_HEADER_BYTES + 4 * d0) != 0)
        return -1;
    int64_t buf[4096], ptr = (int64_t)(p->first_token * (uint64_t)p->s.token_bytes);
    for (uint64_t i = 0; i < p->n_docs; i += 4096) {
        size_t k = p->n_docs - i < 4096 ? (size_t)(p->n_docs - i) : 4096;
        for (size_t j = 0; j < k; j++) {
            buf[j] = ptr;
            ptr += (int64_t)p->lengths[i + j] * p->s.token_bytes;
        }
        if (pwrite_all(p->idx, buf, k * 8, IDX_HEADER_BYTES + 4 * D + 8 * (d0 + i)) != 0)
            return -1;
        for (size_t j = 0; j < k; j++)
            buf[j] = (int64_t)(d0 + i + j);
        if (pwrite_all(p->idx, buf, k * 8, IDX_HEADER_BYTES + 12 * D + 8 * (d0 + i)) != 0)
            return -1;
    }
    return 0;
}

int dataset_part_close(DatasetPart *p, char err[CFG_ERR])
{
    int rc = 0;
    if (!p->s.llmc && part_write_idx(p) != 0)
        rc = trd_errorf(err, "cannot write %s: %s", p->idx_tmp, strerror(errno));
    if (close(p->bin) != 0 && rc == 0)
        rc = trd_errorf(err, "cannot write %s: %s", p->bin_tmp, strerror(errno));
    if (p->idx >= 0 && close(p->idx) != 0 && rc == 0)
        rc = trd_errorf(err, "cannot write %s: %s", p->idx_tmp, strerror(errno));
    free(p->lengths);
    free(p);
    return rc;
}

int dataset_parts_publish(const DatasetShape *s, char err[CFG_ERR])
{
    char bin[CFG_STR + 16], idx[CFG_STR + 16], path[CFG_STR + 8];
    parts_paths(s, bin, idx, sizeof bin);
    snprintf(path, sizeof path, "%s.bin", s->prefix);
    if (rename(bin, path) != 0)
        return trd_errorf(err, "cannot rename %s to %s: %s", bin, path, strerror(errno));
    snprintf(path, sizeof path, "%s.idx", s->prefix);
    if (!s->llmc && rename(idx, path) != 0)
        return trd_errorf(err, "cannot rename %s to %s: %s", idx, path, strerror(errno));
    return 0;
}
