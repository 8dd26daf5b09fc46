/* preempt.h — stopping a run cleanly on a signal (Slurm preemption, time limit).
 *
 * SIGUSR1, SIGTERM and SIGINT (Ctrl-C) only set a flag (the handler is
 * async-signal-safe; a second SIGINT exits at once).
 * After every step the ranks all-reduce the flag (MAX over the world), so
 * they all agree on the same step to stop at even though the signal reaches
 * them at different moments; the trainer then saves a checkpoint and exits
 * with TRD_EXIT_PREEMPTED (src/core/error.h), which the Slurm templates turn
 * into a requeue (docs/slurm.md). */
#ifndef TRD_PREEMPT_H
#define TRD_PREEMPT_H

#include "comm/comm.h"

/* Install the handlers for SIGUSR1, SIGTERM and SIGINT, and clear the flag.  Call
 * after MPI is initialised, so the handlers are ours.  The first signal also
 * starts a timer: a rank still running TRIDENT_PREEMPT_GRACE seconds later
 * (default 300; 0: never) exits 1 with a message, so a rank stuck in a
 * collective still ends on SIGTERM, as it did before the handler. */
void preempt_install(void);

/* Whether a signal arrived on this rank (no communication). */
int preempt_requested(void);

/* Collective over `world`: whether any rank has seen a signal.  Every rank
 * gets the same answer, so all stop after the same step.  One int MAX
 * all-reduce; call it at the same point of every step on every rank. */
int preempt_agree(Comm *world);

#endif
