/* reader.c — plain, gzip and zstd input streams (see reader.h). */
#include "data/reader.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

enum { IN_CHUNK = 1 << 17, OUT_CHUNK = 1 << 18 };

struct DataReader {
    ReaderCodec codec;
    FILE *f;
    int eof;  /* no more file bytes */
    int done; /* no more decompressed bytes */
    uint64_t file_bytes;
    uint64_t left;     /* plain: bytes left of the range (reader_open_range) */
    unsigned char *in; /* compressed input chunk */
    z_stream zs;       /* gzip */
    int in_member;     /* gzip: inside a member (its end not seen yet) */
    ZSTD_DCtx *zd;     /* zstd */
    ZSTD_inBuffer zin;
    size_t zlast;          /* last ZSTD_decompressStream result: 0 = a frame ended */
    char pending[TRD_ERR]; /* an error met after some bytes were returned */
    /* reader_line: decompressed bytes [out_pos, out_len) of out, and the
     * line being assembled when it spans chunks. */
    char *out;
    size_t out_pos, out_len;
    char *line;
    size_t line_len, line_cap;
};

ReaderCodec reader_codec(const char *path)
{
    size_t n = strlen(path);
    if (n > 3 && !strcmp(path + n - 3, ".gz"))
        return READER_GZIP;
    if (n > 4 && !strcmp(path + n - 4, ".zst"))
        return READER_ZSTD;
    return READER_PLAIN;
}

DataReader *reader_open(const char *path, char err[TRD_ERR])
{
    DataReader *r = calloc(1, sizeof *r);
    if (!r) {
        trd_errorf(err, "out of memory opening %s", path);
        return NULL;
    }
    r->codec = strcmp(path, "-") ? reader_codec(path) : READER_PLAIN;
    r->f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!r->f) {
        trd_errorf(err, "cannot open %s: %s", path, strerror(errno));
        free(r);
        return NULL;
    }
    r->left = UINT64_MAX;
    r->out = malloc(OUT_CHUNK);
    int ok = r->out != NULL;
    if (ok && r->codec != READER_PLAIN)
        ok = (r->in = malloc(IN_CHUNK)) != NULL;
    if (ok && r->codec == READER_GZIP) {
        ok = inflateInit2(&r->zs, 15 + 16) == Z_OK; /* +16: gzip header and trailer */
        r->in_member = 1;
    }
    if (ok && r->codec == READER_ZSTD) {
        ok = (r->zd = ZSTD_createDCtx()) != NULL;
        r->zin.src = r->in;
        r->zlast = 1; /* an empty file is a truncated stream */
    }
    if (!ok) {
        trd_errorf(err, "out of memory opening %s", path);
        reader_close(r);
        return NULL;
    }
    return r;
}

DataReader *reader_open_range(const char *path, uint64_t start, uint64_t end, char err[TRD_ERR])
{
    if (reader_codec(path) != READER_PLAIN || !strcmp(path, "-")) {
        trd_errorf(err, "%s: only a plain file can be read in part", path);
        return NULL;
    }
    DataReader *r = reader_open(path, err);
    if (r && fseeko(r->f, (off_t)start, SEEK_SET) != 0) {
        trd_errorf(err, "cannot seek in %s: %s", path, strerror(errno));
        reader_close(r);
        return NULL;
    }
    if (r)
        r->left = end > start ? end - start : 0;
    return r;
}

/* The bytes of a plain file from `at`, a chunk at a time, to fn until it
 * returns nonzero: 0, or -1 with err. */
static int scan(const char *path, uint64_t at, uint64_t end,
                int (*fn)(const char *p, size_t n, uint64_t pos, void *ctx), void *ctx,
                char err[TRD_ERR])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return trd_errorf(err, "cannot open %s: %s", path, strerror(errno));
    char *buf = malloc(IN_CHUNK);
    int rc = buf && fseeko(f, (off_t)at, SEEK_SET) == 0 ? 0 : -1;
    if (rc)
        trd_errorf(err, "cannot read %s: %s", path, buf ? strerror(errno) : "out of memory");
    while (rc == 0 && at < end) {
        size_t want = end - at < IN_CHUNK ? (size_t)(end - at) : IN_CHUNK;
        size_t k = fread(buf, 1, want, f);
        if (ferror(f))
            rc = trd_errorf(err, "read error in %s: %s", path, strerror(errno));
        if (rc || k == 0 || fn(buf, k, at, ctx))
            break;
        at += k;
    }
    free(buf);
    fclose(f);
    return rc;
}

static int find_newline(const char *p, size_t n, uint64_t pos, void *ctx)
{
    const char *nl = memchr(p, '\n', n);
    if (nl)
        *(uint64_t *)ctx = pos + (uint64_t)(nl - p) + 1;
    return nl != NULL;
}

int reader_line_start(const char *path, uint64_t at, uint64_t size, uint64_t *start,
                      char err[TRD_ERR])
{
    *start = size; /* no '\n' from at - 1 on: the rest is one line, the earlier part's */
    if (at == 0 || at >= size) {
        *start = at == 0 ? 0 : size;
        return 0;
    }
    return scan(path, at - 1, size, find_newline, start, err);
}

static int count_newlines(const char *p, size_t n, uint64_t pos, void *ctx)
{
    (void)pos;
    for (const char *e = p + n; (p = memchr(p, '\n', (size_t)(e - p))) != NULL; p++)
        ++*(uint64_t *)ctx;
    return 0;
}

int reader_count_lines(const char *path, uint64_t end, uint64_t *lines, char err[TRD_ERR])
{
    *lines = 0;
    return scan(path, 0, end, count_newlines, lines, err);
}

void reader_close(DataReader *r)
{
    if (!r)
        return;
    if (r->f && r->f != stdin)
        fclose(r->f);
    if (r->codec == READER_GZIP)
        inflateEnd(&r->zs);
    ZSTD_freeDCtx(r->zd);
    free(r->in);
    free(r->out);
    free(r->line);
    free(r);
}

uint64_t reader_file_bytes(const DataReader *r) { return r->file_bytes; }

/* Up to IN_CHUNK file bytes into r->in; sets eof.  -1 on a read error. */
static ssize_t fill(DataReader *r, char err[TRD_ERR])
{
    size_t n = fread(r->in, 1, IN_CHUNK, r->f);
    if (ferror(r->f))
        return trd_errorf(err, "read error: %s", strerror(errno));
    if (n < IN_CHUNK)
        r->eof = 1;
    r->file_bytes += n;
    return (ssize_t)n;
}

static ssize_t read_gzip(DataReader *r, unsigned char *buf, size_t n, char err[TRD_ERR],
                         size_t *got)
{
    z_stream *z = &r->zs;
    z->next_out = buf;
    z->avail_out = (uInt)n;
    while (z->avail_out > 0) {
        *got = n - z->avail_out;
        if (z->avail_in == 0 && !r->eof) {
            ssize_t k = fill(r, err);
            if (k < 0)
                return -1;
            z->next_in = r->in;
            z->avail_in = (uInt)k;
        }
        if (z->avail_in == 0 && r->eof) {
            if (r->in_member)
                return trd_errorf(err,
                                  "truncated gzip stream (the file ends inside compressed data)");
            r->done = 1;
            break;
        }
        if (!r->in_member) { /* another member follows */
            inflateReset(z);
            r->in_member = 1;
        }
        int rc = inflate(z, Z_NO_FLUSH);
        if (rc == Z_STREAM_END)
            r->in_member = 0;
        else if (rc == Z_DATA_ERROR)
            return trd_errorf(err, "corrupt gzip data (%s)", z->msg ? z->msg : "data error");
        else if (rc == Z_MEM_ERROR)
            return trd_errorf(err, "out of memory decompressing");
        else if (rc != Z_OK && rc != Z_BUF_ERROR)
            return trd_errorf(err, "gzip error %d", rc);
    }
    return (ssize_t)(n - z->avail_out);
}

static ssize_t read_zstd(DataReader *r, unsigned char *buf, size_t n, char err[TRD_ERR],
                         size_t *got)
{
    ZSTD_outBuffer out = {buf, n, 0};
    while (out.pos < out.size) {
        *got = out.pos;
        if (r->zin.pos == r->zin.size && !r->eof) {
            ssize_t k = fill(r, err);
            if (k < 0)
                return -1;
            r->zin.size = (size_t)k;
            r->zin.pos = 0;
        }
        if (r->zin.pos == r->zin.size && r->eof && r->zlast == 0) {
            r->done = 1; /* the last frame ended with the file */
            break;
        }
        size_t before = out.pos;
        size_t rc = ZSTD_decompressStream(r->zd, &out, &r->zin);
        if (ZSTD_isError(rc))
            return trd_errorf(err, "corrupt zstd data (%s)", ZSTD_getErrorName(rc));
        r->zlast = rc;
        if (r->zin.pos == r->zin.size && r->eof && rc != 0 && out.pos == before &&
            out.pos < out.size)
            return trd_errorf(err, "truncated zstd stream (the file ends inside a frame)");
    }
    return (ssize_t)out.pos;
}

/* The bytes decompressed before an error are returned first and the error
 * on the next call, so that the lines before a truncation are read and the
 * error names the line it cuts. */
static ssize_t read_codec(DataReader *r, unsigned char *buf, size_t n, char err[TRD_ERR])
{
    if (r->pending[0])
        return trd_errorf(err, "%s", r->pending);
    size_t got = 0;
    ssize_t k = r->codec == READER_GZIP ? read_gzip(r, buf, n, r->pending, &got)
                                        : read_zstd(r, buf, n, r->pending, &got);
    if (k >= 0)
        return k;
    if (got > 0)
        return (ssize_t)got;
    return trd_errorf(err, "%s", r->pending);
}

ssize_t reader_read(DataReader *r, void *buf, size_t n, char err[TRD_ERR])
{
    if (r->done || n == 0)
        return 0;
    if (r->codec != READER_PLAIN)
        return read_codec(r, buf, n, err);
    if (n > r->left)
        n = (size_t)r->left;
    size_t k = n ? fread(buf, 1, n, r->f) : 0;
    if (ferror(r->f))
        return trd_errorf(err, "read error: %s", strerror(errno));
    r->file_bytes += k;
    r->left -= k;
    if (k == 0)
        r->done = 1;
    return (ssize_t)k;
}

char *reader_slurp(DataReader *r, size_t *len, char err[TRD_ERR])
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            trd_errorf(err, "out of memory reading the file");
            return NULL;
        }
        ssize_t k = reader_read(r, buf + n, cap - n, err);
        if (k < 0) {
            free(buf);
            return NULL;
        }
        if (k == 0)
            break;
        n += (size_t)k;
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int line_append(DataReader *r, const char *p, size_t n, char err[TRD_ERR])
{
    if (r->line_len + n > r->line_cap) {
        size_t c = r->line_cap ? r->line_cap : 1 << 16;
        while (c < r->line_len + n)
            c *= 2;
        char *nl = realloc(r->line, c);
        if (!nl)
            return trd_errorf(err, "out of memory: a line of more than %zu bytes", r->line_len + n);
        r->line = nl;
        r->line_cap = c;
    }
    memcpy(r->line + r->line_len, p, n);
    r->line_len += n;
    return 0;
}

int reader_line(DataReader *r, const char **line, size_t *len, char err[TRD_ERR])
{
    r->line_len = 0;
    for (;;) {
        if (r->out_pos == r->out_len) {
            ssize_t k = reader_read(r, r->out, OUT_CHUNK, err);
            if (k < 0)
                return -1;
            r->out_pos = 0;
            r->out_len = (size_t)k;
            if (k == 0) { /* end: a last line without '\n' */
                *line = r->line;
                *len = r->line_len;
                return r->line_len > 0;
            }
        }
        char *start = r->out + r->out_pos;
        size_t avail = r->out_len - r->out_pos;
        char *nl = memchr(start, '\n', avail);
        if (nl && r->line_len == 0) { /* the whole line is in the chunk: no copy */
            *line = start;
            *len = (size_t)(nl - start);
            r->out_pos += *len + 1;
            return 1;
        }
        size_t take = nl ? (size_t)(nl - start) : avail;
        if (line_append(r, start, take, err) != 0)
            return -1;
        r->out_pos += take + (nl ? 1 : 0);
        if (nl) {
            *line = r->line;
            *len = r->line_len;
            return 1;
        }
    }
}
