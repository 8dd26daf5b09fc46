/* fuzz.c — the shared part of the harnesses (fuzz.h). */
#include "fuzz.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

jmp_buf fuzz_jmp;

static char scratch[256];
static int max_fd; /* the highest descriptor open at fuzz_init */

/* trd_fatal's hook: code 2 (bad input) goes back to the harness; any other
 * code reached from input is a bug, and abort() makes libFuzzer report it
 * with the input that caused it. */
static void on_fatal(int code)
{
    if (code == TRD_EXIT_INPUT)
        longjmp(fuzz_jmp, 1);
    fprintf(stderr, "fuzz: trd_fatal with exit code %d (not 2) reached from input\n", code);
    abort();
}

static int highest_fd(void)
{
    int hi = 2;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 1024;
    const struct dirent *e;
    while ((e = readdir(d)))
        if (atoi(e->d_name) > hi)
            hi = atoi(e->d_name);
    closedir(d);
    return hi - 1; /* less the directory's own descriptor */
}

void fuzz_init(void)
{
    trd_on_fatal(on_fatal);
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof scratch, "%s/trident-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(scratch)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    max_fd = highest_fd();
}

const char *fuzz_dir(void) { return scratch; }

const char *fuzz_file(const char *name, const uint8_t *data, size_t size)
{
    static char path[8][512];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 512, "%s/%s", scratch, name);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(p);
        abort();
    }
    return p;
}

void fuzz_unlink(const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", scratch, name);
    unlink(p);
}

void fuzz_check(int rc, int bad, const char *err, const char *what)
{
    if (rc == 0)
        return;
    if (rc != bad) {
        fprintf(stderr, "fuzz: %s returned %d on bad input (want %d): %s\n", what, rc, bad, err);
        abort();
    }
    /* One message: a first line that says what is wrong (a "---> hint"
     * line may follow it, as trd_fatal prints hints). */
    if (!err[0] || err[0] == '\n') {
        fprintf(stderr, "fuzz: %s failed without a message: '%s'\n", what, err);
        abort();
    }
}

void fuzz_close_fds(void)
{
    int hi = highest_fd();
    for (int fd = max_fd + 1; fd <= hi; fd++)
        close(fd);
}

void fuzz_split(const uint8_t *data, size_t size, char **text, const uint8_t **rest, size_t *rest_n)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t n = nul ? (size_t)(nul - data) : size;
    *text = malloc(n + 1);
    if (!*text)
        abort();
    memcpy(*text, data, n);
    (*text)[n] = '\0';
    *rest = nul ? nul + 1 : data + size;
    *rest_n = nul ? size - n - 1 : 0;
}
