/* train.c — the `train` command's loop over the trainer (trainer.h): what
 * a run prints and records around each step — the start-up summary,
 * metrics.jsonl and TensorBoard, samples, the watchdog and straggler
 * reports, preemption — and when it validates and saves. */
#include "train/train.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#ifdef TRD_HAVE_CUDA
#include "backend/cuda.h"
#endif
#include "core/error.h"
#include "core/rng.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "model/params.h"
#include "train/guard.h"
#include "train/metrics.h"
#include "train/preempt.h"
#include "train/straggler.h"
#include "train/tensorboard.h"
#include "train/trainer.h"
#include "train/watchdog.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void mkdir_p(const char *path)
{
    char buf[CFG_STR + 16];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(buf, 0755);
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        trd_fatal(TRD_EXIT_RUNTIME, "check run.dir", "cannot create directory %s: %s", path,
                  strerror(errno));
}

/* The adapters' parameters of the whole model (LoRA). */
static size_t lora_count(const ModelConfig *mc)
{
    ParamShard sh = params_full_shard(mc);
    ParamTable t;
    params_build(&t, mc, &sh);
    const size_t n = t.global_numel;
    params_free(&t);
    return n;
}

static void print_start(Trainer *tr, const Config *cfg, double peak)
{
    const TrainerInfo *in = trainer_info(tr);
    const ModelConfig *mc = &cfg->model;
    size_t snapshot;
    MemoryReport mem = trainer_memory(tr, &snapshot);
    char err[CFG_ERR];
    printf("trident: %s %s | layers %d hidden %d heads %d kv_heads %d ffn %d vocab %d (padded %d) "
           "seq %d\n",
           cfg->run.name, config_arch_name(mc->arch), mc->layers, mc->hidden, mc->heads,
           mc->kv_heads, mc->ffn_hidden, mc->vocab, params_padded_vocab(mc, cfg->topology.tp),
           mc->seq_len);
    /* The whole per-rank table for worlds one can read; its summary beyond. */
    const TopoMapFormat fmt = in->topo->world <= 64 ? TOPO_MAP_TABLE : TOPO_MAP_SUMMARY;
    if (topology_print_map(stdout, &cfg->topology, in->topo->world, in->topo->ranks_per_node, fmt,
                           err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    printf("parameters: %zu (%.2f M)\n", params_count_real(mc),
           1e-6 * (double)params_count_real(mc));
    printf("memory per rank (MiB): params %.1f | grads %.1f | optimizer %.1f | zero buffers %.1f "
           "| activations %.1f | scratch %.1f | checkpoint snapshot %.1f\n",
           trd_mib(mem.params), trd_mib(mem.grads), trd_mib(mem.optimizer), trd_mib(mem.buffers),
           trd_mib(mem.activations), trd_mib(mem.scratch), trd_mib(snapshot));
    if (mc->lora.rank > 0) /* params, grads and optimizer above are the adapters' */
        printf("lora: rank %d alpha %g on %s | adapters %zu params (%.4f%% of the model) | "
               "frozen base per rank %.1f MiB (%s, no gradients, no optimizer state)\n",
               mc->lora.rank, (double)mc->lora.alpha, mc->lora.targets, lora_count(mc),
               100.0 * (double)lora_count(mc) / (double)params_count_real(mc), trd_mib(mem.frozen),
               mc->lora.base_dtype == LORA_BASE_BF16
                   ? "bf16, one part (layer, embedding, head) at a time widened to fp32"
                   : config_precision_name(cfg->training.precision));
    if (mem.host_optimizer) /* topology.offload: not device memory, so not above */
        printf("offloaded to host memory per rank (MiB): optimizer %.1f (fp32 master weights, "
               "Adam m and v, gradient staging; page-locked)%s\n",
               trd_mib(mem.host_optimizer),
               cfg->topology.offload == OFFLOAD_PARAMS
                   ? "; the weights' shard lives there too (optimizer+params: params above "
                     "are 0, the layers are gathered from the host)"
                   : "");
    printf("batch: global %d sequences = %d micro-steps x micro_batch %d x dp %d | %d tokens/step "
           "| zero %d\n",
           cfg->training.global_batch, in->n_micro, cfg->training.micro_batch, in->dp,
           cfg->training.global_batch * mc->seq_len, cfg->topology.zero);
    if (in->be->device)
        printf("backend: %s on %s | MFU against %.1f TFLOP/s | precision %s | comm %s | "
               "host waits a step: %s\n",
               in->be->name, in->device, 1e-12 * peak,
               config_precision_name(cfg->training.precision),
               in->nccl ? "nccl" : "mpi (host staging)",
               in->device_step ? "1 (loss, norm, clip and skip on the device)"
                               : "1 a micro-batch (loss) + 1 (norm)");
    else
        printf("backend: cpu (%d OpenMP threads per rank), BLAS SGEMM peak %.1f GFLOP/s | "
               "precision %s\n",
               omp_get_max_threads(), 1e-9 * peak, config_precision_name(cfg->training.precision));
    TrainerDataset ds[CFG_MAX_BLEND];
    const int nd = trainer_data_seen(tr, 0, ds);
    for (int d = 0; d < nd; d++) {
        char shards[48] = "";
        if (ds[d].n_shards > 1)
            snprintf(shards, sizeof shards, "%d shards, ", ds[d].n_shards);
        char weight[32] = "";
        if (cfg->data.blend[0])
            snprintf(weight, sizeof weight, "weight %.4g, ", ds[d].weight);
        printf("data%s: %s (%s%s%llu tokens, %llu samples/epoch)\n", nd > 1 ? " blend" : "",
               ds[d].name, weight, shards, (unsigned long long)ds[d].n_tokens,
               (unsigned long long)ds[d].samples_per_epoch);
    }
    if (in->has_val)
        printf("val: %s\n", cfg->data.val_blend[0] ? cfg->data.val_blend : cfg->data.val_path);
    fflush(stdout);
}

/* Collective over the pipeline group: with pp > 1 the record also lists
 * every stage's activation bytes (stages hold different numbers of
 * micro-batches in flight). */
static void memory_json(Trainer *tr, char *buf, size_t cap)
{
    size_t snapshot;
    MemoryReport mem = trainer_memory(tr, &snapshot);
    const TopologyComms *comms = trainer_info(tr)->comms;
    int n = snprintf(buf, cap,
                     "\"memory_bytes\": {\"params\": %zu, \"grads\": %zu, \"optimizer\": %zu, "
                     "\"zero_buffers\": %zu, \"activations\": %zu, \"scratch\": %zu, "
                     "\"checkpoint_snapshot\": %zu",
                     mem.params, mem.grads, mem.optimizer, mem.buffers, mem.activations,
                     mem.scratch, snapshot);
    if (mem.frozen) /* LoRA: the frozen base (params, grads, optimizer: the adapters) */
        n += snprintf(buf + n, cap - (size_t)n, ", \"frozen_base\": %zu", mem.frozen);
    n += snprintf(buf + n, cap - (size_t)n, "}");
    if (mem.host_optimizer) /* host memory: not one of the device's categories */
        n += snprintf(buf + n, cap - (size_t)n, ", \"host_memory_bytes\": {\"optimizer\": %zu}",
                      mem.host_optimizer);
    const int pp = comms->pp.size;
    if (pp == 1)
        return;
    double *acts = trd_calloc((size_t)pp, sizeof(double), "stage activation bytes");
    acts[comms->pp.rank] = (double)mem.activations;
    comm_allreduce_f64((Comm *)&comms->pp, acts, (size_t)pp);
    n += snprintf(buf + n, cap - (size_t)n, ", \"stage_activation_bytes\": [");
    for (int k = 0; k < pp && (size_t)n < cap; k++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%.0f", k ? ", " : "", acts[k]);
    if ((size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, "]");
    free(acts);
}

/* The memory table in TensorBoard, once, at the run's first step (the same
 * categories as metrics.jsonl's memory_bytes). */
static void tb_memory(TbWriter *tb, const Trainer *tr, int step)
{
    size_t snapshot;
    const MemoryReport m = trainer_memory(tr, &snapshot);
    static const char *const names[] = {
        "params",      "grads",   "optimizer",          "zero_buffers",
        "activations", "scratch", "checkpoint_snapshot"};
    const double bytes[] = {(double)m.params,  (double)m.grads,       (double)m.optimizer,
                            (double)m.buffers, (double)m.activations, (double)m.scratch,
                            (double)snapshot};
    tb_record_values(tb, step, "memory_bytes", names, bytes, NULL, 7);
}

/* model.moe: the router's statistics of this step's forwards, over every
 * rank (each holds its micro-batches' MoE layers), as metrics.jsonl
 * members: the load-balancing and z-loss values per MoE layer and
 * micro-batch (mean; before their coefficients), the fewest and most
 * assignments one expert got in one layer and micro-batch, and the
 * assignments dropped over capacity, also into values (in that order);
 * returns whether there were any.  Collective; "" and 0 for a dense model. */
enum { MOE_VALUES = 5 };
static int moe_json(Trainer *tr, const Config *cfg, Comm *world, char *out, size_t n,
                    double values[MOE_VALUES])
{
    out[0] = '\0';
    if (cfg->model.moe_experts == 0)
        return 0;
    double sum[4] = {0}, most[2] = {-1e300, -1e300}; /* most: max, -min */
    const int chunks = cfg->topology.virtual_stages > 1 ? cfg->topology.virtual_stages : 1;
    for (int c = 0; c < chunks; c++) {
        const MoeStats s = model_take_moe_stats(trainer_model(tr, c));
        sum[0] += s.aux_sum;
        sum[1] += s.z_sum;
        sum[2] += s.layers;
        sum[3] += s.dropped;
        if (s.layers > 0) {
            most[0] = s.tokens_max > most[0] ? s.tokens_max : most[0];
            most[1] = -s.tokens_min > most[1] ? -s.tokens_min : most[1];
        }
    }
    comm_allreduce_f64(world, sum, 4);
    comm_allreduce_max_f64(world, most, 2);
    if (sum[2] == 0)
        return 0;
    const double v[MOE_VALUES] = {sum[0] / sum[2], sum[1] / sum[2], -most[1], most[0], sum[3]};
    snprintf(out, n,
             "\"moe_aux_loss\": %.6g, \"moe_z_loss\": %.6g, \"moe_tokens_per_expert_min\": %.0f, "
             "\"moe_tokens_per_expert_max\": %.0f, \"moe_dropped\": %.0f",
             v[0], v[1], v[2], v[3], v[4]);
    memcpy(values, v, sizeof v);
    return 1;
}

/* The same values as TensorBoard scalars moe/<name>, rounded as
 * metrics.jsonl prints them. */
static void tb_moe(TbWriter *tb, int step, const double values[MOE_VALUES])
{
    static const char *const names[MOE_VALUES] = {"aux_loss", "z_loss", "tokens_per_expert_min",
                                                  "tokens_per_expert_max", "dropped"};
    static const char *const fmts[MOE_VALUES] = {"%.6g", "%.6g", "%.0f", "%.0f", "%.0f"};
    tb_record_values(tb, step, "moe", names, values, fmts, MOE_VALUES);
}

/* training.sample_every: a continuation of end-of-text by the model as it
 * is now, as llm.c prints during training.  Rank 0 alone: with tp 1, pp 1
 * and ZeRO 0-2 (config validation) its model holds every weight.  Up to 64
 * tokens, temperature 1, drawn with the RNG keyed by (seed, step). */
static void print_sample(Trainer *tr, const Config *cfg, Tokenizer *tok, int step)
{
    Model *m = trainer_model(tr, 0);
    const int n = cfg->model.seq_len < 64 ? cfg->model.seq_len : 64;
    Decoder *dc = decoder_create(m, n);
    int32_t ids[64];
    ids[0] = tokenizer_eot(tok);
    const float *logits = decoder_step(dc, ids, 1);
    int len = 1;
    while (len < n) {
        const double u = rng_uniform(rng_mix(cfg->run.seed, (uint64_t)step), (uint64_t)len);
        ids[len] = decoder_sample(logits, decoder_vocab(dc), 1.0f, u);
        if (ids[len++] == tokenizer_eot(tok) || len == n)
            break;
        logits = decoder_step(dc, ids + len - 1, 1);
    }
    decoder_free(dc);
    char *text = tokenizer_decode(tok, ids + 1, (size_t)(len - 1));
    printf("sample at step %d: %s\n", step, text ? text : "(out of memory)");
    fflush(stdout);
    free(text);
}

/* TRIDENT_DUMP_WEIGHTS=FILE: rank 0 writes the final flat parameter buffer
 * (fp32, table order) — a testing aid: the tests compare the final weights
 * of layouts with it, without reading a checkpoint. */
static void dump_weights(Trainer *tr)
{
    const char *path = getenv("TRIDENT_DUMP_WEIGHTS");
    if (!path || !*path)
        return;
    const int rank = trainer_info(tr)->topo->rank;
    size_t numel;
    if (trainer_gather_weights(tr, NULL, &numel) != 0) {
        if (rank == 0)
            fprintf(
                stderr,
                "trident: TRIDENT_DUMP_WEIGHTS ignored: tp x pp > 1, or experts divided over ep\n");
        return;
    }
    float *buf = trd_malloc(numel * sizeof(float), "weight dump");
    trainer_gather_weights(tr, buf, &numel);
    if (rank == 0) {
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(buf, sizeof(float), numel, f) != numel || fclose(f) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot write %s: %s", path, strerror(errno));
    }
    free(buf);
}

/* A run never destroys an earlier run's results: a fresh run (not resumed
 * from a checkpoint) into a run.dir whose metrics.jsonl already holds
 * records is refused before anything is written.  Rank 0 looks, all agree. */
static void check_run_dir(const Config *cfg, int resumed, Comm *world)
{
    char path[CFG_STR + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->run.dir);
    struct stat st;
    int taken = world->rank == 0 && !resumed && stat(path, &st) == 0 && st.st_size > 0;
    /* A job Slurm requeued (node failure, preemption) before its first
     * checkpoint is the same run starting over: its earlier attempt's
     * metrics are kept beside, not refused and not overwritten. */
    const char *restart = getenv("SLURM_RESTART_COUNT");
    if (taken && restart && atoi(restart) > 0) {
        char kept[CFG_STR + 64];
        snprintf(kept, sizeof kept, "%s.restart-%d", path, atoi(restart));
        if (rename(path, kept) == 0) {
            printf("Slurm restart %d and no checkpoint to resume: the run starts over; the "
                   "earlier attempt's metrics are kept in %s\n",
                   atoi(restart), kept);
            taken = 0;
        }
    }
    comm_allreduce_max_i32(world, &taken, 1);
    if (!taken)
        return;
    char hint[3 * CFG_STR];
    snprintf(hint, sizeof hint,
             "give this run a directory of its own (--set run.dir=%s-2); "
             "or continue that run from its checkpoint (--set checkpoint.resume=STEP_DIR, or "
             "checkpoint.resume: auto with the checkpoint.dir it saved to); or delete %s to "
             "start over",
             cfg->run.dir, path);
    guard_exit_agreed(world->rank, TRD_EXIT_INPUT, hint,
                      "run.dir %s holds the metrics of an earlier run, and this run "
                      "starts fresh (no checkpoint to resume from in %s): it would overwrite them",
                      cfg->run.dir,
                      cfg->checkpoint.dir[0] ? cfg->checkpoint.dir : "checkpoint.dir (unset)");
}

/* checkpoint.every auto (config.h): due once the time since the last
 * save (or the start) reaches the interval, or 50 times the last save's
 * blocking time when that is longer, so saving costs at most 2 % of the
 * run.  Clocks differ between ranks: the flag is all-reduced so that
 * every rank saves after the same step. */
typedef struct {
    double since; /* when the last save ended (or the loop began) */
    double cost;  /* seconds the last save blocked training */
} AutoSave;

static int auto_save_due(const AutoSave *a, Comm *world)
{
    double wait = 50 * a->cost;
    if (wait < CKPT_AUTO_INTERVAL_S)
        wait = CKPT_AUTO_INTERVAL_S;
    int due = now_s() - a->since >= wait;
    comm_allreduce_max_i32(world, &due, 1);
    return due;
}

static void print_every(const CheckpointConfig *ck)
{
    if (ck->every == CKPT_EVERY_AUTO)
        printf(" | checkpoints: %s every %d min of training (checkpoint.every auto) and at the "
               "end, newest %d kept\n",
               ck->dir, CKPT_AUTO_INTERVAL_S / 60, ck->keep);
    else if (ck->every > 0)
        printf(" | checkpoints: %s every %d steps and at the end, newest %d kept\n", ck->dir,
               ck->every, ck->keep);
    else
        printf(" | checkpoints: %s at the end\n", ck->dir);
}

/* Where this run's results go: a user should not have to read the config
 * to find them. */
static void print_outputs(const Config *cfg)
{
    const CheckpointConfig *ck = &cfg->checkpoint;
    printf("output: %s/metrics.jsonl, %s/config.yaml", cfg->run.dir, cfg->run.dir);
    if (cfg->training.trace)
        printf(", %s/trace.json", cfg->run.dir);
    if (cfg->run.tensorboard)
        printf(", %s/tb/", cfg->run.dir);
    if (!ck->dir[0])
        printf(" | checkpoints: none (set checkpoint.dir to keep the run)\n");
    else
        print_every(ck);
    fflush(stdout);
}

/* rank 0: run.dir, its config.yaml, the start-up summary; metrics and
 * TensorBoard opened. */
static void open_outputs(Trainer *tr, const Config *cfg, double peak, Metrics *metrics,
                         TbWriter *tb)
{
    mkdir_p(cfg->run.dir);
    char path[CFG_STR + 32], err[CFG_ERR];
    snprintf(path, sizeof path, "%s/config.yaml", cfg->run.dir);
    if (config_write_yaml(cfg, path, err) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, "check that run.dir is writable", "%s", err);
    print_start(tr, cfg, peak);
    print_outputs(cfg);
    metrics_open(metrics, cfg->run.dir, cfg->training.steps, cfg->run.log_every,
                 trainer_info(tr)->resumed);
    if (cfg->run.tensorboard) /* a new events file per run, resumed too */
        tb_open(tb, cfg->run.dir);
}

/* With data.blend, what each dataset gave so far:
 * "data_tokens": [..], "data_epochs": [..] in the blend's order. */
static void data_json(Trainer *tr, int steps, char *buf, size_t cap)
{
    TrainerDataset ds[CFG_MAX_BLEND];
    const int n = trainer_data_seen(tr, steps, ds);
    size_t used = (size_t)snprintf(buf, cap, "\"data_tokens\": [");
    for (int d = 0; d < n && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%llu", d ? ", " : "",
                                 (unsigned long long)ds[d].tokens);
    if (used < cap)
        used += (size_t)snprintf(buf + used, cap - used, "], \"data_epochs\": [");
    for (int d = 0; d < n && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%.6g", d ? ", " : "", ds[d].epochs);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
}

/* At the end, rank 0: each dataset's share of what the run drew. */
static void print_data_seen(Trainer *tr, int steps)
{
    TrainerDataset ds[CFG_MAX_BLEND];
    const int n = trainer_data_seen(tr, steps, ds);
    uint64_t all = 0;
    for (int d = 0; d < n; d++)
        all += ds[d].samples;
    for (int d = 0; d < n && all; d++)
        printf("data: %s: %llu samples (%.2f%%, weight %.2f%%), %llu tokens, %.3f epochs\n",
               ds[d].name, (unsigned long long)ds[d].samples,
               100.0 * (double)ds[d].samples / (double)all, 100.0 * ds[d].weight,
               (unsigned long long)ds[d].tokens, ds[d].epochs);
}

int train_run(const Config *cfg, Comm world)
{
    preempt_install(); /* SIGUSR1/SIGTERM/SIGINT: stop at an agreed step, checkpointed */
    /* From the start: start-up waits on other ranks too (NCCL's
     * initialisation, the checkpoint's agreement), and a rank that never
     * joins must end the job there as well. */
    watchdog_start(cfg->training.hang_timeout, world.rank, world.size, cfg->run.dir,
                   cfg->training.trace);
    Trainer *tr = trainer_create(cfg, world, TRAINER_TRAIN);
    const TrainerInfo *in = trainer_info(tr);
    check_run_dir(cfg, in->resumed, &world);
    const int rank0 = world.rank == 0;
    /* Every rank probes, so they share the machine the same way as in
     * training; rank 0's figure is the one reported. */
    const double peak = trainer_peak_flops(tr);
    const double flops_per_token = model_flops_per_token(&cfg->model);
    const long long tokens_per_step = (long long)cfg->training.global_batch * cfg->model.seq_len;

    Metrics metrics = {0};
    TbWriter tb = {0};
    char memory[2048];
    if (rank0)
        open_outputs(tr, cfg, peak / world.size, &metrics, &tb);
    memory_json(tr, memory, sizeof memory);
    Tokenizer *sample_tok = NULL;
    if (rank0 && cfg->training.sample_every > 0) {
        char err[CFG_ERR];
        sample_tok = data_tokenizer_named(cfg->model.vocab == 257 ? "byte" : "gpt2", err);
        if (!sample_tok)
            trd_fatal(TRD_EXIT_INPUT,
                      "fetch the GPT-2 vocabulary (scripts/get_corpus.sh), or "
                      "set training.sample_every: 0",
                      "training.sample_every: %s", err);
    }
    const CheckpointConfig *ck = &cfg->checkpoint;
    const double t_loop = now_s();
    int exit_code = TRD_EXIT_OK;
    int done = in->start_step; /* steps trained by the end */
    long long trained_total = rank0 ? (long long)trainer_trained_before(tr) : 0;
    AutoSave autosave = {.since = t_loop};
    for (int step = in->start_step; step < cfg->training.steps; step++) {
        straggler_begin();
        const double t0 = now_s();
        const TrainerStep r = trainer_step(tr, step);
        const double dt = now_s() - t0;
        done = step + 1;
        trained_total += (long long)r.trained;
        straggler_end(&world, step + 1, dt, cfg->run.log_every, cfg->training.straggler_threshold);

        StepMetrics s = {.step = step + 1,
                         .loss = r.loss,
                         .lr = r.lr,
                         .grad_norm = r.grad_norm,
                         .tokens = (long long)(step + 1) * tokens_per_step,
                         .trained_tokens = (long long)r.trained,
                         .trained_tokens_total = trained_total,
                         .step_ms = 1e3 * dt,
                         .tokens_per_s = (double)tokens_per_step / dt,
                         .mfu =
                             peak > 0 ? flops_per_token * (double)tokens_per_step / dt / peak : 0,
                         .comm_ms = r.comm_ms,
                         .data_ms = r.data_ms,
                         .comm_bytes = r.comm_bytes,
                         .pp_idle = r.pp_idle,
                         .cp_ms = r.cp_ms,
                         .cp_bytes = r.cp_bytes,
                         .val_loss = -1,
                         .extra = step == in->start_step ? memory : NULL};
        char extra[sizeof memory + 64 * CFG_MAX_BLEND + 256], moe[256];
        double moe_values[MOE_VALUES];
        const int has_moe = moe_json(tr, cfg, &world, moe, sizeof moe, moe_values);
        if (rank0 && (cfg->data.blend[0] || moe[0])) {
            extra[0] = '\0';
            if (cfg->data.blend[0])
                data_json(tr, step + 1, extra, sizeof extra);
            if (moe[0])
                snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "%s%s",
                         extra[0] ? ", " : "", moe);
            if (s.extra)
                snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", %s", s.extra);
            s.extra = extra;
        }
        const int last = step + 1 == cfg->training.steps;
        const int every = cfg->data.val_every > 0 && (step + 1) % cfg->data.val_every == 0;
        if (in->has_val && (last || every)) {
            s.val_loss = trainer_validate(tr, NULL);
            double dropped[MOE_VALUES]; /* validation's, not training's */
            moe_json(tr, cfg, &world, moe, sizeof moe, dropped);
        }
        /* The ETA extrapolates this run's mean step time (validation included). */
        s.elapsed_s = now_s() - t_loop;
        s.eta_s = s.elapsed_s / (step + 1 - in->start_step) * (cfg->training.steps - step - 1);
        if (rank0) {
            metrics_record(&metrics, &s);
            tb_record(&tb, &s);
            if (has_moe)
                tb_moe(&tb, step + 1, moe_values);
            if (step == in->start_step)
                tb_memory(&tb, tr, step + 1);
        }
        if (sample_tok && (step + 1) % cfg->training.sample_every == 0)
            print_sample(tr, cfg, sample_tok, step + 1);
        const int saved =
            ck->dir[0] && (last || (ck->every > 0 && (step + 1) % ck->every == 0) ||
                           (ck->every == CKPT_EVERY_AUTO && auto_save_due(&autosave, &world)));
        if (saved) {
            const double t_save = now_s();
            trainer_save(tr, step + 1, last);
            autosave.since = now_s();
            autosave.cost = autosave.since - t_save;
        } else
            trainer_poll_save(tr, 0); /* a finished background write: report it */
        /* A signal reaches the ranks at different moments; the all-reduced
         * flag makes them all stop after this same step (src/train/preempt.h). */
        if (!last && preempt_agree(&world)) {
            if (ck->dir[0] && !saved)
                trainer_save(tr, step + 1, 1);
            trainer_poll_save(tr, 1); /* the write in flight ends before the job */
            if (rank0)
                printf("preempted: a rank got a signal (SIGUSR1/SIGTERM/SIGINT); stopped after "
                       "step %d of %d, %s; exit %d\n",
                       step + 1, cfg->training.steps,
                       ck->dir[0] ? "checkpoint saved" : "no checkpoint.dir, nothing saved",
                       TRD_EXIT_PREEMPTED);
            exit_code = TRD_EXIT_PREEMPTED;
            break;
        }
    }
    if (rank0 && cfg->data.blend[0])
        print_data_seen(tr, done);
    trainer_report_device_memory(tr);
#ifdef TRD_HAVE_CUDA
    if (rank0 && cfg->backend == BACKEND_CUDA) /* TRIDENT_PROFILE's table, when it is on */
        backend_cuda_profile_report(cfg->run.dir);
#endif
    dump_weights(tr);
    watchdog_stop();
    if (sample_tok)
        tokenizer_free(sample_tok);
    if (rank0) {
        metrics_close(&metrics);
        tb_close(&tb);
    }
    trainer_destroy(tr);
    return exit_code;
}
