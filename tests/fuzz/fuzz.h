/* fuzz.h — what every libFuzzer harness of tests/fuzz shares.
 *
 * Each harness feeds its bytes to the parser entry point the program calls
 * (config_load, st_open, bpe_load, ...), through a file when that entry
 * point reads a path, and checks the exit contract of docs/design.md
 * (invariant 3): bad input is a returned error with a message, which the
 * front end prints once and turns into exit 2.  What counts as a crash:
 *
 *   - a signal, a sanitizer report (ASan, UBSan with halt_on_error), a
 *     libFuzzer timeout (a hang) or a malloc above -malloc_limit_mb
 *     (an allocation storm);
 *   - a parser that fails without a message, or with an exit code other
 *     than 2;
 *   - trd_fatal reached from input with any code but 2: TRD_ASSERT and
 *     trd_malloc's out-of-memory are code 1, a runtime failure, which no
 *     input may cause.
 *
 * trd_fatal's hook (trd_on_fatal, the one comm_init uses to abort an MPI
 * job) is how a harness survives a fatal error with code 2: the hook
 * longjmps back into the harness instead of letting exit() end the
 * process.  No parser needs a fuzz-only path; the price is what the
 * jumped-over frames held (memory, descriptors), which the harness frees
 * by closing descriptors it did not open and running with leak detection
 * off in that case only. */
#ifndef TRD_FUZZ_H
#define TRD_FUZZ_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "core/error.h"

extern jmp_buf fuzz_jmp;

/* Register the trd_fatal hook and make the harness's scratch directory.
 * Called once, from LLVMFuzzerInitialize. */
void fuzz_init(void);

/* Write bytes to NAME in the scratch directory; returns its path (static
 * storage, valid until the next call with the same name). */
const char *fuzz_file(const char *name, const uint8_t *data, size_t size);

/* The scratch directory (a directory argument for parsers that take one). */
const char *fuzz_dir(void);

/* Remove NAME from the scratch directory (no error when absent). */
void fuzz_unlink(const char *name);

/* The returned-error contract: rc 0 is success; otherwise the error code
 * must be `bad` (TRD_EXIT_INPUT, or -1 for functions that return -1 and
 * whose callers exit 2) and err must hold a message (its first line says what is wrong).  Aborts
 * (a crash libFuzzer reports) otherwise. */
void fuzz_check(int rc, int bad, const char *err, const char *what);

/* Close descriptors opened since fuzz_init (after a fatal jump). */
void fuzz_close_fds(void);

/* Around the entry point: FUZZ_GUARD returns from the harness when a
 * trd_fatal with code 2 jumped back. */
#define FUZZ_GUARD()                                                                               \
    do {                                                                                           \
        if (setjmp(fuzz_jmp)) {                                                                    \
            fuzz_close_fds();                                                                      \
            return 0;                                                                              \
        }                                                                                          \
    } while (0)

/* libFuzzer's entry points; FUZZ_INIT(setup) defines the first, which
 * runs fuzz_init and then setup (may be NULL: void setup(void)). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#define FUZZ_INIT(setup)                                                                           \
    int LLVMFuzzerInitialize(int *argc, char ***argv)                                              \
    {                                                                                              \
        (void)argc, (void)argv;                                                                    \
        fuzz_init();                                                                               \
        void (*fn)(void) = setup;                                                                  \
        if (fn)                                                                                    \
            fn();                                                                                  \
        return 0;                                                                                  \
    }

/* Split data at the first NUL byte: before it the main text (NUL-terminated
 * copy in *text), after it the rest (*rest, *rest_n).  The caller frees
 * *text. */
void fuzz_split(const uint8_t *data, size_t size, char **text, const uint8_t **rest,
                size_t *rest_n);

#endif
