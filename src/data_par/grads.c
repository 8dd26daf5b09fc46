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
    /* offload (dp_grads_stream): where each bucket's reduced part goes */
    const Backend *be;
    float *host;
    int *unsent;   /* [n_buckets]: reduction started this step, not yet sent */
    double waited; /* seconds the host waited for buckets before finish */
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
    free(g->unsent);
    free(g);
}

void dp_grads_stream(DpGrads *g, const Backend *be, float *host)
{
    g->be = be;
    g->host = host;
    g->unsent = trd_calloc((size_t)g->n_buckets + 1, sizeof(int), "gradient buckets to send");
}

void dp_grads_begin_step(DpGrads *g)
{
    for (int i = 0; i < g->n_buckets; i++)
        g->buckets[i].left = g->buckets[i].groups;
}

/* Where bucket b's reduced result lands on this rank (backend memory):
 * [*lo, *hi) of the flat buffer, ZeRO 0 the whole bucket in place, ZeRO 1
 * our part of it (possibly empty) in the shard. */
static float *reduced_part(const DpGrads *g, const DpBucket *b, size_t *lo, size_t *hi)
{
    if (!g->shard) {
        *lo = b->lo;
        *hi = b->hi;
        return g->grads + b->lo;
    }
    comm_shard_part(b->lo, b->hi, g->S, g->dp->rank, lo, hi);
    return *hi > *lo ? g->shard + (*lo - g->own_lo) : g->shard;
}

/* Offload: send bucket i's reduced part to the host on the copy stream,
 * once its reduction is done, without ordering the compute stream after
 * it.  Under NCCL the copy stream waits for the reduction's own event
 * (comm_done_event) and the copy is queued at once; the compute stream
 * waits for the reduction only in dp_grads_finish, as without offload.
 * Under MPI (host staging) the reduction completes on the host:
 * comm_test polls it (block: comm_wait) and its result is back in device
 * memory when it says so; the copy then follows the compute stream's
 * work.  Returns whether it was sent.  ZeRO 0's optimizer range is
 * [0, P): the host buffer is indexed by the flat offset; ZeRO 1's is our
 * block, from own_lo. */
static int send_bucket(DpGrads *g, int i, int block)
{
    DpBucket *b = &g->buckets[i];
    const void *after = comm_done_event(&b->h);
    if (!after && block) {
        const double t0 = now_s();
        comm_wait(&b->h);
        g->waited += now_s() - t0;
    } else if (!after && !comm_test(&b->h)) {
        return 0;
    }
    g->unsent[i] = 0;
    size_t lo, hi;
    const float *part = reduced_part(g, b, &lo, &hi);
    if (hi > lo)
        g->be->to_host_async(g->host + (lo - (g->shard ? g->own_lo : 0)), part,
                             (hi - lo) * sizeof(float), after);
    return 1;
}

static void start_bucket(DpGrads *g, int i)
{
    DpBucket *b = &g->buckets[i];
    size_t lo, hi;
    float *out = reduced_part(g, b, &lo, &hi);
    if (!g->shard)
        b->h = comm_iallreduce_f32(g->dp, out, b->hi - b->lo);
    else
        b->h = comm_ireduce_scatter_range_f32(g->dp, g->grads + b->lo, out, b->lo, b->hi, g->S);
    if (!g->host)
        return;
    /* The earlier buckets' copies first (the copy stream runs in order),
     * those whose reduction has completed by now (MPI; NCCL's went at
     * once); then this one's, if it can go now. */
    for (int k = 0; k < g->n_buckets; k++)
        if (g->unsent[k])
            send_bucket(g, k, 0);
    g->unsent[i] = 1;
    send_bucket(g, i, 0);
}

static void group_final(DpGrads *g, int pos)
{
    const int b = g->bucket_of[pos];
    for (int i = 0; i < g->n_buckets; i++) { /* drive progress of those in flight */
        if (i == b)
            continue;
        if (g->host && g->unsent[i])
            send_bucket(g, i, 0); /* MPI: copied once its reduction has completed */
        else
            comm_test(&g->buckets[i].h);
    }
    if (b < 0)
        return;
    TRD_ASSERT(g->buckets[b].left > 0);
    if (--g->buckets[b].left == 0)
        start_bucket(g, b);
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
    const double during_backward = g->waited;
    const double t0 = now_s();
    for (int i = 0; i < g->n_buckets; i++) {
        if (g->host && g->unsent[i])
            send_bucket(g, i, 1);
        comm_wait(&g->buckets[i].h); /* NCCL: the compute stream's wait */
    }
    g->waited = 0;
    return during_backward + (now_s() - t0);
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
