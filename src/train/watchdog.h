/* watchdog.h — a rank that stops making progress ends the job.
 *
 * A thread per rank watches the progress counter (core/progress.h): the
 * trainer bumps it at every step and micro-batch, src/comm at every
 * completed wait on other ranks.  When it has not moved for the timeout
 * (training.hang_timeout seconds, or 5x the longest gap between marks seen
 * so far when longer) the watchdog prints, from this rank, what the rank
 * was waiting for ("rank 3: no progress for 10 s in all-reduce on group dp
 * (ranks 1,3) at step 5 micro-batch 2") and, from the heartbeat file
 * <run.dir>/.trident.heartbeat that every rank's watchdog rewrites, which of
 * those ranks stopped beating (stopped, dead, node gone) and which are
 * alive and waiting themselves; writes this rank's trace
 * so far when tracing (<run.dir>/trace.rank<N>.json), and calls
 * MPI_Abort(MPI_COMM_WORLD, 1): the job ends with exit 1 instead of hanging
 * until the scheduler's time limit, and Slurm can requeue it.
 * docs/reliability.md says how to choose the timeout. */
#ifndef TRD_TRAIN_WATCHDOG_H
#define TRD_TRAIN_WATCHDOG_H

/* Start watching (timeout_s 0: do nothing).  run_dir and trace are where
 * and whether to write this rank's trace on a hang.  A job of one rank is
 * not watched: it waits for nobody, and without communication its only
 * marks are micro-batches, which a big model on the CPU can take minutes
 * to compute. */
void watchdog_start(int timeout_s, int world_rank, int world_size, const char *run_dir, int trace);
/* Stop and join the thread (before the communicators go away). */
void watchdog_stop(void);

#endif
