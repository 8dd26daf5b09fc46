/* launch.h — run a launcher (mpiexec) as a child and give its outcome as a
 * trident exit code (docs/design.md, invariant 3).
 *
 * `trident run` must exit 0, 2 (bad input), 75 (stopped after saving) or 1
 * (any runtime failure), whatever the launcher does with a rank that fails:
 * MPICH's mpiexec passes on the largest exit code of its ranks, or 128+N
 * (or its own codes) when a rank dies of signal N. */
#ifndef TRD_LAUNCH_H
#define TRD_LAUNCH_H

/* Fork, exec argv[0] (a PATH search) with argv, wait for it and map its
 * status: exit 0, 2 and 75 are kept, every other exit and every death by a
 * signal becomes 1 (with one line saying what the launcher returned).
 * SIGTERM, SIGUSR1 and SIGHUP sent to this process are passed on to the
 * child, which forwards them to the ranks (a preemption reaches them);
 * SIGINT is ignored here, since the terminal's Ctrl-C already reaches the
 * child, which is in the same process group.  Returns 1 with a message
 * when argv[0] cannot be run at all (hint: what to install). */
int launch_wait(char *const argv[], const char *install_hint);

/* The same mapping, for a status returned by waitpid (tests). */
int launch_exit_code(int status, const char *what);

#endif
