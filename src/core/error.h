/* error.h — how trident fails: one message, a hint, a defined exit code.
 *
 * Exit codes (docs/design.md, invariant 3): 0 success, 2 bad input, 1 runtime
 * failure.  A fatal error on one rank takes the whole job down (the hook
 * comm_init registers aborts the MPI job), so no other rank is left
 * waiting in a collective. */
#ifndef TRD_ERROR_H
#define TRD_ERROR_H

#include <stdarg.h>
#include <stddef.h>

enum { TRD_EXIT_OK = 0, TRD_EXIT_RUNTIME = 1, TRD_EXIT_INPUT = 2 };
/* Stopped on SIGUSR1/SIGTERM after saving a checkpoint: run it again and it
 * resumes (the Slurm templates requeue the job on it; docs/slurm.md).  75 is
 * sysexits.h's EX_TEMPFAIL, "try again later". */
#define TRD_EXIT_PREEMPTED 75

/* Print "trident: error: <message>" and, when hint is not NULL,
 * "---> <hint>" on stderr (for a caller that ends the job its own way). */
void trd_print_error(const char *hint, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Called by trd_fatal before it exits (src/comm: end the whole job). */
void trd_on_fatal(void (*fn)(int code));

/* Print as trd_print_error, then end the job with `code`. */
_Noreturn void trd_fatal(int code, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Same, with the source location of the failing call (for runtime bugs). */
#define TRD_ASSERT(cond)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "%s:%d: %s", __FILE__, __LINE__, #cond);             \
    } while (0)

/* Checked allocations; `what` names the buffer in the out-of-memory message. */
void *trd_malloc(size_t bytes, const char *what);
void *trd_calloc(size_t count, size_t size, const char *what);

/* Functions that report bad input return -1 with a message in a caller's
 * buffer of TRD_ERR bytes (the same size as CFG_ERR); this formats it. */
#define TRD_ERR 1024
int trd_errorf(char err[TRD_ERR], const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "1, 2, 4, 8": the divisors of n, for "use one of" hints. */
void trd_divisors(int n, char *out, size_t size);

/* Byte sizes in MiB for reports. */
static inline double trd_mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

#endif
