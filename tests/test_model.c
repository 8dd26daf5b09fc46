/* test_model.c — the GPT-2 and Llama models against finite differences.
 *
 * For a tiny GPT-2 (tied embeddings, padded vocabulary) and a tiny Llama
 * (grouped-query attention, untied head), under each recompute mode:
 *   - directional finite differences of the loss agree with <grad, d>, over
 *     all parameters at once and over single tensors;
 *   - gradients do not depend on the recompute mode;
 *   - the loss at init is close to ln(V);
 *   - backward accumulates: two backwards at loss_scale 0.5 equal one at 1;
 *   - padded vocabulary rows get no gradient;
 *   - SGD on one fixed batch memorises it;
 *   - packed documents (model_set_positions): finite differences hold, and
 *     every token's loss in a packed window equals its loss with its
 *     document alone at the start of a sequence.
 * Plus activation memory per recompute mode and the FLOP formula. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "model/model.h"

enum { B = 2, T = 8, N = B * T, V = 37 };

static void tiny_config(Config *c, ModelArch arch, Recompute rc, float init_std)
{
    memset(c, 0, sizeof *c);
    ModelConfig *m = &c->model;
    m->arch = arch;
    m->layers = 2;
    m->hidden = 16;
    m->heads = 4;
    m->kv_heads = arch == ARCH_GPT2 ? 4 : 2;
    m->ffn_hidden = arch == ARCH_GPT2 ? 64 : 32;
    m->vocab = V;
    m->vocab_pad_multiple = 8; /* Vp = 40: three padding rows */
    m->seq_len = T;
    m->tie_embeddings = arch == ARCH_GPT2;
    m->norm_eps = 1e-5f;
    m->rope_theta = 10000.0f;
    m->init_std = init_std;
    c->training.recompute = rc;
    c->run.seed = 1234;
}

static Model *tiny_model_on(const Backend *be, ModelArch arch, Recompute rc, float init_std)
{
    Config c;
    tiny_config(&c, arch, rc, init_std);
    ParamShard sh = params_full_shard(&c.model);
    return model_create(&c, be, &sh, B);
}

static Model *tiny_model(ModelArch arch, Recompute rc, float init_std)
{
    return tiny_model_on(backend_cpu(), arch, rc, init_std);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Random tokens; targets random too, with two positions ignored (-1) so the
 * mean over counted positions is exercised. */
static void make_batch(int32_t *tok, int32_t *tgt, uint64_t seed, int ignore)
{
    for (int n = 0; n < N; n++) {
        tok[n] = (int32_t)(lcg(&seed) % V);
        tgt[n] = (int32_t)(lcg(&seed) % V);
    }
    if (ignore) {
        tgt[3] = -1;
        tgt[12] = -1;
    }
}

static double normal(uint64_t *s)
{
    double u1 = ((double)lcg(s) + 1.0) / 2147483649.0, u2 = (double)lcg(s) / 2147483648.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Zero the direction on padded vocabulary rows (they carry no information). */
static void zero_padding(const ParamTable *t, const ModelConfig *mc, double *d)
{
    const char *names[] = {"embed.wte.weight", "head.weight"};
    for (int k = 0; k < 2; k++) {
        const ParamSpec *p = params_find(t, names[k]);
        if (!p)
            continue;
        for (int64_t r = 0; r < p->local_shape[0]; r++)
            if (p->local_start[0] + r >= mc->vocab)
                for (int64_t c = 0; c < p->local_shape[1]; c++)
                    d[p->offset + (size_t)(r * p->local_shape[1] + c)] = 0.0;
    }
}

/* Random direction over one tensor (name) or over everything (NULL). */
static void direction(const ParamTable *t, const ModelConfig *mc, const char *name, double *d,
                      uint64_t seed)
{
    memset(d, 0, t->numel * sizeof *d);
    size_t lo = 0, hi = t->numel;
    if (name) {
        const ParamSpec *p = params_find(t, name);
        CHECK(p != NULL, "no parameter %s", name);
        if (!p)
            return;
        lo = p->offset;
        hi = p->offset + p->numel;
    }
    for (size_t i = lo; i < hi; i++)
        d[i] = normal(&seed);
    zero_padding(t, mc, d);
}

/* Central difference of the loss along d against <grad, d> (grad of the
 * unscaled mean loss, already in the gradient buffer). */
static void check_direction(Model *m, const int32_t *tok, const int32_t *tgt, const double *d,
                            double eps, double rtol, const char *what)
{
    const ParamTable *t = model_params(m);
    float *p = model_param_buffer(m);
    const float *g = model_grad_buffer(m);
    float *p0 = malloc(t->numel * sizeof *p0);
    memcpy(p0, p, t->numel * sizeof *p0);

    double an = 0.0, dnorm = 0.0, gnorm = 0.0;
    for (size_t i = 0; i < t->numel; i++) {
        an += (double)g[i] * d[i];
        dnorm += d[i] * d[i];
        gnorm += (double)g[i] * g[i] * (d[i] != 0.0);
    }
    for (size_t i = 0; i < t->numel; i++)
        p[i] = (float)(p0[i] + eps * d[i]);
    double lp = model_forward(m, tok, tgt);
    for (size_t i = 0; i < t->numel; i++)
        p[i] = (float)(p0[i] - eps * d[i]);
    double lm = model_forward(m, tok, tgt);
    memcpy(p, p0, t->numel * sizeof *p0);
    free(p0);

    const double fd = (lp - lm) / (2.0 * eps);
    /* fp32 loss: each evaluation is off by ~1e-6, so allow that much over 2 eps
     * on top of the relative tolerance. */
    const double atol = 2e-6 / eps;
    CHECK(fabs(fd - an) <= atol + rtol * fabs(an) && fabs(an) > 10 * atol,
          "%s: finite difference %.7g vs <grad,d> %.7g (|g| on support %.3g, |d| %.3g)", what, fd,
          an, sqrt(gnorm), sqrt(dnorm));
}

static void gradient_of(Model *m, const int32_t *tok, const int32_t *tgt)
{
    model_zero_grad(m);
    model_forward(m, tok, tgt);
    model_backward(m, 1.0f);
}

/* Document positions of the packed test batch: sequence 0 holds documents
 * of 3, 1 and 4 tokens, sequence 1 of 6 and 2 (batch_positions' form). */
static const int32_t doc_pos[N] = {0, 1, 2, 0, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1};

/* pos: NULL, or packed documents' positions for every forward. */
static void test_gradcheck(ModelArch arch, Recompute rc, const int32_t *pos, const char *label)
{
    /* A larger init than training uses, so the function is far from linear
     * in every tensor and each part of backward is exercised. */
    Model *m = tiny_model(arch, rc, 0.2f);
    model_set_positions(m, pos);
    Config c;
    tiny_config(&c, arch, rc, 0.2f);
    const ParamTable *t = model_params(m);
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt, 7, 1);
    gradient_of(m, tok, tgt);

    double *d = malloc(t->numel * sizeof *d);
    char what[160];
    direction(t, &c.model, NULL, d, 11);
    snprintf(what, sizeof what, "%s all parameters", label);
    check_direction(m, tok, tgt, d, 1e-3, 1e-2, what);

    const char *gpt2_names[] = {
        "layers.0.attn.qkv.weight", "layers.1.attn.qkv.weight", "layers.0.ln2.weight",
        "layers.1.ln1.bias",        "layers.1.mlp.fc.weight",   "layers.0.attn.proj.bias",
        "final_norm.weight",        "embed.wte.weight",         "embed.wpe.weight"};
    const char *llama_names[] = {
        "layers.0.attn.qkv.weight", "layers.1.attn.qkv.weight", "layers.0.ln2.weight",
        "layers.1.mlp.gate.weight", "layers.0.mlp.up.weight",   "layers.1.mlp.down.weight",
        "final_norm.weight",        "embed.wte.weight",         "head.weight"};
    const char **names = arch == ARCH_GPT2 ? gpt2_names : llama_names;
    for (int k = 0; k < 9; k++) {
        direction(t, &c.model, names[k], d, 100 + (uint64_t)k);
        snprintf(what, sizeof what, "%s %s", label, names[k]);
        check_direction(m, tok, tgt, d, 1e-3, 1e-2, what);
    }
    free(d);
    model_free(m);
}

/* Each token of a packed window (doc_pos) has the loss it has with its
 * document alone at the start of a sequence (the rest of that sequence
 * other tokens, which a causal model cannot see): one forward per token,
 * only its target counted. */
static void test_documents_alone(ModelArch arch, Recompute rc, const char *label)
{
    Model *m = tiny_model(arch, rc, 0.2f);
    int32_t tok[N], tgt[N], one[N], alone[N], filler[N];
    make_batch(tok, tgt, 5, 0);
    make_batch(filler, one, 6, 0);
    double worst = 0;
    int tokens = 0;
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < N; i++)
            one[i] = i == n ? tgt[n] : -1;
        model_set_positions(m, doc_pos);
        const float packed = model_forward(m, tok, one);
        /* its document's tokens up to n, from position 0 of sequence 0 */
        const int start = n - doc_pos[n];
        memcpy(alone, filler, sizeof alone);
        memcpy(alone, tok + start, (size_t)(doc_pos[n] + 1) * sizeof *alone);
        for (int i = 0; i < N; i++)
            one[i] = i == doc_pos[n] ? tgt[n] : -1;
        model_set_positions(m, NULL);
        const float single = model_forward(m, alone, one);
        const double e = fabs((double)packed - single) / fabs((double)single);
        worst = e > worst ? e : worst;
        tokens++;
    }
    CHECK(worst <= 1e-5, "%s: %d tokens of packed documents have their loss alone (worst rel %.3g)",
          label, tokens, worst);
    model_free(m);
}

/* Gradients do not depend on the recompute mode, on backend be (the bf16
 * twin: activations stored in bf16, the attention's bf16 copy of its
 * output in the slot selective recompute shares). */
static void test_recompute_equal(const Backend *be, ModelArch arch, const char *label)
{
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt, 21, 1);
    Model *ref = tiny_model_on(be, arch, RECOMPUTE_NONE, 0.2f);
    gradient_of(ref, tok, tgt);
    const float loss_ref = model_forward(ref, tok, tgt);
    const ParamTable *t = model_params(ref);
    const Recompute modes[] = {RECOMPUTE_SELECTIVE, RECOMPUTE_FULL};
    for (int k = 0; k < 2; k++) {
        Model *m = tiny_model_on(be, arch, modes[k], 0.2f);
        gradient_of(m, tok, tgt);
        const float *g = model_grad_buffer(m), *gr = model_grad_buffer(ref);
        double worst = 0.0;
        for (size_t i = 0; i < t->numel; i++) {
            double e = fabs((double)g[i] - gr[i]) / (1.0 + fabs((double)gr[i]));
            worst = e > worst ? e : worst;
        }
        CHECK(worst <= 1e-6, "%s recompute %s: gradients differ from none by %.3g", label,
              k == 0 ? "selective" : "full", worst);
        CHECK(model_forward(m, tok, tgt) == loss_ref, "%s: loss depends on recompute", label);
        model_free(m);
    }
    model_free(ref);
}

static void test_init_loss(ModelArch arch, Recompute rc, const char *label)
{
    Model *m = tiny_model(arch, rc, 0.02f);
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt, 3, 0);
    const float loss = model_forward(m, tok, tgt);
    char what[128];
    snprintf(what, sizeof what, "%s loss at init vs ln(V)", label);
    CHECK_CLOSE(loss, log((double)V), 0.0, 0.1, what);
    model_free(m);
}

/* Backward accumulates into the gradient buffer, scaled by loss_scale. */
static void test_accumulation(ModelArch arch, Recompute rc, const char *label)
{
    Model *m = tiny_model(arch, rc, 0.2f);
    const size_t n = model_params(m)->numel;
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt, 5, 1);
    gradient_of(m, tok, tgt);
    float *once = malloc(n * sizeof *once);
    memcpy(once, model_grad_buffer(m), n * sizeof *once);

    model_zero_grad(m);
    for (int k = 0; k < 2; k++) {
        model_forward(m, tok, tgt);
        model_backward(m, 0.5f);
    }
    const float *twice = model_grad_buffer(m);
    double worst = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)twice[i] - once[i]) / (1e-6 + fabs((double)once[i]));
        worst = e > worst ? e : worst;
        norm += (double)once[i] * once[i];
    }
    CHECK(worst <= 1e-5 && norm > 0.0,
          "%s: 2 x backward(0.5) differs from backward(1) by %.3g (rel), |g|^2 %.3g", label, worst,
          norm);
    free(once);
    model_free(m);
}

/* Two micro-batches in flight (a pipeline stage under 1F1B): forward A,
 * forward B, backward A, backward B with two activation sets gives the
 * gradient of forward/backward A then B, bit for bit. */
static void test_activation_sets(ModelArch arch, Recompute rc, const char *label)
{
    Model *m = tiny_model(arch, rc, 0.2f);
    const size_t n = model_params(m)->numel;
    int32_t tok[2][N], tgt[2][N];
    make_batch(tok[0], tgt[0], 11, 1);
    make_batch(tok[1], tgt[1], 12, 0);
    model_zero_grad(m);
    float seq_loss[2];
    for (int k = 0; k < 2; k++) {
        seq_loss[k] = model_forward(m, tok[k], tgt[k]);
        model_backward(m, 0.5f);
    }
    float *seq = malloc(n * sizeof *seq);
    memcpy(seq, model_grad_buffer(m), n * sizeof *seq);

    model_set_activation_sets(m, 2);
    model_zero_grad(m);
    float loss[2];
    for (int k = 0; k < 2; k++) {
        model_use_activation_set(m, k);
        loss[k] = model_forward(m, tok[k], tgt[k]);
    }
    for (int k = 0; k < 2; k++) {
        model_use_activation_set(m, k);
        model_backward(m, 0.5f);
    }
    CHECK(loss[0] == seq_loss[0] && loss[1] == seq_loss[1], "%s: losses with two sets", label);
    CHECK(memcmp(seq, model_grad_buffer(m), n * sizeof *seq) == 0,
          "%s: interleaved micro-batches change the gradient", label);
    CHECK(model_memory(m).activations > 0, "%s: activation bytes", label);
    free(seq);
    model_free(m);
}

static void test_padding_rows(ModelArch arch, Recompute rc, const char *label)
{
    Model *m = tiny_model(arch, rc, 0.2f);
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt, 9, 0);
    gradient_of(m, tok, tgt);
    const ParamTable *t = model_params(m);
    const float *g = model_grad_buffer(m);
    const char *names[] = {"embed.wte.weight", "head.weight"};
    int tensors = 0;
    for (int k = 0; k < 2; k++) {
        const ParamSpec *p = params_find(t, names[k]);
        if (!p)
            continue;
        tensors++;
        CHECK(p->local_shape[0] == 40 && model_vocab_padded(m) == 40, "%s: Vp %lld", label,
              (long long)p->local_shape[0]);
        double pad = 0.0, real = 0.0;
        for (int64_t r = 0; r < p->local_shape[0]; r++)
            for (int64_t c = 0; c < p->local_shape[1]; c++) {
                double v = fabs(g[p->offset + (size_t)(r * p->local_shape[1] + c)]);
                if (r >= V)
                    pad += v;
                else
                    real += v;
            }
        CHECK(pad == 0.0 && real > 0.0, "%s %s: padded rows gradient %.3g (real rows %.3g)", label,
              names[k], pad, real);
    }
    CHECK(tensors == (arch == ARCH_GPT2 ? 1 : 2), "%s: vocabulary tensors %d", label, tensors);
    model_free(m);
}

static void test_memorise(ModelArch arch, Recompute rc, const char *label)
{
    Model *m = tiny_model(arch, rc, 0.02f);
    const size_t n = model_params(m)->numel;
    float *p = model_param_buffer(m);
    const float *g = model_grad_buffer(m);
    int32_t tok[N], tgt[N];
    make_batch(tok, tgt, 13, 0);
    float first = 0.0f, last = 0.0f;
    for (int step = 0; step < 60; step++) {
        model_zero_grad(m);
        last = model_forward(m, tok, tgt);
        if (step == 0)
            first = last;
        model_backward(m, 1.0f);
        for (size_t i = 0; i < n; i++)
            p[i] -= 0.5f * g[i];
    }
    last = model_forward(m, tok, tgt);
    CHECK(last < 0.3f * first, "%s: SGD on one batch: loss %.4f -> %.4f", label, first, last);
    model_free(m);
}

/* Recompute must show in the activation bytes.  The differences are
 * predicted from the shapes alone: selective drops the attention output
 * [N, H*hs] and log-sum-exp [B,H,T] of all but one layer; full keeps one
 * layer's activations instead of L.  Nothing of size T x T exists. */
static void test_memory(ModelArch arch)
{
    Model *none = tiny_model(arch, RECOMPUTE_NONE, 0.02f);
    Model *sel = tiny_model(arch, RECOMPUTE_SELECTIVE, 0.02f);
    Model *full = tiny_model(arch, RECOMPUTE_FULL, 0.02f);
    MemoryReport rn = model_memory(none), rs = model_memory(sel), rf = model_memory(full);
    const size_t L = 2, H = 4, C = 16, F = arch == ARCH_GPT2 ? 64 : 32;
    const size_t att = (size_t)N * C + (size_t)B * H * T; /* atty (H*hs = C) and lse */
    CHECK(rn.activations - rs.activations == (L - 1) * att * sizeof(float),
          "selective saves %zu bytes", rn.activations - rs.activations);
    /* One layer's set: ln1, qkv, lse, atty, res_mid, ln2, MLP hidden tensors. */
    const size_t qkv = arch == ARCH_GPT2 ? 3 * C : (4 + 2 * 2) * (C / H);
    const size_t norms = arch == ARCH_GPT2 ? 4 * N : 2 * N; /* mean+rstd or rstd, twice */
    const size_t mlp = (arch == ARCH_GPT2 ? 2 : 3) * N * F;
    const size_t layer = 3 * N * C + N * qkv + att + norms + mlp;
    CHECK(rn.activations - rf.activations == (L - 1) * layer * sizeof(float),
          "full saves %zu bytes, expected %zu", rn.activations - rf.activations,
          (L - 1) * layer * sizeof(float));
    const size_t numel = model_params(none)->numel;
    CHECK(rn.params == numel * sizeof(float) && rn.grads == rn.params && rn.scratch > 0 &&
              rn.master == 0 && rn.optimizer == 0,
          "memory report: params %zu grads %zu scratch %zu", rn.params, rn.grads, rn.scratch);
    model_free(none);
    model_free(sel);
    model_free(full);
}

/* GPT-2 124M: matmul weights 12*(3C^2 + C^2 + 2*C*4C) + V*C = 123,532,032;
 * 6 * that + 12 * 12 * 1024 * 768 = 854,438,400 FLOPs per token (by hand). */
static void test_flops(void)
{
    Config c;
    tiny_config(&c, ARCH_GPT2, RECOMPUTE_NONE, 0.02f);
    c.model.layers = 12;
    c.model.hidden = 768;
    c.model.heads = 12;
    c.model.kv_heads = 12;
    c.model.ffn_hidden = 3072;
    c.model.vocab = 50257;
    c.model.seq_len = 1024;
    CHECK(model_flops_per_token(&c.model) == 854438400.0, "gpt2 124M flops/token %.0f",
          model_flops_per_token(&c.model));
    /* Llama with GQA: qkv (H + 2 KVH) hs C, three MLP matrices. */
    tiny_config(&c, ARCH_LLAMA, RECOMPUTE_NONE, 0.02f);
    const double expect =
        6.0 * (2 * (32.0 * 16 + 16.0 * 16 + 3 * 16.0 * 32) + 37.0 * 16) + 12.0 * 2 * 8 * 16;
    CHECK(model_flops_per_token(&c.model) == expect, "llama tiny flops/token %.0f vs %.0f",
          model_flops_per_token(&c.model), expect);
}

int main(void)
{
    const ModelArch arches[] = {ARCH_GPT2, ARCH_LLAMA};
    const Recompute modes[] = {RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL};
    const char *mode_names[] = {"none", "selective", "full"};
    for (int a = 0; a < 2; a++) {
        const char *arch = arches[a] == ARCH_GPT2 ? "gpt2" : "llama";
        for (int r = 0; r < 3; r++) {
            char label[64];
            snprintf(label, sizeof label, "%s/%s", arch, mode_names[r]);
            test_gradcheck(arches[a], modes[r], NULL, label);
            char dlabel[80];
            snprintf(dlabel, sizeof dlabel, "%s documents", label);
            test_gradcheck(arches[a], modes[r], doc_pos, dlabel);
            test_documents_alone(arches[a], modes[r], dlabel);
            test_init_loss(arches[a], modes[r], label);
            test_accumulation(arches[a], modes[r], label);
            test_activation_sets(arches[a], modes[r], label);
            test_padding_rows(arches[a], modes[r], label);
            test_memorise(arches[a], modes[r], label);
        }
        test_recompute_equal(backend_cpu(), arches[a], arch);
        char blabel[32];
        snprintf(blabel, sizeof blabel, "%s bf16", arch);
        test_recompute_equal(backend_cpu_bf16(), arches[a], blabel);
        test_memory(arches[a]);
    }
    test_flops();
    return check_summary("model");
}
