/* pp_schedule.c — the instruction lists of 1F1B, interleaved 1F1B and GPipe.
 *
 * All three are built the same way.  A rank's forwards form one sequence
 * fwd[0..mv-1] of (mb, chunk) pairs and its backwards another, bwd[0..mv-1];
 * the rank runs `warm-up` forwards, then alternates one forward and one
 * backward (steady state), then runs the backwards that are left (cool-down).
 * The kinds differ only in the two sequences and the warm-up length. */
#include "pipeline_par/pp_schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct {
    int mb, chunk;
} MbChunk;

/* The k-th forward (bwd = 0) or backward (bwd = 1) of a rank.  Micro-batches
 * go in groups of pp (the last group may be smaller): a group passes through
 * chunk 0 of every rank, then chunk 1, and so on, which keeps every rank busy
 * while the group travels round the pp * v stage pipeline.  Backwards take the
 * chunks in reverse.  With v = 1 this is simply micro-batch k. */
static MbChunk nth_pass(int pp, int m, int v, int k, int bwd)
{
    int full = m / pp; /* groups of exactly pp micro-batches */
    int first, size;   /* the group of k */
    if (k < full * pp * v) {
        first = k / (pp * v) * pp;
        size = pp;
        k %= pp * v;
    } else {
        first = full * pp;
        size = m - first;
        k -= full * pp * v;
    }
    MbChunk p = {first + k % size, k / size};
    if (bwd)
        p.chunk = v - 1 - p.chunk;
    return p;
}

/* Forwards a rank runs before its first backward.  1F1B: pp - rank - 1, the
 * micro-batches that are still on their way to the last stage when the first
 * one comes back.  This bounds the activations held at pp - rank.
 * Interleaved: the same, plus the forwards of the first group through chunks
 * 0..v-2, which come before that group's first pass through chunk v - 1,
 * where the first backward starts.  (Megatron-LM warms up with 2 (pp - rank -
 * 1) + (v - 1) pp, to hide the latency of its paired blocking send/receive
 * calls.  With non-blocking sends the shorter warm-up gives the same bubble
 * and holds fewer activations; see docs/pipeline.md.)  GPipe: all of them. */
static int warmup_count(ScheduleKind kind, int pp, int rank, int m, int v)
{
    int w = m * v;
    if (kind != SCHED_GPIPE) {
        int group = m < pp ? m : pp;
        int need = (pp - rank - 1) + (v - 1) * group;
        if (need < w)
            w = need;
    }
    return w;
}

static void emit(PpSchedule *s, PpOp op, int mb, int chunk, int peer)
{
    TRD_ASSERT(s->n < s->cap);
    s->ins[s->n++] = (PpInstr){op, mb, chunk, peer};
}

/* Receive the input (unless this is stage 0, which reads the data), compute,
 * and post the output to the next stage (unless this is the last stage,
 * whose output goes into the loss). */
static void emit_forward(PpSchedule *s, MbChunk p)
{
    int g = pp_stage(s->pp, s->rank, p.chunk), last = s->pp * s->v - 1;
    if (g > 0)
        emit(s, PP_RECV_ACT, p.mb, p.chunk, (g - 1) % s->pp);
    emit(s, PP_FWD, p.mb, p.chunk, -1);
    if (g < last)
        emit(s, PP_SEND_ACT, p.mb, p.chunk, (g + 1) % s->pp);
}

/* The mirror image: the last stage starts backward from its own loss. */
static void emit_backward(PpSchedule *s, MbChunk p)
{
    int g = pp_stage(s->pp, s->rank, p.chunk), last = s->pp * s->v - 1;
    if (g < last)
        emit(s, PP_RECV_GRAD, p.mb, p.chunk, (g + 1) % s->pp);
    emit(s, PP_BWD, p.mb, p.chunk, -1);
    if (g > 0)
        emit(s, PP_SEND_GRAD, p.mb, p.chunk, (g - 1) % s->pp);
}

static int check_args(ScheduleKind kind, int pp, int rank, int m, int v, char err[CFG_ERR])
{
    if (kind != SCHED_1F1B && kind != SCHED_INTERLEAVED && kind != SCHED_GPIPE)
        return trd_errorf(err, "unknown pipeline schedule kind %d", (int)kind);
    if (pp < 1)
        return trd_errorf(err, "pipeline size %d must be >= 1", pp);
    if (rank < 0 || rank >= pp)
        return trd_errorf(err, "pipeline rank %d is outside 0..%d", rank, pp - 1);
    if (m < 1)
        return trd_errorf(err, "%d micro-batches: a step needs at least one", m);
    if (v < 1)
        return trd_errorf(err, "virtual stages %d must be >= 1", v);
    if (v > 1 && kind != SCHED_INTERLEAVED)
        return trd_errorf(err, "virtual stages %d > 1 need the interleaved schedule, not %s", v,
                          pp_schedule_name(kind));
    if ((long long)m * v * 6 + 2 > 1 << 28)
        return trd_errorf(err, "%d micro-batches x %d virtual stages is too long a schedule", m, v);
    return 0;
}

int pp_schedule_build(PpSchedule *s, ScheduleKind kind, int pp, int rank, int m, int v,
                      char err[CFG_ERR])
{
    memset(s, 0, sizeof *s);
    if (check_args(kind, pp, rank, m, v, err))
        return -1;
    *s = (PpSchedule){.kind = kind, .pp = pp, .rank = rank, .m = m, .v = v};
    /* At most recv, compute, send per pass, two passes per (mb, chunk). */
    s->cap = m * v * 6 + 2;
    s->ins = trd_malloc((size_t)s->cap * sizeof *s->ins, "pipeline schedule");

    int total = m * v, warm = warmup_count(kind, pp, rank, m, v);
    for (int k = 0; k < warm; k++)
        emit_forward(s, nth_pass(pp, m, v, k, 0));
    for (int k = 0; k < total - warm; k++) {
        emit_forward(s, nth_pass(pp, m, v, warm + k, 0));
        emit_backward(s, nth_pass(pp, m, v, k, 1));
    }
    for (int k = total - warm; k < total; k++)
        emit_backward(s, nth_pass(pp, m, v, k, 1));
    emit(s, PP_REDUCE, -1, -1, -1);
    emit(s, PP_STEP, -1, -1, -1);
    return 0;
}

void pp_schedule_free(PpSchedule *s)
{
    free(s->ins);
    memset(s, 0, sizeof *s);
}

int pp_schedule_build_all(PpSchedule *ranks, ScheduleKind kind, int pp, int m, int v,
                          char err[CFG_ERR])
{
    for (int r = 0; r < pp; r++) {
        if (pp_schedule_build(&ranks[r], kind, pp, r, m, v, err)) {
            pp_schedule_free_all(ranks, r);
            return -1;
        }
    }
    return 0;
}

void pp_schedule_free_all(PpSchedule *ranks, int pp)
{
    for (int r = 0; r < pp; r++)
        pp_schedule_free(&ranks[r]);
}

double pp_bubble_fraction(int pp, int m, int v)
{
    return (double)(pp - 1) / ((double)v * m + pp - 1);
}

double pp_bubble_ratio(int pp, int m, int v) { return (double)(pp - 1) / ((double)v * m); }

/* ---- slots and stages ---- */

int pp_schedule_chunk_slots(const PpSchedule *s, int chunk)
{
    /* open: micro-batches of the chunk that have arrived or been forwarded;
     * closed: those whose backward ran.  Live: [closed, open). */
    int open = 0, closed = 0, widest = 0;
    for (int i = 0; i < s->n; i++) {
        const PpInstr *in = &s->ins[i];
        if (in->chunk != chunk)
            continue;
        if (in->op == PP_RECV_ACT || in->op == PP_FWD) {
            if (in->mb == open)
                open++; /* a new live micro-batch */
            else if (in->mb < closed || in->mb >= open)
                return -1; /* not forward-after-receive */
            if (open - closed > widest)
                widest = open - closed;
        } else if (in->op == PP_BWD) {
            if (in->mb != closed || closed >= open)
                return -1;
            closed++;
        }
    }
    return widest;
}

int pp_schedule_slots(const PpSchedule *s)
{
    int widest = 0;
    for (int c = 0; c < s->v; c++) {
        int n = pp_schedule_chunk_slots(s, c);
        if (n < 0)
            return -1;
        widest = n > widest ? n : widest;
    }
    return widest;
}

void pp_stage_layers(const ModelConfig *m, const TopologyConfig *t, int stage, int *begin, int *end)
{
    if (t->n_stage_layers > 0) {
        *begin = 0;
        for (int s = 0; s < stage; s++)
            *begin += t->stage_layers[s];
        *end = *begin + t->stage_layers[stage];
        return;
    }
    const int n = t->pp * t->virtual_stages;
    const int L = m->layers, base = L / n, extra = L % n;
    *begin = stage * base + (stage < extra ? stage : extra);
    *end = *begin + base + (stage < extra ? 1 : 0);
}

ParamShard pp_rank_shard(const ModelConfig *m, const TopologyConfig *t, int pp_rank, int tp,
                         int tp_rank)
{
    const int pp = t->pp, v = t->virtual_stages;
    ParamShard sh = params_full_shard(m);
    sh.tp = tp;
    sh.tp_rank = tp_rank;
    sh.n_chunks = v;
    for (int c = 0; c < v; c++)
        pp_stage_layers(m, t, pp_stage(pp, pp_rank, c), &sh.chunk[c].begin, &sh.chunk[c].end);
    sh.has_embed = pp_rank == 0;
    sh.has_head = pp_rank == pp - 1;
    return sh;
}
