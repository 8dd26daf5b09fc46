/* buckets.c — the partition of a rank's gradients into DP buckets. */
#include "data_par/buckets.h"

int dp_make_buckets(const ParamTable *t, const int *layers, int nl, size_t target, DpBucket *b,
                    int *bucket_of)
{
    int n = 0;
    DpBucket *open = NULL;
    for (int pos = 0; pos <= nl; pos++) {
        int group = pos < nl ? layers[nl - 1 - pos] : PARAMS_OUTER;
        size_t glo, ghi;
        params_group_range(t, group, &glo, &ghi);
        bucket_of[pos] = -1;
        if (ghi <= glo)
            continue;
        if (!open) {
            open = &b[n++];
            *open = (DpBucket){.hi = ghi, .h = comm_handle_none()};
        }
        open->lo = glo; /* groups in backward order move down the buffer */
        open->groups++;
        bucket_of[pos] = (int)(open - b);
        /* A bucket starts once all its groups have their final gradient,
         * whatever order the chunks of an interleaved pipeline finish in. */
        if (open->hi - open->lo >= target)
            open = NULL;
    }
    return n;
}

size_t dp_bucket_target(int bucket_mb) { return (size_t)bucket_mb * 1024 * 1024 / sizeof(float); }
