/* test_moe.c — mixture-of-experts layers (model.moe, docs/moe.md).
 *
 *   - one forward and backward of tiny GPT-2 and Llama MoE models against
 *     tests/moe_ref.py, an independent numpy reference: cross-entropy, the
 *     load-balancing and z-losses, the dropped count, and the gradient of
 *     the total loss (aux and z included) against finite differences;
 *     cases: top-2 with a shared expert, top-1 with a capacity that drops
 *     and a dense layer before the MoE layer, 8 experts at capacity 0.6;
 *   - the router's ties go to the lower expert index;
 *   - recompute full gives the gradients of recompute none;
 *   - backward accumulates: two at loss scale 0.5 equal one at 1;
 *   - the planner's active parameter count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "core/error.h"
#include "model/model.h"

enum { B = 2, T = 16, N = B * T, V = 37 };

typedef struct {
    ModelArch arch;
    int experts, top_k, every, ffn, shared;
    float capacity;
} Case;

static void moe_config(Config *c, const Case *k, Recompute rc)
{
    memset(c, 0, sizeof *c);
    ModelConfig *m = &c->model;
    m->arch = k->arch;
    m->layers = 2;
    m->hidden = 16;
    m->heads = 4;
    m->kv_heads = k->arch == ARCH_GPT2 ? 4 : 2;
    m->ffn_hidden = 32;
    m->vocab = V;
    m->vocab_pad_multiple = 8;
    m->seq_len = T;
    m->tie_embeddings = k->arch == ARCH_GPT2;
    m->norm_eps = 1e-5f;
    m->rope_theta = 10000.0f;
    m->init_std = 0.3f; /* large: routing far from uniform, experts unevenly loaded */
    m->moe_experts = k->experts;
    m->moe_top_k = k->top_k;
    m->moe_every = k->every;
    m->moe_ffn_hidden = k->ffn;
    m->moe_shared_experts = k->shared;
    m->moe_aux_loss_coef = 0.1f; /* large enough to show in the gradient */
    m->moe_z_loss_coef = 0.05f;
    m->moe_capacity_factor = k->capacity;
    c->training.recompute = rc;
    c->run.seed = 99;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static void make_batch(int32_t *tok, int32_t *tgt)
{
    uint64_t seed = 5;
    for (int n = 0; n < N; n++) {
        tok[n] = (int32_t)(lcg(&seed) % V);
        tgt[n] = (int32_t)(lcg(&seed) % V);
    }
    tgt[7] = -1; /* an ignored target: the mean counts the others */
}

static void put_floats(FILE *f, const char *key, const float *x, size_t n)
{
    fprintf(f, "%s", key);
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %.9g", (double)x[i]);
    fputc('\n', f);
}

/* The dump moe_ref.py reads: config, batch, results, table, params, grads. */
static void dump(const char *path, const Config *c, const Model *m, const int32_t *tok,
                 const int32_t *tgt, float loss, const MoeStats *st)
{
    const ModelConfig *mc = &c->model;
    const ParamTable *t = model_params(m);
    FILE *f = fopen(path, "w");
    TRD_ASSERT(f);
    fprintf(f, "gpt2 %d\n", mc->arch == ARCH_GPT2);
    fprintf(f, "dims %d %d %d %d %d %d %d\n", mc->layers, mc->hidden, mc->heads, mc->kv_heads, B, T,
            V);
    fprintf(f, "moe %d %d %d %d %d %.9g %.9g %.9g\n", mc->moe_experts, mc->moe_top_k, mc->moe_every,
            mc->moe_ffn_hidden, mc->moe_shared_experts, (double)mc->moe_aux_loss_coef,
            (double)mc->moe_z_loss_coef, (double)mc->moe_capacity_factor);
    fprintf(f, "eps %.9g\nrope %.9g\n", (double)mc->norm_eps, (double)mc->rope_theta);
    fprintf(f, "tokens");
    for (int n = 0; n < N; n++)
        fprintf(f, " %d", tok[n]);
    fprintf(f, "\ntargets");
    for (int n = 0; n < N; n++)
        fprintf(f, " %d", tgt[n]);
    fprintf(f, "\nresult %.9g %.17g %.17g %.0f\n", (double)loss, st->aux_sum, st->z_sum,
            st->dropped);
    for (int i = 0; i < t->n; i++)
        fprintf(f, "param %s %lld %lld %zu\n", t->p[i].name, (long long)t->p[i].shape[0],
                (long long)t->p[i].shape[1], t->p[i].offset);
    put_floats(f, "params", model_param_buffer((Model *)m), t->numel);
    put_floats(f, "grads", model_grad_buffer((Model *)m), t->numel);
    fclose(f);
}

static Model *run(const Case *k, Recompute rc, float *loss, MoeStats *st)
{
    Config c;
    moe_config(&c, k, rc);
    ParamShard sh = params_full_shard(&c.model);
    Model *m = model_create(&c, backend_cpu(), &sh, B);
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt);
    model_zero_grad(m);
    *loss = model_forward(m, tok, tgt);
    model_backward(m, 1.0f);
    *st = model_take_moe_stats(m);
    return m;
}

static void against_reference(const Case *k, const char *what)
{
    float loss;
    MoeStats st;
    Model *m = run(k, RECOMPUTE_NONE, &loss, &st);
    Config c;
    moe_config(&c, k, RECOMPUTE_NONE);
    char path[] = "/tmp/test_moe_XXXXXX";
    const int fd = mkstemp(path);
    TRD_ASSERT(fd >= 0);
    close(fd);
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt);
    dump(path, &c, m, tok, tgt, loss, &st);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/moe_ref.py %s", path);
    printf("%s:\n", what);
    fflush(stdout);
    const int rc = system(cmd);
    CHECK(rc == 0, "%s: moe_ref.py exited %d", what, rc);
    CHECK(st.layers == (k->every == 1 ? 2 : 1), "%s: %g MoE layers counted", what, st.layers);
    unlink(path);
    model_free(m);
}

/* Equal logits: every row picks experts 0 .. k-1, with equal weights. */
static void ties(void)
{
    const Backend *be = backend_cpu();
    enum { E = 5, K = 3, R = 2 };
    float logits[R * E], probs[R * E], lse[R], w[R * K];
    int32_t idx[R * K];
    for (int i = 0; i < R * E; i++)
        logits[i] = 0.25f;
    logits[E + 4] = 1.0f; /* row 1: expert 4 first, then the lowest of the rest */
    be->moe_router_forward(probs, lse, idx, w, logits, R, E, K);
    CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2, "row 0 picked %d %d %d", idx[0], idx[1],
          idx[2]);
    CHECK(idx[3] == 4 && idx[4] == 0 && idx[5] == 1, "row 1 picked %d %d %d", idx[3], idx[4],
          idx[5]);
    CHECK_CLOSE(w[0], 1.0 / 3, 1e-6, 0, "tied weight");
}

static void recompute_and_accumulate(const Case *k)
{
    float l1, l2;
    MoeStats st;
    Model *a = run(k, RECOMPUTE_NONE, &l1, &st);
    Model *b = run(k, RECOMPUTE_FULL, &l2, &st);
    const size_t P = model_params(a)->numel;
    const float *ga = model_grad_buffer(a), *gb = model_grad_buffer(b);
    double worst = 0;
    for (size_t i = 0; i < P; i++)
        worst = fmax(worst, fabs((double)ga[i] - gb[i]));
    CHECK(l1 == l2 && worst == 0, "recompute full: loss %g vs %g, gradient differs by %g", l1, l2,
          worst);

    /* Two backwards at 0.5 over the same forward input equal one at 1. */
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt);
    model_zero_grad(b);
    for (int r = 0; r < 2; r++) {
        model_forward(b, tok, tgt);
        model_backward(b, 0.5f);
    }
    worst = 0;
    double big = 0;
    for (size_t i = 0; i < P; i++) {
        worst = fmax(worst, fabs((double)ga[i] - gb[i]));
        big = fmax(big, fabs((double)ga[i]));
    }
    CHECK(worst <= 1e-5 * big, "accumulation: gradient differs by %g of %g", worst, big);
    model_free(a);
    model_free(b);
}

/* Active parameters: the total less (E - k) / E of every MoE layer's
 * expert tensors, from the table. */
static void active_count(const Case *k)
{
    Config c;
    moe_config(&c, k, RECOMPUTE_NONE);
    ModelConfig mc = c.model;
    mc.vocab_pad_multiple = 1;
    ParamShard sh = params_full_shard(&mc);
    ParamTable t;
    params_build(&t, &mc, &sh);
    double idle = 0;
    for (int i = 0; i < t.n; i++)
        if (strstr(t.p[i].name, ".moe.experts."))
            idle += (double)t.p[i].numel * (k->experts - k->top_k) / k->experts;
    CHECK_CLOSE((double)params_count_active(&c.model), (double)t.global_numel - idle, 0, 0.5,
                "active parameters");
    CHECK(params_count_real(&c.model) == t.global_numel, "total parameters");
    params_free(&t);
}

int main(void)
{
    const Case gpt2_top2_shared = {ARCH_GPT2, 4, 2, 1, 24, 1, 0.0f};
    const Case llama_top1_capacity = {ARCH_LLAMA, 4, 1, 2, 24, 0, 1.0f};
    const Case gpt2_e8_capacity = {ARCH_GPT2, 8, 2, 1, 16, 0, 0.6f}; /* 4.8 rows */
    const Case llama_top2_shared = {ARCH_LLAMA, 4, 2, 1, 24, 1, 0.0f};
    against_reference(&gpt2_top2_shared, "gpt2, 4 experts, top-2, a shared expert, dropless");
    against_reference(&llama_top1_capacity,
                      "llama, 4 experts, top-1, capacity 1.0, MoE every 2nd layer");
    against_reference(&gpt2_e8_capacity, "gpt2, 8 experts, top-2, capacity 0.6");
    against_reference(&llama_top2_shared, "llama, 4 experts, top-2, a shared expert");
    ties();
    recompute_and_accumulate(&gpt2_top2_shared);
    recompute_and_accumulate(&llama_top1_capacity);
    active_count(&gpt2_top2_shared);
    active_count(&llama_top1_capacity);
    return check_summary("moe");
}
