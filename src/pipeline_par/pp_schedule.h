/* pp_schedule.h — pipeline schedules as data: the instruction list each pipeline
 * rank runs in one optimizer step, a checker that runs all ranks' lists
 * together, and a timing model of the bubble.
 *
 * A schedule is a pure function of (kind, pp, rank, micro-batches m, virtual
 * stages v).  It knows micro-batches and model chunks, never layers.  Rank r
 * of pp holds v model chunks; its local chunk c is the global pipeline stage
 *
 *     g = c * pp + r          (0 <= g < pp * v)
 *
 * so chunk c's activations go to stage g + 1 (rank (r + 1) % pp) and its
 * gradients to stage g - 1 (rank (r - 1 + pp) % pp).  With v = 1 this is the
 * plain pipeline: rank r is stage r.
 *
 * Executor contract (what the order of the instructions assumes):
 *  - instructions run one after another, in list order;
 *  - a send (PP_SEND_ACT, PP_SEND_GRAD) is non-blocking: it is posted and the
 *    rank moves on.  Its buffer stays untouched until the send completes; all
 *    sends of a step complete before PP_REDUCE;
 *  - a receive (PP_RECV_ACT, PP_RECV_GRAD) blocks until the matching send has
 *    been posted by the peer (an executor may post it early as a non-blocking
 *    receive, as long as it waits for it where the instruction stands);
 *  - a message is named by (direction, micro-batch, sending stage): exactly one
 *    send and one receive carry it;
 *  - on each channel (one direction, activations or gradients, from one rank
 *    to another) messages are received in the order they were sent, so one
 *    MPI tag per channel suffices (MPI does not reorder a channel);
 *  - PP_REDUCE (gradient reduction over data-parallel replicas, and the tied
 *    embedding all-reduce) and PP_STEP (optimizer step) come last, once.
 * Under this contract pp_simulate() proves, for a given set of lists, that
 * every receive is matched and no rank waits forever.  See docs/pipeline.md. */
#ifndef TRD_PIPELINE_SCHEDULE_H
#define TRD_PIPELINE_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#include "config/config.h"
#include "model/params.h"

typedef enum {
    PP_FWD = 0,   /* forward of (mb, chunk) */
    PP_BWD,       /* backward of (mb, chunk) */
    PP_SEND_ACT,  /* send chunk's output activation of mb to peer (next stage) */
    PP_RECV_ACT,  /* receive chunk's input activation of mb from peer (previous stage) */
    PP_SEND_GRAD, /* send the gradient of chunk's input of mb to peer (previous stage) */
    PP_RECV_GRAD, /* receive the gradient of chunk's output of mb from peer (next stage) */
    PP_REDUCE,    /* end of step: data-parallel gradient reduction */
    PP_STEP,      /* end of step: optimizer step */
    PP_OPS
} PpOp;

/* One instruction.  mb and chunk (local chunk index, 0..v-1) are -1 for
 * PP_REDUCE and PP_STEP; peer is the pipeline rank of the other end of a send
 * or receive, else -1.  For a send or receive, chunk is this rank's chunk that
 * produced (send) or consumes (receive) the data. */
typedef struct {
    PpOp op;
    int mb;
    int chunk;
    int peer;
} PpInstr;

/* The instruction list of one pipeline rank for one step. */
typedef struct {
    ScheduleKind kind;
    int pp, rank, m, v;
    PpInstr *ins; /* n instructions, room for cap (trd_malloc'ed) */
    int n, cap;
} PpSchedule;

/* Global pipeline stage of local chunk `chunk` on pipeline rank `rank`. */
static inline int pp_stage(int pp, int rank, int chunk) { return chunk * pp + rank; }

/* Build rank `rank`'s list for m micro-batches and v chunks per rank:
 *  - SCHED_1F1B: pp - rank - 1 warm-up forwards, then one forward and one
 *    backward alternately, then the remaining backwards (v must be 1);
 *  - SCHED_INTERLEAVED: v chunks per rank, micro-batches taken in groups of pp
 *    (a smaller last group when pp does not divide m); v = 1 gives 1F1B;
 *  - SCHED_GPIPE: all forwards, then all backwards (v must be 1).
 * Returns 0, or -1 with the reason in err (s is then empty).  Free with
 * pp_schedule_free. */
int pp_schedule_build(PpSchedule *s, ScheduleKind kind, int pp, int rank, int m, int v,
                      char err[CFG_ERR]);
void pp_schedule_free(PpSchedule *s);

/* All pp ranks' lists: ranks[0..pp-1].  On error nothing stays allocated. */
int pp_schedule_build_all(PpSchedule *ranks, ScheduleKind kind, int pp, int m, int v,
                          char err[CFG_ERR]);
void pp_schedule_free_all(PpSchedule *ranks, int pp);

/* ---- checker and timing model ---- */

/* Cost of a forward and a backward of one micro-batch through a whole rank
 * (all its v chunks; one chunk costs 1/v of it).  Communication is free. */
typedef struct {
    double fwd, bwd;
} PpCost;

typedef struct {
    int pp, m, v;
    PpCost cost;         /* the costs simulated */
    double step_time;    /* when the last rank has finished its list */
    double ideal_time;   /* m * (fwd + bwd): one rank's compute, no bubble */
    double bubble;       /* (step_time - ideal_time) / step_time: idle share of the step */
    double bubble_ratio; /* (step_time - ideal_time) / ideal_time: the paper's measure */
    /* per rank, [pp] */
    double *busy;       /* compute time */
    double *finish;     /* time of its last instruction */
    double *idle;       /* (step_time - busy) / step_time */
    int *peak_inflight; /* most (mb, chunk) pairs with forward done, backward not */
    double **start;     /* start[r][i]: when ranks[r].ins[i] began (receive: when
                            the data was there) */
} PpSimResult;

/* Run all ranks' lists together under the executor contract and check them:
 * every send has exactly one matching receive (same direction, micro-batch,
 * stage; peers consistent), received in channel order; each rank runs
 * forward and backward of every (mb, chunk) it owns exactly once, a forward
 * after its activation arrived, a backward after its forward and after its
 * gradient arrived, PP_REDUCE after the last backward and PP_STEP last; and
 * every rank finishes (a rank left waiting is reported as a deadlock).  Also times the
 * step with `cost`.  Returns 0 with res filled (free with pp_sim_free), or -1
 * with the first violation in err (res holds nothing). */
int pp_simulate(const PpSchedule *ranks, int pp, PpCost cost, PpSimResult *res, char err[CFG_ERR]);
void pp_sim_free(PpSimResult *res);

/* The textbook bubble with v chunks (v = 1 for 1F1B and GPipe) and equal
 * stages: idle share of the step (p-1)/(v m + p-1), and relative to the
 * ideal time (p-1)/(v m) (Narayanan et al. 2021). */
double pp_bubble_fraction(int pp, int m, int v);
double pp_bubble_ratio(int pp, int m, int v);

/* ---- printing ---- */

const char *pp_op_name(PpOp op);                 /* "fwd", "recv-act", ... */
const char *pp_schedule_name(ScheduleKind kind); /* "1f1b", "interleaved", "gpipe" */

/* One instruction in words: "recv-act mb 3 chunk 1 from rank 2". */
void pp_instr_describe(const PpInstr *in, char *buf, size_t len);

/* A rank's compute in order, "F0 F1 B0 F2 B1 B2" (with v > 1 "F0.1" is the
 * forward of micro-batch 0 on local chunk 1); with_comm adds the sends and
 * receives ("<a0" receive activation, ">a0" send it, "<g0"/">g0" gradients)
 * and "R S" for reduce and step.  Truncates to len (always terminated). */
void pp_schedule_format(const PpSchedule *s, int with_comm, char *buf, size_t len);

/* Every rank's line, then (when sim is not NULL) the bubble against the
 * formula and the peak in-flight micro-batches per rank. */
void pp_schedule_print(FILE *f, const PpSchedule *ranks, int pp, const PpSimResult *sim,
                       int with_comm);

/* ---- slots and stages ---- */

/* Activation slots per chunk for buffers assigned slot = mb % n: n is the
 * widest window of live micro-batches of one chunk (received or forwarded,
 * backward not yet run) over the list.  Live micro-batches of a chunk are
 * consecutive when forwards and backwards of each chunk go in mb order; if a
 * list breaks that, returns -1 (no slot rule of this form is safe).
 * 1F1B: min(pp - rank, m); GPipe: m. */
int pp_schedule_slots(const PpSchedule *s);
/* The same for one chunk (the widest window of that chunk alone): with
 * v > 1 the first chunk holds more micro-batches than the last. */
int pp_schedule_chunk_slots(const PpSchedule *s, int chunk);

/* Layers [*begin, *end) of model stage `stage` (0 .. pp * virtual_stages - 1):
 * topology.stage_layers, or an even split with the first stages taking one
 * more when it is uneven. */
void pp_stage_layers(const ModelConfig *m, const TopologyConfig *t, int stage, int *begin,
                     int *end);

/* What pipeline rank pp_rank holds: chunk c is model stage c * pp + pp_rank
 * (above), the embeddings on rank 0, the head on the last rank. */
ParamShard pp_rank_shard(const ModelConfig *m, const TopologyConfig *t, int pp_rank, int tp,
                         int tp_rank);

#endif
