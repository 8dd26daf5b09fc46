/* test_pp_schedule.c — pipeline schedules as data, checked without a model.
 *
 *  - small schedules written out by hand from the published rules (1F1B:
 *    pp - rank - 1 warm-up forwards, then one forward one backward, then the
 *    remaining backwards; interleaved: groups of pp micro-batches pass through
 *    chunk 0, then chunk 1, ...; GPipe: all forwards, then all backwards);
 *  - a grid (pp 1..16, m 1..3pp+1, v 1..4): counts, order of receive /
 *    compute / send, peers, and the simulator's verdict;
 *  - activation memory: at most pp - rank micro-batches in flight for 1F1B;
 *  - the bubble against (p-1)/(v m + p-1), and start times of a tiny case
 *    worked out by hand;
 *  - broken schedules (a dropped receive or send, swapped instructions, a
 *    wrong peer, a duplicate) must be rejected, with the reason. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "pipeline_par/pp_schedule.h"

#define MAX_PP 16

static const PpCost UNIT = {1, 2}; /* backward = 2 x forward */

/* The compact rendering of rank r's list. */
static void line_of(const PpSchedule *s, int with_comm, char *buf, size_t len)
{
    pp_schedule_format(s, with_comm, buf, len);
}

static void expect_lines(ScheduleKind kind, int pp, int m, int v, const char *const *want,
                         int with_comm)
{
    PpSchedule r[MAX_PP];
    char err[CFG_ERR], got[4096];
    int rc = pp_schedule_build_all(r, kind, pp, m, v, err);
    CHECK(rc == 0, "%s pp %d m %d v %d: %s", pp_schedule_name(kind), pp, m, v, err);
    if (rc)
        return;
    for (int k = 0; k < pp; k++) {
        line_of(&r[k], with_comm, got, sizeof got);
        CHECK(!strcmp(got, want[k]), "%s pp %d m %d v %d rank %d:\n  got  %s\n  want %s",
              pp_schedule_name(kind), pp, m, v, k, got, want[k]);
    }
    pp_schedule_free_all(r, pp);
}

static void test_hand_schedules(void)
{
    /* 1F1B, pp 4, m 8 (the example of the 1F1B figure of Narayanan et al.):
     * rank r warms up with pp - r - 1 forwards. */
    static const char *const f1b_4_8[] = {
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    };
    expect_lines(SCHED_1F1B, 4, 8, 1, f1b_4_8, 0);
    /* Fewer micro-batches than stages: the warm-up is cut to m. */
    static const char *const f1b_4_2[] = {"F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1",
                                          "F0 B0 F1 B1"};
    expect_lines(SCHED_1F1B, 4, 2, 1, f1b_4_2, 0);
    /* With communication: receive just before the compute that needs it, send
     * just after the compute that produced it. */
    static const char *const f1b_2_2[] = {"F0 >a0 F1 >a1 <g0 B0 <g1 B1 R S",
                                          "<a0 F0 B0 >g0 <a1 F1 B1 >g1 R S"};
    expect_lines(SCHED_1F1B, 2, 2, 1, f1b_2_2, 1);
    static const char *const gpipe_3_2[] = {"F0 >a0 F1 >a1 <g0 B0 <g1 B1 R S",
                                            "<a0 F0 >a0 <a1 F1 >a1 <g0 B0 >g0 <g1 B1 >g1 R S",
                                            "<a0 F0 <a1 F1 B0 >g0 B1 >g1 R S"};
    expect_lines(SCHED_GPIPE, 3, 2, 1, gpipe_3_2, 1);
    /* Interleaved, pp 2, v 2, m 4: forwards in the order 0.0 1.0 0.1 1.1 2.0
     * 3.0 2.1 3.1 (groups of pp micro-batches through chunk 0 then chunk 1),
     * backwards 0.1 1.1 0.0 1.0 2.1 3.1 2.0 3.0; rank r warms up with
     * (pp - r - 1) + (v - 1) pp forwards: 3 on rank 0, 2 on rank 1. */
    static const char *const int_2_4_2[] = {
        "F0.0 F1.0 F0.1 F1.1 B0.1 F2.0 B1.1 F3.0 B0.0 F2.1 B1.0 F3.1 B2.1 B3.1 B2.0 B3.0",
        "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0",
    };
    expect_lines(SCHED_INTERLEAVED, 2, 4, 2, int_2_4_2, 0);
    /* The interleaved schedule with one chunk is 1F1B. */
    expect_lines(SCHED_INTERLEAVED, 4, 8, 1, f1b_4_8, 0);
}

/* Interleaved chunk placement: rank r holds stages r, r + pp, ...; stage
 * pp - 1 (rank pp-1, chunk 0) sends to stage pp (rank 0, chunk 1). */
static void test_interleaved_peers(void)
{
    PpSchedule r[4];
    char err[CFG_ERR];
    if (pp_schedule_build_all(r, SCHED_INTERLEAVED, 4, 8, 2, err)) {
        CHECK(0, "%s", err);
        return;
    }
    int wrap_send = 0, wrap_recv = 0, first_recv = 0, last_send = 0;
    for (int i = 0; i < r[3].n; i++) {
        PpInstr in = r[3].ins[i];
        wrap_send += in.op == PP_SEND_ACT && in.chunk == 0 && in.peer == 0;
        last_send += (in.op == PP_SEND_ACT || in.op == PP_RECV_GRAD) && in.chunk == 1;
    }
    for (int i = 0; i < r[0].n; i++) {
        PpInstr in = r[0].ins[i];
        wrap_recv += in.op == PP_RECV_ACT && in.chunk == 1 && in.peer == 3;
        first_recv += (in.op == PP_RECV_ACT || in.op == PP_SEND_GRAD) && in.chunk == 0;
    }
    CHECK(wrap_send == 8 && wrap_recv == 8, "stage 3 -> stage 4 wrap: %d sends, %d receives",
          wrap_send, wrap_recv);
    CHECK(first_recv == 0, "stage 0 receives/sends %d activations/gradients", first_recv);
    CHECK(last_send == 0, "the last stage sends %d activations", last_send);
    CHECK(pp_stage(4, 3, 1) == 7 && pp_stage(4, 0, 1) == 4, "stage numbering");
    pp_schedule_free_all(r, 4);
}

/* Counts and local order on one rank, checked directly on the list: every
 * (mb, chunk) forward and backward once, forward first; a receive right
 * before the compute that needs it and a send right after the compute that
 * made it, exactly where the stage has a neighbour; reduce and step last. */
static int check_rank_list(const PpSchedule *s)
{
    int pp = s->pp, v = s->v, m = s->m, last = pp * v - 1, bad = 0;
    int *fwd_at = calloc((size_t)m * v, sizeof(int)), *bwd_at = calloc((size_t)m * v, sizeof(int));
    int nf = 0, nb = 0, ncomm = 0;
    for (int i = 0; i < m * v; i++)
        fwd_at[i] = bwd_at[i] = -1;
    for (int i = 0; i < s->n - 2; i++) {
        PpInstr in = s->ins[i];
        if (in.op != PP_FWD && in.op != PP_BWD) {
            ncomm++;
            continue;
        }
        int *at = in.op == PP_FWD ? fwd_at : bwd_at, k = in.chunk * m + in.mb;
        bad += at[k] != -1;
        at[k] = i;
        if (in.op == PP_FWD)
            nf++;
        else
            nb++;
        int g = pp_stage(pp, s->rank, in.chunk), fw = in.op == PP_FWD;
        int has_in = fw ? g > 0 : g < last, has_out = fw ? g < last : g > 0;
        PpOp want_in = fw ? PP_RECV_ACT : PP_RECV_GRAD, want_out = fw ? PP_SEND_ACT : PP_SEND_GRAD;
        int in_peer = fw ? (g - 1) % pp : (g + 1) % pp, out_peer = fw ? (g + 1) % pp : (g - 1) % pp;
        if (has_in) {
            PpInstr p = s->ins[i - 1];
            bad += p.op != want_in || p.mb != in.mb || p.chunk != in.chunk || p.peer != in_peer;
        }
        if (has_out) {
            PpInstr q = s->ins[i + 1];
            bad += q.op != want_out || q.mb != in.mb || q.chunk != in.chunk || q.peer != out_peer;
        }
    }
    for (int k = 0; k < m * v; k++)
        bad += fwd_at[k] < 0 || bwd_at[k] < fwd_at[k];
    /* sends and receives: one per pass with a neighbour on that side */
    int want_comm = 0;
    for (int c = 0; c < v; c++) {
        int g = pp_stage(pp, s->rank, c);
        want_comm += 2 * m * ((g > 0) + (g < last));
    }
    bad += nf != m * v || nb != m * v || ncomm != want_comm;
    bad += s->n < 2 || s->ins[s->n - 2].op != PP_REDUCE || s->ins[s->n - 1].op != PP_STEP;
    free(fwd_at);
    free(bwd_at);
    return bad;
}

/* The simulated bubble against what holds exactly (see docs/pipeline.md):
 * 1F1B and GPipe take (m + p - 1)(f + b) for any f, b, so the idle share is
 * (p-1)/(m+p-1) on every rank; interleaved with pp | m takes
 * m (f + b) + (p - 1)(f + b)/v, so (p-1)/(v m + p-1); otherwise no better. */
static void check_bubble(ScheduleKind kind, int pp, int m, int v, PpCost c, const PpSimResult *res)
{
    double f = pp_bubble_fraction(pp, m, v), ratio = pp_bubble_ratio(pp, m, v);
    double want_t = m * (c.fwd + c.bwd) + (pp - 1) * (c.fwd + c.bwd) / v;
    int exact = kind != SCHED_INTERLEAVED || m % pp == 0 || v == 1;
    if (exact) {
        CHECK_CLOSE(res->step_time, want_t, 1e-12, 1e-9, "step time");
        CHECK_CLOSE(res->bubble, f, 1e-12, 1e-12, "bubble share");
        CHECK_CLOSE(res->bubble_ratio, ratio, 1e-12, 1e-12, "bubble ratio");
        for (int r = 0; r < pp; r++)
            CHECK_CLOSE(res->idle[r], f, 1e-12, 1e-12, "idle share of a rank");
    } else {
        CHECK(res->bubble >= f - 1e-12, "%s pp %d m %d v %d: bubble %g below formula %g",
              pp_schedule_name(kind), pp, m, v, res->bubble, f);
    }
}

/* Activation memory: 1F1B holds min(pp - rank, m) micro-batches, GPipe m.
 * Interleaved counts passes through one chunk (1/v of a stage's activations
 * each): at most v pp - rank of them, so never more than 1F1B's pp
 * micro-batches.  Rank 0 holds the most in all three. */
static void check_memory(ScheduleKind kind, int pp, int m, int v, const PpSimResult *res)
{
    for (int r = 0; r < pp; r++) {
        int peak = res->peak_inflight[r];
        if (kind == SCHED_1F1B)
            CHECK(peak == (pp - r < m ? pp - r : m), "1f1b pp %d m %d rank %d: peak %d", pp, m, r,
                  peak);
        else if (kind == SCHED_GPIPE)
            CHECK(peak == m, "gpipe pp %d m %d rank %d: peak %d", pp, m, r, peak);
        else
            CHECK(peak <= v * pp - r && peak <= m * v,
                  "interleaved pp %d m %d v %d rank %d: "
                  "peak %d passes",
                  pp, m, v, r, peak);
        CHECK(peak <= res->peak_inflight[0], "rank 0 holds the most (rank %d: %d > %d)", r, peak,
              res->peak_inflight[0]);
    }
}

static void test_grid(void)
{
    static const PpCost costs[] = {{1, 2}, {1, 1}, {1, 3}, {2, 1}};
    static const ScheduleKind kinds[] = {SCHED_1F1B, SCHED_INTERLEAVED, SCHED_GPIPE};
    int cases = 0, failures_before = check_failures;
    for (int kk = 0; kk < 3; kk++)
        for (int pp = 1; pp <= MAX_PP; pp++)
            for (int m = 1; m <= 3 * pp + 1; m++)
                for (int v = 1; v <= (kinds[kk] == SCHED_INTERLEAVED ? 4 : 1); v++) {
                    ScheduleKind kind = kinds[kk];
                    PpSchedule r[MAX_PP];
                    char err[CFG_ERR];
                    if (pp_schedule_build_all(r, kind, pp, m, v, err)) {
                        CHECK(0, "%s pp %d m %d v %d: %s", pp_schedule_name(kind), pp, m, v, err);
                        continue;
                    }
                    for (int k = 0; k < pp; k++)
                        CHECK(check_rank_list(&r[k]) == 0, "%s pp %d m %d v %d rank %d: list",
                              pp_schedule_name(kind), pp, m, v, k);
                    for (int ci = 0; ci < 4; ci++) {
                        PpSimResult res;
                        int rc = pp_simulate(r, pp, costs[ci], &res, err);
                        CHECK(rc == 0, "%s pp %d m %d v %d: %s", pp_schedule_name(kind), pp, m, v,
                              err);
                        if (rc)
                            continue;
                        check_bubble(kind, pp, m, v, costs[ci], &res);
                        check_memory(kind, pp, m, v, &res);
                        pp_sim_free(&res);
                        cases++;
                    }
                    pp_schedule_free_all(r, pp);
                    if (check_failures > failures_before + 20)
                        return; /* enough to read */
                }
    printf("grid: %d schedule x cost cases simulated\n", cases);
}

/* pp 2, m 2, 1F1B, f 1, b 2, worked out by hand:
 * rank 1: F0 [1,2]  B0 [2,4]  F1 [4,5]  B1 [5,7]
 * rank 0: F0 [0,1]  F1 [1,2]  B0 [4,6]  B1 [7,9]   -> step 9 = (2+2-1) x 3 */
static void test_timeline_by_hand(void)
{
    PpSchedule r[2];
    char err[CFG_ERR];
    PpSimResult res;
    if (pp_schedule_build_all(r, SCHED_1F1B, 2, 2, 1, err) || pp_simulate(r, 2, UNIT, &res, err)) {
        CHECK(0, "%s", err);
        return;
    }
    static const double want[2][4] = {{0, 1, 4, 7}, {1, 2, 4, 5}};
    for (int k = 0; k < 2; k++) {
        int j = 0;
        for (int i = 0; i < r[k].n; i++)
            if (r[k].ins[i].op == PP_FWD || r[k].ins[i].op == PP_BWD)
                CHECK_CLOSE(res.start[k][i], want[k][j++], 0, 0, "start time");
    }
    CHECK_CLOSE(res.finish[0], 9, 0, 0, "rank 0 finish");
    CHECK_CLOSE(res.finish[1], 7, 0, 0, "rank 1 finish");
    CHECK_CLOSE(res.step_time, 9, 0, 0, "step time");
    CHECK_CLOSE(res.busy[0], 6, 0, 0, "busy");
    CHECK_CLOSE(res.idle[1], 1.0 / 3, 1e-15, 0, "idle share");
    pp_sim_free(&res);
    pp_schedule_free_all(r, 2);
}

/* ---- broken schedules ---- */

static int find(const PpSchedule *s, PpOp op, int mb, int chunk)
{
    for (int i = 0; i < s->n; i++)
        if (s->ins[i].op == op && s->ins[i].mb == mb && s->ins[i].chunk == chunk)
            return i;
    return -1;
}

static void drop(PpSchedule *s, int i)
{
    memmove(&s->ins[i], &s->ins[i + 1], (size_t)(s->n - i - 1) * sizeof *s->ins);
    s->n--;
}

static void swap(PpSchedule *s, int i, int j)
{
    PpInstr t = s->ins[i];
    s->ins[i] = s->ins[j];
    s->ins[j] = t;
}

typedef void (*Breaker)(PpSchedule *r);

/* Build, break, simulate: the checker must fail and say `want`. */
static void expect_broken(const char *what, ScheduleKind kind, int pp, int m, int v, Breaker brk,
                          const char *want)
{
    PpSchedule r[MAX_PP];
    char err[CFG_ERR] = "";
    if (pp_schedule_build_all(r, kind, pp, m, v, err)) {
        CHECK(0, "%s: %s", what, err);
        return;
    }
    brk(r);
    PpSimResult res;
    int rc = pp_simulate(r, pp, UNIT, &res, err);
    CHECK(rc == -1, "%s: the checker accepted it", what);
    CHECK(strstr(err, want) != NULL, "%s: message '%s' lacks '%s'", what, err, want);
    if (rc == 0)
        pp_sim_free(&res);
    pp_schedule_free_all(r, pp);
}

static void drop_recv_act(PpSchedule *r) { drop(&r[1], find(&r[1], PP_RECV_ACT, 2, 0)); }
static void drop_send_act(PpSchedule *r) { drop(&r[1], find(&r[1], PP_SEND_ACT, 2, 0)); }
static void drop_recv_grad(PpSchedule *r) { drop(&r[0], find(&r[0], PP_RECV_GRAD, 1, 0)); }
static void drop_send_grad(PpSchedule *r) { drop(&r[2], find(&r[2], PP_SEND_GRAD, 0, 0)); }
/* rank 0 waits for gradient 0 before posting activation 0: both wait. */
static void swap_deadlock(PpSchedule *r)
{
    swap(&r[0], find(&r[0], PP_SEND_ACT, 0, 0), find(&r[0], PP_RECV_GRAD, 0, 0));
}
/* interleaved: rank 0 waits for the gradient of chunk 1 before sending on
 * the very first activation that the whole pipeline needs to produce it. */
static void swap_deadlock_interleaved(PpSchedule *r)
{
    swap(&r[0], find(&r[0], PP_SEND_ACT, 0, 0), find(&r[0], PP_RECV_GRAD, 0, 1));
}
static void backward_first(PpSchedule *r)
{
    swap(&r[3], find(&r[3], PP_FWD, 1, 0), find(&r[3], PP_BWD, 1, 0));
}
static void wrong_peer(PpSchedule *r) { r[2].ins[find(&r[2], PP_SEND_ACT, 0, 0)].peer = 1; }
static void twice(PpSchedule *r)
{
    int i = find(&r[0], PP_FWD, 0, 0);
    r[0].ins[i + 2] = r[0].ins[i]; /* overwrite F1 with a second F0 */
}
static void no_step(PpSchedule *r) { r[1].n--; }
static void step_first(PpSchedule *r) { swap(&r[2], r[2].n - 1, r[2].n - 2); }
static void early_reduce(PpSchedule *r) { swap(&r[0], r[0].n - 2, find(&r[0], PP_BWD, 3, 0)); }
static void bad_chunk(PpSchedule *r) { r[1].ins[0].chunk = 2; }
/* MPI keeps the order of one channel; taking activation 1 before 0 is a bug. */
static void out_of_order(PpSchedule *r)
{
    swap(&r[1], find(&r[1], PP_RECV_ACT, 0, 0), find(&r[1], PP_RECV_ACT, 1, 0));
}

static void test_broken(void)
{
    expect_broken("dropped receive", SCHED_1F1B, 4, 8, 1, drop_recv_act,
                  "forward before its input activation was received");
    expect_broken("dropped send", SCHED_1F1B, 4, 8, 1, drop_send_act, "deadlock");
    expect_broken("dropped send names the waiter", SCHED_1F1B, 4, 8, 1, drop_send_act,
                  "rank 2 waits at instruction");
    expect_broken("dropped gradient receive", SCHED_GPIPE, 4, 5, 1, drop_recv_grad,
                  "backward before its output gradient was received");
    expect_broken("dropped gradient send", SCHED_1F1B, 4, 8, 1, drop_send_grad, "deadlock");
    expect_broken("swapped send and receive", SCHED_1F1B, 2, 2, 1, swap_deadlock, "deadlock");
    expect_broken("swapped, interleaved", SCHED_INTERLEAVED, 4, 8, 2, swap_deadlock_interleaved,
                  "deadlock");
    expect_broken("backward before forward", SCHED_1F1B, 4, 8, 1, backward_first,
                  "backward before its forward");
    expect_broken("wrong peer", SCHED_1F1B, 4, 8, 1, wrong_peer, "peer should be rank 3");
    expect_broken("forward twice", SCHED_1F1B, 4, 8, 1, twice, "second time");
    expect_broken("no optimizer step", SCHED_1F1B, 4, 8, 1, no_step, "without the optimizer step");
    expect_broken("step before reduce", SCHED_1F1B, 4, 8, 1, step_first,
                  "without the gradient reduction");
    expect_broken("reduce before the last backward", SCHED_1F1B, 4, 8, 1, early_reduce,
                  "before the backward of mb");
    expect_broken("chunk out of range", SCHED_1F1B, 4, 8, 1, bad_chunk, "out of range");
    expect_broken("receives out of order", SCHED_GPIPE, 2, 2, 1, out_of_order,
                  "received out of order: it is activation number 1 from rank 0");

    /* lists of different shapes are refused */
    PpSchedule r[2];
    char err[CFG_ERR];
    PpSimResult res;
    CHECK(pp_schedule_build(&r[0], SCHED_1F1B, 2, 0, 4, 1, err) == 0, "%s", err);
    CHECK(pp_schedule_build(&r[1], SCHED_1F1B, 2, 1, 5, 1, err) == 0, "%s", err);
    CHECK(pp_simulate(r, 2, UNIT, &res, err) == -1 && strstr(err, "list 1"), "mixed m accepted: %s",
          err);
    pp_schedule_free_all(r, 2);
}

static void expect_build_error(ScheduleKind kind, int pp, int rank, int m, int v, const char *want)
{
    PpSchedule s;
    char err[CFG_ERR] = "";
    int rc = pp_schedule_build(&s, kind, pp, rank, m, v, err);
    CHECK(rc == -1 && strstr(err, want),
          "build(%d, pp %d, rank %d, m %d, v %d): rc %d '%s', "
          "want '%s'",
          (int)kind, pp, rank, m, v, rc, err, want);
    CHECK(s.ins == NULL && s.n == 0, "a failed build leaves the schedule empty");
    if (!rc)
        pp_schedule_free(&s);
}

static void test_bad_arguments(void)
{
    expect_build_error(SCHED_GPIPE, 4, 0, 8, 2, "need the interleaved schedule");
    expect_build_error(SCHED_1F1B, 4, 0, 8, 2, "need the interleaved schedule");
    expect_build_error(SCHED_1F1B, 4, 4, 8, 1, "outside 0..3");
    expect_build_error(SCHED_1F1B, 4, 0, 0, 1, "at least one");
    expect_build_error(SCHED_INTERLEAVED, 4, 0, 8, 0, "virtual stages 0");
    expect_build_error(SCHED_1F1B, 0, 0, 8, 1, "pipeline size 0");
}

/* The printed summary carries the bubble next to its formula. */
static void test_print(void)
{
    PpSchedule r[4];
    char err[CFG_ERR], out[8192] = "";
    PpSimResult res;
    if (pp_schedule_build_all(r, SCHED_INTERLEAVED, 4, 8, 2, err) ||
        pp_simulate(r, 4, UNIT, &res, err)) {
        CHECK(0, "%s", err);
        return;
    }
    FILE *f = fmemopen(out, sizeof out - 1, "w");
    pp_schedule_print(f, r, 4, &res, 0);
    fclose(f);
    /* (p-1)/(v m + p-1) = 3/19 = 15.79%; (p-1)/(v m) = 3/16 = 0.1875 */
    CHECK(strstr(out, "rank 0: F0.0 F1.0 F2.0 F3.0 F0.1") != NULL, "print:\n%s", out);
    CHECK(strstr(out, "15.79% of the step (formula (p-1)/(v*m+p-1) = 15.79%)") != NULL,
          "print:\n%s", out);
    CHECK(strstr(out, "0.1875 of the ideal time") != NULL, "print:\n%s", out);
    char d[128];
    pp_instr_describe(&r[0].ins[find(&r[0], PP_RECV_ACT, 5, 1)], d, sizeof d);
    CHECK(!strcmp(d, "recv-act mb 5 chunk 1 from rank 3"), "describe: '%s'", d);
    char tiny[8];
    pp_schedule_format(&r[0], 1, tiny, sizeof tiny);
    CHECK(strlen(tiny) == 7, "format truncates to the buffer: '%s'", tiny);
    pp_sim_free(&res);
    pp_schedule_free_all(r, 4);
}

int main(void)
{
    test_hand_schedules();
    test_interleaved_peers();
    test_timeline_by_hand();
    test_grid();
    test_broken();
    test_bad_arguments();
    test_print();
    return check_summary("schedule_pp");
}
