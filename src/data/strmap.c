#include "data/strmap.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a with a final mix: keys are short (words, token pairs), and the
 * mix spreads FNV's weak low bits over the slot index. */
uint64_t strmap_hash(const void *key, size_t n)
{
    const unsigned char *p = key;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

static int alloc_slots(StrMap *m, size_t cap)
{
    m->hash = calloc(cap, sizeof *m->hash);
    m->key_off = malloc(cap * sizeof *m->key_off);
    m->key_len = malloc(cap * sizeof *m->key_len);
    m->val = malloc(cap * sizeof *m->val);
    m->cap = cap;
    return m->hash && m->key_off && m->key_len && m->val ? 0 : -1;
}

static void free_slots(StrMap *m)
{
    free(m->hash);
    free(m->key_off);
    free(m->key_len);
    free(m->val);
}

int strmap_init(StrMap *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < 2 * expected)
        cap *= 2;
    if (alloc_slots(m, cap) != 0) {
        strmap_free(m);
        return -1;
    }
    return 0;
}

void strmap_free(StrMap *m)
{
    free_slots(m);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

void strmap_clear(StrMap *m)
{
    memset(m->hash, 0, m->cap * sizeof *m->hash);
    m->count = 0;
    m->arena_used = 0;
}

static size_t find_slot(const StrMap *m, uint64_t h, const void *key, size_t len)
{
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (m->hash[i] != 0) {
        if (m->hash[i] == h && m->key_len[i] == len &&
            memcmp(m->arena + m->key_off[i], key, len) == 0)
            return i;
        i = (i + 1) & mask;
    }
    return i;
}

int strmap_get(const StrMap *m, const void *key, size_t len, uint64_t *val)
{
    return strmap_get_hashed(m, strmap_hash(key, len), key, len, val);
}

int strmap_get_hashed(const StrMap *m, uint64_t h, const void *key, size_t len, uint64_t *val)
{
    size_t i = find_slot(m, h, key, len);
    if (m->hash[i] == 0)
        return 0;
    *val = m->val[i];
    return 1;
}

static int grow(StrMap *m)
{
    StrMap old = *m;
    if (alloc_slots(m, 2 * old.cap) != 0) {
        free_slots(m);
        m->hash = old.hash;
        m->key_off = old.key_off;
        m->key_len = old.key_len;
        m->val = old.val;
        m->cap = old.cap;
        return -1;
    }
    for (size_t i = 0; i < old.cap; i++) {
        if (old.hash[i] == 0)
            continue;
        size_t j = (size_t)old.hash[i] & (m->cap - 1);
        while (m->hash[j] != 0)
            j = (j + 1) & (m->cap - 1);
        m->hash[j] = old.hash[i];
        m->key_off[j] = old.key_off[i];
        m->key_len[j] = old.key_len[i];
        m->val[j] = old.val[i];
    }
    free_slots(&old);
    return 0;
}

int strmap_put(StrMap *m, const void *key, size_t len, uint64_t val)
{
    if (len > UINT32_MAX)
        return -1;
    uint64_t h = strmap_hash(key, len);
    size_t i = find_slot(m, h, key, len);
    if (m->hash[i] != 0) {
        m->val[i] = val;
        return 0;
    }
    if (2 * (m->count + 1) > m->cap) {
        if (grow(m) != 0)
            return -1;
        i = find_slot(m, h, key, len);
    }
    if (!m->arena || m->arena_used + len > m->arena_cap) {
        size_t cap = m->arena_cap ? m->arena_cap : 4096;
        while (cap < m->arena_used + len)
            cap *= 2;
        unsigned char *a = realloc(m->arena, cap);
        if (!a)
            return -1;
        m->arena = a;
        m->arena_cap = cap;
    }
    memcpy(m->arena + m->arena_used, key, len);
    m->hash[i] = h;
    m->key_off[i] = m->arena_used;
    m->key_len[i] = (uint32_t)len;
    m->val[i] = val;
    m->arena_used += len;
    m->count++;
    return 0;
}
