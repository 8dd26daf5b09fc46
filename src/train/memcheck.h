/* memcheck.h — before the trainer allocates: does the model fit the memory
 * its ranks run in?
 *
 * Every rank keeps its parameters, gradients, optimizer state, activations
 * and scratch in host memory (CPU backend) or device memory (CUDA).  A run
 * that cannot fit would otherwise get as far as its first large allocation,
 * or the kernel's OOM killer, which gives no message at all.  The bytes are
 * the planner's (plan_evaluate, `trident plan`): the same tables the model
 * and the ZeRO engine allocate from, for the most loaded pipeline rank, so
 * on the CPU backend they equal what the run allocates
 * (tests/test_plan_runs.sh).  The ranks that share the memory (a node's
 * ranks share its RAM; ranks beyond the GPU count share a GPU) multiply it. */
#ifndef TRD_TRAIN_MEMCHECK_H
#define TRD_TRAIN_MEMCHECK_H

#include "comm/comm.h"
#include "config/config.h"

/* The memory a rank's state lives in. */
typedef struct {
    double bytes;     /* capacity: RAM (or the cgroup limit), or one device's memory */
    int sharers;      /* ranks that share it, this one included */
    const char *what; /* "this machine's RAM", or the device's name */
} MemBudget;

/* Host RAM of this machine, or its cgroup (v2) limit when lower, shared by
 * ranks_per_node ranks. */
MemBudget memcheck_host_budget(int ranks_per_node);

/* The planner's bytes for the most loaded rank: total (what memcheck
 * compares) and host_ckpt (the checkpoint's host snapshot).  Returns 0, or
 * -1 (both 0) where it cannot evaluate cfg. */
int memcheck_plan(const Config *cfg, int ranks_per_node, double *total, double *host_ckpt);

/* Collective over world: exits 2 on every rank (rank 0 says what is needed
 * per category and how to fix it) when `sharers` ranks of the planner's
 * bytes for the most loaded rank exceed the budget on any rank.  cfg is
 * validated, dp a number; a config the planner cannot evaluate is not
 * refused here. */
void memcheck(const Config *cfg, int ranks_per_node, MemBudget budget, Comm *world);

#endif
