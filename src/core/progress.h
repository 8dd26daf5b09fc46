/* progress.h — what this rank is doing, for the watchdog (src/train/watchdog.h).
 *
 * The trainer marks each step and micro-batch; src/comm marks the start of
 * every wait on other ranks (a blocking collective, a receive, a wait on a
 * non-blocking operation) and its completion.  Completions and marks bump a
 * counter: a counter that stops moving is a rank that makes no progress,
 * and the last wait recorded says on what and on whom.  Polling a request
 * that is not complete is not progress.
 *
 * Written by the main thread only, read by the watchdog thread: the counter
 * is atomic; the description is plain memory the watchdog reads only once
 * the counter has stood still for seconds, when the main thread is not
 * writing it (a torn read could garble the message, never crash: every
 * string stays NUL-terminated). */
#ifndef TRD_CORE_PROGRESS_H
#define TRD_CORE_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

/* The trainer is at step (1-based) and micro-batch (1-based; 0: none). */
void progress_step(int step, int micro);
/* The same step, at micro-batch `micro` (the pipeline executor's forwards
 * and backwards). */
void progress_micro(int micro);

/* About to wait for other ranks: op ("all-reduce", or "receive from" /
 * "send to" for point-to-point, which the peer's rank follows), the group's name
 * ("dp") and its members as world ranks ("1,3"), peer the other world
 * rank of a point-to-point operation (-1: none).  Strings are copied. */
void progress_wait(const char *op, const char *group, const char *members, int peer);
/* The same description without blocked time: a test of a request that is
 * not complete (between computations it is no wait; in a polling loop the
 * watchdog still learns what the loop waits for). */
void progress_poll(const char *op, const char *group, const char *members, int peer);
/* The wait ended (the operation completed): progress. */
void progress_done(void);

/* Whether the trainer has marked a step (start-up is over). */
int progress_started(void);
/* Seconds the open wait on other ranks has lasted, or -1 when none is
 * open. */
double progress_wait_s(void);

/* Bumped by every mark and completion. */
uint64_t progress_ticks(void);
/* "in all-reduce on group dp (ranks 0,1) at step 5 micro-batch 2", or
 * "outside communication at step 5" when no wait is open. */
void progress_describe(char *buf, size_t len);
/* The world ranks the open wait waits for: the peer of a point-to-point
 * operation, or the group's members (as far as the recorded list goes).
 * Returns how many were written to ranks (at most max); 0 when no wait is
 * open. */
int progress_waiting_on(int *ranks, int max);
/* Seconds spent in waits since the last call (resets the sum). */
double progress_take_blocked_s(void);

#endif
