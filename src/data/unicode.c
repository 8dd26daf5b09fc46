#include "data/unicode.h"

#include <stdlib.h>
#include <string.h>

int unicode_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    /* Lead byte: number of continuation bytes, and the allowed range of
     * the first one (which excludes overlong forms, surrogates and code
     * points above U+10FFFF). */
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
        v = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        v = b & 0x0F;
        if (b == 0xE0)
            lo = 0xA0;
        if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        v = b & 0x07;
        if (b == 0xF0)
            lo = 0x90;
        if (b == 0xF4)
            hi = 0x8F;
    } else {
        *cp = 0xFFFD;
        return 1;
    }
    int i = 1;
    for (; i <= need; i++) {
        if ((size_t)i >= len || s[i] < lo || s[i] > hi) {
            *cp = 0xFFFD; /* maximal subpart: the bytes seen so far */
            return i;
        }
        v = (v << 6) | (s[i] & 0x3F);
        lo = 0x80;
        hi = 0xBF;
    }
    *cp = v;
    return i;
}

static int in_ranges(const uint32_t (*r)[2], int n, uint32_t cp)
{
    int a = 0, b = n - 1;
    while (a <= b) {
        int m = (a + b) / 2;
        if (cp < r[m][0])
            b = m - 1;
        else if (cp > r[m][1])
            a = m + 1;
        else
            return 1;
    }
    return 0;
}

UnicodeClass unicode_class(uint32_t cp)
{
    if (cp < 0x80)
        return unicode_class_ascii(cp);
    /* JavaScript's \s beyond ASCII: no-break space, Ogham space mark, the
     * U+2000 spaces, line/paragraph separators, narrow no-break space,
     * medium mathematical space, ideographic space and the BOM. */
    if (cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
        cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF)
        return UCLASS_SPACE;
    if (in_ranges(unicode_letter_ranges, unicode_letter_ranges_count, cp))
        return UCLASS_LETTER;
    if (in_ranges(unicode_number_ranges, unicode_number_ranges_count, cp))
        return UCLASS_NUMBER;
    return UCLASS_OTHER;
}

UnicodeCategory unicode_category(uint32_t cp)
{
    if (cp < 0x80)
        return unicode_category_ascii(cp);
    if (unicode_class(cp) == UCLASS_SPACE)
        return UCAT_SPACE;
    int a = 0, b = unicode_category_ranges_count - 1;
    while (a <= b) {
        int m = (a + b) / 2;
        if (cp < unicode_category_ranges[m].first)
            b = m - 1;
        else if (cp > unicode_category_ranges[m].last)
            a = m + 1;
        else
            return unicode_category_ranges[m].cat;
    }
    return UCAT_OTHER;
}

/* U+FFFD from the decoder is ill-formed input unless the text spells it. */
static int is_replacement(const unsigned char *s, int k, uint32_t cp)
{
    return cp == 0xFFFD && !(k == 3 && s[0] == 0xEF && s[1] == 0xBF && s[2] == 0xBD);
}

size_t unicode_invalid_at(const unsigned char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        uint64_t w;
        if (i + 8 <= len && (memcpy(&w, s + i, 8), (w & 0x8080808080808080ull) == 0)) {
            i += 8; /* ASCII runs, the common case: eight bytes at a time */
            continue;
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = unicode_decode(s + i, len - i, &cp);
        if (is_replacement(s + i, k, cp))
            return i;
        i += (size_t)k;
    }
    return len;
}

unsigned char *unicode_repair(const unsigned char *s, size_t len, size_t *out_len, int *clean)
{
    size_t bad = unicode_invalid_at(s, len);
    *clean = bad == len;
    if (*clean)
        return NULL;
    unsigned char *r = malloc(3 * len);
    if (!r)
        return NULL;
    memcpy(r, s, bad);
    size_t o = bad;
    for (size_t i = bad; i < len;) {
        uint32_t cp;
        int k = unicode_decode(s + i, len - i, &cp);
        if (cp == 0xFFFD) {
            memcpy(r + o, "\xEF\xBF\xBD", 3);
            o += 3;
        } else {
            memcpy(r + o, s + i, (size_t)k);
            o += (size_t)k;
        }
        i += (size_t)k;
    }
    *out_len = o;
    return r;
}
