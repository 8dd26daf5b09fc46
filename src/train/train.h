/* train.h — the step loop and the `train` / `run` commands.
 *
 * One optimizer step: zero gradients; for each micro-batch, forward and
 * backward (gradients accumulate, scaled by 1/micro-batches); global
 * gradient norm and clipping; AdamW at the scheduled learning rate; metrics;
 * validation every data.val_every steps and at the end. */
#ifndef TRD_TRAIN_H
#define TRD_TRAIN_H

/* trident train CONFIG [--set key.path=value ...] */
int train_main(int argc, char **argv);

/* trident run CONFIG [--set ...] [-n WORLD]: exec mpiexec -n WORLD trident train ... */
int run_main(int argc, char **argv);

/* SGEMM FLOP/s of this machine's CPU BLAS (best of a few 1024^3 products):
 * the physical limit that CPU MFU is measured against. */
double train_cpu_peak_flops(void);

#endif
