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

/* What both kinds of optimizer start with: the range it owns, no state yet. */
static void optimizer_fields(Optimizer *o, const ParamTable *t, const Backend *be, size_t begin,
                             size_t end, Precision precision)
{
    memset(o, 0, sizeof *o);
    o->table = t;
    o->be = be;
    o->begin = begin;
    o->end = end;
    o->bf16 = precision == PREC_BF16;
    o->grad_scale = 1.0f;
}

void optimizer_init(Optimizer *o, const ParamTable *t, const Backend *be, float *params,
                    size_t begin, size_t end, Precision precision)
{
    optimizer_fields(o, t, be, begin, end, precision);
    size_t n = end - begin;
    o->m = be->alloc(n * sizeof(float), "Adam first moment");
    o->v = be->alloc(n * sizeof(float), "Adam second moment");
    if (o->bf16) {
        o->master = be->alloc(n * sizeof(float), "fp32 master weights");
        be->copy(o->master, params, n * sizeof(float));
        round_to_bf16(be, params, n);
    }
}

void optimizer_init_pair(Optimizer *o, Optimizer *x, const ParamTable *t, const Backend *be,
                         float *params, size_t begin, size_t end, float *xparams, size_t xbegin,
                         size_t xend, Precision precision)
{
    optimizer_fields(o, t, be, begin, end, precision);
    optimizer_fields(x, t, be, xbegin, xend, precision);
    x->shared = 1;
    const size_t n = end - begin, xn = xend - xbegin, all = n + xn ? n + xn : 1;
    o->m = be->alloc(all * sizeof(float), "Adam first moment");
    o->v = be->alloc(all * sizeof(float), "Adam second moment");
    x->m = o->m + n;
    x->v = o->v + n;
    if (o->bf16) {
        o->master = be->alloc(all * sizeof(float), "fp32 master weights");
        x->master = o->master + n;
        be->copy(o->master, params, n * sizeof(float));
        be->copy(x->master, xparams, xn * sizeof(float));
        round_to_bf16(be, params, n);
        round_to_bf16(be, xparams, xn);
    }
}

/* Zeroed page-locked host memory for the offloaded state (at least one
 * element: a rank may own an empty range). */
static float *host_state(const Backend *be, size_t n, const char *what)
{
    float *p = be->host_alloc((n ? n : 1) * sizeof(float), what);
    memset(p, 0, (n ? n : 1) * sizeof(float));
    return p;
}

void optimizer_init_offload(Optimizer *o, const ParamTable *t, const Backend *be, float *params,
                            size_t begin, size_t end, Precision precision)
{
    optimizer_fields(o, t, be, begin, end, precision);
    o->offload = 1;
    const size_t n = end - begin;
    o->m = host_state(be, n, "Adam first moment (offloaded to host memory)");
    o->v = host_state(be, n, "Adam second moment (offloaded to host memory)");
    o->master = host_state(be, n, "fp32 master weights (offloaded to host memory)");
    o->stage = host_state(be, n, "offload staging (gradients in, weights out)");
    const size_t whole = n;
    optimizer_upload_parts(o, &whole, 1);
    be->to_host(o->master, params, n * sizeof(float));
    if (o->bf16) { /* the first forward already sees bf16 weights */
        for (size_t i = 0; i < n; i++)
            o->stage[i] = bf16_round(o->master[i]);
        be->to_backend(params, o->stage, n * sizeof(float));
    }
}

float *optimizer_init_offload_params(Optimizer *o, const ParamTable *t, const Backend *be,
                                     const float *init, size_t begin, size_t end,
                                     Precision precision)
{
    optimizer_fields(o, t, be, begin, end, precision);
    o->offload = 1;
    o->params_on_host = 1;
    const size_t n = end - begin;
    o->m = host_state(be, n, "Adam first moment (offloaded to host memory)");
    o->v = host_state(be, n, "Adam second moment (offloaded to host memory)");
    o->master = host_state(be, n, "fp32 master weights (offloaded to host memory)");
    o->stage = host_state(be, n, "offload staging (gradients in, the bf16 weights between steps)");
    memcpy(o->master, init, n * sizeof(float));
    if (!o->bf16)
        return o->master;
    for (size_t i = 0; i < n; i++)
        o->stage[i] = bf16_round(o->master[i]);
    return o->stage;
}

static void upload_parts_free(Optimizer *o)
{
    for (int i = 0; i < o->n_up; i++)
        o->be->event_destroy(o->up_ev[i]);
    free(o->up_end);
    free(o->up_ev);
    free(o->up_pending);
    o->n_up = 0;
}

void optimizer_upload_parts(Optimizer *o, const size_t *ends, int n)
{
    if (!o->offload || o->params_on_host)
        return;
    TRD_ASSERT(n >= 1 && ends[n - 1] == o->end - o->begin);
    optimizer_wait_params(o);
    upload_parts_free(o);
    o->up_end = trd_malloc((size_t)n * sizeof(size_t), "weight upload parts");
    o->up_ev = trd_malloc((size_t)n * sizeof(void *), "weight upload events");
    o->up_pending = trd_calloc((size_t)n, sizeof(int), "weight upload flags");
    for (int i = 0; i < n; i++) {
        TRD_ASSERT(i == 0 || ends[i] > ends[i - 1]);
        o->up_end[i] = ends[i];
        o->up_ev[i] = o->be->event_create();
    }
    o->n_up = n;
}

void optimizer_wait_part(Optimizer *o, int i)
{
    if (i < 0 || i >= o->n_up || !o->up_pending[i])
        return;
    o->be->wait_event(o->up_ev[i]);
    o->up_pending[i] = 0;
}

void optimizer_wait_params(Optimizer *o)
{
    for (int i = 0; i < o->n_up; i++)
        optimizer_wait_part(o, i);
}

void optimizer_free(Optimizer *o)
{
    if (o->shared) { /* the other's buffers: freed with it */
    } else if (o->offload) {
        upload_parts_free(o);
        o->be->host_release(o->m);
        o->be->host_release(o->v);
        o->be->host_release(o->master);
        o->be->host_release(o->stage);
    } else if (o->be) {
        o->be->release(o->m);
        o->be->release(o->v);
        o->be->release(o->master);
    }
    memset(o, 0, sizeof *o);
}

/* Offload: the gradients of the owned range to the host, the CPU
 * backend's AdamW there (the reference's arithmetic, its OpenMP threads),
 * the updated weights back.  One staging buffer serves both ways: AdamW
 * reads grad[i] before it writes param[i], element by element, so with
 * bf16 the rounded weights overwrite the gradients in place; with fp32 the
 * weights are the master weights themselves.  The weights go up on the
 * copy stream, part by part (optimizer_upload_parts), without the host
 * waiting and without the compute stream waiting until a part's reader
 * asks (optimizer_wait_part); `out` is written again only after the next
 * step's host_copies_wait, which follows the copies (the next step's
 * gradients come down on the same stream, after them).  With the
 * parameters on the host (optimizer+params) params is that buffer
 * already: nothing goes back. */
static void step_on_host(Optimizer *o, float *params, const float *grads, const BackendRange *r,
                         int nr, float lr, const TrainingConfig *tc)
{
    const size_t bytes = (o->end - o->begin) * sizeof(float);
    BackendStepState st;
    if (o->state) { /* the device's decision (grad_check): read, not recomputed */
        o->be->to_host(&st, o->state, sizeof st);
        if (st.skip) {
            if (o->grads_streamed) /* the caller may clear the gradients next */
                optimizer_grads_dropped(o);
            return;
        }
    }
    /* The gradients sent during backward (zero.c), and the last step's
     * weights up from stage and master, done. */
    o->be->host_copies_wait();
    if (!o->grads_streamed)
        o->be->to_host(o->stage, grads, bytes);
    float *out = o->bf16 ? o->stage : o->master;
    backend_cpu()->adamw_ranges(out, o->master, o->stage, o->m, o->v, r, nr, lr, tc->beta1,
                                tc->beta2, tc->eps, tc->weight_decay, o->grad_scale, o->t, o->bf16,
                                o->state ? &st : NULL);
    if (o->params_on_host) {
        TRD_ASSERT(params == out);
        return;
    }
    size_t lo = 0;
    for (int i = 0; i < o->n_up; i++) {
        const size_t hi = o->up_end[i];
        o->be->to_backend_copy(params + lo, out + lo, (hi - lo) * sizeof(float), o->up_ev[i]);
        o->up_pending[i] = 1;
        lo = hi;
    }
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
    if (o->offload) {
        step_on_host(o, params, grads, r, n, lr, tc);
    } else {
        float *master = o->master ? o->master : params;
        o->be->adamw_ranges(params, master, grads, o->m, o->v, r, n, lr, tc->beta1, tc->beta2,
                            tc->eps, tc->weight_decay, o->grad_scale, o->t, o->bf16, o->state);
    }
    free(r);
    o->grad_scale = 1.0f;
    o->state = NULL;
    o->grads_streamed = 0;
}

void optimizer_scale_grads(Optimizer *o, float s) { o->grad_scale *= s; }

void optimizer_grads_dropped(Optimizer *o)
{
    TRD_ASSERT(o->offload);
    o->be->host_copies_wait();
    if (o->params_on_host && o->bf16) /* the weights, as AdamW last wrote them */
        for (size_t i = 0; i < o->end - o->begin; i++)
            o->stage[i] = bf16_round(o->master[i]);
}

void optimizer_grads_streamed(Optimizer *o)
{
    TRD_ASSERT(o->offload);
    o->grads_streamed = 1;
}

void optimizer_use_state(Optimizer *o, const BackendStepState *s) { o->state = s; }

void optimizer_skipped(Optimizer *o)
{
    TRD_ASSERT(o->t > 0);
    o->t--;
}

void optimizer_params_loaded(Optimizer *o, const float *params)
{
    optimizer_wait_params(o);
    if (o->offload && !o->bf16 && !o->params_on_host) /* on the host, params is master */
        o->be->to_host(o->master, params, (o->end - o->begin) * sizeof(float));
}

size_t optimizer_bytes(const Optimizer *o)
{
    size_t n = o->end - o->begin;
    return o->offload ? 0 : n * sizeof(float) * (o->master ? 3 : 2);
}

size_t optimizer_host_bytes(const Optimizer *o)
{
    size_t n = o->end - o->begin;
    return o->offload ? (n ? n : 1) * sizeof(float) * 4 : 0;
}
