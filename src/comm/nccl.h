/* nccl.h — NCCL communicators for src/comm, implemented in kernels/nccl.cu
 * (nvcc with the real NCCL, or the CPU emulation of kernels/emu, where NCCL
 * is played by MPI).  comm.c is the only caller: the rest of trident sees
 * comm.h, whatever carries its bytes.
 *
 * Ordering.  Each communicator has a stream of its own.  An operation
 * first makes that stream wait for everything issued so far on the
 * backend's compute stream (its input is ready, its output buffer free),
 * then runs, then records a completion event.  The host never waits:
 * comm_nccl_wait makes the compute stream wait for the event, so work
 * issued after it sees the result; comm_nccl_test asks whether the event
 * has passed.  Gradient reduction on the communicator's stream thus
 * overlaps the backward kernels issued after it.
 *
 * Every call is checked; a failure aborts every communicator
 * (ncclCommAbort) and ends the job with NCCL's reason (trd_fatal, exit 1).
 *
 * Faults that come later (a peer gone, a network error: NCCL's
 * asynchronous errors) and operations that never finish are found by
 * comm_nccl_fault and comm_nccl_pending, which any thread may call (the
 * watchdog's, while the main thread waits); comm_nccl_abort_all aborts
 * every communicator so that no kernel stays stuck on the GPU when the job
 * ends (docs/reliability.md, "NCCL").  Only built with TRD_HAVE_NCCL. */
#ifndef TRD_COMM_NCCL_H
#define TRD_COMM_NCCL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommNccl CommNccl;     /* a communicator, its stream and rank */
typedef struct CommNcclOp CommNcclOp; /* an operation in flight (its event) */

/* The bytes of an NCCL unique id (rank 0 makes one, every rank gets it). */
enum { COMM_NCCL_ID_BYTES = 128 };
void comm_nccl_unique_id(unsigned char id[COMM_NCCL_ID_BYTES]);
/* Collective over the nranks ranks that pass the same id. */
CommNccl *comm_nccl_init(const unsigned char id[COMM_NCCL_ID_BYTES], int nranks, int rank);
/* Collective over parent: the ranks with the same color >= 0 form one new
 * communicator, ordered by key; color < 0 joins none and gets NULL. */
CommNccl *comm_nccl_split(CommNccl *parent, int color, int key);
void comm_nccl_free(CommNccl *c);
/* What c connects, for messages: "group dp (ranks 0,1)". */
void comm_nccl_set_label(CommNccl *c, const char *label);

/* Any thread.  1, with "NCCL reports an asynchronous error on group dp
 * (ranks 0,1): REASON; its last operation: all-reduce" in buf, when a live
 * communicator has one (ncclCommGetAsyncError); else 0. */
int comm_nccl_fault(char *buf, size_t n);
/* Any thread.  1, with "NCCL all-reduce on group dp (ranks 0,1) has not
 * completed on the GPU" (or "... has not returned", when the call itself
 * blocks) in buf, when a communicator's last operation is unfinished. */
int comm_nccl_pending(char *buf, size_t n);
/* Any thread: ncclCommAbort on every live communicator (they are not
 * usable afterwards; the job is ending). */
void comm_nccl_abort_all(void);

/* Sum (or max) all-reduce of n floats in place. */
CommNcclOp *comm_nccl_allreduce(CommNccl *c, float *buf, size_t n, int max);
/* In place over `size` blocks of n floats: all-gather (this rank's block
 * holds its part) and reduce-scatter (the sum of block `rank` lands in
 * buf[0, n)); see comm_allgather_block_f32 and comm_reduce_scatter_block_f32. */
CommNcclOp *comm_nccl_allgather_block(CommNccl *c, float *buf, size_t n);
CommNcclOp *comm_nccl_reduce_scatter_block(CommNccl *c, float *buf, size_t n);
/* Uneven parts (the ZeRO ranges of comm.h): rank r's part is counts[r]
 * floats at displs[r] of a buffer of the whole range.  reduce_parts sums
 * every rank's `send` part by part and leaves this rank's part in recv;
 * gather_parts gives every rank all the parts in `out`, this rank's coming
 * from `mine` (which may be its place in out). */
CommNcclOp *comm_nccl_reduce_parts(CommNccl *c, const float *send, float *recv, const int *counts,
                                   const int *displs);
CommNcclOp *comm_nccl_gather_parts(CommNccl *c, const float *mine, float *out, const int *counts,
                                   const int *displs);
/* All-to-all of uneven parts: part q of send (scount[q] floats at
 * sdispl[q]) goes to rank q, which receives it at rdispl[its rank] of its
 * recv (rcount[q] floats come from rank q at rdispl[q]); this rank's own
 * part is a device copy.  One group of sends and receives, as NCCL has no
 * all-to-all-v (see comm_alltoallv_f32). */
CommNcclOp *comm_nccl_alltoallv(CommNccl *c, const float *send, const size_t *scount,
                                const size_t *sdispl, float *recv, const size_t *rcount,
                                const size_t *rdispl);
/* Point to point within c. */
CommNcclOp *comm_nccl_send(CommNccl *c, const float *buf, size_t n, int peer);
CommNcclOp *comm_nccl_recv(CommNccl *c, float *buf, size_t n, int peer);

/* The compute stream waits for op (host returns at once); op is released. */
void comm_nccl_wait(CommNcclOp *op);
/* 1, and op released, when op has completed on the GPU; else 0. */
int comm_nccl_test(CommNcclOp *op);
/* op's completion event (a cudaEvent_t, for the backend's copy stream to
 * wait for: Backend.to_host_async); op stays in flight. */
const void *comm_nccl_op_event(const CommNcclOp *op);
/* c's later operations also wait for event e (a backend event:
 * Backend.to_backend_copy's), besides the compute stream's work. */
void comm_nccl_after(CommNccl *c, const void *e);

#ifdef __cplusplus
}
#endif

#endif
