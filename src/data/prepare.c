#include "data/prepare.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/inputs.h"
#include "data/tokenizer.h"

static const char prepare_usage[] =
    "usage: trident prepare-data --input PATH [PATH ...] [--ext EXT[,EXT]]\n"
    "                            --tokenizer byte|gpt2 [--vocab encoder.json --merges vocab.bpe]\n"
    "                            --out PREFIX [--format megatron|llmc] [--val-every K]\n"
    "\n"
    "Tokenize text files into a training dataset.  Each input file is one document;\n"
    "its tokens are followed by the EOT token.\n"
    "\n"
    "  --input PATH ...   text files (UTF-8), one document each; directories (walked\n"
    "                     recursively, in name order) and quoted glob patterns\n"
    "                     ('corpus/*.txt') are expanded; may be repeated\n"
    "  --ext EXT[,EXT]    take only files with these extensions from directories and\n"
    "                     patterns (e.g. txt,md); files named explicitly are always taken\n"
    "  --tokenizer NAME   byte (ids 0..255 + EOT 256) or gpt2 (GPT-2 BPE, vocab 50257)\n"
    "  --vocab FILE       GPT-2 encoder.json (default " DATA_GPT2_ENCODER_DEFAULT ",\n"
    "                     from the current directory, else from trident's source tree)\n"
    "  --merges FILE      GPT-2 vocab.bpe (default " DATA_GPT2_MERGES_DEFAULT ")\n"
    "  --out PREFIX       megatron: writes PREFIX.bin + PREFIX.idx; llmc: writes PREFIX.bin\n"
    "  --format FMT       megatron (default) or llmc (llm.c shard, uint16 tokens)\n"
    "  --val-every K      every K-th document (index % K == K-1) goes to PREFIX_val\n"
    "  --help             this text\n";

static const char tokenize_usage[] =
    "usage: trident tokenize [--tokenizer byte|gpt2] [--vocab encoder.json --merges vocab.bpe] FILE|-\n"
    "\n"
    "Print the token ids of a file (or stdin for -), space-separated on one line.\n"
    "The tokenizer defaults to gpt2, its files to those scripts/get_corpus.sh installs.\n";

typedef struct {
    const char *tokenizer, *vocab, *merges, *out, *format, *ext;
    const char **inputs;
    int n_inputs;
    long val_every;
    InputList docs;             /* the inputs expanded: one document each */
} PrepareArgs;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage_error(const char *cmd, const char *usage, const char *fmt, const char *arg)
{
    fprintf(stderr, "trident %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n---> see `trident %s --help`\n\n%s", cmd, usage);
    return TRD_EXIT_INPUT;
}

/* Value of an option that takes one; NULL when it is missing. */
static const char *option_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)
        return NULL;
    return argv[++*i];
}

/* Parse prepare-data's arguments; returns -1 after --help, else an exit
 * code (0 when args is filled). */
static int parse_prepare(int argc, char **argv, PrepareArgs *a)
{
    const char *cmd = "prepare-data";
    memset(a, 0, sizeof *a);
    a->vocab = DATA_GPT2_ENCODER_DEFAULT;
    a->merges = DATA_GPT2_MERGES_DEFAULT;
    a->format = "megatron";
    a->inputs = calloc((size_t)argc, sizeof *a->inputs);
    if (!a->inputs)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory parsing arguments");
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], **dst = NULL, *v;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            fputs(prepare_usage, stdout);
            return -1;
        }
        if (strcmp(o, "--input") == 0) {
            int before = a->n_inputs;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                a->inputs[a->n_inputs++] = argv[++i];
            if (a->n_inputs == before)
                return usage_error(cmd, prepare_usage, "%s needs at least one file", o);
            continue;
        }
        if (strcmp(o, "--tokenizer") == 0) dst = &a->tokenizer;
        else if (strcmp(o, "--vocab") == 0) dst = &a->vocab;
        else if (strcmp(o, "--merges") == 0) dst = &a->merges;
        else if (strcmp(o, "--out") == 0) dst = &a->out;
        else if (strcmp(o, "--format") == 0) dst = &a->format;
        else if (strcmp(o, "--ext") == 0) dst = &a->ext;
        else if (strcmp(o, "--val-every") != 0)
            return usage_error(cmd, prepare_usage, "unknown argument '%s'", o);
        /* --ext '' (files without an extension) is a value, not a missing one */
        if (!strcmp(o, "--ext") && i + 1 < argc && !argv[i + 1][0])
            v = argv[++i];
        else if (!(v = option_value(argc, argv, &i)))
            return usage_error(cmd, prepare_usage, "%s needs a value", o);
        if (dst) {
            *dst = v;
            continue;
        }
        char *end;
        errno = 0;
        a->val_every = strtol(v, &end, 10);
        if (*end || errno || a->val_every < 1)
            return usage_error(cmd, prepare_usage, "--val-every needs a positive integer, got '%s'", v);
    }
    if (a->n_inputs == 0)
        return usage_error(cmd, prepare_usage, "%s", "no --input files");
    if (!a->out)
        return usage_error(cmd, prepare_usage, "%s", "no --out PREFIX");
    if (!a->tokenizer)
        return usage_error(cmd, prepare_usage, "%s", "no --tokenizer (byte or gpt2)");
    if (strcmp(a->tokenizer, "byte") != 0 && strcmp(a->tokenizer, "gpt2") != 0)
        return usage_error(cmd, prepare_usage, "unknown tokenizer '%s' (byte or gpt2)", a->tokenizer);
    if (strcmp(a->format, "megatron") != 0 && strcmp(a->format, "llmc") != 0)
        return usage_error(cmd, prepare_usage, "unknown format '%s' (megatron or llmc)", a->format);
    return 0;
}

static Tokenizer *make_tokenizer(const char *name, const char *vocab, const char *merges)
{
    char err[CFG_ERR];
    if (strcmp(name, "byte") == 0)
        return tokenizer_byte();
    char vbuf[4096], mbuf[4096];
    vocab = inputs_repo_file(vocab, vbuf, sizeof vbuf);
    merges = inputs_repo_file(merges, mbuf, sizeof mbuf);
    Tokenizer *t = tokenizer_gpt2(vocab, merges, err);
    if (!t)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    return t;
}

/* Whole file (or stdin for "-") into memory; exits with a message on error. */
static char *read_input(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    struct stat st;
    if (!f)
        trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "cannot open %s: %s", path,
                  strerror(errno));
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode))
        trd_fatal(TRD_EXIT_INPUT, "pass the files, e.g. DIR/*", "%s is a directory", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = trd_malloc(cap, "an input file");
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory reading %s", path);
        buf = nb;
    }
    if (ferror(f))
        trd_fatal(TRD_EXIT_INPUT, NULL, "cannot read %s: %s", path, strerror(errno));
    if (f != stdin)
        fclose(f);
    *len = n;
    return buf;
}

/* Every input must be a readable file before any output is created. */
static void check_inputs(PrepareArgs *a)
{
    inputs_expand(&a->docs, a->inputs, a->n_inputs, a->ext);
    for (size_t d = 0; d < a->docs.n; d++) {
        const char *p = a->docs.paths[d];
        if (strcmp(p, "-") && access(p, R_OK) != 0)
            trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "cannot read %s: %s", p,
                      strerror(errno));
    }
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
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot create directory %s: %s", dir, strerror(errno));
        *p = '/';
    }
}

/* One output dataset (train or val) in either format. */
typedef struct {
    char prefix[CFG_STR];
    int llmc;
    DatasetWriter *w;           /* megatron */
    int32_t *all;               /* llmc: every token, written at the end */
    size_t n_all, cap_all;
    uint64_t docs, tokens;
} Output;

static void output_open(Output *o, const char *prefix, int llmc, int token_bytes)
{
    char err[CFG_ERR];
    memset(o, 0, sizeof *o);
    if (strlen(prefix) + 9 > CFG_STR)
        trd_fatal(TRD_EXIT_INPUT, NULL, "--out prefix too long (max %d bytes): %s", CFG_STR - 9, prefix);
    snprintf(o->prefix, sizeof o->prefix, "%s", prefix);
    o->llmc = llmc;
    if (!llmc && !(o->w = dataset_writer_open(prefix, token_bytes, err)))
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
}

static void output_add(Output *o, const int32_t *ids, size_t n)
{
    char err[CFG_ERR];
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

static void output_close(Output *o, const char *label)
{
    char err[CFG_ERR], path[CFG_STR + 8];
    snprintf(path, sizeof path, "%s.bin", o->prefix);
    int rc = o->llmc ? dataset_write_llmc(path, o->all, o->n_all, err)
                     : dataset_writer_close(o->w, err);
    if (rc != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s", err);
    free(o->all);
    printf("  %-5s %s%s: %llu documents, %llu tokens\n", label, o->prefix,
           o->llmc ? ".bin" : ".{bin,idx}", (unsigned long long)o->docs,
           (unsigned long long)o->tokens);
}

int data_prepare_main(int argc, char **argv)
{
    PrepareArgs a;
    int rc = parse_prepare(argc, argv, &a);
    if (rc != 0) {
        free(a.inputs);
        return rc < 0 ? 0 : rc;
    }
    check_inputs(&a);
    Tokenizer *tok = make_tokenizer(a.tokenizer, a.vocab, a.merges);
    int llmc = strcmp(a.format, "llmc") == 0;
    int token_bytes = dataset_token_bytes_for_vocab(tokenizer_vocab(tok));
    if (llmc && token_bytes != 2)
        trd_fatal(TRD_EXIT_INPUT, "use --format megatron", "llm.c shards hold uint16 tokens; vocabulary %d does not fit",
                  tokenizer_vocab(tok));
    printf("prepare-data: %s tokenizer (vocab %d, EOT %d), %s format, %s tokens\n",
           tokenizer_name(tok), tokenizer_vocab(tok), tokenizer_eot(tok), a.format,
           token_bytes == 2 ? "uint16" : "int32");
    make_parent_dirs(a.out);
    char val_prefix[CFG_STR + 8];
    snprintf(val_prefix, sizeof val_prefix, "%s_val", a.out);
    Output train, val;
    output_open(&train, a.out, llmc, token_bytes);
    if (a.val_every)
        output_open(&val, val_prefix, llmc, token_bytes);

    double t0 = now_s(), t_encode = 0;
    uint64_t bytes = 0;
    int32_t *ids = NULL;
    size_t cap = 0;
    for (size_t d = 0; d < a.docs.n; d++) {
        size_t len, n = 0;
        const char *doc = a.docs.paths[d];
        char *text = read_input(doc, &len);
        double te = now_s();
        if (tokenizer_encode(tok, text, len, &ids, &n, &cap) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory tokenizing %s", doc);
        t_encode += now_s() - te;
        /* EOT after each document: grow by hand, encode never emits it. */
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            int32_t *p = realloc(ids, cap * sizeof *ids);
            if (!p)
                trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory tokenizing %s", doc);
            ids = p;
        }
        ids[n++] = tokenizer_eot(tok);
        int to_val = a.val_every && (long)(d % (size_t)a.val_every) == a.val_every - 1;
        output_add(to_val ? &val : &train, ids, n);
        bytes += len;
        free(text);
    }
    free(ids);
    output_close(&train, "train");
    if (a.val_every)
        output_close(&val, "val");
    if (a.val_every && val.docs == 0)
        fprintf(stderr, "prepare-data: warning: the validation split %s is empty: --val-every "
                "%ld puts every %ld-th document there, and there are %zu; use a smaller "
                "--val-every\n", val_prefix, a.val_every, a.val_every, a.docs.n);
    if (train.docs == 0)
        fprintf(stderr, "prepare-data: warning: the training split %s is empty\n", a.out);
    double dt = now_s() - t0;
    uint64_t tokens = train.tokens + (a.val_every ? val.tokens : 0);
    printf("  read %zu files, %.2f MiB; %llu tokens in %.2f s (encoding %.2f s: %.2f MiB/s, %.0f tokens/s)\n",
           a.docs.n, trd_mib(bytes), (unsigned long long)tokens, dt, t_encode,
           t_encode > 0 ? trd_mib(bytes) / t_encode : 0.0,
           t_encode > 0 ? (double)tokens / t_encode : 0.0);
    tokenizer_free(tok);
    inputs_free(&a.docs);
    free(a.inputs);
    return TRD_EXIT_OK;
}

int data_tokenize_main(int argc, char **argv)
{
    const char *cmd = "tokenize", *name = "gpt2", *vocab = DATA_GPT2_ENCODER_DEFAULT,
               *merges = DATA_GPT2_MERGES_DEFAULT, *file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], **dst = NULL, *v;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            fputs(tokenize_usage, stdout);
            return TRD_EXIT_OK;
        }
        if (strcmp(o, "--tokenizer") == 0) dst = &name;
        else if (strcmp(o, "--vocab") == 0) dst = &vocab;
        else if (strcmp(o, "--merges") == 0) dst = &merges;
        else if (strncmp(o, "--", 2) == 0)
            return usage_error(cmd, tokenize_usage, "unknown argument '%s'", o);
        else if (file)
            return usage_error(cmd, tokenize_usage, "more than one FILE ('%s')", o);
        else {
            file = o;
            continue;
        }
        if (!(v = option_value(argc, argv, &i)))
            return usage_error(cmd, tokenize_usage, "%s needs a value", o);
        *dst = v;
    }
    if (!file)
        return usage_error(cmd, tokenize_usage, "%s", "no FILE (use - for stdin)");
    if (strcmp(name, "byte") != 0 && strcmp(name, "gpt2") != 0)
        return usage_error(cmd, tokenize_usage, "unknown tokenizer '%s' (byte or gpt2)", name);
    Tokenizer *tok = make_tokenizer(name, vocab, merges);
    size_t len, n = 0, cap = 0;
    char *text = read_input(file, &len);
    int32_t *ids = NULL;
    if (tokenizer_encode(tok, text, len, &ids, &n, &cap) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory tokenizing %s", file);
    for (size_t i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    free(text);
    tokenizer_free(tok);
    return fflush(stdout) == 0 ? TRD_EXIT_OK : TRD_EXIT_RUNTIME;
}
