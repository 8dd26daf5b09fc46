/* progress.c — the progress record the watchdog reads (progress.h). */
#include "core/progress.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct {
    _Atomic uint64_t ticks;
    int step, micro;
    int waiting; /* a wait is described */
    int timed;   /* ... and counts as blocked time from `since` */
    char op[32], group[16], members[64];
    int peer;
    double since;   /* monotonic start of the open wait */
    double blocked; /* seconds in closed waits since progress_take_blocked_s */
} P;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void copy(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src ? src : "");
}

void progress_step(int step, int micro)
{
    P.step = step;
    P.micro = micro;
    P.waiting = P.timed = 0;
    atomic_fetch_add_explicit(&P.ticks, 1, memory_order_release);
}

static void describe(const char *op, const char *group, const char *members, int peer)
{
    copy(P.op, sizeof P.op, op);
    copy(P.group, sizeof P.group, group);
    copy(P.members, sizeof P.members, members);
    P.peer = peer;
    P.waiting = 1;
}

void progress_micro(int micro) { progress_step(P.step, micro); }

void progress_wait(const char *op, const char *group, const char *members, int peer)
{
    /* A polling loop calls this once per poll: the wait started at the first. */
    if (!P.timed || strcmp(P.op, op) != 0 || P.peer != peer) {
        P.since = mono();
        P.timed = 1;
    }
    describe(op, group, members, peer);
}

void progress_poll(const char *op, const char *group, const char *members, int peer)
{
    describe(op, group, members, peer);
}

void progress_done(void)
{
    if (P.timed)
        P.blocked += mono() - P.since;
    P.waiting = P.timed = 0;
    atomic_fetch_add_explicit(&P.ticks, 1, memory_order_release);
}

int progress_started(void) { return P.step > 0; }
double progress_wait_s(void) { return P.waiting && P.timed ? mono() - P.since : -1; }

uint64_t progress_ticks(void) { return atomic_load_explicit(&P.ticks, memory_order_acquire); }

void progress_describe(char *buf, size_t len)
{
    int n = 0;
    if (P.waiting && P.peer >= 0)
        n = snprintf(buf, len, "in %s rank %d on group %s (ranks %s)", P.op, P.peer, P.group,
                     P.members);
    else if (P.waiting)
        n = snprintf(buf, len, "in %s on group %s (ranks %s)", P.op, P.group, P.members);
    else
        n = snprintf(buf, len, "outside communication");
    if (n < 0 || (size_t)n >= len)
        return;
    if (P.step > 0 && P.micro > 0)
        snprintf(buf + n, len - (size_t)n, " at step %d micro-batch %d", P.step, P.micro);
    else if (P.step > 0)
        snprintf(buf + n, len - (size_t)n, " at step %d", P.step);
    else
        snprintf(buf + n, len - (size_t)n, " before the first step");
}

int progress_waiting_on(int *ranks, int max)
{
    if (!P.waiting || max <= 0)
        return 0;
    if (P.peer >= 0) {
        ranks[0] = P.peer;
        return 1;
    }
    /* The list as src/comm writes it: "1,3", "0-7", or cut with ",...". */
    int n = 0;
    for (const char *s = P.members; *s && n < max;) {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s)
            break;
        if (*end == '-') {
            s = end + 1;
            hi = strtol(s, &end, 10);
            if (end == s)
                break;
        }
        for (long r = lo; r <= hi && n < max; r++)
            ranks[n++] = (int)r;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

double progress_take_blocked_s(void)
{
    double b = P.blocked;
    if (P.timed) { /* count an open wait up to now, the rest goes to the next period */
        const double t = mono();
        b += t - P.since;
        P.since = t;
    }
    P.blocked = 0;
    return b;
}
