#include "pipeline_par/pp_stage.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "comm/trace.h"
#include "model/model.h"
#include "pipeline_par/pp_schedule.h"

#define ACT_TAG 0x7101 /* validation forwards; the executor uses its own tags */

struct PpStage {
    const Config *cfg;
    Zero *z;
    Comm *pp;
    PpSchedule sched;
    PpChunkOps ops;
    PpExecStats stats;
    int n_micro, BT;
    int v;                     /* model chunks on this rank (virtual stages) */
    Model *m[CFG_MAX_VIRTUAL]; /* chunk c: model stage c * pp + rank */
    LayerRange layers[CFG_MAX_VIRTUAL];
    int slots[CFG_MAX_VIRTUAL];            /* activation sets of chunk c */
    float *gsend[CFG_MAX_VIRTUAL];         /* chunk c: slots[c] outgoing gradients [act_elems] */
    const int32_t *tokens, *targets, *pos; /* pos: NULL without data.document_mask */
    const uint64_t *drop_rows;             /* NULL without model.lora.dropout */
    const float *loss_scale;               /* [n_micro]: micro-batch mb's gradient scale */
    double loss_sum;                       /* the losses weighted by loss_scale (last stage) */
};

/* Model stage c * pp + rank is the first / the last of the whole model. */
static int first_stage(const PpStage *p, int c)
{
    return pp_stage(p->pp->size, p->pp->rank, c) == 0;
}

static int last_stage(const PpStage *p, int c)
{
    return pp_stage(p->pp->size, p->pp->rank, c) == p->pp->size * p->v - 1;
}

/* Chunk c's model, with micro-batch mb's activation set selected. */
static Model *use_set(PpStage *p, int mb, int c)
{
    model_use_activation_set(p->m[c], mb % p->slots[c]);
    return p->m[c];
}

/* A received gradient goes straight into the chunk model's gradient
 * stream, where its last block's backward reads it. */
static float *grad_in(void *ctx, int mb, int chunk)
{
    (void)mb;
    return model_grad_stream(((PpStage *)ctx)->m[chunk]);
}

/* A sent gradient leaves from a buffer of its own per micro-batch slot,
 * not from the gradient stream: its receiver may take it only after several
 * more backwards here (with interleaving, the previous stage runs other
 * chunks first), and the executor would make each of those backwards wait
 * for the send to complete before reusing one shared buffer. */
static float *grad_out_of(void *ctx, int mb, int chunk)
{
    PpStage *p = ctx;
    return p->gsend[chunk] + (size_t)(mb % p->slots[chunk]) * p->ops.act_elems;
}

static void stage_forward(void *ctx, int mb, int chunk)
{
    PpStage *p = ctx;
    const size_t at = (size_t)mb * (size_t)p->BT;
    Model *m = use_set(p, mb, chunk);
    model_set_positions(m, p->pos ? p->pos + at : NULL); /* kept in the set for backward */
    model_set_dropout_rows(m, p->drop_rows ? p->drop_rows + at : NULL);
    p->loss_sum +=
        p->loss_scale[mb] * zero_chunk_forward(p->z, m, p->layers[chunk],
                                               first_stage(p, chunk) ? p->tokens + at : NULL,
                                               last_stage(p, chunk) ? p->targets + at : NULL);
}

static void stage_backward(void *ctx, int mb, int chunk)
{
    PpStage *p = ctx;
    const int first = first_stage(p, chunk);
    Model *m = use_set(p, mb, chunk);
    /* Not the last stage: the received gradient already sits in the
     * model's gradient stream, where the last block's backward reads it. */
    zero_chunk_backward(p->z, m, p->layers[chunk], last_stage(p, chunk), first, p->loss_scale[mb],
                        mb == p->n_micro - 1);
    if (!first) /* the input gradient leaves from the micro-batch's own slot */
        zero_backend(p->z)->copy(grad_out_of(p, mb, chunk), model_grad_stream(m),
                                 p->ops.act_elems * sizeof(float));
}

static float *act_in(void *ctx, int mb, int chunk)
{
    return model_stage_input(use_set(ctx, mb, chunk));
}

static float *act_out(void *ctx, int mb, int chunk)
{
    return model_stage_output(use_set(ctx, mb, chunk));
}

static void stage_reduce(void *ctx)
{
    PpStage *p = ctx;
    zero_finish_grads(p->z); /* the DP reduction, a tied embedding summed first */
}

PpStage *pp_stage_create(const Config *cfg, Zero *z, Comm *pp, int n_micro, char err[CFG_ERR])
{
    const int v = cfg->topology.virtual_stages;
    if (zero_chunks(z) != v) {
        trd_errorf(err, "the ZeRO engine holds %d model chunks, the schedule wants %d",
                   zero_chunks(z), v);
        return NULL;
    }
    PpStage *p = trd_calloc(1, sizeof *p, "pipeline stage");
    p->cfg = cfg;
    p->z = z;
    p->pp = pp;
    p->n_micro = n_micro;
    p->v = v;
    p->BT = cfg->training.micro_batch * cfg->model.seq_len /
            (cfg->topology.cp > 1 ? cfg->topology.cp : 1); /* rows */
    if (pp_schedule_build(&p->sched, cfg->topology.schedule, pp->size, pp->rank, n_micro, v, err) !=
        0) {
        free(p);
        return NULL;
    }
    for (int c = 0; c < v; c++) {
        p->m[c] = zero_chunk_model(z, c);
        pp_stage_layers(&cfg->model, &cfg->topology, pp_stage(pp->size, pp->rank, c),
                        &p->layers[c].begin, &p->layers[c].end);
        /* A chunk keeps one activation set per micro-batch it holds between
         * forward and backward: pp - rank for 1F1B, m for GPipe, more for
         * the first chunks than the last ones when interleaved. */
        p->slots[c] = pp_schedule_chunk_slots(&p->sched, c);
        TRD_ASSERT(p->slots[c] >= 1);
        model_set_activation_sets(p->m[c], p->slots[c]);
    }
    p->ops =
        (PpChunkOps){.ctx = p,
                     .act_elems = (size_t)model_stream_rows(p->m[0]) * (size_t)cfg->model.hidden,
                     .forward = stage_forward,
                     .backward = stage_backward,
                     .act_in = act_in,
                     .act_out = act_out,
                     .grad_in = grad_in,
                     .grad_out = grad_out_of,
                     .reduce = stage_reduce};
    for (int c = 0; c < v; c++)
        if (!first_stage(p, c))
            p->gsend[c] = zero_backend(z)->alloc(
                (size_t)p->slots[c] * p->ops.act_elems * sizeof(float), "pipeline gradient sends");
    if (cfg->training.trace) { /* the executor's timeline of each step */
        p->stats.span_cap = p->sched.n;
        p->stats.spans = trd_calloc((size_t)p->sched.n, sizeof(PpSpan), "pipeline spans");
    }
    return p;
}

void pp_stage_free(PpStage *p)
{
    if (!p)
        return;
    pp_schedule_free(&p->sched);
    for (int c = 0; c < p->v; c++)
        zero_backend(p->z)->release(p->gsend[c]);
    free(p->stats.spans);
    free(p);
}

/* The executor's spans of the last step into the trace: compute on one
 * lane, the pipeline's sends and receives on another. */
static void trace_step(const PpStage *p)
{
    const PpExecStats *x = &p->stats;
    const uint64_t bytes = (uint64_t)p->ops.act_elems * sizeof(float);
    for (int i = 0; i < x->n_spans; i++) {
        const PpSpan *s = &x->spans[i];
        if (s->op == PP_STEP)
            continue; /* the trainer steps after the list, and says so itself */
        const int p2p = s->op == PP_SEND_ACT || s->op == PP_SEND_GRAD || s->op == PP_RECV_ACT ||
                        s->op == PP_RECV_GRAD;
        trace_span(pp_op_name(s->op), p2p ? TRACE_P2P : TRACE_COMPUTE, x->t0 + s->start,
                   x->t0 + s->end, s->mb, p->v > 1 ? s->chunk : -1, p2p ? bytes : 0);
    }
}

double pp_stage_step(PpStage *p, const int32_t *tokens, const int32_t *targets, const int32_t *pos,
                     const uint64_t *drop_rows, const float *loss_scale)
{
    p->drop_rows = drop_rows;
    p->tokens = tokens;
    p->targets = targets;
    p->pos = pos;
    p->loss_scale = loss_scale;
    p->loss_sum = 0;
    char err[CFG_ERR];
    if (pp_execute(&p->sched, &p->ops, p->pp, &p->stats, err) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "pipeline: %s", err);
    trace_step(p);
    return p->loss_sum;
}

double pp_stage_forward(PpStage *p, const int32_t *tokens, const int32_t *targets,
                        const int32_t *pos)
{
    /* Through the model stages in order: chunk c of this rank takes its
     * input from the rank before (the last rank, for c > 0 on rank 0). */
    const int pp = p->pp->size, prev = (p->pp->rank - 1 + pp) % pp, next = (p->pp->rank + 1) % pp;
    const size_t n = p->ops.act_elems;
    for (int c = 0; c < p->v; c++) {
        Model *m = use_set(p, 0, c);
        const int first = first_stage(p, c), last = last_stage(p, c);
        model_set_positions(m, pos);
        if (!first)
            comm_recv_f32(p->pp, model_stage_input(m), n, prev, ACT_TAG);
        const float loss =
            zero_chunk_forward(p->z, m, p->layers[c], first ? tokens : NULL, last ? targets : NULL);
        if (last)
            return loss;
        CommHandle h = comm_isend_f32(p->pp, model_stage_output(m), n, next, ACT_TAG);
        comm_wait(&h);
    }
    return 0.0;
}

const PpExecStats *pp_stage_stats(const PpStage *p) { return &p->stats; }

size_t pp_stage_memory(const PpStage *p)
{
    size_t bytes = 0;
    for (int c = 0; c < p->v; c++)
        if (p->gsend[c])
            bytes += (size_t)p->slots[c] * p->ops.act_elems * sizeof(float);
    return bytes;
}
