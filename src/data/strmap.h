/* strmap.h — a small open-addressing hash table from byte strings to
 * uint64 values (internal to src/data: the tokenizer's vocabulary, merge
 * table and word cache).  Keys are copied into an arena owned by the map. */
#ifndef TRD_DATA_STRMAP_H
#define TRD_DATA_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *hash;  /* 0 marks an empty slot */
    size_t *key_off; /* key bytes: arena[key_off[i] .. + key_len[i]) */
    uint32_t *key_len;
    uint64_t *val;
    size_t cap, count; /* cap is a power of two, count <= cap / 2 */
    unsigned char *arena;
    size_t arena_used, arena_cap;
} StrMap;

int strmap_init(StrMap *m, size_t expected); /* 0, or -1 when out of memory */
void strmap_free(StrMap *m);
void strmap_clear(StrMap *m); /* drop all keys, keep memory */
/* 1 and *val when found, else 0. */
int strmap_get(const StrMap *m, const void *key, size_t len, uint64_t *val);

/* The same lookup in two steps, for callers that look up many keys: the
 * key's hash (one per key, whatever the map), a prefetch of the slot it
 * starts at, and later the lookup itself.  Issuing the prefetches of a
 * batch of keys before their lookups overlaps the cache misses of a big
 * map (the tokenizers' ranks: megabytes) instead of paying them in turn. */
uint64_t strmap_hash(const void *key, size_t len);
static inline void strmap_prefetch(const StrMap *m, uint64_t h)
{
    size_t i = (size_t)h & (m->cap - 1);
    __builtin_prefetch(&m->hash[i]);
    __builtin_prefetch(&m->key_len[i]);
    __builtin_prefetch(&m->key_off[i]);
    __builtin_prefetch(&m->val[i]);
}
/* Second step, once the slot has arrived: a prefetch of the key's bytes
 * in the arena when the slot's hash is h (the key is there, likely). */
static inline void strmap_prefetch_key(const StrMap *m, uint64_t h)
{
    size_t i = (size_t)h & (m->cap - 1);
    if (m->hash[i] == h)
        __builtin_prefetch(m->arena + m->key_off[i]);
}
/* strmap_get with h = strmap_hash(key, len). */
int strmap_get_hashed(const StrMap *m, uint64_t h, const void *key, size_t len, uint64_t *val);

/* Insert or overwrite.  0, or -1 when out of memory (or key over 4 GiB). */
int strmap_put(StrMap *m, const void *key, size_t len, uint64_t val);

#endif
