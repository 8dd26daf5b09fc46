/* bench_cpu — training throughput of the CPU backend against the machine's
 * own SGEMM peak, measured in the same run.
 *
 * Default shapes: GPT-2 124M (12 layers, 768 hidden, 12 heads, vocab 50257),
 * micro-batch 4, sequence 64.  One step = forward + backward + AdamW.
 * Model FLOPs = model_flops_per_token() * tokens (6 * matmul params + attention).
 *
 *   bench_cpu [--layers L --hidden C --heads H --vocab V --batch B --seq T --steps N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/trainer.h"
#include "zero/optimizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    cfg.model.seq_len = 64;
    cfg.training.micro_batch = 4;
    cfg.training.global_batch = 4;
    cfg.training.steps = 1;
    cfg.training.lr = 3e-4f;
    snprintf(cfg.data.path, sizeof cfg.data.path, "unused");
    int steps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
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
        else if (!strcmp(argv[i], "--batch"))
            cfg.training.micro_batch = cfg.training.global_batch = v;
        else if (!strcmp(argv[i], "--steps"))
            steps = v;
        else if (!strcmp(argv[i], "--arch"))
            cfg.model.arch = !strcmp(argv[i + 1], "llama") ? ARCH_LLAMA : ARCH_GPT2;
        else
            trd_fatal(TRD_EXIT_INPUT, NULL, "unknown option %s", argv[i]);
    }
    char err[CFG_ERR];
    if (config_validate(&cfg, 1, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);

    const Backend *be = backend_cpu();
    const int B = cfg.training.micro_batch, T = cfg.model.seq_len;
    ParamShard sh = params_full_shard(&cfg.model);
    Model *m = model_create(&cfg, be, &sh, B);
    const ParamTable *pt = model_params(m);
    Optimizer opt;
    optimizer_init(&opt, pt, be, model_param_buffer(m), 0, pt->numel, PREC_FP32);

    int32_t *tok = malloc((size_t)B * T * sizeof(int32_t)),
            *tgt = malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(rng_u64(1, (uint64_t)i) % (uint64_t)cfg.model.vocab);
        tgt[i] = (int32_t)(rng_u64(2, (uint64_t)i) % (uint64_t)cfg.model.vocab);
    }

    const double peak = train_cpu_peak_flops();
    double t_fwd = 0, t_bwd = 0, t_opt = 0;
    for (int s = -1; s < steps; s++) { /* step -1 warms caches and thread pools */
        double t0 = now_s();
        model_zero_grad(m);
        float loss = model_forward(m, tok, tgt);
        double t1 = now_s();
        model_backward(m, 1.0f);
        double t2 = now_s();
        optimizer_step(&opt, model_param_buffer(m), model_grad_buffer(m), 3e-4f, &cfg.training);
        double t3 = now_s();
        if (s >= 0) {
            t_fwd += t1 - t0;
            t_bwd += t2 - t1;
            t_opt += t3 - t2;
        }
        if (s == steps - 1)
            printf("final loss %.4f (finite check)\n", loss);
    }
    double step = (t_fwd + t_bwd + t_opt) / steps;
    double tokens = (double)B * T;
    double flops = model_flops_per_token(&cfg.model) * tokens;
    printf("model: %s layers %d hidden %d heads %d vocab %d | batch %d x seq %d | %.1f M params\n",
           config_arch_name(cfg.model.arch), cfg.model.layers, cfg.model.hidden, cfg.model.heads,
           cfg.model.vocab, B, T, 1e-6 * (double)params_count_real(&cfg.model));
    printf("step %.1f ms (forward %.1f, backward %.1f, adamw %.1f) over %d steps\n", 1e3 * step,
           1e3 * t_fwd / steps, 1e3 * t_bwd / steps, 1e3 * t_opt / steps, steps);
    printf("training tokens/s        %.1f\n", tokens / step);
    printf("model GFLOP/s            %.2f\n", 1e-9 * flops / step);
    printf("OpenBLAS SGEMM GFLOP/s   %.2f (1024^3, same run)\n", 1e-9 * peak);
    printf("ratio to SGEMM peak      %.3f   (goal >= 0.5; llm.c CPU trainer ~0.2)\n",
           flops / step / peak);
    optimizer_free(&opt);
    model_free(m);
    free(tok);
    free(tgt);
    return 0;
}
