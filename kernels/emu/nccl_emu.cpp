/* nccl_emu.cpp — NCCL played by MPI for the CPU emulation (see nccl.h here).
 * Every call checks that its buffers are emulated device memory of the
 * sizes its counts imply, opens device memory while MPI touches it, and
 * returns ncclInvalidUsage / ncclSystemError with a line on stderr
 * ("emu: ncclX: ...") when something is wrong. */
#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mpi.h>
#include <string>
#include <unistd.h>
#include <nccl.h>
#include <vector>

/* A communicator, and the send it may have in flight: an NCCL send ends
 * only when its receive has taken the data, and nothing queued after it on
 * the communicator's stream starts before that.  Here the next call on the
 * communicator waits for it (stricter than a GPU, whose host goes on), so a
 * program whose sends and receives cross on one communicator deadlocks
 * here as it would on GPUs. */
struct emu_nccl {
    MPI_Comm mpi;
    int rank, size;
    MPI_Request send;          /* MPI_Issend of send_data, or MPI_REQUEST_NULL */
    std::vector<float> send_data;
    std::atomic<int> async_error{ncclSuccess}; /* a fault's ncclRemoteError */
    std::atomic<int> aborted{0};
};

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return r;
}

static ncclResult_t mpi(int rc, const char *call)
{
    return rc == MPI_SUCCESS ? ncclSuccess : fail(ncclSystemError, "%s: MPI failed", call);
}

/* A wait for MPI that tests for 50 us, then naps 20 us between tests, as
 * src/comm/comm.c waits: MPICH's blocking calls spin, and the emulated
 * ranks outnumber the test machine's cores. */
static int wait_mpi(int rc, MPI_Request *req, MPI_Status *st = MPI_STATUS_IGNORE)
{
    if (rc != MPI_SUCCESS)
        return rc;
    const double t0 = MPI_Wtime();
    for (;;) {
        int done = 0;
        if ((rc = MPI_Test(req, &done, st)) != MPI_SUCCESS || done)
            return rc;
        if (MPI_Wtime() - t0 >= 50e-6)
            usleep(20);
    }
}

/* The stream order: the communicator's send in flight completes first. */
static void drain(ncclComm_t c)
{
    if (c && c->send != MPI_REQUEST_NULL)
        wait_mpi(MPI_SUCCESS, &c->send);
}

/* TRIDENT_EMU_NCCL_FAULT (nccl.h here): whether this call is the one to
 * fail, and how ('e' error, 'h' hang; 0 none). */
static char fault_here(const char *call)
{
    static int parsed;
    static char kind;
    static std::string which;
    static int rank = -1, nth;
    static std::map<std::string, int> calls;
    if (!parsed) {
        parsed = 1;
        const char *s = getenv("TRIDENT_EMU_NCCL_FAULT");
        char k[16] = "", c[64] = "";
        if (s && sscanf(s, "%15[a-z]:%63[A-Za-z]:%d:%d", k, c, &rank, &nth) == 4 &&
            (!strcmp(k, "error") || !strcmp(k, "hang"))) {
            kind = k[0];
            which = c;
        } else if (s && *s)
            fprintf(stderr, "emu: TRIDENT_EMU_NCCL_FAULT=%s: expected KIND:CALL:RANK:N\n", s);
    }
    if (!kind || which != call)
        return 0;
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return me == rank && ++calls[which] == nth ? kind : 0;
}

/* A call in which the fault plays: a hang waits for ncclCommAbort (from
 * another thread) and then fails; an error is reported later, by
 * ncclCommGetAsyncError, as NCCL does. */
static ncclResult_t play_fault(const char *call, ncclComm_t comm)
{
    const char kind = fault_here(call);
    if (kind == 'h') {
        fprintf(stderr, "emu: %s: fault: hangs until ncclCommAbort\n", call);
        while (!comm->aborted)
            usleep(10000);
        return fail(ncclSystemError, "%s: communicator aborted", call);
    }
    if (kind == 'e') {
        fprintf(stderr, "emu: %s: fault: an asynchronous error (ncclRemoteError)\n", call);
        comm->async_error = ncclRemoteError;
    }
    return ncclSuccess;
}

static ncclResult_t check_args(const char *call, ncclDataType_t type, size_t count,
                               ncclComm_t comm)
{
    if (comm && comm->aborted)
        return fail(ncclInvalidUsage, "%s: the communicator was aborted", call);
    drain(comm);
    if (type != ncclFloat32)
        return fail(ncclInvalidArgument, "%s: only float32 is emulated", call);
    if (!comm)
        return fail(ncclInvalidArgument, "%s: NULL communicator", call);
    if (count * (size_t)comm->size > (size_t)INT_MAX)
        return fail(ncclInvalidArgument, "%s: %zu elements: too many for the emulation", call,
                    count);
    return ncclSuccess;
}

static void check_buf(const char *call, const char *what, const void *p, size_t count)
{
    if (count)
        emu_check_device(call, what, p, count * sizeof(float));
}

static MPI_Op mpi_op(ncclRedOp_t op) { return op == ncclMax ? MPI_MAX : MPI_SUM; }

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    case ncclSystemError: return "system error (emulated NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error (emulated NCCL)";
    default: return "error (emulated NCCL)";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    strcpy(id->internal, "emulated");
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    int world = 0, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (strcmp(id.internal, "emulated") != 0)
        return fail(ncclInvalidArgument, "ncclCommInitRank: id not from ncclGetUniqueId");
    if (fault_here("ncclCommInitRank") == 'h') { /* a rank that never joins */
        fprintf(stderr, "emu: ncclCommInitRank: fault: never returns\n");
        for (;;)
            usleep(10000);
    }
    if (nranks != world || rank != me)
        return fail(ncclInvalidUsage, "ncclCommInitRank: the emulation makes only the world "
                    "(rank %d of %d asked; world rank %d of %d)", rank, nranks, me, world);
    emu_nccl *c = new emu_nccl;
    c->mpi = MPI_COMM_NULL, c->rank = rank, c->size = nranks, c->send = MPI_REQUEST_NULL;
    ncclResult_t r = mpi(MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi), "ncclCommInitRank");
    *comm = c;
    return r;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *)
{
    MPI_Comm m = MPI_COMM_NULL;
    drain(comm);
    ncclResult_t r = mpi(MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED
                                                                               : color,
                                        key, &m),
                         "ncclCommSplit");
    *newcomm = NULL;
    if (r == ncclSuccess && m != MPI_COMM_NULL) {
        emu_nccl *c = new emu_nccl;
        c->mpi = m, c->rank = 0, c->size = 0, c->send = MPI_REQUEST_NULL;
        MPI_Comm_rank(m, &c->rank);
        MPI_Comm_size(m, &c->size);
        *newcomm = c;
    }
    return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    drain(comm);
    MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank)
{
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int *count)
{
    *count = comm->size;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    *async_error = (ncclResult_t)comm->async_error.load();
    return ncclSuccess;
}

/* Only marks the communicator: the emulation's calls run in the calling
 * thread, and a hung one returns when it sees the mark.  Its MPI
 * communicator is left to MPI_Abort or the end of the process. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm)
        comm->aborted = 1;
    return ncclSuccess;
}

/* Collectives run at once; every rank makes the calls of a group in the
 * same order, so running them in that order is a valid schedule.  Sends
 * and receives in a group run together, as NCCL fuses them (an
 * all-to-all: every pair exchanges both ways): each posts its MPI request
 * at once, a send from a copy of its data, and the outermost ncclGroupEnd
 * completes them all, each receive checked for its length and copied into
 * device memory only then. */
struct emu_p2p {
    MPI_Request req;
    std::vector<float> data;
    float *dst; /* a receive's device buffer; NULL for a send */
    size_t count;
    int peer;
    const char *call;
};
static int group_depth;
static std::vector<emu_p2p *> group_p2p;

ncclResult_t ncclGroupStart()
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd()
{
    if (group_depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0)
        return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    for (emu_p2p *p : group_p2p) {
        MPI_Status st;
        ncclResult_t ri = mpi(wait_mpi(MPI_SUCCESS, &p->req, &st), p->call);
        int got = 0;
        if (ri == ncclSuccess && p->dst) {
            MPI_Get_count(&st, MPI_FLOAT, &got);
            if ((size_t)got != p->count)
                ri = fail(ncclInvalidUsage, "%s: %d floats arrived from rank %d, %zu expected",
                          p->call, got, p->peer, p->count);
            else if (p->count) {
                emu_device_scope scope;
                memcpy(p->dst, p->data.data(), p->count * sizeof(float));
            }
        }
        if (r == ncclSuccess)
            r = ri;
        delete p;
    }
    group_p2p.clear();
    return r;
}

/* A send or receive inside a group: posted now, completed by ncclGroupEnd. */
static ncclResult_t group_post(const char *call, const void *send, void *recv, size_t count,
                               int peer, ncclComm_t comm);

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t)
{
    const char *call = "ncclAllReduce";
    if (ncclResult_t r = check_args(call, type, count, comm))
        return r;
    if (ncclResult_t r = play_fault(call, comm))
        return r;
    check_buf(call, "sendbuff", send, count);
    check_buf(call, "recvbuff", recv, count);
    emu_device_scope scope;
    const void *s = send == recv ? MPI_IN_PLACE : send;
    MPI_Request q;
    return mpi(wait_mpi(MPI_Iallreduce(s, recv, (int)count, MPI_FLOAT, mpi_op(op), comm->mpi, &q),
                        &q),
               call);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t)
{
    const char *call = "ncclAllGather";
    if (ncclResult_t r = check_args(call, type, count, comm))
        return r;
    if (ncclResult_t r = play_fault(call, comm))
        return r;
    check_buf(call, "sendbuff", send, count);
    check_buf(call, "recvbuff", recv, count * (size_t)comm->size);
    emu_device_scope scope;
    /* NCCL's in place: the send buffer is this rank's block of recv. */
    const bool in_place = send == (const float *)recv + (size_t)comm->rank * count;
    if (!in_place && send != recv &&
        (const float *)send < (const float *)recv + count * (size_t)comm->size &&
        (const float *)recv < (const float *)send + count)
        return fail(ncclInvalidUsage, "%s: buffers overlap but not in place", call);
    MPI_Request q;
    return mpi(wait_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)count, MPI_FLOAT, recv,
                                       (int)count, MPI_FLOAT, comm->mpi, &q),
                        &q),
               call);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t)
{
    const char *call = "ncclReduceScatter";
    if (ncclResult_t r = check_args(call, type, count, comm))
        return r;
    if (ncclResult_t r = play_fault(call, comm))
        return r;
    check_buf(call, "sendbuff", send, count * (size_t)comm->size);
    check_buf(call, "recvbuff", recv, count);
    emu_device_scope scope;
    /* Through a copy: NCCL's in place (recv = send + rank * count) is not MPI's. */
    std::vector<float> out(count);
    MPI_Request q;
    ncclResult_t r = mpi(wait_mpi(MPI_Ireduce_scatter_block(send, out.data(), (int)count,
                                                            MPI_FLOAT, mpi_op(op), comm->mpi, &q),
                                  &q),
                         call);
    if (count)
        memcpy(recv, out.data(), count * sizeof(float));
    return r;
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t)
{
    const char *call = "ncclReduce";
    if (ncclResult_t r = check_args(call, type, count, comm))
        return r;
    if (ncclResult_t r = play_fault(call, comm))
        return r;
    if (root < 0 || root >= comm->size)
        return fail(ncclInvalidArgument, "%s: root %d of %d ranks", call, root, comm->size);
    check_buf(call, "sendbuff", send, count);
    if (comm->rank == root)
        check_buf(call, "recvbuff", recv, count);
    emu_device_scope scope;
    std::vector<float> out(comm->rank == root ? count : 0);
    MPI_Request q;
    ncclResult_t r = mpi(wait_mpi(MPI_Ireduce(send, out.data(), (int)count, MPI_FLOAT, mpi_op(op),
                                              root, comm->mpi, &q),
                                  &q),
                         call);
    if (comm->rank == root && count)
        memcpy(recv, out.data(), count * sizeof(float));
    return r;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t)
{
    const char *call = "ncclBroadcast";
    if (ncclResult_t r = check_args(call, type, count, comm))
        return r;
    if (ncclResult_t r = play_fault(call, comm))
        return r;
    if (root < 0 || root >= comm->size)
        return fail(ncclInvalidArgument, "%s: root %d of %d ranks", call, root, comm->size);
    if (comm->rank == root)
        check_buf(call, "sendbuff", send, count);
    check_buf(call, "recvbuff", recv, count);
    emu_device_scope scope;
    if (comm->rank == root && send != recv && count)
        memmove(recv, send, count * sizeof(float));
    MPI_Request q;
    return mpi(wait_mpi(MPI_Ibcast(recv, (int)count, MPI_FLOAT, root, comm->mpi, &q), &q), call);
}

enum { P2P_TAG = 0x4e43 };

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t)
{
    const char *call = "ncclSend";
    if (ncclResult_t r = check_args(call, type, count, comm))
        return r;
    if (ncclResult_t r = play_fault(call, comm))
        return r;
    if (peer < 0 || peer >= comm->size || peer == comm->rank)
        return fail(ncclInvalidArgument, "%s: peer %d (rank %d of %d)", call, peer, comm->rank,
                    comm->size);
    check_buf(call, "sendbuff", send, count);
    if (group_depth > 0)
        return group_post(call, send, NULL, count, peer, comm);
    comm->send_data.resize(count);
    {
        emu_device_scope scope;
        if (count)
            memcpy(comm->send_data.data(), send, count * sizeof(float));
    }
    /* Synchronous mode: complete only once the receive has matched it. */
    return mpi(MPI_Issend(comm->send_data.data(), (int)count, MPI_FLOAT, peer, P2P_TAG,
                          comm->mpi, &comm->send),
               call);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t)
{
    const char *call = "ncclRecv";
    if (ncclResult_t r = check_args(call, type, count, comm))
        return r;
    if (ncclResult_t r = play_fault(call, comm))
        return r;
    if (peer < 0 || peer >= comm->size || peer == comm->rank)
        return fail(ncclInvalidArgument, "%s: peer %d (rank %d of %d)", call, peer, comm->rank,
                    comm->size);
    check_buf(call, "recvbuff", recv, count);
    if (group_depth > 0)
        return group_post(call, NULL, recv, count, peer, comm);
    std::vector<float> in(count);
    MPI_Status st;
    MPI_Request q;
    ncclResult_t r = mpi(wait_mpi(MPI_Irecv(in.data(), (int)count, MPI_FLOAT, peer, P2P_TAG,
                                            comm->mpi, &q),
                                  &q, &st),
                         call);
    int got = 0;
    MPI_Get_count(&st, MPI_FLOAT, &got);
    if (r == ncclSuccess && (size_t)got != count)
        return fail(ncclInvalidUsage, "%s: %d floats arrived from rank %d, %zu expected", call,
                    got, peer, count);
    emu_device_scope scope;
    if (count)
        memcpy(recv, in.data(), count * sizeof(float));
    return r;
}

static ncclResult_t group_post(const char *call, const void *send, void *recv, size_t count,
                               int peer, ncclComm_t comm)
{
    if (count > (size_t)INT_MAX)
        return fail(ncclInvalidArgument, "%s: %zu floats", call, count);
    emu_p2p *p = new emu_p2p{MPI_REQUEST_NULL, std::vector<float>(count), (float *)recv, count,
                             peer, call};
    group_p2p.push_back(p);
    if (recv)
        return mpi(MPI_Irecv(p->data.data(), (int)count, MPI_FLOAT, peer, P2P_TAG, comm->mpi,
                             &p->req),
                   call);
    {
        emu_device_scope scope;
        if (count)
            memcpy(p->data.data(), send, count * sizeof(float));
    }
    return mpi(MPI_Isend(p->data.data(), (int)count, MPI_FLOAT, peer, P2P_TAG, comm->mpi, &p->req),
               call);
}
