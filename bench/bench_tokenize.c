/* bench_tokenize — tokenizer_encode alone over a corpus, one document at a
 * time as prepare-data encodes them (bench/tokenize.sh runs it against
 * OpenAI's tiktoken and js-tiktoken on the same text).
 *
 *   bench_tokenize --tokenizer gpt2|cl100k_base|o200k_base [--repeat R]
 *                  [--threads T] [--rounds N] [--warm 1] FILE...
 *
 * Each FILE is a document; the list is taken R times (default 1).  Files
 * are read before any timing.  Each round loads fresh tokenizers (one per
 * thread; loading is not timed), so the word caches start empty and
 * filling them is part of the time, as in a prepare-data run over new
 * text.  Documents are spread over the T OpenMP threads (dynamic, one at a
 * time), as prepare-data --workers does.  With --warm 1 every tokenizer
 * first encodes the whole list untimed, so its word cache holds every word
 * (the cost of filling the caches, once per thread, is then left out).
 * Before the first round, an
 * untimed warm-up encodes the first 50 documents on a throwaway tokenizer.
 * Prints one line per round:
 *
 *   trident ENC threads T: BYTES bytes, TOKENS tokens, SECONDS s, MB/s, tokens/s, cpu CPU s
 *
 * MB is 10^6 bytes of UTF-8 text; the token count has no EOTs; CPU is the
 * process's CPU time over the pass (all threads): well below T x SECONDS
 * when other programs took the cores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

typedef struct {
    char *text;
    size_t len;
} Doc;

static double clock_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static Doc read_doc(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        trd_fatal(TRD_EXIT_INPUT, "run scripts/get_corpus.sh", "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    Doc d = {trd_malloc((size_t)n + 1, "a document"), (size_t)n};
    if (n < 0 || fread(d.text, 1, (size_t)n, f) != (size_t)n)
        trd_fatal(TRD_EXIT_INPUT, NULL, "cannot read %s", path);
    fclose(f);
    return d;
}

static Tokenizer *make(const char *name)
{
    char err[CFG_ERR];
    Tokenizer *t = data_tokenizer_named(name, err);
    if (!t)
        trd_fatal(TRD_EXIT_INPUT, "run scripts/get_corpus.sh and scripts/get_tiktoken.sh", "%s",
                  err);
    return t;
}

/* Encode docs[0..n) over the threads' tokenizers; returns the token count. */
static size_t encode_all(Tokenizer **toks, int threads, const Doc *docs, long n)
{
    size_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        Tokenizer *t = toks[omp_get_thread_num()];
        int32_t *ids = NULL;
        size_t cap = 0;
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < n; i++) {
            size_t k = 0;
            if (tokenizer_encode(t, docs[i].text, docs[i].len, &ids, &k, &cap) != 0)
                trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory encoding");
            total += k;
        }
        free(ids);
    }
    return total;
}

int main(int argc, char **argv)
{
    const char *name = "gpt2";
    int repeat = 1, threads = 1, rounds = 1, warm_caches = 0, first = argc;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0) {
            first = i;
            break;
        }
        if (i + 1 >= argc)
            trd_fatal(TRD_EXIT_INPUT, NULL, "%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--tokenizer"))
            name = argv[i + 1];
        else if (!strcmp(argv[i], "--repeat"))
            repeat = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warm"))
            warm_caches = atoi(argv[i + 1]);
        else
            trd_fatal(TRD_EXIT_INPUT, NULL, "unknown option %s", argv[i]);
        i++;
    }
    if (first >= argc || repeat < 1 || threads < 1 || rounds < 1)
        trd_fatal(TRD_EXIT_INPUT, NULL,
                  "usage: bench_tokenize --tokenizer NAME [--repeat R] [--threads T] "
                  "[--rounds N] [--warm 1] FILE...");
    const long n_files = argc - first, n = n_files * repeat;
    Doc *docs = trd_malloc((size_t)n * sizeof *docs, "the document list");
    size_t bytes = 0;
    for (long i = 0; i < n_files; i++) {
        docs[i] = read_doc(argv[first + i]);
        bytes += docs[i].len;
    }
    for (long i = n_files; i < n; i++) /* the copies share the text */
        docs[i] = docs[i % n_files];
    bytes *= (size_t)repeat;

    Tokenizer *warm = make(name);
    encode_all(&warm, 1, docs, n < 50 ? n : 50);
    tokenizer_free(warm);

    Tokenizer **toks = trd_malloc((size_t)threads * sizeof *toks, "the tokenizers");
    for (int r = 0; r < rounds; r++) {
        for (int t = 0; t < threads; t++) {
            toks[t] = make(name);
            if (warm_caches)
                encode_all(&toks[t], 1, docs, n_files);
        }
        double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        size_t tokens = encode_all(toks, threads, docs, n);
        double dt = clock_s(CLOCK_MONOTONIC) - t0, cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        for (int t = 0; t < threads; t++)
            tokenizer_free(toks[t]);
        printf("trident %s threads %d: %zu bytes, %zu tokens, %.4f s, %.2f MB/s, %.0f tokens/s, "
               "cpu %.4f s\n",
               name, threads, bytes, tokens, dt, 1e-6 * (double)bytes / dt, (double)tokens / dt,
               cpu);
        fflush(stdout);
    }
    for (long i = 0; i < n_files; i++)
        free(docs[i].text);
    free(docs);
    free(toks);
    return 0;
}
