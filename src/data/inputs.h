/* inputs.h — the document list of `trident prepare-data --input ...`.
 *
 * An input is a file (always taken), a directory (walked recursively,
 * names in byte order, hidden entries skipped) or a glob pattern that the
 * shell did not expand (quoted, e.g. 'corpus/part-*').  Files found in
 * directories or by patterns are filtered by extension when --ext is given;
 * a file named explicitly is taken whatever its extension.  A compressed
 * file (.gz, .zst) matches by its own extension or the one before it.  The list is in
 * a fixed order, so the same inputs give the same dataset. */
#ifndef TRD_DATA_INPUTS_H
#define TRD_DATA_INPUTS_H

#include <stddef.h>

typedef struct {
    char **paths;
    size_t n, cap;
} InputList;

/* Expand inputs[0..n) into list.  exts: NULL (no filter) or a comma list
 * of extensions without the dot ("txt,md"; "" matches files without one).
 * Exits 2 naming the input when a path does not exist or a directory or
 * pattern yields no file. */
void inputs_expand(InputList *list, const char *const *inputs, int n, const char *exts);

void inputs_free(InputList *list);

/* The path of a data file that trident's own scripts install under the
 * repository (e.g. .cache/npm/...): as given when it exists from the
 * current directory, else under the source tree trident was built from.
 * Returns rel itself when neither exists (the caller's open reports it). */
const char *inputs_repo_file(const char *rel, char *buf, size_t n);

#endif
