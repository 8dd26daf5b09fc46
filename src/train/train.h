/* train.h — the step loop and the `train` / `run` commands.
 *
 * One optimizer step: zero gradients; for each micro-batch, forward and
 * backward (gradients accumulate, scaled by 1/micro-batches); global
 * gradient norm and clipping; AdamW at the scheduled learning rate; metrics;
 * validation every data.val_every steps and at the end. */
#ifndef TRD_TRAIN_H
#define TRD_TRAIN_H

#include "comm/comm.h"
#include "config/config.h"

/* trident train CONFIG [--set key.path=value ...] */
int train_main(int argc, char **argv);

/* trident run CONFIG [--set ...] [-n WORLD]: exec mpiexec -n WORLD trident train ... */
int run_main(int argc, char **argv);

/* `trident eval` (src/cli/eval.c): the trainer of cfg on this job's ranks
 * (any layout), weights from cfg->checkpoint.init_from, no optimizer step:
 * the validation pass over the first data.val_sequences sequences of
 * data.val_path, the same sequences in the same order on every layout.
 * Returns the mean loss per token on every rank, and the tokens counted.
 * Writes nothing under run.dir except a Hugging Face import into
 * run.dir/init_from.  Collective over world; bad input exits 2. */
typedef struct {
    double loss, tokens;
} EvalResult;
EvalResult train_evaluate(const Config *cfg, Comm world);

/* SGEMM FLOP/s of this machine's CPU BLAS (best of a few 1024^3 products):
 * the physical limit that CPU MFU is measured against. */
double train_cpu_peak_flops(void);

#endif
