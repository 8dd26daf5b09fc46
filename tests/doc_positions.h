/* doc_positions.h — packed documents for the attention tests: positions
 * within documents (AttnArgs.pos), as batch_positions makes them from a
 * batch's end-of-document tokens. */
#ifndef TRD_TEST_DOC_POSITIONS_H
#define TRD_TEST_DOC_POSITIONS_H

#include <stdint.h>
#include <stdlib.h>

/* B sequences of T rows cut into documents of lengths len[0], len[1], ...
 * (cycled over the rows of all sequences; each sequence starts a new one):
 * pos restarts at 0 where a document starts.  malloc'ed. */
static inline int32_t *doc_positions(int B, int T, const int *len, int nlen)
{
    int32_t *pos = malloc((size_t)B * T * sizeof *pos);
    for (int b = 0, k = 0; b < B; b++)
        for (int t = 0, at = 0; t < T; t++, at++) {
            if (at == len[k % nlen])
                at = 0, k++;
            pos[(size_t)b * T + t] = at;
        }
    return pos;
}

#endif
