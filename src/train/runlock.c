/* runlock.c — run.dir / checkpoint.dir: created, probed, locked (runlock.h). */
#include "train/runlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

enum { MAX_LOCKS = 2, RECORD_MAX = 512 };

static int held_fd[MAX_LOCKS];
static int n_held;

typedef struct {
    int code; /* TRD_EXIT_OK, _INPUT (the directory is unusable) or _RUNTIME */
    char msg[TRD_ERR];
    char hint[256];
} Verdict;

static int fail(Verdict *v, int code, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(Verdict *v, int code, const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, sizeof v->msg, fmt, ap);
    va_end(ap);
    snprintf(v->hint, sizeof v->hint, "%s", hint ? hint : "");
    v->code = code;
    return -1;
}

/* mkdir -p; a component that exists but is no directory fails here with
 * ENOTDIR rather than later at the first write. */
static int make_dirs(const char *key, const char *path, Verdict *v)
{
    char buf[CFG_STR + 16];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return fail(v, TRD_EXIT_INPUT, "choose a directory this job can create and write",
                        "%s %s: cannot create %s: %s", key, path, buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return fail(v, TRD_EXIT_INPUT, "choose a directory this job can create and write",
                    "%s %s: cannot create it: %s", key, path, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0)
        return fail(v, TRD_EXIT_INPUT, "choose a directory this job can create and write",
                    "%s %s: %s", key, path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return fail(v, TRD_EXIT_INPUT, "choose a directory this job can create and write",
                    "%s %s: not a directory", key, path);
    return 0;
}

/* Create and remove a file: permission bits, read-only mounts, immutable
 * directories and quota-less full inode tables all show up here, before a
 * step is spent, instead of at the first metrics line or checkpoint. */
static int probe(const char *key, const char *dir, Verdict *v)
{
    char path[CFG_STR + 64];
    snprintf(path, sizeof path, "%s/.trident.probe.%ld", dir, (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return fail(v, TRD_EXIT_INPUT,
                    "choose a writable directory (check permissions, read-only mounts, quota)",
                    "%s %s is not writable: cannot create %s: %s", key, dir, path, strerror(errno));
    close(fd);
    if (unlink(path) != 0)
        return fail(v, TRD_EXIT_INPUT, "choose a directory this job can write",
                    "%s %s: cannot remove the probe file %s: %s", key, dir, path, strerror(errno));
    return 0;
}

/* The record of a lock file, one line without its newline ("" if none). */
static void read_record(int fd, char out[RECORD_MAX])
{
    ssize_t n = pread(fd, out, RECORD_MAX - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
}

static int lock_dir(const char *key, const char *dir, Verdict *v)
{
    char path[CFG_STR + 32];
    snprintf(path, sizeof path, "%s/%s", dir, RUNLOCK_FILE);
    /* Never O_TRUNC: the holder's record must survive our open. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return fail(v, TRD_EXIT_INPUT, "choose a writable directory", "%s %s: cannot open %s: %s",
                    key, dir, path, strerror(errno));
    char old[RECORD_MAX];
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        if (e == EWOULDBLOCK) {
            read_record(fd, old);
            close(fd);
            return fail(v, TRD_EXIT_INPUT,
                        "wait for that run to end, or give this one another directory "
                        "(--set run.dir=... / checkpoint.dir=...)",
                        "%s %s is in use by another run: %s (lock %s)", key, dir,
                        old[0] ? old : "holder not recorded yet", path);
        }
        /* Some shared filesystems refuse flock (Lustre without -o flock):
         * the run goes on, but says that nothing keeps a second run out. */
        fprintf(stderr,
                "trident: warning: %s %s: cannot lock %s (%s); another run on this "
                "directory would not be stopped\n",
                key, dir, path, strerror(e));
    }
    read_record(fd, old);
    if (old[0])
        printf("%s %s: taking over the lock of a run that is gone (%s)\n", key, dir, old);

    char host[256] = "?", rec[RECORD_MAX];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    const char *job = getenv("SLURM_JOB_ID");
    int len = snprintf(rec, sizeof rec, "host %s, pid %ld, Slurm job %s\n", host, (long)getpid(),
                       job && *job ? job : "none");
    if (ftruncate(fd, 0) != 0 || pwrite(fd, rec, (size_t)len, 0) != len || fsync(fd) != 0) {
        const int e = errno;
        close(fd);
        return fail(v, TRD_EXIT_RUNTIME, "free space under the directory, or choose another",
                    "cannot write %s: %s", path, strerror(e));
    }
    held_fd[n_held++] = fd; /* kept open (and locked) until the process ends */
    return 0;
}

static int claim(const char *key, const char *dir, Verdict *v)
{
    return make_dirs(key, dir, v) || probe(key, dir, v) || lock_dir(key, dir, v) ? -1 : 0;
}

/* Whether two existing directories are the same one (a second flock on the
 * same file from this process would conflict with the first). */
static int same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

void runlock_claim(const char *run_dir, const char *ckpt_dir, Comm *world)
{
    Verdict v = {.code = TRD_EXIT_OK};
    if (world->rank == 0) {
        const char *ck = ckpt_dir;
        if (claim("run.dir", run_dir, &v) == 0 && ck[0]) {
            if (make_dirs("checkpoint.dir", ck, &v) == 0 && !same_dir(ck, run_dir))
                claim("checkpoint.dir", ck, &v);
        }
    }
    int code = v.code;
    comm_broadcast(world, &code, sizeof code, 0);
    if (code == TRD_EXIT_OK)
        return;
    if (world->rank == 0) {
        fprintf(stderr, "trident: error: %s\n", v.msg);
        if (v.hint[0])
            fprintf(stderr, "---> %s\n", v.hint);
        fflush(stderr);
    }
    /* Every rank leaves with the same code (no abort, which can swallow
     * rank 0's message). */
    comm_finalize();
    exit(code);
}

void runlock_release(void)
{
    for (int i = 0; i < n_held; i++) {
        /* An empty record: the next run finds no dead holder to report. */
        if (ftruncate(held_fd[i], 0) != 0)
            fprintf(stderr, "trident: warning: cannot clear a lock record: %s\n", strerror(errno));
        close(held_fd[i]); /* releases the flock */
    }
    n_held = 0;
}
