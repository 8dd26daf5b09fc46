/* straggler.c — the slowest rank against the median (straggler.h). */
#include "train/straggler.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/progress.h"

static struct {
    double step_s, compute_s; /* sums since the last report */
    int steps, first;
} S;

void straggler_begin(void)
{
    /* Waits outside steps (validation, checkpoints) are not the step's. */
    progress_take_blocked_s();
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void straggler_end(Comm *world, int step, double step_s, int every, double threshold)
{
    double compute = step_s - progress_take_blocked_s();
    if (S.steps == 0)
        S.first = step;
    S.step_s += step_s;
    S.compute_s += compute > 0 ? compute : 0;
    S.steps++;
    if (step % every != 0)
        return;
    const int n = world->size;
    if (n > 1) {
        /* Every rank's pair in its own slots; the sum all-reduce gathers them. */
        double *t = trd_calloc(3 * (size_t)n, sizeof(double), "straggler times");
        t[2 * world->rank] = S.step_s / S.steps;
        t[2 * world->rank + 1] = S.compute_s / S.steps;
        comm_allreduce_f64(world, t, 2 * (size_t)n);
        if (world->rank == 0) {
            double *sorted = t + 2 * n;
            int slow = 0;
            for (int r = 0; r < n; r++) {
                sorted[r] = t[2 * r + 1];
                if (t[2 * r + 1] > t[2 * slow + 1])
                    slow = r;
            }
            qsort(sorted, (size_t)n, sizeof(double), cmp_double);
            /* The lower middle: with two ranks, the other one. */
            const double median = sorted[(n - 1) / 2];
            if (median > 0 && t[2 * slow + 1] > threshold * median) {
                printf("straggler: rank %d computes %.1f ms per step over steps %d-%d, %.2fx the "
                       "median rank's %.1f ms (threshold %.2fx); its step takes %.1f ms, the "
                       "other ranks wait for it\n",
                       slow, 1e3 * t[2 * slow + 1], S.first, step, t[2 * slow + 1] / median,
                       1e3 * median, threshold, 1e3 * t[2 * slow]);
                fflush(stdout);
            }
        }
        free(t);
    }
    S.step_s = S.compute_s = 0;
    S.steps = 0;
}
