/* lora_cli.c — `trident ckpt export` of a LoRA checkpoint (model.lora):
 *   --format hf    the merged model: the base (model.lora.base) plus
 *                  (alpha/r) B A in every adapted weight, written as a plain
 *                  trident checkpoint (at the run's step) beside OUT and
 *                  exported from there by the usual Hugging Face export
 *                  (one code path for the layout), then removed;
 *   --format peft  the adapters alone, as a PEFT adapter directory
 *                  (ckpt_peft_export).
 * One rank: the model is read whole (trainer_load_model). */
#include "cli/commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "checkpoint/ckpt.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "model/model.h"
#include "train/trainer.h"

/* The config of step directory `step` for one rank (generate's view: the
 * model section as saved, fp32, no data read).  Returns 1 for a LoRA
 * model, 0 for a plain one, -1 with err. */
static int step_config(const char *step, Config *cfg, char err[CFG_ERR])
{
    char path[CFG_STR + 32];
    snprintf(path, sizeof path, "%s/config.yaml", step);
    config_defaults(cfg);
    if (config_load(cfg, path, err) != 0)
        return -1;
    if (cfg->model.lora.rank == 0)
        return 0;
    Config def;
    config_defaults(&def);
    cfg->topology = def.topology;
    cfg->training = def.training;
    cfg->checkpoint = def.checkpoint;
    cfg->training.steps = cfg->training.global_batch = cfg->training.micro_batch = 1;
    if (!cfg->data.path[0] && !cfg->data.blend[0])
        snprintf(cfg->data.path, sizeof cfg->data.path, "(none)");
    cfg->backend = BACKEND_CPU;
    char why[CFG_ERR];
    if (config_validate(cfg, 1, why) != 0) {
        snprintf(err, CFG_ERR, "%.300s: %.600s", path, why);
        return -1;
    }
    return 1;
}

/* The merged weights as a plain checkpoint in dir, at the LoRA run's step
 * (its sampler and LR positions too: the merged model is the run's model
 * after that many steps).  Adam's count is 0: no optimizer state is
 * written, as an import writes none. */
static int save_merged(Model *m, const Config *lora_cfg, const char *step, const char *dir,
                       char err[CFG_ERR])
{
    CkptState st;
    if (ckpt_read_state(step, &st, err) != 0)
        return TRD_EXIT_INPUT;
    st.adam_t = 0;
    Config cfg = *lora_cfg;
    cfg.model.lora.rank = 0; /* the index describes the plain, merged model */
    Comm world = comm_world();
    CkptShardView v;
    ckpt_view_init(&v, model_base_params(m), 0, 0, 1, 0, &world);
    v.part[CKPT_PARAMS].data = model_base_buffer(m);
    for (int k = 0; k < CKPT_KINDS; k++) /* the weights only, as an import writes them */
        if (k != CKPT_PARAMS)
            v.part[k].lo = v.part[k].hi = 0;
    return ckpt_save(dir, &v, &st, &cfg, 1, err) == 0 ? TRD_EXIT_OK : TRD_EXIT_RUNTIME;
}

int lora_export(const char *src, const char *out, int peft, int bf16, int64_t max_shard)
{
    char step[CFG_STR], err[CFG_ERR];
    Config cfg;
    if (ckpt_resolve(NULL, RESUME_PATH, src, step, err) != 1) {
        fprintf(stderr, "trident: error: ckpt export: %s\n", err);
        return TRD_EXIT_INPUT;
    }
    const int lora = step_config(step, &cfg, err);
    if (lora < 0 && !peft) /* no config trident reads: the export says what it lacks */
        return ckpt_hf_export(src, out, bf16, max_shard);
    if (lora < 0) {
        fprintf(stderr, "trident: error: ckpt export: %s\n", err);
        return TRD_EXIT_INPUT;
    }
    if (!lora && peft) {
        fprintf(stderr,
                "trident: error: ckpt export --format peft: %s is not a LoRA checkpoint (its "
                "config has no model.lora); use --format hf\n",
                step);
        return TRD_EXIT_INPUT;
    }
    if (!lora)
        return ckpt_hf_export(src, out, bf16, max_shard);
    int argc0 = 0;
    char **argv0 = NULL;
    comm_init(&argc0, &argv0);
    Model *m = trainer_load_model(&cfg, backend_cpu(), step); /* merged in the base */
    int code;
    if (peft) {
        code = ckpt_peft_export(out, model_params(m), model_param_buffer(m), &cfg.model, err);
    } else {
        char tmp[CFG_STR + 32];
        snprintf(tmp, sizeof tmp, "%s.merging", out);
        code = save_merged(m, &cfg, step, tmp, err);
        if (code == TRD_EXIT_OK) {
            printf("lora: adapters (rank %d, alpha %g) merged into the base %s\n",
                   cfg.model.lora.rank, (double)cfg.model.lora.alpha,
                   cfg.model.lora.base[0] ? cfg.model.lora.base : "(fresh from run.seed)");
            code = ckpt_hf_export(tmp, out, bf16, max_shard);
            err[0] = '\0'; /* the export said what went wrong */
        }
        char cmd[2 * CFG_STR];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0)
            fprintf(stderr, "trident: warning: cannot remove %s\n", tmp);
    }
    if (code != TRD_EXIT_OK && err[0])
        fprintf(stderr, "trident: error: ckpt export: %s\n", err);
    model_free(m);
    comm_finalize();
    return code;
}
