#include "core/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"

static volatile sig_atomic_t child_pid;

static void forward(int sig)
{
    if (child_pid > 0)
        kill((pid_t)child_pid, sig);
}

int launch_exit_code(int status, const char *what)
{
    if (WIFEXITED(status)) {
        int code = WEXITSTATUS(status);
        if (code == TRD_EXIT_OK || code == TRD_EXIT_INPUT || code == TRD_EXIT_PREEMPTED ||
            code == TRD_EXIT_RUNTIME)
            return code;
        fprintf(stderr,
                "trident: error: %s exited with status %d (a rank failed; "
                "its message is above)\n",
                what, code);
        return TRD_EXIT_RUNTIME;
    }
    if (WIFSIGNALED(status))
        fprintf(stderr, "trident: error: %s was killed by signal %d (%s)\n", what, WTERMSIG(status),
                strsignal(WTERMSIG(status)));
    return TRD_EXIT_RUNTIME;
}

int launch_wait(char *const argv[], const char *install_hint)
{
    /* A pipe closed on exec tells the parent whether exec worked. */
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        execvp(argv[0], argv);
        int err = errno;
        ssize_t w = write(fds[1], &err, sizeof err);
        (void)w;
        _exit(127);
    }
    close(fds[1]);
    child_pid = pid;
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGINT, SIG_IGN);

    int err = 0;
    ssize_t got;
    do
        got = read(fds[0], &err, sizeof err);
    while (got < 0 && errno == EINTR);
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "waitpid: %s", strerror(errno));
    if (got == (ssize_t)sizeof err)
        trd_fatal(TRD_EXIT_RUNTIME, install_hint, "cannot run %s: %s", argv[0], strerror(err));
    return launch_exit_code(status, argv[0]);
}
