/* comm.h — communication behind one interface.
 *
 * A Comm is a group of ranks (the world, or a TP/DP/PP group built by
 * src/topology).  Two implementations sit behind these functions: MPI for
 * everything, and NCCL (comm_use_nccl, with the CUDA backend) for the float
 * buffers in device memory.  All reductions are sums unless the name says
 * otherwise.  Every call is checked: a failing collective ends the job with
 * the reason (src/core/error.h).
 *
 * Completion under NCCL is stream-ordered (src/comm/nccl.h): an operation
 * runs on the group's own stream after the work the backend issued before
 * it, and "complete" (comm_wait, a blocking call returning) means that work
 * the backend issues afterwards sees its result; the host does not wait.
 * Host memory (doubles, ints, comm_broadcast) always goes through MPI. */
#ifndef TRD_COMM_H
#define TRD_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

struct CommNccl;

/* A point-to-point channel under NCCL (comm_open_channel): messages from
 * src to dst with tag go through a two-rank communicator of their own. */
typedef struct {
    int src, dst, tag;
    struct CommNccl *nccl; /* NULL on the ranks that are neither */
} CommChannel;

/* A group.  `handle` is the MPI communicator as comm.c keeps it (MPICH's
 * handles are ints; comm.c checks that at compile time): opaque here, and
 * the few places that hand it to an MPI-aware library (HDF5's MPI-IO) get
 * it from comm_mpi.h. */
typedef struct {
    int handle;
    int rank, size;
    char name[12];         /* "dp", "tp", ... for traces ("" unless the creator names it) */
    char members[48];      /* its world ranks, "1,3" or "0-7" (",..." when cut), for the
                            * watchdog's messages (core/progress.h) */
    int wfirst, wstride;   /* world rank of group rank r: wfirst + r * wstride (wstride 0:
                            * the group is no arithmetic progression of world ranks) */
    uint64_t bytes_sent;   /* bytes this rank sends under the ring algorithms (all-reduce
                            * 2n(p-1)/p, reduce-scatter and all-gather n(p-1)/p of the
                            * n-element whole), for reports and the benchmarks */
    uint64_t calls;        /* operations this rank started that move data: all-reduce,
                            * reduce-scatter, all-gather, broadcast (one per call, however
                            * MPI chunks it) and sends; not receives, not barriers, and
                            * nothing on a group of one */
    const Backend *mem;    /* NULL: float buffers are host memory; else they are this
                            * (device) backend's and go through host staging buffers */
    struct CommNccl *nccl; /* non-NULL: float buffers go through NCCL instead */
    CommChannel *chan;     /* open point-to-point channels (NCCL only) */
    int n_chan;
} Comm;

/* MPI_Init (asking for MPI_THREAD_MULTIPLE) unless already done; error
 * handlers set so that a failure returns to us and we abort with a message. */
void comm_init(int *argc, char ***argv);
/* MPI_Finalize, once, after the function given to comm_before_finalize
 * (one at a time; NULL: none), which every exit path that finalizes runs:
 * the asynchronous checkpoint writer finishes there. */
void comm_finalize(void);
void comm_before_finalize(void (*fn)(void));
/* End the whole job now with `code` (MPI_Abort of the world): for a rank
 * that cannot agree with the others, such as the watchdog's thread. */
_Noreturn void comm_abort(int code);
/* For the watchdog's thread (any thread may call them).  Under NCCL, 1
 * with a description in buf when a communicator reports an asynchronous
 * error (comm_async_fault) or when its last operation has not finished
 * (comm_unfinished: under NCCL comm_wait returns before the GPU is done,
 * so a stuck collective is found here, not in the rank's open wait);
 * always 0 without NCCL.  comm_abort aborts the NCCL communicators. */
int comm_async_fault(char *buf, size_t n);
int comm_unfinished(char *buf, size_t n);
/* Whether a launcher (mpiexec, srun --mpi=...) started this process as a
 * rank of a job, from its environment; needs no MPI.  For commands that run
 * as one plain process unless launched (prepare-data). */
int comm_launched(void);
/* Seconds on this rank's clock (MPI_Wtime): the time base of traces. */
double comm_wtime(void);
/* Whether MPI runs calls from several threads at once (MPI_THREAD_MULTIPLE). */
int comm_threads(void);
Comm comm_world(void);

/* The sub-group of parent's ranks that pass the same color (MPI_Comm_split),
 * ordered by key.  A color < 0 joins no group: the result has mpi =
 * MPI_COMM_NULL, rank -1, size 0.  Collective over parent. */
Comm comm_split(const Comm *parent, int color, int key);
/* A communicator of the same ranks whose messages never match c's (for a
 * thread of its own beside the main one); host memory only (no NCCL).
 * Collective over c; free with comm_free. */
Comm comm_dup(const Comm *c);
/* From now on this thread's calls are not the rank's progress record (the
 * watchdog's) nor spans of its trace: for a helper thread beside the main
 * one, such as the background checkpoint writer. */
void comm_untracked_thread(void);
/* The ranks of parent that share this rank's node (its shared memory),
 * ordered by their rank in parent.  Collective over parent; free with
 * comm_free. */
Comm comm_split_node(const Comm *parent);
/* Free a communicator made by comm_split (no-op for MPI_COMM_NULL and the world). */
void comm_free(Comm *c);
/* Name a group for traces (truncated to 11 characters). */
void comm_set_name(Comm *c, const char *name);
/* From now on the float buffers given to c's *_f32 calls live in be's memory.
 * For a device backend (be->device) they are staged through host memory:
 * copied to the host before MPI sees them, and back once an operation
 * completes (at comm_wait / comm_test); MPI here is not CUDA-aware.  Host
 * backends change nothing.  Doubles and ints are always host memory. */
void comm_use_memory(Comm *c, const Backend *be);

/* NCCL for the float buffers of the world and of groups[0..n) (device
 * memory: call comm_use_memory first).  Collective over the world: every
 * rank passes its own groups of the same kinds in the same order (a rank
 * outside a group passes it with MPI_COMM_NULL).  Groups split later from
 * these (comm_split) get NCCL too.  Dies with a message when trident was
 * built without NCCL. */
void comm_use_nccl(Comm *world, Comm *const *groups, int n);
/* Whether completion is stream-ordered (NCCL) rather than host-visible. */
int comm_stream_ordered(const Comm *c);
/* Under NCCL, messages from src to dst with tag get a channel of their own
 * (its own communicator and stream), so traffic in one direction never
 * queues behind the other: NCCL's sends wait for their receives, and a
 * pipeline's activations and gradients cross in opposite directions.
 * Collective over c: every rank calls it with the same arguments in the
 * same order; a channel already open is left as it is.  Does nothing with
 * MPI, whose tags already keep channels apart. */
void comm_open_channel(Comm *c, int src, int dst, int tag);

/* The staging buffers of this process (one pool, reused across operations
 * and groups): how many were ever allocated, and the bytes held now. */
typedef struct {
    uint64_t allocations;
    size_t bytes;
} CommStaging;
CommStaging comm_staging(void);
/* Release the pooled buffers (before the backend goes away). */
void comm_staging_free(void);

void comm_allreduce_f32(Comm *c, float *buf, size_t n);
void comm_allreduce_f64(Comm *c, double *buf, size_t n);
void comm_allreduce_max_i32(Comm *c, int *buf, size_t n);
void comm_broadcast(Comm *c, void *buf, size_t bytes, int root);
/* Every rank's `bytes` bytes from mine, in rank order, into all (size *
 * bytes) on every rank. */
void comm_allgather_bytes(Comm *c, const void *mine, void *all, size_t bytes);
/* Each rank's byte count may differ: returns a malloc'ed buffer of all
 * ranks' bytes in rank order (total in *total; counts[r], when counts is not
 * NULL, room for size ints, gets rank r's count). */
void *comm_allgatherv_bytes(Comm *c, const void *mine, size_t bytes, size_t *total, int *counts);
void comm_allreduce_min_i32(Comm *c, int *buf, size_t n);
void comm_allreduce_sum_u64(Comm *c, uint64_t *buf, size_t n);

/* ---- non-blocking, over flat sharded buffers (data parallelism, ZeRO) ----
 * A buffer of n elements is sharded in blocks of S = ceil(n / size)
 * elements: rank r owns [r*S, (r+1)*S).  The *_range collectives work on a
 * range [lo, hi) of such a buffer; each rank's part of it is the
 * intersection with its block (possibly empty). */
typedef struct {
    int req;     /* the MPI request (opaque, as Comm.handle); none once complete */
    int *counts; /* v-collective counts and displacements, live until completion */
    /* Under a trace (comm/trace.h): the collective's span name, issue time
     * and bytes, recorded when wait or test sees it complete. */
    char what[32];
    double t0;
    uint64_t bytes;
    /* Host staging (comm_use_memory): MPI works on `host`; on completion
     * back_n floats from host + back_off are copied to `back` (device
     * memory, NULL for none) and host goes back to the staging pool. */
    float *host, *back;
    size_t back_off, back_n;
    const Backend *mem;
    struct CommNcclOp *op; /* NCCL: the operation in flight */
    /* What a wait on it waits for (core/progress.h): op name, group, peer
     * world rank of a send (-1: none); op NULL for nothing in flight. */
    const char *wait_op;
    const Comm *group;
    int peer;
} CommHandle;

/* A handle with nothing in flight: waiting on it returns at once. */
CommHandle comm_handle_none(void);
/* No group: what comm_split gives a rank that joins none (rank -1, size 0). */
Comm comm_none(void);
/* Whether c is a group this rank belongs to (not comm_none). */
int comm_is_member(const Comm *c);

/* The part of [lo, hi) that `rank` owns, as [*a, *b). */
void comm_shard_part(size_t lo, size_t hi, size_t S, int rank, size_t *a, size_t *b);

/* The bytes one of p ranks sends for `passes` ring passes over n floats
 * (all-reduce 2, reduce-scatter and all-gather 1): what bytes_sent counts,
 * and what the planner predicts. */
uint64_t comm_ring_bytes(size_t n, int passes, int p);

/* Sum all-reduce of buf[0..n) in place. */
CommHandle comm_iallreduce_f32(Comm *c, float *buf, size_t n);
/* Sum all-reduce of counters in place (host memory), e.g. a progress
 * report gathered while work goes on. */
CommHandle comm_iallreduce_sum_u64(Comm *c, uint64_t *buf, size_t n);
/* Reduce-scatter: send holds [lo, hi) of every rank's buffer; this rank
 * receives the sum of its part into recv (comm_shard_part's length). */
CommHandle comm_ireduce_scatter_range_f32(Comm *c, const float *send, float *recv, size_t lo,
                                          size_t hi, size_t S);
/* All-gather: every rank contributes its part of [lo, hi) from `mine`; out
 * receives all of [lo, hi).  `mine` may point into out (in place). */
CommHandle comm_iallgather_range_f32(Comm *c, const float *mine, float *out, size_t lo, size_t hi,
                                     size_t S);
/* Complete an operation; returns at once for a completed handle.  (NCCL:
 * the backend's later work waits for it; the host does not.) */
void comm_wait(CommHandle *h);
/* Drive MPI progress and report whether the operation completed (1).
 * (NCCL: whether it has finished on the GPU.) */
int comm_test(CommHandle *h);
/* Under NCCL, the event h's operation records on its stream when it is
 * done, while it is in flight (not yet waited for): a copy on the
 * backend's copy stream may wait for it (Backend.to_host_async) without
 * the compute stream waiting; h must still be waited for (comm_wait).
 * NULL otherwise: under MPI an operation's result is in backend memory
 * once comm_wait or comm_test completes it (staged results come back on
 * the compute stream), and a completed handle needs nothing. */
const void *comm_done_event(const CommHandle *h);
/* c's operations issued from now on read their input after event e (a
 * backend event, Backend.to_backend_copy's): under NCCL c's stream waits
 * for it and the compute stream does not; otherwise (MPI stages through
 * the host on the compute stream; a group of one copies there) the
 * compute stream waits for it. */
void comm_after(Comm *c, const void *e);
void comm_barrier(Comm *c);

/* ---- blocking, over equal contiguous blocks (tensor/sequence parallelism) ----
 * Rank r's block is buf[r*n, (r+1)*n): n elements per rank, size*n in all. */

/* Max all-reduce of floats in place (row maxima of vocabulary-parallel logits). */
void comm_allreduce_max_f32(Comm *c, float *buf, size_t n);
/* All-gather in place: on entry this rank's block holds its n elements; on
 * return every block holds its rank's. */
void comm_allgather_block_f32(Comm *c, float *buf, size_t n);
/* Reduce-scatter in place: buf holds size*n elements on every rank; on return
 * buf[0, n) holds the sum over ranks of block `rank` (the rest is garbage). */
void comm_reduce_scatter_block_f32(Comm *c, float *buf, size_t n);

/* ---- point to point (pipeline activations and gradients) ----
 * A send is non-blocking: buf must stay unmodified until comm_wait or
 * comm_test reports the handle complete.  Its bytes count in bytes_sent.
 * The receive blocks until the whole message is in buf; a message of any
 * other length than n floats ends the job (a schedule or stage bug; NCCL
 * cannot tell, both sides must agree on n). */
CommHandle comm_isend_f32(Comm *c, const float *buf, size_t n, int dest, int tag);
void comm_recv_f32(Comm *c, float *buf, size_t n, int src, int tag);
/* Whether a message from src with tag is waiting to be received (never
 * blocks); moves MPI along.  Lets a caller wait without spinning in MPI.
 * Under NCCL always 1: a receive is queued on a stream, it never blocks. */
int comm_probe(Comm *c, int src, int tag);

/* ---- all-to-all (expert parallelism: tokens to their experts and back) ----
 * Blocking.  comm_alltoall_i32: every rank sends n ints to every rank,
 * send[q*n, (q+1)*n) to rank q, and receives rank p's into recv[p*n, ...)
 * (the counts of the v-exchange below, exchanged first).
 * comm_alltoallv_f32: rank q gets scount[q] floats of send from sdispl[q];
 * rank p's rcount[p] floats land at recv + rdispl[p] (each side's counts
 * must agree with the other's; the receive parts tile recv from 0, as
 * prefix sums of the counts do).  With NCCL the parts go device to device,
 * one group of sends and receives (comm_nccl_alltoallv), the compute
 * stream waiting for it on the GPU; under MPI float buffers in device
 * memory are staged through the host.  The counts (host ints) always go
 * through MPI.  bytes_sent counts the floats sent to other ranks. */
void comm_alltoall_i32(Comm *c, const int *send, int *recv, size_t n);
void comm_alltoallv_f32(Comm *c, const float *send, const size_t *scount, const size_t *sdispl,
                        float *recv, const size_t *rcount, const size_t *rdispl);

/* Max all-reduce of doubles in place (the slowest rank's time of a step). */
void comm_allreduce_max_f64(Comm *c, double *buf, size_t n);

#endif
