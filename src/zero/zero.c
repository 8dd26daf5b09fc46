#include "zero/zero.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

/* A DP gradient bucket (stages 0-1): a flat range of whole groups whose
 * reduction starts once backward has produced the group at `last_pos`. */
typedef struct {
    size_t lo, hi;
    int last_pos;        /* position in backward order of its last group */
    CommHandle h;
} Bucket;

struct Zero {
    const Config *cfg;
    const Backend *be;
    Comm *dp;
    int stage;
    Model *model;
    const ParamTable *t;
    int layer_begin, layer_end;
    int has_embed, has_head;     /* first / last pipeline stage */

    size_t P, S;                 /* local elements; shard block */
    size_t own_lo, own_hi;       /* this rank's part of [0, P) */
    size_t outer_lo, outer_hi;   /* the outer group's range */
    size_t max_layer;            /* elements of the largest layer */

    float *params;               /* stages 0-2: [P] */
    float *grads;                /* stages 0-1: [P] */
    float *pshard;               /* stage 3: [own] */
    float *gshard;               /* stages 1-3: [own], the reduced gradient */

    /* stages 2-3: gradient slots; stage 3: parameter slots */
    float *outer_p, *outer_g, *outer_recv;
    float *pslot[2], *gslot[2], *recv[2];
    int pslot_layer[2];          /* layer a parameter slot holds (-1: none) */
    int outer_valid;             /* stage 3: outer_p holds current parameters */
    CommHandle pgather[2], gred[2], outer_red;
    int gred_layer[2];           /* layer whose reduction is in flight (-1: none) */
    int outer_pending;
    int defer_outer;             /* stages 0-1: the outer bucket waits for zero_start_outer */

    Bucket *buckets;             /* stages 0-1 */
    int n_buckets;

    Optimizer opt;
    ZeroStats stats;
    size_t buffer_bytes;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waiting is the communication that compute did not hide. */
static void wait_timed(Zero *z, CommHandle *h)
{
    double t0 = now_s();
    comm_wait(h);
    z->stats.exposed_comm_s += now_s() - t0;
}

static size_t own_n(const Zero *z) { return z->own_hi - z->own_lo; }

static size_t layer_index(const Zero *z, int l) { return (size_t)(l - z->layer_begin); }

static int slot_of(const Zero *z, int l) { return (int)(layer_index(z, l) & 1); }

static void group_range(const Zero *z, int group, size_t *lo, size_t *hi)
{
    params_group_range(z->t, group, lo, hi);
}

/* ---- buckets (stages 0-1) ------------------------------------------------ */

/* Backward order: layers last to first, then the outer group (position
 * n_layers).  Buckets take whole groups until they reach the target size. */
static void build_buckets(Zero *z)
{
    const int nl = z->layer_end - z->layer_begin;
    const size_t target = (size_t)z->cfg->topology.bucket_mb * 1024 * 1024 / sizeof(float);
    z->buckets = trd_calloc((size_t)nl + 1, sizeof(Bucket), "gradient buckets");
    size_t lo = 0, hi = 0;
    int open = 0;
    for (int pos = 0; pos <= nl; pos++) {
        int group = pos < nl ? z->layer_end - 1 - pos : PARAMS_OUTER;
        size_t glo, ghi;
        group_range(z, group, &glo, &ghi);
        if (ghi <= glo)
            continue;
        if (!open) {
            hi = ghi;
            open = 1;
        }
        lo = glo; /* groups in backward order move down the buffer */
        if (hi - lo >= target || pos == nl) {
            z->buckets[z->n_buckets++] =
                (Bucket){.lo = lo, .hi = hi, .last_pos = pos, .h = {.req = MPI_REQUEST_NULL}};
            open = 0;
        }
    }
    if (open)
        z->buckets[z->n_buckets++] =
            (Bucket){.lo = lo, .hi = hi, .last_pos = nl, .h = {.req = MPI_REQUEST_NULL}};
}

static void start_bucket(Zero *z, Bucket *b)
{
    if (z->stage == 0) {
        b->h = comm_iallreduce_f32(z->dp, z->grads + b->lo, b->hi - b->lo);
    } else {
        size_t a, e;
        comm_shard_part(b->lo, b->hi, z->S, z->dp->rank, &a, &e);
        float *recv = e > a ? z->gshard + (a - z->own_lo) : z->gshard;
        b->h = comm_ireduce_scatter_range_f32(z->dp, z->grads + b->lo, recv, b->lo, b->hi, z->S);
    }
}

/* ---- slots (stages 2-3) ---------------------------------------------------- */

/* Add a finished reduction of [lo, hi) (received into recv) to our shard. */
static void accumulate_part(Zero *z, const float *recv, size_t lo, size_t hi)
{
    size_t a, b;
    comm_shard_part(lo, hi, z->S, z->dp->rank, &a, &b);
    if (b > a)
        z->be->accumulate(z->gshard + (a - z->own_lo), recv, b - a);
}

static void finish_layer_reduction(Zero *z, int k)
{
    if (z->gred_layer[k] < 0)
        return;
    size_t lo, hi;
    group_range(z, z->gred_layer[k], &lo, &hi);
    wait_timed(z, &z->gred[k]);
    accumulate_part(z, z->recv[k], lo, hi);
    z->gred_layer[k] = -1;
}

static void finish_outer_reduction(Zero *z)
{
    if (!z->outer_pending)
        return;
    wait_timed(z, &z->outer_red);
    accumulate_part(z, z->outer_recv, z->outer_lo, z->outer_hi);
    z->outer_pending = 0;
}

static void start_gather(Zero *z, int l)
{
    int k = slot_of(z, l);
    if (z->pslot_layer[k] == l)
        return;
    comm_wait(&z->pgather[k]); /* a slot is reused only after its last gather */
    size_t lo, hi, a, b;
    group_range(z, l, &lo, &hi);
    comm_shard_part(lo, hi, z->S, z->dp->rank, &a, &b);
    const float *mine = b > a ? z->pshard + (a - z->own_lo) : z->pshard;
    z->pgather[k] = comm_iallgather_range_f32(z->dp, mine, z->pslot[k], lo, hi, z->S);
    z->pslot_layer[k] = l;
}

/* Stage 3: make layer l's parameters present and bound; prefetch `next`. */
static void use_layer_params(Zero *z, int l, int next)
{
    if (z->stage < 3)
        return;
    int k = slot_of(z, l);
    start_gather(z, l);
    wait_timed(z, &z->pgather[k]);
    if (next >= z->layer_begin && next < z->layer_end)
        start_gather(z, next);
    model_bind(z->model, l, z->pslot[k], NULL);
}

static void gather_outer(Zero *z)
{
    if (z->stage < 3 || z->outer_valid || z->outer_hi <= z->outer_lo)
        return;
    size_t a, b;
    comm_shard_part(z->outer_lo, z->outer_hi, z->S, z->dp->rank, &a, &b);
    const float *mine = b > a ? z->pshard + (a - z->own_lo) : z->pshard;
    CommHandle h = comm_iallgather_range_f32(z->dp, mine, z->outer_p, z->outer_lo, z->outer_hi,
                                             z->S);
    wait_timed(z, &h);
    z->outer_valid = 1;
}

/* ---- create ------------------------------------------------------------------ */

static float *alloc_buffer(Zero *z, size_t n, const char *what)
{
    z->buffer_bytes += n * sizeof(float);
    return trd_calloc(n, sizeof(float), what);
}

static void bind_full(Zero *z, float *params, float *grads)
{
    size_t lo, hi;
    group_range(z, PARAMS_OUTER, &lo, &hi);
    model_bind(z->model, PARAMS_OUTER, params ? params + lo : NULL, grads ? grads + lo : NULL);
    for (int l = z->layer_begin; l < z->layer_end; l++) {
        group_range(z, l, &lo, &hi);
        model_bind(z->model, l, params ? params + lo : NULL, grads ? grads + lo : NULL);
    }
}

Zero *zero_create(const Config *cfg, const Backend *be, const ParamShard *sh, Comm *dp)
{
    Zero *z = trd_calloc(1, sizeof *z, "ZeRO engine");
    z->cfg = cfg;
    z->be = be;
    z->dp = dp;
    z->stage = cfg->topology.zero;
    z->layer_begin = sh->layer_begin;
    z->layer_end = sh->layer_end;
    z->has_embed = sh->has_embed;
    z->has_head = sh->has_head;
    z->model = model_create_unbound(cfg, be, sh, cfg->training.micro_batch);
    z->t = model_params(z->model);
    z->P = z->t->numel;
    z->S = (z->P + (size_t)dp->size - 1) / (size_t)dp->size;
    comm_shard_part(0, z->P, z->S, dp->rank, &z->own_lo, &z->own_hi);
    group_range(z, PARAMS_OUTER, &z->outer_lo, &z->outer_hi);
    for (int l = z->layer_begin; l < z->layer_end; l++) {
        size_t lo, hi;
        group_range(z, l, &lo, &hi);
        if (hi - lo > z->max_layer)
            z->max_layer = hi - lo;
    }
    z->pslot_layer[0] = z->pslot_layer[1] = -1;
    for (int k = 0; k < 2; k++)
        z->pgather[k] = z->gred[k] = (CommHandle){.req = MPI_REQUEST_NULL};
    z->outer_red = (CommHandle){.req = MPI_REQUEST_NULL};
    z->gred_layer[0] = z->gred_layer[1] = -1;
    const Precision prec = cfg->training.precision;
    const uint64_t seed = cfg->run.seed;
    const size_t outer_n = z->outer_hi - z->outer_lo;

    if (z->stage <= 2) {
        z->params = trd_calloc(z->P, sizeof(float), "parameters");
        params_init(z->t, z->params, seed);
    }
    if (z->stage <= 1) {
        z->grads = trd_calloc(z->P, sizeof(float), "gradients");
        bind_full(z, z->params, z->grads);
        build_buckets(z);
    } else {
        bind_full(z, z->params, NULL); /* stage 3: params is NULL, nothing bound */
        z->outer_g = alloc_buffer(z, outer_n, "outer gradient slot");
        z->outer_recv = alloc_buffer(z, outer_n < z->S ? outer_n : z->S, "outer receive");
        for (int k = 0; k < 2; k++) {
            z->gslot[k] = alloc_buffer(z, z->max_layer, "layer gradient slot");
            z->recv[k] = alloc_buffer(z, z->max_layer < z->S ? z->max_layer : z->S,
                                      "layer receive");
        }
        model_bind(z->model, PARAMS_OUTER, NULL, z->outer_g);
    }
    if (z->stage >= 1)
        z->gshard = trd_calloc(own_n(z) ? own_n(z) : 1, sizeof(float), "gradient shard");
    if (z->stage == 3) {
        z->pshard = trd_calloc(own_n(z) ? own_n(z) : 1, sizeof(float), "parameter shard");
        params_init_range(z->t, z->pshard, seed, z->own_lo, z->own_hi);
        z->outer_p = alloc_buffer(z, outer_n, "outer parameter slot");
        for (int k = 0; k < 2; k++)
            z->pslot[k] = alloc_buffer(z, z->max_layer, "layer parameter slot");
        model_bind(z->model, PARAMS_OUTER, z->outer_p, NULL);
    }

    if (z->stage == 0) {
        optimizer_init(&z->opt, z->t, be, z->params, 0, z->P, prec);
    } else if (z->stage <= 2) {
        optimizer_init(&z->opt, z->t, be, z->params + z->own_lo, z->own_lo, z->own_hi, prec);
        /* bf16 rounded only our part: make every rank's copy whole again. */
        CommHandle h = comm_iallgather_range_f32(dp, z->params + z->own_lo, z->params, 0, z->P,
                                                 z->S);
        comm_wait(&h);
    } else {
        optimizer_init(&z->opt, z->t, be, z->pshard, z->own_lo, z->own_hi, prec);
    }
    return z;
}

void zero_free(Zero *z)
{
    if (!z)
        return;
    optimizer_free(&z->opt);
    model_free(z->model);
    free(z->params);
    free(z->grads);
    free(z->pshard);
    free(z->gshard);
    free(z->outer_p);
    free(z->outer_g);
    free(z->outer_recv);
    for (int k = 0; k < 2; k++) {
        free(z->pslot[k]);
        free(z->gslot[k]);
        free(z->recv[k]);
    }
    free(z->buckets);
    free(z);
}

Model *zero_model(Zero *z) { return z->model; }

/* ---- the step -------------------------------------------------------------- */

void zero_begin_step(Zero *z)
{
    if (z->grads)
        memset(z->grads, 0, z->P * sizeof(float));
    if (z->gshard)
        memset(z->gshard, 0, own_n(z) * sizeof(float));
    gather_outer(z);
}

/* Backward of layer l is done: start what can start. */
static void layer_grads_ready(Zero *z, int l, int pos, int last_micro)
{
    if (z->stage >= 2) {
        int k = slot_of(z, l);
        size_t lo, hi;
        group_range(z, l, &lo, &hi);
        z->gred[k] = comm_ireduce_scatter_range_f32(z->dp, z->gslot[k], z->recv[k], lo, hi, z->S);
        z->gred_layer[k] = l;
        return;
    }
    if (!last_micro)
        return; /* accumulate locally; reduce once on the last micro-batch */
    for (int i = 0; i < z->n_buckets; i++) {
        if (z->buckets[i].last_pos == pos)
            start_bucket(z, &z->buckets[i]);
        else
            comm_test(&z->buckets[i].h); /* drive progress of those in flight */
    }
}

/* ---- the parts of a micro-batch ----------------------------------------------
 * zero_forward_backward runs them in order for a whole model; a pipeline
 * stage calls them around the model parts it runs itself. */

void zero_before_block_forward(Zero *z, int l)
{
    gather_outer(z);
    use_layer_params(z, l, l + 1);
}

void zero_before_block_backward(Zero *z, int l)
{
    use_layer_params(z, l, l - 1);
    if (z->stage < 2)
        return;
    int k = slot_of(z, l);
    finish_layer_reduction(z, k);
    size_t lo, hi;
    group_range(z, l, &lo, &hi);
    memset(z->gslot[k], 0, (hi - lo) * sizeof(float));
    model_bind(z->model, l, NULL, z->gslot[k]);
}

void zero_after_block_backward(Zero *z, int l, int last_micro)
{
    layer_grads_ready(z, l, z->layer_end - 1 - l, last_micro);
}

void zero_before_outer_backward(Zero *z)
{
    if (z->stage < 2)
        return;
    /* The outer slot collects head and embedding gradients of this
     * micro-batch: the previous one's reduction must be done first. */
    finish_outer_reduction(z);
    memset(z->outer_g, 0, (z->outer_hi - z->outer_lo) * sizeof(float));
}

void zero_after_outer_backward(Zero *z, int last_micro)
{
    if (z->stage >= 2) {
        z->outer_red = comm_ireduce_scatter_range_f32(z->dp, z->outer_g, z->outer_recv,
                                                      z->outer_lo, z->outer_hi, z->S);
        z->outer_pending = 1;
    } else if (last_micro && !z->defer_outer) {
        zero_start_outer(z);
    }
}

void zero_defer_outer(Zero *z)
{
    TRD_ASSERT(z->stage <= 1);
    z->defer_outer = 1;
}

void zero_start_outer(Zero *z)
{
    const int nl = z->layer_end - z->layer_begin;
    for (int i = 0; i < z->n_buckets; i++)
        if (z->buckets[i].last_pos == nl)
            start_bucket(z, &z->buckets[i]);
}

float *zero_full_grads(Zero *z) { return z->grads; }

float zero_forward(Zero *z, const int32_t *tokens, const int32_t *targets)
{
    Model *m = z->model;
    gather_outer(z);
    if (z->has_embed)
        model_embed_forward(m, tokens);
    for (int l = z->layer_begin; l < z->layer_end; l++) {
        zero_before_block_forward(z, l);
        model_block_forward(m, l);
    }
    return z->has_head ? model_head_forward(m, targets) : 0.0f;
}

float zero_forward_backward(Zero *z, const int32_t *tokens, const int32_t *targets,
                            float loss_scale, int last_micro)
{
    Model *m = z->model;
    const float loss = zero_forward(z, tokens, targets);
    zero_before_outer_backward(z);
    if (z->has_head)
        model_head_backward(m, loss_scale);
    for (int l = z->layer_end - 1; l >= z->layer_begin; l--) {
        zero_before_block_backward(z, l);
        model_block_backward(m, l);
        zero_after_block_backward(z, l, last_micro);
    }
    if (z->has_embed)
        model_embed_backward(m);
    zero_after_outer_backward(z, last_micro);
    return loss;
}

void zero_finish_grads(Zero *z)
{
    if (z->stage >= 2) {
        finish_layer_reduction(z, 0);
        finish_layer_reduction(z, 1);
        finish_outer_reduction(z);
        return;
    }
    for (int i = 0; i < z->n_buckets; i++)
        wait_timed(z, &z->buckets[i].h);
}

double zero_grad_sumsq(Zero *z)
{
    /* Each element counted once: tensor-parallel replicas only on their
     * owner (params_grad_sumsq); ZeRO shards summed over DP here. */
    if (z->stage == 0)
        return params_grad_sumsq(z->t, z->grads, 0, z->P);
    double s = params_grad_sumsq(z->t, z->gshard, z->own_lo, z->own_hi);
    comm_allreduce_f64(z->dp, &s, 1);
    return s;
}

void zero_scale_grads(Zero *z, float s)
{
    if (z->stage == 0)
        z->be->scale(z->grads, s, z->P);
    else
        z->be->scale(z->gshard, s, own_n(z));
}

void zero_optimizer_step(Zero *z, float lr, const TrainingConfig *tc)
{
    if (z->stage == 0) {
        optimizer_step(&z->opt, z->params, z->grads, lr, tc);
    } else if (z->stage <= 2) {
        optimizer_step(&z->opt, z->params + z->own_lo, z->gshard, lr, tc);
        CommHandle h = comm_iallgather_range_f32(z->dp, z->params + z->own_lo, z->params, 0,
                                                 z->P, z->S);
        wait_timed(z, &h);
    } else {
        optimizer_step(&z->opt, z->pshard, z->gshard, lr, tc);
        /* Gathered copies are stale now. */
        for (int k = 0; k < 2; k++) {
            comm_wait(&z->pgather[k]);
            z->pslot_layer[k] = -1;
        }
        z->outer_valid = 0;
    }
}

ZeroState zero_state(Zero *z)
{
    return (ZeroState){.params = z->params ? z->params : z->pshard, .master = z->opt.master,
                       .m = z->opt.m, .v = z->opt.v, .adam_t = &z->opt.t};
}

ZeroMemory zero_memory(const Zero *z)
{
    ZeroMemory r = {0};
    r.params = (z->params ? z->P : 0) * sizeof(float) + (z->pshard ? own_n(z) : 0) * sizeof(float);
    r.grads = (z->grads ? z->P : 0) * sizeof(float) + (z->gshard ? own_n(z) : 0) * sizeof(float);
    r.optimizer = optimizer_bytes(&z->opt);
    r.buffers = z->buffer_bytes;
    return r;
}

ZeroStats zero_take_stats(Zero *z)
{
    ZeroStats s = z->stats;
    s.bytes = z->dp->bytes_sent;
    z->dp->bytes_sent = 0;
    memset(&z->stats, 0, sizeof z->stats);
    return s;
}

void zero_gather_params(Zero *z, float *out)
{
    if (z->params) {
        memcpy(out, z->params, z->P * sizeof(float));
        return;
    }
    CommHandle h = comm_iallgather_range_f32(z->dp, z->pshard, out, 0, z->P, z->S);
    comm_wait(&h);
}
