/* test_pp_exec.c — the pipeline executor on real ranks against a sequential
 * run of the same toy model.
 *
 * The toy: global stage k maps a vector elementwise, y = w_k * x + b_k; stage
 * 0 reads a per-micro-batch input, the last stage's loss is sum(y * t_mb).
 * Backward accumulates dL/dw_k, dL/db_k over micro-batches and passes dL/dx
 * upstream.  Every message carries one extra float naming (mb, sending
 * stage), which the receiver checks; each chunk keeps pp_schedule_slots
 * slots and asserts that a slot is free when it is claimed.
 *
 * With 4 ranks: pp 4, pp 3 (ranks 0-2), pp 2 (two groups), pp 1 (four), each
 * with 1F1B, GPipe and interleaved (v 2) for several micro-batch counts;
 * large messages with one out buffer per chunk and gradients written over
 * the inputs (the executor must complete sends before the buffers are
 * rewritten); and the measured idle share against the bubble formula, with
 * compute that sleeps.
 *
 * Run as a plain unit test (one process), it re-executes itself under
 * `mpiexec -n 4` and exits with mpiexec's status. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "mpi_test.h"
#include "core/error.h"
#include "pipeline_par/executor.h"

#define WORLD 4

/* ---- the toy model: values, and the math shared by both runs ---- */

static float input_val(int mb, int i) { return (float)((mb * 131 + i * 17) % 97) / 48.5f - 1.0f; }
static float target_val(int mb, int i) { return (float)((mb * 29 + i * 7) % 31) / 15.5f - 1.0f; }
static float w_val(int g, int i) { return 0.75f + (float)((g * 7 + i * 3) % 11) / 20.0f; }
static float b_val(int g, int i) { return (float)((g * 5 + i) % 13) / 26.0f - 0.25f; }
/* The identity float at the end of a message: who sent it, for which mb. */
static float ident(int mb, int stage) { return (float)(mb * 64 + stage); }

static void stage_fwd(const float *w, const float *b, const float *x, float *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = w[i] * x[i] + b[i];
}

static double stage_loss(const float *y, int mb, int n)
{
    double l = 0;
    for (int i = 0; i < n; i++)
        l += (double)(y[i] * target_val(mb, i));
    return l;
}

/* gy is the gradient of y.  dx may alias x: x[i] is read before dx[i] is
 * written. */
static void stage_bwd(const float *w, const float *x, const float *gy, float *dw, float *db,
                      float *dx, int n)
{
    for (int i = 0; i < n; i++) {
        float xi = x[i], g = gy[i];
        dw[i] += g * xi;
        db[i] += g;
        if (dx)
            dx[i] = g * w[i];
    }
}

/* Sequential reference: dw, db [G][n], the loss summed over mb 0..m-1. */
static double reference(int G, int m, int n, float *dw, float *db)
{
    float *w = malloc(sizeof(float) * (size_t)G * n), *b = malloc(sizeof(float) * (size_t)G * n);
    float *xs = malloc(sizeof(float) * (size_t)(G + 1) * n), *g = malloc(sizeof(float) * n);
    for (int k = 0; k < G; k++)
        for (int i = 0; i < n; i++) {
            w[k * n + i] = w_val(k, i);
            b[k * n + i] = b_val(k, i);
        }
    memset(dw, 0, sizeof(float) * (size_t)G * n);
    memset(db, 0, sizeof(float) * (size_t)G * n);
    double loss = 0;
    for (int mb = 0; mb < m; mb++) {
        for (int i = 0; i < n; i++)
            xs[i] = input_val(mb, i);
        for (int k = 0; k < G; k++)
            stage_fwd(w + k * n, b + k * n, xs + k * n, xs + (k + 1) * n, n);
        loss += stage_loss(xs + G * n, mb, n);
        for (int i = 0; i < n; i++)
            g[i] = target_val(mb, i);
        for (int k = G - 1; k >= 0; k--)
            stage_bwd(w + k * n, xs + k * n, g, dw + k * n, db + k * n, k > 0 ? g : NULL, n);
    }
    free(w);
    free(b);
    free(xs);
    free(g);
    return loss;
}

/* ---- the toy stage: this rank's chunks ---- */

typedef struct {
    int pp, rank, v, G, m, n, slots, out_slots;
    int alias; /* grad_out(mb, c) is act_in's slot of (mb, c): in place */
    long sleep_fwd_us, sleep_bwd_us;
    size_t msg;             /* n + 1 floats: values and the identity */
    float *w, *b, *dw, *db; /* [v][n] */
    float *x, *gin;         /* [v][slots][msg]: inputs kept for backward, received grads */
    float *y, *gout;        /* [v][out_slots][msg] */
    int *x_mb, *gin_mb;     /* [v][slots]: the mb a slot holds, -1 free */
    int fwds, bwds;
    double loss;
} Toy;

static int stage_of(const Toy *t, int c) { return c * t->pp + t->rank; }
static int slot(const Toy *t, int mb, int c) { return c * t->slots + mb % t->slots; }
static float *x_buf(Toy *t, int mb, int c) { return t->x + (size_t)slot(t, mb, c) * t->msg; }
static float *gin_buf(Toy *t, int mb, int c) { return t->gin + (size_t)slot(t, mb, c) * t->msg; }

static float *out_buf(Toy *t, float *base, int mb, int c)
{
    return base + (size_t)(c * t->out_slots + mb % t->out_slots) * t->msg;
}

static void nap(long us)
{
    if (us <= 0)
        return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

/* Claim a slot for mb: it must be free, or the slot count was too small. */
static void claim(int *holder, int mb, const char *what, int c)
{
    CHECK(*holder == -1, "%s slot of mb %d chunk %d still holds mb %d", what, mb, c, *holder);
    *holder = mb;
}

static float *toy_act_in(void *ctx, int mb, int c)
{
    Toy *t = ctx;
    claim(&t->x_mb[slot(t, mb, c)], mb, "activation", c);
    return x_buf(t, mb, c);
}

static float *toy_grad_in(void *ctx, int mb, int c)
{
    Toy *t = ctx;
    claim(&t->gin_mb[slot(t, mb, c)], mb, "gradient", c);
    return gin_buf(t, mb, c);
}

static float *toy_act_out(void *ctx, int mb, int c)
{
    Toy *t = ctx;
    return out_buf(t, t->y, mb, c);
}

static float *toy_grad_out(void *ctx, int mb, int c)
{
    Toy *t = ctx;
    return t->alias ? x_buf(t, mb, c) : out_buf(t, t->gout, mb, c);
}

static void toy_forward(void *ctx, int mb, int c)
{
    Toy *t = ctx;
    int g = stage_of(t, c), n = t->n;
    float *x = x_buf(t, mb, c);
    if (g == 0) {
        claim(&t->x_mb[slot(t, mb, c)], mb, "input", c);
        for (int i = 0; i < n; i++)
            x[i] = input_val(mb, i);
    } else {
        CHECK(t->x_mb[slot(t, mb, c)] == mb, "forward mb %d chunk %d: slot holds mb %d", mb, c,
              t->x_mb[slot(t, mb, c)]);
        CHECK(x[n] == ident(mb, g - 1), "stage %d got activation %g, want mb %d from stage %d", g,
              (double)x[n], mb, g - 1);
    }
    const float *w = t->w + (size_t)c * n, *b = t->b + (size_t)c * n;
    if (g == t->G - 1) {
        float *y = malloc(sizeof(float) * n);
        stage_fwd(w, b, x, y, n);
        t->loss += stage_loss(y, mb, n);
        free(y);
    } else {
        float *y = out_buf(t, t->y, mb, c);
        stage_fwd(w, b, x, y, n);
        y[n] = ident(mb, g);
    }
    t->fwds++;
    nap(t->sleep_fwd_us);
}

static void toy_backward(void *ctx, int mb, int c)
{
    Toy *t = ctx;
    int g = stage_of(t, c), n = t->n, s = slot(t, mb, c);
    float *x = x_buf(t, mb, c), *gy;
    CHECK(t->x_mb[s] == mb, "backward mb %d chunk %d: input slot holds mb %d", mb, c, t->x_mb[s]);
    float *tgt = NULL;
    if (g == t->G - 1) {
        gy = tgt = malloc(sizeof(float) * n);
        for (int i = 0; i < n; i++)
            tgt[i] = target_val(mb, i);
    } else {
        gy = gin_buf(t, mb, c);
        CHECK(t->gin_mb[s] == mb, "backward mb %d chunk %d: gradient slot holds mb %d", mb, c,
              t->gin_mb[s]);
        CHECK(gy[n] == ident(mb, g + 1), "stage %d got gradient %g, want mb %d from stage %d", g,
              (double)gy[n], mb, g + 1);
        t->gin_mb[s] = -1;
    }
    float *dx = g > 0 ? toy_grad_out(t, mb, c) : NULL;
    stage_bwd(t->w + (size_t)c * n, x, gy, t->dw + (size_t)c * n, t->db + (size_t)c * n, dx, n);
    if (dx)
        dx[n] = ident(mb, g);
    t->x_mb[s] = -1;
    free(tgt);
    t->bwds++;
    nap(t->sleep_bwd_us);
}

static void toy_init(Toy *t, int pp, int rank, int v, int m, int n, int slots, int out_slots)
{
    *t = (Toy){.pp = pp,
               .rank = rank,
               .v = v,
               .G = pp * v,
               .m = m,
               .n = n,
               .slots = slots,
               .out_slots = out_slots,
               .msg = (size_t)n + 1};
    size_t vn = (size_t)v * n;
    t->w = trd_malloc(4 * vn * sizeof(float), "toy params");
    t->b = t->w + vn;
    t->dw = t->b + vn;
    t->db = t->dw + vn;
    memset(t->dw, 0, 2 * vn * sizeof(float));
    for (int c = 0; c < v; c++)
        for (int i = 0; i < n; i++) {
            t->w[c * n + i] = w_val(stage_of(t, c), i);
            t->b[c * n + i] = b_val(stage_of(t, c), i);
        }
    size_t in = (size_t)v * slots * t->msg, out = (size_t)v * out_slots * t->msg;
    t->x = trd_calloc(2 * in + 2 * out, sizeof(float), "toy buffers");
    t->gin = t->x + in;
    t->y = t->gin + in;
    t->gout = t->y + out;
    t->x_mb = trd_malloc(2 * (size_t)v * slots * sizeof(int), "toy slots");
    t->gin_mb = t->x_mb + v * slots;
    for (int i = 0; i < 2 * v * slots; i++)
        t->x_mb[i] = -1;
}

static void toy_free(Toy *t)
{
    free(t->w);
    free(t->x);
    free(t->x_mb);
}

static PpChunkOps toy_stage(Toy *t)
{
    return (PpChunkOps){.ctx = t,
                        .act_elems = t->msg,
                        .forward = toy_forward,
                        .backward = toy_backward,
                        .act_in = toy_act_in,
                        .act_out = toy_act_out,
                        .grad_in = toy_grad_in,
                        .grad_out = toy_grad_out};
}

/* ---- equivalence runs ---- */

typedef struct {
    int n;     /* floats per vector */
    int out1;  /* one act_out / grad_out buffer per chunk instead of slots */
    int alias; /* gradients written over the inputs */
} Variant;

static int exact(const float *a, const float *b, int n, double *maxdiff)
{
    *maxdiff = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > *maxdiff)
            *maxdiff = d;
    }
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* One (kind, m, v) on group pp; returns this rank's buffer_waits. */
static int run_case(Comm *pp, ScheduleKind kind, int v, int m, Variant var)
{
    char err[CFG_ERR], what[128];
    snprintf(what, sizeof what, "%s pp %d m %d v %d n %d%s%s (rank %d)", pp_schedule_name(kind),
             pp->size, m, v, var.n, var.out1 ? " one-out" : "", var.alias ? " alias" : "",
             pp->rank);
    PpSchedule s;
    int rc = pp_schedule_build(&s, kind, pp->size, pp->rank, m, v, err);
    CHECK(rc == 0, "%s: build: %s", what, err);
    if (rc)
        return 0;
    int slots = pp_schedule_slots(&s);
    CHECK(slots >= 1 && slots <= m, "%s: %d slots", what, slots);
    if (kind == SCHED_1F1B) {
        int want = pp->size - pp->rank < m ? pp->size - pp->rank : m;
        CHECK(slots == want, "%s: 1f1b slots %d, want min(pp - rank, m) = %d", what, slots, want);
    } else if (kind == SCHED_GPIPE) {
        CHECK(slots == m, "%s: gpipe slots %d, want m", what, slots);
    }
    if (slots < 1)
        slots = m;

    Toy t;
    toy_init(&t, pp->size, pp->rank, v, m, var.n, slots, var.out1 ? 1 : slots);
    t.alias = var.alias;
    PpChunkOps st = toy_stage(&t);
    PpSpan spans[128];
    PpExecStats stats = {.spans = spans, .span_cap = 128};
    rc = pp_execute(&s, &st, pp, &stats, err);
    CHECK(rc == 0, "%s: execute: %s", what, err);
    CHECK(t.fwds == m * v && t.bwds == m * v, "%s: %d forwards %d backwards", what, t.fwds, t.bwds);
    CHECK(stats.n_spans == (s.n < 128 ? s.n : 128), "%s: %d spans for %d instructions", what,
          stats.n_spans, s.n);
    for (int i = 0; i < stats.n_spans; i++) {
        CHECK(spans[i].op == s.ins[i].op && spans[i].mb == s.ins[i].mb &&
                  spans[i].chunk == s.ins[i].chunk,
              "%s: span %d is not instruction %d", what, i, i);
        CHECK(spans[i].start <= spans[i].end && (i == 0 || spans[i - 1].end <= spans[i].start),
              "%s: span %d out of order", what, i);
    }
    for (int i = 0; i < 2 * v * slots; i++)
        CHECK(t.x_mb[i] == -1, "%s: slot %d still holds mb %d", what, i, t.x_mb[i]);

    int G = pp->size * v, n = var.n;
    float *dw = malloc(sizeof(float) * (size_t)G * n), *db = malloc(sizeof(float) * (size_t)G * n);
    double loss = reference(G, m, n, dw, db), d;
    for (int c = 0; c < v; c++) {
        int g = stage_of(&t, c);
        CHECK(exact(t.dw + (size_t)c * n, dw + (size_t)g * n, n, &d),
              "%s: dw of stage %d differs "
              "(max %.3g)",
              what, g, d);
        CHECK(exact(t.db + (size_t)c * n, db + (size_t)g * n, n, &d),
              "%s: db of stage %d differs "
              "(max %.3g)",
              what, g, d);
        if (g == G - 1)
            CHECK(t.loss == loss, "%s: loss %.17g, sequential %.17g", what, t.loss, loss);
    }
    free(dw);
    free(db);
    toy_free(&t);
    pp_schedule_free(&s);
    return stats.buffer_waits;
}

static void run_group(Comm *pp)
{
    static const ScheduleKind kinds[] = {SCHED_1F1B, SCHED_GPIPE, SCHED_INTERLEAVED};
    int p = pp->size, ms[] = {1, p - 1, p, 2 * p + 1};
    Variant small = {.n = 5};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++) {
            if (ms[j] < 1 || (j > 0 && ms[j] == ms[j - 1]))
                continue;
            run_case(pp, kinds[k], kinds[k] == SCHED_INTERLEAVED ? 2 : 1, ms[j], small);
        }
}

/* pp 4, 3, 2 (twice), 1 (four times) from the 4 world ranks. */
static void equivalence(Comm *world)
{
    static const int pps[] = {4, 3, 2, 1};
    for (int i = 0; i < 4; i++) {
        int p = pps[i];
        int color = p == 3 ? (world->rank < 3 ? 0 : -1) : world->rank / p;
        Comm g = comm_split(world, color, world->rank);
        if (g.size > 0)
            run_group(&g);
        comm_free(&g);
    }
}

/* Messages above the eager limit, one out buffer per chunk and gradients
 * written over the inputs: sends are still in flight when the next compute
 * wants the buffer, and only the executor's waits keep the data intact. */
static void tight_buffers(Comm *world)
{
    Variant tight = {.n = 1 << 16, .out1 = 1, .alias = 1};
    double waits = 0;
    for (int p = 4; p >= 2; p -= 2) {
        Comm g = comm_split(world, world->rank / p, world->rank);
        waits += run_case(&g, SCHED_1F1B, 1, 6, tight);
        waits += run_case(&g, SCHED_GPIPE, 1, 5, tight);
        comm_free(&g);
    }
    comm_allreduce_f64(world, &waits, 1);
    if (world->rank == 0)
        printf("pp_exec: large messages, one out buffer: %.0f computes or receives waited "
               "for a send on their buffer\n",
               waits);
    CHECK(waits > 0, "the one-buffer runs never found a buffer in flight: the test did not "
                     "exercise the executor's send waits");
}

/* ---- the bubble, measured ---- */

/* Start every rank at the same moment: a barrier alone lets ranks leave it
 * milliseconds apart on a loaded machine, which the first stage would count
 * as bubble.  All ranks share one clock here (one node). */
static void start_together(Comm *world)
{
    comm_barrier(world);
    double at = comm_wtime() + 0.02;
    comm_broadcast(world, &at, sizeof at, 0);
    double left = at - comm_wtime();
    if (left > 0)
        nap((long)(left * 1e6));
}

/* The idle share of each rank against (p - 1) / (v m + p - 1), from the
 * better of two steps (the least disturbed: smaller step time T).  The
 * compute sleeps, so the ranks do not compete for the cores, and the sleeps
 * are long (tens of ms), so that a late wake-up on a busy machine is small
 * beside them.  Such delays act as message latency, which the formula leaves
 * out: a replay of these lists with latency L per message gives, for 1F1B,
 * 0.273 / 0.290 / 0.306 at L = 0 / 1 / 2 ms (fwd 20, bwd 40 ms), and the
 * interleaved lists, whose short warm-up leaves no slack, 0.158 / 0.200 /
 * 0.238.  So 1F1B is held to the formula +- 0.05, interleaved only to lie
 * between its formula and 1F1B's (with the same margin). */
static void bubble(Comm *world, ScheduleKind kind, int v, int m, long fwd_us, long bwd_us)
{
    char err[CFG_ERR];
    PpSchedule s;
    CHECK(pp_schedule_build(&s, kind, world->size, world->rank, m, v, err) == 0, "%s", err);
    int slots = pp_schedule_slots(&s);
    double best_T = 1e30, best_idle = 0, best_busy = 0, best_wait = 0;
    for (int rep = 0; rep < 2; rep++) {
        Toy t;
        toy_init(&t, world->size, world->rank, v, m, 8, slots, slots);
        t.sleep_fwd_us = fwd_us / v;
        t.sleep_bwd_us = bwd_us / v;
        PpChunkOps st = toy_stage(&t);
        PpExecStats stats = {0};
        start_together(world);
        CHECK(pp_execute(&s, &st, world, &stats, err) == 0, "%s", err);
        double idle = pp_exec_idle_fraction(&stats, world), T = stats.elapsed_s;
        comm_allreduce_max_f64(world, &T, 1);
        if (T < best_T) {
            best_T = T;
            best_idle = idle;
            best_busy = stats.busy_s;
            best_wait = stats.wait_s;
        }
        toy_free(&t);
    }
    double want = pp_bubble_fraction(world->size, m, v);
    printf("pp_exec: %s pp %d m %d v %d, fwd %ld us bwd %ld us per rank: rank %d step %.1f ms, "
           "busy %.1f ms, blocked %.1f ms, idle %.4f, formula %.4f\n",
           pp_schedule_name(kind), world->size, m, v, fwd_us, bwd_us, world->rank, best_T * 1e3,
           best_busy * 1e3, best_wait * 1e3, best_idle, want);
    if (v == 1) {
        CHECK(fabs(best_idle - want) <= 0.05, "%s rank %d: measured idle %.4f, formula %.4f",
              pp_schedule_name(kind), world->rank, best_idle, want);
    } else {
        double plain = pp_bubble_fraction(world->size, m, 1);
        CHECK(best_idle >= want - 0.05 && best_idle <= plain + 0.05,
              "%s rank %d: measured idle %.4f, outside formula %.4f .. 1f1b's %.4f",
              pp_schedule_name(kind), world->rank, best_idle, want, plain);
    }
    pp_schedule_free(&s);
}

/* ---- contract checks that need no peers ---- */

static void errors(Comm *world)
{
    char err[CFG_ERR] = "";
    PpSchedule s;
    pp_schedule_build(&s, SCHED_1F1B, 2, 0, 3, 1, err);
    Toy t;
    toy_init(&t, 2, 0, 1, 3, 4, 2, 2);
    PpChunkOps st = toy_stage(&t);
    CHECK(pp_execute(&s, &st, world, NULL, err) == -1 && strstr(err, "group of 4"),
          "a schedule for pp 2 on a group of 4 must be refused: '%s'", err);
    /* Interleaved with pp 1 sends to itself, so it needs the buffers. */
    Comm one = comm_split(world, world->rank, 0);
    PpSchedule self;
    pp_schedule_build(&self, SCHED_INTERLEAVED, 1, 0, 2, 2, err);
    st.grad_in = NULL;
    err[0] = '\0';
    CHECK(pp_execute(&self, &st, &one, NULL, err) == -1 && strstr(err, "message buffers"),
          "a stage without grad_in must be refused: '%s'", err);
    pp_schedule_free(&self);
    comm_free(&one);

    /* A list whose backwards of a chunk are out of order has no slot rule. */
    for (int i = 0; i < s.n; i++)
        if (s.ins[i].op == PP_BWD) {
            s.ins[i].mb = 1;
            break;
        }
    CHECK(pp_schedule_slots(&s) == -1, "out-of-order backwards must give -1 slots");
    toy_free(&t);
    pp_schedule_free(&s);

    /* Interleaved slot counts, which the equivalence runs use, are printed
     * for the record; 1F1B and GPipe are checked there against their formulas. */
    if (world->rank == 0) {
        printf("pp_exec: interleaved pp 4 v 2 slots per chunk, m 8:");
        for (int r = 0; r < 4; r++) {
            pp_schedule_build(&s, SCHED_INTERLEAVED, 4, r, 8, 2, err);
            printf(" %d", pp_schedule_slots(&s));
            pp_schedule_free(&s);
        }
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    if (!mpi_test_child())
        return mpi_test_relaunch("pp_exec", 4);
    comm_init(&argc, &argv);
    alarm(60); /* a hung receive fails the test instead of stalling it */
    Comm world = comm_world();
    if (world.size != WORLD) {
        fprintf(stderr, "pp_exec: needs %d ranks, got %d\n", WORLD, world.size);
        comm_finalize();
        return 1;
    }
    errors(&world);
    equivalence(&world);
    tight_buffers(&world);
    bubble(&world, SCHED_1F1B, 1, 8, 50000, 100000);
    bubble(&world, SCHED_INTERLEAVED, 2, 8, 30000, 60000);

    int failed = check_failures;
    comm_allreduce_max_i32(&world, &failed, 1);
    int rc = check_summary("pp_exec");
    comm_finalize();
    return rc || failed;
}
