/* grads.c — the bucketed DP reduction and the finalize step (grads.h). */
#include "data_par/grads.h"

#include <stdlib.h>
#include <time.h>

#include "core/error.h"
#include "data_par/buckets.h"

struct DpGrads {
    Comm *dp, *embed;
    float *grads, *shard;
    size_t own_lo, S;
    int nl;
    DpBucket *buckets;
    int n_buckets;
    int *bucket_of;         /* [nl + 1]: bucket of the group at each backward position, or -1 */
    size_t tied_lo, tied_n; /* embed: the tied embedding's range in grads */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

DpGrads *dp_grads_create(const ParamTable *t, const int *layers, int nl, int bucket_mb, Comm *dp,
                         float *grads, float *shard, size_t own_lo, size_t S, Comm *embed)
{
    DpGrads *g = trd_calloc(1, sizeof *g, "data-parallel gradients");
    *g = (DpGrads){.dp = dp,
                   .embed = embed,
                   .grads = grads,
                   .shard = shard,
                   .own_lo = own_lo,
                   .S = S,
                   .nl = nl};
    g->buckets = trd_calloc((size_t)nl + 1, sizeof(DpBucket), "gradient buckets");
    g->bucket_of = trd_malloc(((size_t)nl + 1) * sizeof(int), "gradient bucket map");
    g->n_buckets =
        dp_make_buckets(t, layers, nl, dp_bucket_target(bucket_mb), g->buckets, g->bucket_of);
    if (embed) {
        const ParamSpec *w = params_find(t, "embed.wte.weight");
        TRD_ASSERT(w);
        g->tied_lo = w->offset;
        g->tied_n = w->numel;
    }
    return g;
}

void dp_grads_free(DpGrads *g)
{
    if (!g)
        return;
    free(g->buckets);
    free(g->bucket_of);
    free(g);
}

void dp_grads_begin_step(DpGrads *g)
{
    for (int i = 0; i < g->n_buckets; i++)
        g->buckets[i].left = g->buckets[i].groups;
}

static void start_bucket(DpGrads *g, DpBucket *b)
{
    if (!g->shard) {
        b->h = comm_iallreduce_f32(g->dp, g->grads + b->lo, b->hi - b->lo);
        return;
    }
    size_t a, e;
    comm_shard_part(b->lo, b->hi, g->S, g->dp->rank, &a, &e);
    float *recv = e > a ? g->shard + (a - g->own_lo) : g->shard;
    b->h = comm_ireduce_scatter_range_f32(g->dp, g->grads + b->lo, recv, b->lo, b->hi, g->S);
}

static void group_final(DpGrads *g, int pos)
{
    const int b = g->bucket_of[pos];
    for (int i = 0; i < g->n_buckets; i++)
        if (i != b)
            comm_test(&g->buckets[i].h); /* drive progress of those in flight */
    if (b < 0)
        return;
    TRD_ASSERT(g->buckets[b].left > 0);
    if (--g->buckets[b].left == 0)
        start_bucket(g, &g->buckets[b]);
}

void dp_grads_ready(DpGrads *g, int pos)
{
    if (pos == g->nl && g->embed)
        return; /* the tied embedding's sum comes first: dp_grads_finish */
    group_final(g, pos);
}

double dp_grads_finish(DpGrads *g)
{
    if (g->embed) {
        comm_allreduce_f32(g->embed, g->grads + g->tied_lo, g->tied_n);
        group_final(g, g->nl);
    }
    const double t0 = now_s();
    for (int i = 0; i < g->n_buckets; i++)
        comm_wait(&g->buckets[i].h);
    return now_s() - t0;
}

uint64_t dp_grads_plan_bytes(const ParamTable *t, const int *layers, int nl, int bucket_mb, int dp,
                             int shard)
{
    DpBucket *b = trd_calloc((size_t)nl + 1, sizeof(DpBucket), "planned buckets");
    int *bucket_of = trd_malloc(((size_t)nl + 1) * sizeof(int), "planned bucket map");
    const int n = dp_make_buckets(t, layers, nl, dp_bucket_target(bucket_mb), b, bucket_of);
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += comm_ring_bytes(b[i].hi - b[i].lo, shard ? 1 : 2, dp);
    free(b);
    free(bucket_of);
    return bytes;
}
