/* test_guard.c — training.nonfinite (src/train/guard.h) without MPI:
 * finite values pass; skip drops the update, names the loss or the
 * gradient norm and stops after max_skipped in a row; stop exits 1 naming
 * the step and the value (run in a child process, its stderr captured). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"
#include "train/guard.h"

/* Run guard_nonfinite in a child; its exit status (-1: it returned) and
 * the start of what it printed. */
static int in_child(const TrainingConfig *tc, NonfiniteGuard g, int step, double loss, double norm,
                    char *out, size_t n)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        guard_nonfinite(&g, tc, step, loss, norm, 0);
        _exit(100); /* returned */
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fds[0], out + got, n - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -3;
}

int main(void)
{
    Config cfg;
    config_defaults(&cfg);
    TrainingConfig tc = cfg.training;
    CHECK(tc.nonfinite == NONFINITE_STOP && tc.max_skipped == 10, "defaults stop, 10");
    NonfiniteGuard g = {0};
    CHECK(guard_nonfinite(&g, &tc, 1, 2.5, 0.7, 1) == 0, "finite values pass");

    char out[2048];
    int rc = in_child(&tc, g, 7, 2.5, INFINITY, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "step 7: gradient norm is inf"),
          "stop on an infinite norm: "
          "exit %d, '%s'",
          rc, out);
    rc = in_child(&tc, g, 8, NAN, NAN, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "step 8: loss is") && strstr(out, "nan"),
          "stop on a NaN loss: exit %d, '%s'", rc, out);

    tc.nonfinite = NONFINITE_SKIP;
    tc.max_skipped = 3;
    rc = in_child(&tc, g, 9, 2.5, NAN, out, sizeof out);
    CHECK(rc == 100 && strstr(out, "step 9: gradient norm is") && strstr(out, "update skipped"),
          "skip returns and says so: exit %d, '%s'", rc, out);
    /* Two skips, a good step resets the count, two more: no stop yet. */
    int skipped = 0;
    for (int s = 0; s < 2; s++)
        skipped += guard_nonfinite(&g, &tc, 10 + s, NAN, NAN, 1);
    CHECK(guard_nonfinite(&g, &tc, 12, 1.0, 1.0, 1) == 0 && g.in_row == 0,
          "a finite step resets the row");
    for (int s = 0; s < 2; s++)
        skipped += guard_nonfinite(&g, &tc, 13 + s, 1.0, INFINITY, 1);
    CHECK(skipped == 4 && g.in_row == 2 && g.total == 4, "skipped %d, in a row %d, total %lld",
          skipped, g.in_row, g.total);
    rc = in_child(&tc, g, 15, NAN, NAN, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "3 steps in a row"), "max_skipped in a row stops: exit %d, '%s'",
          rc, out);
    return check_summary("guard");
}
