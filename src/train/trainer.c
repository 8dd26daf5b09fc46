/* trainer.c — building a rank's trainer, the optimizer step and the
 * validation pass (trainer.h).  Checkpoints: trainer_ckpt.c; threads,
 * GPUs and peak FLOP/s: trainer_device.c. */
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#ifdef TRD_HAVE_CUDA
#include "backend/cuda.h"
#endif
#include "config/layout.h"
#include "context_par/cp_attention.h"
#include "core/error.h"
#include "core/progress.h"
#include "comm/trace.h"
#include "model/params.h"
#include "train/runlock.h"
#include "train/lr_schedule.h"
#include "train/trainer_internal.h"

/* Open the training and validation data.  Every rank reads the same paths:
 * a bad one is bad input, and the ranks agree on it first, so the job ends
 * with exit 2 and one message (from the lowest failing rank) instead of an
 * abort of the whole job with the launcher's noise. */
static void open_data(Trainer *tr, Comm *world)
{
    const Config *cfg = tr->cfg;
    char err[CFG_ERR] = "";
    BlendSpec train, val;
    int bad = config_data_spec(&cfg->data, 0, &train, err) != 0 ||
              config_data_spec(&cfg->data, 1, &val, err) != 0;
    tr->info.has_val = !bad && val.n > 0;
    bad = bad || blend_open(&tr->train_data, &train, cfg->data.format, cfg->model.seq_len,
                            cfg->run.seed, cfg->model.vocab, err) != 0;
    if (!bad && tr->info.has_val)
        bad = blend_open(&tr->val_data, &val, cfg->data.format, cfg->model.seq_len, cfg->run.seed,
                         cfg->model.vocab, err) != 0;
    int first_bad = bad ? world->size - world->rank : 0; /* max = the lowest failing rank */
    comm_allreduce_max_i32(world, &first_bad, 1);
    if (first_bad)
        guard_exit_agreed(world->rank == world->size - first_bad ? 0 : 1, TRD_EXIT_INPUT,
                          strstr(err, "--->")
                              ? NULL
                              : "make a dataset with `trident prepare-data`, or "
                                "fetch the default one with scripts/get_corpus.sh (docs/data.md)",
                          "%s", err);
}

/* The positions of B sequences of T tokens: in their documents with
 * data.document_mask, else 0 .. T-1 (needed with context parallelism,
 * whose rows are not in order). */
static void positions(const Trainer *tr, const int32_t *tok, int B, int T, int32_t *pos)
{
    if (tr->cfg->data.document_mask) {
        batch_positions(tok, B, T, tr->cfg->data.eot, pos);
        return;
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            pos[(size_t)b * T + t] = t;
}

/* This rank's rows of B whole sequences (src [B][T]) into dst: its two
 * chunks of each, chunk-major (context_par/cp_attention.h). */
static void cut_chunks(const Trainer *tr, const int32_t *src, int B, int T, int32_t *dst)
{
    const int cp = tr->cp, L = T / (2 * cp);
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < B; b++)
            memcpy(dst + ((size_t)c * B + b) * L,
                   src + (size_t)b * T + (size_t)cp_chunk(cp, tr->topo.cp_rank, c) * L,
                   (size_t)L * sizeof(int32_t));
}

/* Fill micro-batch j (tokens, targets and positions, where kept: rows
 * each at j * rows) with the sequences at global stream positions first,
 * first+1, ...; sequences from `valid` on get no targets. */
static void read_batch(Trainer *tr, Blend *data, uint64_t first, int j, int valid)
{
    const int B = tr->cfg->training.micro_batch, T = tr->cfg->model.seq_len;
    const size_t at = (size_t)j * tr->rows, BT = (size_t)B * (size_t)T;
    int32_t *tok = tr->cp > 1 ? tr->whole : tr->tokens + at;
    int32_t *tgt = tr->cp > 1 ? tr->whole + BT : tr->targets + at;
    int32_t *pos = tr->cp > 1 ? tr->whole + 2 * BT : tr->pos ? tr->pos + at : NULL;
    char err[CFG_ERR];
    for (int b = 0; b < B; b++)
        if (blend_read(data, first + (uint64_t)b, tok + b * T, tgt + b * T, err) != 0)
            trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    if (pos)
        positions(tr, tok, B, T, pos);
    for (size_t i = (size_t)valid * (size_t)T; i < BT; i++)
        tgt[i] = -1;
    if (tr->cfg->data.eod_mask_loss)
        for (size_t i = 0; i < BT; i++)
            if (tgt[i] == tr->cfg->data.eot)
                tgt[i] = -1;
    if (tr->cp > 1) {
        cut_chunks(tr, tok, B, T, tr->tokens + at);
        cut_chunks(tr, tgt, B, T, tr->targets + at);
        cut_chunks(tr, pos, B, T, tr->pos + at);
    }
}

/* model.lora.dropout: the places in the token stream, sample x T + t, of
 * micro-batch j's rows (the sequences at stream positions first, first+1,
 * ...), in this rank's row order (its two chunks of each with cp > 1, as
 * cut_chunks); every stage, data read or not. */
static void dropout_rows(const Trainer *tr, uint64_t first, int j)
{
    const int B = tr->cfg->training.micro_batch, T = tr->cfg->model.seq_len, cp = tr->cp;
    uint64_t *rows = tr->drop_rows + (size_t)j * tr->rows;
    if (cp == 1) {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                rows[(size_t)b * T + t] = (first + (uint64_t)b) * (uint64_t)T + (uint64_t)t;
        return;
    }
    const int L = T / (2 * cp);
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < B; b++)
            for (int l = 0; l < L; l++) {
                const int t = cp_chunk(cp, tr->topo.cp_rank, c) * L + l;
                rows[((size_t)c * B + b) * L + l] =
                    (first + (uint64_t)b) * (uint64_t)T + (uint64_t)t;
            }
}

/* The stream position of the first sequence of micro-batch j of `step`:
 * the global batch is positions [step*GB, (step+1)*GB) of the sample stream
 * whatever the topology; micro-step j of DP rank d takes its B consecutive
 * positions from there. */
static uint64_t micro_first(const Trainer *tr, int step, int j)
{
    const TrainingConfig *t = &tr->cfg->training;
    return tr->start_position + (uint64_t)(step - tr->start_step) * (uint64_t)t->global_batch +
           (uint64_t)(j * tr->dp + tr->dp_rank) * (uint64_t)t->micro_batch;
}

/* Each micro-batch's loss_scale: its share of the targets the whole step
 * counts (over its micro-batches and the DP ranks).  The model averages a
 * micro-batch's loss over its counted targets, so with these shares the
 * gradient is the mean over every counted token of the global batch,
 * whatever the layout and micro-batch split, also when targets are masked
 * (data.eod_mask_loss) and micro-batches count different numbers.  With
 * every target counted each share is 1 / (n_micro * dp).  Ranks without
 * the data (middle pipeline stages) never use them: their DP group skips
 * the reduction alike. */
static double counted_targets(const Trainer *tr, int j)
{
    double n = 0;
    for (size_t i = 0; i < tr->rows; i++)
        n += tr->targets[(size_t)j * tr->rows + i] >= 0;
    return n;
}

static void loss_shares(Trainer *tr, int has_data)
{
    double total = 0;
    for (int j = 0; has_data && j < tr->n_micro; j++)
        total += counted_targets(tr, j);
    if (has_data)
        comm_allreduce_f64(&tr->comms.dp, &total, 1);
    tr->step_trained = total;
    for (int j = 0; j < tr->n_micro; j++)
        tr->loss_share[j] = total > 0 ? (float)(counted_targets(tr, j) / total) : 0.0f;
}

int trainer_data_seen(Trainer *tr, int steps, TrainerDataset *out)
{
    Blend *b = &tr->train_data;
    uint64_t count[CFG_MAX_BLEND];
    blend_counts(b, (uint64_t)steps * (uint64_t)tr->cfg->training.global_batch, count);
    for (int d = 0; d < b->n; d++)
        out[d] = (TrainerDataset){.name = b->data[d].name,
                                  .weight = b->weight[d],
                                  .samples = count[d],
                                  .tokens = count[d] * (uint64_t)tr->cfg->model.seq_len,
                                  .epochs = (double)count[d] / (double)b->sampler[d].n_samples,
                                  .n_tokens = b->data[d].n_tokens,
                                  .n_shards = b->data[d].n_shards,
                                  .samples_per_epoch = b->sampler[d].n_samples};
    return b->n;
}

/* The step's bf16 copy of the weights (backend.h weights_bf16), made
 * before its first forward where the flat parameter buffer holds every
 * weight whole and final on the device then: ZeRO 0-2 (stage 3 gathers
 * each layer into a slot), no topology.offload (the updated weights go up
 * on the copy stream while the forward runs).  Nothing writes the weights
 * during the forwards and backwards of a step, and weights_drop runs
 * before anything that may (the optimizer, a skipped step's path, and all
 * that happens between steps: validation, checkpoints). */
static void weights_copy(Trainer *tr)
{
    const Config *cfg = tr->cfg;
    if (!tr->be->weights_bf16 || cfg->topology.zero >= 3 || cfg->topology.offload != OFFLOAD_NONE)
        return;
    const ZeroState st = zero_state(tr->zero);
    tr->be->weights_bf16(st.params, zero_params(tr->zero)->numel);
}

static void weights_drop(Trainer *tr)
{
    if (tr->be->weights_bf16_drop)
        tr->be->weights_bf16_drop();
}

/* one_step on one rank with a device backend: the same step with one wait
 * for the device.  The loss is summed (loss_add), the gradient norm, the
 * clip factor and the non-finite decision made (grad_check) and AdamW run
 * or skipped (adamw_ranges reading that decision) all on the device; then
 * one read of the step's scalars.  The host's guard then sees what the
 * device saw: a stop ends the run with the parameters not updated, as the
 * host path stops before the update; a skip takes the step off AdamW's
 * count, the only host-side state of an update the device did not make. */
static double device_step(Trainer *tr, int step, double *grad_norm, float *lr, int *skipped)
{
    const Config *cfg = tr->cfg;
    const size_t BT = (size_t)cfg->training.micro_batch * (size_t)cfg->model.seq_len;
    tr->be->zero(tr->step_dev, sizeof *tr->step_dev);
    for (int j = 0; j < tr->n_micro; j++) {
        progress_step(step + 1, j + 1);
        model_set_positions(trainer_model(tr, 0), tr->pos ? tr->pos + j * BT : NULL);
        model_set_dropout_rows(trainer_model(tr, 0), tr->drop_rows ? tr->drop_rows + j * BT : NULL);
        zero_forward_backward(tr->zero, tr->tokens + j * BT, tr->targets + j * BT,
                              tr->loss_share[j], j == tr->n_micro - 1);
    }
    weights_drop(tr);
    zero_finish_grads(tr->zero);
    zero_grad_check(tr->zero, tr->step_dev, cfg->training.grad_clip);
    *lr = schedule_lr(&cfg->training, step);
    const double t_opt = comm_wtime();
    zero_optimizer_step(tr->zero, *lr, &cfg->training);
    tr->be->to_host(tr->step_host, tr->step_dev, sizeof *tr->step_host); /* the step's one wait */
    const double loss = tr->step_host->loss;
    *grad_norm = sqrt(tr->step_host->sumsq);
    *skipped =
        guard_nonfinite(&tr->guard, &cfg->training, step + 1, loss, *grad_norm, tr->topo.rank);
    TRD_ASSERT(*skipped == (tr->step_host->skip != 0)); /* the same test on the same values */
    if (*skipped)
        zero_optimizer_skipped(tr->zero);
    else if (trace_active())
        trace_span("optimizer", TRACE_COMPUTE, t_opt, comm_wtime(), -1, -1, 0);
    return loss;
}

/* One optimizer step; returns the mean loss over the global batch. */
static double one_step(Trainer *tr, int step, double *grad_norm, float *lr, int *skipped,
                       double *data_ms)
{
    const Config *cfg = tr->cfg;
    const int B = cfg->training.micro_batch;
    const double t_step = comm_wtime();

    progress_step(step + 1, 0);
    zero_begin_step(tr->zero);
    const size_t BT = tr->rows;
    /* (every stage attends within the documents of the batch, or needs the
     * positions of its rows with cp) */
    const int needs_data = !tr->pipe || tr->pos || tr->comms.pp.rank == 0 ||
                           tr->comms.pp.rank == tr->comms.pp.size - 1;
    const double t_data = comm_wtime();
    for (int j = 0; needs_data && j < tr->n_micro; j++)
        read_batch(tr, &tr->train_data, micro_first(tr, step, j), j, B);
    for (int j = 0; tr->drop_rows && j < tr->n_micro; j++)
        dropout_rows(tr, micro_first(tr, step, j), j);
    loss_shares(tr, needs_data);
    *data_ms = 1e3 * (comm_wtime() - t_data);
    weights_copy(tr);
    if (tr->step_dev) {
        const double loss = device_step(tr, step, grad_norm, lr, skipped);
        if (trace_active()) {
            char name[32];
            snprintf(name, sizeof name, "step %d", step + 1);
            trace_span(name, TRACE_STEP, t_step, comm_wtime(), -1, -1, 0);
        }
        return loss;
    }
    /* The micro-batches' mean losses weighted by their shares: the mean over
     * every counted token of the step, once summed over DP. */
    double loss = 0;
    if (tr->pipe) {
        loss = pp_stage_step(tr->pipe, tr->tokens, tr->targets, tr->pos, tr->drop_rows,
                             tr->loss_share);
        comm_allreduce_f64(&tr->comms.pp, &loss, 1); /* only the last stage has it */
    } else {
        for (int j = 0; j < tr->n_micro; j++) {
            progress_step(step + 1, j + 1); /* for the watchdog's message */
            model_set_positions(trainer_model(tr, 0), tr->pos ? tr->pos + j * BT : NULL);
            model_set_dropout_rows(trainer_model(tr, 0),
                                   tr->drop_rows ? tr->drop_rows + j * BT : NULL);
            loss += tr->loss_share[j] *
                    zero_forward_backward(tr->zero, tr->tokens + j * BT, tr->targets + j * BT,
                                          tr->loss_share[j], j == tr->n_micro - 1);
        }
        zero_finish_grads(tr->zero);
    }
    weights_drop(tr);
    comm_allreduce_f64(&tr->comms.dp, &loss, 1);

    double sumsq = zero_grad_sumsq(tr->zero);
    comm_allreduce_f64(&tr->comms.mp, &sumsq, 1);
    *grad_norm = sqrt(sumsq);
    *lr = schedule_lr(&cfg->training, step);
    /* Both values are all-reduced: every rank decides alike (guard.h). */
    *skipped =
        guard_nonfinite(&tr->guard, &cfg->training, step + 1, loss, *grad_norm, tr->topo.rank);
    if (*skipped) {
        zero_drop_grads(tr->zero);
        return loss; /* no optimizer step */
    }
    const float clip = cfg->training.grad_clip;
    if (clip > 0 && *grad_norm > clip)
        zero_scale_grads(tr->zero, clip / (float)(*grad_norm + 1e-6));

    const double t_opt = comm_wtime();
    zero_optimizer_step(tr->zero, *lr, &cfg->training);
    if (trace_active()) {
        char name[32];
        snprintf(name, sizeof name, "step %d", step + 1);
        trace_span("optimizer", TRACE_COMPUTE, t_opt, comm_wtime(), -1, -1, 0);
        trace_span(name, TRACE_STEP, t_step, comm_wtime(), -1, -1, 0);
    }
    return loss;
}

TrainerStep trainer_step(Trainer *tr, int step)
{
    TrainerStep r = {0};
#ifdef TRD_HAVE_CUDA
    const double t0 = comm_wtime(); /* the profile's step wall time */
#endif
    r.loss = one_step(tr, step, &r.grad_norm, &r.lr, &r.skipped, &r.data_ms);
#ifdef TRD_HAVE_CUDA
    if (tr->be->device)
        backend_cuda_step_end(step + 1, 1e3 * (comm_wtime() - t0));
#endif
    if (++tr->steps_taken == 1) /* staging buffers pooled by the first step */
        tr->staged_first = comm_staging().allocations;
    const ZeroStats zs = zero_take_stats(tr->zero);
    r.comm_ms = 1e3 * zs.exposed_comm_s;
    r.comm_bytes = zs.bytes;
    r.pp_idle = tr->pipe ? pp_exec_idle_fraction(pp_stage_stats(tr->pipe), &tr->comms.pp) : -1;
    r.cp_ms = -1;
    if (tr->cp > 1) {
        double s = 0;
        for (int c = 0; c < zero_chunks(tr->zero); c++)
            s += model_take_cp_seconds(zero_chunk_model(tr->zero, c));
        r.cp_ms = 1e3 * s;
        r.cp_bytes = tr->comms.cp.bytes_sent;
        tr->comms.cp.bytes_sent = 0;
    }
    r.trained = tr->step_trained;
    return r;
}

uint64_t trainer_trained_before(Trainer *tr)
{
    const Config *cfg = tr->cfg;
    const int T = cfg->model.seq_len;
    Blend *b = &tr->train_data;
    int masked = cfg->data.eod_mask_loss;
    for (int d = 0; d < b->n; d++)
        masked |= b->data[d].has_mask;
    if (!masked)
        return tr->start_position * (uint64_t)T;
    int32_t *tok = trd_malloc(2 * (size_t)T * sizeof *tok, "a sample");
    int32_t *tgt = tok + T;
    char err[CFG_ERR];
    uint64_t n = 0;
    for (uint64_t p = 0; p < tr->start_position; p++) {
        if (blend_read(b, p, tok, tgt, err) != 0)
            trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
        for (int t = 0; t < T; t++)
            n += tgt[t] >= 0 && !(cfg->data.eod_mask_loss && tgt[t] == cfg->data.eot);
    }
    free(tok);
    return n;
}

/* The mean loss per token of a fixed validation set, whatever the layout:
 * the first data.val_sequences sequences of the validation stream, cut into
 * micro-batches of micro_batch sequences that are dealt out to the DP
 * replicas in turn.  The rows of a partial last micro-batch get target -1,
 * which the loss ignores, so every layout and micro_batch sums the same
 * per-token losses (in another order). */
double trainer_validate(Trainer *tr, double *counted_tokens)
{
    const int B = tr->cfg->training.micro_batch;
    const int n = tr->cfg->data.val_sequences, batches = (n + B - 1) / B;
    /* Every DP rank runs the same number of forwards (ZeRO-3 gathers inside
     * them are collective); a rank past the end runs one with no target. */
    const int rounds = (batches + tr->dp - 1) / tr->dp;
    const double t0 = comm_wtime();
    double sum = 0, tokens = 0;
    for (int r = 0; r < rounds; r++) {
        const int j = r * tr->dp + tr->dp_rank;
        const int rows = j < batches ? (n - j * B < B ? n - j * B : B) : 0;
        read_batch(tr, &tr->val_data, (uint64_t)(rows ? j : 0) * (uint64_t)B, 0, rows);
        double counted = 0;
        for (size_t i = 0; i < tr->rows; i++)
            counted += tr->targets[i] >= 0;
        if (!tr->pipe)
            model_set_positions(trainer_model(tr, 0), tr->pos);
        double loss = tr->pipe ? pp_stage_forward(tr->pipe, tr->tokens, tr->targets, tr->pos)
                               : zero_forward(tr->zero, tr->tokens, tr->targets);
        sum += loss * counted; /* the model's loss is the mean over counted rows */
        tokens += counted;
    }
    if (tr->pipe)
        comm_allreduce_f64(&tr->comms.pp, &sum, 1); /* only the last stage has it */
    double both[2] = {sum, tokens};
    comm_allreduce_f64(&tr->comms.dp, both, 2);
    trace_span("validation", TRACE_STEP, t0, comm_wtime(), -1, -1, 0);
    if (tr->steps_taken == 1) /* the first step's validation pools its buffers too */
        tr->staged_first = comm_staging().allocations;
    if (counted_tokens)
        *counted_tokens = both[1];
    return both[1] > 0 ? both[0] / both[1] : 0.0;
}

MemoryReport trainer_memory(const Trainer *tr, size_t *snapshot)
{
    MemoryReport mem = {0};
    for (int c = 0; c < zero_chunks(tr->zero); c++) {
        MemoryReport cm = model_memory(zero_chunk_model(tr->zero, c));
        mem.activations += cm.activations;
        mem.scratch += cm.scratch;
        mem.frozen += cm.frozen;
    }
    if (tr->pipe) /* the gradient messages of micro-batches in flight */
        mem.activations += pp_stage_memory(tr->pipe);
    ZeroMemory zm = zero_memory(tr->zero);
    mem.params = zm.params;
    mem.grads = zm.grads;
    mem.optimizer = zm.optimizer;
    mem.host_optimizer = zm.host_optimizer;
    mem.buffers = zm.buffers;
    if (snapshot) /* a device backend's host copies are its snapshot: nothing more */
        *snapshot = tr->async && !tr->be->device ? ckpt_async_bytes(&tr->ckpt) : 0;
    return mem;
}

/* training.trace: every rank records its spans from here on (comm/trace.h);
 * its row is named by its mesh coordinates.  2^18 spans (18 MiB) a rank
 * hold hundreds of pipeline steps; later ones are counted, not kept. */
#define TRACE_MAX_SPANS ((size_t)1 << 18)
static void start_trace(Trainer *tr)
{
    if (!tr->cfg->training.trace)
        return;
    char label[64];
    snprintf(label, sizeof label, "rank %d (tp %d, pp %d, dp %d)", tr->topo.rank, tr->comms.tp.rank,
             tr->comms.pp.rank, tr->comms.dp.rank);
    trace_start(&tr->comms.world, label, TRACE_MAX_SPANS);
}

static void finish_trace(Trainer *tr)
{
    if (!trace_active())
        return;
    char path[CFG_STR + 16];
    snprintf(path, sizeof path, "%s/trace.json", tr->cfg->run.dir);
    long n = trace_finish(path);
    if (tr->topo.rank == 0 && n < 0)
        trd_fatal(TRD_EXIT_RUNTIME, "check that run.dir is writable", "cannot write %s: %s", path,
                  strerror(errno));
    if (tr->topo.rank == 0)
        printf("trace: %ld spans of %d ranks in %s (open in ui.perfetto.dev)\n", n,
               tr->comms.world.size, path);
}

/* The layout rules (config/layout.h): config validation applied them;
 * a Config built or changed without it is refused here the same way. */
static void check_layout(const Config *cfg, int rank)
{
    LayoutError e;
    if (layout_check(&cfg->model, &cfg->topology, &e) != 0)
        guard_exit_agreed(rank, TRD_EXIT_INPUT, NULL, "%s", e.msg);
}

/* The backend of cfg: cpu or cuda, fp32 or bf16 (bf16: GEMMs multiply bf16
 * operands with fp32 sums, backend.h; the weights are bf16 values with fp32
 * masters, zero/optimizer.h). */
static const Backend *pick_backend(const Config *cfg, int rank)
{
    const int bf16 = cfg->training.precision == PREC_BF16;
    if (cfg->backend != BACKEND_CUDA)
        return bf16 ? backend_cpu_bf16() : backend_cpu();
#ifdef TRD_HAVE_CUDA
    (void)rank;
    const Backend *be = bf16 ? backend_cuda_bf16() : backend_cuda();
    const char *prof = getenv("TRIDENT_PROFILE");
    return prof && strcmp(prof, "1") == 0 ? backend_cuda_profiled(be) : be;
#else
    guard_exit_agreed(rank, TRD_EXIT_INPUT,
                      "set backend: cpu, or rebuild with -Dcuda=enabled (docs/cuda.md)",
                      "backend cuda: this trident was built without the CUDA backend");
#endif
}

Trainer *trainer_create(const Config *cfg, Comm world, TrainerMode mode)
{
    Trainer *tr = trd_calloc(1, sizeof *tr, "trainer");
    tr->cfg = cfg;
    tr->mode = mode;
    tr->be = pick_backend(cfg, world.rank);
    check_layout(cfg, world.rank);
    topology_init(&tr->topo, &tr->comms, &cfg->topology, world);
    trainer_set_threads(world);
    trainer_use_device(tr);
    tr->cp = tr->topo.cp;
    tr->dp = tr->comms.dp.size / tr->cp;
    tr->dp_rank = tr->topo.data_rank;
    tr->n_micro = cfg->training.global_batch / (cfg->training.micro_batch * tr->dp);
    tr->rows = (size_t)cfg->training.micro_batch * (size_t)cfg->model.seq_len / (size_t)tr->cp;

    open_data(tr, &world);
    memcheck(cfg, tr->topo.ranks_per_node,
             tr->be->device ? tr->device_memory : memcheck_host_budget(tr->topo.ranks_per_node),
             &world);
    const int async = mode == TRAINER_TRAIN && trainer_async_decide(tr, &world);
    if (mode == TRAINER_TRAIN) /* inputs are good: create, probe and lock the output dirs */
        runlock_claim(cfg->run.dir, cfg->checkpoint.dir, &world);

    ParamShard shard = pp_rank_shard(&cfg->model, &cfg->topology, tr->comms.pp.rank,
                                     tr->comms.tp.size, tr->comms.tp.rank);
    if (config_ep_divides(cfg)) { /* this rank holds its ep rank's experts only */
        shard.ep = tr->comms.ep.size;
        shard.ep_rank = tr->comms.ep.rank;
    }
    for (int c = 0; c < shard.n_chunks; c++) {
        const ParamShard chunk = params_chunk_shard(&shard, c);
        tr->models[c] = model_create_unbound(cfg, tr->be, &chunk, cfg->training.micro_batch);
        model_set_tensor_parallel(tr->models[c], &tr->comms.tp);
        model_set_context_parallel(tr->models[c], &tr->comms.cp);
        model_set_expert_parallel(tr->models[c], &tr->comms.ep);
    }
    /* A tied embedding split over the first and last stage: its gradient
     * is summed over the embedding group before its DP bucket goes out. */
    const int tied = tr->comms.pp.size > 1 && cfg->model.tie_embeddings &&
                     tr->comms.embed.size > 1 &&
                     cfg->model.lora.rank == 0; /* LoRA: the embedding is frozen */
    tr->zero = zero_create(cfg, tr->be, &shard, tr->models, &tr->comms.dp,
                           tied ? &tr->comms.embed : NULL, &tr->comms.ep, &tr->comms.edp);
    start_trace(tr);
    if (tr->comms.pp.size > 1) {
        char err[CFG_ERR];
        tr->pipe = pp_stage_create(cfg, tr->zero, &tr->comms.pp, tr->n_micro, err);
        if (!tr->pipe)
            guard_exit_agreed(world.rank, TRD_EXIT_INPUT, NULL, "%s", err);
    }
    trainer_ckpt_setup(tr);
    tr->resumed = mode == TRAINER_TRAIN && trainer_resume(tr);
    trainer_init_from(tr, tr->resumed);
    if (async)
        tr->async = ckpt_async_create(&tr->ckpt, !tr->be->device);
    const size_t BT = tr->rows;
    tr->tokens = trd_malloc((size_t)tr->n_micro * BT * sizeof(int32_t), "token batches");
    tr->targets = trd_malloc((size_t)tr->n_micro * BT * sizeof(int32_t), "target batches");
    if (cfg->data.document_mask || tr->cp > 1)
        tr->pos = trd_malloc((size_t)tr->n_micro * BT * sizeof(int32_t), "token positions");
    if (tr->cp > 1)
        tr->whole = trd_malloc(3 * (size_t)cfg->training.micro_batch * (size_t)cfg->model.seq_len *
                                   sizeof(int32_t),
                               "whole sequences");
    tr->loss_share = trd_malloc((size_t)tr->n_micro * sizeof(float), "loss shares");
    if (cfg->model.lora.rank > 0 && cfg->model.lora.dropout > 0)
        tr->drop_rows =
            trd_malloc((size_t)tr->n_micro * BT * sizeof(uint64_t), "adapter dropout rows");
    if (tr->be->device && tr->topo.world == 1 && !tr->pipe) {
        tr->step_dev = model_step_state(trainer_model(tr, 0));
        tr->step_host = tr->be->host_alloc(sizeof *tr->step_host, "the step's scalars");
        model_set_step_state(trainer_model(tr, 0), tr->step_dev);
    }
    tr->info = (TrainerInfo){.be = tr->be,
                             .topo = &tr->topo,
                             .comms = &tr->comms,
                             .dp = tr->dp,
                             .n_micro = tr->n_micro,
                             .start_step = tr->start_step,
                             .resumed = tr->resumed,
                             .has_val = tr->info.has_val,
                             .n_datasets = tr->train_data.n,
                             .device = tr->device,
                             .nccl = tr->nccl,
                             .device_step = tr->step_dev != NULL};
    return tr;
}

void trainer_destroy(Trainer *tr)
{
    if (!tr)
        return;
    if (tr->mode == TRAINER_TRAIN) {
        trainer_poll_save(tr, 1); /* the write in flight ends before the trainer */
        finish_trace(tr);
        if (tr->topo.rank == 0)
            runlock_release();
    }
    ckpt_async_free(tr->async);
    free(tr->tokens);
    free(tr->targets);
    free(tr->pos);
    free(tr->drop_rows);
    free(tr->whole);
    free(tr->loss_share);
    if (tr->step_dev) /* (step_dev is the model's) */
        tr->be->host_release(tr->step_host);
    trainer_ckpt_teardown(tr);
    pp_stage_free(tr->pipe);
    zero_free(tr->zero);
    for (int c = 0; c < CFG_MAX_VIRTUAL; c++)
        model_free(tr->models[c]);
    blend_close(&tr->train_data);
    if (tr->info.has_val)
        blend_close(&tr->val_data);
    topology_comms_free(&tr->comms);
    free(tr);
}

const TrainerInfo *trainer_info(const Trainer *tr) { return &tr->info; }

Model *trainer_model(Trainer *tr, int c) { return zero_chunk_model(tr->zero, c); }

int trainer_gather_weights(Trainer *tr, float *buf, size_t *numel)
{
    if (tr->comms.mp.size > 1 || zero_params(tr->zero)->ep > 1) /* a piece of the model */
        return -1;
    const ParamTable *pt = zero_params(tr->zero);
    if (buf)
        zero_gather_params(tr->zero, buf);
    *numel = pt->numel;
    return 0;
}
