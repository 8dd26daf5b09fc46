#include "zero/optimizer.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* params = bf16(params), in the backend's memory (a round trip through the
 * host: once, at start). */
static void round_to_bf16(const Backend *be, float *params, size_t n)
{
    float *host = be->device ? trd_malloc(n * sizeof(float), "bf16 rounding") : params;
    if (host != params)
        be->to_host(host, params, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        host[i] = bf16_round(host[i]);
    if (host != params) {
        be->to_backend(params, host, n * sizeof(float));
        free(host);
    }
}

void optimizer_init(Optimizer *o, const ParamTable *t, const Backend *be, float *params,
                    size_t begin, size_t end, Precision precision)
{
    memset(o, 0, sizeof *o);
    o->table = t;
    o->be = be;
    o->begin = begin;
    o->end = end;
    o->bf16 = precision == PREC_BF16;
    o->grad_scale = 1.0f;
    size_t n = end - begin;
    o->m = be->alloc(n * sizeof(float), "Adam first moment");
    o->v = be->alloc(n * sizeof(float), "Adam second moment");
    if (o->bf16) {
        o->master = be->alloc(n * sizeof(float), "fp32 master weights");
        be->copy(o->master, params, n * sizeof(float));
        round_to_bf16(be, params, n);
    }
}

void optimizer_free(Optimizer *o)
{
    if (o->be) {
        o->be->release(o->m);
        o->be->release(o->v);
        o->be->release(o->master);
    }
    memset(o, 0, sizeof *o);
}

void optimizer_step(Optimizer *o, float *params, const float *grads, float lr,
                    const TrainingConfig *tc)
{
    o->t++;
    /* One backend call for every tensor (or the part of it in our range):
     * weight decay is a per-tensor property, so a run per tensor, merged
     * with the previous one when both decay alike (the flat buffers hold
     * the tensors back to back). */
    BackendRange *r = trd_malloc((size_t)o->table->n * sizeof *r + 1, "optimizer ranges");
    int n = 0;
    for (int i = 0; i < o->table->n; i++) {
        const ParamSpec *p = &o->table->p[i];
        size_t lo = p->offset > o->begin ? p->offset : o->begin;
        size_t hi = p->offset + p->numel < o->end ? p->offset + p->numel : o->end;
        if (lo >= hi)
            continue;
        const BackendRange run = {.lo = lo - o->begin, .hi = hi - o->begin, .decay = p->decay};
        if (n && r[n - 1].hi == run.lo && r[n - 1].decay == run.decay)
            r[n - 1].hi = run.hi;
        else
            r[n++] = run;
    }
    float *master = o->master ? o->master : params;
    o->be->adamw_ranges(params, master, grads, o->m, o->v, r, n, lr, tc->beta1, tc->beta2, tc->eps,
                        tc->weight_decay, o->grad_scale, o->t, o->bf16, o->state);
    free(r);
    o->grad_scale = 1.0f;
    o->state = NULL;
}

void optimizer_scale_grads(Optimizer *o, float s) { o->grad_scale *= s; }

void optimizer_use_state(Optimizer *o, const BackendStepState *s) { o->state = s; }

void optimizer_skipped(Optimizer *o)
{
    TRD_ASSERT(o->t > 0);
    o->t--;
}

size_t optimizer_bytes(const Optimizer *o)
{
    size_t n = o->end - o->begin;
    return n * sizeof(float) * (o->master ? 3 : 2);
}
