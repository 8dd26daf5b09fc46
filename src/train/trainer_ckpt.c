/* trainer_ckpt.c — the trainer's checkpoints: the host view of its state,
 * resume, checkpoint.init_from, and synchronous or background saves
 * (docs/checkpoint.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "comm/trace.h"
#include "model/params.h"
#include "train/lr_schedule.h"
#include "train/trainer_internal.h"

/* Point the checkpoint view at the engine's buffers. */
void trainer_ckpt_setup(Trainer *tr)
{
    const ParamTable *t = zero_params(tr->zero);
    /* The checkpoint's collectives move host memory only, on a world of
     * their own (no NCCL, no device staging). */
    tr->ckpt_world = comm_dup(&tr->comms.world);
    ckpt_view_init(&tr->ckpt, t, tr->cfg->topology.zero, tr->comms.dp.rank, tr->comms.dp.size,
                   tr->comms.pp.rank, &tr->ckpt_world);
    ZeroState zs = zero_state(tr->zero);
    float *state[CKPT_KINDS] = {[CKPT_PARAMS] = zs.params,
                                [CKPT_MASTER] = zs.master,
                                [CKPT_ADAM_M] = zs.m,
                                [CKPT_ADAM_V] = zs.v};
    for (int k = 0; k < CKPT_KINDS; k++) {
        CkptRange *r = &tr->ckpt.part[k];
        r->data = state[k];
        if (!tr->be->device || !state[k])
            continue;
        /* HDF5 reads and writes host memory: a host copy of each buffer.
         * Offloaded optimizer state (and optimizer+params' weights) is host memory already, but it changes
         * while a background save writes: it gets a copy as well. */
        tr->ckpt_dev[k] = state[k];
        tr->ckpt_host[k] = k == CKPT_PARAMS ? zs.params_on_host : zs.optimizer_on_host;
        r->data = trd_malloc((ckpt_range_n(r) ? ckpt_range_n(r) : 1) * sizeof(float),
                             "checkpoint host copy");
    }
}

/* Device backends: the engine's state into the checkpoint's host copies
 * (to_host) or back (from_host).  No-ops on the CPU. */
static void ckpt_sync(Trainer *tr, int to_host)
{
    for (int k = 0; k < CKPT_KINDS; k++) {
        CkptRange *r = &tr->ckpt.part[k];
        if (!tr->ckpt_dev[k])
            continue;
        const size_t bytes = ckpt_range_n(r) * sizeof(float);
        if (tr->ckpt_host[k])
            memcpy(to_host ? r->data : tr->ckpt_dev[k], to_host ? tr->ckpt_dev[k] : r->data, bytes);
        else if (to_host)
            tr->be->to_host(r->data, tr->ckpt_dev[k], bytes);
        else
            tr->be->to_backend(tr->ckpt_dev[k], r->data, bytes);
    }
}

void trainer_ckpt_teardown(Trainer *tr)
{
    for (int k = 0; k < CKPT_KINDS; k++)
        if (tr->ckpt_dev[k])
            free(tr->ckpt.part[k].data);
    comm_free(&tr->ckpt_world);
}

/* bf16: the weights are the bf16 rounding of the master weights, as
 * optimizer_init and every update make them.  A bf16 checkpoint stores the
 * master weights only, and an fp32 source's weights were never rounded:
 * after a load they are rounded here (a no-op on values already bf16). */
static void round_weights(Trainer *tr)
{
    if (tr->cfg->training.precision != PREC_BF16)
        return;
    CkptRange *r = &tr->ckpt.part[CKPT_PARAMS];
    for (size_t i = 0; r->data && i < ckpt_range_n(r); i++) /* ZeRO 3: both blocks */
        r->data[i] = bf16_round(r->data[i]);
}

/* checkpoint.resume: auto (latest if any), never, or a step directory.
 * Returns whether the run continues from a checkpoint. */
/* A resume with another training.steps than the saved run's: the LR
 * schedule is a function of training.steps, so the decay is recomputed
 * over the new total and the rate jumps at this step.  Said, not refused:
 * extending a run is legitimate (docs/checkpoint.md, "Raising
 * training.steps on resume").  Rank 0; a checkpoint without a readable
 * config.yaml says nothing. */
static void note_steps_change(const char *dir, const Config *cfg, int64_t step)
{
    char path[CFG_STR + 16], err[CFG_ERR];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    Config *saved = malloc(sizeof *saved);
    if (!saved)
        return;
    const TrainingConfig *t = &cfg->training;
    if (config_load(saved, path, err) == 0 && saved->training.steps != t->steps &&
        t->decay != DECAY_CONSTANT)
        printf("note: training.steps %d, the checkpoint's run had %d: the learning-rate "
               "schedule is recomputed over %d steps, so the rate at step %lld jumps from "
               "%.3g to %.3g (docs/checkpoint.md, \"Raising training.steps on resume\")\n",
               t->steps, saved->training.steps, t->steps, (long long)step,
               (double)schedule_lr(&saved->training, (int)step), (double)schedule_lr(t, (int)step));
    free(saved);
}

int trainer_resume(Trainer *tr)
{
    const CheckpointConfig *c = &tr->cfg->checkpoint;
    char dir[CFG_STR], err[CFG_ERR];
    if (c->resume == RESUME_NEVER || (!c->dir[0] && c->resume != RESUME_PATH))
        return 0;
    /* Every rank resolves and loads alike: errors are agreed, said once. */
    const int rank = tr->topo.rank;
    int rc = ckpt_resolve(c->dir, c->resume, c->resume_path, dir, err);
    if (rc < 0)
        guard_exit_agreed(rank, TRD_EXIT_INPUT, "check checkpoint.dir and checkpoint.resume",
                          "%s%s", c->resume == RESUME_PATH ? "checkpoint.resume: " : "", err);
    if (rc == 0)
        return 0;
    if (err[0] && rank == 0)
        printf("checkpoint: %s\n", err); /* no latest: which step was taken */
    CkptState st;
    ckpt_sync(tr, 1); /* what the load does not replace stays as it is */
    if (ckpt_load(dir, &tr->ckpt, &st, tr->cfg, err) != 0)
        guard_exit_agreed(rank, TRD_EXIT_INPUT,
                          "resume from another checkpoint "
                          "(checkpoint.resume: PATH) or start fresh (checkpoint.resume: never)",
                          "%s", err);
    if (st.step >= tr->cfg->training.steps) {
        if (rank == 0)
            printf("checkpoint at step %lld >= training.steps %d: nothing to train\n",
                   (long long)st.step, tr->cfg->training.steps);
        fflush(stdout);
        comm_finalize();
        exit(TRD_EXIT_OK);
    }
    round_weights(tr);
    ckpt_sync(tr, 0);
    zero_params_loaded(tr->zero);
    *zero_state(tr->zero).adam_t = (int)st.adam_t;
    tr->start_step = (int)st.step;
    tr->start_position = st.sampler_position;
    if (rank == 0)
        printf("resumed from %s: step %d, sample position %llu, tokens seen %llu, lr step %lld, "
               "adam_t %lld\n",
               dir, tr->start_step, (unsigned long long)tr->start_position,
               (unsigned long long)tr->start_position * (unsigned long long)tr->cfg->model.seq_len,
               (long long)st.lr_step, (long long)st.adam_t);
    if (rank == 0)
        note_steps_change(dir, tr->cfg, st.step);
    return 1;
}

/* checkpoint.init_from: the weights of a Hugging Face directory (it has a
 * config.json) or of a trident checkpoint start this run at step 0, with a
 * fresh optimizer, schedule and sampler.  Every rank reads its own pieces:
 * of the safetensors files (ckpt_hf_load_weights), or of the checkpoint the
 * way a resume does.  Ignored, with a note, when the run resumed. */
/* LoRA's frozen base (model.lora.base: a Hugging Face directory or a
 * trident checkpoint of the plain model) into the base weights of model m,
 * every rank its whole pieces (no ZeRO sharding of frozen weights).
 * Collective over world.  Returns 0, or the exit code with err. */
static int read_lora_base(Model *m, const Config *cfg, const Backend *be, int pp_rank, Comm *world,
                          char err[CFG_ERR])
{
    const char *src = cfg->model.lora.base;
    char dir[CFG_STR], json[CFG_STR + 16];
    snprintf(json, sizeof json, "%s/config.json", src);
    struct stat st;
    const int hf = stat(json, &st) == 0;
    if (stat(src, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, CFG_ERR, "model.lora.base: %s: no such directory", src);
        return TRD_EXIT_INPUT;
    }
    char why[CFG_ERR] = "";
    if (!hf && ckpt_resolve(NULL, RESUME_PATH, src, dir, why) != 1) {
        snprintf(err, CFG_ERR, "model.lora.base: %.900s", why);
        return TRD_EXIT_INPUT;
    }
    const ParamTable *t = model_base_params(m);
    const size_t bytes = t->numel * sizeof(float);
    float *in_place = be->device ? NULL : model_base_buffer(m); /* NULL: bf16 storage too */
    float *host = in_place ? in_place : trd_malloc(bytes + 1, "base weights");
    CkptShardView v;
    ckpt_view_init(&v, t, 0, 0, 1, pp_rank, world);
    v.part[CKPT_PARAMS].data = host;
    int code = TRD_EXIT_OK;
    if (hf)
        code = ckpt_hf_load_weights(src, &v, &cfg->model, why);
    else if (ckpt_load_weights(dir, &v, cfg, why) != 0)
        code = TRD_EXIT_INPUT;
    if (code != TRD_EXIT_OK)
        snprintf(err, CFG_ERR, "model.lora.base: %.900s", why);
    /* bf16 weights, or a base the run stored in bf16 (an inference model
     * built in fp32 from its checkpoint: trainer_load_model) */
    if (code == TRD_EXIT_OK &&
        (cfg->training.precision == PREC_BF16 || cfg->model.lora.base_dtype == LORA_BASE_BF16))
        for (size_t i = 0; i < t->numel; i++)
            host[i] = bf16_round(host[i]);
    if (host != in_place) {
        if (code == TRD_EXIT_OK)
            model_load_base(m, host); /* uploaded, or stored in bf16 */
        free(host);
    }
    return code;
}

/* LoRA: the base at every start, a resume included (the run's own
 * checkpoints hold the adapters only; their config names the base).
 * Without model.lora.base the base is the fresh model of run.seed. */
static void load_lora_base(Trainer *tr)
{
    const int rank = tr->topo.rank;
    char err[CFG_ERR] = "";
    if (!tr->cfg->model.lora.base[0]) {
        if (rank == 0)
            printf("note: model.lora without model.lora.base: the frozen base is a fresh model "
                   "from run.seed\n");
        return;
    }
    for (int c = 0; c < zero_chunks(tr->zero); c++) {
        const int code = read_lora_base(zero_chunk_model(tr->zero, c), tr->cfg, tr->be,
                                        tr->comms.pp.rank, &tr->ckpt_world, err);
        if (code != TRD_EXIT_OK)
            guard_exit_agreed(rank, code,
                              "model.lora.base names the plain model the adapters apply to: a "
                              "Hugging Face directory or a trident checkpoint",
                              "%s", err);
    }
    if (rank == 0)
        printf("lora: base weights from %s (frozen), adapters %s\n", tr->cfg->model.lora.base,
               tr->resumed                        ? "resumed"
               : tr->cfg->checkpoint.init_from[0] ? "from checkpoint.init_from"
                                                  : "fresh: B = 0, the model starts as its base");
}

void trainer_init_from(Trainer *tr, int resumed)
{
    const char *src = tr->cfg->checkpoint.init_from;
    const int rank = tr->topo.rank;
    if (tr->cfg->model.lora.rank > 0) /* then init_from, if any, gives the adapters */
        load_lora_base(tr);
    if (!src[0])
        return;
    if (resumed) {
        if (rank == 0)
            printf("note: checkpoint.init_from %s ignored: the run resumed from its own "
                   "checkpoint\n",
                   src);
        return;
    }
    char dir[CFG_STR], err[CFG_ERR] = "", json[CFG_STR + 16];
    snprintf(json, sizeof json, "%s/config.json", src);
    struct stat st;
    const int hf = stat(json, &st) == 0;
    if (stat(src, &st) != 0 || !S_ISDIR(st.st_mode))
        guard_exit_agreed(rank, TRD_EXIT_INPUT,
                          "checkpoint.init_from: a Hugging Face "
                          "directory (with config.json) or a trident checkpoint",
                          "checkpoint.init_from: %s: no such directory", src);
    if (!hf && ckpt_resolve(NULL, RESUME_PATH, src, dir, err) != 1)
        guard_exit_agreed(rank, TRD_EXIT_INPUT,
                          "checkpoint.init_from: a Hugging Face "
                          "directory (with config.json) or a trident checkpoint",
                          "checkpoint.init_from: %s", err);
    ckpt_sync(tr, 1); /* the optimizer state stays as initialised */
    /* A Hugging Face directory: each rank reads its pieces of the
     * safetensors files, nothing is converted on disk. */
    int code = TRD_EXIT_OK;
    if (hf)
        code = ckpt_hf_load_weights(src, &tr->ckpt, &tr->cfg->model, err);
    else if (ckpt_load_weights(dir, &tr->ckpt, tr->cfg, err) != 0)
        code = TRD_EXIT_INPUT;
    if (code != TRD_EXIT_OK)
        guard_exit_agreed(rank, code,
                          "the model section must describe the model "
                          "checkpoint.init_from holds (a directory written by `trident ckpt "
                          "export --format hf`, or a trident checkpoint)",
                          "checkpoint.init_from: %s", err);
    round_weights(tr);
    ckpt_sync(tr, 0);
    zero_params_loaded(tr->zero);
    if (rank == 0)
        printf("initialised from %s: weights of %s, step 0, fresh optimizer and data\n", src,
               hf ? "its safetensors (each rank read its own pieces)" : dir);
}

/* checkpoint.async (docs/checkpoint.md): auto is on where MPI runs calls
 * from threads and the planner's snapshot fits in RAM beside the state
 * memcheck counted (device backends: their host copies are the snapshot,
 * and nothing more is allocated).  Decided before anything is allocated. */
int trainer_async_decide(const Trainer *tr, Comm *world)
{
    const CheckpointConfig *ck = &tr->cfg->checkpoint;
    if (!ck->dir[0] || ck->async == ASYNC_OFF)
        return 0;
    double state = 0, snap = 0;
    if (!tr->be->device)
        memcheck_plan(tr->cfg, tr->topo.ranks_per_node, &state, &snap);
    const MemBudget ram = memcheck_host_budget(tr->topo.ranks_per_node);
    int why = !comm_threads() ? 1 : (state + snap) * ram.sharers > ram.bytes ? 2 : 0;
    comm_allreduce_max_i32(world, &why, 1);
    const char *reason = why == 1 ? "the MPI library does not run calls from several threads "
                                    "(MPI_THREAD_MULTIPLE)"
                                  : "the snapshot does not fit in RAM beside the training state";
    if (why && ck->async == ASYNC_ON)
        guard_exit_agreed(
            world->rank, TRD_EXIT_INPUT,
            "set checkpoint.async: auto (synchronous where it cannot be "
            "asynchronous) or false",
            "checkpoint.async: true: %s (per rank %.2f GiB of "
            "state and %.2f GiB of snapshot, as `trident plan` counts them; %d rank(s) "
            "share %s, %.2f GiB)",
            reason, state / (1 << 30), snap / (1 << 30), ram.sharers, ram.what,
            ram.bytes / (1 << 30));
    if (why && world->rank == 0)
        printf("checkpoint: saves are synchronous (checkpoint.async: auto): %s\n", reason);
    return !why;
}

/* The background write in flight, once every rank's writer has returned
 * (block: wait for it; else only if all have, one all-reduce).  A failed
 * write stops the job as a failed synchronous save does. */
void trainer_poll_save(Trainer *tr, int block)
{
    if (!ckpt_async_in_flight(tr->async))
        return;
    if (!block) {
        int pending = !ckpt_async_finished(tr->async);
        comm_allreduce_max_i32(&tr->comms.world, &pending, 1);
        if (pending)
            return;
    }
    CkptAsyncDone d;
    char err[CFG_ERR];
    if (ckpt_async_wait(tr->async, &d, err) != 0)
        guard_exit_agreed(tr->topo.rank, TRD_EXIT_RUNTIME,
                          "nothing was published, the previous checkpoint and latest are "
                          "unchanged; check free space and permissions of checkpoint.dir, or "
                          "for non-finite values training.lr and weight_decay",
                          "%s", err);
    tr->async_blocked_s += d.waited_s;
    trace_span("checkpoint write", TRACE_STEP, d.t_start, d.t_end, -1, -1, 0);
    if (tr->topo.rank == 0)
        printf("checkpoint: step %lld saved to %s in %.2f s (in the background; training "
               "blocked %.3f s)\n",
               (long long)d.step, tr->cfg->checkpoint.dir, d.t_end - d.t_start,
               tr->async_blocked_s);
}

/* Save steps_done: synchronously, or (checkpoint.async) wait for the
 * previous write, copy the state into the snapshot and go on; `wait`
 * (the run ends) waits for this write too. */
void trainer_save(Trainer *tr, int steps_done, int wait)
{
    const Config *cfg = tr->cfg;
    CkptState st = {.step = steps_done,
                    .sampler_position =
                        tr->start_position + (uint64_t)(steps_done - tr->start_step) *
                                                 (uint64_t)cfg->training.global_batch,
                    .lr_step = steps_done,
                    .adam_t = *zero_state(tr->zero).adam_t};
    char err[CFG_ERR];
    const double t0 = comm_wtime();
    if (tr->async) {
        trainer_poll_save(tr, 1);
        const double t_copy = comm_wtime();
        ckpt_sync(tr, 1); /* device backends: the host copies are the snapshot */
        const float *src[CKPT_KINDS];
        for (int k = 0; k < CKPT_KINDS; k++)
            src[k] = tr->be->device ? NULL : tr->ckpt.part[k].data;
        if (ckpt_async_snapshot(tr->async, src, steps_done, err) != 0)
            guard_exit_agreed(tr->topo.rank, TRD_EXIT_RUNTIME,
                              "lower training.lr or "
                              "weight_decay: an update made the state non-finite",
                              "%s", err);
        ckpt_async_start(tr->async, cfg->checkpoint.dir, &st, cfg, cfg->checkpoint.keep);
        tr->async_blocked_s = comm_wtime() - t0;
        trace_span("checkpoint snapshot", TRACE_STEP, t_copy, comm_wtime(), -1, -1, 0);
        if (wait)
            trainer_poll_save(tr, 1);
        return;
    }
    ckpt_sync(tr, 1);
    if (ckpt_save(cfg->checkpoint.dir, &tr->ckpt, &st, cfg, cfg->checkpoint.keep, err) != 0)
        guard_exit_agreed(tr->topo.rank, TRD_EXIT_RUNTIME,
                          "nothing was published, the previous checkpoint and latest are "
                          "unchanged; check free space and permissions of checkpoint.dir, or "
                          "for non-finite values training.lr and weight_decay",
                          "%s", err);
    trace_span("checkpoint save", TRACE_STEP, t0, comm_wtime(), -1, -1, 0);
    if (tr->topo.rank == 0)
        printf("checkpoint: step %d saved to %s in %.2f s\n", steps_done, cfg->checkpoint.dir,
               comm_wtime() - t0);
}

Model *trainer_load_model(const Config *cfg_in, const Backend *be, const char *step)
{
    char err[CFG_ERR];
    /* The adapters merge into an fp32 base, whatever stored it: a run's bf16
     * base is read rounded (read_lora_base with cfg_in), held in fp32. */
    Config copy = *cfg_in;
    copy.model.lora.base_dtype = LORA_BASE_FP32;
    const Config *cfg = &copy;
    ParamShard sh = pp_rank_shard(&cfg->model, &cfg->topology, 0, 1, 0);
    Model *m = model_create(cfg, be, &sh, 1);
    const ParamTable *t = model_params(m);
    CkptShardView v;
    Comm world = comm_world();
    ckpt_view_init(&v, t, 0, 0, 1, 0, &world);
    float *host =
        be->device ? trd_malloc(t->numel * sizeof(float), "weights") : model_param_buffer(m);
    v.part[CKPT_PARAMS].data = host;
    if (ckpt_load_weights(step, &v, cfg, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    if (be->device) {
        be->to_backend(model_param_buffer(m), host, t->numel * sizeof(float));
        free(host);
    }
    if (cfg->model.lora.rank > 0) { /* the adapters above; the base they apply to */
        int code = TRD_EXIT_OK;
        if (cfg->model.lora.base[0])
            code = read_lora_base(m, cfg_in, be, 0, &world, err); /* rounded as trained */
        else
            printf("note: the LoRA checkpoint names no model.lora.base: its base is the fresh "
                   "model of run.seed\n");
        if (!cfg->model.lora.base[0] && cfg_in->model.lora.base_dtype == LORA_BASE_BF16) {
            /* the fresh base, rounded as the run stored it */
            const size_t n = model_base_params(m)->numel;
            float *w = trd_malloc((n + 1) * sizeof(float), "base weights");
            be->to_host(w, model_base_buffer(m), n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                w[i] = bf16_round(w[i]);
            model_load_base(m, w);
            free(w);
        }
        if (code != TRD_EXIT_OK)
            trd_fatal(code, "the base must be where the LoRA run read it", "%s", err);
        model_lora_merge(m);
    }
    return m;
}
