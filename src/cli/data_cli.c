/* data_cli.c — `trident data inspect`: what a dataset, or a config's data
 * (one dataset or a blend), holds and what the model will see from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_config.h"
#include "cli/commands.h"
#include "core/error.h"
#include "data/blend.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: trident data inspect PREFIX|PATTERN|CONFIG [--sample N] [--tokenizer NAME]\n"
        "                            [--format megatron|llmc] [--seq-len L] [--seed S]\n"
        "                            [--set key.path=value ...]\n\n"
        "  PREFIX     a dataset (a Megatron prefix or an llm.c shard), a quoted glob\n"
        "             pattern or a comma list of them: one dataset of many shards\n"
        "  CONFIG     a run's YAML config (.yaml/.yml): its data.path or data.blend, its\n"
        "             validation data, and the realized share of each blended dataset\n"
        "  --sample N print global sample N (default 0) as the model reads it, decoded\n"
        "  --tokenizer byte|gpt2|cl100k_base|o200k_base, or a SentencePiece FILE.model:\n"
        "             to decode (default: by the model's vocabulary, or by the dataset's\n"
        "             largest id)\n"
        "  --seq-len, --seed  the sample order of a PREFIX (default 1024, 1234; a CONFIG\n"
        "             gives its own)\n"
        "Exit codes: 0 success, 2 bad input (arguments, a missing or bad dataset), 1 failure.\n");
}

typedef struct {
    CliConfig cli;
    long sample, seq_len;
    unsigned long long seed;
    const char *tokenizer, *format;
} Args;

static long num(const char *opt, const char *v, long lo)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || end == v || x < lo)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s: expected an integer >= %ld, got '%s'", opt, lo, v);
    return x;
}

static int option(void *ctx, int argc, char **argv, int *i)
{
    Args *a = ctx;
    const char *o = argv[*i];
    if (*i + 1 >= argc)
        return 0;
    const char *v = argv[*i + 1];
    if (!strcmp(o, "--sample"))
        a->sample = num(o, v, 0);
    else if (!strcmp(o, "--seq-len"))
        a->seq_len = num(o, v, 1);
    else if (!strcmp(o, "--seed"))
        a->seed = (unsigned long long)num(o, v, 0);
    else if (!strcmp(o, "--tokenizer"))
        a->tokenizer = v;
    else if (!strcmp(o, "--format"))
        a->format = v;
    else
        return 0;
    (*i)++;
    return 1;
}

static int is_config(const char *p)
{
    size_t n = strlen(p);
    return (n > 5 && !strcmp(p + n - 5, ".yaml")) || (n > 4 && !strcmp(p + n - 4, ".yml"));
}

/* The tokenizer's name: asked for, the model's, or by the largest id of
 * the first tokens (which is what a dataset can tell). */
static const char *tokenizer_for(const Args *a, int vocab, Blend *b, char *why, size_t n)
{
    if (a->tokenizer) {
        snprintf(why, n, "as asked");
        return a->tokenizer;
    }
    if (vocab > 0) {
        const char *name = vocab == 257      ? "byte"
                           : vocab == 50257  ? "gpt2"
                           : vocab == 100277 ? "cl100k_base"
                           : vocab == 200019 ? "o200k_base"
                                             : NULL;
        snprintf(why, n, "by model.vocab %d", vocab);
        return name;
    }
    uint32_t top = 0, buf[1 << 14];
    char err[CFG_ERR];
    for (int d = 0; d < b->n; d++) {
        TokenStream *s = &b->data[d];
        uint64_t end = s->n_tokens < SAMPLER_VOCAB_SCAN ? s->n_tokens : SAMPLER_VOCAB_SCAN;
        for (uint64_t at = 0; at < end; at += sizeof buf / sizeof buf[0]) {
            size_t m = end - at < sizeof buf / sizeof buf[0] ? (size_t)(end - at)
                                                             : sizeof buf / sizeof buf[0];
            if (stream_read(s, at, m, buf, err) != 0)
                trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
            for (size_t i = 0; i < m; i++)
                top = buf[i] > top ? buf[i] : top;
        }
    }
    snprintf(why, n, "guessed from the largest id, %u; --tokenizer names another", top);
    return top < 257 ? "byte" : top < 50257 ? "gpt2" : top < 100277 ? "cl100k_base" : "o200k_base";
}

static void print_dataset(const char *label, Blend *b)
{
    for (int d = 0; d < b->n; d++) {
        const TokenStream *s = &b->data[d];
        uint64_t bytes = 0;
        int narrow = 0, wide = 0;
        for (int i = 0; i < s->n_shards; i++) {
            bytes += s->shards[i].n_tokens * (uint64_t)s->shards[i].token_bytes;
            narrow += s->shards[i].token_bytes == 2;
            wide += s->shards[i].token_bytes == 4;
        }
        char weight[32] = "";
        if (b->n > 1)
            snprintf(weight, sizeof weight, " weight %.4f", b->weight[d]);
        printf("%s [%d]%s %s\n", label, d, weight, s->name);
        printf("  %d shard%s | %llu documents | %llu tokens | %s tokens | %.2f MiB | %llu "
               "samples/epoch of %d tokens\n",
               s->n_shards, s->n_shards == 1 ? "" : "s", (unsigned long long)s->n_docs,
               (unsigned long long)s->n_tokens,
               narrow && wide ? "uint16 and int32"
               : wide         ? "int32"
                              : "uint16",
               (double)bytes / (1 << 20), (unsigned long long)b->sampler[d].n_samples,
               b->sampler[d].seq_len);
    }
}

/* The realized share of each dataset over the first n samples. */
static void print_shares(Blend *b, uint64_t n, const char *what)
{
    if (b->n < 2 || n == 0)
        return;
    uint64_t count[CFG_MAX_BLEND];
    blend_counts(b, n, count);
    printf("realized shares over %s (%llu samples):\n", what, (unsigned long long)n);
    for (int d = 0; d < b->n; d++)
        printf("  [%d] %llu samples = %.4f%% (target %.4f%%), %.3f epochs of %s\n", d,
               (unsigned long long)count[d], 100.0 * (double)count[d] / (double)n,
               100.0 * b->weight[d], (double)count[d] / (double)b->sampler[d].n_samples,
               b->data[d].name);
}

static void print_sample(Blend *b, uint64_t p, int T, Tokenizer *tok)
{
    uint64_t k;
    const int d = blend_pick(b, p, &k);
    const Sampler *s = &b->sampler[d];
    const uint64_t start = sampler_index(s, k) * (uint64_t)T;
    int32_t *ids = malloc((size_t)(T + 1) * sizeof *ids), *tgt = malloc((size_t)T * sizeof *tgt);
    char err[CFG_ERR];
    if (!ids || !tgt || blend_read(b, p, ids, tgt, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", ids && tgt ? err : "out of memory");
    ids[T] = tgt[T - 1];
    printf("sample %llu: dataset [%d] %s, its sample %llu (epoch %llu), tokens [%llu, %llu) of "
           "its stream:\n",
           (unsigned long long)p, d, b->data[d].name, (unsigned long long)k,
           (unsigned long long)(k / s->n_samples), (unsigned long long)start,
           (unsigned long long)(start + (uint64_t)T + 1));
    char *text = tok ? tokenizer_decode(tok, ids, (size_t)T + 1) : NULL;
    if (text)
        printf("%s\n", text);
    else
        for (int t = 0; t <= T; t++)
            printf("%d%c", ids[t], t == T ? '\n' : ' ');
    free(text);
    free(ids);
    free(tgt);
}

static int inspect(const Args *a)
{
    char err[CFG_ERR], why[128];
    Config cfg;
    BlendSpec train, val = {0};
    int T = (int)a->seq_len, vocab = 0, is_cfg = is_config(a->cli.config_path);
    uint64_t seed = a->seed, run_samples = 0;
    DataFormat fmt = a->format && !strcmp(a->format, "llmc") ? DATA_LLMC : DATA_MEGATRON;
    if (a->format && strcmp(a->format, "llmc") && strcmp(a->format, "megatron"))
        trd_fatal(TRD_EXIT_INPUT, NULL, "--format is megatron or llmc, not '%s'", a->format);
    if (is_cfg) {
        if (cli_read_config(&cfg, &a->cli, 0, err) != 0 ||
            config_data_spec(&cfg.data, 0, &train, err) != 0 ||
            config_data_spec(&cfg.data, 1, &val, err) != 0)
            trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
        T = cfg.model.seq_len;
        vocab = cfg.model.vocab;
        seed = cfg.run.seed;
        fmt = cfg.data.format;
        run_samples = (uint64_t)cfg.training.steps * (uint64_t)cfg.training.global_batch;
        printf("config: %s | seq_len %d | seed %llu | %d steps x global_batch %d\n",
               a->cli.config_path, T, (unsigned long long)seed, cfg.training.steps,
               cfg.training.global_batch);
    } else {
        if (a->cli.n_sets)
            trd_fatal(TRD_EXIT_INPUT, NULL, "--set applies to a CONFIG, not to a dataset path");
        train = (BlendSpec){.n = 1, .weight = {1}};
        snprintf(train.path[0], CFG_PATHS, "%s", a->cli.config_path);
    }
    Blend b, v;
    /* No vocabulary check here: inspect shows the ids whatever they are. */
    if (blend_open(&b, &train, fmt, T, seed, 1 << 30, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    print_dataset(is_cfg ? "train" : "dataset", &b);
    print_shares(&b, run_samples, "the run");
    if (val.n) {
        if (blend_open(&v, &val, fmt, T, seed, 1 << 30, err) != 0)
            trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
        print_dataset("val", &v);
        print_shares(&v, (uint64_t)cfg.data.val_sequences, "data.val_sequences");
        blend_close(&v);
    }
    const char *name = tokenizer_for(a, vocab, &b, why, sizeof why);
    Tokenizer *tok = name ? data_tokenizer_named(name, err) : NULL;
    printf("tokenizer: %s (%s)%s%s\n", name ? name : "none", why, name && !tok ? ": " : "",
           name && !tok ? err : "");
    print_sample(&b, (uint64_t)a->sample, T, tok);
    if (tok)
        tokenizer_free(tok);
    blend_close(&b);
    return TRD_EXIT_OK;
}

int data_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "inspect")) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            usage(stdout);
            return TRD_EXIT_OK;
        }
        usage(stderr);
        fprintf(stderr, "trident: error: %s\n",
                argc < 2 ? "no subcommand (inspect)" : "unknown data subcommand");
        return TRD_EXIT_INPUT;
    }
    Args a = {.seq_len = 1024, .seed = 1234};
    if (cli_parse(argc - 1, argv + 1, &a.cli, usage, option, &a))
        return TRD_EXIT_OK;
    return inspect(&a);
}
