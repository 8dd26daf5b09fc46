/* executor.c — runs a pipeline rank's instruction list: callbacks for the
 * compute, non-blocking sends tracked by buffer, blocking receives, timing. */
#include "pipeline_par/executor.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/progress.h"

/* One tag per direction: a channel (direction, sender, receiver) keeps its
 * order in MPI, and the schedule receives each channel in send order. */
enum { PP_TAG_ACT = 0x7001, PP_TAG_GRAD = 0x7002 };

/* A send MPI has not reported complete, and the buffer it holds. */
typedef struct {
    CommHandle h;
    const float *buf;
} PendingSend;

typedef struct {
    const PpSchedule *s;
    const PpChunkOps *st;
    Comm *pp;
    PpExecStats *stats;
    PendingSend *pending; /* room for every send of the list */
    int n_pending;
} Exec;

static double now(void) { return comm_wtime(); }

/* Waiting without holding a core.  A rank blocked inside MPI spins on its
 * core; where ranks share cores (the CPU backend's OpenMP threads, a test on
 * a small machine) the spin takes the core from a rank that is computing,
 * and the whole pipeline slows down.  So the executor's waits poll: they spin
 * for the first POLL_SPIN_S (a short wait keeps its latency), then nap
 * POLL_NAP_NS between polls. */
#define POLL_SPIN_S 50e-6
#define POLL_NAP_NS 20000L

static void poll_pause(double since)
{
    if (now() - since < POLL_SPIN_S)
        return;
    struct timespec ts = {0, POLL_NAP_NS};
    nanosleep(&ts, NULL);
}

static void wait_send(Exec *e, PendingSend *p)
{
    if (comm_stream_ordered(e->pp)) { /* NCCL: later work waits, the host need not */
        comm_wait(&p->h);
        return;
    }
    double t = now();
    while (!comm_test(&p->h))
        poll_pause(t);
}

/* Receive once the message is there (a probe does not block); the receive
 * itself checks the length. */
static void receive(Exec *e, float *buf, int peer, int tag)
{
    double t = now();
    while (!comm_probe(e->pp, peer, tag))
        poll_pause(t);
    comm_recv_f32(e->pp, buf, e->st->act_elems, peer, tag);
}

static int overlaps(const float *a, const float *b, size_t n)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b, len = n * sizeof(float);
    return x < y + len && y < x + len;
}

static void drop_pending(Exec *e, int i) { e->pending[i] = e->pending[--e->n_pending]; }

/* Test every pending send (this also moves MPI along) and forget the
 * completed ones. */
static void reap_sends(Exec *e)
{
    for (int i = e->n_pending - 1; i >= 0; i--)
        if (comm_test(&e->pending[i].h))
            drop_pending(e, i);
}

/* Before something writes buf: complete the sends still reading it. */
static void free_buffer(Exec *e, const float *buf)
{
    int waited = 0;
    double t = now();
    for (int i = e->n_pending - 1; i >= 0; i--) {
        if (!overlaps(e->pending[i].buf, buf, e->st->act_elems))
            continue;
        wait_send(e, &e->pending[i]);
        drop_pending(e, i);
        waited = 1;
    }
    if (waited) {
        e->stats->buffer_waits++;
        e->stats->send_wait_s += now() - t;
    }
}

static void wait_all_sends(Exec *e)
{
    double t = now();
    for (int i = 0; i < e->n_pending; i++)
        wait_send(e, &e->pending[i]);
    e->n_pending = 0;
    e->stats->send_wait_s += now() - t;
}

static int is_first(const Exec *e, int chunk) { return pp_stage(e->s->pp, e->s->rank, chunk) == 0; }

static int is_last(const Exec *e, int chunk)
{
    return pp_stage(e->s->pp, e->s->rank, chunk) == e->s->pp * e->s->v - 1;
}

/* The buffer instruction `in` is about to write (NULL if none), from the
 * stage's accessor, called once here, and with every send still reading it
 * completed first.  REDUCE writes no buffer but needs every send complete. */
static float *claim_buffer(Exec *e, const PpInstr *in)
{
    const PpChunkOps *st = e->st;
    void *ctx = st->ctx;
    float *buf = NULL;
    if (in->op == PP_FWD && !is_last(e, in->chunk))
        buf = st->act_out(ctx, in->mb, in->chunk);
    else if (in->op == PP_BWD && !is_first(e, in->chunk))
        buf = st->grad_out(ctx, in->mb, in->chunk);
    else if (in->op == PP_RECV_ACT)
        buf = st->act_in(ctx, in->mb, in->chunk);
    else if (in->op == PP_RECV_GRAD)
        buf = st->grad_in(ctx, in->mb, in->chunk);
    else if (in->op == PP_REDUCE)
        wait_all_sends(e);
    if (buf)
        free_buffer(e, buf);
    return buf;
}

/* Run one instruction; buf is what claim_buffer gave for it.  last_out[c]
 * remembers the buffer the latest compute of chunk c wrote: the send right
 * after that compute sends it (check_fit makes sure one follows the other). */
static void run_instr(Exec *e, const PpInstr *in, float *buf, const float *last_out[])
{
    const PpChunkOps *st = e->st;
    void *ctx = st->ctx;
    switch (in->op) {
    case PP_FWD:
        progress_micro(in->mb + 1); /* for the watchdog (core/progress.h) */
        st->forward(ctx, in->mb, in->chunk);
        last_out[in->chunk] = buf;
        break;
    case PP_BWD:
        progress_micro(in->mb + 1);
        st->backward(ctx, in->mb, in->chunk);
        last_out[in->chunk] = buf;
        break;
    case PP_SEND_ACT:
    case PP_SEND_GRAD: {
        const float *out = last_out[in->chunk];
        TRD_ASSERT(out != NULL);
        int tag = in->op == PP_SEND_ACT ? PP_TAG_ACT : PP_TAG_GRAD;
        e->pending[e->n_pending++] =
            (PendingSend){comm_isend_f32(e->pp, out, st->act_elems, in->peer, tag), out};
        break;
    }
    case PP_RECV_ACT:
    case PP_RECV_GRAD:
        receive(e, buf, in->peer, in->op == PP_RECV_ACT ? PP_TAG_ACT : PP_TAG_GRAD);
        break;
    case PP_REDUCE:
        if (st->reduce)
            st->reduce(ctx);
        break;
    case PP_STEP:
        if (st->step)
            st->step(ctx);
        break;
    default:
        TRD_ASSERT(!"unknown pipeline instruction");
    }
}

/* A send's chunk must be the one whose compute ran just before it (the
 * builder's rule; the executor relies on it to find the buffer). */
static int check_fit(const PpSchedule *s, const PpChunkOps *st, const Comm *pp, char err[CFG_ERR])
{
    if (s->pp != pp->size || s->rank != pp->rank)
        return trd_errorf(err,
                          "schedule for pipeline rank %d of %d run on rank %d of a group of %d",
                          s->rank, s->pp, pp->rank, pp->size);
    if (!st->forward || !st->backward)
        return trd_errorf(err, "pipeline stage without forward or backward callback");
    int comm = 0;
    for (int i = 0; i < s->n; i++) {
        const PpInstr *in = &s->ins[i];
        if (in->op == PP_REDUCE || in->op == PP_STEP)
            continue;
        if (in->chunk < 0 || in->chunk >= s->v || in->mb < 0 || in->mb >= s->m)
            return trd_errorf(err, "instruction %d: micro-batch %d chunk %d out of range", i,
                              in->mb, in->chunk);
        if (in->op == PP_FWD || in->op == PP_BWD)
            continue;
        comm = 1;
        if (in->peer < 0 || in->peer >= s->pp)
            return trd_errorf(err, "instruction %d: peer %d outside the group of %d", i, in->peer,
                              s->pp);
        PpOp before = in->op == PP_SEND_ACT ? PP_FWD : PP_BWD;
        if ((in->op == PP_SEND_ACT || in->op == PP_SEND_GRAD) &&
            (i == 0 || s->ins[i - 1].op != before || s->ins[i - 1].mb != in->mb ||
             s->ins[i - 1].chunk != in->chunk))
            return trd_errorf(err,
                              "instruction %d: a send must follow the compute of its "
                              "micro-batch and chunk",
                              i);
    }
    if (comm &&
        (st->act_elems == 0 || !st->act_in || !st->act_out || !st->grad_in || !st->grad_out))
        return trd_errorf(err,
                          "pipeline stage without message buffers (act_elems %zu, "
                          "accessors) for a schedule that communicates",
                          st->act_elems);
    return 0;
}

static void record(Exec *e, const PpInstr *in, double t0, double t1)
{
    PpExecStats *x = e->stats;
    x->op_s[in->op] += t1 - t0;
    if (x->spans && x->n_spans < x->span_cap)
        x->spans[x->n_spans++] = (PpSpan){t0 - x->t0, t1 - x->t0, in->op, in->mb, in->chunk};
}

/* Activations go to the next rank, gradients to the one before; with
 * chunks (v > 1) the last rank's activations wrap around to rank 0 and
 * rank 0's gradients to the last.  Each of these one-way channels gets its
 * own NCCL communicator (comm_open_channel; nothing under MPI). */
static void open_channels(const PpSchedule *s, Comm *pp)
{
    for (int r = 0; r < s->pp; r++) {
        if (r + 1 < s->pp || s->v > 1)
            comm_open_channel(pp, r, (r + 1) % s->pp, PP_TAG_ACT);
        if (r > 0 || s->v > 1)
            comm_open_channel(pp, r, (r - 1 + s->pp) % s->pp, PP_TAG_GRAD);
    }
}

int pp_execute(const PpSchedule *s, const PpChunkOps *st, Comm *pp, PpExecStats *stats,
               char err[CFG_ERR])
{
    if (check_fit(s, st, pp, err))
        return -1;
    open_channels(s, pp);
    PpExecStats local = {0};
    if (!stats)
        stats = &local;
    PpSpan *spans = stats->spans;
    int cap = stats->span_cap;
    *stats = (PpExecStats){.spans = spans, .span_cap = spans ? cap : 0};

    int sends = 0;
    for (int i = 0; i < s->n; i++)
        sends += s->ins[i].op == PP_SEND_ACT || s->ins[i].op == PP_SEND_GRAD;
    Exec e = {.s = s,
              .st = st,
              .pp = pp,
              .stats = stats,
              .pending = trd_malloc((size_t)(sends ? sends : 1) * sizeof(PendingSend),
                                    "pipeline pending sends")};
    const float **last_out = trd_calloc((size_t)s->v, sizeof *last_out, "pipeline out buffers");

    stats->t0 = now();
    for (int i = 0; i < s->n; i++) {
        /* Waiting for a send to free the buffer counts in send_wait_s, not
         * in the instruction's time or span. */
        float *buf = claim_buffer(&e, &s->ins[i]);
        double t = now();
        run_instr(&e, &s->ins[i], buf, last_out);
        record(&e, &s->ins[i], t, now());
        reap_sends(&e);
    }
    wait_all_sends(&e); /* a list always ends in REDUCE; this is for hand-made ones */
    stats->elapsed_s = now() - stats->t0;
    stats->busy_s =
        stats->op_s[PP_FWD] + stats->op_s[PP_BWD] + stats->op_s[PP_REDUCE] + stats->op_s[PP_STEP];
    stats->wait_s = stats->op_s[PP_RECV_ACT] + stats->op_s[PP_RECV_GRAD] + stats->send_wait_s;
    free(last_out);
    free(e.pending);
    return 0;
}

double pp_exec_idle_fraction(const PpExecStats *stats, Comm *pp)
{
    double T = stats->elapsed_s;
    comm_allreduce_max_f64(pp, &T, 1);
    return T > 0 ? (T - stats->busy_s) / T : 0.0;
}
