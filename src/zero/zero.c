#include "zero/zero.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "comm/trace.h"
#include "data_par/grads.h"

struct Zero {
    const Config *cfg;
    const Backend *be;
    Comm *dp;
    /* config_ep_divides: the experts' memory divided over ep.  The flat
     * buffers' expert region [Pd, P) (params.h) holds this rank's experts,
     * whose gradients are reduced over edp (the dp / ep ranks holding the
     * same experts) while the dense [0, Pd) is reduced over dp; ep sums
     * the expert part of the gradient norm.  Else Pd = P, edp NULL. */
    Comm *ep, *edp;
    size_t Pd;
    /* ZeRO 1-3 divided: the expert region sharded over edp in blocks of
     * XS (of the region: element Pd is its 0), this rank's [xown_lo,
     * xown_hi) (flat), its reduced gradient xgshard and the optimizer xopt
     * of it (state in opt's buffers after the dense block's:
     * optimizer_init_pair).  ZeRO 2-3: a layer's experts (the group
     * PARAMS_EXPERTS(l), bound apart from the layer) have slots of their
     * own beside the layer's, reduce-scattered (and at ZeRO 3 gathered)
     * over edp when the layer's are over dp: xgslot, xrecv, xgred, and at
     * ZeRO 3 xpslot, xpgather and the shard xpshard (pshard's tail).
     * ZeRO 0-1: each held layer's experts are reduced over edp in place
     * in grads (ZeRO 1: into xgshard) once its last micro-batch's backward
     * is done, overlapped with the rest of backward; xred[i] is held layer
     * i's reduction (by local index), waited for in zero_finish_grads. */
    size_t XS, xown_lo, xown_hi;
    float *xgshard;
    Optimizer xopt;
    size_t max_xlayer; /* elements of the largest layer's experts */
    float *xpshard, *xpslot[2], *xgslot[2], *xrecv[2];
    CommHandle xpgather[2], xgred[2];
    CommHandle *xred; /* ZeRO 0-1 divided: [nl] */
    int stage;
    ParamShard sh;
    Model *model[CFG_MAX_VIRTUAL]; /* one per model chunk held (params_chunk_shard) */
    ParamTable table;              /* the rank's piece: outer tensors, then every chunk */
    const ParamTable *t;           /* &table */
    int nl;                        /* layers held */
    int *layers;                   /* [nl]: the held layers, ascending (flat buffer order) */
    int *local;                    /* [model.layers]: index in `layers`, or -1 */
    int has_embed, has_head;       /* first / last model stage */

    size_t P, S;               /* local elements; shard block */
    size_t own_lo, own_hi;     /* this rank's part of [0, P) */
    size_t outer_lo, outer_hi; /* the outer group's range */
    size_t max_layer;          /* elements of the largest layer */

    float *params;   /* stages 0-2: [P] */
    float *grads;    /* stages 0-1: [P] */
    float *pshard;   /* stage 3: [own]; host memory with pshard_host */
    int pshard_host; /* topology.offload optimizer+params: pshard is the optimizer's */
    void *gather_up; /* pshard_host: the event of a gather's copy up (gather_range) */
    float *gshard;   /* stages 1-3: [own], the reduced gradient */

    /* stages 2-3: gradient slots; stage 3: parameter slots */
    float *outer_p, *outer_g, *outer_recv;
    float *pslot[2], *gslot[2], *recv[2];
    int pslot_layer[2]; /* layer a parameter slot holds (-1: none) */
    int outer_valid;    /* stage 3: outer_p holds current parameters */
    CommHandle pgather[2], gred[2], outer_red;
    int gred_layer[2]; /* layer whose reduction is in flight (-1: none) */
    int outer_pending;
    /* offload: each part of the gradients goes to the host as it is final
     * (stream_grads; stages 0-1: each bucket as its reduction completes,
     * data_par/grads.h; stages 2-3: each part of the gradient shard as its
     * last micro-batch's reduction is added); gred_last / outer_last: that
     * reduction is of the last micro-batch */
    int stream_grads, gred_last[2], outer_last, streamed;
    /* offload, stage 0: the optimizer's weight upload part of each held
     * layer (by local index) and of the outer group (-1: empty) */
    int *up_part, up_outer;

    DpGrads *dpg; /* stages 0-1: the bucketed reduction (data_par/grads.h) */

    Optimizer opt;
    ZeroStats stats;
    size_t buffer_bytes;
};

/* What each stage shards (zero.h's table). */
static const ZeroWhole STAGES[4] = {
    /*  params grads optimizer */
    {1, 1, 1}, /* 0: plain data parallelism */
    {1, 1, 0}, /* 1: the optimizer state */
    {1, 0, 0}, /* 2: and the gradients, per layer */
    {0, 0, 0}, /* 3: and the weights, gathered per layer */
};

ZeroWhole zero_stage_whole(int stage)
{
    TRD_ASSERT(stage >= 0 && stage <= 3);
    return STAGES[stage];
}

void zero_block(size_t P, int dp, int r, size_t *lo, size_t *hi)
{
    const size_t S = (P + (size_t)dp - 1) / (size_t)dp;
    comm_shard_part(0, P, S, r, lo, hi);
}

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
static size_t xown_n(const Zero *z) { return z->xown_hi - z->xown_lo; }

/* Stages 1-2: every rank's updated block into everyone's whole
 * parameters: the dense region over dp, the divided experts over edp. */
static void gather_owned(Zero *z, double *waited)
{
    CommHandle h[2];
    h[0] = comm_iallgather_range_f32(z->dp, z->params + z->own_lo, z->params, 0, z->Pd, z->S);
    h[1] = z->ep ? comm_iallgather_range_f32(z->edp, z->params + z->xown_lo, z->params + z->Pd, 0,
                                             z->P - z->Pd, z->XS)
                 : comm_handle_none();
    const double t0 = now_s();
    comm_wait(&h[0]);
    comm_wait(&h[1]);
    if (waited)
        *waited += now_s() - t0;
}

static int holds(const Zero *z, int l)
{
    return l >= 0 && l < z->cfg->model.layers && z->local[l] >= 0;
}

static int slot_of(const Zero *z, int l) { return z->local[l] & 1; }

/* Backward position of layer l: held layers run last to first (over every
 * chunk: a micro-batch's backward reaches chunk c only after chunk c + 1);
 * the outer group comes last, at position nl. */
static int backward_pos(const Zero *z, int l) { return z->nl - 1 - z->local[l]; }

/* The chunk model that runs layer l. */
static Model *model_of(const Zero *z, int l) { return z->model[params_shard_chunk_of(&z->sh, l)]; }

static void group_range(const Zero *z, int group, size_t *lo, size_t *hi)
{
    params_group_range(z->t, group, lo, hi);
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

/* Offload: [lo, hi)'s part of the gradient shard is final (its last
 * micro-batch's reduction was just added): send it to the optimizer's
 * staging buffer on the copy stream while backward goes on.  With bf16
 * optimizer+params that part of the buffer held the layer's weights: the
 * step gathered the layer for the last time before its backward, and the
 * copy up of that gather ran earlier on the same copy stream (or on the
 * compute stream, which this copy follows). */
static void stream_part(Zero *z, size_t lo, size_t hi)
{
    size_t a, b;
    comm_shard_part(lo, hi, z->S, z->dp->rank, &a, &b);
    if (b <= a)
        return;
    z->be->to_host_async(z->opt.stage + (a - z->own_lo), z->gshard + (a - z->own_lo),
                         (b - a) * sizeof(float), NULL);
    z->streamed = 1;
}

/* The same for a layer's experts (flat [lo, hi) in the expert region),
 * reduced over edp into the expert shard. */
static void accumulate_expert_part(Zero *z, const float *recv, size_t lo, size_t hi)
{
    size_t a, b;
    comm_shard_part(lo - z->Pd, hi - z->Pd, z->XS, z->edp->rank, &a, &b);
    if (b > a)
        z->be->accumulate(z->xgshard + (z->Pd + a - z->xown_lo), recv, b - a);
}

static void finish_layer_reduction(Zero *z, int k)
{
    if (z->gred_layer[k] < 0)
        return;
    size_t lo, hi;
    group_range(z, PARAMS_EXPERTS(z->gred_layer[k]), &lo, &hi); /* empty unless divided */
    if (hi > lo) {
        wait_timed(z, &z->xgred[k]);
        accumulate_expert_part(z, z->xrecv[k], lo, hi);
    }
    group_range(z, z->gred_layer[k], &lo, &hi);
    wait_timed(z, &z->gred[k]);
    accumulate_part(z, z->recv[k], lo, hi);
    if (z->stream_grads && z->gred_last[k])
        stream_part(z, lo, hi);
    z->gred_layer[k] = -1;
}

static void finish_outer_reduction(Zero *z)
{
    if (!z->outer_pending)
        return;
    wait_timed(z, &z->outer_red);
    accumulate_part(z, z->outer_recv, z->outer_lo, z->outer_hi);
    if (z->stream_grads && z->outer_last)
        stream_part(z, z->outer_lo, z->outer_hi);
    z->outer_pending = 0;
}

/* Start gathering [lo, hi) of the flat buffer into out (backend memory
 * for [lo, hi)).  With the shard in host memory (optimizer+params) this
 * rank's part is copied up into its place in out first, on the copy
 * stream, and gathered in place: the device holds no shard of its own.
 * The all-gather reads it after that copy (comm_after: under NCCL the
 * communicator's stream waits for it, the compute stream does not; under
 * MPI, or on one rank, the compute stream does).  Neither the host nor the
 * compute stream waits for the copy itself: the shard changes only in the
 * optimizer step, after host_copies_wait. */
static CommHandle gather_range(Zero *z, float *out, size_t lo, size_t hi)
{
    optimizer_wait_params(&z->opt); /* offload: the device shard's update */
    size_t a, b;
    comm_shard_part(lo, hi, z->S, z->dp->rank, &a, &b);
    const float *mine = b > a ? z->pshard + (a - z->own_lo) : z->pshard;
    if (z->pshard_host) {
        if (b > a) {
            z->be->to_backend_copy(out + (a - lo), mine, (b - a) * sizeof(float), z->gather_up);
            comm_after(z->dp, z->gather_up);
        }
        mine = out + (a - lo);
    }
    return comm_iallgather_range_f32(z->dp, mine, out, lo, hi, z->S);
}

/* Divided experts: start gathering a layer's experts, flat [lo, hi) of the
 * expert region, into out over edp (no offload: config_ep_divides). */
static CommHandle gather_experts(Zero *z, float *out, size_t lo, size_t hi)
{
    size_t a, b;
    comm_shard_part(lo - z->Pd, hi - z->Pd, z->XS, z->edp->rank, &a, &b);
    const float *mine = b > a ? z->xpshard + (z->Pd + a - z->xown_lo) : z->xpshard;
    return comm_iallgather_range_f32(z->edp, mine, out, lo - z->Pd, hi - z->Pd, z->XS);
}

static void start_gather(Zero *z, int l)
{
    int k = slot_of(z, l);
    if (z->pslot_layer[k] == l)
        return;
    comm_wait(&z->pgather[k]); /* a slot is reused only after its last gather */
    comm_wait(&z->xpgather[k]);
    size_t lo, hi;
    group_range(z, l, &lo, &hi);
    z->pgather[k] = gather_range(z, z->pslot[k], lo, hi);
    group_range(z, PARAMS_EXPERTS(l), &lo, &hi); /* empty unless divided */
    if (hi > lo)
        z->xpgather[k] = gather_experts(z, z->xpslot[k], lo, hi);
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
    wait_timed(z, &z->xpgather[k]);
    if (holds(z, next))
        start_gather(z, next);
    model_bind(model_of(z, l), l, z->pslot[k], NULL);
    if (z->xpslot[k])
        model_bind_experts(model_of(z, l), l, z->xpslot[k], NULL);
}

static void gather_outer(Zero *z)
{
    if (z->stage < 3 || z->outer_valid || z->outer_hi <= z->outer_lo)
        return;
    CommHandle h = gather_range(z, z->outer_p, z->outer_lo, z->outer_hi);
    wait_timed(z, &h);
    z->outer_valid = 1;
}

/* ---- create ------------------------------------------------------------------ */

/* Every buffer the ops or the collectives touch is in the backend's memory
 * (device memory for CUDA). */
static float *alloc_floats(const Zero *z, size_t n, const char *what)
{
    return z->be->alloc(n * sizeof(float), what);
}

static float *alloc_buffer(Zero *z, size_t n, const char *what)
{
    z->buffer_bytes += n * sizeof(float);
    return alloc_floats(z, n, what);
}

static void zero_floats(const Zero *z, float *x, size_t n) { z->be->zero(x, n * sizeof(float)); }

/* The seeded initial weights of [lo, hi) into dst (backend memory): made on
 * the host, where the initializer runs, then copied over. */
static void init_params(const Zero *z, float *dst, size_t lo, size_t hi)
{
    const size_t n = hi - lo;
    float *host = z->be->device ? trd_calloc(n ? n : 1, sizeof(float), "initial weights") : dst;
    params_init_range(z->t, host, z->cfg->run.seed, lo, hi);
    if (host != dst) {
        z->be->to_backend(dst, host, n * sizeof(float));
        free(host);
    }
}

/* optimizer+params: the shard's seeded weights made on the host and given
 * to the optimizer, whose host buffer holds them from then on (a
 * temporary copy of the shard, once, at start). */
static void init_params_host(Zero *z)
{
    const size_t n = own_n(z);
    float *init = trd_calloc(n ? n : 1, sizeof(float), "initial weights");
    params_init_range(z->t, init, z->cfg->run.seed, z->own_lo, z->own_hi);
    z->pshard = optimizer_init_offload_params(&z->opt, z->t, z->be, init, z->own_lo, z->own_hi,
                                              z->cfg->training.precision);
    z->pshard_host = 1;
    z->gather_up = z->be->event_create();
    free(init);
}

/* The outer tensors of every chunk model that has any (the first chunk's
 * embeddings, the last chunk's head) at storage holding the rank's outer
 * range; the chunk model's outer group is the rank's (checked at create). */
static void bind_outer_all(Zero *z, float *params, float *grads)
{
    for (int c = 0; c < z->sh.n_chunks; c++)
        model_bind(z->model[c], PARAMS_OUTER, params, grads);
}

static void bind_full(Zero *z, float *params, float *grads)
{
    size_t lo, hi;
    group_range(z, PARAMS_OUTER, &lo, &hi);
    bind_outer_all(z, params ? params + lo : NULL, grads ? grads + lo : NULL);
    for (int i = 0; i < z->nl; i++) {
        int l = z->layers[i];
        group_range(z, l, &lo, &hi);
        model_bind(model_of(z, l), l, params ? params + lo : NULL, grads ? grads + lo : NULL);
        group_range(z, PARAMS_EXPERTS(l), &lo, &hi); /* empty unless divided */
        model_bind_experts(model_of(z, l), l, params ? params + lo : NULL,
                           grads ? grads + lo : NULL);
    }
}

/* The caller's models, one per chunk over its own contiguous layers; the
 * rank's table (every chunk) lays out the flat buffers the engine owns. */
static void take_models(Zero *z, const Config *cfg, const ParamShard *sh, Model *const *models)
{
    TRD_ASSERT(sh->n_chunks >= 1 && sh->n_chunks <= CFG_MAX_VIRTUAL);
    z->sh = *sh;
    params_build(&z->table, &cfg->model, sh);
    z->t = &z->table;
    z->nl = params_shard_layers(sh);
    z->layers = trd_calloc((size_t)z->nl + 1, sizeof(int), "held layers");
    z->local = trd_malloc((size_t)cfg->model.layers * sizeof(int), "layer index");
    for (int l = 0; l < cfg->model.layers; l++)
        z->local[l] = -1;
    int i = 0;
    for (int c = 0; c < sh->n_chunks; c++)
        for (int l = sh->chunk[c].begin; l < sh->chunk[c].end; l++) {
            z->local[l] = i;
            z->layers[i++] = l;
        }
    size_t olo, ohi;
    params_group_range(z->t, PARAMS_OUTER, &olo, &ohi);
    for (int c = 0; c < sh->n_chunks; c++) {
        z->model[c] = models[c];
        size_t lo, hi;
        params_group_range(model_params(z->model[c]), PARAMS_OUTER, &lo, &hi);
        TRD_ASSERT(hi == lo || hi - lo == ohi - olo);
    }
}

/* Offload, stage 0 (the optimizer's range is the flat buffer): the weights
 * go up a group at a time, the outer tensors then each held layer (the
 * flat buffer's order, which is the forward's), and the forward waits for
 * each group's part just before its first use. */
static void upload_per_group(Zero *z)
{
    size_t *ends = trd_malloc(((size_t)z->nl + 1) * sizeof(size_t), "weight upload parts");
    z->up_part = trd_malloc(((size_t)z->nl + 1) * sizeof(int), "weight upload part map");
    int n = 0;
    size_t at = 0;
    for (int i = -1; i < z->nl; i++) {
        size_t lo, hi;
        group_range(z, i < 0 ? PARAMS_OUTER : z->layers[i], &lo, &hi);
        int part = -1;
        if (hi > lo) {
            TRD_ASSERT(lo == at); /* contiguous, in this order */
            ends[n] = hi;
            part = n++;
            at = hi;
        }
        if (i < 0)
            z->up_outer = part;
        else
            z->up_part[i] = part;
    }
    TRD_ASSERT(at == z->P && n > 0);
    optimizer_upload_parts(&z->opt, ends, n);
    free(ends);
}

Zero *zero_create(const Config *cfg, const Backend *be, const ParamShard *sh, Model *const *models,
                  Comm *dp, Comm *embed, Comm *ep, Comm *edp)
{
    Zero *z = trd_calloc(1, sizeof *z, "ZeRO engine");
    z->cfg = cfg;
    z->be = be;
    z->dp = dp;
    z->stage = cfg->topology.zero;
    z->has_embed = sh->has_embed;
    z->has_head = sh->has_head;
    take_models(z, cfg, sh, models);
    z->P = z->t->numel;
    z->Pd = z->t->dense_numel;
    if (z->t->ep > 1) { /* the trainer's shard follows config_ep_divides */
        TRD_ASSERT(config_ep_divides(cfg) && ep && edp && ep->size == z->t->ep &&
                   ep->rank == z->t->ep_rank && edp->size * ep->size == dp->size);
        z->ep = ep;
        z->edp = edp;
    }
    /* ZeRO's blocks over dp cover the dense region (all of [0, P) unless
     * the experts are divided); the expert region's, over edp. */
    z->S = (z->Pd + (size_t)dp->size - 1) / (size_t)dp->size;
    comm_shard_part(0, z->Pd, z->S, dp->rank, &z->own_lo, &z->own_hi);
    if (z->ep) {
        const size_t Pe = z->P - z->Pd;
        z->XS = (Pe + (size_t)edp->size - 1) / (size_t)edp->size;
        comm_shard_part(0, Pe, z->XS, edp->rank, &z->xown_lo, &z->xown_hi);
        z->xown_lo += z->Pd;
        z->xown_hi += z->Pd;
    }
    group_range(z, PARAMS_OUTER, &z->outer_lo, &z->outer_hi);
    for (int i = 0; i < z->nl; i++) {
        size_t lo, hi;
        group_range(z, z->layers[i], &lo, &hi);
        if (hi - lo > z->max_layer)
            z->max_layer = hi - lo;
        group_range(z, PARAMS_EXPERTS(z->layers[i]), &lo, &hi);
        if (hi - lo > z->max_xlayer)
            z->max_xlayer = hi - lo;
    }
    z->pslot_layer[0] = z->pslot_layer[1] = -1;
    for (int k = 0; k < 2; k++)
        z->pgather[k] = z->gred[k] = z->xpgather[k] = z->xgred[k] = comm_handle_none();
    z->outer_red = comm_handle_none();
    z->gred_layer[0] = z->gred_layer[1] = -1;
    const Precision prec = cfg->training.precision;
    const size_t outer_n = z->outer_hi - z->outer_lo;

    const ZeroWhole whole = STAGES[z->stage];
    if (whole.params) {
        z->params = alloc_floats(z, z->P, "parameters");
        init_params(z, z->params, 0, z->P);
    }
    if (whole.grads) {
        z->grads = alloc_floats(z, z->P, "gradients");
        bind_full(z, z->params, z->grads);
    } else {
        bind_full(z, z->params, NULL); /* stage 3: params is NULL, nothing bound */
        z->outer_g = alloc_buffer(z, outer_n, "outer gradient slot");
        z->outer_recv = alloc_buffer(z, outer_n < z->S ? outer_n : z->S, "outer receive");
        for (int k = 0; k < 2; k++) {
            z->gslot[k] = alloc_buffer(z, z->max_layer, "layer gradient slot");
            z->recv[k] =
                alloc_buffer(z, z->max_layer < z->S ? z->max_layer : z->S, "layer receive");
            if (z->max_xlayer) { /* divided experts */
                z->xgslot[k] = alloc_buffer(z, z->max_xlayer, "expert gradient slot");
                z->xrecv[k] = alloc_buffer(z, z->max_xlayer < z->XS ? z->max_xlayer : z->XS,
                                           "expert receive");
            }
        }
        bind_outer_all(z, NULL, z->outer_g);
    }
    if (!whole.optimizer) /* a sharded optimizer steps on the reduced gradient's shard */
        z->gshard = alloc_floats(z, own_n(z) ? own_n(z) : 1, "gradient shard");
    if (!whole.optimizer && z->ep)
        z->xgshard = alloc_floats(z, xown_n(z) ? xown_n(z) : 1, "expert gradient shard");
    if (whole.grads) { /* ZeRO 0 all-reduces, ZeRO 1 reduce-scatters into the shard */
        z->dpg = dp_grads_create(z->t, z->layers, z->nl, cfg->topology.bucket_mb, dp, z->grads,
                                 z->gshard, z->own_lo, z->S, embed);
        if (z->ep) {
            z->xred = trd_malloc(((size_t)z->nl + 1) * sizeof *z->xred, "expert reductions");
            for (int i = 0; i < z->nl; i++)
                z->xred[i] = comm_handle_none();
        }
    } else {
        TRD_ASSERT(!embed); /* layout_check: no tied embedding over stages with ZeRO 2-3 */
    }
    if (!whole.params) {
        if (cfg->topology.offload != OFFLOAD_PARAMS) {
            /* The dense block, then (divided experts) the expert block:
             * the checkpoint's two runs (ckpt.h), as the optimizer's. */
            const size_t n = own_n(z) + xown_n(z);
            z->pshard = alloc_floats(z, n ? n : 1, "parameter shard");
            z->xpshard = z->pshard + own_n(z);
            init_params(z, z->pshard, z->own_lo, z->own_hi);
            init_params(z, z->xpshard, z->xown_lo, z->xown_hi);
        }
        z->outer_p = alloc_buffer(z, outer_n, "outer parameter slot");
        for (int k = 0; k < 2; k++) {
            z->pslot[k] = alloc_buffer(z, z->max_layer, "layer parameter slot");
            if (z->max_xlayer)
                z->xpslot[k] = alloc_buffer(z, z->max_xlayer, "expert parameter slot");
        }
        bind_outer_all(z, z->outer_p, NULL);
    }

    /* topology.offload: the same ranges, the state in host memory. */
    void (*opt_init)(Optimizer *, const ParamTable *, const Backend *, float *, size_t, size_t,
                     Precision) =
        cfg->topology.offload == OFFLOAD_NONE ? optimizer_init : optimizer_init_offload;
    if (cfg->topology.offload == OFFLOAD_PARAMS) { /* stage 3 (config_validate) */
        TRD_ASSERT(z->stage == 3);
        init_params_host(z);
    } else if (z->stage == 0) {
        opt_init(&z->opt, z->t, be, z->params, 0, z->P, prec);
    } else if (z->stage <= 2) {
        if (z->ep) /* the dense block and the expert block (config_ep_divides: no offload) */
            optimizer_init_pair(&z->opt, &z->xopt, z->t, be, z->params + z->own_lo, z->own_lo,
                                z->own_hi, z->params + z->xown_lo, z->xown_lo, z->xown_hi, prec);
        else
            opt_init(&z->opt, z->t, be, z->params + z->own_lo, z->own_lo, z->own_hi, prec);
        /* bf16 rounded only our part: make every rank's copy whole again. */
        gather_owned(z, NULL);
    } else if (z->ep) { /* stage 3: the dense block and the expert block */
        optimizer_init_pair(&z->opt, &z->xopt, z->t, be, z->pshard, z->own_lo, z->own_hi,
                            z->xpshard, z->xown_lo, z->xown_hi, prec);
    } else {
        opt_init(&z->opt, z->t, be, z->pshard, z->own_lo, z->own_hi, prec);
    }
    /* Every stage finishes the gradients part by part during backward
     * (stages 0-1 a bucket, 2-3 a layer's part of the shard): with offload
     * each part can go down then.  Where the staging buffer is the bf16
     * weights' home (optimizer+params, bf16) a layer's part is final only
     * after the step's last gather of that layer (backward's, on the last
     * micro-batch), whose copy up from it runs first (stream_part); a
     * skip writes the weights back from the master (zero_drop_grads). */
    z->stream_grads = cfg->topology.offload != OFFLOAD_NONE;
    if (z->stream_grads && z->dpg)
        dp_grads_stream(z->dpg, be, z->opt.stage);
    if (z->stage == 0 && cfg->topology.offload != OFFLOAD_NONE)
        upload_per_group(z);
    return z;
}

void zero_free(Zero *z)
{
    if (!z)
        return;
    optimizer_free(&z->xopt);
    optimizer_free(&z->opt);
    params_free(&z->table);
    free(z->layers);
    free(z->local);
    free(z->up_part);
    free(z->xred);
    dp_grads_free(z->dpg);
    const Backend *be = z->be;
    be->release(z->params);
    be->release(z->grads);
    if (!z->pshard_host) /* else the optimizer's, freed above */
        be->release(z->pshard);
    be->event_destroy(z->gather_up);
    be->release(z->gshard);
    be->release(z->xgshard);
    be->release(z->outer_p);
    be->release(z->outer_g);
    be->release(z->outer_recv);
    for (int k = 0; k < 2; k++) {
        be->release(z->pslot[k]);
        be->release(z->gslot[k]);
        be->release(z->recv[k]);
        be->release(z->xpslot[k]);
        be->release(z->xgslot[k]);
        be->release(z->xrecv[k]);
    }
    free(z);
}

Model *zero_model(Zero *z) { return z->model[0]; }
int zero_chunks(const Zero *z) { return z->sh.n_chunks; }
Model *zero_chunk_model(Zero *z, int c)
{
    TRD_ASSERT(c >= 0 && c < z->sh.n_chunks);
    return z->model[c];
}
const ParamTable *zero_params(const Zero *z) { return z->t; }
const Backend *zero_backend(const Zero *z) { return z->be; }

/* ---- the step -------------------------------------------------------------- */

void zero_drop_grads(Zero *z)
{
    if (z->streamed)
        optimizer_grads_dropped(&z->opt);
    z->streamed = 0;
}

void zero_begin_step(Zero *z)
{
    zero_drop_grads(z); /* a skipped step's copies: done before the shard is cleared */
    if (z->grads)
        zero_floats(z, z->grads, z->P);
    if (z->gshard)
        zero_floats(z, z->gshard, own_n(z));
    if (z->xgshard)
        zero_floats(z, z->xgshard, xown_n(z));
    if (z->dpg)
        dp_grads_begin_step(z->dpg);
    gather_outer(z);
}

/* Stages 0-1 with the experts divided: layer l's experts' final gradients
 * (flat [lo, hi) of the expert region) over the ranks holding the same
 * experts, started now: all-reduced in place (ZeRO 0), or reduce-scattered
 * into our part of the expert shard (ZeRO 1).  The same per-element sums
 * over the same edp ranks as one reduction of the whole region.  Under
 * NCCL it runs on edp's stream after the compute stream's backward. */
static void start_expert_reduction(Zero *z, int l)
{
    size_t lo, hi;
    group_range(z, PARAMS_EXPERTS(l), &lo, &hi);
    if (hi <= lo) /* no MoE layer */
        return;
    CommHandle *h = &z->xred[z->local[l]];
    if (z->stage == 0) {
        *h = comm_iallreduce_f32(z->edp, z->grads + lo, hi - lo);
        return;
    }
    size_t a, b;
    comm_shard_part(lo - z->Pd, hi - z->Pd, z->XS, z->edp->rank, &a, &b);
    float *mine = b > a ? z->xgshard + (z->Pd + a - z->xown_lo) : z->xgshard;
    *h = comm_ireduce_scatter_range_f32(z->edp, z->grads + lo, mine, lo - z->Pd, hi - z->Pd, z->XS);
}

/* Backward of layer l is done: start what can start. */
static void layer_grads_ready(Zero *z, int l, int last_micro)
{
    if (z->stage >= 2) {
        int k = slot_of(z, l);
        size_t lo, hi;
        group_range(z, l, &lo, &hi);
        z->gred[k] = comm_ireduce_scatter_range_f32(z->dp, z->gslot[k], z->recv[k], lo, hi, z->S);
        group_range(z, PARAMS_EXPERTS(l), &lo, &hi); /* divided: over edp, not dp */
        if (hi > lo)
            z->xgred[k] = comm_ireduce_scatter_range_f32(z->edp, z->xgslot[k], z->xrecv[k],
                                                         lo - z->Pd, hi - z->Pd, z->XS);
        z->gred_layer[k] = l;
        z->gred_last[k] = last_micro;
        return;
    }
    if (!last_micro) /* accumulate locally; reduce once on the last micro-batch */
        return;
    dp_grads_ready(z->dpg, backward_pos(z, l));
    if (z->xred)
        start_expert_reduction(z, l);
}

/* ---- the parts of a micro-batch ----------------------------------------------
 * zero_chunk_forward and zero_chunk_backward run them around the model's
 * parts, for the plain path and for a pipeline stage alike. */

static void zero_before_block_forward(Zero *z, int l)
{
    gather_outer(z);
    if (z->up_part)
        optimizer_wait_part(&z->opt, z->up_part[z->local[l]]);
    use_layer_params(z, l, l + 1);
}

static void zero_before_block_backward(Zero *z, int l)
{
    use_layer_params(z, l, l - 1);
    if (z->stage < 2)
        return;
    int k = slot_of(z, l);
    finish_layer_reduction(z, k);
    size_t lo, hi;
    group_range(z, l, &lo, &hi);
    zero_floats(z, z->gslot[k], hi - lo);
    model_bind(model_of(z, l), l, NULL, z->gslot[k]);
    group_range(z, PARAMS_EXPERTS(l), &lo, &hi); /* empty unless divided */
    if (hi > lo) {
        zero_floats(z, z->xgslot[k], hi - lo);
        model_bind_experts(model_of(z, l), l, NULL, z->xgslot[k]);
    }
}

static void zero_after_block_backward(Zero *z, int l, int last_micro)
{
    layer_grads_ready(z, l, last_micro);
}

static void zero_before_outer_backward(Zero *z)
{
    if (z->stage < 2)
        return;
    /* The outer slot collects head and embedding gradients of this
     * micro-batch: the previous one's reduction must be done first. */
    finish_outer_reduction(z);
    zero_floats(z, z->outer_g, z->outer_hi - z->outer_lo);
}

static void zero_after_outer_backward(Zero *z, int last_micro)
{
    if (z->stage >= 2) {
        z->outer_red = comm_ireduce_scatter_range_f32(z->dp, z->outer_g, z->outer_recv, z->outer_lo,
                                                      z->outer_hi, z->S);
        z->outer_pending = 1;
        z->outer_last = last_micro;
    } else if (last_micro) {
        dp_grads_ready(z->dpg, z->nl);
    }
}

float zero_chunk_forward(Zero *z, Model *m, LayerRange layers, const int32_t *tokens,
                         const int32_t *targets)
{
    gather_outer(z);
    if (z->up_part && (tokens || targets)) /* the embeddings, the head */
        optimizer_wait_part(&z->opt, z->up_outer);
    if (tokens)
        model_embed_forward(m, tokens);
    for (int l = layers.begin; l < layers.end; l++) {
        zero_before_block_forward(z, l);
        model_block_forward(m, l);
    }
    return targets ? model_head_forward(m, targets) : 0.0f;
}

void zero_chunk_backward(Zero *z, Model *m, LayerRange layers, int head, int embed,
                         float loss_scale, int last_micro)
{
    /* The outer tensors' hooks go around the chunk that holds them. */
    if (head || embed)
        zero_before_outer_backward(z);
    model_set_loss_scale(m, loss_scale); /* MoE layers' router losses */
    if (head)
        model_head_backward(m, loss_scale);
    for (int l = layers.end - 1; l >= layers.begin; l--) {
        zero_before_block_backward(z, l);
        model_block_backward(m, l);
        zero_after_block_backward(z, l, last_micro);
    }
    if (embed)
        model_embed_backward(m);
    if (head || embed)
        zero_after_outer_backward(z, last_micro);
}

float zero_forward(Zero *z, const int32_t *tokens, const int32_t *targets)
{
    TRD_ASSERT(z->sh.n_chunks == 1); /* an interleaved stage runs its chunks itself */
    return zero_chunk_forward(z, z->model[0], z->sh.chunk[0], z->has_embed ? tokens : NULL,
                              z->has_head ? targets : NULL);
}

float zero_forward_backward(Zero *z, const int32_t *tokens, const int32_t *targets,
                            float loss_scale, int last_micro)
{
    const double t0 = comm_wtime();
    if (z->has_head) /* the backward follows at once: the head may fuse them */
        model_head_fuse(z->model[0], loss_scale);
    const float loss = zero_forward(z, tokens, targets);
    const double t1 = comm_wtime();
    zero_chunk_backward(z, z->model[0], z->sh.chunk[0], z->has_head, z->has_embed, loss_scale,
                        last_micro);
    trace_span("fwd", TRACE_COMPUTE, t0, t1, -1, -1, 0);
    trace_span("bwd", TRACE_COMPUTE, t1, comm_wtime(), -1, -1, 0);
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
    z->stats.exposed_comm_s += dp_grads_finish(z->dpg);
    for (int i = 0; z->xred && i < z->nl; i++) /* started per layer in backward */
        wait_timed(z, &z->xred[i]);
    z->streamed = z->stream_grads; /* every bucket's copy is under way */
}

double zero_grad_sumsq(Zero *z)
{
    /* Each element counted once: tensor-parallel replicas only on their
     * owner (params_grad_sumsq); ZeRO shards summed over DP here. */
    if (z->stage == 0 && z->ep) { /* each expert once: summed over the ep ranks holding them */
        double x = params_grad_sumsq(z->t, z->be, z->grads + z->Pd, z->Pd, z->P);
        comm_allreduce_f64(z->ep, &x, 1);
        return params_grad_sumsq(z->t, z->be, z->grads, 0, z->Pd) + x;
    }
    if (z->stage == 0)
        return params_grad_sumsq(z->t, z->be, z->grads, 0, z->P);
    double s = params_grad_sumsq(z->t, z->be, z->gshard, z->own_lo, z->own_hi);
    /* Divided experts: each (ep rank, edp rank) pair, that is each dp
     * rank, owns a distinct block of them. */
    if (z->xgshard)
        s += params_grad_sumsq(z->t, z->be, z->xgshard, z->xown_lo, z->xown_hi);
    comm_allreduce_f64(z->dp, &s, 1);
    return s;
}

void zero_grad_check(Zero *z, BackendStepState *state, float clip)
{
    TRD_ASSERT(z->dp->size == 1); /* the whole gradient is this rank's */
    if (z->stage == 0)
        params_grad_check(z->t, z->be, z->grads, 0, z->P, state, clip);
    else
        params_grad_check(z->t, z->be, z->gshard, z->own_lo, z->own_hi, state, clip);
    optimizer_use_state(&z->opt, state);
}

void zero_optimizer_skipped(Zero *z)
{
    optimizer_skipped(&z->opt);
    if (z->xgshard)
        optimizer_skipped(&z->xopt);
}

void zero_scale_grads(Zero *z, float s)
{
    optimizer_scale_grads(&z->opt, s);
    if (z->xgshard)
        optimizer_scale_grads(&z->xopt, s);
}

void zero_optimizer_step(Zero *z, float lr, const TrainingConfig *tc)
{
    if (z->streamed) /* optimizer_step waits for the gradients' copies */
        optimizer_grads_streamed(&z->opt);
    z->streamed = 0;
    if (z->stage == 0) {
        optimizer_step(&z->opt, z->params, z->grads, lr, tc);
    } else if (z->stage <= 2) {
        /* One step count: the checkpoint's (zero_state's adam_t) is opt's. */
        z->xopt.t = z->opt.t;
        optimizer_step(&z->opt, z->params + z->own_lo, z->gshard, lr, tc);
        optimizer_wait_params(&z->opt); /* offload: the all-gather reads them */
        if (z->xgshard)
            optimizer_step(&z->xopt, z->params + z->xown_lo, z->xgshard, lr, tc);
        gather_owned(z, &z->stats.exposed_comm_s);
    } else {
        z->xopt.t = z->opt.t;
        optimizer_step(&z->opt, z->pshard, z->gshard, lr, tc);
        if (z->xgshard)
            optimizer_step(&z->xopt, z->xpshard, z->xgshard, lr, tc);
        /* Gathered copies are stale now. */
        for (int k = 0; k < 2; k++) {
            comm_wait(&z->pgather[k]);
            comm_wait(&z->xpgather[k]);
            z->pslot_layer[k] = -1;
        }
        z->outer_valid = 0;
    }
}

ZeroState zero_state(Zero *z)
{
    optimizer_wait_params(&z->opt); /* the caller reads the weights */
    /* Offloaded fp32 keeps a master copy on the host that equals params:
     * not a checkpoint kind (fp32 checkpoints hold params). */
    return (ZeroState){.params = z->params ? z->params : z->pshard,
                       .master = z->opt.bf16 ? z->opt.master : NULL,
                       .m = z->opt.m,
                       .v = z->opt.v,
                       .adam_t = &z->opt.t,
                       .optimizer_on_host = z->opt.offload,
                       .params_on_host = z->pshard_host};
}

void zero_params_loaded(Zero *z)
{
    const float *owned = z->stage == 0   ? z->params
                         : z->stage <= 2 ? z->params + z->own_lo
                                         : z->pshard;
    optimizer_params_loaded(&z->opt, owned);
    if (z->xgshard)
        optimizer_params_loaded(&z->xopt, z->stage <= 2 ? z->params + z->xown_lo : z->xpshard);
}

ZeroMemory zero_memory(const Zero *z)
{
    ZeroMemory r = {0};
    /* the dense and expert blocks; with pshard_host, in the host's */
    const size_t shard = z->pshard && !z->pshard_host ? own_n(z) + xown_n(z) : 0;
    r.params = (z->params ? z->P : 0) * sizeof(float) + shard * sizeof(float);
    r.grads = (z->grads ? z->P : 0) * sizeof(float) + (z->gshard ? own_n(z) : 0) * sizeof(float) +
              (z->xgshard ? xown_n(z) : 0) * sizeof(float);
    r.optimizer = optimizer_bytes(&z->opt) + (z->xgshard ? optimizer_bytes(&z->xopt) : 0);
    r.host_optimizer = optimizer_host_bytes(&z->opt);
    r.buffers = z->buffer_bytes;
    return r;
}

ZeroStats zero_take_stats(Zero *z)
{
    ZeroStats s = z->stats;
    s.bytes = z->dp->bytes_sent + (z->edp ? z->edp->bytes_sent : 0);
    z->dp->bytes_sent = 0;
    if (z->edp)
        z->edp->bytes_sent = 0;
    memset(&z->stats, 0, sizeof z->stats);
    return s;
}

void zero_gather_params(Zero *z, float *out)
{
    optimizer_wait_params(&z->opt);
    if (z->params) {
        z->be->to_host(out, z->params, z->P * sizeof(float));
        return;
    }
    float *whole = alloc_floats(z, z->P, "gathered parameters");
    CommHandle h = gather_range(z, whole, 0, z->Pd);
    comm_wait(&h);
    if (z->ep) { /* this rank's experts, over the ranks holding them */
        h = gather_experts(z, whole + z->Pd, z->Pd, z->P);
        comm_wait(&h);
    }
    z->be->to_host(out, whole, z->P * sizeof(float));
    z->be->release(whole);
}

/* ---- for the planner ------------------------------------------------------ */

/* The held layers' ranges and sizes, ascending (the flat buffer's order);
 * with divided experts (t.ep > 1) the dense region's blocks over dp, the
 * expert region's (XS) over edp, of edp ranks, as zero_create makes them. */
typedef struct {
    ParamTable t;
    int nl, *layers;
    size_t P, S, outer_n, max_layer;
    size_t XS, max_xlayer;
    int edp;
} PlanShard;

static void plan_shard_open(PlanShard *ps, const Config *cfg, const ParamShard *sh, int dp)
{
    memset(ps, 0, sizeof *ps);
    params_build(&ps->t, &cfg->model, sh);
    ps->nl = params_shard_layers(sh);
    ps->layers = trd_calloc((size_t)ps->nl + 1, sizeof(int), "planned layers");
    int i = 0;
    for (int c = 0; c < sh->n_chunks; c++)
        for (int l = sh->chunk[c].begin; l < sh->chunk[c].end; l++)
            ps->layers[i++] = l;
    ps->P = ps->t.numel;
    ps->S = (ps->t.dense_numel + (size_t)dp - 1) / (size_t)dp;
    ps->edp = dp / ps->t.ep;
    ps->XS = (ps->P - ps->t.dense_numel + (size_t)ps->edp - 1) / (size_t)ps->edp;
    size_t lo, hi;
    params_group_range(&ps->t, PARAMS_OUTER, &lo, &hi);
    ps->outer_n = hi - lo;
    for (i = 0; i < ps->nl; i++) {
        params_group_range(&ps->t, ps->layers[i], &lo, &hi);
        if (hi - lo > ps->max_layer)
            ps->max_layer = hi - lo;
        params_group_range(&ps->t, PARAMS_EXPERTS(ps->layers[i]), &lo, &hi);
        if (hi - lo > ps->max_xlayer)
            ps->max_xlayer = hi - lo;
    }
}

static void plan_shard_close(PlanShard *ps)
{
    params_free(&ps->t);
    free(ps->layers);
}

static size_t layer_n(const PlanShard *ps, int l)
{
    size_t lo, hi;
    params_group_range(&ps->t, l, &lo, &hi);
    return hi - lo;
}

/* Divided experts: the stacked experts of layer l (0 otherwise). */
static size_t layer_xn(const PlanShard *ps, int l) { return layer_n(ps, PARAMS_EXPERTS(l)); }

ZeroMemory zero_plan_memory(const Config *cfg, const ParamShard *sh, int dp, int dp_rank)
{
    PlanShard ps;
    plan_shard_open(&ps, cfg, sh, dp);
    const int stage = cfg->topology.zero;
    const ZeroWhole whole = STAGES[stage];
    size_t own_lo, own_hi, xlo, xhi;
    zero_block(ps.t.dense_numel, dp, dp_rank, &own_lo, &own_hi);
    /* divided experts: the expert region's block over edp as well (else empty) */
    zero_block(ps.P - ps.t.dense_numel, dp / ps.t.ep, dp_rank / ps.t.ep, &xlo, &xhi);
    const size_t own = own_hi - own_lo + xhi - xlo, F = sizeof(float);
    const size_t outer_recv = ps.outer_n < ps.S ? ps.outer_n : ps.S;
    const size_t layer_recv = ps.max_layer < ps.S ? ps.max_layer : ps.S;
    const size_t xlayer_recv = ps.max_xlayer < ps.XS ? ps.max_xlayer : ps.XS;
    ZeroMemory r = {0};
    /* optimizer+params: the shard lives in the optimizer's host buffers */
    r.params = (whole.params ? ps.P : cfg->topology.offload == OFFLOAD_PARAMS ? 0 : own) * F;
    r.grads = ((whole.grads ? ps.P : 0) + (whole.optimizer ? 0 : own)) * F;
    const size_t opt_n = whole.optimizer ? ps.P : own;
    if (cfg->topology.offload != OFFLOAD_NONE) /* master, m, v and staging: optimizer.c */
        r.host_optimizer = (opt_n ? opt_n : 1) * F * 4;
    else /* m, v [, master] */
        r.optimizer = opt_n * F * (cfg->training.precision == PREC_BF16 ? 3 : 2);
    if (stage >= 2) /* gradient slots and receive space (zero_create), the experts' too */
        r.buffers = (ps.outer_n + outer_recv + 2 * (ps.max_layer + layer_recv) +
                     2 * (ps.max_xlayer + xlayer_recv)) *
                    F;
    if (stage == 3) /* parameter slots */
        r.buffers += (ps.outer_n + 2 * (ps.max_layer + ps.max_xlayer)) * F;
    plan_shard_close(&ps);
    return r;
}

/* What one gather of [lo, hi) costs: the ring bytes over DP, or with
 * `host` the elements DP rank 0 copies up from host memory first
 * (optimizer+params: its part of the range). */
static uint64_t plan_gather_cost(const PlanShard *ps, size_t lo, size_t hi, int dp, int host)
{
    if (!host)
        return comm_ring_bytes(hi - lo, 1, dp);
    size_t a, b;
    comm_shard_part(lo, hi, ps->S, 0, &a, &b);
    return b - a;
}

/* Stage 3: the layer gathers of one micro-batch, following the two slots
 * (use_layer_params: a layer still in its slot is not gathered again). */
static uint64_t plan_gather_bytes(const PlanShard *ps, int slot_layer[2], int dp, int host)
{
    uint64_t bytes = 0;
    for (int dir = 0; dir < 2; dir++) /* forward, then backward */
        for (int k = 0; k < ps->nl; k++) {
            const int i = dir == 0 ? k : ps->nl - 1 - k;
            const int next = dir == 0 ? i + 1 : i - 1;
            for (int j = 0; j < 2; j++) { /* the layer, then the prefetch */
                const int g = j == 0 ? i : next;
                if (g < 0 || g >= ps->nl || slot_layer[g & 1] == ps->layers[g])
                    continue;
                size_t lo, hi;
                params_group_range(&ps->t, ps->layers[g], &lo, &hi);
                bytes += plan_gather_cost(ps, lo, hi, dp, host);
                if (!host) /* divided experts, over edp (never with offload) */
                    bytes += comm_ring_bytes(layer_xn(ps, ps->layers[g]), 1, ps->edp);
                slot_layer[g & 1] = ps->layers[g];
            }
        }
    return bytes;
}

uint64_t zero_plan_step_bytes(const Config *cfg, const ParamShard *sh, int dp, int n_micro)
{
    if (dp <= 1)
        return 0;
    PlanShard ps;
    plan_shard_open(&ps, cfg, sh, dp);
    const int stage = cfg->topology.zero;
    uint64_t bytes = 0;
    if (stage <= 1) {
        bytes +=
            dp_grads_plan_bytes(&ps.t, ps.layers, ps.nl, cfg->topology.bucket_mb, dp, stage == 1);
        /* divided experts: each layer's over edp, all-reduced or reduce-scattered */
        for (int i = 0; ps.t.ep > 1 && i < ps.nl; i++)
            bytes += comm_ring_bytes(layer_xn(&ps, ps.layers[i]), stage == 1 ? 1 : 2, ps.edp);
    } else { /* every micro-batch: each layer's and the outer gradient reduce-scattered */
        uint64_t per_micro = comm_ring_bytes(ps.outer_n, 1, dp);
        for (int i = 0; i < ps.nl; i++) /* divided experts: over edp */
            per_micro += comm_ring_bytes(layer_n(&ps, ps.layers[i]), 1, dp) +
                         comm_ring_bytes(layer_xn(&ps, ps.layers[i]), 1, ps.edp);
        bytes += (uint64_t)n_micro * per_micro;
    }
    if (stage == 1 || stage == 2) /* parameters made whole after the step (gather_owned) */
        bytes += comm_ring_bytes(ps.t.dense_numel, 1, dp) +
                 comm_ring_bytes(ps.P - ps.t.dense_numel, 1, dp / ps.t.ep);
    if (stage == 3) {
        int slot_layer[2] = {-1, -1};                /* the optimizer step invalidates both */
        bytes += comm_ring_bytes(ps.outer_n, 1, dp); /* outer tensors, once a step */
        for (int j = 0; j < n_micro; j++)
            bytes += plan_gather_bytes(&ps, slot_layer, dp, 0);
    }
    if (stage >= 1) /* zero_grad_sumsq: one double */
        bytes += comm_ring_bytes(sizeof(double) / sizeof(float), 2, dp);
    plan_shard_close(&ps);
    return bytes;
}

uint64_t zero_plan_host_gather_elems(const Config *cfg, const ParamShard *sh, int dp, int n_micro)
{
    if (cfg->topology.offload != OFFLOAD_PARAMS)
        return 0;
    PlanShard ps;
    plan_shard_open(&ps, cfg, sh, dp);
    size_t lo, hi;
    params_group_range(&ps.t, PARAMS_OUTER, &lo, &hi);
    uint64_t n = plan_gather_cost(&ps, lo, hi, dp, 1); /* the outer tensors, once a step */
    int slot_layer[2] = {-1, -1};
    for (int j = 0; j < n_micro; j++)
        n += plan_gather_bytes(&ps, slot_layer, dp, 1);
    plan_shard_close(&ps);
    return n;
}
