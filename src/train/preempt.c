/* preempt.c — signal flag and the per-step agreement on when to stop. */
#include "train/preempt.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

/* Written by the handler, read by the step loop: sig_atomic_t is the only
 * type a handler may store to portably. */
static volatile sig_atomic_t preempt_flag;
static unsigned preempt_grace_s; /* read once at install, used by the handler */

static void preempt_handler(int signo)
{
    /* Ctrl-C twice: the user does not want to wait for the checkpoint. */
    if (signo == SIGINT && preempt_flag)
        _exit(128 + SIGINT);
    /* Catching SIGTERM means a rank stuck in a collective would no longer
     * die on it (timeout, mpiexec and Slurm send SIGTERM first); the alarm
     * bounds how long a stop may take. */
    if (!preempt_flag && preempt_grace_s > 0)
        alarm(preempt_grace_s);
    preempt_flag = 1;
}

/* Only async-signal-safe calls: write and _exit. */
static void preempt_overdue(int signo)
{
    (void)signo;
    static const char msg[] =
        "trident: error: still running TRIDENT_PREEMPT_GRACE seconds after SIGUSR1/SIGTERM "
        "(a rank stuck in communication, or a checkpoint save slower than that); exiting\n"
        "---> the last complete checkpoint is kept; raise TRIDENT_PREEMPT_GRACE if saves "
        "take longer\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(TRD_EXIT_RUNTIME);
}

/* TRIDENT_PREEMPT_GRACE: seconds from the first signal to a forced exit;
 * 0 turns the limit off.  Bad values are input errors. */
static unsigned grace_from_env(void)
{
    const char *s = getenv("TRIDENT_PREEMPT_GRACE");
    if (!s || !*s)
        return 300;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > INT_MAX)
        trd_fatal(TRD_EXIT_INPUT, "set it to a number of seconds (0: no limit)",
                  "TRIDENT_PREEMPT_GRACE '%s' is not a whole number >= 0", s);
    return (unsigned)v;
}

static void install(int signo, void (*fn)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    /* SA_RESTART: a signal during a blocking read or MPI wait must not turn
     * into an EINTR failure somewhere deep in the step. */
    sa.sa_flags = SA_RESTART;
    if (sigaction(signo, &sa, NULL) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot install the handler of signal %d: %s", signo,
                  strerror(errno));
}

void preempt_install(void)
{
    preempt_flag = 0;
    preempt_grace_s = grace_from_env();
    install(SIGALRM, preempt_overdue);
    install(SIGUSR1, preempt_handler);
    install(SIGTERM, preempt_handler);
    install(SIGINT, preempt_handler); /* Ctrl-C: the same clean stop, a second one exits */
}

int preempt_requested(void) { return preempt_flag != 0; }

int preempt_agree(Comm *world)
{
    int stop = preempt_flag != 0;
    comm_allreduce_max_i32(world, &stop, 1);
    return stop;
}
