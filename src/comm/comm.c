#include "comm/comm.h"
#include "comm/comm_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/nccl.h"
#include "core/error.h"
#include "core/progress.h"
#include "comm/trace.h"

static void check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    trd_fatal(TRD_EXIT_RUNTIME, "another rank probably failed; see its message above",
              "MPI %s failed: %s", what, msg);
}

/* comm.h keeps MPI's handles as ints, which they are in MPICH. */
_Static_assert(__builtin_types_compatible_p(MPI_Comm, int) &&
                   __builtin_types_compatible_p(MPI_Request, int),
               "comm.h stores MPI_Comm and MPI_Request as int (MPICH's handles)");

MPI_Comm comm_mpi(const Comm *c) { return c->handle; }

CommHandle comm_handle_none(void) { return (CommHandle){.req = MPI_REQUEST_NULL}; }

Comm comm_none(void) { return (Comm){.handle = MPI_COMM_NULL, .rank = -1, .size = 0}; }

int comm_is_member(const Comm *c) { return c->handle != MPI_COMM_NULL; }

static void (*before_finalize)(void);

/* trd_fatal's end of a job: with more than one rank a plain exit would
 * leave the others blocked in their next collective, so abort them all. */
static void abort_job(int code)
{
    int initialized = 0, finalized = 0, size = 1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) {
        /* The launcher forwards our stderr asynchronously and drops what it
         * has not forwarded when the abort tears the job down: give it a
         * moment to pass the message on. */
        nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    MPI_Finalize();
}

void comm_init(int *argc, char ***argv)
{
    trd_on_fatal(abort_job);
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    /* MULTIPLE: an asynchronous checkpoint writes from its own thread
     * while training goes on (src/checkpoint/ckpt_async.c). */
    if (!initialized)
        check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "init");
    /* Errors come back to check(), which aborts the job with a message
     * instead of MPI's default silent abort. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

void comm_finalize(void)
{
    /* Safe to call from any exit path, also before comm_init (a front end
     * like `trident run` that refuses its input never starts MPI). */
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        void (*fn)(void) = before_finalize;
        before_finalize = NULL;
        if (fn)
            fn();
        MPI_Finalize();
    }
}

void comm_before_finalize(void (*fn)(void)) { before_finalize = fn; }

_Noreturn void comm_abort(int code)
{
    comm_nccl_abort_all(); /* no NCCL kernel left waiting on the GPU */
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code); /* MPI_Abort does not return; if it did, still end */
}

double comm_wtime(void) { return MPI_Wtime(); }

int comm_launched(void)
{
    /* MPICH's Hydra and Slurm's PMI-1/PMI-2 set PMI_RANK, PMIx launchers
     * PMIX_RANK, Open MPI's mpirun OMPI_COMM_WORLD_RANK. */
    return getenv("PMI_RANK") || getenv("PMIX_RANK") || getenv("OMPI_COMM_WORLD_RANK");
}

int comm_threads(void)
{
    int initialized = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    if (initialized)
        MPI_Query_thread(&level);
    return level >= MPI_THREAD_MULTIPLE;
}

/* The group's world ranks, for the watchdog's messages: "1,3", "0-7",
 * cut with ",..." past the buffer; and their progression, so a peer's
 * group rank can be named as a world rank without an MPI call. */
static void set_members(Comm *c)
{
    MPI_Group grp, world;
    check(MPI_Comm_group(c->handle, &grp), "group of a communicator");
    check(MPI_Comm_group(MPI_COMM_WORLD, &world), "group of the world");
    int *mine = trd_malloc(2 * (size_t)c->size * sizeof(int), "group ranks");
    int *wr = mine + c->size;
    for (int r = 0; r < c->size; r++)
        mine[r] = r;
    check(MPI_Group_translate_ranks(grp, c->size, mine, world, wr), "group rank translation");
    MPI_Group_free(&grp);
    MPI_Group_free(&world);
    int step = c->size > 1 ? wr[1] - wr[0] : 1;
    for (int r = 2; r < c->size && step; r++)
        if (wr[r] - wr[r - 1] != step)
            step = 0;
    c->wfirst = wr[0];
    c->wstride = step;
    const size_t cap = sizeof c->members;
    if (step == 1 && c->size > 2) {
        snprintf(c->members, cap, "%d-%d", wr[0], wr[c->size - 1]);
    } else {
        size_t n = 0;
        c->members[0] = '\0';
        for (int r = 0; r < c->size; r++) {
            char one[16];
            int k = snprintf(one, sizeof one, "%s%d", r ? "," : "", wr[r]);
            if (n + (size_t)k + 5 > cap) { /* room for ",..." */
                snprintf(c->members + n, cap - n, ",...");
                break;
            }
            memcpy(c->members + n, one, (size_t)k + 1);
            n += (size_t)k;
        }
    }
    free(mine);
}

/* The world rank of group rank r (for messages; -1 when unknown). */
static int world_rank(const Comm *c, int r)
{
    return c->wstride || c->size == 1 ? c->wfirst + r * c->wstride : -1;
}

/* Set on a helper thread (comm_untracked_thread): its calls are neither
 * the rank's progress record nor spans of its trace, which belong to the
 * main thread. */
static _Thread_local int untracked;

void comm_untracked_thread(void) { untracked = 1; }

/* A blocking wait on other ranks of c starts (progress.h). */
static void wait_begin(const Comm *c, const char *op, int peer)
{
    if (!untracked)
        progress_wait(op, c->name, c->members, peer >= 0 ? world_rank(c, peer) : -1);
}

static void wait_end(void)
{
    if (!untracked)
        progress_done();
}

/* How a rank waits for MPI: every blocking call here is its non-blocking
 * form plus this wait, which tests for 50 us and then naps 20 us between
 * tests (as the pipeline executor's receive loop does).  MPICH's blocking
 * calls spin on a core until the others arrive; with more ranks than cores
 * (a test machine, a login node, a CPU job oversubscribed on purpose) the
 * spinning ranks take the cores from the ranks they are waiting for.  Open
 * MPI yields when oversubscribed for the same reason.  The nap costs at most
 * a few tens of microseconds on a wait that has already lasted 50. */
#define WAIT_SPIN_S 50e-6
#define WAIT_NAP_NS 20000L

static void wait_request(MPI_Request *req, MPI_Status *st, const char *what)
{
    const double t0 = MPI_Wtime();
    for (;;) {
        int done = 0;
        check(MPI_Test(req, &done, st), what);
        if (done)
            return;
        if (MPI_Wtime() - t0 >= WAIT_SPIN_S)
            nanosleep(&(struct timespec){.tv_nsec = WAIT_NAP_NS}, NULL);
    }
}

Comm comm_world(void)
{
    Comm c = {.handle = MPI_COMM_WORLD, .name = "world"};
    MPI_Comm_rank(c.handle, &c.rank);
    MPI_Comm_size(c.handle, &c.size);
    set_members(&c);
    return c;
}

static void nccl_label(const Comm *c, const char *what);

void comm_set_name(Comm *c, const char *name)
{
    snprintf(c->name, sizeof c->name, "%s", name);
    if (c->nccl)
        nccl_label(c, "group ");
}

void comm_use_memory(Comm *c, const Backend *be) { c->mem = be && be->device ? be : NULL; }

/* ---- NCCL (comm/nccl.h; kernels/nccl_none.c in a build without it) ---- */

/* The world rank of a group's rank 0: the color that names the group when
 * the world's NCCL communicator is split into the groups. */
static int group_color(const Comm *g)
{
    if (g->handle == MPI_COMM_NULL || g->size < 2)
        return -1; /* a group of one never communicates */
    MPI_Group grp, world;
    int zero = 0, root = -1;
    check(MPI_Comm_group(g->handle, &grp), "group of a communicator");
    check(MPI_Comm_group(MPI_COMM_WORLD, &world), "group of the world");
    check(MPI_Group_translate_ranks(grp, 1, &zero, world, &root), "group rank translation");
    MPI_Group_free(&grp);
    MPI_Group_free(&world);
    return root;
}

/* "group dp (ranks 0,1)", for NCCL's messages. */
static void nccl_label(const Comm *c, const char *what)
{
    char label[128];
    snprintf(label, sizeof label, "%s%s (ranks %s)", what, c->name[0] ? c->name : "?", c->members);
    comm_nccl_set_label(c->nccl, label);
}

void comm_use_nccl(Comm *world, Comm *const *groups, int n)
{
    TRD_ASSERT(world->handle == MPI_COMM_WORLD && world->mem);
    unsigned char id[COMM_NCCL_ID_BYTES];
    if (world->rank == 0)
        comm_nccl_unique_id(id);
    check(MPI_Bcast(id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "broadcast of the NCCL id");
    /* Collective over every rank, and it blocks until all have joined: a
     * wait the watchdog can name. */
    wait_begin(world, "NCCL initialisation", -1);
    world->nccl = comm_nccl_init(id, world->size, world->rank);
    nccl_label(world, "group ");
    for (int i = 0; i < n; i++) {
        Comm *g = groups[i];
        if (g == world)
            continue;
        TRD_ASSERT(g->handle == MPI_COMM_NULL || g->mem);
        g->nccl = comm_nccl_split(world->nccl, group_color(g), g->rank);
        if (g->nccl)
            nccl_label(g, "group ");
    }
    wait_end();
}

/* An NCCL fault reported asynchronously (a peer gone, a network error)
 * ends the job here, naming the communicator, rather than at a later
 * hang; every communicator is aborted first. */
static void nccl_check_faults(void)
{
    char why[320];
    if (comm_nccl_fault(why, sizeof why)) {
        comm_nccl_abort_all();
        trd_fatal(TRD_EXIT_RUNTIME,
                  "NCCL_DEBUG=WARN says more; the failed peer's own log says why it failed", "%s",
                  why);
    }
}

int comm_async_fault(char *buf, size_t n) { return comm_nccl_fault(buf, n); }
int comm_unfinished(char *buf, size_t n) { return comm_nccl_pending(buf, n); }

int comm_stream_ordered(const Comm *c) { return c->nccl != NULL; }

/* The channel for messages src -> dst with tag, or NULL. */
static const CommChannel *find_channel(const Comm *c, int src, int dst, int tag)
{
    for (int i = 0; i < c->n_chan; i++)
        if (c->chan[i].src == src && c->chan[i].dst == dst && c->chan[i].tag == tag)
            return &c->chan[i];
    return NULL;
}

void comm_open_channel(Comm *c, int src, int dst, int tag)
{
    if (!c->nccl || c->size < 2 || find_channel(c, src, dst, tag))
        return;
    TRD_ASSERT(src != dst && src >= 0 && dst >= 0 && src < c->size && dst < c->size);
    CommChannel *more = realloc(c->chan, (size_t)(c->n_chan + 1) * sizeof *c->chan);
    if (!more)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory opening a communication channel");
    c->chan = more;
    CommChannel *ch = &c->chan[c->n_chan++];
    /* In the two-rank communicator the sender is rank 0, the receiver 1. */
    const int member = c->rank == src || c->rank == dst;
    *ch = (CommChannel){.src = src,
                        .dst = dst,
                        .tag = tag,
                        .nccl = comm_nccl_split(c->nccl, member ? 0 : -1, c->rank == src ? 0 : 1)};
    if (ch->nccl) {
        char label[128];
        snprintf(label, sizeof label, "the channel %d -> %d of group %s (ranks %s)", src, dst,
                 c->name, c->members);
        comm_nccl_set_label(ch->nccl, label);
    }
}

/* ---- host staging of device buffers (comm_use_memory) ---- */

/* Staging buffers come from the backend's host_alloc (page-locked with
 * CUDA) and are kept for reuse: the same sizes recur every step (buckets,
 * shards, pipeline messages, TP boundaries), and pinning memory is slow.
 * A buffer's capacity sits in a header in front of it.  Released buffers
 * wait in a free list of at most STAGE_KEEP; taking one picks the smallest
 * that fits, else allocates.  Single-threaded, like the rest of comm. */
enum { STAGE_KEEP = 32, STAGE_HEAD = 64 / sizeof(float) /* keeps 64-byte alignment */ };

static struct {
    float *free[STAGE_KEEP];
    int n_free;
    const Backend *be; /* whose host_alloc made them (one backend a process) */
    CommStaging stats;
} stage;

static size_t stage_cap(const float *host) { return *(const size_t *)(host - STAGE_HEAD); }

static float *stage_take(const Comm *c, size_t n)
{
    TRD_ASSERT(!stage.be || stage.be == c->mem);
    stage.be = c->mem;
    int best = -1;
    for (int i = 0; i < stage.n_free; i++)
        if (stage_cap(stage.free[i]) >= n &&
            (best < 0 || stage_cap(stage.free[i]) < stage_cap(stage.free[best])))
            best = i;
    if (best >= 0) {
        float *host = stage.free[best];
        stage.free[best] = stage.free[--stage.n_free];
        return host;
    }
    float *base =
        c->mem->host_alloc((STAGE_HEAD + n) * sizeof(float), "communication staging buffer");
    *(size_t *)base = n;
    stage.stats.allocations++;
    stage.stats.bytes += n * sizeof(float);
    return base + STAGE_HEAD;
}

static void stage_release(float *host)
{
    if (stage.n_free == STAGE_KEEP) { /* full: drop the smallest */
        int small = 0;
        for (int i = 1; i < STAGE_KEEP; i++)
            if (stage_cap(stage.free[i]) < stage_cap(stage.free[small]))
                small = i;
        if (stage_cap(stage.free[small]) >= stage_cap(host))
            small = -1; /* the new one is the smallest: drop it instead */
        float *gone = small < 0 ? host : stage.free[small];
        stage.stats.bytes -= stage_cap(gone) * sizeof(float);
        stage.be->host_release(gone - STAGE_HEAD);
        if (small < 0)
            return;
        stage.free[small] = stage.free[--stage.n_free];
    }
    stage.free[stage.n_free++] = host;
}

CommStaging comm_staging(void) { return stage.stats; }

void comm_staging_free(void)
{
    for (int i = 0; i < stage.n_free; i++) {
        stage.stats.bytes -= stage_cap(stage.free[i]) * sizeof(float);
        stage.be->host_release(stage.free[i] - STAGE_HEAD);
    }
    stage.n_free = 0;
}

/* A host copy of n floats of device memory. */
static float *stage_out(const Comm *c, const float *dev, size_t n)
{
    float *host = stage_take(c, n);
    c->mem->to_host(host, dev, n * sizeof(float));
    return host;
}

/* Copy between buffers of the caller's memory (a group of one). */
static void copy_floats(const Comm *c, float *dst, const float *src, size_t n)
{
    if (c->mem)
        c->mem->copy(dst, src, n * sizeof(float));
    else
        memmove(dst, src, n * sizeof(float));
}

/* An operation is complete: staged results go back, buffers are released. */
static void finish(CommHandle *h)
{
    free(h->counts);
    h->counts = NULL;
    if (h->host) {
        if (h->back)
            h->mem->to_backend(h->back, h->host + h->back_off, h->back_n * sizeof(float));
        stage_release(h->host);
        h->host = h->back = NULL;
    }
}

Comm comm_split(const Comm *parent, int color, int key)
{
    /* The sub-group's buffers are the parent's kind of memory. */
    Comm c = {.handle = MPI_COMM_NULL, .rank = -1, .size = 0, .mem = parent->mem};
    check(MPI_Comm_split(parent->handle, color < 0 ? MPI_UNDEFINED : color, key, &c.handle),
          "communicator split");
    /* NCCL's split is collective over the parent too: every rank joins it. */
    if (parent->nccl)
        c.nccl = comm_nccl_split(parent->nccl, c.handle == MPI_COMM_NULL ? -1 : color, key);
    if (c.handle == MPI_COMM_NULL)
        return c;
    /* A split communicator inherits the parent's error handler, so failures
     * on it come back to check() as on the world. */
    MPI_Comm_rank(c.handle, &c.rank);
    MPI_Comm_size(c.handle, &c.size);
    set_members(&c);
    if (c.nccl)
        nccl_label(&c, "group "); /* again when its creator names it */
    return c;
}

Comm comm_dup(const Comm *c)
{
    Comm d = *c;
    d.chan = NULL;
    d.n_chan = 0;
    d.nccl = NULL;
    d.mem = NULL;
    d.bytes_sent = d.calls = 0;
    check(MPI_Comm_dup(c->handle, &d.handle), "duplicate a communicator");
    return d;
}

Comm comm_split_node(const Comm *parent)
{
    Comm c = comm_none();
    if (MPI_Comm_split_type(parent->handle, MPI_COMM_TYPE_SHARED, parent->rank, MPI_INFO_NULL,
                            &c.handle) != MPI_SUCCESS)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
    MPI_Comm_rank(c.handle, &c.rank);
    MPI_Comm_size(c.handle, &c.size);
    return c;
}

void comm_free(Comm *c)
{
    for (int i = 0; i < c->n_chan; i++)
        comm_nccl_free(c->chan[i].nccl);
    comm_nccl_free(c->nccl);
    free(c->chan);
    if (c->handle != MPI_COMM_NULL && c->handle != MPI_COMM_WORLD)
        MPI_Comm_free(&c->handle);
    *c = (Comm){.handle = MPI_COMM_NULL, .rank = -1, .size = 0};
}

uint64_t comm_ring_bytes(size_t n, int passes, int p)
{
    return p <= 1 ? 0 : (uint64_t)passes * n * sizeof(float) * (uint64_t)(p - 1) / (uint64_t)p;
}

static uint64_t ring_bytes(const Comm *c, size_t n, int passes)
{
    return comm_ring_bytes(n, passes, c->size);
}

/* One data-moving operation of `bytes` (ring model) started on c. */
static void count_op(Comm *c, uint64_t bytes)
{
    c->bytes_sent += bytes;
    c->calls++;
}

/* ---- traces: a span per collective, named after the op and the group ---- */

static void span_name(char *buf, size_t len, const char *op, const Comm *c)
{
    snprintf(buf, len, "%s%s%s", op, c->name[0] ? " " : "", c->name);
}

static void trace_blocking(const char *op, const Comm *c, double t0, uint64_t bytes)
{
    if (untracked || !trace_active())
        return;
    char name[32];
    span_name(name, sizeof name, op, c);
    trace_span(name, TRACE_COLLECTIVE, t0, MPI_Wtime(), -1, -1, bytes);
}

/* A non-blocking collective just issued: its span ends when it completes. */
static void trace_issue(CommHandle *h, const char *op, const Comm *c, uint64_t bytes)
{
    h->wait_op = op; /* also what a wait on it waits for */
    h->group = c;
    h->peer = -1;
    if (untracked || !trace_active())
        return;
    span_name(h->what, sizeof h->what, op, c);
    h->t0 = MPI_Wtime();
    h->bytes = bytes;
}

static void trace_complete(CommHandle *h)
{
    if (h->what[0])
        trace_span(h->what, TRACE_COLLECTIVE, h->t0, MPI_Wtime(), -1, -1, h->bytes);
    h->what[0] = '\0';
}

/* MPI counts are int: large buffers go in chunks. */
static void allreduce(Comm *c, void *buf, size_t n, size_t elem, MPI_Datatype t, MPI_Op op)
{
    if (c->size == 1)
        return;
    const double t0 = MPI_Wtime();
    const size_t chunk = (size_t)INT_MAX / 2;
    wait_begin(c, "all-reduce", -1);
    for (size_t off = 0; off < n; off += chunk) {
        size_t k = n - off < chunk ? n - off : chunk;
        MPI_Request r;
        check(MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)k, t, op, c->handle, &r),
              "all-reduce");
        wait_request(&r, MPI_STATUS_IGNORE, "all-reduce");
    }
    wait_end();
    count_op(c, ring_bytes(c, n * elem / sizeof(float), 2));
    trace_blocking("all-reduce", c, t0, ring_bytes(c, n * elem / sizeof(float), 2));
}

/* A blocking float all-reduce, staged when the buffer is device memory. */
static void allreduce_f32(Comm *c, float *buf, size_t n, MPI_Op op)
{
    if (c->nccl && c->size > 1 && n > 0) {
        const double t0 = MPI_Wtime();
        CommHandle h = {.req = MPI_REQUEST_NULL,
                        .op = comm_nccl_allreduce(c->nccl, buf, n, op == MPI_MAX),
                        .wait_op = "all-reduce",
                        .group = c,
                        .peer = -1};
        comm_wait(&h);
        count_op(c, ring_bytes(c, n, 2));
        trace_blocking("all-reduce", c, t0, ring_bytes(c, n, 2));
        return;
    }
    if (!c->mem || c->size == 1) {
        allreduce(c, buf, n, sizeof(float), MPI_FLOAT, op);
        return;
    }
    float *host = stage_out(c, buf, n);
    allreduce(c, host, n, sizeof(float), MPI_FLOAT, op);
    c->mem->to_backend(buf, host, n * sizeof(float));
    stage_release(host);
}

void comm_allreduce_f32(Comm *c, float *buf, size_t n) { allreduce_f32(c, buf, n, MPI_SUM); }

void comm_allreduce_f64(Comm *c, double *buf, size_t n)
{
    allreduce(c, buf, n, sizeof(double), MPI_DOUBLE, MPI_SUM);
}

void comm_allreduce_max_i32(Comm *c, int *buf, size_t n)
{
    allreduce(c, buf, n, sizeof(int), MPI_INT, MPI_MAX);
}

void comm_allreduce_min_i32(Comm *c, int *buf, size_t n)
{
    allreduce(c, buf, n, sizeof(int), MPI_INT, MPI_MIN);
}

void comm_allreduce_sum_u64(Comm *c, uint64_t *buf, size_t n)
{
    allreduce(c, buf, n, sizeof(uint64_t), MPI_UINT64_T, MPI_SUM);
}

void comm_allgather_bytes(Comm *c, const void *mine, void *all, size_t bytes)
{
    TRD_ASSERT(bytes <= (size_t)INT_MAX);
    wait_begin(c, "all-gather", -1);
    MPI_Request r;
    check(MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, c->handle, &r),
          "all-gather");
    wait_request(&r, MPI_STATUS_IGNORE, "all-gather");
    wait_end();
    c->calls++;
}

void *comm_allgatherv_bytes(Comm *c, const void *mine, size_t bytes, size_t *total, int *counts)
{
    TRD_ASSERT(bytes <= (size_t)INT_MAX);
    int *n = trd_malloc(2 * (size_t)c->size * sizeof(int), "all-gather counts");
    int *at = n + c->size, b = (int)bytes;
    comm_allgather_bytes(c, &b, n, sizeof(int));
    size_t sum = 0;
    for (int r = 0; r < c->size; r++) {
        TRD_ASSERT(sum <= (size_t)INT_MAX);
        at[r] = (int)sum;
        sum += (size_t)n[r];
    }
    char *all = trd_malloc(sum ? sum : 1, "all-gathered bytes");
    wait_begin(c, "all-gather", -1);
    MPI_Request r;
    check(MPI_Iallgatherv(mine, b, MPI_BYTE, all, n, at, MPI_BYTE, c->handle, &r), "all-gather");
    wait_request(&r, MPI_STATUS_IGNORE, "all-gather");
    wait_end();
    if (counts)
        memcpy(counts, n, (size_t)c->size * sizeof(int));
    free(n);
    *total = sum;
    return all;
}

void comm_broadcast(Comm *c, void *buf, size_t bytes, int root)
{
    if (c->size == 1)
        return;
    TRD_ASSERT(bytes <= (size_t)INT_MAX);
    wait_begin(c, "broadcast", -1);
    MPI_Request r;
    check(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c->handle, &r), "broadcast");
    wait_request(&r, MPI_STATUS_IGNORE, "broadcast");
    wait_end();
    c->calls++;
}

void comm_barrier(Comm *c)
{
    wait_begin(c, "barrier", -1);
    MPI_Request r;
    check(MPI_Ibarrier(c->handle, &r), "barrier");
    wait_request(&r, MPI_STATUS_IGNORE, "barrier");
    wait_end();
}

void comm_shard_part(size_t lo, size_t hi, size_t S, int rank, size_t *a, size_t *b)
{
    size_t r0 = (size_t)rank * S, r1 = r0 + S;
    *a = lo > r0 ? lo : r0;
    *b = hi < r1 ? hi : r1;
    if (*a > *b)
        *a = *b = 0;
}

CommHandle comm_iallreduce_f32(Comm *c, float *buf, size_t n)
{
    CommHandle h = {.req = MPI_REQUEST_NULL};
    if (c->size == 1 || n == 0)
        return h;
    if (c->nccl) {
        h.op = comm_nccl_allreduce(c->nccl, buf, n, 0);
    } else {
        TRD_ASSERT(n <= (size_t)INT_MAX);
        if (c->mem) {
            h = (CommHandle){.req = MPI_REQUEST_NULL,
                             .host = stage_out(c, buf, n),
                             .back = buf,
                             .back_n = n,
                             .mem = c->mem};
            buf = h.host;
        }
        check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->handle, &h.req),
              "all-reduce");
    }
    count_op(c, ring_bytes(c, n, 2));
    trace_issue(&h, "all-reduce", c, ring_bytes(c, n, 2));
    return h;
}

CommHandle comm_iallreduce_sum_u64(Comm *c, uint64_t *buf, size_t n)
{
    CommHandle h = {.req = MPI_REQUEST_NULL};
    if (c->size == 1 || n == 0)
        return h;
    TRD_ASSERT(n <= (size_t)INT_MAX);
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_UINT64_T, MPI_SUM, c->handle, &h.req),
          "all-reduce");
    count_op(c, ring_bytes(c, n * sizeof *buf / sizeof(float), 2));
    trace_issue(&h, "all-reduce", c, ring_bytes(c, n * sizeof *buf / sizeof(float), 2));
    return h;
}

/* counts[r] = length of rank r's part of [lo, hi); displs[r] its offset
 * from lo.  Parts of consecutive ranks are consecutive in memory. */
static int *range_counts(const Comm *c, size_t lo, size_t hi, size_t S)
{
    int *counts = trd_malloc(2 * (size_t)c->size * sizeof(int), "collective counts");
    for (int r = 0; r < c->size; r++) {
        size_t a, b;
        comm_shard_part(lo, hi, S, r, &a, &b);
        TRD_ASSERT(b - a <= (size_t)INT_MAX);
        counts[r] = (int)(b - a);
        counts[c->size + r] = (int)(b > a ? a - lo : 0);
    }
    return counts;
}

CommHandle comm_ireduce_scatter_range_f32(Comm *c, const float *send, float *recv, size_t lo,
                                          size_t hi, size_t S)
{
    CommHandle h = {.req = MPI_REQUEST_NULL};
    if (hi <= lo)
        return h;
    if (c->size == 1) {
        copy_floats(c, recv, send, hi - lo);
        return h;
    }
    h.counts = range_counts(c, lo, hi, S);
    if (c->nccl) {
        h.op = comm_nccl_reduce_parts(c->nccl, send, recv, h.counts, h.counts + c->size);
    } else {
        if (c->mem) { /* host: the whole range to send, then this rank's part received */
            const size_t n = hi - lo, mine = (size_t)h.counts[c->rank];
            h.host = stage_take(c, n + mine);
            c->mem->to_host(h.host, send, n * sizeof(float));
            h.back = recv, h.back_off = n, h.back_n = mine, h.mem = c->mem;
            send = h.host;
            recv = h.host + n;
        }
        check(MPI_Ireduce_scatter(send, recv, h.counts, MPI_FLOAT, MPI_SUM, c->handle, &h.req),
              "reduce-scatter");
    }
    count_op(c, ring_bytes(c, hi - lo, 1));
    trace_issue(&h, "reduce-scatter", c, ring_bytes(c, hi - lo, 1));
    return h;
}

CommHandle comm_iallgather_range_f32(Comm *c, const float *mine, float *out, size_t lo, size_t hi,
                                     size_t S)
{
    CommHandle h = {.req = MPI_REQUEST_NULL};
    size_t a, b;
    comm_shard_part(lo, hi, S, c->rank, &a, &b);
    if (hi <= lo)
        return h;
    if (c->size == 1) {
        if (mine != out + (a - lo))
            copy_floats(c, out + (a - lo), mine, b - a);
        return h;
    }
    h.counts = range_counts(c, lo, hi, S);
    const int rank = c->rank;
    if (c->nccl) {
        h.op = comm_nccl_gather_parts(c->nccl, mine, out, h.counts, h.counts + c->size);
        count_op(c, ring_bytes(c, hi - lo, 1));
        trace_issue(&h, "all-gather", c, ring_bytes(c, hi - lo, 1));
        return h;
    }
    if (c->mem) { /* gather in place in a host copy of the range, then copy it back */
        h.host = stage_take(c, hi - lo);
        c->mem->to_host(h.host + (a - lo), mine, (b - a) * sizeof(float));
        h.back = out, h.back_n = hi - lo, h.mem = c->mem;
        out = h.host;
        mine = h.host + (a - lo);
    }
    /* In place when this rank's part already sits where it belongs. */
    const void *send = mine == out + (a - lo) ? MPI_IN_PLACE : (const void *)mine;
    check(MPI_Iallgatherv(send, h.counts[rank], MPI_FLOAT, out, h.counts, h.counts + c->size,
                          MPI_FLOAT, c->handle, &h.req),
          "all-gather");
    count_op(c, ring_bytes(c, hi - lo, 1));
    trace_issue(&h, "all-gather", c, ring_bytes(c, hi - lo, 1));
    return h;
}

/* A wait on h begins: what it waits for (progress.h). */
static void handle_wait_begin(const CommHandle *h)
{
    if (h->wait_op && h->group)
        wait_begin(h->group, h->wait_op, h->peer);
}

void comm_wait(CommHandle *h)
{
    const int pending = h->op || h->req != MPI_REQUEST_NULL;
    if (pending)
        handle_wait_begin(h);
    if (h->op) {
        comm_nccl_wait(h->op);
        nccl_check_faults();
    }
    h->op = NULL;
    if (h->req != MPI_REQUEST_NULL)
        wait_request(&h->req, MPI_STATUS_IGNORE, "wait");
    if (pending)
        wait_end();
    finish(h);
    trace_complete(h);
}

int comm_test(CommHandle *h)
{
    const int pending = h->op || h->req != MPI_REQUEST_NULL;
    int done = !h->op || comm_nccl_test(h->op);
    if (h->op)
        nccl_check_faults();
    if (done)
        h->op = NULL;
    if (done && h->req != MPI_REQUEST_NULL)
        check(MPI_Test(&h->req, &done, MPI_STATUS_IGNORE), "test");
    if (done) {
        finish(h);
        trace_complete(h);
    }
    /* A completion is progress; an incomplete test names what is awaited
     * (for a polling loop's wait) but is none, and its time is not counted
     * as blocked: a test between computations is no wait. */
    if (pending && done)
        wait_end();
    else if (!untracked && pending && h->wait_op && h->group)
        progress_poll(h->wait_op, h->group->name, h->group->members,
                      h->peer >= 0 ? world_rank(h->group, h->peer) : -1);
    return done;
}

const void *comm_done_event(const CommHandle *h)
{
    return h->op ? comm_nccl_op_event(h->op) : NULL;
}

void comm_after(Comm *c, const void *e)
{
    if (c->nccl && c->size > 1)
        comm_nccl_after(c->nccl, e);
    else if (c->mem)
        c->mem->wait_event(e);
}

void comm_allreduce_max_f32(Comm *c, float *buf, size_t n) { allreduce_f32(c, buf, n, MPI_MAX); }

/* The blocking block collectives work in place on size*n floats: staged,
 * the whole buffer goes to the host and `back` floats of it come back. */
static float *block_stage(const Comm *c, float *buf, size_t n)
{
    return c->mem ? stage_out(c, buf, n * (size_t)c->size) : buf;
}

static void block_unstage(const Comm *c, float *buf, float *host, size_t back)
{
    if (host == buf)
        return;
    c->mem->to_backend(buf, host, back * sizeof(float));
    stage_release(host);
}

void comm_allgather_block_f32(Comm *c, float *buf, size_t n)
{
    if (c->size == 1 || n == 0)
        return;
    const double t0 = MPI_Wtime();
    if (c->nccl) {
        CommHandle h = {.req = MPI_REQUEST_NULL,
                        .op = comm_nccl_allgather_block(c->nccl, buf, n),
                        .wait_op = "all-gather",
                        .group = c,
                        .peer = -1};
        comm_wait(&h);
    } else {
        TRD_ASSERT(n * (size_t)c->size <= (size_t)INT_MAX);
        float *x = block_stage(c, buf, n);
        wait_begin(c, "all-gather", -1);
        MPI_Request r;
        check(
            MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, (int)n, MPI_FLOAT, c->handle, &r),
            "all-gather");
        wait_request(&r, MPI_STATUS_IGNORE, "all-gather");
        wait_end();
        block_unstage(c, buf, x, n * (size_t)c->size);
    }
    count_op(c, ring_bytes(c, n * (size_t)c->size, 1));
    trace_blocking("all-gather", c, t0, ring_bytes(c, n * (size_t)c->size, 1));
}

void comm_reduce_scatter_block_f32(Comm *c, float *buf, size_t n)
{
    if (c->size == 1 || n == 0)
        return;
    const double t0 = MPI_Wtime();
    if (c->nccl) {
        CommHandle h = {.req = MPI_REQUEST_NULL,
                        .op = comm_nccl_reduce_scatter_block(c->nccl, buf, n),
                        .wait_op = "reduce-scatter",
                        .group = c,
                        .peer = -1};
        comm_wait(&h);
    } else {
        TRD_ASSERT(n * (size_t)c->size <= (size_t)INT_MAX);
        /* In place, MPI leaves this rank's reduced block at the start of buf. */
        float *x = block_stage(c, buf, n);
        wait_begin(c, "reduce-scatter", -1);
        MPI_Request r;
        check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, c->handle, &r),
              "reduce-scatter");
        wait_request(&r, MPI_STATUS_IGNORE, "reduce-scatter");
        wait_end();
        block_unstage(c, buf, x, n);
    }
    count_op(c, ring_bytes(c, n * (size_t)c->size, 1));
    trace_blocking("reduce-scatter", c, t0, ring_bytes(c, n * (size_t)c->size, 1));
}

/* Where a message src -> dst with tag goes under NCCL: its channel, in
 * which the sender is rank 0 and the receiver rank 1, or else the group. */
static CommNccl *p2p_route(const Comm *c, int src, int dst, int tag, int *peer)
{
    const CommChannel *ch = find_channel(c, src, dst, tag);
    const int other = c->rank == src ? dst : src;
    if (!ch) {
        *peer = other;
        return c->nccl;
    }
    *peer = c->rank == src ? 1 : 0;
    return ch->nccl;
}

CommHandle comm_isend_f32(Comm *c, const float *buf, size_t n, int dest, int tag)
{
    CommHandle h = {.req = MPI_REQUEST_NULL, .wait_op = "send to", .group = c, .peer = dest};
    if (c->nccl) {
        int peer;
        CommNccl *via = p2p_route(c, c->rank, dest, tag, &peer);
        h.op = comm_nccl_send(via, buf, n, peer);
        count_op(c, (uint64_t)n * sizeof(float));
        return h;
    }
    TRD_ASSERT(n <= (size_t)INT_MAX);
    if (c->mem) { /* the host copy is what is sent; freed on completion */
        h.host = stage_out(c, buf, n);
        h.mem = c->mem;
        buf = h.host;
    }
    check(MPI_Isend(buf, (int)n, MPI_FLOAT, dest, tag, c->handle, &h.req), "send");
    count_op(c, (uint64_t)n * sizeof(float));
    return h;
}

void comm_recv_f32(Comm *c, float *buf, size_t n, int src, int tag)
{
    if (c->nccl) {
        int peer;
        CommNccl *via = p2p_route(c, src, c->rank, tag, &peer);
        wait_begin(c, "receive from", src);
        comm_nccl_wait(comm_nccl_recv(via, buf, n, peer));
        wait_end();
        return;
    }
    TRD_ASSERT(n <= (size_t)INT_MAX);
    MPI_Status st;
    int got = 0;
    float *x = c->mem ? stage_take(c, n) : buf;
    wait_begin(c, "receive from", src);
    MPI_Request r;
    check(MPI_Irecv(x, (int)n, MPI_FLOAT, src, tag, c->handle, &r), "receive");
    wait_request(&r, &st, "receive");
    wait_end();
    MPI_Get_count(&st, MPI_FLOAT, &got);
    if (got != (int)n)
        trd_fatal(TRD_EXIT_RUNTIME, "the two ranks disagree on the message size",
                  "received %d floats from rank %d (tag %d), expected %zu", got, src, tag, n);
    if (x != buf) {
        c->mem->to_backend(buf, x, n * sizeof(float));
        stage_release(x);
    }
}

int comm_probe(Comm *c, int src, int tag)
{
    if (c->nccl)
        return 1;
    int flag = 0;
    check(MPI_Iprobe(src, tag, c->handle, &flag, MPI_STATUS_IGNORE), "probe");
    if (!flag) /* a probe loop waits for this message; the receive completes the wait */
        wait_begin(c, "receive from", src);
    return flag;
}

void comm_alltoall_i32(Comm *c, const int *send, int *recv, size_t n)
{
    if (c->size == 1) {
        memcpy(recv, send, n * sizeof(int));
        return;
    }
    TRD_ASSERT(n <= (size_t)INT_MAX);
    wait_begin(c, "all-to-all", -1);
    MPI_Request r;
    check(MPI_Ialltoall(send, (int)n, MPI_INT, recv, (int)n, MPI_INT, c->handle, &r), "all-to-all");
    wait_request(&r, MPI_STATUS_IGNORE, "all-to-all");
    wait_end();
    c->calls++;
}

/* MPI's int counts and displacements of the v-exchange (in floats). */
static int *alltoallv_ints(const Comm *c, const size_t *count, const size_t *displ)
{
    int *v = trd_malloc(2 * (size_t)c->size * sizeof(int), "all-to-all counts");
    for (int r = 0; r < c->size; r++) {
        TRD_ASSERT(count[r] <= (size_t)INT_MAX && displ[r] <= (size_t)INT_MAX);
        v[r] = (int)count[r];
        v[c->size + r] = (int)displ[r];
    }
    return v;
}

/* The floats a v-exchange reaches on this side: the largest end of a part. */
static size_t alltoallv_extent(const Comm *c, const size_t *count, const size_t *displ)
{
    size_t end = 0;
    for (int r = 0; r < c->size; r++)
        if (count[r] && displ[r] + count[r] > end)
            end = displ[r] + count[r];
    return end;
}

void comm_alltoallv_f32(Comm *c, const float *send, const size_t *scount, const size_t *sdispl,
                        float *recv, const size_t *rcount, const size_t *rdispl)
{
    if (c->size == 1) {
        if (scount[0])
            copy_floats(c, recv + rdispl[0], send + sdispl[0], scount[0]);
        return;
    }
    const double t0 = MPI_Wtime();
    uint64_t bytes = 0;
    for (int q = 0; q < c->size; q++)
        bytes += q == c->rank ? 0 : (uint64_t)scount[q] * sizeof(float);
    if (c->nccl) { /* device to device, the compute stream waiting on the GPU */
        CommHandle h = {
            .req = MPI_REQUEST_NULL,
            .op = comm_nccl_alltoallv(c->nccl, send, scount, sdispl, recv, rcount, rdispl),
            .wait_op = "all-to-all",
            .group = c,
            .peer = -1};
        comm_wait(&h);
        count_op(c, bytes);
        trace_blocking("all-to-all", c, t0, bytes);
        return;
    }
    const size_t ns = alltoallv_extent(c, scount, sdispl);
    const size_t nr = alltoallv_extent(c, rcount, rdispl);
    /* Staged: the send side's extent goes to the host, the receive side's
     * comes back (MPI here is not CUDA-aware). */
    float *hs = c->mem && ns ? stage_out(c, send, ns) : (float *)send;
    float *hr = c->mem && nr ? stage_take(c, nr) : recv;
    int *s = alltoallv_ints(c, scount, sdispl), *r = alltoallv_ints(c, rcount, rdispl);
    wait_begin(c, "all-to-all", -1);
    MPI_Request q;
    check(
        MPI_Ialltoallv(hs, s, s + c->size, MPI_FLOAT, hr, r, r + c->size, MPI_FLOAT, c->handle, &q),
        "all-to-all");
    wait_request(&q, MPI_STATUS_IGNORE, "all-to-all");
    wait_end();
    free(s);
    free(r);
    if (hr != recv) {
        c->mem->to_backend(recv, hr, nr * sizeof(float));
        stage_release(hr);
    }
    if (hs != send)
        stage_release(hs);
    count_op(c, bytes);
    trace_blocking("all-to-all", c, t0, bytes);
}

void comm_allreduce_max_f64(Comm *c, double *buf, size_t n)
{
    allreduce(c, buf, n, sizeof(double), MPI_DOUBLE, MPI_MAX);
}
