/* unicode.h — the little Unicode the GPT-2 pre-tokenizer needs (internal to
 * src/data): UTF-8 decoding as the reference (WHATWG TextDecoder) does it,
 * and the character classes of its pattern: letters \p{L}, numbers \p{N},
 * whitespace \s (JavaScript's definition), everything else. */
#ifndef TRD_DATA_UNICODE_H
#define TRD_DATA_UNICODE_H

#include <stddef.h>
#include <stdint.h>

typedef enum { UCLASS_OTHER = 0, UCLASS_LETTER, UCLASS_NUMBER, UCLASS_SPACE } UnicodeClass;

/* Decode one code point at s[0..len) (len >= 1).  Returns its byte length;
 * an ill-formed sequence gives U+FFFD and the length of its maximal
 * subpart (at least 1), as the WHATWG UTF-8 decoder does. */
int unicode_decode(const unsigned char *s, size_t len, uint32_t *cp);

/* Class of a code point for the GPT-2 pattern. */
UnicodeClass unicode_class(uint32_t cp);
/* The same for ASCII (cp < 0x80), inline: the pre-tokenizers' common case. */
static inline UnicodeClass unicode_class_ascii(uint32_t cp)
{
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
        return UCLASS_LETTER;
    if (cp >= '0' && cp <= '9')
        return UCLASS_NUMBER;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
        return UCLASS_SPACE;
    return UCLASS_OTHER;
}

/* Generated tables (unicode_classes.c): sorted, disjoint, inclusive
 * ranges of non-ASCII letters and numbers. */
extern const uint32_t unicode_letter_ranges[][2];
extern const int unicode_letter_ranges_count;
extern const uint32_t unicode_number_ranges[][2];
extern const int unicode_number_ranges_count;

/* General categories for the tiktoken patterns (cl100k_base, o200k_base),
 * which also need letters by subcategory and marks.  JavaScript's \s is
 * UCAT_SPACE (no such code point is a letter, mark or number). */
typedef enum {
    UCAT_OTHER = 0,
    UCAT_SPACE,
    UCAT_LU,
    UCAT_LL,
    UCAT_LT,
    UCAT_LM,
    UCAT_LO,
    UCAT_M,
    UCAT_N
} UnicodeCategory;
UnicodeCategory unicode_category(uint32_t cp);
/* The same for ASCII (cp < 0x80), inline. */
static inline UnicodeCategory unicode_category_ascii(uint32_t cp)
{
    if (cp >= 'a' && cp <= 'z')
        return UCAT_LL;
    if (cp >= 'A' && cp <= 'Z')
        return UCAT_LU;
    if (cp >= '0' && cp <= '9')
        return UCAT_N;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
        return UCAT_SPACE;
    return UCAT_OTHER;
}

typedef struct {
    uint32_t first, last;
    UnicodeCategory cat;
} UnicodeRange;
/* Generated (unicode_categories.c): non-ASCII code points by category. */
extern const UnicodeRange unicode_category_ranges[];
extern const int unicode_category_ranges_count;

/* Offset of the first ill-formed UTF-8 sequence in s[0..len), or len when
 * the text is well-formed. */
size_t unicode_invalid_at(const unsigned char *s, size_t len);

/* The text as the reference encoders read a file: each ill-formed
 * sequence becomes U+FFFD (EF BF BD).  Returns a malloc'd repaired copy
 * with its length in *out_len, or NULL with *clean = 1 when the text is
 * well-formed already (NULL with *clean = 0: out of memory). */
unsigned char *unicode_repair(const unsigned char *s, size_t len, size_t *out_len, int *clean);

#endif
