/* watchdog.c — the hang watchdog thread (watchdog.h). */
#include "train/watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "core/progress.h"
#include "comm/trace.h"

static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, stop;
    int timeout_s, rank, trace;
    char run_dir[CFG_STR];
    int beat_fd;        /* this rank's slot in the heartbeat file, or -1 */
    double beat_every;  /* seconds between heartbeats */
    double longest_gap; /* longest time seen between two progress marks */
} W = {.mu = PTHREAD_MUTEX_INITIALIZER, .beat_fd = -1};

/* The heartbeat file <run.dir>/.trident.heartbeat: one fixed-size text
 * slot per world rank at offset rank * SLOT, rewritten by that rank's
 * watchdog every beat_every seconds (about a tenth of the timeout, 0.5 to
 * 30 s): "rank R beat T progress T' | <where>", wall-clock seconds.  A
 * stopped, hard-hung or vanished rank stops beating, so the rank whose
 * watchdog fires can tell the peers it waits for that are gone from the
 * ones that are alive and waiting too, and name them.  One small write
 * per rank and beat; slots of 512 bytes so that ranks of different nodes
 * rarely share a file-system page.  On a run.dir that is not shared between
 * nodes a rank sees only its own node's slots (docs/reliability.md). */
enum { SLOT = 512 };

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double mono(void) { return clock_s(CLOCK_MONOTONIC); }
static double wall(void) { return clock_s(CLOCK_REALTIME); }

static void heartbeat_path(char *buf, size_t len)
{
    snprintf(buf, len, "%s/.trident.heartbeat", W.run_dir);
}

/* Write this rank's slot: alive now, last progress `progressed` (wall
 * time), and where it is when it has been idle for a beat.  Best effort:
 * a failed write only leaves the slot older. */
/* The heartbeat file, once the run directory exists (the watchdog starts
 * before start-up makes it); other failures are said once. */
static void open_beat(void)
{
    static int warned;
    char path[CFG_STR + 32];
    heartbeat_path(path, sizeof path);
    W.beat_fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (W.beat_fd < 0 && errno != ENOENT && !warned) {
        warned = 1;
        fprintf(stderr,
                "trident: warning: rank %d: cannot open %s (%s): a hang will not name "
                "stopped peers\n",
                W.rank, path, strerror(errno));
    }
}

static void beat(double progressed, int idle)
{
    if (W.beat_fd < 0)
        open_beat();
    if (W.beat_fd < 0)
        return;
    char slot[SLOT], where[256] = "making progress";
    if (idle)
        progress_describe(where, sizeof where);
    int n = snprintf(slot, sizeof slot, "rank %d beat %.3f progress %.3f | %s", W.rank, wall(),
                     progressed, where);
    if (n < 0 || n > SLOT - 1)
        n = SLOT - 1;
    memset(slot + n, ' ', (size_t)(SLOT - 1 - n));
    slot[SLOT - 1] = '\n';
    ssize_t w = pwrite(W.beat_fd, slot, SLOT, (off_t)W.rank * SLOT);
    (void)w;
}

/* What the heartbeat file says of world rank r, as one line. */
static void describe_peer(int r, int fd, char *out, size_t len)
{
    char slot[SLOT + 1];
    int who = -1;
    double beat_t = 0, prog_t = 0;
    int off = 0;
    ssize_t got = fd >= 0 ? pread(fd, slot, SLOT, (off_t)r * SLOT) : -1;
    if (got == SLOT) {
        slot[SLOT] = '\0';
        if (sscanf(slot, "rank %d beat %lf progress %lf | %n", &who, &beat_t, &prog_t, &off) < 3)
            who = -1;
    }
    if (who != r) {
        snprintf(out, len,
                 "rank %d: no heartbeat record (a run.dir not shared with its node, "
                 "or it never started)",
                 r);
        return;
    }
    char *end = slot + SLOT - 1;
    while (end > slot + off && (end[-1] == ' ' || end[-1] == '\n'))
        end--;
    *end = '\0';
    const double now = wall(), silent = now - beat_t;
    if (silent > 3 * W.beat_every + 1)
        snprintf(out, len,
                 "rank %d: no heartbeat for %.0f s: STOPPED, hung hard or its node is "
                 "gone (its last record: no progress for %.0f s, %s)",
                 r, silent, beat_t - prog_t, slot + off);
    else
        snprintf(out, len, "rank %d: alive, no progress for %.0f s, %s", r, now - prog_t,
                 slot + off);
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

/* The timeout in force: training.hang_timeout, or five times the longest
 * gap between progress marks seen so far when that is longer (a model
 * whose steps take minutes is not a hang). */
static double timeout_of(void)
{
    const double scaled = 5 * W.longest_gap;
    return scaled > W.timeout_s ? scaled : W.timeout_s;
}

/* No progress for the timeout: say where, keep the trace, end the job.
 * The main thread is stuck, so this thread is the only one writing. */
static _Noreturn void fire(double idle)
{
    char where[256];
    progress_describe(where, sizeof where);
    say("trident: error: rank %d: no progress for %.0f s %s\n", W.rank, idle, where);
    /* Under NCCL the open wait above may be long over: the collective that
     * holds the GPU is NCCL's last unfinished operation. */
    char nccl[320];
    if (comm_unfinished(nccl, sizeof nccl))
        say("trident: rank %d: %s\n", W.rank, nccl);
    /* The ranks it waits for, as their heartbeats tell. */
    int peers[64];
    const int np = progress_waiting_on(peers, 64);
    char path[CFG_STR + 32];
    heartbeat_path(path, sizeof path);
    const int fd = np > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    for (int i = 0; i < np; i++) {
        if (peers[i] == W.rank)
            continue;
        char line[SLOT + 256];
        describe_peer(peers[i], fd, line, sizeof line);
        say("trident: rank %d waits for %s\n", W.rank, line);
    }
    if (fd >= 0)
        close(fd);
    say("---> a rank marked STOPPED is the one to look at (its own message, or none if the "
        "machine went away); ending the job so it can be requeued.  The timeout was %.0f s "
        "(training.hang_timeout %d s, or 5x the longest gap between progress marks seen, "
        "%.1f s): raise training.hang_timeout if a step or checkpoint legitimately takes "
        "longer\n",
        timeout_of(), W.timeout_s, W.longest_gap);
    if (W.trace) {
        char path[CFG_STR + 32];
        snprintf(path, sizeof path, "%s/trace.rank%d.json", W.run_dir, W.rank);
        long n = trace_write_rank(path);
        if (n >= 0)
            say("trident: rank %d: trace so far (%ld spans) in %s\n", W.rank, n, path);
        else
            say("trident: rank %d: cannot write %s: %s\n", W.rank, path, strerror(errno));
    }
    /* From this thread (MPI runs calls from any thread: comm_init asks for
     * MPI_THREAD_MULTIPLE): the main thread is blocked (inside MPI, often)
     * and will not call again, and MPICH's abort asks the launcher to kill
     * the job without touching the communicators.  The pause lets the
     * launcher forward our message. */
    nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
    comm_abort(TRD_EXIT_RUNTIME);
}

static void *watch(void *arg)
{
    (void)arg;
    /* Look a few times per timeout, at most once a second. */
    const double period = W.timeout_s >= 5 ? 1.0 : W.timeout_s / 5.0;
    uint64_t seen = progress_ticks();
    int started_seen = progress_started();
    double since = mono(), progressed = wall(), last_beat = -1e30;
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
        /* NCCL's asynchronous errors, polled while the main thread waits
         * (it may be stuck in a kernel that will never finish): abort. */
        char why[320];
        if (comm_async_fault(why, sizeof why)) {
            say("trident: error: rank %d: %s\n", W.rank, why);
            say("---> NCCL_DEBUG=WARN says more; the failed peer's own log says why it failed; "
                "aborting the NCCL communicators and ending the job so it can be requeued\n");
            nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
            comm_abort(TRD_EXIT_RUNTIME);
        }
        const uint64_t now_ticks = progress_ticks();
        const double now = mono();
        /* Before the first step only a wait on other ranks (NCCL's
         * initialisation, a collective of the checkpoint load) can fire:
         * start-up's own work (data, model, the SGEMM probe) has no marks
         * and may take longer than a tight timeout, and its gaps do not
         * count toward the longest gap. */
        const int started = progress_started();
        if (now_ticks != seen) {
            if (started && started_seen && now - since > W.longest_gap)
                W.longest_gap = now - since;
            started_seen = started;
            seen = now_ticks;
            since = now;
            progressed = wall();
        } else if (started ? now - since >= timeout_of() : progress_wait_s() >= timeout_of()) {
            beat(progressed, 1);
            fire(started ? now - since : progress_wait_s());
        }
        if (now - last_beat >= W.beat_every) {
            beat(progressed, now - since >= period);
            last_beat = now;
        }
    }
    pthread_mutex_unlock(&W.mu);
    return NULL;
}

void watchdog_start(int timeout_s, int world_rank, int world_size, const char *run_dir, int trace)
{
    if (timeout_s <= 0 || world_size < 2 || W.running)
        return;
    W.timeout_s = timeout_s;
    W.rank = world_rank;
    W.trace = trace;
    W.stop = 0;
    snprintf(W.run_dir, sizeof W.run_dir, "%s", run_dir);
    W.longest_gap = 0;
    W.beat_every = timeout_s / 10.0 < 0.5 ? 0.5 : timeout_s / 10.0 > 30 ? 30 : timeout_s / 10.0;
    W.beat_fd = -1;
    open_beat();
    beat(wall(), 0); /* the slot exists from the start: a rank stopped at once is named too */
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
    if (W.beat_fd >= 0)
        close(W.beat_fd);
    W.beat_fd = -1;
    W.running = 0;
}
