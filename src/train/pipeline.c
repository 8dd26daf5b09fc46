#include "train/pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"
#include "pipeline_par/schedule.h"

#define ACT_TAG 0x7101 /* validation forwards; the executor uses its own tags */

struct PipeStage {
    const Config *cfg;
    Zero *z;
    Model *m;
    Comm *pp;
    PpSchedule sched;
    PpStage ops;
    PpExecStats stats;
    int n_micro, slots, BT;
    int first, last;             /* this rank is the first / last stage */
    int layer_begin, layer_end;
    const int32_t *tokens, *targets;
    float loss_scale;
    double loss_sum;
    void (*reduce)(void *);
    void *reduce_ctx;
};

void pipe_stage_layers(const Config *cfg, int stage, int *begin, int *end)
{
    const TopologyConfig *t = &cfg->topology;
    if (t->n_stage_layers > 0) {
        *begin = 0;
        for (int s = 0; s < stage; s++)
            *begin += t->stage_layers[s];
        *end = *begin + t->stage_layers[stage];
        return;
    }
    const int L = cfg->model.layers, base = L / t->pp, extra = L % t->pp;
    *begin = stage * base + (stage < extra ? stage : extra);
    *end = *begin + base + (stage < extra ? 1 : 0);
}

static void use_set(PipeStage *p, int mb)
{
    model_use_activation_set(p->m, mb % p->slots);
}

static void stage_forward(void *ctx, int mb, int chunk)
{
    (void)chunk;
    PipeStage *p = ctx;
    use_set(p, mb);
    if (p->first)
        model_embed_forward(p->m, p->tokens + (size_t)mb * (size_t)p->BT);
    for (int l = p->layer_begin; l < p->layer_end; l++) {
        zero_before_block_forward(p->z, l);
        model_block_forward(p->m, l);
    }
    if (p->last)
        p->loss_sum += model_head_forward(p->m, p->targets + (size_t)mb * (size_t)p->BT);
}

static void stage_backward(void *ctx, int mb, int chunk)
{
    (void)chunk;
    PipeStage *p = ctx;
    const int last_micro = mb == p->n_micro - 1;
    use_set(p, mb);
    /* On every stage, also one without outer tensors: the hooks also start
     * the last data-parallel bucket. */
    zero_before_outer_backward(p->z);
    /* Not the last stage: the received gradient already sits in the
     * model's gradient stream, where the last block's backward reads it. */
    if (p->last)
        model_head_backward(p->m, p->loss_scale);
    for (int l = p->layer_end - 1; l >= p->layer_begin; l--) {
        zero_before_block_backward(p->z, l);
        model_block_backward(p->m, l);
        zero_after_block_backward(p->z, l, last_micro);
    }
    if (p->first)
        model_embed_backward(p->m);
    zero_after_outer_backward(p->z, last_micro);
}

static float *act_in(void *ctx, int mb, int chunk)
{
    (void)chunk;
    PipeStage *p = ctx;
    use_set(p, mb);
    return model_stage_input(p->m);
}

static float *act_out(void *ctx, int mb, int chunk)
{
    (void)chunk;
    PipeStage *p = ctx;
    use_set(p, mb);
    return model_stage_output(p->m);
}

/* One gradient stream: the executor completes a pending send from it
 * before the next receive or backward writes it. */
static float *grad_io(void *ctx, int mb, int chunk)
{
    (void)mb;
    (void)chunk;
    return model_grad_stream(((PipeStage *)ctx)->m);
}

static void stage_reduce(void *ctx)
{
    PipeStage *p = ctx;
    if (p->reduce)
        p->reduce(p->reduce_ctx);
}

PipeStage *pipe_create(const Config *cfg, Zero *z, Comm *pp, int n_micro, char err[CFG_ERR])
{
    if (cfg->topology.virtual_stages > 1) {
        trd_errorf(err, "topology.virtual_stages %d: training with the interleaved schedule is "
                   "not wired yet (the schedule and executor exist: trident topology "
                   "--schedule); use schedule 1f1b or gpipe with virtual_stages 1",
                   cfg->topology.virtual_stages);
        return NULL;
    }
    PipeStage *p = trd_calloc(1, sizeof *p, "pipeline stage");
    p->cfg = cfg;
    p->z = z;
    p->m = zero_model(z);
    p->pp = pp;
    p->n_micro = n_micro;
    p->first = pp->rank == 0;
    p->last = pp->rank == pp->size - 1;
    pipe_stage_layers(cfg, pp->rank, &p->layer_begin, &p->layer_end);
    p->BT = cfg->training.micro_batch * cfg->model.seq_len;
    if (pp_schedule_build(&p->sched, cfg->topology.schedule, pp->size, pp->rank, n_micro, 1,
                          err) != 0) {
        free(p);
        return NULL;
    }
    p->slots = pp_schedule_slots(&p->sched);
    TRD_ASSERT(p->slots >= 1);
    model_set_activation_sets(p->m, p->slots);
    p->ops = (PpStage){.ctx = p,
                       .act_elems = (size_t)model_stream_rows(p->m) * (size_t)cfg->model.hidden,
                       .forward = stage_forward, .backward = stage_backward,
                       .act_in = act_in, .act_out = act_out, .grad_in = grad_io,
                       .grad_out = grad_io, .reduce = stage_reduce};
    return p;
}

void pipe_free(PipeStage *p)
{
    if (!p)
        return;
    pp_schedule_free(&p->sched);
    free(p->stats.spans);
    free(p);
}

double pipe_step(PipeStage *p, const int32_t *tokens, const int32_t *targets, float loss_scale,
                 void (*reduce)(void *), void *reduce_ctx)
{
    p->tokens = tokens;
    p->targets = targets;
    p->loss_scale = loss_scale;
    p->loss_sum = 0;
    p->reduce = reduce;
    p->reduce_ctx = reduce_ctx;
    char err[CFG_ERR];
    if (pp_execute(&p->sched, &p->ops, p->pp, &p->stats, err) != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "pipeline: %s", err);
    return p->loss_sum;
}

double pipe_forward(PipeStage *p, const int32_t *tokens, const int32_t *targets)
{
    use_set(p, 0);
    const size_t n = p->ops.act_elems;
    if (!p->first)
        comm_recv_f32(p->pp, model_stage_input(p->m), n, p->pp->rank - 1, ACT_TAG);
    if (p->first)
        model_embed_forward(p->m, tokens);
    for (int l = p->layer_begin; l < p->layer_end; l++) {
        zero_before_block_forward(p->z, l);
        model_block_forward(p->m, l);
    }
    if (p->last)
        return model_head_forward(p->m, targets);
    CommHandle h = comm_isend_f32(p->pp, model_stage_output(p->m), n, p->pp->rank + 1, ACT_TAG);
    comm_wait(&h);
    return 0.0;
}

const PpExecStats *pipe_stats(const PipeStage *p) { return &p->stats; }
