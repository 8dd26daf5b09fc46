/* straggler.h — which rank slows the job down.
 *
 * In synchronous training every rank's step takes as long as the slowest
 * rank's: the others wait for it in their collectives.  So the step time
 * does not tell who is slow; the time a rank spends outside those waits
 * (its compute: step time minus the time blocked in communication,
 * core/progress.h) does.  Every run.log_every steps rank 0 gathers each
 * rank's step and compute time over those steps and names the rank whose
 * compute time is more than training.straggler_threshold (default 1.2)
 * times the median: a slow node, a throttled GPU, a noisy neighbour. */
#ifndef TRD_TRAIN_STRAGGLER_H
#define TRD_TRAIN_STRAGGLER_H

#include "comm/comm.h"

/* Around every step: begin, then end with the step's wall time (seconds).
 * end is collective over world on the steps where step % every == 0. */
void straggler_begin(void);
void straggler_end(Comm *world, int step, double step_s, int every, double threshold);

#endif
