#include "train/train.h"

#include <cblas.h>
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#ifdef TRD_HAVE_CUDA
#include "backend/cuda.h"
#endif
#include "checkpoint/ckpt.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "core/launch.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/trace.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "data/sampler.h"
#include "model/model.h"
#include "model/params.h"
#include "train/memcheck.h"
#include "train/metrics.h"
#include "topology/topology.h"
#include "train/guard.h"
#include "train/pipeline.h"
#include "train/preempt.h"
#include "train/runlock.h"
#include "train/schedule.h"
#include "train/straggler.h"
#include "train/tensorboard.h"
#include "train/watchdog.h"
#include "zero/zero.h"

#define MAX_SETS 64

typedef struct {
    const char *config_path;
    const char *sets[MAX_SETS];
    int n_sets;
    int world_override; /* run: -n */
} Args;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage_train(FILE *f)
{
    fprintf(f,
            "usage: trident train CONFIG [--set key.path=value ...]\n"
            "       mpiexec -n N trident train CONFIG ...\n\n"
            "Trains the model described by the YAML CONFIG (see docs/config.md).\n"
            "  --set key.path=value   override one config key (repeatable),\n"
            "                         e.g. --set training.steps=100 --set model.arch=llama\n"
            "Writes <run.dir>/metrics.jsonl, <run.dir>/config.yaml and TensorBoard events in\n"
            "<run.dir>/tb/ (docs/monitoring.md; `trident report RUN_DIR` makes an HTML page).\n"
            "Exit codes: 0 success, 2 bad input, 1 runtime failure.\n");
}

static void usage_run(FILE *f)
{
    fprintf(f,
            "usage: trident run CONFIG [-n WORLD] [--set key.path=value ...]\n\n"
            "Launches `mpiexec -n WORLD trident train CONFIG ...` on this machine.\n"
            "WORLD defaults to topology.tp * topology.pp * topology.dp of the config\n"
            "(dp must then be a number, not auto).\n");
}

/* Returns 0, 1 for --help, or exits 2 on bad arguments. */
static int parse_args(int argc, char **argv, Args *a, int allow_n, void (*usage)(FILE *))
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (a->n_sets == MAX_SETS)
                trd_fatal(TRD_EXIT_INPUT, NULL, "more than %d --set options", MAX_SETS);
            a->sets[a->n_sets++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6)) {
            if (a->n_sets == MAX_SETS)
                trd_fatal(TRD_EXIT_INPUT, NULL, "more than %d --set options", MAX_SETS);
            a->sets[a->n_sets++] = argv[i] + 6;
        } else if (allow_n && !strcmp(argv[i], "-n") && i + 1 < argc) {
            a->world_override = atoi(argv[++i]);
            if (a->world_override < 1)
                trd_fatal(TRD_EXIT_INPUT, NULL, "-n needs a positive rank count, got '%s'",
                          argv[i]);
        } else if (argv[i][0] == '-' || a->config_path) {
            usage(stderr);
            trd_fatal(TRD_EXIT_INPUT, NULL, "unexpected argument '%s'", argv[i]);
        } else {
            a->config_path = argv[i];
        }
    }
    if (!a->config_path) {
        usage(stderr);
        trd_fatal(TRD_EXIT_INPUT, NULL, "missing CONFIG");
    }
    return 0;
}

/* Load, override and validate; on bad input every rank exits 2 (they all
 * read the same file, so they all fail the same way) and rank 0 says why.
 * world <= 0: not known yet (`trident run` before it launches). */
static void load_config(Config *cfg, const Args *a, int world, int rank)
{
    char err[CFG_ERR];
    int rc = config_load(cfg, a->config_path, err);
    for (int i = 0; rc == 0 && i < a->n_sets; i++)
        rc = config_set(cfg, a->sets[i], err);
    if (rc == 0)
        rc = config_validate(cfg, world, err);
    if (rc == 0)
        return;
    if (rank == 0)
        fprintf(stderr, "trident: error: %s\n", err);
    comm_finalize();
    exit(TRD_EXIT_INPUT);
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

double train_cpu_peak_flops(void)
{
    const int n = 1024;
    float *a = trd_malloc((size_t)n * n * sizeof(float), "peak probe");
    float *b = trd_malloc((size_t)n * n * sizeof(float), "peak probe");
    float *c = trd_malloc((size_t)n * n * sizeof(float), "peak probe");
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    /* The backend runs BLAS single-threaded inside its own OpenMP split;
     * the machine's limit is BLAS on every thread this rank has. */
    const int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(omp_get_max_threads());
    double best = 1e30;
    for (int rep = 0; rep < 10; rep++) { /* best of several: other work may share the cores */
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double dt = now_s() - t0;
        if (rep > 0 && dt < best) /* the first call warms up the thread pool */
            best = dt;
    }
    openblas_set_num_threads(blas_threads);
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * (double)n / best;
}

/* The training state one rank works on. */
typedef struct {
    const Config *cfg;
    const Backend *be;
    Topology topo;
    TopologyComms comms;
    Zero *zero;
    TokenDataset train_data, val_data;
    Sampler train_sampler, val_sampler;
    int has_val;
    int32_t *tokens, *targets; /* the step's micro-batches: [n_micro][B*T] */
    int dp, dp_rank, n_micro;
    PipeStage *pipe;           /* pp > 1 */
    CkptShardView ckpt;        /* what this rank saves and loads (host memory) */
    CkptAsync *async;          /* checkpoint.async on: the background writer */
    double async_blocked_s;    /* the write in flight: what its save step blocked */
    float *ckpt_dev[CKPT_KINDS]; /* device backends: the engine's buffers that ckpt's
                                    host copies mirror (NULL: none, or host backend) */
    char device[128];          /* device backends: the device's name */
    MemBudget device_memory;   /* device backends: the memory the state lives in */
    int nccl;                  /* device buffers go through NCCL (topology.comm) */
    int start_step;            /* first step of this run (> 0 when resumed) */
    uint64_t start_position;   /* sample stream position at start_step */
    int tied_embed_group;      /* first/last stage summing a tied embedding's gradient */
    uint64_t staged_first;     /* staging buffers allocated by the end of the first step */
    NonfiniteGuard guard;      /* training.nonfinite: skipped steps */
} Trainer;

/* A layout this build refuses: every rank reaches the same verdict from
 * the same config, so all exit 2 together and rank 0 says why (no abort,
 * which can swallow the message). */
static _Noreturn void refuse(int rank, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static _Noreturn void refuse(int rank, const char *hint, const char *fmt, ...)
{
    if (rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        trd_print_error(hint, fmt, ap);
        va_end(ap);
    }
    comm_finalize();
    exit(TRD_EXIT_INPUT);
}

/* Open the training and validation data.  Every rank reads the same paths:
 * a bad one is bad input, and the ranks agree on it first, so the job ends
 * with exit 2 and one message (from the lowest failing rank) instead of an
 * abort of the whole job with the launcher's noise. */
static void open_data(Trainer *tr, Comm *world)
{
    const Config *cfg = tr->cfg;
    char err[CFG_ERR] = "";
    tr->has_val = cfg->data.val_path[0] != '\0';
    int bad = dataset_open(&tr->train_data, cfg->data.path, cfg->data.format, err) != 0 ||
              sampler_init(&tr->train_sampler, &tr->train_data, cfg->model.seq_len,
                           cfg->run.seed, err) != 0 ||
              sampler_check_vocab(&tr->train_data, cfg->model.vocab, SAMPLER_VOCAB_SCAN, err) != 0;
    if (!bad && tr->has_val)
        bad = dataset_open(&tr->val_data, cfg->data.val_path, cfg->data.format, err) != 0 ||
              sampler_init(&tr->val_sampler, &tr->val_data, cfg->model.seq_len, cfg->run.seed,
                           err) != 0 ||
              sampler_check_vocab(&tr->val_data, cfg->model.vocab, SAMPLER_VOCAB_SCAN, err) != 0;
    int first_bad = bad ? world->size - world->rank : 0; /* max = the lowest failing rank */
    comm_allreduce_max_i32(world, &first_bad, 1);
    if (first_bad)
        refuse(world->rank == world->size - first_bad ? 0 : 1,
               strstr(err, "--->") ? NULL : "make a dataset with `trident prepare-data`, or "
               "fetch the default one with scripts/get_corpus.sh (docs/data.md)", "%s", err);
}

/* Fill one micro-batch (tok, tgt: [B*T]) with the sequences at global
 * stream positions first, first+1, ... */
static void read_batch(Trainer *tr, const Sampler *s, const TokenDataset *ds, uint64_t first,
                       int32_t *tok, int32_t *tgt)
{
    const int B = tr->cfg->training.micro_batch, T = tr->cfg->model.seq_len;
    char err[CFG_ERR];
    for (int b = 0; b < B; b++)
        if (sampler_read(s, ds, first + (uint64_t)b, tr->cfg->model.vocab, tok + b * T,
                         tgt + b * T, err) != 0)
            trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
}

/* PP_REDUCE of a pipeline step: a tied embedding's gradient is summed over
 * the first and last stage before its data-parallel bucket goes out. */
static void pipeline_reduce(void *ctx)
{
    Trainer *tr = ctx;
    if (tr->tied_embed_group) {
        const ParamSpec *w = params_find(zero_params(tr->zero), "embed.wte.weight");
        comm_allreduce_f32(&tr->comms.embed, zero_full_grads(tr->zero) + w->offset, w->numel);
        zero_start_outer(tr->zero);
    }
    zero_finish_grads(tr->zero);
}

/* One optimizer step; returns the mean loss over the global batch. */
static double train_step(Trainer *tr, int step, double *grad_norm, float *lr)
{
    const Config *cfg = tr->cfg;
    const int B = cfg->training.micro_batch;
    /* Pre-scaled so that the sum over DP ranks of the accumulated gradients
     * is the mean over the global batch. */
    const float loss_scale = 1.0f / (float)(tr->n_micro * tr->dp);
    const double t_step = MPI_Wtime();

    progress_step(step + 1, 0);
    zero_begin_step(tr->zero);
    const size_t BT = (size_t)B * (size_t)cfg->model.seq_len;
    const int needs_data = !tr->pipe || tr->comms.pp.rank == 0 ||
                           tr->comms.pp.rank == tr->comms.pp.size - 1;
    for (int j = 0; needs_data && j < tr->n_micro; j++) {
        /* The global batch is positions [step*GB, (step+1)*GB) of the sample
         * stream whatever the topology; micro-step j of DP rank d takes its
         * B consecutive positions from there. */
        uint64_t first = tr->start_position +
                         (uint64_t)(step - tr->start_step) * (uint64_t)cfg->training.global_batch +
                         (uint64_t)(j * tr->dp + tr->dp_rank) * (uint64_t)B;
        read_batch(tr, &tr->train_sampler, &tr->train_data, first, tr->tokens + j * BT,
                   tr->targets + j * BT);
    }
    double loss = 0;
    if (tr->pipe) {
        loss = pipe_step(tr->pipe, tr->tokens, tr->targets, loss_scale, pipeline_reduce, tr);
        comm_allreduce_f64(&tr->comms.pp, &loss, 1); /* only the last stage has it */
    } else {
        for (int j = 0; j < tr->n_micro; j++) {
            progress_step(step + 1, j + 1); /* for the watchdog's message */
            loss += zero_forward_backward(tr->zero, tr->tokens + j * BT, tr->targets + j * BT,
                                          loss_scale, j == tr->n_micro - 1);
        }
        zero_finish_grads(tr->zero);
    }
    loss /= tr->n_micro * tr->dp;
    comm_allreduce_f64(&tr->comms.dp, &loss, 1);

    double sumsq = zero_grad_sumsq(tr->zero);
    comm_allreduce_f64(&tr->comms.mp, &sumsq, 1);
    *grad_norm = sqrt(sumsq);
    *lr = schedule_lr(&cfg->training, step);
    /* Both values are all-reduced: every rank decides alike (guard.h). */
    if (guard_nonfinite(&tr->guard, &cfg->training, step + 1, loss, *grad_norm, tr->topo.rank))
        return loss; /* skipped: no optimizer step */
    const float clip = cfg->training.grad_clip;
    if (clip > 0 && *grad_norm > clip)
        zero_scale_grads(tr->zero, clip / (float)(*grad_norm + 1e-6));

    const double t_opt = MPI_Wtime();
    zero_optimizer_step(tr->zero, *lr, &cfg->training);
    if (trace_active()) {
        char name[32];
        snprintf(name, sizeof name, "step %d", step + 1);
        trace_span("optimizer", TRACE_COMPUTE, t_opt, MPI_Wtime(), -1, -1, 0);
        trace_span(name, TRACE_STEP, t_step, MPI_Wtime(), -1, -1, 0);
    }
    return loss;
}

/* The mean loss per token of a fixed validation set, whatever the layout:
 * the first data.val_sequences sequences of the validation stream, cut into
 * micro-batches of micro_batch sequences that are dealt out to the DP
 * replicas in turn.  The rows of a partial last micro-batch get target -1,
 * which the loss ignores, so every layout and micro_batch sums the same
 * per-token losses (in another order). */
static double validate(Trainer *tr, double *counted_tokens)
{
    const int B = tr->cfg->training.micro_batch, T = tr->cfg->model.seq_len;
    const int n = tr->cfg->data.val_sequences, batches = (n + B - 1) / B;
    /* Every DP rank runs the same number of forwards (ZeRO-3 gathers inside
     * them are collective); a rank past the end runs one with no target. */
    const int rounds = (batches + tr->dp - 1) / tr->dp;
    const double t0 = MPI_Wtime();
    double sum = 0, tokens = 0;
    for (int r = 0; r < rounds; r++) {
        const int j = r * tr->dp + tr->dp_rank;
        const int rows = j < batches ? (n - j * B < B ? n - j * B : B) : 0;
        read_batch(tr, &tr->val_sampler, &tr->val_data, (uint64_t)(rows ? j : 0) * (uint64_t)B,
                   tr->tokens, tr->targets);
        for (size_t i = (size_t)rows * (size_t)T; i < (size_t)B * (size_t)T; i++)
            tr->targets[i] = -1;
        double counted = 0;
        for (size_t i = 0; i < (size_t)rows * (size_t)T; i++)
            counted += tr->targets[i] >= 0;
        double loss = tr->pipe ? pipe_forward(tr->pipe, tr->tokens, tr->targets)
                               : zero_forward(tr->zero, tr->tokens, tr->targets);
        sum += loss * counted; /* the model's loss is the mean over counted rows */
        tokens += counted;
    }
    if (tr->pipe)
        comm_allreduce_f64(&tr->comms.pp, &sum, 1); /* only the last stage has it */
    double both[2] = {sum, tokens};
    comm_allreduce_f64(&tr->comms.dp, both, 2);
    trace_span("validation", TRACE_STEP, t0, MPI_Wtime(), -1, -1, 0);
    if (counted_tokens)
        *counted_tokens = both[1];
    return both[1] > 0 ? both[0] / both[1] : 0.0;
}

static MemoryReport memory_report(const Trainer *tr)
{
    MemoryReport mem = {0};
    for (int c = 0; c < zero_chunks(tr->zero); c++) {
        MemoryReport cm = model_memory(zero_chunk_model(tr->zero, c));
        mem.activations += cm.activations;
        mem.scratch += cm.scratch;
    }
    if (tr->pipe) /* the gradient messages of micro-batches in flight */
        mem.activations += pipe_memory(tr->pipe);
    ZeroMemory zm = zero_memory(tr->zero);
    mem.params = zm.params;
    mem.grads = zm.grads;
    mem.optimizer = zm.optimizer;
    mem.buffers = zm.buffers;
    return mem;
}

/* Host bytes of the asynchronous checkpoint's snapshot (0: none, or a
 * device backend's host copies serve). */
static size_t snapshot_bytes(const Trainer *tr)
{
    return tr->async && !tr->be->device ? ckpt_async_bytes(&tr->ckpt) : 0;
}

static void print_start(const Trainer *tr, double peak)
{
    const Config *cfg = tr->cfg;
    const ModelConfig *mc = &cfg->model;
    MemoryReport mem = memory_report(tr);
    char err[CFG_ERR];
    printf("trident: %s %s | layers %d hidden %d heads %d kv_heads %d ffn %d vocab %d (padded %d) "
           "seq %d\n",
           cfg->run.name, config_arch_name(mc->arch), mc->layers, mc->hidden, mc->heads,
           mc->kv_heads, mc->ffn_hidden, mc->vocab, params_padded_vocab(mc, cfg->topology.tp),
           mc->seq_len);
    /* The whole per-rank table for worlds one can read; its summary beyond. */
    const TopoMapFormat fmt = tr->topo.world <= 64 ? TOPO_MAP_TABLE : TOPO_MAP_SUMMARY;
    if (topology_print_map(stdout, &cfg->topology, tr->topo.world, tr->topo.ranks_per_node, fmt,
                           err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    printf("parameters: %zu (%.2f M)\n", params_count_real(mc), 1e-6 * (double)params_count_real(mc));
    printf("memory per rank (MiB): params %.1f | grads %.1f | optimizer %.1f | zero buffers %.1f "
           "| activations %.1f | scratch %.1f | checkpoint snapshot %.1f\n",
           trd_mib(mem.params), trd_mib(mem.grads), trd_mib(mem.optimizer), trd_mib(mem.buffers),
           trd_mib(mem.activations), trd_mib(mem.scratch), trd_mib(snapshot_bytes(tr)));
    printf("batch: global %d sequences = %d micro-steps x micro_batch %d x dp %d | %d tokens/step "
           "| zero %d\n",
           cfg->training.global_batch, tr->n_micro, cfg->training.micro_batch, tr->dp,
           cfg->training.global_batch * mc->seq_len, cfg->topology.zero);
    if (tr->be->device)
        printf("backend: %s on %s | MFU against %.1f TFLOP/s | precision %s | comm %s\n",
               tr->be->name, tr->device, 1e-12 * peak,
               config_precision_name(cfg->training.precision),
               tr->nccl ? "nccl" : "mpi (host staging)");
    else
        printf("backend: cpu (%d OpenMP threads per rank), BLAS SGEMM peak %.1f GFLOP/s | "
               "precision %s\n",
               omp_get_max_threads(), 1e-9 * peak, config_precision_name(cfg->training.precision));
    printf("data: %s (%llu tokens, %llu samples/epoch)%s%s\n", cfg->data.path,
           (unsigned long long)tr->train_data.n_tokens,
           (unsigned long long)tr->train_sampler.n_samples, tr->has_val ? " | val: " : "",
           tr->has_val ? cfg->data.val_path : "");
    fflush(stdout);
}

/* Collective over the pipeline group: with pp > 1 the record also lists
 * every stage's activation bytes (stages hold different numbers of
 * micro-batches in flight). */
static void memory_json(Trainer *tr, char *buf, size_t cap)
{
    MemoryReport mem = memory_report(tr);
    int n = snprintf(buf, cap,
                     "\"memory_bytes\": {\"params\": %zu, \"grads\": %zu, \"optimizer\": %zu, "
                     "\"zero_buffers\": %zu, \"activations\": %zu, \"scratch\": %zu, "
                     "\"checkpoint_snapshot\": %zu}",
                     mem.params, mem.grads, mem.optimizer, mem.buffers, mem.activations,
                     mem.scratch, snapshot_bytes(tr));
    if (!tr->pipe)
        return;
    const int pp = tr->comms.pp.size;
    double *acts = trd_calloc((size_t)pp, sizeof(double), "stage activation bytes");
    acts[tr->comms.pp.rank] = (double)mem.activations;
    comm_allreduce_f64(&tr->comms.pp, acts, (size_t)pp);
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
    const MemoryReport m = memory_report(tr);
    static const char *const names[] = {"params", "grads", "optimizer", "zero_buffers",
                                        "activations", "scratch", "checkpoint_snapshot"};
    const double bytes[] = {(double)m.params, (double)m.grads, (double)m.optimizer,
                            (double)m.buffers, (double)m.activations, (double)m.scratch,
                            (double)snapshot_bytes(tr)};
    tb_record_values(tb, step, "memory_bytes", names, bytes, 7);
}

/* Point the checkpoint view at the engine's buffers. */
static void ckpt_setup(Trainer *tr)
{
    const ParamTable *t = zero_params(tr->zero);
    ckpt_view_init(&tr->ckpt, t, tr->cfg->topology.zero, tr->comms.dp.rank, tr->comms.dp.size,
                   tr->comms.pp.rank, MPI_COMM_WORLD);
    ZeroState zs = zero_state(tr->zero);
    float *state[CKPT_KINDS] = {[CKPT_PARAMS] = zs.params, [CKPT_MASTER] = zs.master,
                                [CKPT_ADAM_M] = zs.m, [CKPT_ADAM_V] = zs.v};
    for (int k = 0; k < CKPT_KINDS; k++) {
        CkptRange *r = &tr->ckpt.part[k];
        r->data = state[k];
        if (!tr->be->device || !state[k])
            continue;
        /* HDF5 reads and writes host memory: a host copy of each buffer. */
        tr->ckpt_dev[k] = state[k];
        r->data = trd_malloc((r->hi - r->lo ? r->hi - r->lo : 1) * sizeof(float),
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
        const size_t bytes = (r->hi - r->lo) * sizeof(float);
        if (to_host)
            tr->be->to_host(r->data, tr->ckpt_dev[k], bytes);
        else
            tr->be->to_backend(tr->ckpt_dev[k], r->data, bytes);
    }
}

static void ckpt_teardown(Trainer *tr)
{
    for (int k = 0; k < CKPT_KINDS; k++)
        if (tr->ckpt_dev[k])
            free(tr->ckpt.part[k].data);
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
    for (size_t i = 0; r->data && i < r->hi - r->lo; i++)
        r->data[i] = bf16_round(r->data[i]);
}

/* checkpoint.resume: auto (latest if any), never, or a step directory.
 * Returns whether the run continues from a checkpoint. */
static int ckpt_resume(Trainer *tr)
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
                          "%s", err);
    if (rc == 0)
        return 0;
    if (err[0] && rank == 0)
        printf("checkpoint: %s\n", err); /* no latest: which step was taken */
    CkptState st;
    ckpt_sync(tr, 1); /* what the load does not replace stays as it is */
    if (ckpt_load(dir, &tr->ckpt, &st, tr->cfg, err) != 0)
        guard_exit_agreed(rank, TRD_EXIT_INPUT, "resume from another checkpoint "
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
    *zero_state(tr->zero).adam_t = (int)st.adam_t;
    tr->start_step = (int)st.step;
    tr->start_position = st.sampler_position;
    if (rank == 0)
        printf("resumed from %s: step %d, sample position %llu, tokens seen %llu, lr step %lld, "
               "adam_t %lld\n", dir, tr->start_step, (unsigned long long)tr->start_position,
               (unsigned long long)tr->start_position * (unsigned long long)tr->cfg->model.seq_len,
               (long long)st.lr_step, (long long)st.adam_t);
    return 1;
}

/* checkpoint.init_from: the weights of a Hugging Face directory (it has a
 * config.json) or of a trident checkpoint start this run at step 0, with a
 * fresh optimizer, schedule and sampler.  Every rank reads its own pieces:
 * of the safetensors files (ckpt_hf_load_weights), or of the checkpoint the
 * way a resume does.  Ignored, with a note, when the run resumed. */
static void ckpt_init_from(Trainer *tr, int resumed)
{
    const char *src = tr->cfg->checkpoint.init_from;
    const int rank = tr->topo.rank;
    if (!src[0])
        return;
    if (resumed) {
        if (rank == 0)
            printf("note: checkpoint.init_from %s ignored: the run resumed from its own "
                   "checkpoint\n", src);
        return;
    }
    char dir[CFG_STR], err[CFG_ERR] = "", json[CFG_STR + 16];
    snprintf(json, sizeof json, "%s/config.json", src);
    struct stat st;
    const int hf = stat(json, &st) == 0;
    if (stat(src, &st) != 0 || !S_ISDIR(st.st_mode))
        guard_exit_agreed(rank, TRD_EXIT_INPUT, "checkpoint.init_from: a Hugging Face "
                          "directory (with config.json) or a trident checkpoint",
                          "checkpoint.init_from: %s: no such directory", src);
    if (!hf && ckpt_resolve(NULL, RESUME_PATH, src, dir, err) != 1)
        guard_exit_agreed(rank, TRD_EXIT_INPUT, "checkpoint.init_from: a Hugging Face "
                          "directory (with config.json) or a trident checkpoint",
                          "checkpoint.init_from: %s", err);
    ckpt_sync(tr, 1); /* the optimizer state stays as initialised */
    /* A Hugging Face directory: each rank reads its pieces of the
     * safetensors files, nothing is converted on disk. */
    int code = TRD_EXIT_OK;
    if (hf)
        code = ckpt_hf_load_weights(src, &tr->ckpt, tr->cfg, err);
    else if (ckpt_load_weights(dir, &tr->ckpt, tr->cfg, err) != 0)
        code = TRD_EXIT_INPUT;
    if (code != TRD_EXIT_OK)
        guard_exit_agreed(rank, code, "the model section must describe the model "
                          "checkpoint.init_from holds (a directory written by `trident ckpt "
                          "export --format hf`, or a trident checkpoint)",
                          "checkpoint.init_from: %s", err);
    round_weights(tr);
    ckpt_sync(tr, 0);
    if (rank == 0)
        printf("initialised from %s: weights of %s, step 0, fresh optimizer and data\n", src,
               hf ? "its safetensors (each rank read its own pieces)" : dir);
}

/* training.sample_every: a continuation of end-of-text by the model as it
 * is now, as llm.c prints during training.  Rank 0 alone: with tp 1, pp 1
 * and ZeRO 0-2 (config validation) its model holds every weight.  Up to 64
 * tokens, temperature 1, drawn with the RNG keyed by (seed, step). */
static void print_sample(Trainer *tr, Tokenizer *tok, int step)
{
    Model *m = zero_chunk_model(tr->zero, 0);
    const int n = tr->cfg->model.seq_len < 64 ? tr->cfg->model.seq_len : 64;
    Decoder *dc = decoder_create(m, n);
    int32_t ids[64];
    ids[0] = tokenizer_eot(tok);
    const float *logits = decoder_step(dc, ids, 1);
    int len = 1;
    while (len < n) {
        const uint64_t r = rng_u64(rng_mix(tr->cfg->run.seed, (uint64_t)step), (uint64_t)len);
        ids[len] = decoder_sample(logits, decoder_vocab(dc), 1.0f, (double)(r >> 11) * 0x1.0p-53);
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

/* checkpoint.async (docs/checkpoint.md): auto is on where MPI runs calls
 * from threads and the planner's snapshot fits in RAM beside the state
 * memcheck counted (device backends: their host copies are the snapshot,
 * and nothing more is allocated).  Decided before anything is allocated. */
static int async_decide(const Trainer *tr, Comm *world)
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
        refuse(world->rank, "set checkpoint.async: auto (synchronous where it cannot be "
               "asynchronous) or false", "checkpoint.async: true: %s (per rank %.2f GiB of "
               "state and %.2f GiB of snapshot, as `trident plan` counts them; %d rank(s) "
               "share %s, %.2f GiB)", reason, state / (1 << 30), snap / (1 << 30), ram.sharers,
               ram.what, ram.bytes / (1 << 30));
    if (why && world->rank == 0)
        printf("checkpoint: saves are synchronous (checkpoint.async: auto): %s\n", reason);
    return !why;
}

/* The background write in flight, once every rank's writer has returned
 * (block: wait for it; else only if all have, one all-reduce).  A failed
 * write stops the job as a failed synchronous save does. */
static void async_finish(Trainer *tr, Comm *world, int block)
{
    if (!ckpt_async_in_flight(tr->async))
        return;
    if (!block) {
        int pending = !ckpt_async_finished(tr->async);
        comm_allreduce_max_i32(world, &pending, 1);
        if (pending)
            return;
    }
    CkptAsyncDone d;
    char err[CFG_ERR];
    if (ckpt_async_wait(tr->async, &d, err) != 0)
        guard_exit_agreed(tr->topo.rank, TRD_EXIT_RUNTIME,
                          "nothing was published, the previous checkpoint and latest are "
                          "unchanged; check free space and permissions of checkpoint.dir, or "
                          "for non-finite values training.lr and weight_decay", "%s", err);
    tr->async_blocked_s += d.waited_s;
    trace_span("checkpoint write", TRACE_STEP, d.t_start, d.t_end, -1, -1, 0);
    if (tr->topo.rank == 0)
        printf("checkpoint: step %lld saved to %s in %.2f s (in the background; training "
               "blocked %.3f s)\n", (long long)d.step, tr->cfg->checkpoint.dir,
               d.t_end - d.t_start, tr->async_blocked_s);
}

/* Save steps_done: synchronously, or (checkpoint.async) wait for the
 * previous write, copy the state into the snapshot and go on; `wait`
 * (the run ends) waits for this write too. */
static void ckpt_save_step(Trainer *tr, Comm *world, int steps_done, int wait)
{
    const Config *cfg = tr->cfg;
    CkptState st = {.step = steps_done,
                    .sampler_position = tr->start_position +
                                        (uint64_t)(steps_done - tr->start_step) *
                                            (uint64_t)cfg->training.global_batch,
                    .lr_step = steps_done, .adam_t = *zero_state(tr->zero).adam_t};
    char err[CFG_ERR];
    const double t0 = MPI_Wtime();
    if (tr->async) {
        async_finish(tr, world, 1);
        const double t_copy = MPI_Wtime();
        ckpt_sync(tr, 1); /* device backends: the host copies are the snapshot */
        const float *src[CKPT_KINDS];
        for (int k = 0; k < CKPT_KINDS; k++)
            src[k] = tr->be->device ? NULL : tr->ckpt.part[k].data;
        if (ckpt_async_snapshot(tr->async, src, steps_done, err) != 0)
            guard_exit_agreed(tr->topo.rank, TRD_EXIT_RUNTIME, "lower training.lr or "
                              "weight_decay: an update made the state non-finite", "%s", err);
        ckpt_async_start(tr->async, cfg->checkpoint.dir, &st, cfg, cfg->checkpoint.keep);
        tr->async_blocked_s = MPI_Wtime() - t0;
        trace_span("checkpoint snapshot", TRACE_STEP, t_copy, MPI_Wtime(), -1, -1, 0);
        if (wait)
            async_finish(tr, world, 1);
        return;
    }
    ckpt_sync(tr, 1);
    if (ckpt_save(cfg->checkpoint.dir, &tr->ckpt, &st, cfg, cfg->checkpoint.keep, err) != 0)
        guard_exit_agreed(tr->topo.rank, TRD_EXIT_RUNTIME,
                          "nothing was published, the previous checkpoint and latest are "
                          "unchanged; check free space and permissions of checkpoint.dir, or "
                          "for non-finite values training.lr and weight_decay", "%s", err);
    trace_span("checkpoint save", TRACE_STEP, t0, MPI_Wtime(), -1, -1, 0);
    if (tr->topo.rank == 0)
        printf("checkpoint: step %d saved to %s in %.2f s\n", steps_done, cfg->checkpoint.dir,
               MPI_Wtime() - t0);
}

/* TRIDENT_DUMP_WEIGHTS=FILE: rank 0 writes the final flat parameter buffer
 * (fp32, table order) — a testing aid: the tests compare the final weights
 * of layouts with it, without reading a checkpoint. */
static void dump_weights(Trainer *tr)
{
    const char *path = getenv("TRIDENT_DUMP_WEIGHTS");
    if (!path || !*path)
        return;
    if (tr->comms.mp.size > 1) { /* the flat buffer is a piece of the model */
        if (tr->topo.rank == 0)
            fprintf(stderr, "trident: TRIDENT_DUMP_WEIGHTS ignored: tp x pp > 1\n");
        return;
    }
    const ParamTable *pt = zero_params(tr->zero);
    float *buf = trd_malloc(pt->numel * sizeof(float), "weight dump");
    zero_gather_params(tr->zero, buf);
    if (tr->topo.rank == 0) {
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(buf, sizeof(float), pt->numel, f) != pt->numel || fclose(f) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot write %s: %s", path, strerror(errno));
    }
    free(buf);
}

/* training.trace: every rank records its spans from here on (core/trace.h);
 * its row is named by its mesh coordinates.  2^18 spans (18 MiB) a rank
 * hold hundreds of pipeline steps; later ones are counted, not kept. */
#define TRACE_MAX_SPANS ((size_t)1 << 18)
static void start_trace(Trainer *tr)
{
    if (!tr->cfg->training.trace)
        return;
    char label[64];
    snprintf(label, sizeof label, "rank %d (tp %d, pp %d, dp %d)", tr->topo.rank,
             tr->comms.tp.rank, tr->comms.pp.rank, tr->comms.dp.rank);
    trace_start(tr->comms.world.mpi, label, TRACE_MAX_SPANS);
}

static void finish_trace(Trainer *tr)
{
    if (!trace_active())
        return;
    char path[CFG_STR + 16];
    snprintf(path, sizeof path, "%s/trace.json", tr->cfg->run.dir);
    long n = trace_finish(path);
    if (tr->topo.rank == 0 && n < 0)
        trd_fatal(TRD_EXIT_RUNTIME, "check that run.dir is writable", "cannot write %s: %s",
                  path, strerror(errno));
    if (tr->topo.rank == 0)
        printf("trace: %ld spans of %d ranks in %s (open in ui.perfetto.dev)\n", n,
               tr->comms.world.size, path);
}

/* Ranks sharing a machine split its cores, unless OMP_NUM_THREADS says
 * otherwise: oversubscribed OpenMP and BLAS threads crawl. */
static void set_threads(Comm world)
{
    MPI_Comm local;
    int local_size = 1;
    MPI_Comm_split_type(world.mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    int threads = omp_get_num_procs() / local_size;
    if (threads < 1)
        threads = 1;
    if (!getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(threads);
}

/* NCCL for device buffers: asked for, or (auto) built in and every rank on a
 * GPU of its own.  The emulated build takes NCCL only when asked: its MPI
 * staging path is the one the rest of the tests exercise. */
static int want_nccl(CommKind kind, int shared)
{
    if (kind != COMM_AUTO)
        return kind == COMM_NCCL;
#if defined(TRD_HAVE_NCCL) && !defined(TRD_CUDA_EMULATED)
    return !shared;
#else
    (void)shared;
    return 0;
#endif
}

/* Device backends: pick this rank's GPU (node-local rank, round robin when
 * ranks outnumber GPUs: they then share one through the MPI path), and let
 * every group's float buffers live in device memory (comm.h staging). */
static void use_device(Trainer *tr)
{
    if (!tr->be->device)
        return;
#ifdef TRD_HAVE_CUDA
    const int n = backend_cuda_devices();
    if (n < 1)
        trd_fatal(TRD_EXIT_RUNTIME, "run on a machine with an NVIDIA GPU and driver, or set "
                  "backend: cpu", "backend cuda: no CUDA device is visible to rank %d",
                  tr->topo.rank);
    const int dev = tr->topo.local_rank % n;
    backend_cuda_set_device(dev);
    backend_cuda_device_name(dev, tr->device, sizeof tr->device);
    tr->device_memory = (MemBudget){.bytes = (double)backend_cuda_device_memory(dev),
                                    .sharers = (tr->topo.ranks_per_node + n - 1) / n,
                                    .what = tr->device};
    /* NCCL wants a GPU per rank: two ranks of a communicator on one GPU
     * fail.  Whether any rank shares is agreed by all (the choice is
     * collective). */
    int shared = tr->topo.local_rank >= n;
    comm_allreduce_max_i32(&tr->comms.world, &shared, 1);
#ifdef TRD_CUDA_EMULATED
    shared = 0; /* the emulation's NCCL is MPI: any number of ranks share its device */
#endif
#else
    const int shared = 0;
#endif
    Comm *groups[] = {&tr->comms.world, &tr->comms.tp, &tr->comms.dp, &tr->comms.pp,
                      &tr->comms.mp, &tr->comms.embed};
    const int n_groups = (int)(sizeof groups / sizeof *groups);
    for (int i = 0; i < n_groups; i++)
        comm_use_memory(groups[i], tr->be);
    tr->nccl = want_nccl(tr->cfg->topology.comm, shared);
#ifndef TRD_HAVE_NCCL
    if (tr->nccl)
        refuse(tr->topo.rank, "set topology.comm: mpi, or rebuild where the CUDA toolkit has "
               "NCCL (libnccl beside libcudart; docs/cuda.md)",
               "topology.comm nccl: this trident was built without NCCL");
#endif
    if (tr->nccl && shared)
        refuse(tr->topo.rank, "set topology.comm: mpi (host staging), or give every rank a GPU "
               "of its own", "topology.comm nccl: ranks of a node share a GPU, which NCCL does "
               "not allow");
    if (tr->nccl)
        comm_use_nccl(&tr->comms.world, groups, n_groups);
}

/* Device backends: the most device memory a rank held (rank 0 prints the
 * largest), against the report's categories above. */
static void report_device_memory(Trainer *tr)
{
    if (!tr->be->device)
        return;
    size_t live = 0, peak = 0;
#ifdef TRD_HAVE_CUDA
    backend_cuda_memory(&live, &peak);
#endif
    (void)live;
    /* Staging buffers are pooled: after the first step, a steady run
     * allocates none (each step repeats the same transfers). */
    const CommStaging st = comm_staging();
    double v[3] = {(double)peak, (double)st.allocations, (double)(st.allocations -
                                                                  tr->staged_first)};
    comm_allreduce_max_f64(&tr->comms.world, v, 3);
    if (tr->topo.rank == 0) {
        printf("device memory: peak %.0f bytes (%.1f MiB) held by trident on the busiest rank "
               "(rank 0: %zu bytes)\n", v[0], v[0] / (1024.0 * 1024.0), peak);
        printf("host staging: %.0f buffers allocated (busiest rank), %.0f of them after the "
               "first step; rank 0 holds %.1f MiB\n", v[1], v[2], trd_mib(st.bytes));
    }
    comm_staging_free();
}

/* The dense bf16 tensor-core peak of a GPU by name (the MFU denominator, as
 * in the planner's presets); TRIDENT_PEAK_TFLOPS overrides; 0 = unknown. */
static double device_peak_flops(const char *name)
{
    const char *env = getenv("TRIDENT_PEAK_TFLOPS");
    if (env && *env)
        return 1e12 * atof(env);
    static const struct { const char *key; double tflops; } known[] = {
        {"H200", 989.0}, {"H100", 989.0}, {"A100", 312.0}, {"RTX 3090", 71.0}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strstr(name, known[i].key))
            return 1e12 * known[i].tflops;
    return 0;
}

/* A run never destroys an earlier run's results: a fresh run (not resumed
 * from a checkpoint) into a run.dir whose metrics.jsonl already holds
 * records is refused before anything is written.  Rank 0 looks, all agree. */
static void check_run_dir(const Trainer *tr, int resumed, Comm *world)
{
    const Config *cfg = tr->cfg;
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
                   "earlier attempt's metrics are kept in %s\n", atoi(restart), kept);
            taken = 0;
        }
    }
    comm_allreduce_max_i32(world, &taken, 1);
    if (!taken)
        return;
    char hint[3 * CFG_STR];
    snprintf(hint, sizeof hint, "give this run a directory of its own (--set run.dir=%s-2); "
             "or continue that run from its checkpoint (--set checkpoint.resume=STEP_DIR, or "
             "checkpoint.resume: auto with the checkpoint.dir it saved to); or delete %s to "
             "start over", cfg->run.dir, path);
    refuse(world->rank, hint, "run.dir %s holds the metrics of an earlier run, and this run "
           "starts fresh (no checkpoint to resume from in %s): it would overwrite them",
           cfg->run.dir, cfg->checkpoint.dir[0] ? cfg->checkpoint.dir : "checkpoint.dir (unset)");
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
    else if (ck->every > 0)
        printf(" | checkpoints: %s every %d steps and at the end, newest %d kept\n", ck->dir,
               ck->every, ck->keep);
    else
        printf(" | checkpoints: %s at the end\n", ck->dir);
    fflush(stdout);
}

/* Training, or with eval != NULL the validation pass only (train_evaluate):
 * nothing under run.dir is locked or written then, and no step runs. */
static int train(const Config *cfg, Comm world, EvalResult *eval)
{
    /* bf16: GEMMs multiply bf16 operands with fp32 sums (backend.h); the
     * weights are bf16 values with fp32 masters (zero/optimizer.h). */
    const int bf16 = cfg->training.precision == PREC_BF16;
    Trainer tr = {.cfg = cfg, .be = bf16 ? backend_cpu_bf16() : backend_cpu()};
    preempt_install(); /* SIGUSR1/SIGTERM/SIGINT: stop at an agreed step, checkpointed */
    if (cfg->backend == BACKEND_CUDA) {
#ifndef TRD_HAVE_CUDA
        refuse(world.rank, "set backend: cpu, or rebuild with -Dcuda=enabled (docs/cuda.md)",
               "backend cuda: this trident was built without the CUDA backend");
#else
        tr.be = bf16 ? backend_cuda_bf16() : backend_cuda();
#endif
    }
    if (cfg->topology.pp > 1 && cfg->topology.zero == 3)
        refuse(world.rank, "use topology.zero 0, 1 or 2 with pipeline parallelism",
                  "topology.zero 3 with topology.pp %d: ZeRO-3 re-gathers every layer for every "
                  "micro-batch, which pipelining multiplies; like Megatron-LM, trident refuses it",
                  cfg->topology.pp);
    if (cfg->topology.pp == 1 && cfg->topology.virtual_stages > 1)
        refuse(world.rank, "set topology.virtual_stages: 1, or use topology.pp >= 2",
               "topology.virtual_stages %d with topology.pp 1: interleaving splits each "
               "pipeline rank's layers into chunks, and there is no pipeline",
               cfg->topology.virtual_stages);
    if (cfg->topology.pp > 1 && cfg->topology.zero == 2 && cfg->model.tie_embeddings)
        refuse(world.rank, "use topology.zero 1, or model.tie_embeddings: false",
                  "topology.zero 2 with topology.pp > 1 and tied embeddings: the embedding "
                  "gradient must be summed over the first and last stage before it is sharded, "
                  "which ZeRO-2's per-micro-batch reduction does not allow");
    topology_init(&tr.topo, &tr.comms, cfg, world);
    set_threads(world);
    use_device(&tr);
    const int rank0 = tr.topo.rank == 0;
    tr.dp = tr.comms.dp.size;
    tr.dp_rank = tr.comms.dp.rank;
    tr.n_micro = cfg->training.global_batch / (cfg->training.micro_batch * tr.dp);

    open_data(&tr, &world);
    memcheck(cfg, tr.topo.ranks_per_node,
             tr.be->device ? tr.device_memory : memcheck_host_budget(tr.topo.ranks_per_node),
             &world);
    const int async = !eval && async_decide(&tr, &world);
    if (!eval)
        runlock_claim(cfg, &world); /* inputs are good: create, probe and lock the output dirs */

    ParamShard shard = pipe_shard(cfg, tr.comms.pp.rank, tr.comms.tp.size, tr.comms.tp.rank);
    tr.zero = zero_create(cfg, tr.be, &shard, &tr.comms.dp);
    for (int c = 0; c < zero_chunks(tr.zero); c++)
        model_set_tensor_parallel(zero_chunk_model(tr.zero, c), &tr.comms.tp);
    start_trace(&tr);
    if (tr.comms.pp.size > 1) {
        char err[CFG_ERR];
        tr.pipe = pipe_create(cfg, tr.zero, &tr.comms.pp, tr.n_micro, err);
        if (!tr.pipe)
            refuse(world.rank, NULL, "%s", err);
        tr.tied_embed_group = cfg->model.tie_embeddings && tr.comms.embed.size > 1;
        if (tr.tied_embed_group)
            zero_defer_outer(tr.zero);
    }
    ckpt_setup(&tr);
    const int resumed = ckpt_resume(&tr);
    ckpt_init_from(&tr, resumed);
    if (async)
        tr.async = ckpt_async_create(&tr.ckpt, !tr.be->device);
    if (!eval)
        check_run_dir(&tr, resumed, &world);
    const size_t BT = (size_t)cfg->training.micro_batch * (size_t)cfg->model.seq_len;
    tr.tokens = trd_malloc((size_t)tr.n_micro * BT * sizeof(int32_t), "token batches");
    tr.targets = trd_malloc((size_t)tr.n_micro * BT * sizeof(int32_t), "target batches");
    int exit_code = TRD_EXIT_OK;
    if (eval) {
        eval->loss = validate(&tr, &eval->tokens);
        goto teardown;
    }

    /* Every rank probes, so they share the machine the same way as in
     * training; rank 0's figure is the one reported. */
    const double peak = (tr.be->device ? device_peak_flops(tr.device)
                                       : train_cpu_peak_flops()) * world.size;
    const double flops_per_token = model_flops_per_token(&cfg->model);
    const long long tokens_per_step = (long long)cfg->training.global_batch * cfg->model.seq_len;

    Metrics metrics = {0};
    TbWriter tb = {0};
    char memory[2048];
    if (rank0) {
        mkdir_p(cfg->run.dir);
        char path[CFG_STR + 32], err[CFG_ERR];
        snprintf(path, sizeof path, "%s/config.yaml", cfg->run.dir);
        if (config_write_yaml(cfg, path, err) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, "check that run.dir is writable", "%s", err);
        print_start(&tr, peak / world.size);
        print_outputs(cfg);
        metrics_open(&metrics, cfg->run.dir, cfg->training.steps, cfg->run.log_every, resumed);
        if (cfg->run.tensorboard) /* a new events file per run, resumed too */
            tb_open(&tb, cfg->run.dir);
    }
    memory_json(&tr, memory, sizeof memory);
    Tokenizer *sample_tok = NULL;
    if (rank0 && cfg->training.sample_every > 0) {
        char err[CFG_ERR];
        sample_tok = data_tokenizer_named(cfg->model.vocab == 257 ? "byte" : "gpt2", err);
        if (!sample_tok)
            trd_fatal(TRD_EXIT_INPUT, "fetch the GPT-2 vocabulary (scripts/get_corpus.sh), or "
                      "set training.sample_every: 0", "training.sample_every: %s", err);
    }
    const double t_loop = now_s();
    watchdog_start(cfg->training.hang_timeout, world.rank, world.size, cfg->run.dir,
                   cfg->training.trace);
    for (int step = tr.start_step; step < cfg->training.steps; step++) {
        straggler_begin();
        double t0 = now_s(), grad_norm;
        float lr;
        double loss = train_step(&tr, step, &grad_norm, &lr);
        double dt = now_s() - t0;
        straggler_end(&world, step + 1, dt, cfg->run.log_every, cfg->training.straggler_threshold);
        ZeroStats zs = zero_take_stats(tr.zero);

        StepMetrics s = {.step = step + 1, .loss = loss, .lr = lr, .grad_norm = grad_norm,
                         .tokens = (long long)(step + 1) * tokens_per_step,
                         .step_ms = 1e3 * dt, .tokens_per_s = (double)tokens_per_step / dt,
                         .mfu = peak > 0 ? flops_per_token * (double)tokens_per_step / dt / peak : 0,
                         .comm_ms = 1e3 * zs.exposed_comm_s, .comm_bytes = zs.bytes,
                         .pp_idle = tr.pipe ? pp_exec_idle_fraction(pipe_stats(tr.pipe),
                                                                    &tr.comms.pp) : -1,
                         .val_loss = -1, .extra = step == tr.start_step ? memory : NULL};
        int last = step + 1 == cfg->training.steps;
        int every = cfg->data.val_every > 0 && (step + 1) % cfg->data.val_every == 0;
        if (tr.has_val && (last || every))
            s.val_loss = validate(&tr, NULL);
        /* The ETA extrapolates this run's mean step time (validation included). */
        s.elapsed_s = now_s() - t_loop;
        s.eta_s = s.elapsed_s / (step + 1 - tr.start_step) * (cfg->training.steps - step - 1);
        if (step == tr.start_step)
            tr.staged_first = comm_staging().allocations;
        if (rank0) {
            metrics_record(&metrics, &s);
            tb_record(&tb, &s);
            if (step == tr.start_step)
                tb_memory(&tb, &tr, step + 1);
        }
        if (sample_tok && (step + 1) % cfg->training.sample_every == 0)
            print_sample(&tr, sample_tok, step + 1);
        const CheckpointConfig *ck = &cfg->checkpoint;
        const int saved = ck->dir[0] && (last || (ck->every > 0 && (step + 1) % ck->every == 0));
        if (saved)
            ckpt_save_step(&tr, &world, step + 1, last);
        else
            async_finish(&tr, &world, 0); /* a finished background write: report it */
        /* A signal reaches the ranks at different moments; the all-reduced
         * flag makes them all stop after this same step (src/train/preempt.h). */
        if (!last && preempt_agree(&world)) {
            if (ck->dir[0] && !saved)
                ckpt_save_step(&tr, &world, step + 1, 1);
            async_finish(&tr, &world, 1); /* the write in flight ends before the job */
            if (rank0)
                printf("preempted: a rank got a signal (SIGUSR1/SIGTERM/SIGINT); stopped after step %d "
                       "of %d, %s; exit %d\n", step + 1, cfg->training.steps,
                       ck->dir[0] ? "checkpoint saved" : "no checkpoint.dir, nothing saved",
                       TRD_EXIT_PREEMPTED);
            exit_code = TRD_EXIT_PREEMPTED;
            break;
        }
    }
    report_device_memory(&tr);
    dump_weights(&tr);
    finish_trace(&tr);
    watchdog_stop();
    if (sample_tok)
        tokenizer_free(sample_tok);
    if (rank0) {
        metrics_close(&metrics);
        tb_close(&tb);
        runlock_release();
    }

teardown:
    ckpt_async_free(tr.async);
    free(tr.tokens);
    free(tr.targets);
    ckpt_teardown(&tr);
    pipe_free(tr.pipe);
    zero_free(tr.zero);
    dataset_close(&tr.train_data);
    if (tr.has_val)
        dataset_close(&tr.val_data);
    topology_comms_free(&tr.comms);
    return exit_code;
}

int train_main(int argc, char **argv)
{
    Args a;
    if (parse_args(argc, argv, &a, 0, usage_train))
        return TRD_EXIT_OK;
    comm_init(&argc, &argv);
    Comm world = comm_world();
    Config cfg;
    load_config(&cfg, &a, world.size, world.rank);
    int rc = train(&cfg, world, NULL);
    comm_finalize();
    return rc;
}

EvalResult train_evaluate(const Config *cfg, Comm world)
{
    EvalResult r = {0};
    train(cfg, world, &r);
    return r;
}

int run_main(int argc, char **argv)
{
    Args a;
    if (parse_args(argc, argv, &a, 1, usage_run))
        return TRD_EXIT_OK;
    Config cfg;
    load_config(&cfg, &a, 0, 0);
    int world = a.world_override;
    if (!world) {
        if (cfg.topology.dp == 0)
            trd_fatal(TRD_EXIT_INPUT, "pass -n WORLD or set topology.dp to a number",
                      "topology.dp is auto, so the world size is unknown");
        world = cfg.topology.tp * cfg.topology.pp * cfg.topology.dp;
    }
    /* The world-dependent rules too, before anything is launched: a bad
     * layout is one message and exit 2, not one per rank. */
    load_config(&cfg, &a, world, 0);
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot find the trident binary: %s", strerror(errno));
    self[len] = '\0';

    char n[16];
    snprintf(n, sizeof n, "%d", world);
    char *args[8 + 2 * MAX_SETS];
    int k = 0;
    args[k++] = "mpiexec";
    args[k++] = "-n";
    args[k++] = n;
    args[k++] = self;
    args[k++] = "train";
    args[k++] = (char *)a.config_path;
    for (int i = 0; i < a.n_sets; i++) {
        args[k++] = "--set";
        args[k++] = (char *)a.sets[i];
    }
    args[k] = NULL;
    printf("trident run: mpiexec -n %s %s train %s ...\n", n, self, a.config_path);
    return launch_wait(args, "install MPICH (apt-get install mpich)");
}
