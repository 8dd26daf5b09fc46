/* train.h — the `train` command's run: the loop over the trainer
 * (trainer.h) with everything a run records around it.
 *
 * Per step: the optimizer step, metrics.jsonl and TensorBoard (rank 0),
 * validation every data.val_every steps and at the end, a sample every
 * training.sample_every steps, a checkpoint every checkpoint.every steps
 * and at the end, the watchdog and the straggler report, and preemption
 * (SIGUSR1/SIGTERM/SIGINT: every rank stops after the same step, saved). */
#ifndef TRD_TRAIN_H
#define TRD_TRAIN_H

#include "comm/comm.h"
#include "config/config.h"

/* Train cfg (validated for world->size) on world; returns the exit code:
 * 0, or TRD_EXIT_PREEMPTED after an agreed stop.  Collective. */
int train_run(const Config *cfg, Comm world);

#endif
