#include "data/prepare.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/inputs.h"
#include "data/prepare_job.h"
#include "data/reader.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

Tokenizer *data_tokenizer_make(const TokenizerSpec *ts)
{
    char err[CFG_ERR];
    if (strcmp(ts->name, "byte") == 0)
        return tokenizer_byte();
    Tokenizer *t;
    if (strcmp(ts->name, "sentencepiece") == 0) {
        t = tokenizer_sentencepiece(ts->model, err);
    } else if (strcmp(ts->name, "hf") == 0) {
        t = tokenizer_hf_json(ts->model, err);
    } else if (strcmp(ts->name, "tiktoken") == 0) {
        char rel[512], rbuf[4096];
        const char *ranks = ts->ranks;
        if (!ranks) {
            snprintf(rel, sizeof rel, DATA_TIKTOKEN_DIR_DEFAULT "/%s.tiktoken", ts->encoding);
            ranks = inputs_repo_file(rel, rbuf, sizeof rbuf);
        }
        t = tokenizer_tiktoken(ranks, ts->encoding, err);
    } else {
        char vbuf[4096], mbuf[4096];
        const char *vocab = inputs_repo_file(ts->vocab, vbuf, sizeof vbuf);
        const char *merges = inputs_repo_file(ts->merges, mbuf, sizeof mbuf);
        t = tokenizer_gpt2(vocab, merges, err);
    }
    if (!t)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    return t;
}

Tokenizer *data_tokenizer_named(const char *name, char *err)
{
    if (!strcmp(name, "byte"))
        return tokenizer_byte();
    if (!strcmp(name, "gpt2")) {
        char vbuf[4096], mbuf[4096];
        return tokenizer_gpt2(inputs_repo_file(DATA_GPT2_ENCODER_DEFAULT, vbuf, sizeof vbuf),
                              inputs_repo_file(DATA_GPT2_MERGES_DEFAULT, mbuf, sizeof mbuf), err);
    }
    if (!strcmp(name, "cl100k_base") || !strcmp(name, "o200k_base")) {
        char rel[512], rbuf[4096];
        snprintf(rel, sizeof rel, DATA_TIKTOKEN_DIR_DEFAULT "/%s.tiktoken", name);
        return tokenizer_tiktoken(inputs_repo_file(rel, rbuf, sizeof rbuf), name, err);
    }
    size_t n = strlen(name);
    if (n > 6 && !strcmp(name + n - 6, ".model"))
        return tokenizer_sentencepiece(name, err);
    if (n > 5 && !strcmp(name + n - 5, ".json"))
        return tokenizer_hf_json(name, err);
    snprintf(err, CFG_ERR,
             "unknown tokenizer '%s' (byte, gpt2, cl100k_base, o200k_base, a SentencePiece "
             "FILE.model or a Hugging Face tokenizer.json)",
             name);
    return NULL;
}

/* Refuse a directory given as a file (stdin "-" is fine). */
static void check_not_dir(const char *path)
{
    struct stat st;
    if (strcmp(path, "-") && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        trd_fatal(TRD_EXIT_INPUT, "pass the files, e.g. DIR/*", "%s is a directory", path);
}

/* Whole file (or stdin for "-"), decompressed, into memory; exits with a
 * message on error. */
char *data_read_input(const char *path, size_t *len)
{
    char err[TRD_ERR];
    check_not_dir(path);
    DataReader *r = reader_open(path, err);
    if (!r)
        trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "%s", err);
    char *text = reader_slurp(r, len, err);
    if (!text)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s: %s", path, err);
    reader_close(r);
    return text;
}

/* Every input must be a readable file before any output is created; the
 * total of their sizes is what the progress line's ETA counts down. */
static uint64_t check_inputs(const PrepareArgs *a, InputList *docs)
{
    uint64_t total = 0;
    inputs_expand(docs, a->inputs, a->n_inputs, a->ext);
    for (size_t d = 0; d < docs->n; d++) {
        const char *p = docs->paths[d];
        struct stat st;
        if (strcmp(p, "-") && access(p, R_OK) != 0)
            trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "cannot read %s: %s", p,
                      strerror(errno));
        check_not_dir(p);
        if (strcmp(p, "-") && stat(p, &st) == 0)
            total += (uint64_t)st.st_size;
    }
    return total;
}

/* mkdir -p of the directory part of a prefix. */
static void make_parent_dirs(const char *prefix)
{
    char dir[CFG_STR];
    snprintf(dir, sizeof dir, "%s", prefix);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0777) != 0 && errno != EEXIST)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot create directory %s: %s", dir,
                      strerror(errno));
        *p = '/';
    }
}

/* One output dataset (train or val) in either format. */
typedef struct {
    char prefix[CFG_STR];
    int llmc;
    DatasetWriter *w; /* megatron */
    int32_t *all;     /* llmc: every token, written at the end */
    FILE *mask;       /* --template: PREFIX.mask.tmp, a byte per token */
    size_t n_all, cap_all;
    uint64_t docs, tokens;
} Output;

static void output_open(Output *o, const char *prefix, int llmc, int token_bytes)
{
    char err[CFG_ERR];
    memset(o, 0, sizeof *o);
    if (strlen(prefix) + 9 > CFG_STR)
        trd_fatal(TRD_EXIT_INPUT, NULL, "--out prefix too long (max %d bytes): %s", CFG_STR - 9,
                  prefix);
    snprintf(o->prefix, sizeof o->prefix, "%s", prefix);
    o->llmc = llmc;
    if (!llmc && !(o->w = dataset_writer_open(prefix, token_bytes, err)))
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
}

/* The loss mask beside a Megatron dataset: PREFIX.mask (docs/data.md). */
static void output_open_mask(Output *o)
{
    char path[CFG_STR + 16];
    snprintf(path, sizeof path, "%s.mask.tmp", o->prefix);
    if (!(o->mask = fopen(path, "wb")))
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot create %s: %s", path, strerror(errno));
}

static void output_add(Output *o, const int32_t *ids, const uint8_t *mask, size_t n)
{
    char err[CFG_ERR];
    if (o->mask && fwrite(mask, 1, n, o->mask) != n)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot write %s.mask.tmp: %s", o->prefix,
                  strerror(errno));
    if (!o->llmc) {
        if (dataset_writer_add(o->w, ids, n, err) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
    } else {
        if (o->n_all + n > o->cap_all) {
            size_t c = o->cap_all ? o->cap_all : 1 << 16;
            while (c < o->n_all + n)
                c *= 2;
            int32_t *p = realloc(o->all, c * sizeof *p);
            if (!p)
                trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory collecting %s tokens", o->prefix);
            o->all = p;
            o->cap_all = c;
        }
        memcpy(o->all + o->n_all, ids, n * sizeof *ids);
        o->n_all += n;
    }
    o->docs++;
    o->tokens += n;
}

/* The mask under its name, before the dataset's .idx makes the dataset
 * visible: a reader never sees the dataset without its mask. */
static void output_publish_mask(Output *o)
{
    char tmp[CFG_STR + 16], path[CFG_STR + 16];
    if (!o->mask)
        return;
    snprintf(tmp, sizeof tmp, "%s.mask.tmp", o->prefix);
    snprintf(path, sizeof path, "%s.mask", o->prefix);
    if (fclose(o->mask) != 0 || rename(tmp, path) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot write %s: %s", path, strerror(errno));
}

static void output_close(Output *o, const char *label)
{
    char err[CFG_ERR], path[CFG_STR + 8];
    output_publish_mask(o);
    snprintf(path, sizeof path, "%s.bin", o->prefix);
    int rc =
        o->llmc ? dataset_write_llmc(path, o->all, o->n_all, err) : dataset_writer_close(o->w, err);
    if (rc != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
    free(o->all);
    printf("  %-5s %s%s: %llu documents, %llu tokens\n", label, o->prefix,
           o->llmc   ? ".bin"
           : o->mask ? ".{bin,idx,mask}"
                     : ".{bin,idx}",
           (unsigned long long)o->docs, (unsigned long long)o->tokens);
}

/* Whether a file is JSON lines: by its name (.jsonl or .json, before a
 * .gz or .zst) unless --input-format says. */
static int is_jsonl(const char *path, const char *input_format)
{
    if (strcmp(input_format, "auto"))
        return strcmp(input_format, "jsonl") == 0;
    size_t n = strlen(path);
    if (reader_codec(path) == READER_GZIP)
        n -= 3;
    else if (reader_codec(path) == READER_ZSTD)
        n -= 4;
    return (n > 6 && !strncmp(path + n - 6, ".jsonl", 6)) ||
           (n > 5 && !strncmp(path + n - 5, ".json", 5));
}

enum { BAD_SHOWN = 5 };

/* The state of one prepare-data run. */
typedef struct {
    const PrepareArgs *a;
    Tokenizer *tok;
    int check_utf8; /* BPE tokenizers: text must be UTF-8 */
    Output train, val;
    uint64_t docs, bytes_text; /* documents taken; their text bytes */
    uint64_t bad;              /* bad documents skipped (--skip-bad) */
    char bad_first[BAD_SHOWN][TRD_ERR];
    int32_t *ids;
    size_t cap;
    double t0, t_encode, t_last;
    uint64_t total_bytes, done_bytes; /* file bytes (compressed) of all / finished inputs */
    int progress, tty;
    /* --workers N > 1: documents are collected into a batch, checked and
     * tokenized by N threads (a tokenizer each: the BPE word caches are
     * not shared), then written in input order, so the dataset and the
     * first error are those of one worker. */
    int workers;
    Tokenizer **toks;
    struct PendingDoc *batch;
    size_t n_batch, cap_batch, batch_bytes;
    /* One rank of an MPI job (prepare_job.h): its documents go to a spool
     * (train), the split comes later.  A bad document ends the job once
     * every rank has stopped (stop: this one or another failed). */
    PrepJob *job;
    uint64_t sums[PREP_COUNTERS]; /* the job's totals, as last summed */
    int stop, failed;
    char fail_msg[TRD_ERR];
    /* --template: examples rendered with a chat template, with their mask. */
    ChatTemplate *chat;
    ChatTokens chat_x;
    uint64_t trained;             /* tokens of mask 1 */
    const char *part_path;        /* this rank's share starts inside this file ... */
    uint64_t part_lo, part_lines; /* ... at this byte, after this many lines */
    int part_counted;
} Prep;

typedef struct PendingDoc {
    char *text; /* owned copy */
    size_t len;
    const char *file;
    uint64_t line;
    int text_file, oom;
    size_t bad_at; /* first ill-formed UTF-8 byte, or len */
    int32_t *ids;
    size_t n, cap;
} PendingDoc;

enum { BATCH_DOCS = 4096, BATCH_BYTES = 32 << 20 };

/* A run that stops on bad input leaves no partial file behind: the
 * megatron writers' PREFIX.bin.tmp (the .idx is written at the end). */
static void discard_outputs(const Prep *p)
{
    char path[CFG_STR + 16];
    const Output *o[2] = {&p->train, &p->val};
    for (int i = 0; i < 2; i++) {
        if (!o[i]->prefix[0] || o[i]->llmc)
            continue;
        snprintf(path, sizeof path, "%s.bin.tmp", o[i]->prefix);
        unlink(path);
        snprintf(path, sizeof path, "%s.mask.tmp", o[i]->prefix);
        unlink(path);
    }
}

static void flush_batch(Prep *p);

/* The line number a line of `file` counts from: past the lines before this
 * rank's share when the share starts inside the file (counted the first
 * time a message needs them; a part counts its own lines from 1). */
static uint64_t line_base(Prep *p, const char *file)
{
    char err[TRD_ERR];
    if (file != p->part_path)
        return 0;
    if (!p->part_counted && reader_count_lines(file, p->part_lo, &p->part_lines, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    p->part_counted = 1;
    return p->part_lines;
}

/* A bad document at file:line: an error (exit 2), or with --skip-bad one
 * more to count and maybe show.  Queued documents (--workers) come first,
 * so errors and counts are in input order. */
__attribute__((format(printf, 4, 5))) static void bad_doc(Prep *p, const char *file, uint64_t line,
                                                          const char *fmt, ...)
{
    char what[TRD_ERR / 2];
    if (p->n_batch)
        flush_batch(p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    line += line_base(p, file);
    if (!p->a->skip_bad && p->job) { /* reported when all ranks stopped */
        snprintf(p->fail_msg, sizeof p->fail_msg, "%s:%llu: %s", file, (unsigned long long)line,
                 what);
        p->failed = p->stop = 1;
        return;
    }
    if (!p->a->skip_bad) {
        discard_outputs(p);
        trd_fatal(TRD_EXIT_INPUT, "fix the input, or pass --skip-bad to skip bad documents",
                  "%s:%llu: %s", file, (unsigned long long)line, what);
    }
    if (p->bad < BAD_SHOWN)
        snprintf(p->bad_first[p->bad], TRD_ERR, "%s:%llu: %s", file, (unsigned long long)line,
                 what);
    p->bad++;
}

static void format_duration(double s, char *out, size_t n)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(out, n, "%lds", t);
}

/* "documents, MiB, throughput, ETA" at most every 2 s and once at the end;
 * on a terminal one line, rewritten.  In an MPI job, rank 0 prints the
 * job's totals as last summed (at most half a second old; at the end,
 * exact). */
static void progress(Prep *p, uint64_t file_bytes_now, int last)
{
    double t = now_s();
    uint64_t docs = p->docs, bytes = p->done_bytes + file_bytes_now;
    uint64_t tokens = p->train.tokens + p->val.tokens;
    if (p->job) {
        uint64_t mine[PREP_COUNTERS] = {docs, bytes, tokens, 0, (uint64_t)p->failed};
        if (!last && prep_job_poll(p->job, mine, p->sums))
            p->stop = 1;
        if (prep_job_rank(p->job) != 0)
            return;
        docs = p->sums[PREP_DOCS];
        bytes = p->sums[PREP_BYTES];
        tokens = p->sums[PREP_TOKENS];
    }
    if (!p->progress || (!last && t - p->t_last < 2.0))
        return;
    p->t_last = t;
    double el = t - p->t0, done = (double)bytes;
    char eta[32] = "";
    if (p->total_bytes && done > 0 && !last) {
        char d[24];
        format_duration(el * ((double)p->total_bytes - done) / done, d, sizeof d);
        snprintf(eta, sizeof eta, ", ETA %s", d);
    }
    /* One write of the whole line: under mpiexec, stdout and stderr reach
     * the same file through separate pipes, and a line written in pieces
     * came out with the summary's stdout in its middle. */
    char total[64] = " MiB";
    if (p->total_bytes)
        snprintf(total, sizeof total, " / %.1f MiB (%.0f%%)", trd_mib(p->total_bytes),
                 100.0 * done / (double)p->total_bytes);
    fprintf(stderr, "%sprepare-data: %llu documents, %.1f%s, %.1f MiB/s, %.0f tokens/s%s%s%s",
            p->tty ? "\r" : "", (unsigned long long)docs, trd_mib((size_t)done), total,
            el > 0 ? trd_mib((size_t)done) / el : 0.0, el > 0 ? (double)tokens / el : 0.0, eta,
            p->tty && !last ? "\033[K" : "\n", last && p->tty ? "\n" : "");
    fflush(stderr);
}

/* Invalid UTF-8 in a document (the position of the first bad byte). */
static void bad_utf8(Prep *p, const char *text, size_t at, const char *file, uint64_t line,
                     int text_file)
{
    for (size_t i = 0; text_file && i < at; i++)
        line += text[i] == '\n';
    bad_doc(p, file, line, "invalid UTF-8 (byte 0x%02X at byte %zu of the %s)",
            (unsigned char)text[at], at, text_file ? "file" : "text");
}

/* Append EOT to a document's ids and write them to its split. */
static void commit_doc(Prep *p, int32_t **ids, size_t n, size_t *cap, size_t len, const char *file)
{
    /* EOT after each document: grow by hand, encode never emits it. */
    if (n == *cap) {
        *cap = *cap ? 2 * *cap : 1024;
        int32_t *q = realloc(*ids, *cap * sizeof *q);
        if (!q)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory tokenizing %s", file);
        *ids = q;
    }
    (*ids)[n++] = tokenizer_eot(p->tok);
    long k = p->job ? 0 : p->a->val_every; /* a rank's spool: split later */
    int to_val = k && (long)(p->docs % (uint64_t)k) == k - 1;
    output_add(to_val ? &p->val : &p->train, *ids, NULL, n);
    p->docs++;
    p->bytes_text += len;
}

/* --template: one example, rendered with its mask, to its split. */
static void add_example(Prep *p, const cJSON *j, size_t len, const char *file, uint64_t line)
{
    char err[CFG_ERR];
    ChatTokens *x = &p->chat_x;
    double te = now_s();
    int rc = chat_render(p->chat, p->tok, j, x, err);
    p->t_encode += now_s() - te;
    if (rc == -2)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory tokenizing %s:%llu", file,
                  (unsigned long long)line);
    if (rc != 0) {
        bad_doc(p, file, line, "%s", err);
        return;
    }
    long k = p->job ? 0 : p->a->val_every; /* a rank's spool: split later */
    int to_val = k && (long)(p->docs % (uint64_t)k) == k - 1;
    output_add(to_val ? &p->val : &p->train, x->ids, x->mask, x->n);
    for (size_t i = 0; i < x->n; i++)
        p->trained += x->mask[i];
    p->docs++;
    p->bytes_text += len;
}

/* Check and tokenize the batch on the workers, then write it in order. */
static void flush_batch(Prep *p)
{
    const int check = p->check_utf8;
    const long nb = (long)p->n_batch;
    double te = now_s();
#pragma omp parallel for schedule(dynamic, 1) num_threads(p->workers)
    for (long i = 0; i < nb; i++) {
        PendingDoc *d = &p->batch[i];
        Tokenizer *t = p->toks[omp_get_thread_num()];
        d->bad_at = check ? unicode_invalid_at((const unsigned char *)d->text, d->len) : d->len;
        if (d->bad_at == d->len)
            d->oom = tokenizer_encode(t, d->text, d->len, &d->ids, &d->n, &d->cap) != 0;
    }
    p->t_encode += now_s() - te;
    /* Emptied first: a bad document below calls bad_doc, which flushes. */
    p->n_batch = 0;
    p->batch_bytes = 0;
    for (long i = 0; i < nb; i++) {
        PendingDoc *d = &p->batch[i];
        if (p->stop)
            ; /* after a bad document: one worker would not have gone on */
        else if (d->bad_at < d->len)
            bad_utf8(p, d->text, d->bad_at, d->file, d->line, d->text_file);
        else if (d->oom)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory tokenizing %s:%llu", d->file,
                      (unsigned long long)d->line);
        else
            commit_doc(p, &d->ids, d->n, &d->cap, d->len, d->file);
        free(d->text);
        free(d->ids);
    }
}

/* One document: check, tokenize, append EOT, write to its split (with
 * --workers, queue it for the next batch). */
static void add_doc(Prep *p, const char *text, size_t len, const char *file, uint64_t line,
                    int text_file)
{
    if (p->stop)
        return;
    if (p->workers > 1) {
        if (p->n_batch == p->cap_batch) {
            p->cap_batch = p->cap_batch ? 2 * p->cap_batch : 256;
            PendingDoc *b = realloc(p->batch, p->cap_batch * sizeof *b);
            if (!b)
                trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory queueing documents");
            p->batch = b;
        }
        PendingDoc *d = &p->batch[p->n_batch++];
        memset(d, 0, sizeof *d);
        d->text = trd_malloc(len + 1, "a document");
        memcpy(d->text, text, len);
        d->len = len;
        d->file = file;
        d->line = line;
        d->text_file = text_file;
        p->batch_bytes += len;
        if (p->n_batch >= BATCH_DOCS || p->batch_bytes >= BATCH_BYTES)
            flush_batch(p);
        return;
    }
    if (p->check_utf8) {
        size_t at = unicode_invalid_at((const unsigned char *)text, len);
        if (at < len) {
            bad_utf8(p, text, at, file, line, text_file);
            return;
        }
    }
    size_t n = 0;
    double te = now_s();
    if (tokenizer_encode(p->tok, text, len, &p->ids, &n, &p->cap) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory tokenizing %s:%llu", file,
                  (unsigned long long)line);
    p->t_encode += now_s() - te;
    commit_doc(p, &p->ids, n, &p->cap, len, file);
}

/* A text file: one document, read whole (decompressed). */
static void add_text_file(Prep *p, const char *path)
{
    char err[TRD_ERR];
    size_t len;
    DataReader *r = reader_open(path, err);
    if (!r) {
        discard_outputs(p);
        trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "%s", err);
    }
    char *text = reader_slurp(r, &len, err);
    if (text)
        add_doc(p, text, len, path, 1, 1);
    else /* a corrupt or truncated compressed file: no partial document */
        bad_doc(p, path, 1, "%s", err);
    p->done_bytes += reader_file_bytes(r);
    reader_close(r);
    free(text);
    progress(p, 0, 0);
}

/* Whether s[0..n) is only spaces, tabs and CRs (lines are not NUL-terminated). */
static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    return 1;
}

static const char *json_type(const cJSON *v)
{
    return cJSON_IsNumber(v)   ? "a number"
           : cJSON_IsBool(v)   ? "a boolean"
           : cJSON_IsNull(v)   ? "null"
           : cJSON_IsArray(v)  ? "an array"
           : cJSON_IsObject(v) ? "an object"
                               : "not a string";
}

/* A JSON lines file: one document per line, the string at --json-key;
 * blank lines are skipped.  Streamed: one line in memory at a time.  u:
 * NULL for the whole file, or a rank's share of it. */
static void add_jsonl_file(Prep *p, const char *path, const PrepUnit *u)
{
    char err[TRD_ERR];
    const char *key = p->a->json_key, *line;
    size_t len;
    uint64_t lineno = 0;
    int rc = 0;
    DataReader *r =
        u && u->part ? reader_open_range(path, u->lo, u->hi, err) : reader_open(path, err);
    if (!r) {
        discard_outputs(p);
        trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "%s", err);
    }
    while (!p->stop && (rc = reader_line(r, &line, &len, err)) > 0) {
        lineno++;
        if (blank(line, len))
            continue;
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(line, len, &end, 0);
        if (!j) {
            const char *at = cJSON_GetErrorPtr();
            size_t col = at && at >= line && at <= line + len ? (size_t)(at - line) : 0;
            bad_doc(p, path, lineno, "malformed JSON (at byte %zu of the line)", col);
        } else if (end && !blank(end, (size_t)(line + len - end))) {
            bad_doc(p, path, lineno, "text after the JSON value (at byte %zu of the line)",
                    (size_t)(end - line));
        } else if (!cJSON_IsObject(j)) {
            bad_doc(p, path, lineno, "not a JSON object (%s)", json_type(j));
        } else if (p->chat) {
            if (p->check_utf8 && unicode_invalid_at((const unsigned char *)line, len) < len)
                bad_utf8(p, line, unicode_invalid_at((const unsigned char *)line, len), path,
                         lineno, 0);
            else
                add_example(p, j, len, path, lineno);
        } else {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
            if (!v)
                bad_doc(p, path, lineno, "no key \"%s\"", key);
            else if (!cJSON_IsString(v) || !v->valuestring)
                bad_doc(p, path, lineno, "\"%s\" is %s, not a string", key, json_type(v));
            else
                add_doc(p, v->valuestring, strlen(v->valuestring), path, lineno, 0);
        }
        cJSON_Delete(j);
        progress(p, reader_file_bytes(r), 0);
    }
    if (!p->stop && rc < 0) /* read error, corrupt or truncated stream: the rest is lost */
        bad_doc(p, path, lineno + 1, "%s", err);
    p->done_bytes += reader_file_bytes(r);
    reader_close(r);
}

/* llm.c shards hold uint16 tokens. */
static void check_format(const PrepareArgs *a, const Tokenizer *tok)
{
    if (!strcmp(a->format, "llmc") && dataset_token_bytes_for_vocab(tokenizer_vocab(tok)) != 2)
        trd_fatal(TRD_EXIT_INPUT, "use --format megatron",
                  "llm.c shards hold uint16 tokens; vocabulary %d does not fit",
                  tokenizer_vocab(tok));
}

/* An MPI rank's share of the input, in order. */
static void add_share(Prep *p, const InputList *docs)
{
    const char *fmt = p->a->input_format;
    unsigned char *splittable = trd_calloc(docs->n + 1, 1, "the input kinds");
    for (size_t f = 0; f < docs->n; f++)
        splittable[f] =
            reader_codec(docs->paths[f]) == READER_PLAIN && is_jsonl(docs->paths[f], fmt);
    PrepUnit *u;
    size_t n = prep_job_units(p->job, docs, splittable, &u);
    for (size_t i = 0; i < n && !p->stop; i++) {
        const char *path = docs->paths[u[i].file];
        if (u[i].part && u[i].lo > 0) { /* the first piece only */
            p->part_path = path;
            p->part_lo = u[i].lo;
        }
        if (is_jsonl(path, fmt))
            add_jsonl_file(p, path, &u[i]);
        else if (p->chat)
            bad_doc(p, path, 1, "--template reads JSON lines of examples, this is a text file");
        else
            add_text_file(p, path);
    }
    free(u);
    free(splittable);
}

/* An MPI rank's end: wait for every rank, then all fail together (exit 2,
 * the first bad document's message, no file left), or write the outputs
 * from the spools and take the job's totals for the report. */
static void finish_job(Prep *p, int llmc, int token_bytes)
{
    char err[CFG_ERR];
    uint64_t mine[PREP_COUNTERS] = {p->docs, p->done_bytes, p->train.tokens, 1,
                                    (uint64_t)p->failed};
    prep_job_finish(p->job, mine, p->sums);
    if (p->sums[PREP_FAILED]) {
        discard_outputs(p);
        prep_job_fail(p->job, p->failed, p->fail_msg,
                      "fix the input, or pass --skip-bad to skip bad documents");
    }
    char spool[CFG_STR];
    snprintf(spool, sizeof spool, "%s", p->train.prefix);
    output_publish_mask(&p->train);
    if (dataset_writer_close(p->train.w, err) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
    PrepWrite w = {p->a->out,    spool,           llmc,           token_bytes,
                   p->a->shards, p->a->val_every, p->chat != NULL};
    PrepSplit split[2] = {{0, 0}, {0, 0}};
    prep_job_write(p->job, &w, split);

    /* The report: the job's totals; the first bad documents in input order. */
    const int rank = prep_job_rank(p->job), size = prep_job_size(p->job);
    char shown[BAD_SHOWN][TRD_ERR];
    int mine_shown = p->bad < BAD_SHOWN ? (int)p->bad : BAD_SHOWN;
    p->bad =
        prep_job_bad(p->job, p->bad, p->bad_first[0], mine_shown, TRD_ERR, shown[0], BAD_SHOWN);
    if (rank == 0)
        memcpy(p->bad_first, shown, sizeof shown);
    p->docs = p->sums[PREP_DOCS];
    p->bytes_text = prep_job_sum(p->job, p->bytes_text);
    p->t_encode = prep_job_max(p->job, p->t_encode);
    p->trained = prep_job_sum(p->job, p->trained);
    Output *o[2] = {&p->train, &p->val};
    for (int s = 0; s < (p->a->val_every ? 2 : 1); s++) {
        Output *out = o[s];
        out->docs = split[s].docs;
        out->tokens = split[s].tokens;
        if (rank != 0)
            continue;
        char name[CFG_STR + 24];
        snprintf(name, sizeof name, "%s%s", p->a->out, s ? "_val" : "");
        if (p->a->shards)
            printf("  %-5s %s-{%05d..%05d}-of-%05d%s: %llu documents, %llu tokens\n",
                   s ? "val" : "train", name, 0, size - 1, size, llmc ? ".bin" : ".{bin,idx}",
                   (unsigned long long)out->docs, (unsigned long long)out->tokens);
        else
            printf("  %-5s %s%s: %llu documents, %llu tokens\n", s ? "val" : "train", name,
                   llmc ? ".bin" : ".{bin,idx}", (unsigned long long)out->docs,
                   (unsigned long long)out->tokens);
    }
}

/* --template: the template, and the combinations it does not take. */
static void setup_chat(Prep *p, ChatTemplate *chat, int llmc, int rank0)
{
    char err[CFG_ERR], unmapped[256];
    const PrepareArgs *a = p->a;
    if (llmc)
        trd_fatal(TRD_EXIT_INPUT, "use --format megatron",
                  "--template writes a loss mask beside a Megatron dataset; llm.c shards have "
                  "no place for it");
    if (chat_template_load(chat, a->chat_template, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, "see docs/data.md, \"Instruction and chat data\"", "%s", err);
    p->chat = chat;
    chat_template_unmapped(chat, p->tok, unmapped, sizeof unmapped);
    if (rank0)
        printf("  template %s: examples {\"prompt\", \"completion\"} or {\"messages\"}, loss mask "
               "in PREFIX.mask%s%s%s\n",
               chat->name,
               unmapped[0] ? "; not special tokens of this tokenizer (encoded as text): " : "",
               unmapped, a->workers > 1 ? "; one worker (--workers is for text)" : "");
}

int data_prepare(const PrepareArgs *args)
{
    const PrepareArgs a = *args;
    InputList docs;
    Prep p;
    memset(&p, 0, sizeof p);
    p.a = &a;
    /* Under mpiexec, rank 0 checks the inputs and the tokenizer's files
     * before the others start, so that a mistake is one message. */
    p.job = prep_job_start();
    const int rank0 = !p.job || prep_job_rank(p.job) == 0;
    if (rank0)
        p.total_bytes = check_inputs(&a, &docs);
    TokenizerSpec ts = {a.tokenizer, a.vocab, a.merges, a.encoding, a.ranks, a.model};
    if (rank0) {
        p.tok = data_tokenizer_make(&ts);
        check_format(&a, p.tok);
    }
    if (p.job)
        prep_job_share(p.job, &docs, &p.total_bytes);
    if (!p.tok)
        p.tok = data_tokenizer_make(&ts);
    p.workers = (int)a.workers;
    p.toks = trd_calloc((size_t)p.workers, sizeof *p.toks, "the tokenizers");
    p.toks[0] = p.tok;
    /* The other workers' copies load at once (0.1-0.25 s each for the BPE
     * tables): one after another they would add up before any encoding. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(p.workers)
    for (int w = 1; w < p.workers; w++)
        p.toks[w] = data_tokenizer_make(&ts);
    p.check_utf8 = strcmp(a.tokenizer, "byte") != 0;
    p.tty = isatty(STDERR_FILENO);
    p.progress = a.progress || p.tty;
    int llmc = strcmp(a.format, "llmc") == 0;
    int token_bytes = dataset_token_bytes_for_vocab(tokenizer_vocab(p.tok));
    if (rank0)
        printf("prepare-data: %s tokenizer (vocab %d, EOT %d), %s format, %s tokens\n",
               tokenizer_name(p.tok), tokenizer_vocab(p.tok), tokenizer_eot(p.tok), a.format,
               token_bytes == 2 ? "uint16" : "int32");
    if (p.job && rank0)
        printf("  %d ranks (MPI), --workers %d each%s\n", prep_job_size(p.job), p.workers,
               a.shards ? ", a shard each (--shards)" : "");
    fflush(stdout);
    make_parent_dirs(a.out);
    char train_prefix[CFG_STR + 24], val_prefix[CFG_STR + 24];
    if (a.shards && !p.job) { /* one process: one shard */
        char val_out[CFG_STR + 8];
        snprintf(val_out, sizeof val_out, "%s_val", a.out);
        prep_shard_prefix(train_prefix, sizeof train_prefix, a.out, 0, 1);
        prep_shard_prefix(val_prefix, sizeof val_prefix, val_out, 0, 1);
    } else {
        snprintf(train_prefix, sizeof train_prefix, "%s", a.out);
        snprintf(val_prefix, sizeof val_prefix, "%s_val", a.out);
    }
    if (p.job) /* this rank's spool: every document, split when all are counted */
        snprintf(train_prefix, sizeof train_prefix, "%s.rank%05d.tmp", a.out, prep_job_rank(p.job));
    output_open(&p.train, train_prefix, p.job ? 0 : llmc, token_bytes);
    if (a.val_every && !p.job)
        output_open(&p.val, val_prefix, llmc, token_bytes);

    ChatTemplate chat;
    if (a.chat_template) {
        setup_chat(&p, &chat, llmc, rank0);
        output_open_mask(&p.train);
        if (a.val_every && !p.job)
            output_open_mask(&p.val);
    }

    p.t0 = p.t_last = now_s();
    if (p.job)
        add_share(&p, &docs);
    for (size_t f = 0; f < docs.n && !p.job; f++) {
        if (p.chat && !is_jsonl(docs.paths[f], a.input_format)) {
            discard_outputs(&p);
            trd_fatal(TRD_EXIT_INPUT, "give JSON lines files (.jsonl), or --input-format jsonl",
                      "%s: --template reads JSON lines of examples, this is a text file",
                      docs.paths[f]);
        }
        if (is_jsonl(docs.paths[f], a.input_format))
            add_jsonl_file(&p, docs.paths[f], NULL);
        else
            add_text_file(&p, docs.paths[f]);
    }
    if (p.n_batch)
        flush_batch(&p);
    if (p.job)
        finish_job(&p, llmc, token_bytes);
    progress(&p, 0, 1);
    free(p.ids);
    free(p.batch);
    if (!rank0) {
        if (p.chat) {
            chat_template_free(p.chat);
            chat_tokens_free(&p.chat_x);
        }
        for (int w = 0; w < p.workers; w++)
            tokenizer_free(p.toks[w]);
        free(p.toks);
        inputs_free(&docs);
        return TRD_EXIT_OK;
    }
    if (!p.job)
        output_close(&p.train, "train");
    if (a.val_every && !p.job)
        output_close(&p.val, "val");
    if (a.val_every && p.val.docs == 0)
        fprintf(stderr,
                "prepare-data: warning: the validation split %s is empty: --val-every "
                "%ld puts every %ld-th document there, and there are %llu; use a smaller "
                "--val-every\n",
                val_prefix, a.val_every, a.val_every, (unsigned long long)p.docs);
    if (p.train.docs == 0)
        fprintf(stderr, "prepare-data: warning: the training split %s is empty\n", a.out);
    if (p.bad) {
        fprintf(stderr, "prepare-data: skipped %llu bad document%s (--skip-bad)%s\n",
                (unsigned long long)p.bad, p.bad == 1 ? "" : "s",
                p.bad > BAD_SHOWN ? "; the first:" : ":");
        for (uint64_t i = 0; i < p.bad && i < BAD_SHOWN; i++)
            fprintf(stderr, "  %s\n", p.bad_first[i]);
    }
    double dt = now_s() - p.t0;
    uint64_t tokens = p.train.tokens + (a.val_every ? p.val.tokens : 0);
    printf("  read %zu files, %llu documents, %.2f MiB of text; %llu tokens in %.2f s "
           "(encoding %.2f s: %.2f MiB/s, %.0f tokens/s)\n",
           docs.n, (unsigned long long)p.docs, trd_mib(p.bytes_text), (unsigned long long)tokens,
           dt, p.t_encode, p.t_encode > 0 ? trd_mib(p.bytes_text) / p.t_encode : 0.0,
           p.t_encode > 0 ? (double)tokens / p.t_encode : 0.0);
    if (p.bad)
        printf("  skipped %llu bad documents\n", (unsigned long long)p.bad);
    if (p.chat) {
        printf("  loss mask: %llu of %llu tokens trained (mask 1)\n", (unsigned long long)p.trained,
               (unsigned long long)tokens);
        chat_template_free(p.chat);
        chat_tokens_free(&p.chat_x);
    }
    for (int w = 0; w < p.workers; w++)
        tokenizer_free(p.toks[w]);
    free(p.toks);
    inputs_free(&docs);
    return TRD_EXIT_OK;
}
