/* buckets.h — data parallelism's gradient buckets.
 *
 * A bucket is a flat range of whole parameter groups (a layer, or the outer
 * group: embeddings, final norm, head) whose DP reduction can start as soon
 * as backward has produced the final gradient of every group in it.  Groups
 * are taken in backward order (layers last to first, then the outer group),
 * which walks down the flat buffer, and a bucket closes once it holds
 * `target` elements (topology.bucket_mb).  The engine (src/zero, stages 0
 * and 1) and the planner build their buckets here, so both count the same
 * messages. */
#ifndef TRD_DATA_PAR_BUCKETS_H
#define TRD_DATA_PAR_BUCKETS_H

#include <stddef.h>

#include "comm/comm.h"
#include "model/params.h"

typedef struct {
    size_t lo, hi; /* flat range [lo, hi) of the rank's parameter buffer */
    int groups;    /* non-empty groups in it */
    int left;      /* of those, still without their final gradient this step */
    CommHandle h;  /* its reduction in flight */
} DpBucket;

/* Fill b (room for nl + 1) from the held layers (ascending, nl of them) and
 * bucket_of[pos] (room for nl + 1: the bucket of the group at each backward
 * position, -1 for an empty group); returns the number of buckets. */
int dp_make_buckets(const ParamTable *t, const int *layers, int nl, size_t target, DpBucket *b,
                    int *bucket_of);

/* topology.bucket_mb in float elements. */
size_t dp_bucket_target(int bucket_mb);

#endif
