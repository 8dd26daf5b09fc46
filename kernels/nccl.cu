/* nccl.cu — NCCL communicators for src/comm (interface and ordering rules in
 * src/comm/nccl.h).  Each communicator owns a non-blocking stream; every
 * operation is fenced in by two events: `ready` (recorded on the compute
 * stream, waited for by the communicator's stream) and the op's own `done`
 * (recorded after it, waited for by the compute stream at comm_nccl_wait).
 * With the emulation (kernels/emu), NCCL is MPI and streams are immediate. */
#include "common.cuh"

#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "comm/nccl.h"
}

static_assert(sizeof(ncclUniqueId) == COMM_NCCL_ID_BYTES, "ncclUniqueId size changed");

/* A failed call aborts every communicator first: the job ends, and no
 * NCCL kernel may stay behind on the GPU waiting for peers. */
#define NCCL_CHECK(call)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            comm_nccl_abort_all();                                                                 \
            trd_fatal(TRD_EXIT_RUNTIME,                                                            \
                      "NCCL_DEBUG=WARN says more; another rank may have failed first",             \
                      "%s:%d: %s: %s", __FILE__, __LINE__, #call, ncclGetErrorString(r_));         \
        }                                                                                          \
    } while (0)

struct CommNccl {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready; /* the compute stream's position when an op is issued */
    int rank, size;
    /* For comm_nccl_fault/pending, read by any thread (a torn read can
     * garble a message, never crash: the strings stay NUL-terminated). */
    char label[128];
    const char *last_op;  /* "all-reduce"..., NULL before the first */
    cudaEvent_t last;     /* recorded after the last op on the stream */
    volatile int issuing; /* inside the NCCL call of last_op */
    CommNccl *next;       /* the live communicators (live, under live_mu) */
};
static CommNccl *live;
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;

/* Ops keep their event; released ones wait in a free list for reuse (the
 * same few are in flight every step, and creating events is not free). */
struct CommNcclOp {
    cudaEvent_t done;
    CommNcclOp *next;
};
static CommNcclOp *free_ops;

static cudaEvent_t new_event(void)
{
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

static CommNccl *wrap(ncclComm_t comm)
{
    CommNccl *c = (CommNccl *)trd_calloc(1, sizeof *c, "NCCL communicator");
    c->comm = comm;
    NCCL_CHECK(ncclCommUserRank(comm, &c->rank));
    NCCL_CHECK(ncclCommCount(comm, &c->size));
    /* Non-blocking: the legacy default stream (cuda_stream) would otherwise
     * wait for it and it for the default stream, and nothing overlaps. */
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
#ifdef TRD_CUDA_EMULATED
    emu_stream_name(c->stream, "comm");
#endif
    c->ready = new_event();
    c->last = new_event();
    snprintf(c->label, sizeof c->label, "a communicator of %d ranks", c->size);
    pthread_mutex_lock(&live_mu);
    c->next = live;
    live = c;
    pthread_mutex_unlock(&live_mu);
    return c;
}

extern "C" void comm_nccl_set_label(CommNccl *c, const char *label)
{
    if (c)
        snprintf(c->label, sizeof c->label, "%s", label);
}

extern "C" int comm_nccl_fault(char *buf, size_t n)
{
    int found = 0;
    pthread_mutex_lock(&live_mu);
    for (CommNccl *c = live; c && !found; c = c->next) {
        ncclResult_t r = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &r) != ncclSuccess)
            continue; /* the query itself failed: nothing to say */
        if (r == ncclSuccess || r == ncclInProgress)
            continue;
        snprintf(buf, n, "NCCL reports an asynchronous error on %s: %s; its last operation: %s",
                 c->label, ncclGetErrorString(r), c->last_op ? c->last_op : "none");
        found = 1;
    }
    pthread_mutex_unlock(&live_mu);
    return found;
}

extern "C" int comm_nccl_pending(char *buf, size_t n)
{
    int found = 0;
    pthread_mutex_lock(&live_mu);
    for (CommNccl *c = live; c && !found; c = c->next) {
        if (!c->last_op)
            continue;
        if (c->issuing)
            snprintf(buf, n, "NCCL %s on %s has not returned", c->last_op, c->label);
        else if (cudaEventQuery(c->last) == cudaErrorNotReady)
            snprintf(buf, n, "NCCL %s on %s has not completed on the GPU", c->last_op, c->label);
        else
            continue;
        found = 1;
    }
    pthread_mutex_unlock(&live_mu);
    return found;
}

extern "C" void comm_nccl_abort_all(void)
{
    /* No lock: the main thread may hold none, but a thread stuck while
     * holding live_mu must not stop the abort (the list only grows at
     * start-up and shrinks at the end). */
    for (CommNccl *c = live; c; c = c->next)
        (void)ncclCommAbort(c->comm);
}

extern "C" void comm_nccl_unique_id(unsigned char id[COMM_NCCL_ID_BYTES])
{
    ncclUniqueId u;
    NCCL_CHECK(ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof u);
}

extern "C" CommNccl *comm_nccl_init(const unsigned char id[COMM_NCCL_ID_BYTES], int nranks,
                                    int rank)
{
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, nranks, u, rank));
    return wrap(comm);
}

extern "C" CommNccl *comm_nccl_split(CommNccl *parent, int color, int key)
{
    ncclComm_t comm = NULL;
    NCCL_CHECK(
        ncclCommSplit(parent->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, NULL));
    return comm ? wrap(comm) : NULL;
}

extern "C" void comm_nccl_free(CommNccl *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&live_mu);
    for (CommNccl **p = &live; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    NCCL_CHECK(ncclCommDestroy(c->comm));
    CUDA_CHECK(cudaEventDestroy(c->last));
    CUDA_CHECK(cudaEventDestroy(c->ready));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    free(c);
}

/* Before an op: c's stream waits for what the compute stream has so far;
 * the op is c's last, and its call is under way. */
static void begin(CommNccl *c, const char *what)
{
    CUDA_CHECK(cudaEventRecord(c->ready, cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->ready, 0));
    c->last_op = what;
    c->issuing = 1;
}

/* After an op: its completion event. */
static CommNcclOp *end(CommNccl *c)
{
    c->issuing = 0;
    CUDA_CHECK(cudaEventRecord(c->last, c->stream));
    CommNcclOp *op = free_ops;
    if (op)
        free_ops = op->next;
    else {
        op = (CommNcclOp *)trd_calloc(1, sizeof *op, "NCCL operation");
        op->done = new_event();
    }
    CUDA_CHECK(cudaEventRecord(op->done, c->stream));
    return op;
}

static void release(CommNcclOp *op)
{
    op->next = free_ops;
    free_ops = op;
}

extern "C" void comm_nccl_wait(CommNcclOp *op)
{
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), op->done, 0));
    release(op);
}

extern "C" int comm_nccl_test(CommNcclOp *op)
{
    cudaError_t e = cudaEventQuery(op->done);
    if (e == cudaErrorNotReady)
        return 0;
    CUDA_CHECK(e);
    release(op);
    return 1;
}

extern "C" const void *comm_nccl_op_event(const CommNcclOp *op) { return op->done; }

extern "C" void comm_nccl_after(CommNccl *c, const void *e)
{
    CUDA_CHECK(cudaStreamWaitEvent(c->stream, (cudaEvent_t)e, 0));
}

extern "C" CommNcclOp *comm_nccl_allreduce(CommNccl *c, float *buf, size_t n, int max)
{
    begin(c, "all-reduce");
    NCCL_CHECK(
        ncclAllReduce(buf, buf, n, ncclFloat32, max ? ncclMax : ncclSum, c->comm, c->stream));
    return end(c);
}

extern "C" CommNcclOp *comm_nccl_allgather_block(CommNccl *c, float *buf, size_t n)
{
    begin(c, "all-gather");
    /* In place: NCCL's send buffer is this rank's block of the result. */
    NCCL_CHECK(ncclAllGather(buf + (size_t)c->rank * n, buf, n, ncclFloat32, c->comm, c->stream));
    return end(c);
}

extern "C" CommNcclOp *comm_nccl_reduce_scatter_block(CommNccl *c, float *buf, size_t n)
{
    begin(c, "reduce-scatter");
    /* In place, NCCL leaves block `rank` where it was; comm.h wants it first. */
    float *mine = buf + (size_t)c->rank * n;
    NCCL_CHECK(ncclReduceScatter(buf, mine, n, ncclFloat32, ncclSum, c->comm, c->stream));
    if (c->rank > 0) /* the ranges do not overlap: mine starts at n or later */
        CUDA_CHECK(
            cudaMemcpyAsync(buf, mine, n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    return end(c);
}

/* NCCL has no v-collectives: a group of rooted ones, one per part (how
 * all-gather-v is done over NCCL elsewhere too).  Parts of zero length are
 * skipped on every rank alike (the counts are the same everywhere). */
extern "C" CommNcclOp *comm_nccl_reduce_parts(CommNccl *c, const float *send, float *recv,
                                              const int *counts, const int *displs)
{
    begin(c, "reduce (ZeRO parts)");
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++)
        if (counts[r] > 0)
            NCCL_CHECK(ncclReduce(send + displs[r], recv, (size_t)counts[r], ncclFloat32, ncclSum,
                                  r, c->comm, c->stream));
    NCCL_CHECK(ncclGroupEnd());
    return end(c);
}

extern "C" CommNcclOp *comm_nccl_gather_parts(CommNccl *c, const float *mine, float *out,
                                              const int *counts, const int *displs)
{
    begin(c, "broadcast (ZeRO parts)");
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++)
        if (counts[r] > 0)
            NCCL_CHECK(ncclBroadcast(r == c->rank ? mine : out + displs[r], out + displs[r],
                                     (size_t)counts[r], ncclFloat32, r, c->comm, c->stream));
    NCCL_CHECK(ncclGroupEnd());
    return end(c);
}

extern "C" CommNcclOp *comm_nccl_alltoallv(CommNccl *c, const float *send, const size_t *scount,
                                           const size_t *sdispl, float *recv, const size_t *rcount,
                                           const size_t *rdispl)
{
    begin(c, "all-to-all");
    NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank)
            continue;
        if (scount[q])
            NCCL_CHECK(ncclSend(send + sdispl[q], scount[q], ncclFloat32, q, c->comm, c->stream));
        if (rcount[q])
            NCCL_CHECK(ncclRecv(recv + rdispl[q], rcount[q], ncclFloat32, q, c->comm, c->stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    const int me = c->rank;
    if (scount[me])
        CUDA_CHECK(cudaMemcpyAsync(recv + rdispl[me], send + sdispl[me], scount[me] * sizeof(float),
                                   cudaMemcpyDeviceToDevice, c->stream));
    return end(c);
}

extern "C" CommNcclOp *comm_nccl_send(CommNccl *c, const float *buf, size_t n, int peer)
{
    begin(c, "send");
    NCCL_CHECK(ncclSend(buf, n, ncclFloat32, peer, c->comm, c->stream));
    return end(c);
}

extern "C" CommNcclOp *comm_nccl_recv(CommNccl *c, float *buf, size_t n, int peer)
{
    begin(c, "receive");
    NCCL_CHECK(ncclRecv(buf, n, ncclFloat32, peer, c->comm, c->stream));
    return end(c);
}
