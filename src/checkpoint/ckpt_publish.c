/* ckpt_publish.c — the file-system side of a save, done by rank 0: the
 * step_X.tmp directory, the rename that publishes it, the `latest` pointer
 * (latest.tmp + fsync + rename) and the pruning of old steps.  Every step
 * that makes something visible is a rename after an fsync, so a crash
 * leaves either the old state or the new one (docs/design.md, invariant 2). */
#include "checkpoint/ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Remove a directory tree; 0 when it is gone. */
int ckpt_rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int mkdir_p(const char *path, char err[CFG_ERR])
{
    char buf[CKPT_PATH];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            ckpt_err(err, "%s: cannot create checkpoint directory: %s", buf, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
        ckpt_err(err, "%s: cannot create checkpoint directory: %s", buf, strerror(errno));
        return -1;
    }
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
        ckpt_err(err, "%s: checkpoint.dir exists and is not a directory", buf);
        return -1;
    }
    return 0;
}

int ckpt_fsync_path(const char *path, int dir)
{
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

void ckpt_step_name(char *out, size_t n, int64_t step)
{
    snprintf(out, n, "step_%08lld", (long long)step);
}

/* Step 1 (rank 0): a fresh <dir>/step_X.tmp. */
int ckpt_prepare_tmp(const char *dir, const char *tmp, char err[CFG_ERR])
{
    if (mkdir_p(dir, err) != 0)
        return -1;
    if (ckpt_rm_tree(tmp) != 0) {
        ckpt_err(err, "%s: cannot remove the unfinished checkpoint left here: %s", tmp,
                 strerror(errno));
        return -1;
    }
    if (mkdir(tmp, 0777) != 0) {
        ckpt_err(err, "%s: cannot create: %s", tmp, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- steps this job did not write ----
 *
 * A checkpoint.dir with step directories but no `latest` was not left by a
 * save of this job (each save moves `latest` right after publishing), or
 * its `latest` was lost: those steps belong to someone else, or are the
 * evidence of a failure.  The first save of this process into such a
 * directory records them; they are never replaced or pruned. */
static char foreign_dir[CKPT_PATH];
static int64_t *foreign;   /* every one of them: a step left out would be pruned */
static int n_foreign = -1; /* -1: foreign_dir not looked at yet */
static int cap_foreign;

void ckpt_note_foreign(const char *dir)
{
    if (n_foreign >= 0 && !strcmp(foreign_dir, dir))
        return;
    snprintf(foreign_dir, sizeof foreign_dir, "%s", dir);
    n_foreign = 0;
    char latest[CKPT_FILE_PATH];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    struct stat st;
    if (stat(latest, &st) == 0)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s = ckpt_parse_step(de->d_name);
        if (s >= 0)
            ckpt_push_step(&foreign, &n_foreign, &cap_foreign, s);
    }
    closedir(d);
}

static int is_foreign(const char *dir, int64_t step)
{
    if (n_foreign <= 0 || strcmp(foreign_dir, dir))
        return 0;
    for (int i = 0; i < n_foreign; i++)
        if (foreign[i] == step)
            return 1;
    return 0;
}

/* step_X.tmp -> step_X; an existing step_X (a rerun saving the same step)
 * is swapped out atomically where the file system can, then removed.  One
 * this job did not write (ckpt_note_foreign) is renamed step_X.kept
 * instead, and kept. */
int ckpt_publish_dir(const char *dir, int64_t step, const char *tmp, const char *final,
                     char err[CFG_ERR])
{
    struct stat st;
    if (lstat(final, &st) == 0 && is_foreign(dir, step)) {
        char kept[CKPT_PATH + 8];
        snprintf(kept, sizeof kept, "%s.kept", final);
        /* rename() would replace an existing step_X.kept: refuse that too. */
        const int taken = lstat(kept, &st) == 0;
        if (taken || rename(final, kept) != 0) {
            ckpt_err(err,
                     "%s: exists and was not written by this job; cannot move it to %s "
                     "(%s): not overwritten",
                     final, kept, taken ? "exists" : strerror(errno));
            return -1;
        }
        fprintf(stderr,
                "trident: warning: %s was not written by this job (no latest named "
                "it): kept as %s\n",
                final, kept);
        /* The step_X about to be published is this job's. */
        for (int i = 0; i < n_foreign; i++)
            if (foreign[i] == step)
                foreign[i--] = foreign[--n_foreign];
    }
    if (lstat(final, &st) == 0) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0)
            return ckpt_rm_tree(tmp) == 0 ? 0 : (ckpt_err(err, "%s: cannot remove", tmp), -1);
        char old[CKPT_PATH + 8];
        snprintf(old, sizeof old, "%s.old", final);
        if (ckpt_rm_tree(old) != 0 || rename(final, old) != 0) {
            ckpt_err(err, "%s: cannot replace: %s", final, strerror(errno));
            return -1;
        }
        if (rename(tmp, final) != 0) {
            ckpt_err(err, "%s: cannot publish: %s", final, strerror(errno));
            return -1;
        }
        ckpt_rm_tree(old);
        return 0;
    }
    if (rename(tmp, final) != 0) {
        ckpt_err(err, "%s: cannot publish: %s", final, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_write_latest(const char *dir, const char *name, char err[CFG_ERR])
{
    char tmp[CKPT_FILE_PATH], path[CKPT_FILE_PATH];
    snprintf(tmp, sizeof tmp, "%s/latest.tmp", dir);
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(tmp, "w");
    int ok = f && fprintf(f, "%s\n", name) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0 || ckpt_fsync_path(dir, 1) != 0) {
        ckpt_err(err, "%s: cannot update: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Parse "step_<digits>" exactly; -1 for anything else (.tmp, .old, files). */
int64_t ckpt_parse_step(const char *name)
{
    if (strncmp(name, "step_", 5) || !name[5])
        return -1;
    int64_t s = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        s = s * 10 + (*p - '0');
    }
    return s;
}

void ckpt_push_step(int64_t **steps, int *n, int *cap, int64_t step)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        int64_t *grown = realloc(*steps, (size_t)*cap * sizeof **steps);
        if (!grown)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory listing checkpoint steps");
        *steps = grown;
    }
    (*steps)[(*n)++] = step;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Remove the oldest published steps beyond keep, never `current`, and the
 * step_X.tmp directories of killed saves (one job writes a checkpoint.dir
 * at a time). */
void ckpt_prune(const char *dir, int keep, int64_t current)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char base[256];
        snprintf(base, sizeof base, "%s", de->d_name);
        size_t len = strlen(base);
        if (len > 4 && !strcmp(base + len - 4, ".tmp")) {
            /* Left by a save that was killed: never published, never read. */
            base[len - 4] = '\0';
            char path[CKPT_PATH + 8];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            if (ckpt_parse_step(base) >= 0)
                ckpt_rm_tree(path);
            continue;
        }
        int64_t s = ckpt_parse_step(de->d_name);
        if (s >= 0)
            ckpt_push_step(&steps, &n, &cap, s);
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, cmp_i64);
    keep = keep < 1 ? 1 : keep;
    for (int i = 0; i < n - keep; i++) {
        if (steps[i] == current || is_foreign(dir, steps[i]))
            continue;
        char name[32], path[CKPT_PATH];
        ckpt_step_name(name, sizeof name, steps[i]);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        /* A directory named step_12 (not 8 digits) is someone else's. */
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && ckpt_rm_tree(path) != 0)
            fprintf(stderr, "trident: warning: %s: cannot remove old checkpoint: %s\n", path,
                    strerror(errno));
    }
    free(steps);
}
