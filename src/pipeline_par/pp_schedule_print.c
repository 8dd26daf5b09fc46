/* pp_schedule_print.c — schedules in words: one line per rank, and the bubble
 * and activation memory a simulation measured next to the formulas. */
#include "pipeline_par/pp_schedule.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const char *const OP_NAMES[PP_OPS] = {
    [PP_FWD] = "fwd",
    [PP_BWD] = "bwd",
    [PP_SEND_ACT] = "send-act",
    [PP_RECV_ACT] = "recv-act",
    [PP_SEND_GRAD] = "send-grad",
    [PP_RECV_GRAD] = "recv-grad",
    [PP_REDUCE] = "reduce",
    [PP_STEP] = "step",
};

/* Short forms of the compact rendering: F/B compute, < receive, > send. */
static const char *const OP_TOKENS[PP_OPS] = {
    [PP_FWD] = "F",        [PP_BWD] = "B",        [PP_SEND_ACT] = ">a", [PP_RECV_ACT] = "<a",
    [PP_SEND_GRAD] = ">g", [PP_RECV_GRAD] = "<g", [PP_REDUCE] = "R",    [PP_STEP] = "S",
};

const char *pp_op_name(PpOp op) { return (unsigned)op < PP_OPS ? OP_NAMES[op] : "?"; }

const char *pp_schedule_name(ScheduleKind kind)
{
    switch (kind) {
    case SCHED_1F1B:
        return "1f1b";
    case SCHED_INTERLEAVED:
        return "interleaved";
    case SCHED_GPIPE:
        return "gpipe";
    }
    return "?";
}

void pp_instr_describe(const PpInstr *in, char *buf, size_t len)
{
    const char *name = pp_op_name(in->op);
    if (in->op == PP_REDUCE || in->op == PP_STEP || (unsigned)in->op >= PP_OPS)
        snprintf(buf, len, "%s", name);
    else if (in->op == PP_FWD || in->op == PP_BWD)
        snprintf(buf, len, "%s mb %d chunk %d", name, in->mb, in->chunk);
    else
        snprintf(buf, len, "%s mb %d chunk %d %s rank %d", name, in->mb, in->chunk,
                 in->op == PP_SEND_ACT || in->op == PP_SEND_GRAD ? "to" : "from", in->peer);
}

/* Append to buf[*at..len) without overflowing; buf stays terminated. */
static void append(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
    if (*at + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, len - *at, fmt, ap);
    va_end(ap);
    if (n > 0)
        *at = *at + (size_t)n < len ? *at + (size_t)n : len - 1;
}

void pp_schedule_format(const PpSchedule *s, int with_comm, char *buf, size_t len)
{
    size_t at = 0;
    if (len)
        buf[0] = '\0';
    for (int i = 0; i < s->n; i++) {
        const PpInstr *in = &s->ins[i];
        int compute = in->op == PP_FWD || in->op == PP_BWD;
        if (!compute && !with_comm)
            continue;
        const char *sep = at ? " " : "";
        const char *tok = (unsigned)in->op < PP_OPS ? OP_TOKENS[in->op] : "?";
        if (in->op == PP_REDUCE || in->op == PP_STEP)
            append(buf, len, &at, "%s%s", sep, tok);
        else if (s->v > 1)
            append(buf, len, &at, "%s%s%d.%d", sep, tok, in->mb, in->chunk);
        else
            append(buf, len, &at, "%s%s%d", sep, tok, in->mb);
    }
}

static void print_bubble(FILE *f, const PpSchedule *s, const PpSimResult *sim)
{
    int v = s->kind == SCHED_INTERLEAVED ? s->v : 1;
    double frac = pp_bubble_fraction(s->pp, s->m, v), ratio = pp_bubble_ratio(s->pp, s->m, v);
    fprintf(f,
            "timing model: forward %g, backward %g per micro-batch and stage, free "
            "communication: step %.4g, ideal %.4g\n",
            sim->cost.fwd, sim->cost.bwd, sim->step_time, sim->ideal_time);
    fprintf(f,
            "bubble: %.2f%% of the step (formula (p-1)/(v*m+p-1) = %.2f%%); "
            "%.4f of the ideal time (paper (p-1)/(v*m) = %.4f)\n",
            100 * sim->bubble, 100 * frac, sim->bubble_ratio, ratio);
    fprintf(f, "peak in-flight micro-batches per rank (forward done, backward not):");
    for (int r = 0; r < s->pp; r++) {
        if (s->v > 1)
            fprintf(f, " %.3g", (double)sim->peak_inflight[r] / s->v);
        else
            fprintf(f, " %d", sim->peak_inflight[r]);
    }
    if (s->v > 1)
        fprintf(f, "\n  (in passes through one chunk, 1/%d of a stage's activations each:", s->v);
    for (int r = 0; s->v > 1 && r < s->pp; r++)
        fprintf(f, " %d", sim->peak_inflight[r]);
    fprintf(f, "%s\n", s->v > 1 ? ")" : "");
    if (s->kind == SCHED_INTERLEAVED && s->v > 1 && s->m % s->pp)
        fprintf(f,
                "note: pp %d does not divide %d micro-batches, so the last group of "
                "micro-batches is smaller and the bubble exceeds the formula\n",
                s->pp, s->m);
}

void pp_schedule_print(FILE *f, const PpSchedule *ranks, int pp, const PpSimResult *sim,
                       int with_comm)
{
    const PpSchedule *s0 = &ranks[0];
    fprintf(f, "pipeline schedule %s: pp %d, %d micro-batches, %d chunk%s per rank\n",
            pp_schedule_name(s0->kind), pp, s0->m, s0->v, s0->v > 1 ? "s" : "");
    fprintf(f, "  F<mb>%s forward, B<mb>%s backward%s\n", s0->v > 1 ? ".<chunk>" : "",
            s0->v > 1 ? ".<chunk>" : "",
            with_comm ? "; <a/<g receive, >a/>g send activation/gradient; R reduce, S step" : "");
    int width = pp > 10 ? 2 : 1;
    for (int r = 0; r < pp; r++) {
        size_t len = (size_t)ranks[r].n * 16 + 1;
        char *line = trd_malloc(len, "schedule line");
        pp_schedule_format(&ranks[r], with_comm, line, len);
        fprintf(f, "rank %*d: %s\n", width, r, line);
        free(line);
    }
    if (sim)
        print_bubble(f, s0, sim);
}
