/* bench_tp — communication of tensor (and sequence) parallelism per
 * transformer layer, measured against theory.
 *
 * Run under `mpiexec -n TP`: the world is one TP group.  Every rank builds
 * its TP shard of the model, runs one forward+backward as warm-up, then
 * measures forward+backward part by part (embedding, each block, head) by
 * reading the TP communicator's counters (src/comm: calls, and bytes sent
 * per rank under ring algorithms) between the parts.  The blocks' share is
 * divided by the number of layers.
 *
 * Theory, n = b*s*h elements, p = tp, per layer:
 *   without SP  forward 2 all-reduces, backward 2 all-reduces
 *   with SP     forward 2 all-gathers + 2 reduce-scatters, backward the same
 * A ring all-reduce of n sends 2n(p-1)/p per rank, an all-gather or a
 * reduce-scatter of the whole n sends n(p-1)/p: the same volume either way.
 * The embedding and head own one such boundary each (see docs/tensor_parallel.md).
 *
 * Every collective the code issues beyond those boundaries is listed as an
 * "extra" with its reason (norm-weight gradients under SP, the position
 * embedding's gradient, the cross-entropy's statistics); the measurement
 * must equal theory + extras exactly, or the row says DIFFERS and the
 * program exits 1.  All-reduces on the kv-sharing sub-communicator
 * (replicated kv heads, tp > kv_heads) are not on the TP communicator: they
 * are counted here through the MPI profiling interface (PMPI).
 *
 *   mpiexec -n TP bench_tp [--set key=value ...] [--reps R] [--header]
 * Defaults: GPT-2 shapes, layers 4, hidden 256, heads 8, seq 64, batch 4,
 * vocab 50257; recompute none (--set training.recompute=full reruns part of
 * the forward's collectives inside backward: listed as an extra). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comm/comm_mpi.h"
#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"

/* ---- all-reduces off the TP communicator (PMPI) --------------------------- */

static MPI_Comm g_tp_mpi = MPI_COMM_NULL;
static uint64_t g_kv_calls, g_kv_bytes;

/* Linked before libmpich, this definition receives every MPI_Allreduce of
 * the program (the profiling interface); the real one is PMPI_Allreduce.
 * Those on a communicator other than the TP group's are the kv group's;
 * their bytes are counted as src/comm counts an all-reduce: 2n(p-1)/p. */
int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm)
{
    if (g_tp_mpi != MPI_COMM_NULL && comm != g_tp_mpi) {
        int p = 1, elem = 0;
        PMPI_Comm_size(comm, &p);
        PMPI_Type_size(datatype, &elem);
        g_kv_calls++;
        g_kv_bytes += 2 * (uint64_t)count * (uint64_t)elem * (uint64_t)(p - 1) / (uint64_t)p;
    }
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

/* ---- counters ------------------------------------------------------------- */

typedef struct {
    uint64_t calls, bytes;       /* on the TP communicator */
    uint64_t kv_calls, kv_bytes; /* on the kv-sharing sub-communicator */
    double secs;
} Counts;

enum { EMBED_F, LAYERS_F, HEAD_F, HEAD_B, LAYERS_B, EMBED_B, NPARTS };
static const char *const part_name[NPARTS] = {"embed fwd", "layer fwd", "head fwd",
                                              "head bwd",  "layer bwd", "embed bwd"};

/* Reads the counters and the clock; each mark() charges what happened since
 * the previous one to a part. */
typedef struct {
    const Comm *tp;
    Counts last;
    Counts part[NPARTS];
} Meter;

static Counts now_counts(const Comm *tp)
{
    return (Counts){.calls = tp->calls,
                    .bytes = tp->bytes_sent,
                    .kv_calls = g_kv_calls,
                    .kv_bytes = g_kv_bytes,
                    .secs = MPI_Wtime()};
}

static void mark(Meter *mt, int part)
{
    Counts c = now_counts(mt->tp);
    Counts *p = &mt->part[part];
    p->calls += c.calls - mt->last.calls;
    p->bytes += c.bytes - mt->last.bytes;
    p->kv_calls += c.kv_calls - mt->last.kv_calls;
    p->kv_bytes += c.kv_bytes - mt->last.kv_bytes;
    p->secs += c.secs - mt->last.secs;
    mt->last = c;
}

/* One forward+backward, part by part. */
static void measured_step(Model *m, Comm *tp, const int32_t *tok, const int32_t *tgt, int L,
                          Counts out[NPARTS])
{
    Meter mt = {.tp = tp};
    model_zero_grad(m);
    comm_barrier(tp); /* all ranks start together: times are not skewed by stragglers */
    mt.last = now_counts(tp);
    model_embed_forward(m, tok);
    mark(&mt, EMBED_F);
    for (int l = 0; l < L; l++)
        model_block_forward(m, l);
    mark(&mt, LAYERS_F);
    model_head_forward(m, tgt);
    mark(&mt, HEAD_F);
    model_head_backward(m, 1.0f);
    mark(&mt, HEAD_B);
    for (int l = L - 1; l >= 0; l--)
        model_block_backward(m, l);
    mark(&mt, LAYERS_B);
    model_embed_backward(m);
    mark(&mt, EMBED_B);
    memcpy(out, mt.part, sizeof mt.part);
}

/* ---- theory ---------------------------------------------------------------- */

/* Expected traffic of one part: the b*s*h boundary collectives (theory)
 * and the smaller ones the code adds (extras), in calls and elements sent
 * per rank; kv: all-reduces on the kv-sharing group. */
typedef struct {
    double calls, elems;
    double x_calls, x_elems;
    double kv_calls, kv_elems;
    char note[160];
} Expect;

static double ar(double n, int p) { return 2.0 * n * (p - 1) / p; } /* ring all-reduce */
static double half(double n, int p) { return n * (p - 1) / p; }     /* AG or RS of whole n */

static void add_note(Expect *e, const char *what)
{
    size_t k = strlen(e->note);
    snprintf(e->note + k, sizeof e->note - k, "%s%s", k ? "; " : "", what);
}

static Expect expect_part(int part, const Config *cfg, int B)
{
    const ModelConfig *mc = &cfg->model;
    const int p = cfg->topology.tp, sp = cfg->topology.sequence_parallel;
    const double N = (double)B * mc->seq_len, C = mc->hidden, n = N * C;
    const int gpt2 = mc->arch == ARCH_GPT2;
    const int kv_share = mc->kv_heads % p ? p / mc->kv_heads : 1;
    const double hs = (double)mc->hidden / mc->heads;
    Expect e = {0};
    if (p == 1)
        return e; /* one rank: no collective at all */
    /* One boundary collective of b*s*h: all-reduce without SP, an
     * all-gather or reduce-scatter with it. */
    const double one = sp ? half(n, p) : ar(n, p);
    switch (part) {
    case LAYERS_F: /* two row-parallel outputs (and, with SP, two norm gathers) */
        e.calls = sp ? 4 : 2;
        e.elems = sp ? 4 * half(n, p) : 2 * ar(n, p);
        break;
    case LAYERS_B: /* two column-parallel inputs (and, with SP, two gradient gathers) */
        e.calls = sp ? 4 : 2;
        e.elems = sp ? 4 * half(n, p) : 2 * ar(n, p);
        if (sp) { /* each norm's weight (and bias) gradient is partial: own rows */
            e.x_calls = gpt2 ? 4 : 2;
            e.x_elems = e.x_calls * ar(C, p);
            add_note(&e, gpt2 ? "+4 AR[h] ln1/ln2 weight+bias grads (SP)"
                              : "+2 AR[h] ln1/ln2 weight grads (SP)");
        }
        if (cfg->training.recompute == RECOMPUTE_FULL) {
            /* The layer's forward reruns without its last projection: the
             * attention projection's output again, and under SP both norm
             * gathers. */
            e.x_calls += sp ? 3 : 1;
            e.x_elems += sp ? 3 * half(n, p) : ar(n, p);
            add_note(&e, sp ? "+2 AG +1 RS[b*s*h] full recompute" : "+1 AR[b*s*h] full recompute");
        }
        if (kv_share > 1) { /* replicated kv rows: partial gradient per rank */
            e.kv_calls = gpt2 ? 2 : 1;
            e.kv_elems = ar(2 * hs * C, kv_share) + (gpt2 ? ar(2 * hs, kv_share) : 0);
            add_note(&e, "kv-group AR of the replicated k,v rows' grads");
        }
        break;
    case EMBED_F: /* vocabulary-parallel lookup: a row-parallel output */
        e.calls = 1;
        e.elems = one;
        break;
    case EMBED_B:
        e.calls = sp ? 1 : 0; /* SP: the stream gradient gathered; else identity */
        e.elems = sp ? half(n, p) : 0;
        if (gpt2) { /* wpe rows get gradient only from tokens this rank's vocabulary holds */
            e.x_calls = 1;
            e.x_elems = ar((double)mc->seq_len * C, p);
            add_note(&e, "+1 AR[s*h] wpe grad");
        }
        break;
    case HEAD_F: /* column-parallel head: its input gathered under SP */
        e.calls = sp ? 1 : 0;
        e.elems = sp ? half(n, p) : 0;
        e.x_calls = 2;
        e.x_elems = ar(N, p) + ar(2 * N, p);
        add_note(&e, "+2 AR cross-entropy: max[b*s], sum-exp+target[2b*s]");
        break;
    case HEAD_B:
        e.calls = 1;
        e.elems = one;
        if (sp) {
            e.x_calls = gpt2 ? 2 : 1;
            e.x_elems = e.x_calls * ar(C, p);
            add_note(&e, gpt2 ? "+2 AR[h] final norm weight+bias grads (SP)"
                              : "+1 AR[h] final norm weight grad (SP)");
        }
        break;
    }
    return e;
}

/* ---- report ---------------------------------------------------------------- */

static void print_header(void)
{
    printf("%-5s %2s %-3s %-9s %13s %21s %7s %9s  %s\n", "arch", "tp", "sp", "part", "calls (thy)",
           "elements/rank (thy)", "ratio", "ms", "check; extras beyond theory");
}

/* One row; per layer for the layer parts.  Returns 1 when the measurement
 * is not theory + extras. */
static int print_row(const Config *cfg, int part, const Counts *c, double secs, int B)
{
    const int p = cfg->topology.tp, sp = cfg->topology.sequence_parallel;
    const int layer = part == LAYERS_F || part == LAYERS_B;
    const double div = layer ? cfg->model.layers : 1;
    const Expect e = expect_part(part, cfg, B);
    const double calls = (double)c->calls / div, elems = (double)c->bytes / sizeof(float) / div;
    const double kv_calls = (double)c->kv_calls / div;
    const double kv_elems = (double)c->kv_bytes / sizeof(float) / div;
    const int ok = fabs(calls - (e.calls + e.x_calls)) < 1e-9 &&
                   fabs(elems - (e.elems + e.x_elems)) <= 1e-6 * (e.elems + e.x_elems) + 0.5 &&
                   fabs(kv_calls - e.kv_calls) < 1e-9 &&
                   fabs(kv_elems - e.kv_elems) <= 1e-6 * e.kv_elems + 0.5;
    char thy_calls[32], ratio[16];
    snprintf(thy_calls, sizeof thy_calls, "%g (%g)", calls, e.calls);
    if (e.elems > 0)
        snprintf(ratio, sizeof ratio, "%.4f", elems / e.elems);
    else
        snprintf(ratio, sizeof ratio, "-");
    char elem_s[48];
    snprintf(elem_s, sizeof elem_s, "%.0f (%.0f)", elems, e.elems);
    printf("%-5s %2d %-3s %-9s %13s %21s %7s %9.2f  %s%s%s", config_arch_name(cfg->model.arch), p,
           sp ? "on" : "off", part_name[part], thy_calls, elem_s, ratio, 1e3 * secs / div,
           ok ? "exact" : "DIFFERS", e.note[0] ? "; " : "", e.note);
    if (c->kv_calls)
        printf(" (measured %g calls, %.0f elements/rank)", kv_calls, kv_elems);
    printf("\n");
    return !ok;
}

/* ---- main ------------------------------------------------------------------ */

static void usage_fatal(const char *arg)
{
    trd_fatal(TRD_EXIT_INPUT,
              "usage: mpiexec -n TP bench_tp [--set key=value ...] "
              "[--reps R] [--header]",
              "bench_tp: unknown or incomplete option '%s'", arg);
}

/* Defaults, then the command line; tp is the world size. */
static void parse_args(Config *cfg, int argc, char **argv, int world, int *reps, int *header)
{
    config_defaults(cfg);
    const char *defaults[] = {
        "model.arch=gpt2",        "model.layers=4",          "model.hidden=256",
        "model.heads=8",          "model.seq_len=64",        "model.vocab=50257",
        "training.micro_batch=4", "training.global_batch=4", "training.recompute=none",
        "training.steps=1",       "training.lr=3e-4"};
    char err[CFG_ERR];
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (config_set(cfg, defaults[i], err))
            trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    snprintf(cfg->data.path, sizeof cfg->data.path, "unused");
    *reps = 3;
    *header = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--header")) {
            *header = 1;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            *reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (config_set(cfg, argv[++i], err))
                trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
        } else {
            usage_fatal(argv[i]);
        }
    }
    if (*reps < 1)
        trd_fatal(TRD_EXIT_INPUT, "use --reps 1 or more", "bench_tp: --reps %d", *reps);
    cfg->topology.tp = world; /* the whole world is the TP group */
    if (config_validate(cfg, world, err))
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
}

int main(int argc, char **argv)
{
    comm_init(&argc, &argv);
    Comm tp = comm_world();
    Config cfg;
    int reps, header;
    parse_args(&cfg, argc, argv, tp.size, &reps, &header);

    const int B = cfg.training.micro_batch, N = B * cfg.model.seq_len, L = cfg.model.layers;
    ParamShard sh = params_full_shard(&cfg.model);
    sh.tp = tp.size;
    sh.tp_rank = tp.rank;
    Model *m = model_create(&cfg, backend_cpu(), &sh, B);
    model_set_tensor_parallel(m, &tp);
    g_tp_mpi = comm_mpi(&tp);

    /* The same tokens on every TP rank (a TP group shares its micro-batch). */
    int32_t *tok = trd_malloc(2 * (size_t)N * sizeof(int32_t), "tokens");
    int32_t *tgt = tok + N;
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)(rng_u64(1, (uint64_t)i) % (uint64_t)cfg.model.vocab);
        tgt[i] = (int32_t)(rng_u64(2, (uint64_t)i) % (uint64_t)cfg.model.vocab);
    }

    /* Warm-up through the whole-model calls; their traffic must equal the
     * sum of the parts measured below (nothing is missed between parts). */
    Counts w0 = now_counts(&tp);
    model_zero_grad(m);
    model_forward(m, tok, tgt);
    model_backward(m, 1.0f);
    Counts w1 = now_counts(&tp);

    Counts first[NPARTS], run[NPARTS];
    double secs[NPARTS] = {0};
    int bad = 0;
    for (int r = 0; r < reps; r++) {
        measured_step(m, &tp, tok, tgt, L, run);
        if (r == 0)
            memcpy(first, run, sizeof run);
        for (int k = 0; k < NPARTS; k++) {
            secs[k] += run[k].secs / reps;
            bad |= run[k].calls != first[k].calls || run[k].bytes != first[k].bytes;
        }
    }
    uint64_t calls = 0, bytes = 0;
    for (int k = 0; k < NPARTS; k++) {
        calls += first[k].calls;
        bytes += first[k].bytes;
    }
    bad |= calls != w1.calls - w0.calls || bytes != w1.bytes - w0.bytes;
    g_tp_mpi = MPI_COMM_NULL; /* stop counting: the time reduction below is ours */
    /* The slowest rank's time is the step's. */
    PMPI_Allreduce(MPI_IN_PLACE, secs, NPARTS, MPI_DOUBLE, MPI_MAX, comm_mpi(&tp));

    if (tp.rank == 0) {
        if (header)
            print_header();
        static const int order[NPARTS] = {LAYERS_F, LAYERS_B, EMBED_F, EMBED_B, HEAD_F, HEAD_B};
        for (int k = 0; k < NPARTS; k++)
            bad |= print_row(&cfg, order[k], &first[order[k]], secs[order[k]], B);
        if (bad)
            printf("bench_tp: the measurement is not theory + the listed extras, or differs "
                   "between repetitions or from the whole-model step\n");
        fflush(stdout);
    }
    int any = bad;
    PMPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, comm_mpi(&tp));
    free(tok);
    model_free(m);
    comm_finalize();
    return any ? 1 : 0;
}
