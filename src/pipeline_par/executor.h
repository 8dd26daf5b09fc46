/* executor.h — runs one pipeline rank's instruction list (pp_schedule.h) over
 * MPI: the stage's compute through callbacks, activations and gradients as
 * point-to-point messages on the pipeline group, timing per instruction.
 *
 * The executor knows micro-batches, chunks and buffers, never layers: a
 * PpChunkOps is whatever computes a model chunk (the model, a test's toy).
 *
 * Buffer contract.  Every activation or gradient message is act_elems
 * floats.  The stage hands out its buffers through four accessors; the
 * executor calls each exactly once per instruction that needs it, just
 * before using it:
 *   act_in(mb, c)   at PP_RECV_ACT: the receive writes it, then forward(mb, c)
 *                   reads it (the stage keeps it for backward if it needs to);
 *   act_out(mb, c)  before forward(mb, c) on every stage but the last: forward
 *                   writes it, then PP_SEND_ACT sends it;
 *   grad_in(mb, c)  at PP_RECV_GRAD: the receive writes it, backward reads it;
 *   grad_out(mb, c) before backward(mb, c) on every stage but the first:
 *                   backward writes it, then PP_SEND_GRAD sends it.
 * A sent buffer is in flight from its send until MPI completes the send,
 * which may be long after the send instruction.  The executor, not the stage,
 * protects it: before forward(mb, c) it completes every pending send whose
 * buffer overlaps act_out(mb, c); before backward(mb, c) the same for
 * grad_out(mb, c); before a receive, for the buffer received into.  So a stage
 * may reuse one out buffer for every micro-batch, alias grad_out with act_in
 * (in place), and so on, and stay correct; it pays only in waiting.  In
 * return the stage promises:
 *   - forward(mb, c) writes no buffer a send may hold except act_out(mb, c),
 *     backward(mb, c) none except grad_out(mb, c); nothing writes them
 *     outside the callbacks while pp_execute runs;
 *   - act_in / grad_in of (mb, c) do not overlap a buffer still holding data
 *     of another (mb', c') that the stage has yet to read: receives are not
 *     checked against the stage's own liveness.
 * Slots: with buffers assigned slot = mb % n per chunk, n = pp_schedule_slots(s)
 * slots per chunk give every live micro-batch its own act_in / grad_in, and
 * an act_out slot is never reused before its send is matched: act_out(mb) is
 * reused by forward(mb + n), which runs after backward(mb), which (below the
 * last stage) needed grad(mb), which the next stage sent only after it had
 * received act(mb).  (A grad_out slot has no such guarantee; the executor's
 * wait covers it.)
 *
 * Messages go on the pipeline group's communicator with one tag for
 * activations and one for gradients (pp_schedule.h: a channel keeps its order).
 * A peer equal to this rank (interleaved with pp = 1) goes through MPI too.
 * Receives block at their instruction (not posted early), so a receive
 * buffer is written only at its instruction.  Pending sends are tested after
 * every instruction; MPI moves a large message (above MPICH's eager limit)
 * only while a rank is inside MPI, so a long compute can delay a transfer.
 * Waits (receives, completing sends) poll instead of blocking in MPI: they
 * spin 50 us, then nap 20 us between polls, so that a waiting rank leaves its
 * core to ranks that compute (4 ranks on 2 cores spinning in MPI_Recv made a
 * 66 ms toy 1F1B step take 170 ms).
 *
 * A failing MPI call or a message of the wrong length ends the job
 * (comm.h); a schedule that does not fit the group or the stage is reported
 * as an error before anything runs. */
#ifndef TRD_PIPELINE_EXECUTOR_H
#define TRD_PIPELINE_EXECUTOR_H

#include <stddef.h>

#include "comm/comm.h"
#include "pipeline_par/pp_schedule.h"

/* One model chunk per local chunk index c (global stage c * pp + rank). */
typedef struct {
    void *ctx;        /* passed to every callback */
    size_t act_elems; /* floats in every message */
    /* Forward of (mb, c): stage 0 reads its own input, others act_in(mb, c);
     * the last stage computes the loss, others write act_out(mb, c). */
    void (*forward)(void *ctx, int mb, int chunk);
    /* Backward of (mb, c): the last stage starts from its loss, others from
     * grad_in(mb, c); stage 0 ends there, others write grad_out(mb, c). */
    void (*backward)(void *ctx, int mb, int chunk);
    float *(*act_in)(void *ctx, int mb, int chunk);
    float *(*act_out)(void *ctx, int mb, int chunk);
    float *(*grad_in)(void *ctx, int mb, int chunk);
    float *(*grad_out)(void *ctx, int mb, int chunk);
    /* PP_REDUCE and PP_STEP; either may be NULL (the caller does it after
     * pp_execute returns).  Every send has completed before reduce runs. */
    void (*reduce)(void *ctx);
    void (*step)(void *ctx);
} PpChunkOps;

/* One executed instruction, for a timeline (Chrome trace): seconds since
 * PpExecStats.t0.  A receive's span is the time blocked in it; a wait for a
 * send to free the buffer an instruction writes comes before its span (and
 * counts in send_wait_s, not in op_s). */
typedef struct {
    double start, end;
    PpOp op;
    int mb, chunk;
} PpSpan;

/* What a step cost on this rank.  The caller sets spans / span_cap (or NULL /
 * 0 for no timeline); pp_execute resets everything else. */
typedef struct {
    double t0;             /* comm_wtime() when pp_execute began */
    double elapsed_s;      /* t0 to the end of the list */
    double op_s[PP_OPS];   /* per kind: computing (FWD, BWD, REDUCE, STEP), blocked
                              receiving (RECV_*), posting (SEND_*) */
    double send_wait_s;    /* blocked completing sends: before reusing a buffer, before REDUCE */
    double busy_s;         /* compute: op_s[FWD] + op_s[BWD] + op_s[REDUCE] + op_s[STEP] */
    double wait_s;         /* op_s[RECV_ACT] + op_s[RECV_GRAD] + send_wait_s */
    int buffer_waits;      /* computes / receives that found their buffer still in a send */
    PpSpan *spans;         /* the caller's array, or NULL */
    int span_cap, n_spans; /* room, and spans written (the first span_cap instructions) */
} PpExecStats;

/* Run schedule s (this rank's list: s->pp == pp->size, s->rank == pp->rank)
 * with stage st over the pipeline group pp.  Returns 0 after PP_STEP, with
 * stats filled when not NULL, or -1 with the reason in err when s does not
 * fit pp or st (nothing ran).  Collective over pp in the sense that every
 * rank of the group must run its own list of the same (kind, m, v). */
int pp_execute(const PpSchedule *s, const PpChunkOps *st, Comm *pp, PpExecStats *stats,
               char err[CFG_ERR]);

/* The idle share of the step on this rank, (T - busy_s) / T, where T is the
 * longest elapsed_s in the group: the measured counterpart of
 * pp_bubble_fraction when the ranks start together (a barrier before
 * pp_execute) and REDUCE / STEP are short.  Collective over pp. */
double pp_exec_idle_fraction(const PpExecStats *stats, Comm *pp);

#endif
