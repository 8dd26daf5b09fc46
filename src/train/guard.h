/* guard.h — what the trainer does with a non-finite loss or gradient norm
 * (training.nonfinite), and ending a job on a verdict every rank shares.
 *
 * The loss and the global gradient norm are all-reduced before they are
 * checked, so every rank reaches the same decision at the same step without
 * another collective; the check runs before the optimizer step, so a NaN
 * never reaches the weights, the optimizer state or a checkpoint. */
#ifndef TRD_GUARD_H
#define TRD_GUARD_H

#include "config/config.h"

typedef struct {
    int in_row;      /* consecutive skipped steps up to now */
    long long total; /* skipped steps of this run */
} NonfiniteGuard;

/* Check step `step` (1-based) before its update.  Both finite: returns 0
 * (apply the update).  Otherwise, nonfinite: stop -> every rank exits 1,
 * rank 0 naming the step and the value; skip -> returns 1 (drop the update;
 * the step still counts and its data is consumed), printing the skip on
 * rank 0, and exits 1 once max_skipped steps in a row were skipped. */
int guard_nonfinite(NonfiniteGuard *g, const TrainingConfig *tc, int step, double loss,
                    double grad_norm, int rank);

/* Every rank has reached the same verdict (all-reduced values, or an
 * agreed error from a collective): rank 0 prints it once, all ranks leave
 * MPI cleanly and exit with `code`.  (trd_fatal is for a failure one rank
 * sees alone: it aborts the job, and each failing rank prints.) */
_Noreturn void guard_exit_agreed(int rank, int code, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
