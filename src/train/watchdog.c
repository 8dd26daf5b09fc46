/* watchdog.c — the hang watchdog thread (watchdog.h). */
#include "train/watchdog.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/trace.h"

static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, stop;
    int timeout_s, rank, trace;
    char run_dir[CFG_STR];
} W = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Straight to file descriptor 2: the main thread may be stuck holding
 * stderr's stdio lock (a blocked write), and this message must get out. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 1)
        n = (int)sizeof buf - 1;
    for (int off = 0; n > off;) {
        ssize_t w = write(STDERR_FILENO, buf + off, (size_t)(n - off));
        if (w <= 0)
            break;
        off += (int)w;
    }
}

/* No progress for the timeout: say where, keep the trace, end the job.
 * The main thread is stuck, so this thread is the only one writing. */
static _Noreturn void fire(double idle)
{
    char where[256];
    progress_describe(where, sizeof where);
    say("trident: error: rank %d: no progress for %.0f s %s\n"
        "---> the ranks named are the ones this rank waits for: look for a rank that died, "
        "stopped or is stuck (its own message, or none if the machine went away); ending the "
        "job so it can be requeued.  Raise training.hang_timeout if a step or checkpoint "
        "legitimately takes longer\n", W.rank, idle, where);
    if (W.trace) {
        char path[CFG_STR + 32];
        snprintf(path, sizeof path, "%s/trace.rank%d.json", W.run_dir, W.rank);
        long n = trace_write_rank(path);
        if (n >= 0)
            say("trident: rank %d: trace so far (%ld spans) in %s\n", W.rank, n, path);
        else
            say("trident: rank %d: cannot write %s: %s\n", W.rank, path, strerror(errno));
    }
    /* From this thread although MPI was initialized FUNNELED: the main
     * thread is blocked (inside MPI, often) and will not call again, and
     * MPICH's abort asks the launcher to kill the job without touching the
     * communicators.  The pause lets the launcher forward our message. */
    nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
    MPI_Abort(MPI_COMM_WORLD, TRD_EXIT_RUNTIME);
    _exit(TRD_EXIT_RUNTIME); /* MPI_Abort does not return; if it did, still end */
}

static void *watch(void *arg)
{
    (void)arg;
    /* Look a few times per timeout, at most once a second. */
    const double period = W.timeout_s >= 5 ? 1.0 : W.timeout_s / 5.0;
    uint64_t seen = progress_ticks();
    double since = mono();
    pthread_mutex_lock(&W.mu);
    while (!W.stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        const double t = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + period;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        pthread_cond_timedwait(&W.cv, &W.mu, &until);
        if (W.stop)
            break;
        const uint64_t now_ticks = progress_ticks();
        const double now = mono();
        if (now_ticks != seen) {
            seen = now_ticks;
            since = now;
        } else if (now - since >= W.timeout_s) {
            fire(now - since);
        }
    }
    pthread_mutex_unlock(&W.mu);
    return NULL;
}

void watchdog_start(int timeout_s, int world_rank, int world_size, const char *run_dir,
                    int trace)
{
    if (timeout_s <= 0 || world_size < 2 || W.running)
        return;
    W.timeout_s = timeout_s;
    W.rank = world_rank;
    W.trace = trace;
    W.stop = 0;
    snprintf(W.run_dir, sizeof W.run_dir, "%s", run_dir);
    /* The condition variable times out on the monotonic clock: a clock
     * step (NTP) must neither fire nor silence the watchdog. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&W.cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&W.thread, NULL, watch, NULL);
    if (rc != 0)
        trd_fatal(TRD_EXIT_RUNTIME, "set training.hang_timeout: 0 to run without a watchdog",
                  "cannot start the watchdog thread: %s", strerror(rc));
    W.running = 1;
}

void watchdog_stop(void)
{
    if (!W.running)
        return;
    pthread_mutex_lock(&W.mu);
    W.stop = 1;
    pthread_cond_signal(&W.cv);
    pthread_mutex_unlock(&W.mu);
    pthread_join(W.thread, NULL);
    pthread_cond_destroy(&W.cv);
    W.running = 0;
}
