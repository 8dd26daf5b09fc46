/* memcheck.h — before the trainer allocates: does the model's state fit?
 *
 * On the CPU backend every rank keeps its parameters, gradients and Adam
 * state in host memory.  A model whose state cannot fit the machine would
 * otherwise get as far as its first large allocation (or the kernel's OOM
 * killer, which gives no message at all).  This check estimates the state a
 * rank holds from the config alone (a lower bound: the average rank, no
 * activations), multiplies it by the ranks sharing the node, and refuses a
 * run that needs more than the machine's RAM. */
#ifndef TRD_TRAIN_MEMCHECK_H
#define TRD_TRAIN_MEMCHECK_H

#include <stdint.h>

#include "comm/comm.h"
#include "config/config.h"

/* Bytes of parameters, gradients and optimizer state on the average rank
 * (a lower bound of the busiest rank's), from a validated config. */
double memcheck_state_bytes(const Config *cfg);

/* Collective over world: exits 2 on every rank (rank 0 says what is needed
 * and how to fix it) when ranks_per_node ranks of this need exceed the
 * RAM.  Device backends keep the state on the device: nothing to check. */
void memcheck_host(const Config *cfg, int ranks_per_node, int device_backend, Comm *world);

#endif
