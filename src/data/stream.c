/* stream.c — one dataset made of many shards, opened lazily (stream.h). */
#include "data/stream.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Append one path to the shard list (a copy). */
static int add_shard(TokenStream *s, int *cap, const char *path, char err[CFG_ERR])
{
    if (s->n_shards == *cap) {
        int ncap = *cap ? 2 * *cap : 16;
        StreamShard *n = realloc(s->shards, (size_t)ncap * sizeof *n);
        if (!n)
            return trd_errorf(err, "%s: out of memory for %d shards", s->name, ncap);
        s->shards = n;
        *cap = ncap;
    }
    StreamShard *sh = &s->shards[s->n_shards];
    memset(sh, 0, sizeof *sh);
    if (!(sh->path = strdup(path)))
        return trd_errorf(err, "%s: out of memory", s->name);
    s->n_shards++;
    return 0;
}

/* A pattern's matches in byte order; for Megatron each .bin/.idx pair
 * gives its prefix once, and other files are ignored. */
static int add_pattern(TokenStream *s, int *cap, const char *pat, char err[CFG_ERR])
{
    glob_t g;
    int rc = glob(pat, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return trd_errorf(err, "data path pattern '%s' matches no file", pat);
    }
    if (rc != 0) {
        globfree(&g);
        return trd_errorf(err, "data path pattern '%s': cannot expand it (glob error %d)", pat, rc);
    }
    char **names = calloc(g.gl_pathc, sizeof *names);
    size_t n = 0;
    for (size_t i = 0; names && i < g.gl_pathc; i++) {
        const char *m = g.gl_pathv[i];
        size_t len = strlen(m);
        if (s->format == DATA_MEGATRON) {
            if (len < 5 || (strcmp(m + len - 4, ".bin") && strcmp(m + len - 4, ".idx")))
                continue;
            len -= 4;
        }
        if (!(names[n] = strndup(m, len)))
            break;
        n++;
    }
    globfree(&g);
    if (!names)
        return trd_errorf(err, "%s: out of memory", pat);
    qsort(names, n, sizeof *names, by_name);
    int bad = 0;
    size_t kept = 0;
    for (size_t i = 0; i < n && !bad; i++)
        if (i == 0 || strcmp(names[i], names[i - 1])) {
            bad = add_shard(s, cap, names[i], err) != 0;
            kept++;
        }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (!bad && kept == 0)
        return trd_errorf(err, "data path pattern '%s' matches no .bin/.idx pair", pat);
    return bad ? -1 : 0;
}

int stream_open(TokenStream *s, const char *spec, DataFormat fmt, char err[CFG_ERR])
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", spec);
    s->format = fmt;
    int cap = 0;
    char *list = strdup(spec);
    if (!list)
        return trd_errorf(err, "out of memory");
    int bad = 0;
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p && !bad;
         p = strtok_r(NULL, ",", &save)) {
        while (*p == ' ')
            p++;
        for (char *e = p + strlen(p); e > p && e[-1] == ' ';)
            *--e = '\0';
        if (!*p)
            continue;
        bad = strpbrk(p, "*?[") ? add_pattern(s, &cap, p, err) : add_shard(s, &cap, p, err);
    }
    free(list);
    if (!bad && s->n_shards == 0)
        bad = trd_errorf(err, "data path '%s' names no dataset", spec);
    for (int i = 0; !bad && i < s->n_shards; i++) {
        StreamShard *sh = &s->shards[i];
        TokenDataset head;
        if (dataset_probe(&head, sh->path, fmt, err) != 0) {
            bad = -1;
            break;
        }
        free(sh->path); /* the normalized name: the prefix without .bin/.idx */
        if (!(sh->path = strdup(head.path))) {
            bad = trd_errorf(err, "out of memory");
            break;
        }
        sh->first = s->n_tokens;
        sh->n_tokens = head.n_tokens;
        sh->n_docs = head.n_docs;
        sh->token_bytes = head.token_bytes;
        sh->has_mask = head.has_mask;
        if (i > 0 && sh->has_mask != s->has_mask) {
            bad = trd_errorf(err,
                             "%s has %s loss mask (.mask) and %s %s: the shards of a dataset "
                             "are all instruction data (prepare-data --template) or none is",
                             sh->path, sh->has_mask ? "a" : "no", s->shards[0].path,
                             s->has_mask ? "has one" : "has none");
            break;
        }
        s->has_mask = sh->has_mask;
        s->n_tokens += head.n_tokens;
        s->n_docs += head.n_docs;
        if (head.token_bytes > s->token_bytes)
            s->token_bytes = head.token_bytes;
    }
    if (bad) {
        stream_close(s);
        return -1;
    }
    return 0;
}

void stream_close(TokenStream *s)
{
    for (int i = 0; i < s->n_shards; i++) {
        if (s->shards[i].ds) {
            dataset_close(s->shards[i].ds);
            free(s->shards[i].ds);
        }
        free(s->shards[i].path);
    }
    free(s->shards);
    s->shards = NULL;
    s->n_shards = s->n_mapped = 0;
    s->n_tokens = s->n_docs = 0;
}

int stream_shard_of(const TokenStream *s, uint64_t pos)
{
    int lo = 0, hi = s->n_shards - 1;
    while (lo < hi) { /* the last shard whose first <= pos */
        int mid = (lo + hi + 1) / 2;
        if (s->shards[mid].first <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Map shard i (and unmap the least recently used one beyond the cap). */
static int map_shard(TokenStream *s, int i, char err[CFG_ERR])
{
    StreamShard *sh = &s->shards[i];
    sh->used = ++s->clock;
    if (sh->ds)
        return 0;
    if (s->n_mapped >= STREAM_MAX_MAPPED) {
        int old = -1;
        for (int j = 0; j < s->n_shards; j++)
            if (s->shards[j].ds && (old < 0 || s->shards[j].used < s->shards[old].used))
                old = j;
        dataset_close(s->shards[old].ds);
        free(s->shards[old].ds);
        s->shards[old].ds = NULL;
        s->n_mapped--;
    }
    TokenDataset *ds = malloc(sizeof *ds);
    if (!ds)
        return trd_errorf(err, "%s: out of memory", sh->path);
    if (dataset_reopen(ds, sh->path, s->format, !sh->checked, err) != 0) {
        free(ds);
        return -1;
    }
    if (ds->n_tokens != sh->n_tokens || ds->token_bytes != sh->token_bytes) {
        trd_errorf(err, "%s changed since the run opened it (%llu tokens then, %llu now)", sh->path,
                   (unsigned long long)sh->n_tokens, (unsigned long long)ds->n_tokens);
        dataset_close(ds);
        free(ds);
        return -1;
    }
    sh->ds = ds;
    sh->checked = 1;
    s->n_mapped++;
    s->n_opened++;
    return 0;
}

/* Tokens (out) or mask bytes (mask) of [first, first + n), shard by shard. */
static int read_span(TokenStream *s, uint64_t first, size_t n, uint32_t *out, uint8_t *mask,
                     char err[CFG_ERR])
{
    if (n == 0)
        return 0;
    if (first + n > s->n_tokens)
        return trd_errorf(err, "%s: read of tokens [%llu, %llu) past the end (%llu tokens)",
                          s->name, (unsigned long long)first, (unsigned long long)(first + n),
                          (unsigned long long)s->n_tokens);
    int i = s->last;
    if (!(s->shards[i].first <= first && first < s->shards[i].first + s->shards[i].n_tokens))
        i = stream_shard_of(s, first);
    while (n > 0) {
        StreamShard *sh = &s->shards[i];
        if (sh->n_tokens == 0 || first >= sh->first + sh->n_tokens) {
            i++;
            continue;
        }
        if (map_shard(s, i, err) != 0)
            return -1;
        uint64_t at = first - sh->first, take = sh->n_tokens - at;
        if (take > n)
            take = n;
        const TokenDataset *ds = sh->ds;
        if (mask) {
            if (ds->mask)
                memcpy(mask, ds->mask + at, take);
            else
                memset(mask, 1, take);
            mask += take;
        } else if (ds->token_bytes == 2) {
            const uint16_t *t = (const uint16_t *)ds->tokens + at;
            for (uint64_t k = 0; k < take; k++)
                out[k] = t[k];
        } else {
            memcpy(out, (const int32_t *)ds->tokens + at, take * sizeof *out);
        }
        if (out)
            out += take;
        first += take;
        n -= take;
        s->last = i;
        if (n)
            i++;
    }
    return 0;
}

int stream_read(TokenStream *s, uint64_t first, size_t n, uint32_t *out, char err[CFG_ERR])
{
    return read_span(s, first, n, out, NULL, err);
}

int stream_read_mask(TokenStream *s, uint64_t first, size_t n, uint8_t *out, char err[CFG_ERR])
{
    return read_span(s, first, n, NULL, out, err);
}
