/* Decoding with the token chosen on the device and the one-row step as one
 * CUDA graph (decode.c decoder_next; docs/cuda.md "Decoding"), in the
 * emulation (suite 'emu'), for a tiny GPT-2 (learned positions) and a tiny
 * Llama (RoPE, grouped-query attention), greedy and sampled:
 *   tokens  decoder_next on the CPU backend gives the tokens of
 *           decoder_step + generate.c's choice from the host's logits (the
 *           path it replaces), and the CUDA backend's, captured as a graph,
 *           eager (a table without graphs) and with instantiation failing
 *           (TRIDENT_EMU_NO_GRAPHS=1: the fallback), give the CPU's;
 *   budget  each token from the third on (the first is the prompt's, the
 *           second the eager step that sizes every workspace, the graph is
 *           captured at the third), counted by the emulation
 *           (TRD_EMU_STATS): at most 1 host synchronization, no copy to
 *           the device, one copy of 4 bytes to the host, no memset or
 *           allocation; with the graph 1 graph launch and no kernel launch
 *           or cuBLAS call outside it, eager no graph launch;
 *   nodes   the graph's kernels a token, exactly: each linear one GEMV
 *           with the norm before it and its bias and the GELU or the
 *           residual add in it (decode_linear), so a separate norm, bias,
 *           GELU or add kernel back in the step fails here.  GPT-2: 6 a
 *           layer (norm + qkv, cache append + attention, projection +
 *           residual, norm + fc + GELU, MLP projection + residual) + 3
 *           (embedding, final norm + head, choice); Llama: 7 a layer
 *           (RoPE, and norm + gate + up + SwiGLU for norm + fc + GELU)
 *           + 3.
 * The prompt, 5 tokens, is above decode_linear's rows with a norm or
 * SwiGLU (DECODE_GEMV_ROWS): its step runs the norm ops, the gate's and
 * up's linears and swiglu_forward apart (decode.c).
 * A second or so. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda.h"
#include "check.h"
#include "config/config.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/params.h"

/* A prompt of 28: the graph's steps see 30 to 36 positions, so that
 * attention_decode goes from one split to two (past 32, decode.cu) while
 * the same graph replays. */
enum { PROMPT = 28, NEW = 8, TOTAL = PROMPT + NEW, FIRST_STEADY = 2 };
static int32_t prompt[PROMPT];
static double u[TOTAL + 1];

/* generate.c's next_token without top-k or top-p, on the host's logits */
static int host_choice(const float *l, int V, double temperature, double uu)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[best])
            best = v;
    if (temperature <= 0)
        return best;
    const double mx = l[best];
    double sum = 0, acc = 0;
    for (int v = 0; v < V; v++)
        sum += (float)exp((l[v] - mx) / temperature);
    for (int v = 0; v < V; v++) {
        acc += (float)exp((l[v] - mx) / temperature);
        if (uu * sum < acc)
            return v;
    }
    return V - 1;
}

static Config tiny(int llama)
{
    Config cfg;
    config_defaults(&cfg);
    cfg.model.arch = llama ? ARCH_LLAMA : ARCH_GPT2;
    cfg.model.layers = 2;
    cfg.model.hidden = 64;
    cfg.model.heads = 4;
    cfg.model.kv_heads = llama ? 2 : 4;
    cfg.model.vocab = 257;
    cfg.model.seq_len = 48;
    cfg.training.micro_batch = cfg.training.global_batch = cfg.training.steps = 1;
    snprintf(cfg.data.path, sizeof cfg.data.path, "unused");
    char err[CFG_ERR];
    if (config_validate(&cfg, 1, err) != 0) {
        fprintf(stderr, "config: %s\n", err);
        exit(1);
    }
    return cfg;
}

/* NEW tokens after the prompt; host: decoder_step and host_choice, else
 * decoder_next.  With stats, each token is a step of the emulation's
 * counts; with logits (not with stats: reading them is a copy), the
 * [NEW][V] logits the tokens were chosen from.  Returns whether the
 * one-row steps ran as a graph. */
static int generate(const Config *cfg, const Backend *be, double temperature, int host, int stats,
                    int32_t *out, float *logits)
{
    ParamShard sh = params_full_shard(&cfg->model);
    Model *m = model_create(cfg, be, &sh, 1);
    Decoder *dc = decoder_create(m, TOTAL);
    const int V = decoder_vocab(dc);
    if (stats) /* the counts so far (model_create's) are not a token's */
        backend_cuda_step_end(-1, 0);
    if (host) {
        int32_t ids[TOTAL];
        memcpy(ids, prompt, sizeof prompt);
        const float *l = decoder_step(dc, ids, PROMPT);
        for (int i = 0; i < NEW; i++) {
            ids[PROMPT + i] = out[i] = host_choice(l, V, temperature, u[PROMPT + i]);
            if (i + 1 < NEW)
                l = decoder_step(dc, ids + PROMPT + i, 1);
        }
    } else {
        decoder_sampling(dc, temperature, u);
        for (int i = 0; i < NEW; i++) {
            out[i] = decoder_next(dc, i ? NULL : prompt, i ? 1 : PROMPT);
            if (logits)
                memcpy(logits + (size_t)i * V, decoder_logits(dc), (size_t)V * sizeof(float));
            if (stats)
                backend_cuda_step_end(i, 0);
        }
    }
    const int graphed = decoder_graphed(dc);
    decoder_free(dc);
    model_free(m);
    return graphed;
}

/* value of `key` in the step line of token `step` in the counts file */
static long count(const char *path, int step, const char *key)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    long v = -1;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "step\t", 5) != 0 || atoi(line + 5) != step)
            continue;
        char want[64];
        snprintf(want, sizeof want, "\t%s\t", key);
        const char *at = strstr(line, want);
        v = at ? atol(at + strlen(want)) : -1;
    }
    if (f)
        fclose(f);
    return v;
}

static void check_budget(const char *path, const char *what, int graph)
{
    for (int t = FIRST_STEADY; t < NEW; t++) {
        const long syncs = count(path, t, "syncs"), launches = count(path, t, "launches");
        CHECK(syncs >= 0 && syncs <= 1, "%s token %d: %ld host syncs", what, t, syncs);
        CHECK(count(path, t, "h2d") == 0, "%s token %d: %ld copies to the device", what, t,
              count(path, t, "h2d"));
        CHECK(count(path, t, "d2h") == 1 && count(path, t, "d2h_bytes") == 4,
              "%s token %d: %ld copies (%ld bytes) to the host, not one of 4", what, t,
              count(path, t, "d2h"), count(path, t, "d2h_bytes"));
        CHECK(count(path, t, "memsets") == 0 && count(path, t, "mallocs") == 0,
              "%s token %d: memsets or allocations", what, t);
        if (graph)
            CHECK(count(path, t, "graph_launches") == 1 && launches == 0 &&
                      count(path, t, "gemm_calls") == 0,
                  "%s token %d: %ld graph launches, %ld kernel launches and %ld cuBLAS calls "
                  "outside it, not 1, 0, 0",
                  what, t, count(path, t, "graph_launches"), launches,
                  count(path, t, "gemm_calls"));
        else
            CHECK(count(path, t, "graph_launches") == 0 && launches > 0,
                  "%s token %d: %ld graph launches, %ld kernel launches", what, t,
                  count(path, t, "graph_launches"), launches);
    }
}

static int same(const int32_t *a, const int32_t *b) { return !memcmp(a, b, NEW * sizeof *a); }

/* the largest difference relative to the largest logit */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        top = fmax(top, fabs((double)b[i]));
    }
    return d / top;
}

int main(void)
{
    for (int i = 0; i <= TOTAL; i++)
        u[i] = (double)(rng_u64(7, (uint64_t)i) >> 11) * 0x1.0p-53;
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (5 + 37 * i) % 257;
    char path[] = "/tmp/trd_decode_graph_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    Backend eager = *backend_cuda();
    eager.graph_begin = NULL; /* decoder_next: no graph to capture */
    for (int llama = 0; llama <= 1; llama++) {
        const Config cfg = tiny(llama);
        for (int k = 0; k < 2; k++) {
            const double temperature = k ? 1.5 : 0;
            char what[64];
            snprintf(what, sizeof what, "%s %s", llama ? "llama" : "gpt2",
                     k ? "temperature 1.5" : "greedy");
            int32_t ref[NEW], cpu[NEW], graph[NEW], one_by_one[NEW], fallback[NEW];
            static float l_cpu[NEW * 257], l_graph[NEW * 257], l_fallback[NEW * 257];
            generate(&cfg, backend_cpu(), temperature, 1, 0, ref, NULL);
            generate(&cfg, backend_cpu(), temperature, 0, 0, cpu, l_cpu);
            CHECK(same(cpu, ref), "%s: cpu decoder_next != decoder_step + host choice", what);

            unlink(path);
            setenv("TRD_EMU_STATS", path, 1);
            const int graphed = generate(&cfg, backend_cuda(), temperature, 0, 1, graph, NULL);
            unsetenv("TRD_EMU_STATS");
            CHECK(graphed, "%s: the one-row step is not a graph", what);
            CHECK(same(graph, cpu), "%s: cuda graph tokens != cpu tokens", what);
            check_budget(path, what, 1);
            const long nodes = count(path, FIRST_STEADY, "graph_nodes");
            const long want_nodes = (llama ? 7 : 6) * cfg.model.layers + 3;
            CHECK(nodes == want_nodes, "%s: %ld graph nodes a token, not %ld", what, nodes,
                  want_nodes);
            int32_t again[NEW];
            generate(&cfg, backend_cuda(), temperature, 0, 0, again, l_graph);
            CHECK(same(again, cpu), "%s: cuda graph tokens != cpu tokens", what);
            const double rel = rel_diff(l_graph, l_cpu, sizeof l_cpu / sizeof *l_cpu);
            CHECK(rel <= 1e-5, "%s: cuda graph logits differ from the cpu's by %.3g", what, rel);

            unlink(path);
            setenv("TRD_EMU_STATS", path, 1);
            const int eager_graphed = generate(&cfg, &eager, temperature, 0, 1, one_by_one, NULL);
            unsetenv("TRD_EMU_STATS");
            CHECK(!eager_graphed, "%s: a graph without graph_begin", what);
            CHECK(same(one_by_one, cpu), "%s: cuda eager tokens != cpu tokens", what);
            check_budget(path, what, 0);

            setenv("TRIDENT_EMU_NO_GRAPHS", "1", 1);
            const int failed_graphed =
                generate(&cfg, backend_cuda(), temperature, 0, 0, fallback, l_fallback);
            unsetenv("TRIDENT_EMU_NO_GRAPHS");
            CHECK(!failed_graphed, "%s: a graph where instantiation fails", what);
            CHECK(same(fallback, cpu), "%s: cuda fallback tokens != cpu tokens", what);
            const double rel_fb = rel_diff(l_fallback, l_cpu, sizeof l_cpu / sizeof *l_cpu);
            CHECK(rel_fb <= 1e-5, "%s: cuda fallback logits differ from the cpu's by %.3g", what,
                  rel_fb);

            printf("%s: cuda graph tokens", what);
            for (int i = 0; i < NEW; i++)
                printf(" %d", (int)graph[i]);
            printf(", logits %.2g from the cpu's (relative), %ld graph nodes a token\n", rel,
                   nodes);
        }
    }
    unlink(path);
    return check_summary("decode_graph");
}
