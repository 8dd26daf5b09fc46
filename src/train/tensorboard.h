/* tensorboard.h — the run's scalars as TensorBoard event files (rank 0):
 * <run.dir>/tb/events.out.tfevents.<unix time>.<hostname>.<pid>.trident.
 *
 * A file is a TFRecord stream of Event protocol buffers (tb_event.proto):
 * a first event naming the format ("brain.Event:2"), then one event per
 * step with a Summary of simple values tagged like metrics.jsonl's keys
 * (loss, val_loss, lr, grad_norm, tokens_per_s, mfu, step_ms), and once,
 * at the run's first step, memory_bytes/<category>.  Every run, resumed
 * ones too, starts a file of its own: TensorBoard merges the files of a
 * directory by step.  Every write is checked; a failed one ends the job
 * (exit 1) naming the file. */
#ifndef TRD_TENSORBOARD_H
#define TRD_TENSORBOARD_H

#include <stdio.h>

#include "train/metrics.h"

typedef struct {
    FILE *f; /* NULL: not writing (run.tensorboard false) */
    char path[1280];
} TbWriter;

/* Creates <run_dir>/tb/ and a new events file in it, and writes the
 * file-version event; exits 1 on failure. */
void tb_open(TbWriter *tb, const char *run_dir);

/* One event at s->step with the step's scalars (val_loss when computed). */
void tb_record(TbWriter *tb, const StepMetrics *s);

/* One event at step with n values tagged <prefix>/<names[i]>, each rounded
 * as metrics.jsonl prints it (fmts[i]; NULL: whole numbers, as the memory
 * table's bytes per category). */
void tb_record_values(TbWriter *tb, int step, const char *prefix, const char *const *names,
                      const double *values, const char *const *fmts, int n);

void tb_close(TbWriter *tb);

#endif
