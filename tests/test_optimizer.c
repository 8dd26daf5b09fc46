/* AdamW over the parameter table: decay only where the table says so,
 * bf16 weights as rounded copies of fp32 master weights, and an owned range
 * that covers part of a tensor (the ZeRO case) updating only that part. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "zero/optimizer.h"

static ModelConfig tiny(void)
{
    ModelConfig m = {.arch = ARCH_GPT2,
                     .layers = 1,
                     .hidden = 4,
                     .heads = 2,
                     .kv_heads = 2,
                     .ffn_hidden = 8,
                     .vocab = 8,
                     .vocab_pad_multiple = 1,
                     .seq_len = 4,
                     .tie_embeddings = 1,
                     .init_std = 0.02f};
    return m;
}

/* Expected AdamW update of one element after one step from zero moments. */
static double adamw_once(double p, double g, const TrainingConfig *tc, double lr, double wd)
{
    double m = (1 - tc->beta1) * g, v = (1 - tc->beta2) * g * g;
    double mhat = m / (1 - tc->beta1), vhat = v / (1 - tc->beta2);
    return p - lr * (mhat / (sqrt(vhat) + tc->eps) + wd * p);
}

int main(void)
{
    const Backend *be = backend_cpu();
    ModelConfig mc = tiny();
    ParamShard sh = params_full_shard(&mc);
    ParamTable t;
    params_build(&t, &mc, &sh);
    TrainingConfig tc = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f};

    float *p = malloc(t.numel * sizeof(float)), *p0 = malloc(t.numel * sizeof(float));
    float *g = malloc(t.numel * sizeof(float));
    for (size_t i = 0; i < t.numel; i++) {
        p[i] = 0.5f + 0.01f * (float)(i % 13);
        g[i] = 0.1f * (float)((int)(i % 7) - 3) + 0.05f;
    }
    memcpy(p0, p, t.numel * sizeof(float));

    Optimizer o;
    optimizer_init(&o, &t, be, p, 0, t.numel, PREC_FP32);
    optimizer_step(&o, p, g, 0.01f, &tc);
    int bad = 0;
    for (int k = 0; k < t.n; k++) {
        const ParamSpec *s = &t.p[k];
        double wd = s->decay ? tc.weight_decay : 0.0;
        for (size_t i = s->offset; i < s->offset + s->numel; i++)
            if (fabs(p[i] - adamw_once(p0[i], g[i], &tc, 0.01, wd)) > 1e-6)
                bad++;
    }
    CHECK(bad == 0, "%d elements differ from the hand-computed AdamW step", bad);
    const ParamSpec *ln = params_find(&t, "layers.0.ln1.weight");
    CHECK_CLOSE(p[ln->offset], adamw_once(p0[ln->offset], g[ln->offset], &tc, 0.01, 0.0), 0, 1e-7,
                "norm weight: no decay");
    CHECK(o.t == 1, "step counter");
    optimizer_free(&o);

    /* bf16: params become rounded copies of the fp32 master weights. */
    memcpy(p, p0, t.numel * sizeof(float));
    optimizer_init(&o, &t, be, p, 0, t.numel, PREC_BF16);
    CHECK(o.master && o.master[3] == p0[3], "master keeps fp32 values");
    CHECK(p[3] == bf16_round(p0[3]), "params rounded at init");
    optimizer_step(&o, p, g, 0.01f, &tc);
    int unrounded = 0;
    for (size_t i = 0; i < t.numel; i++)
        if (p[i] != bf16_round(o.master[i]))
            unrounded++;
    CHECK(unrounded == 0, "%d params are not bf16(master)", unrounded);
    CHECK(optimizer_bytes(&o) == t.numel * 12, "bf16 state = master + m + v");
    optimizer_free(&o);

    /* A range that splits a tensor: only [begin, end) changes. */
    memcpy(p, p0, t.numel * sizeof(float));
    size_t begin = t.p[1].offset + 3, end = t.p[3].offset + 2;
    optimizer_init(&o, &t, be, p + begin, begin, end, PREC_FP32);
    optimizer_step(&o, p + begin, g + begin, 0.01f, &tc);
    int outside = 0, inside = 0;
    for (size_t i = 0; i < t.numel; i++) {
        if (i < begin || i >= end)
            outside += p[i] != p0[i];
        else
            inside += p[i] != p0[i];
    }
    CHECK(outside == 0 && inside == (int)(end - begin), "range update: %d outside, %d/%zu inside",
          outside, inside, end - begin);
    optimizer_free(&o);

    /* The step decided in backend memory (optimizer_use_state): a skipped
     * step changes nothing and, taken off the count, leaves the next step
     * the very first one's; a clip factor there scales the gradient as
     * optimizer_scale_grads does. */
    float *p1 = malloc(t.numel * sizeof(float));
    memcpy(p, p0, t.numel * sizeof(float));
    optimizer_init(&o, &t, be, p, 0, t.numel, PREC_FP32);
    const BackendStepState skip = {.loss = NAN, .grad_scale = 1, .skip = 1};
    optimizer_use_state(&o, &skip);
    optimizer_step(&o, p, g, 0.01f, &tc);
    CHECK(memcmp(p, p0, t.numel * sizeof(float)) == 0, "a skipped step leaves the weights");
    optimizer_skipped(&o);
    CHECK(o.t == 0 && o.state == NULL, "skipped: off the count (t %d), state used once", o.t);
    const BackendStepState clip = {.loss = 1, .grad_scale = 0.25, .skip = 0};
    optimizer_use_state(&o, &clip);
    optimizer_step(&o, p, g, 0.01f, &tc);
    optimizer_free(&o);
    memcpy(p1, p0, t.numel * sizeof(float));
    optimizer_init(&o, &t, be, p1, 0, t.numel, PREC_FP32);
    optimizer_scale_grads(&o, 0.25f);
    optimizer_step(&o, p1, g, 0.01f, &tc);
    CHECK(memcmp(p, p1, t.numel * sizeof(float)) == 0 && o.t == 1,
          "skipped, then clipped on the state: the bits of a first step clipped on the host");
    optimizer_free(&o);

    free(p);
    free(p0);
    free(p1);
    free(g);
    params_free(&t);
    return check_summary("optimizer");
}
