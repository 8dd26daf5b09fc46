#include "core/error.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void trd_print_error(const char *hint, const char *fmt, va_list ap)
{
    fputs("trident: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    if (hint)
        fprintf(stderr, "---> %s\n", hint);
    fflush(stderr);
}

_Noreturn void trd_fatal(int code, const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    trd_print_error(hint, fmt, ap);
    va_end(ap);

    /* With more than one rank, a plain exit would leave the others blocked
     * in their next collective: abort the whole job instead. */
    int initialized = 0, finalized = 0, size = 1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (size > 1) {
            /* The launcher forwards our stderr asynchronously and drops
             * what it has not forwarded when the abort tears the job down:
             * give it a moment to pass the message on. */
            nanosleep(&(struct timespec){.tv_nsec = 200 * 1000 * 1000}, NULL);
            MPI_Abort(MPI_COMM_WORLD, code);
        }
        MPI_Finalize();
    }
    exit(code);
}

void *trd_malloc(size_t bytes, const char *what)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        trd_fatal(TRD_EXIT_RUNTIME, "reduce model size or batch, or use more ranks",
                  "out of memory allocating %.1f MiB for %s", trd_mib(bytes), what);
    return p;
}

void *trd_calloc(size_t count, size_t size, const char *what)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        trd_fatal(TRD_EXIT_RUNTIME, "reduce model size or batch, or use more ranks",
                  "out of memory allocating %.1f MiB for %s", trd_mib(count * size), what);
    return p;
}

int trd_errorf(char err[TRD_ERR], const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, TRD_ERR, fmt, ap);
    va_end(ap);
    return -1;
}

void trd_divisors(int n, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int d = 1; d <= n && used < size; d++) {
        if (n % d)
            continue;
        int w = snprintf(out + used, size - used, "%s%d", used ? ", " : "", d);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}
