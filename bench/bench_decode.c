/* bench_decode — generation speed of trident generate's Decoder (one
 * sequence) on the CPU backend, or with --backend cuda on the GPU, against
 * the memory-bandwidth limit measured in the same run.
 *
 * Decoding one token at batch 1 is memory-bound: every weight is read once
 * (matrix-vector products), plus the key/value cache up to the position.
 * The limit is bandwidth / bytes per token, the bandwidth the faster of a
 * STREAM-like copy (bytes read + written per second) and a read (a sum) of
 * a 1 GiB buffer on all threads, in memory allocated as the weights' is
 * (the CPU backend's: huge pages), measured between the decode rounds (on
 * the GPU: a device-to-device copy of 1 GiB, read + written).  Rounds
 * alternate, and the best of each is reported (the machine's speed drifts).
 *
 *   bench_decode [--layers L --hidden C --heads H --vocab V --seq T --prompt P
 *                 --tokens N --rounds R --arch gpt2|llama --backend cpu|cuda --ops]
 * --prompt: a P-token prompt (ids 0 .. P - 1, one step, not timed) before
 * the N new tokens, which then attend to up to P + N positions: a long
 * context, e.g. --prompt 896 --tokens 128 (GPT-2's 1024 positions).
 * --ops: then one more round with every op timed (CPU), printed per token.
 * Default: GPT-2 124M, a 1-token prompt, 128 new tokens, 3 rounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "backend/backend.h"
#ifdef TRD_HAVE_CUDA
#include "backend/cuda.h"
#endif
#include "config/config.h"
#include "core/error.h"
#include "model/model.h"
#include "model/params.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes per second of memory traffic on all threads, best of 3: a copy of
 * n bytes (read + written, as STREAM counts it), and a read of n bytes (a
 * sum, which is what a matrix-vector product does with its matrix). */
static void bandwidth(size_t n, double *copy_bw, double *read_bw)
{
    /* The CPU backend's memory, as the weights': huge pages where the
     * system gives them (cpu.c), which raise the bandwidth of a stream. */
    const Backend *cpu = backend_cpu();
    float *a = cpu->alloc(n, "bandwidth probe"), *b = cpu->alloc(n, "bandwidth probe");
    const size_t m = n / sizeof(float);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < m; i++)
        a[i] = 1.0f, b[i] = 2.0f;
    double best_copy = 1e30, best_read = 1e30, sum = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < m; i++)
            b[i] = a[i];
        double dt = now_s() - t0;
        best_copy = dt < best_copy ? dt : best_copy;
        t0 = now_s();
        float s = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
        for (size_t i = 0; i < m; i++)
            s += b[i];
        dt = now_s() - t0;
        best_read = dt < best_read ? dt : best_read;
        sum += s;
    }
    volatile double sink = sum;
    (void)sink;
    cpu->release(a);
    cpu->release(b);
    *copy_bw = 2.0 * (double)n / best_copy;
    *read_bw = (double)n / best_read;
}

/* --ops: the time of each op of the decode steps, by op and shape.  The
 * model runs over a copy of the backend's table whose ops are replaced by
 * timed wrappers for the profiled round only. */
enum { MAX_SLOTS = 32 };
static struct {
    char name[48];
    double s, bytes;
    long calls;
} slots[MAX_SLOTS];
static const Backend *inner;
static double t_op;

static void op_done(const char *name, double bytes)
{
    const double dt = now_s() - t_op;
    int i = 0;
    while (i < MAX_SLOTS && slots[i].calls && strcmp(slots[i].name, name))
        i++;
    TRD_ASSERT(i < MAX_SLOTS);
    snprintf(slots[i].name, sizeof slots[i].name, "%s", name);
    slots[i].s += dt;
    slots[i].bytes += bytes;
    slots[i].calls++;
}

static void timed_matmul_forward(float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int C, int OC)
{
    char name[48];
    snprintf(name, sizeof name, "matmul %dx%d%s", OC, C, bias ? " +bias" : "");
    t_op = now_s();
    inner->matmul_forward(out, inp, weight, bias, N, C, OC);
    op_done(name, 4.0 * OC * C);
}
static void timed_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                    const float *w, const float *b, int N, int C, float eps)
{
    t_op = now_s();
    inner->layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
    op_done("layernorm", 0);
}
static void timed_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N,
                                  int C, float eps)
{
    t_op = now_s();
    inner->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    op_done("rmsnorm", 0);
}
/* pos0 is the decoder's position also where the op reads it at `at` */
static void timed_attention_decode(float *out, const float *qkv, float *kc, float *vc, int n,
                                   const int32_t *at, int pos0, int H, int KVH, int hs)
{
    t_op = now_s();
    inner->attention_decode(out, qkv, kc, vc, n, at, pos0, H, KVH, hs);
    op_done("attention_decode", 2.0 * 4 * (pos0 + n) * KVH * hs);
}
static void timed_rope_decode(float *qkv, int n, int pos0, int H, int KVH, int hs, RopeFreq rf)
{
    t_op = now_s();
    inner->rope_decode(qkv, n, pos0, H, KVH, hs, rf);
    op_done("rope_decode", 0);
}
static void timed_add(float *out, const float *a, const float *b, size_t n)
{
    t_op = now_s();
    inner->add(out, a, b, n);
    op_done("add", 0);
}
static void timed_gelu_forward(float *out, const float *inp, size_t n)
{
    t_op = now_s();
    inner->gelu_forward(out, inp, n);
    op_done("gelu", 0);
}
static void timed_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    t_op = now_s();
    inner->swiglu_forward(out, gate, up, n);
    op_done("swiglu", 0);
}
static void timed_embedding_forward(float *out, const int32_t *tokens, const int32_t *pos,
                                    const float *wte, const float *wpe, int N, int T, int C,
                                    int vocab_start, int V)
{
    t_op = now_s();
    inner->embedding_forward(out, tokens, pos, wte, wpe, N, T, C, vocab_start, V);
    op_done("embedding", 0);
}
static void timed_to_backend(void *dst, const void *host, size_t bytes)
{
    t_op = now_s();
    inner->to_backend(dst, host, bytes);
    op_done("to_backend", 0);
}
static void timed_to_host(void *host, const void *src, size_t bytes)
{
    t_op = now_s();
    inner->to_host(host, src, bytes);
    op_done("to_host (logits)", 0);
}

static void time_ops(Backend *t)
{
    t->matmul_forward = timed_matmul_forward;
    t->layernorm_forward = timed_layernorm_forward;
    t->rmsnorm_forward = timed_rmsnorm_forward;
    t->attention_decode = timed_attention_decode;
    t->rope_decode = timed_rope_decode;
    t->add = timed_add;
    t->gelu_forward = timed_gelu_forward;
    t->swiglu_forward = timed_swiglu_forward;
    t->embedding_forward = timed_embedding_forward;
    t->to_backend = timed_to_backend;
    t->to_host = timed_to_host;
}

/* The GPU's copy bandwidth (bytes read + written per second), best of 3
 * device-to-device copies of n bytes. */
static double device_bandwidth(const Backend *be, size_t n)
{
#ifdef TRD_HAVE_CUDA
    void *a = be->alloc(n, "bandwidth probe"), *b = be->alloc(n, "bandwidth probe");
    double best = 1e30;
    be->copy(b, a, n); /* warm-up */
    backend_cuda_synchronize();
    for (int r = 0; r < 3; r++) {
        const double t0 = now_s();
        be->copy(b, a, n);
        backend_cuda_synchronize();
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    be->release(a);
    be->release(b);
    return 2.0 * (double)n / best;
#else
    (void)be;
    (void)n;
    return 0;
#endif
}

int main(int argc, char **argv)
{
    Config cfg;
    config_defaults(&cfg);
    cfg.model.arch = ARCH_GPT2;
    cfg.model.layers = 12;
    cfg.model.hidden = 768;
    cfg.model.heads = 12;
    cfg.model.vocab = 50257;
    cfg.model.seq_len = 1024;
    cfg.training.micro_batch = cfg.training.global_batch = cfg.training.steps = 1;
    snprintf(cfg.data.path, sizeof cfg.data.path, "unused");
    int tokens = 128, prompt = 1, rounds = 3, cuda = 0, ops = 0;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--ops")) {
            ops = 1;
            i--;
            continue;
        }
        if (i + 1 >= argc)
            trd_fatal(TRD_EXIT_INPUT, NULL, "%s needs a value", argv[i]);
        const int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers"))
            cfg.model.layers = v;
        else if (!strcmp(argv[i], "--hidden"))
            cfg.model.hidden = v;
        else if (!strcmp(argv[i], "--heads"))
            cfg.model.heads = v;
        else if (!strcmp(argv[i], "--vocab"))
            cfg.model.vocab = v;
        else if (!strcmp(argv[i], "--seq"))
            cfg.model.seq_len = v;
        else if (!strcmp(argv[i], "--tokens"))
            tokens = v;
        else if (!strcmp(argv[i], "--prompt"))
            prompt = v;
        else if (!strcmp(argv[i], "--rounds"))
            rounds = v;
        else if (!strcmp(argv[i], "--backend"))
            cuda = !strcmp(argv[i + 1], "cuda");
        else if (!strcmp(argv[i], "--arch"))
            cfg.model.arch = !strcmp(argv[i + 1], "llama") ? ARCH_LLAMA : ARCH_GPT2;
        else
            trd_fatal(TRD_EXIT_INPUT, NULL, "unknown option %s", argv[i]);
    }
    char err[CFG_ERR];
    if (config_validate(&cfg, 1, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    if (prompt < 1 || tokens < 1 || prompt + tokens > cfg.model.seq_len)
        trd_fatal(TRD_EXIT_INPUT, NULL, "--prompt %d --tokens %d: both >= 1, and --seq >= %d",
                  prompt, tokens, prompt + tokens);

    const Backend *be = backend_cpu();
    if (cuda) {
#ifdef TRD_HAVE_CUDA
        if (backend_cuda_devices() < 1)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "--backend cuda: no CUDA device is visible");
        backend_cuda_set_device(0);
        be = backend_cuda();
#else
        trd_fatal(TRD_EXIT_INPUT, "build with -Dcuda=enabled",
                  "--backend cuda: built without CUDA");
#endif
    }
    if (ops && cuda)
        trd_fatal(TRD_EXIT_INPUT, NULL, "--ops times the CPU backend's ops only");
    /* The model runs over a copy of the table, which --ops changes later. */
    Backend table = *be;
    inner = be;
    ParamShard sh = params_full_shard(&cfg.model);
    Model *m = model_create(&cfg, &table, &sh, 1);
    Decoder *dc = decoder_create(m, prompt + tokens);
    /* the prompt, then (--ops) the tokens chosen */
    int32_t *ids = malloc((size_t)(prompt + tokens) * sizeof *ids);
    for (int i = 0; i < prompt; i++)
        ids[i] = i % cfg.model.vocab;

    /* Bytes a token reads: every weight except the position table and the
     * embedding rows not looked up (one row), the output head whole (tied:
     * the token embedding), and the cache, 2 x layers x pos x kv width,
     * at the mean position of the timed tokens. */
    const ParamTable *pt = model_params(m);
    const int hs = cfg.model.hidden / cfg.model.heads;
    double weights = 0;
    for (int i = 0; i < pt->n; i++) {
        const ParamSpec *p = &pt->p[i];
        if (strstr(p->name, "wpe"))
            continue;
        weights += (double)p->numel * 4;
    }
    if (!cfg.model.tie_embeddings) /* the input table: one row read, not all */
        weights -= ((double)cfg.model.vocab - 1) * cfg.model.hidden * 4;
    const double cache =
        2.0 * cfg.model.layers * (prompt + tokens / 2.0) * cfg.model.kv_heads * hs * 4;
    const double per_token = weights + cache;

    /* As trident generate decodes greedily: the argmax on the backend, the
     * host reading the token alone, the one-row step a CUDA graph where
     * the backend has them (decoder_next). */
    decoder_sampling(dc, 0, NULL);
    double best_tps = 0, best_copy = 0, best_read = 0;
    for (int r = 0; r < rounds; r++) {
        decoder_reset(dc);
        decoder_next(dc, ids, prompt);
        const double t0 = now_s();
        for (int t = 1; t <= tokens; t++)
            decoder_next(dc, NULL, 1);
        const double tps = tokens / (now_s() - t0);
        double copy_bw, read_bw;
        if (cuda)
            copy_bw = read_bw = device_bandwidth(be, (size_t)1 << 30);
        else
            bandwidth((size_t)1 << 30, &copy_bw, &read_bw);
        best_tps = tps > best_tps ? tps : best_tps;
        best_copy = copy_bw > best_copy ? copy_bw : best_copy;
        best_read = read_bw > best_read ? read_bw : best_read;
        printf("round %d: %.1f tokens/s, copy %.2f GB/s, read %.2f GB/s\n", r + 1, tps,
               1e-9 * copy_bw, 1e-9 * read_bw);
    }
    /* The stricter limit: the faster of the two ways to move memory. */
    const double best_bw = best_copy > best_read ? best_copy : best_read;
    const double limit = best_bw / per_token;
    printf("model: %s layers %d hidden %d heads %d vocab %d | %.1f M params | %d new tokens\n",
           config_arch_name(cfg.model.arch), cfg.model.layers, cfg.model.hidden, cfg.model.heads,
           cfg.model.vocab, 1e-6 * (double)params_count_real(&cfg.model), tokens);
    if (prompt > 1)
        printf("context                  a %d-token prompt, then the %d new tokens\n", prompt,
               tokens);
    printf("bytes read per token     %.1f MB (weights %.1f, key/value cache %.1f on average)\n",
           1e-6 * per_token, 1e-6 * weights, 1e-6 * cache);
    if (cuda)
        printf("memory bandwidth         %.2f GB/s (GPU: a 1 GiB device-to-device copy, read + "
               "write, best of the run) | %s backend\n",
               1e-9 * best_bw, be->name);
    else
        printf("memory bandwidth         %.2f GB/s (1 GiB on %d threads: copy %.2f read + write, "
               "read %.2f; the faster, best of the run)\n",
               1e-9 * best_bw, omp_get_max_threads(), 1e-9 * best_copy, 1e-9 * best_read);
    printf("decode tokens/s          %.1f (best round; %s)\n", best_tps,
           decoder_graphed(dc) ? "one CUDA graph a token"
           : be->graph_begin   ? "ops one by one: the CUDA graph failed"
                               : "ops one by one: the backend has no graphs");
    printf("bandwidth limit          %.1f tokens/s\n", limit);
    printf("ratio to the limit       %.3f   (%s)\n", best_tps / limit,
           cuda ? "no goal is set for the GPU"
                : "goal >= 0.7, where llama.cpp's CPU decoding runs");
    if (ops) {
        /* One more round with every op timed: per token, by op and shape. */
        time_ops(&table);
        decoder_reset(dc);
        const float *logits = decoder_step(dc, ids, prompt);
        memset(slots, 0, sizeof slots);
        double argmax_s = 0;
        const double t0 = now_s();
        for (int t = prompt; t < prompt + tokens; t++) {
            const double ta = now_s();
            int best = 0;
            for (int v = 1; v < cfg.model.vocab; v++)
                best = logits[v] > logits[best] ? v : best;
            ids[t] = best;
            argmax_s += now_s() - ta;
            logits = decoder_step(dc, ids + t, 1);
        }
        const double total = now_s() - t0;
        double in_ops = 0;
        printf("\nper token, op by op (%.1f tokens/s in this round, every op timed):\n",
               tokens / total);
        printf("  %-26s %6s %9s %6s %9s\n", "op", "calls", "ms", "share", "GB/s");
        for (int i = 0; i < MAX_SLOTS && slots[i].calls; i++) {
            in_ops += slots[i].s;
            printf("  %-26s %6.0f %9.3f %5.1f%%", slots[i].name, (double)slots[i].calls / tokens,
                   1e3 * slots[i].s / tokens, 100 * slots[i].s / total);
            if (slots[i].bytes > 0)
                printf(" %9.2f", 1e-9 * slots[i].bytes / slots[i].s);
            printf("\n");
        }
        printf("  %-26s %6d %9.3f %5.1f%%\n", "argmax (bench loop)", 1, 1e3 * argmax_s / tokens,
               100 * argmax_s / total);
        printf("  %-26s %6s %9.3f %5.1f%%\n", "rest (between ops)", "",
               1e3 * (total - in_ops - argmax_s) / tokens,
               100 * (total - in_ops - argmax_s) / total);
        printf("  %-26s %6s %9.3f\n", "token", "", 1e3 * total / tokens);
    }
    free(ids);
    decoder_free(dc);
    model_free(m);
    return 0;
}
