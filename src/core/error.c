#include "core/error.h"

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

static void (*on_fatal)(int code);

_Noreturn void trd_fatal(int code, const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    trd_print_error(hint, fmt, ap);
    va_end(ap);

    /* With more than one rank, a plain exit would leave the others blocked
     * in their next collective: the hook (comm_init's) aborts the job. */
    if (on_fatal)
        on_fatal(code);
    exit(code);
}

void trd_on_fatal(void (*fn)(int code)) { on_fatal = fn; }

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
