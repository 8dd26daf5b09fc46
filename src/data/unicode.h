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

/* Generated tables (unicode_classes.c): sorted, disjoint, inclusive
 * ranges of non-ASCII letters and numbers. */
extern const uint32_t unicode_letter_ranges[][2];
extern const int unicode_letter_ranges_count;
extern const uint32_t unicode_number_ranges[][2];
extern const int unicode_number_ranges_count;

#endif
