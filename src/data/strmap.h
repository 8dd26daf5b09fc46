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
/* Insert or overwrite.  0, or -1 when out of memory (or key over 4 GiB). */
int strmap_put(StrMap *m, const void *key, size_t len, uint64_t val);

#endif
