/* check.h — the tiny assertion kit of the C unit tests.
 * CHECK counts and reports; a test's main ends with `return check_summary(name)`,
 * which exits non-zero when any check failed or when no check ran at all. */
#ifndef TRD_TEST_CHECK_H
#define TRD_TEST_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_count, check_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        check_count++;                                                                             \
        if (!(cond)) {                                                                             \
            check_failures++;                                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, rtol, atol, what)                                                        \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                                 \
        CHECK(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_),                                           \
              "%s: got %.9g, expected %.9g (diff %.3g)", what, a_, b_, fabs(a_ - b_));             \
    } while (0)

static inline int check_summary(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    if (check_count == 0) {
        fprintf(stderr, "%s: no check ran\n", name);
        return 1;
    }
    return check_failures ? 1 : 0;
}

#endif
