/* guard.c — training.nonfinite: stop or skip a step whose loss or gradient
 * norm is NaN or Inf (guard.h). */
#include "train/guard.h"

#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "core/error.h"

_Noreturn void guard_exit_agreed(int rank, int code, const char *hint, const char *fmt, ...)
{
    if (rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        trd_print_error(hint, fmt, ap);
        va_end(ap);
    }
    fflush(stdout);
    comm_finalize(); /* also safe before MPI started */
    exit(code);
}

int guard_nonfinite(NonfiniteGuard *g, const TrainingConfig *tc, int step, double loss,
                    double grad_norm, int rank)
{
    const int loss_ok = isfinite(loss), norm_ok = isfinite(grad_norm);
    if (loss_ok && norm_ok) {
        g->in_row = 0;
        return 0;
    }
    /* A NaN loss makes a NaN norm too: name the first of them. */
    const char *what = !loss_ok ? "loss" : "gradient norm";
    const double value = !loss_ok ? loss : grad_norm;
    if (tc->nonfinite == NONFINITE_STOP)
        guard_exit_agreed(rank, TRD_EXIT_RUNTIME,
                          "lower training.lr, raise warmup_steps or set grad_clip; or "
                          "training.nonfinite: skip to drop such steps",
                          "step %d: %s is %g (not finite); stopped before the update, so no "
                          "checkpoint holds it",
                          step, what, value);
    g->in_row++;
    g->total++;
    if (rank == 0) {
        printf("trident: warning: step %d: %s is %g (not finite): update skipped (%d in a row, "
               "%lld in this run; training.max_skipped %d)\n",
               step, what, value, g->in_row, g->total, tc->max_skipped);
        fflush(stdout);
    }
    if (g->in_row >= tc->max_skipped)
        guard_exit_agreed(rank, TRD_EXIT_RUNTIME,
                          "lower training.lr, raise warmup_steps or set grad_clip",
                          "step %d: %d steps in a row had a non-finite loss or gradient norm "
                          "(training.max_skipped %d); stopped",
                          step, g->in_row, tc->max_skipped);
    return 1;
}
