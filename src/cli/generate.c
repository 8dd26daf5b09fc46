/* generate.c — `trident generate`: text from a trained model (docs/generate.md).
 *
 * The model comes from a trident checkpoint saved on any layout (its
 * config.yaml gives the model; the weights are read in the global layout
 * onto one rank) or from a Hugging Face directory (imported first, as
 * `trident ckpt import` does).  The prompt is encoded with the run's
 * tokenizer, fed to a Decoder (src/model/model.h: one pass with a
 * key/value cache), and each next token is drawn from the last logits:
 * greedy, or softmax(logits / temperature) restricted to the top k and
 * the top p of the probability mass, with a counter-based RNG keyed by
 * --seed (the same seed gives the same text, on any backend that gives
 * the same logits). */
#include "cli/commands.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#ifdef TRD_HAVE_CUDA
#include "backend/cuda.h"
#endif
#include "checkpoint/ckpt.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/trainer.h"

static const char usage[] =
    "usage: trident generate CKPT|HF_DIR --prompt TEXT [--max-new-tokens N]\n"
    "           [--temperature T] [--top-k K] [--top-p P] [--seed S] [--greedy]\n"
    "           [--tokenizer NAME] [--backend cpu|cuda] [--no-cache] [--ids]\n"
    "           [--dump-logits FILE]\n\n"
    "Prints the continuation of TEXT by a trained model.\n"
    "  CKPT              a trident step directory, or a checkpoint.dir (its latest)\n"
    "  HF_DIR            a Hugging Face directory (config.json + safetensors)\n"
    "  --max-new-tokens  tokens to generate (default 64; stops early at end-of-text)\n"
    "  --temperature     divides the logits (default 1.0); 0 is --greedy\n"
    "  --top-k           sample among the K most likely tokens (default 0: all)\n"
    "  --top-p           ... and among the fewest whose probability reaches P (default 1)\n"
    "  --seed            the sampling RNG's key (default 1234): same seed, same text\n"
    "  --greedy          always the most likely token\n"
    "  --tokenizer       byte, gpt2, cl100k_base, o200k_base, or a SentencePiece\n"
    "                    FILE.model (default: gpt2 for a vocabulary of 50257, byte for\n"
    "                    257; an HF directory's own files)\n"
    "  --backend         where the model runs (default cpu)\n"
    "  --no-cache        recompute the whole sequence for every token (for checking)\n"
    "  --ids             print the token ids (prompt | continuation) instead of text\n"
    "  --dump-logits F   write the logits each token was drawn from to F (float32,\n"
    "                    [new tokens][vocab], for checking against another model)\n"
    "Exit codes: 0 success, 2 bad input (arguments, not a checkpoint), 1 failure.\n";

typedef struct {
    const char *source, *prompt, *tokenizer, *backend, *dump;
    long max_new;
    double temperature, top_p;
    long top_k;
    uint64_t seed;
    int greedy, no_cache, ids;
} GenArgs;

static int bad_args(const char *fmt, const char *arg)
{
    fprintf(stderr, "trident generate: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n---> see `trident generate --help`\n");
    return TRD_EXIT_INPUT;
}

static int number(const char *opt, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (*end || errno || !(x >= lo && x <= hi)) {
        fprintf(stderr, "trident generate: %s needs a number from %.16g to %.16g, got '%s'\n", opt,
                lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* -1 after --help; else 0 or the exit code of a bad argument. */
static int parse(int argc, char **argv, GenArgs *a)
{
    *a = (GenArgs){.max_new = 64, .temperature = 1.0, .top_p = 1.0, .seed = 1234, .backend = "cpu"};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(usage, stdout);
            return -1;
        }
        if (!strcmp(o, "--greedy") || !strcmp(o, "--no-cache") || !strcmp(o, "--ids")) {
            *(!strcmp(o, "--greedy") ? &a->greedy
              : !strcmp(o, "--ids")  ? &a->ids
                                     : &a->no_cache) = 1;
            continue;
        }
        if (strncmp(o, "--", 2)) {
            if (a->source)
                return bad_args("one model source only, got '%s' too", o);
            a->source = o;
            continue;
        }
        if (i + 1 >= argc)
            return bad_args("%s needs a value", o);
        const char *v = argv[++i];
        double x;
        if (!strcmp(o, "--prompt"))
            a->prompt = v;
        else if (!strcmp(o, "--tokenizer"))
            a->tokenizer = v;
        else if (!strcmp(o, "--backend"))
            a->backend = v;
        else if (!strcmp(o, "--dump-logits"))
            a->dump = v;
        else if (!strcmp(o, "--max-new-tokens")) {
            if (number(o, v, 1, 1 << 20, &x))
                return TRD_EXIT_INPUT;
            a->max_new = (long)x;
        } else if (!strcmp(o, "--temperature")) {
            if (number(o, v, 0, 1e6, &x))
                return TRD_EXIT_INPUT;
            a->temperature = x;
        } else if (!strcmp(o, "--top-k")) {
            if (number(o, v, 0, 1 << 24, &x))
                return TRD_EXIT_INPUT;
            a->top_k = (long)x;
        } else if (!strcmp(o, "--top-p")) {
            if (number(o, v, 1e-9, 1, &x))
                return TRD_EXIT_INPUT;
            a->top_p = x;
        } else if (!strcmp(o, "--seed")) {
            if (number(o, v, 0, 9007199254740992.0, &x))
                return TRD_EXIT_INPUT;
            a->seed = (uint64_t)x;
        } else
            return bad_args("unknown argument '%s'", o);
    }
    if (!a->source)
        return bad_args("%s", "no checkpoint or Hugging Face directory given");
    if (!a->prompt)
        return bad_args("%s", "no --prompt (an empty prompt \"\" starts from end-of-text)");
    if (strcmp(a->backend, "cpu") && strcmp(a->backend, "cuda"))
        return bad_args("--backend is cpu or cuda, not '%s'", a->backend);
    if (a->temperature == 0)
        a->greedy = 1;
    return 0;
}

static int is_file(const char *dir, const char *name)
{
    char p[CFG_STR + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The step directory to read, importing a Hugging Face directory into tmp
 * first (tmp then holds a weights-only checkpoint to remove afterwards). */
static void resolve_source(const GenArgs *a, char step[CFG_STR], char tmp[CFG_STR])
{
    char err[CFG_ERR];
    tmp[0] = '\0';
    if (is_file(a->source, "config.json")) {
        snprintf(tmp, CFG_STR, "%s/trident-generate-XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(tmp))
            trd_fatal(TRD_EXIT_RUNTIME, "set TMPDIR to a writable directory",
                      "cannot make a temporary directory %s: %s", tmp, strerror(errno));
        /* Its report goes to stderr: stdout is the generated text. */
        fflush(stdout);
        const int saved = dup(STDOUT_FILENO);
        dup2(STDERR_FILENO, STDOUT_FILENO);
        const int rc = ckpt_hf_import(a->source, tmp, NULL, 0, 1, err);
        fflush(stdout);
        dup2(saved, STDOUT_FILENO);
        close(saved);
        if (rc != 0)
            trd_fatal(rc, NULL, "%s", err);
        snprintf(step, CFG_STR, "%.200s/step_00000000", tmp);
        return;
    }
    if (ckpt_resolve(NULL, RESUME_PATH, a->source, step, err) != 1)
        trd_fatal(TRD_EXIT_INPUT,
                  "give a step directory, a checkpoint.dir with a latest, or a "
                  "Hugging Face directory with config.json",
                  "%s", err);
}

static Tokenizer *open_tokenizer(const GenArgs *a, const Config *cfg)
{
    char err[CFG_ERR];
    Tokenizer *t = NULL;
    if (!a->tokenizer && is_file(a->source, "vocab.json") && is_file(a->source, "merges.txt")) {
        char v[CFG_STR + 16], m[CFG_STR + 16];
        snprintf(v, sizeof v, "%s/vocab.json", a->source);
        snprintf(m, sizeof m, "%s/merges.txt", a->source);
        t = tokenizer_gpt2(v, m, err);
    } else if (!a->tokenizer && is_file(a->source, "tokenizer.json")) {
        char j[CFG_STR + 16];
        snprintf(j, sizeof j, "%s/tokenizer.json", a->source);
        t = tokenizer_hf_json(j, err);
    } else {
        const char *name = a->tokenizer                ? a->tokenizer
                           : cfg->model.vocab == 50257 ? "gpt2"
                           : cfg->model.vocab == 257   ? "byte"
                                                       : NULL;
        if (!name)
            trd_fatal(TRD_EXIT_INPUT,
                      "pass --tokenizer byte|gpt2|cl100k_base|o200k_base|FILE.model",
                      "the model's vocabulary (%d) names no tokenizer", cfg->model.vocab);
        t = data_tokenizer_named(name, err);
    }
    if (!t)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    if (tokenizer_vocab(t) > cfg->model.vocab)
        trd_fatal(TRD_EXIT_INPUT, "pass the --tokenizer the model was trained with",
                  "tokenizer %s has %d ids, more than the model's vocabulary of %d",
                  tokenizer_name(t), tokenizer_vocab(t), cfg->model.vocab);
    return t;
}

/* The model of the checkpoint's config on one rank, with its weights. */
static Model *load_model(const char *step, const GenArgs *a, Config *cfg, const Backend **be)
{
    char path[CFG_STR + 32], err[CFG_ERR];
    snprintf(path, sizeof path, "%s/config.yaml", step);
    config_defaults(cfg);
    if (config_load(cfg, path, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    /* One rank, whatever layout saved it: the checkpoint is global. */
    cfg->topology.tp = cfg->topology.pp = cfg->topology.dp = cfg->topology.cp = 1;
    cfg->topology.ep = 1;
    cfg->topology.zero = 0;
    cfg->topology.virtual_stages = 1;
    cfg->topology.stage_layers[0] = 0;
    cfg->topology.sequence_parallel = 0;
    /* Only the model matters here: the training and checkpoint sections are
     * the defaults (an imported checkpoint's are empty), fp32 compute. */
    Config def;
    config_defaults(&def);
    cfg->training = def.training;
    cfg->checkpoint = def.checkpoint;
    cfg->training.steps = cfg->training.global_batch = cfg->training.micro_batch = 1;
    if (!cfg->data.path[0] && !cfg->data.blend[0]) /* no data is read; validation wants one */
        snprintf(cfg->data.path, sizeof cfg->data.path, "(none)");
    cfg->backend = strcmp(a->backend, "cuda") ? BACKEND_CPU : BACKEND_CUDA;
    cfg->model.lora.dropout = 0; /* a training-time key: generation never drops */
    if (config_validate(cfg, 1, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s: %s", path, err);
    if (cfg->backend == BACKEND_CUDA) {
#ifdef TRD_HAVE_CUDA
        if (backend_cuda_devices() < 1)
            trd_fatal(TRD_EXIT_RUNTIME, "run on a machine with an NVIDIA GPU, or --backend cpu",
                      "--backend cuda: no CUDA device is visible");
        backend_cuda_set_device(0);
        *be = backend_cuda();
#else
        trd_fatal(TRD_EXIT_INPUT, "build with meson -Dcuda=enabled (docs/cuda.md)",
                  "--backend cuda: this trident was built without CUDA");
#endif
    } else {
        *be = backend_cpu();
    }
    return trainer_load_model(cfg, *be, step);
}

typedef struct {
    float p;
    int id;
} Cand;

static int by_prob(const void *x, const void *y)
{
    const Cand *a = x, *b = y;
    return a->p > b->p ? -1 : a->p < b->p ? 1 : a->id - b->id;
}

/* The next token: the argmax, or a draw from the temperature-scaled
 * softmax cut to the top k and the top p, with uniform number u in [0,1). */
static int next_token(const float *logits, int V, const GenArgs *a, double u, Cand *c)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    if (a->greedy)
        return best;
    const double mx = logits[best];
    double sum = 0;
    for (int v = 0; v < V; v++) {
        c[v].id = v;
        c[v].p = (float)exp((logits[v] - mx) / a->temperature);
        sum += c[v].p;
    }
    if ((a->top_k <= 0 || a->top_k >= V) && a->top_p >= 1) { /* no cut: no sort */
        double acc = 0, target = u * sum;
        for (int v = 0; v < V; v++) {
            acc += c[v].p;
            if (target < acc)
                return v;
        }
        return V - 1;
    }
    qsort(c, (size_t)V, sizeof *c, by_prob);
    int n = a->top_k > 0 && a->top_k < V ? (int)a->top_k : V;
    double kept = 0;
    for (int i = 0; i < n; i++) {
        kept += c[i].p;
        if (kept >= a->top_p * sum) {
            n = i + 1;
            break;
        }
    }
    kept = 0;
    for (int i = 0; i < n; i++)
        kept += c[i].p;
    double acc = 0, target = u * kept;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (target < acc)
            return c[i].id;
    }
    return c[n - 1].id;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int generate_main(int argc, char **argv)
{
    GenArgs a;
    int rc = parse(argc, argv, &a);
    if (rc)
        return rc < 0 ? TRD_EXIT_OK : rc;
    comm_init(&argc, &argv);
    char step[CFG_STR], tmp[CFG_STR];
    resolve_source(&a, step, tmp);
    Config cfg;
    const Backend *be;
    Model *m = load_model(step, &a, &cfg, &be);
    if (tmp[0]) {
        char cmd[CFG_STR + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0)
            fprintf(stderr, "trident: warning: cannot remove %s\n", tmp);
    }
    Tokenizer *tok = open_tokenizer(&a, &cfg);

    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (tokenizer_encode(tok, a.prompt, strlen(a.prompt), &ids, &n, &cap) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory encoding the prompt");
    if (n == 0) { /* unconditional: start from end-of-text, as GPT-2 does */
        ids = realloc(ids, sizeof *ids);
        TRD_ASSERT(ids);
        ids[0] = tokenizer_eot(tok);
        n = 1;
    }
    const int T = cfg.model.seq_len;
    if ((long)n >= T)
        trd_fatal(TRD_EXIT_INPUT, "shorten the prompt",
                  "the prompt is %zu tokens; the model's "
                  "context (model.seq_len) is %d, which leaves no room to generate",
                  n, T);
    const int prompt_n = (int)n;
    const long room = T - prompt_n;
    const int total = prompt_n + (int)(a.max_new < room ? a.max_new : room);
    if (a.max_new > room)
        fprintf(stderr,
                "trident: note: %ld new tokens fit the context of %d after a prompt of "
                "%d tokens, not %ld\n",
                room, T, prompt_n, a.max_new);
    ids = realloc(ids, (size_t)total * sizeof *ids);
    TRD_ASSERT(ids);

    Decoder *dc = decoder_create(m, total);
    const int V = decoder_vocab(dc);
    Cand *cand = trd_malloc((size_t)V * sizeof *cand, "candidates");
    FILE *dump = a.dump ? fopen(a.dump, "wb") : NULL;
    if (a.dump && !dump)
        trd_fatal(TRD_EXIT_INPUT, NULL, "cannot write %s: %s", a.dump, strerror(errno));
    /* Greedy, or sampling without a cut: the backend chooses each token
     * (decoder_next), and only its id comes back to the host. */
    const int on_backend =
        !a.no_cache && !dump && (a.greedy || ((a.top_k <= 0 || a.top_k >= V) && a.top_p >= 1));
    const double t0 = now_s();
    const float *logits = NULL;
    int len = prompt_n;
    if (on_backend) {
        double *u = trd_malloc((size_t)(total + 1) * sizeof *u, "uniform numbers");
        for (int i = 0; i <= total; i++)
            u[i] = rng_uniform(a.seed, (uint64_t)i);
        decoder_sampling(dc, a.greedy ? 0 : a.temperature, u);
        free(u);
        if (len < total)
            ids[len++] = decoder_next(dc, ids, prompt_n);
    } else {
        logits = decoder_step(dc, ids, prompt_n);
    }
    const double t_prompt = now_s() - t0;
    while (on_backend && len < total && ids[len - 1] != tokenizer_eot(tok))
        ids[len++] = decoder_next(dc, NULL, 1);
    while (!on_backend && len < total) {
        const double u = rng_uniform(a.seed, (uint64_t)len);
        if (dump && fwrite(logits, sizeof *logits, (size_t)V, dump) != (size_t)V)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot write %s: %s", a.dump, strerror(errno));
        const int next = next_token(logits, V, &a, u, cand);
        ids[len++] = next;
        if (next == tokenizer_eot(tok) || len == total)
            break;
        if (a.no_cache) { /* the whole sequence again, from position 0 */
            decoder_reset(dc);
            logits = decoder_step(dc, ids, len);
        } else {
            logits = decoder_step(dc, ids + len - 1, 1);
        }
    }
    const double t_all = now_s() - t0;
    if (dump && fclose(dump) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot write %s: %s", a.dump, strerror(errno));
    if (a.ids) {
        for (int i = 0; i < len; i++)
            printf("%s%d", i == 0 ? "" : i == prompt_n ? " | " : " ", ids[i]);
        printf("\n");
    } else {
        /* The continuation is the whole text past the prompt's: decoded
         * alone, a SentencePiece continuation would lose the space its
         * first piece starts with (a text drops its leading one). */
        char *all = tokenizer_decode(tok, ids, (size_t)len);
        char *head = tokenizer_decode(tok, ids, (size_t)prompt_n);
        char *rest = tokenizer_decode(tok, ids + prompt_n, (size_t)(len - prompt_n));
        TRD_ASSERT(all && head && rest);
        const size_t h = strlen(head);
        printf("%s\n", strncmp(all, head, h) == 0 ? all + h : rest);
        free(all);
        free(head);
        free(rest);
    }
    const int gen = len - prompt_n;
    fprintf(stderr,
            "generate: %d prompt tokens in %.3f s, %d new tokens in %.3f s (%.1f "
            "tokens/s%s), %s backend\n",
            prompt_n, t_prompt, gen, t_all - t_prompt,
            gen > 0 && t_all > t_prompt ? gen / (t_all - t_prompt) : 0.0,
            a.no_cache ? ", no cache" : "", be->name);
    free(cand);
    free(ids);
    decoder_free(dc);
    tokenizer_free(tok);
    model_free(m);
    comm_finalize();
    return TRD_EXIT_OK;
}
