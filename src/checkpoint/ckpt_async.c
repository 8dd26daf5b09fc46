/* ckpt_async.c — checkpoint.async: write a host snapshot in the background.
 *
 * At a save step the trainer waits for the write in flight (one at a
 * time), copies its state into the snapshot (ckpt_async_snapshot, which
 * refuses non-finite values at once, as a synchronous save would) and calls
 * ckpt_async_start; a thread of each rank then runs ckpt_save over the
 * snapshot, exactly as a synchronous save would, on a duplicate of the
 * world communicator (MPI_THREAD_MULTIPLE), so its collectives never match
 * the training's.  The step is published by ckpt_save's own rules: a kill
 * during the write leaves `latest` where it was.
 *
 * HDF5 here is not built thread-safe: while a write is in flight no other
 * thread may call it.  The trainer calls HDF5 only before its loop (resume,
 * init_from) and at the saves, after ckpt_async_wait. */
#include "checkpoint/ckpt_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/error.h"

struct CkptAsync {
    CkptShardView view; /* the live view, data pointing at the snapshot */
    Comm comm;          /* the writer's duplicate of view.world */
    pthread_t thread;
    int own;             /* the snapshot buffers are ours (else the caller's) */
    int in_flight;       /* started and not yet waited for */
    atomic_int finished; /* the thread's ckpt_save returned */
    /* the write in flight */
    char dir[CFG_STR];
    CkptState st;
    const Config *cfg;
    int keep, rc;
    double t_start, t_end; /* comm_wtime around ckpt_save, on the thread */
    char err[CFG_ERR];
};

/* The one writer whose write comm_finalize finishes first (an agreed exit
 * during a write: every rank's writer completes, then MPI ends). */
static CkptAsync *active;

size_t ckpt_async_bytes(const CkptShardView *v)
{
    size_t n = 0;
    for (int k = 0; k < CKPT_KINDS; k++)
        if (v->part[k].data)
            n += ckpt_range_n(&v->part[k]) * sizeof(float);
    return n;
}

static void drain_at_exit(void)
{
    if (!active || !active->in_flight)
        return;
    char err[CFG_ERR];
    CkptAsyncDone d;
    ckpt_async_wait(active, &d, err);
}

CkptAsync *ckpt_async_create(const CkptShardView *v, int own)
{
    CkptAsync *a = trd_calloc(1, sizeof *a, "asynchronous checkpoint");
    a->view = *v;
    a->own = own;
    for (int k = 0; own && k < CKPT_KINDS; k++) {
        CkptRange *r = &a->view.part[k];
        if (!r->data)
            continue;
        /* Touched now, by the threads that copy into it: the memory is
         * the process's from the start (as the planner counts it), and the
         * first save does not pay for the page faults. */
        const size_t n = ckpt_range_n(r) ? ckpt_range_n(r) : 1;
        r->data = trd_malloc(n * sizeof(float), "checkpoint snapshot");
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i += 1024)
            r->data[i] = 0;
    }
    a->comm = comm_dup(v->world);
    a->view.world = &a->comm;
    active = a;
    comm_before_finalize(drain_at_exit);
    return a;
}

/* Copy n floats (src NULL: they are in place) and count the non-finite
 * ones, in one pass over blocks shared by the OpenMP threads (a copy of
 * gigabytes is bound by memory bandwidth, which one core does not fill).
 * NaN and Inf have all exponent bits set, so the largest magnitude bit
 * pattern of a block says whether to look closer.  *first: the lowest
 * index of a non-finite value (n when none). */
static int64_t copy_counting(float *dst, const float *src, size_t n, size_t *first)
{
    enum { B = 16384 };
    const int64_t blocks = (int64_t)((n + B - 1) / B);
    int64_t bad = 0;
    size_t lowest = n;
#pragma omp parallel for schedule(static) reduction(+ : bad) reduction(min : lowest)
    for (int64_t k = 0; k < blocks; k++) {
        const size_t lo = (size_t)k * B, m = n - lo < B ? n - lo : B;
        if (src)
            memcpy(dst + lo, src + lo, m * sizeof(float));
        uint32_t top = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t bits;
            memcpy(&bits, &dst[lo + i], sizeof bits);
            bits &= 0x7fffffffu;
            top = bits > top ? bits : top;
        }
        for (size_t i = 0; top >= 0x7f800000u && i < m; i++)
            if (!isfinite(dst[lo + i])) {
                lowest = lo + i < lowest ? lo + i : lowest;
                bad++;
            }
    }
    *first = lowest;
    return bad;
}

int ckpt_async_snapshot(CkptAsync *a, const float *const src[CKPT_KINDS], int64_t step,
                        char err[CFG_ERR])
{
    TRD_ASSERT(!a->in_flight);
    err[0] = '\0';
    int rc = 0;
    for (int k = 0; k < CKPT_KINDS; k++) {
        CkptRange *r = &a->view.part[k];
        if (!r->data)
            continue;
        size_t first = 0;
        const int64_t bad = copy_counting(r->data, src[k], ckpt_range_n(r), &first);
        if (!bad || rc)
            continue;
        /* The tensor of the first one: its flat element r->lo + first
         * (or in the second run, ckpt.h). */
        const ParamTable *t = a->view.table;
        const size_t n1 = r->hi - r->lo;
        const size_t at = first < n1 ? r->lo + first : r->xlo + (first - n1);
        const char *name = "?";
        for (int i = 0; i < t->n; i++)
            if (at >= t->p[i].offset && at < t->p[i].offset + t->p[i].numel)
                name = t->p[i].name;
        ckpt_err(err,
                 "step %lld: tensor '%s' (%s) holds %lld non-finite value%s (NaN or Inf) "
                 "on this rank: checkpoint not published",
                 (long long)step, name, ckpt_kind_names[k], (long long)bad, bad == 1 ? "" : "s");
        rc = -1;
    }
    /* No write is in flight: the writer's communicator is free to use. */
    return ckpt_agree(&a->comm, rc, err);
}

/* The writer runs at nice 10 (Linux: a thread's own priority): where
 * training keeps every core busy (the CPU backend) it yields to it, and
 * the write is spread over more steps instead of stalling one.  GPT-2 124M
 * on 2 cores, a checkpoint every 4 steps (bench/ckpt_async.sh): a step
 * during a write took 1.35x a step without one at nice 0, 1.07-1.10x at
 * nice 10 (write 1.4 s -> 4 s, still done before the next save), while at
 * nice 15 the write was not done by the next save, which waited for it.
 * With idle cores (a GPU run) it changes nothing. */
static void *writer(void *arg)
{
    CkptAsync *a = arg;
    setpriority(PRIO_PROCESS, (id_t)gettid(), 10);
    comm_untracked_thread(); /* the rank's progress record and trace are the main thread's */
    a->t_start = comm_wtime();
    a->rc = ckpt_save(a->dir, &a->view, &a->st, a->cfg, a->keep, a->err);
    a->t_end = comm_wtime();
    atomic_store(&a->finished, 1);
    return NULL;
}

void ckpt_async_start(CkptAsync *a, const char *dir, const CkptState *st, const Config *cfg,
                      int keep)
{
    TRD_ASSERT(!a->in_flight);
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    a->st = *st;
    a->cfg = cfg;
    a->keep = keep;
    a->rc = 0;
    a->err[0] = '\0';
    atomic_store(&a->finished, 0);
    if (pthread_create(&a->thread, NULL, writer, a) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, "set checkpoint.async: false",
                  "checkpoint: cannot start the writer thread");
    a->in_flight = 1;
}

int ckpt_async_in_flight(const CkptAsync *a) { return a && a->in_flight; }

int ckpt_async_finished(const CkptAsync *a) { return !a->in_flight || atomic_load(&a->finished); }

int ckpt_async_wait(CkptAsync *a, CkptAsyncDone *done, char err[CFG_ERR])
{
    memset(done, 0, sizeof *done);
    err[0] = '\0';
    if (!a || !a->in_flight)
        return 0;
    const double t0 = comm_wtime();
    TRD_ASSERT(pthread_join(a->thread, NULL) == 0);
    a->in_flight = 0;
    done->step = a->st.step;
    done->t_start = a->t_start;
    done->t_end = a->t_end;
    done->waited_s = comm_wtime() - t0;
    if (a->rc != 0)
        snprintf(err, CFG_ERR, "%s", a->err);
    return a->rc;
}

void ckpt_async_free(CkptAsync *a)
{
    if (!a)
        return;
    char err[CFG_ERR];
    CkptAsyncDone d;
    ckpt_async_wait(a, &d, err);
    if (active == a) {
        active = NULL;
        comm_before_finalize(NULL);
    }
    comm_free(&a->comm);
    for (int k = 0; a->own && k < CKPT_KINDS; k++)
        free(a->view.part[k].data);
    free(a);
}
