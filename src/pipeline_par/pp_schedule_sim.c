/* pp_schedule_sim.c — run every rank's instruction list together, under the
 * executor contract of pp_schedule.h, to check the lists and time the step.
 *
 * Each rank advances through its list as far as it can; only a receive whose
 * send has not been posted yet stops it.  Sweeping the ranks until none moves
 * either finishes every list or leaves some rank waiting forever: a deadlock.
 * Times are exact whatever the sweep order: a rank's clock depends only on its
 * own list and on when the sends it receives were posted. */
#include "pipeline_par/pp_schedule.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* What has happened to one (stage, micro-batch). */
enum { ST_FWD = 1, ST_BWD = 2, ST_ACT_IN = 4, ST_GRAD_IN = 8 };

/* Message directions; a message is keyed by (direction, mb, sending stage). */
enum { DIR_ACT = 0, DIR_GRAD = 1 };

typedef struct {
    const PpSchedule *ranks;
    int pp, m, v, stages;
    PpCost cost;
    unsigned char *state;        /* [stage * m + mb] */
    unsigned char *sent;         /* [msg]: number of sends posted (0 or 1) */
    unsigned char *recvd;        /* [msg]: number of receives done */
    double *sent_at;             /* [msg] */
    int *seq;                    /* [msg]: its place among the sends of its channel */
    int *chan_sent, *chan_recvd; /* [channel]: messages posted and received */
    int *pc;                     /* [rank]: next instruction */
    double *clock;               /* [rank] */
    int *inflight;               /* [rank] */
    unsigned char *phase;        /* [rank]: 0 running, 1 reduced, 2 stepped */
    PpSimResult *res;
} Sim;

enum { STEP_BLOCKED = 0, STEP_DONE = 1, STEP_ERROR = -1 };

static int msg_index(const Sim *s, int dir, int mb, int sender_stage)
{
    return (dir * s->m + mb) * s->stages + sender_stage;
}

/* A channel: one direction between two ranks (MPI keeps its order). */
static int channel(const Sim *s, int dir, int from_rank, int to_rank)
{
    return (dir * s->pp + from_rank) * s->pp + to_rank;
}

/* Report a violation at rank r's current instruction. */
static int fail_at(const Sim *s, int r, char err[CFG_ERR], const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_at(const Sim *s, int r, char err[CFG_ERR], const char *fmt, ...)
{
    char what[128], why[512];
    pp_instr_describe(&s->ranks[r].ins[s->pc[r]], what, sizeof what);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    trd_errorf(err, "rank %d, instruction %d (%s): %s", r, s->pc[r], what, why);
    return STEP_ERROR;
}

static void run_compute(Sim *s, int r, double t)
{
    t /= s->v; /* one chunk holds 1/v of the rank's layers */
    s->clock[r] += t;
    s->res->busy[r] += t;
}

static int do_forward(Sim *s, int r, int g, unsigned char *st, char err[CFG_ERR])
{
    if (*st & ST_FWD)
        return fail_at(s, r, err, "forward runs a second time");
    if (g > 0 && !(*st & ST_ACT_IN))
        return fail_at(s, r, err, "forward before its input activation was received");
    *st |= ST_FWD;
    if (++s->inflight[r] > s->res->peak_inflight[r])
        s->res->peak_inflight[r] = s->inflight[r];
    run_compute(s, r, s->cost.fwd);
    return STEP_DONE;
}

static int do_backward(Sim *s, int r, int g, unsigned char *st, char err[CFG_ERR])
{
    if (!(*st & ST_FWD))
        return fail_at(s, r, err, "backward before its forward");
    if (*st & ST_BWD)
        return fail_at(s, r, err, "backward runs a second time");
    if (g < s->stages - 1 && !(*st & ST_GRAD_IN))
        return fail_at(s, r, err, "backward before its output gradient was received");
    *st |= ST_BWD;
    s->inflight[r]--;
    run_compute(s, r, s->cost.bwd);
    return STEP_DONE;
}

/* A send of `dir` from stage g to stage `to`, after `need` happened on g. */
static int do_send(Sim *s, int r, const PpInstr *in, int g, int to, unsigned need,
                   char err[CFG_ERR])
{
    int dir = in->op == PP_SEND_ACT ? DIR_ACT : DIR_GRAD;
    if (to < 0 || to >= s->stages)
        return fail_at(s, r, err, "stage %d has no %s stage to send to", g,
                       dir == DIR_ACT ? "next" : "previous");
    if (in->peer != to % s->pp)
        return fail_at(s, r, err, "peer should be rank %d, which holds stage %d", to % s->pp, to);
    if (!(s->state[g * s->m + in->mb] & need))
        return fail_at(s, r, err, "sends data its %s has not produced yet",
                       dir == DIR_ACT ? "forward" : "backward");
    int k = msg_index(s, dir, in->mb, g);
    if (s->sent[k]++)
        return fail_at(s, r, err, "this message was already sent");
    s->sent_at[k] = s->clock[r];
    s->seq[k] = s->chan_sent[channel(s, dir, r, in->peer)]++;
    return STEP_DONE;
}

/* A receive into stage g from stage `from`; blocks until the send is posted. */
static int do_recv(Sim *s, int r, const PpInstr *in, int g, int from, unsigned mark,
                   char err[CFG_ERR])
{
    int dir = in->op == PP_RECV_ACT ? DIR_ACT : DIR_GRAD;
    if (from < 0 || from >= s->stages)
        return fail_at(s, r, err, "stage %d has no %s stage to receive from", g,
                       dir == DIR_ACT ? "previous" : "next");
    if (in->peer != from % s->pp)
        return fail_at(s, r, err, "peer should be rank %d, which holds stage %d", from % s->pp,
                       from);
    unsigned char *st = &s->state[g * s->m + in->mb];
    if (*st & mark)
        return fail_at(s, r, err, "this message was already received");
    int k = msg_index(s, dir, in->mb, from);
    if (!s->sent[k])
        return STEP_BLOCKED;
    int *next = &s->chan_recvd[channel(s, dir, in->peer, r)];
    if (s->seq[k] != *next)
        return fail_at(s, r, err,
                       "received out of order: it is %s number %d from rank %d, "
                       "but %d came before it",
                       dir == DIR_ACT ? "activation" : "gradient", s->seq[k], in->peer, *next);
    (*next)++;
    s->recvd[k]++;
    *st |= mark;
    if (s->sent_at[k] > s->clock[r])
        s->clock[r] = s->sent_at[k];
    return STEP_DONE;
}

static int do_end(Sim *s, int r, PpOp op, char err[CFG_ERR])
{
    if (op == PP_STEP) {
        if (s->phase[r] != 1)
            return fail_at(s, r, err, "optimizer step without the gradient reduction before it");
        s->phase[r] = 2;
        return STEP_DONE;
    }
    if (s->phase[r])
        return fail_at(s, r, err, "second gradient reduction");
    for (int c = 0; c < s->v; c++)
        for (int mb = 0; mb < s->m; mb++)
            if (!(s->state[pp_stage(s->pp, r, c) * s->m + mb] & ST_BWD))
                return fail_at(s, r, err,
                               "reduces gradients before the backward of mb %d "
                               "chunk %d",
                               mb, c);
    s->phase[r] = 1;
    return STEP_DONE;
}

/* Try rank r's next instruction. */
static int step_rank(Sim *s, int r, char err[CFG_ERR])
{
    const PpInstr *in = &s->ranks[r].ins[s->pc[r]];
    if (s->phase[r] == 2)
        return fail_at(s, r, err, "instruction after the optimizer step");
    if (in->op == PP_REDUCE || in->op == PP_STEP)
        return do_end(s, r, in->op, err);
    if ((unsigned)in->op >= PP_OPS)
        return fail_at(s, r, err, "unknown operation %d", (int)in->op);
    if (in->mb < 0 || in->mb >= s->m || in->chunk < 0 || in->chunk >= s->v)
        return fail_at(s, r, err, "micro-batch or chunk out of range (m %d, v %d)", s->m, s->v);
    if (s->phase[r])
        return fail_at(s, r, err, "after the gradient reduction");
    int g = pp_stage(s->pp, r, in->chunk);
    unsigned char *st = &s->state[g * s->m + in->mb];
    switch (in->op) {
    case PP_FWD:
        return do_forward(s, r, g, st, err);
    case PP_BWD:
        return do_backward(s, r, g, st, err);
    case PP_SEND_ACT:
        return do_send(s, r, in, g, g + 1, ST_FWD, err);
    case PP_SEND_GRAD:
        return do_send(s, r, in, g, g - 1, ST_BWD, err);
    case PP_RECV_ACT:
        return do_recv(s, r, in, g, g - 1, ST_ACT_IN, err);
    case PP_RECV_GRAD:
        return do_recv(s, r, in, g, g + 1, ST_GRAD_IN, err);
    default:
        return fail_at(s, r, err, "unexpected operation");
    }
}

/* Sweep the ranks until nobody moves.  Returns 0, or -1 on a violation. */
static int run_all(Sim *s, char err[CFG_ERR])
{
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < s->pp; r++) {
            while (s->pc[r] < s->ranks[r].n) {
                double before = s->clock[r];
                int rc = step_rank(s, r, err);
                if (rc == STEP_ERROR)
                    return -1;
                if (rc == STEP_BLOCKED)
                    break;
                /* A receive moves the clock to when its data was there, and
                 * counts as starting then; anything else starts at `before`. */
                PpOp op = s->ranks[r].ins[s->pc[r]].op;
                int recv = op == PP_RECV_ACT || op == PP_RECV_GRAD;
                s->res->start[r][s->pc[r]] = recv ? s->clock[r] : before;
                s->pc[r]++;
                moved = 1;
            }
        }
    }
    return 0;
}

/* After the sweep: every rank done, nothing sent but not received. */
static int check_finished(const Sim *s, char err[CFG_ERR])
{
    int len = snprintf(err, CFG_ERR, "deadlock:");
    int stuck = 0;
    for (int r = 0; r < s->pp; r++) {
        if (s->pc[r] >= s->ranks[r].n)
            continue;
        char what[128];
        pp_instr_describe(&s->ranks[r].ins[s->pc[r]], what, sizeof what);
        if (len < CFG_ERR)
            len += snprintf(err + len, CFG_ERR - len, "%s rank %d waits at instruction %d (%s)",
                            stuck ? ";" : "", r, s->pc[r], what);
        stuck++;
    }
    if (stuck)
        return -1;
    for (int r = 0; r < s->pp; r++)
        if (s->phase[r] != 2)
            return trd_errorf(err, "rank %d: the list ends without %s", r,
                              s->phase[r] ? "the optimizer step" : "the gradient reduction");
    for (int dir = 0; dir < 2; dir++)
        for (int mb = 0; mb < s->m; mb++)
            for (int g = 0; g < s->stages; g++) {
                int k = msg_index(s, dir, mb, g);
                if (s->sent[k] && !s->recvd[k])
                    return trd_errorf(err,
                                      "the %s of mb %d sent by stage %d (rank %d) is "
                                      "never received",
                                      dir == DIR_ACT ? "activation" : "gradient", mb, g, g % s->pp);
            }
    return 0;
}

static int check_lists(const PpSchedule *ranks, int pp, char err[CFG_ERR])
{
    if (pp < 1)
        return trd_errorf(err, "no ranks to simulate");
    for (int r = 0; r < pp; r++) {
        const PpSchedule *q = &ranks[r];
        if (q->pp != pp || q->rank != r || q->m != ranks[0].m || q->v != ranks[0].v || q->m < 1 ||
            q->v < 1)
            return trd_errorf(err,
                              "list %d is for rank %d of %d (m %d, v %d), not rank %d of "
                              "%d (m %d, v %d)",
                              r, q->rank, q->pp, q->m, q->v, r, pp, ranks[0].m, ranks[0].v);
    }
    return 0;
}

static void alloc_result(PpSimResult *res, const PpSchedule *ranks, int pp)
{
    memset(res, 0, sizeof *res);
    res->pp = pp;
    res->m = ranks[0].m;
    res->v = ranks[0].v;
    res->busy = trd_calloc((size_t)pp, sizeof(double), "simulated busy time");
    res->finish = trd_calloc((size_t)pp, sizeof(double), "simulated finish time");
    res->idle = trd_calloc((size_t)pp, sizeof(double), "simulated idle share");
    res->peak_inflight = trd_calloc((size_t)pp, sizeof(int), "simulated peak in-flight");
    res->start = trd_calloc((size_t)pp, sizeof(double *), "simulated timeline");
    for (int r = 0; r < pp; r++)
        res->start[r] = trd_calloc((size_t)ranks[r].n + 1, sizeof(double), "simulated timeline");
}

static void sim_init(Sim *s, const PpSchedule *ranks, int pp, PpCost cost, PpSimResult *res)
{
    memset(s, 0, sizeof *s);
    s->ranks = ranks;
    s->pp = pp;
    s->m = ranks[0].m;
    s->v = ranks[0].v;
    s->stages = pp * s->v;
    s->cost = cost;
    s->res = res;
    size_t cells = (size_t)s->stages * s->m, msgs = 2 * cells;
    s->state = trd_calloc(cells, 1, "simulation state");
    s->sent = trd_calloc(msgs, 1, "simulation messages");
    s->recvd = trd_calloc(msgs, 1, "simulation messages");
    s->sent_at = trd_calloc(msgs, sizeof(double), "simulation messages");
    s->seq = trd_calloc(msgs, sizeof(int), "simulation messages");
    size_t chans = 2 * (size_t)pp * pp;
    s->chan_sent = trd_calloc(chans, sizeof(int), "simulation channels");
    s->chan_recvd = trd_calloc(chans, sizeof(int), "simulation channels");
    s->pc = trd_calloc((size_t)pp, sizeof(int), "simulation ranks");
    s->clock = trd_calloc((size_t)pp, sizeof(double), "simulation ranks");
    s->inflight = trd_calloc((size_t)pp, sizeof(int), "simulation ranks");
    s->phase = trd_calloc((size_t)pp, 1, "simulation ranks");
}

static void sim_free(Sim *s)
{
    free(s->state);
    free(s->sent);
    free(s->recvd);
    free(s->sent_at);
    free(s->seq);
    free(s->chan_sent);
    free(s->chan_recvd);
    free(s->pc);
    free(s->clock);
    free(s->inflight);
    free(s->phase);
}

static void summarize(const Sim *s, PpSimResult *res)
{
    for (int r = 0; r < s->pp; r++) {
        res->finish[r] = s->clock[r];
        if (s->clock[r] > res->step_time)
            res->step_time = s->clock[r];
    }
    res->cost = s->cost;
    res->ideal_time = s->m * (s->cost.fwd + s->cost.bwd);
    double t = res->step_time;
    res->bubble = t > 0 ? (t - res->ideal_time) / t : 0;
    res->bubble_ratio = res->ideal_time > 0 ? (t - res->ideal_time) / res->ideal_time : 0;
    for (int r = 0; r < s->pp; r++)
        res->idle[r] = t > 0 ? (t - res->busy[r]) / t : 0;
}

int pp_simulate(const PpSchedule *ranks, int pp, PpCost cost, PpSimResult *res, char err[CFG_ERR])
{
    memset(res, 0, sizeof *res);
    if (check_lists(ranks, pp, err))
        return -1;
    if (!(cost.fwd >= 0 && cost.bwd >= 0))
        return trd_errorf(err, "costs must be >= 0 (forward %g, backward %g)", cost.fwd, cost.bwd);
    alloc_result(res, ranks, pp);
    Sim s;
    sim_init(&s, ranks, pp, cost, res);
    int rc = run_all(&s, err);
    if (!rc)
        rc = check_finished(&s, err);
    if (!rc)
        summarize(&s, res);
    sim_free(&s);
    if (rc)
        pp_sim_free(res);
    return rc;
}

void pp_sim_free(PpSimResult *res)
{
    if (res->start)
        for (int r = 0; r < res->pp; r++)
            free(res->start[r]);
    free(res->start);
    free(res->busy);
    free(res->finish);
    free(res->idle);
    free(res->peak_inflight);
    memset(res, 0, sizeof *res);
}
