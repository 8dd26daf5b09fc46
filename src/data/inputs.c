/* inputs.c — expand prepare-data's --input list (see inputs.h). */
#include "data/inputs.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

static void add(InputList *l, const char *path)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        char **p = realloc(l->paths, l->cap * sizeof *p);
        if (!p)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory listing inputs");
        l->paths = p;
    }
    if (!(l->paths[l->n++] = strdup(path)))
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory listing inputs");
}

/* Whether ext (n bytes) is one of the comma list exts. */
static int ext_listed(const char *ext, size_t len, const char *exts)
{
    for (const char *p = exts;;) {
        const char *comma = strchr(p, ',');
        const size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == len && !strncmp(p, ext, n))
            return 1;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

/* Whether path's extension is one of the comma list exts.  A compressed
 * file (.gz, .zst) also matches by the extension under it, or both:
 * "a.jsonl.gz" is taken by --ext gz, jsonl or jsonl.gz. */
static int ext_ok(const char *path, const char *exts)
{
    if (!exts)
        return 1;
    const char *base = strrchr(path, '/'), *dot;
    base = base ? base + 1 : path;
    dot = strrchr(base, '.');
    const char *ext = dot && dot != base ? dot + 1 : "";
    if (ext_listed(ext, strlen(ext), exts))
        return 1;
    if (strcmp(ext, "gz") && strcmp(ext, "zst"))
        return 0;
    const char *inner = dot - 1;
    while (inner > base && *inner != '.')
        inner--;
    if (inner <= base)
        return 0;
    return ext_listed(inner + 1, (size_t)(dot - inner - 1), exts) ||
           ext_listed(inner + 1, strlen(inner + 1), exts);
}

static int visible(const struct dirent *e) { return e->d_name[0] != '.'; }

/* Regular files under dir, depth first, names in byte order. */
static void walk(InputList *l, const char *dir, const char *exts)
{
    struct dirent **names;
    int n = scandir(dir, &names, visible, alphasort);
    if (n < 0)
        trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "cannot list %s: %s", dir,
                  strerror(errno));
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            walk(l, path, exts);
        else if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && ext_ok(path, exts))
            add(l, path);
        free(names[i]);
    }
    free(names);
}

void inputs_expand(InputList *l, const char *const *inputs, int n, const char *exts)
{
    memset(l, 0, sizeof *l);
    for (int i = 0; i < n; i++) {
        const char *in = inputs[i];
        const size_t before = l->n;
        struct stat st;
        if (!strcmp(in, "-") || (stat(in, &st) == 0 && !S_ISDIR(st.st_mode))) {
            add(l, in); /* named explicitly: taken as it is */
            continue;
        }
        if (stat(in, &st) == 0) {
            walk(l, in, exts);
        } else if (strpbrk(in, "*?[")) {
            glob_t g;
            int rc = glob(in, 0, NULL, &g);
            for (size_t k = 0; rc == 0 && k < g.gl_pathc; k++) { /* glob sorts */
                if (stat(g.gl_pathv[k], &st) == 0 && S_ISDIR(st.st_mode))
                    walk(l, g.gl_pathv[k], exts);
                else if (ext_ok(g.gl_pathv[k], exts))
                    add(l, g.gl_pathv[k]);
            }
            globfree(&g);
        } else {
            trd_fatal(TRD_EXIT_INPUT, "check the --input paths", "cannot open %s: %s", in,
                      strerror(errno));
        }
        if (l->n == before)
            trd_fatal(TRD_EXIT_INPUT, exts ? "check --ext (a comma list such as txt,md)" : NULL,
                      "--input %s: no file%s%s%s", in, exts ? " with extension " : "",
                      exts ? exts : "", exts ? "" : " in it");
    }
}

void inputs_free(InputList *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->paths[i]);
    free(l->paths);
    memset(l, 0, sizeof *l);
}

const char *inputs_repo_file(const char *rel, char *buf, size_t n)
{
    if (rel[0] == '/' || access(rel, F_OK) == 0)
        return rel;
#ifdef TRD_SOURCE_ROOT
    snprintf(buf, n, "%s/%s", TRD_SOURCE_ROOT, rel);
    if (access(buf, F_OK) == 0)
        return buf;
#else
    (void)buf;
    (void)n;
#endif
    return rel;
}
