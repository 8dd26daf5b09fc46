/* optimizer.h — AdamW over the flat parameter buffer, per-tensor decay.
 *
 * The optimizer owns a flat range [begin, end) of the parameter buffer: the
 * whole buffer without ZeRO, this rank's shard with it (the range comes from
 * the parameter table; sharding lands with the ZeRO issue).  State is fp32:
 * Adam first and second moments, and fp32 master weights when the model's
 * weights are bf16 (training.precision: bf16).
 *
 * Offload (topology.offload: optimizer, a device backend): the state lives
 * in the backend's page-locked host memory instead, fp32 master weights
 * included whatever the precision (they are the weights AdamW updates; with
 * fp32 they equal the device's weights).  A step copies the gradients of
 * the owned range to the host, runs the CPU backend's AdamW there (OpenMP
 * threads) and copies the updated weights back: two transfers of the
 * range, and the same AdamW arithmetic as the CPU reference.
 *
 * Offloaded parameters too (topology.offload: optimizer+params, ZeRO-3):
 * the weights of the range never live in the backend's memory; their home
 * is a host buffer of the state, so no copy goes back after a step (the
 * ZeRO-3 gathers read each layer's part from the host when it is needed).
 * With fp32 the weights are the master weights themselves; with bf16 they
 * are the staging buffer, which holds the rounded weights between steps
 * and the gradients only inside a step, after the step's last gather: the
 * host memory is the same four buffers as above. */
#ifndef TRD_OPTIMIZER_H
#define TRD_OPTIMIZER_H

#include <stddef.h>

#include "backend/backend.h"
#include "config/config.h"
#include "model/params.h"

typedef struct {
    const ParamTable *table;
    const Backend *be;
    size_t begin, end; /* owned flat range */
    float *master;     /* fp32 master weights [end-begin], or NULL (fp32: params are master) */
    float *m, *v;      /* Adam moments [end-begin] */
    int bf16;          /* params are bf16-rounded copies of master */
    int t;             /* optimizer steps taken (bias correction) */
    float grad_scale;  /* factor of the next step's gradients (optimizer_scale_grads) */
    const BackendStepState *state; /* the next step's device decision, or NULL */
    int offload;                   /* state in host memory, AdamW on the host */
    float *stage; /* offload: page-locked [end-begin], the gradients in, the bf16 weights out */
    int params_on_host; /* optimizer+params: params is host memory, master (fp32) or stage */
    int grads_streamed; /* the next step's gradients were sent to stage (optimizer_grads_streamed) */
    /* offload, params in the backend's memory: the updated weights go up
     * in parts [up_end[i-1], up_end[i]) of the range on the copy stream,
     * each recording up_ev[i]; up_pending[i]: the compute stream has not
     * waited for it yet (optimizer_wait_part) */
    int n_up;
    size_t *up_end;
    void **up_ev;
    int *up_pending;
    int shared; /* its state lies in another's buffers (optimizer_init_pair): not freed here */
} Optimizer;

/* Allocate state for the owned flat range [begin, end).  `params` holds
 * that range (params[0] is flat element `begin`).  With bf16, copies params
 * into master and rounds params to bf16 so the first forward already sees
 * bf16 weights. */
void optimizer_init(Optimizer *o, const ParamTable *t, const Backend *be, float *params,
                    size_t begin, size_t end, Precision precision);
/* Two optimizers over two owned ranges, [begin, end) at params and
 * [xbegin, xend) at xparams (the dense and the expert block of ZeRO 1
 * with the experts divided over ep, zero.h), whose state is one
 * allocation: o's m, v and master are [n + xn], x's the last xn of them.
 * A checkpoint reads and writes each kind as one buffer (ckpt.h's second
 * run). */
void optimizer_init_pair(Optimizer *o, Optimizer *x, const ParamTable *t, const Backend *be,
                         float *params, size_t begin, size_t end, float *xparams, size_t xbegin,
                         size_t xend, Precision precision);
/* The same with the state offloaded to host memory (see above); params
 * stays in the backend's memory. */
void optimizer_init_offload(Optimizer *o, const ParamTable *t, const Backend *be, float *params,
                            size_t begin, size_t end, Precision precision);
/* Parameters offloaded as well (see above): `init` holds the range's
 * initial weights in host memory (the caller's, read once).  Returns the
 * host buffer where the weights live from now on, which optimizer_step
 * takes as its params; bf16 rounds them there. */
float *optimizer_init_offload_params(Optimizer *o, const ParamTable *t, const Backend *be,
                                     const float *init, size_t begin, size_t end,
                                     Precision precision);
void optimizer_free(Optimizer *o);

/* One AdamW step at learning rate lr: decay only on tensors whose
 * ParamSpec.decay is set (matrices; not norms or biases).  params and grads
 * hold the owned range, as in optimizer_init. */
void optimizer_step(Optimizer *o, float *params, const float *grads, float lr,
                    const TrainingConfig *tc);

/* Multiply the gradients the next optimizer_step reads by s (gradient
 * clipping): applied inside its AdamW pass, so the gradients are not read
 * and written once more for it; the buffer itself is left unscaled.  The
 * factor returns to 1 after the step. */
void optimizer_scale_grads(Optimizer *o, float s);

/* The next optimizer_step takes its clip factor and its skip decision
 * from s (backend memory, written by the backend's grad_check before the
 * step runs): the host does not wait for the gradient norm.  Once the host
 * has read s and the step was skipped there, optimizer_skipped takes the
 * step off the count t, which the device left unchanged with the rest. */
void optimizer_use_state(Optimizer *o, const BackendStepState *s);
void optimizer_skipped(Optimizer *o);

/* The weights of the owned range were replaced (a checkpoint or
 * checkpoint.init_from was loaded into params): with offload and fp32 the
 * host's master copy is read back from params (bf16 loads the master
 * weights themselves).  A no-op otherwise. */
void optimizer_params_loaded(Optimizer *o, const float *params);

/* Offload: the next optimizer_step's gradients are on their way to the
 * host already (the caller sent each part to o->stage with to_host_async
 * as its reduction completed): the step waits for those copies instead of
 * copying the gradients itself. */
void optimizer_grads_streamed(Optimizer *o);
/* Offload: gradients sent to the host are dropped without a step (a skip):
 * waits for their copies and, where they overwrote the weights' home
 * (optimizer+params, bf16: stage), writes the weights back there from the
 * master weights, which the skip left unchanged (bf16_round of each, as
 * AdamW writes them). */
void optimizer_grads_dropped(Optimizer *o);

/* Offload with the weights in the backend's memory: the step copies the
 * updated weights up on the backend's copy stream (to_backend_copy) in
 * parts, by default one, the whole range; the compute stream waits for a
 * part only where the caller says its first reader is, so that the next
 * forward starts while later parts are still coming up.
 * optimizer_upload_parts: n parts ending at ends[0] < ... < ends[n - 1] =
 * end - begin (offsets in the range).  optimizer_wait_part: the compute
 * stream's later work sees part i's new weights (no-op when they are
 * there already); optimizer_wait_params: every part's.  No-ops without
 * offload. */
void optimizer_upload_parts(Optimizer *o, const size_t *ends, int n);
void optimizer_wait_part(Optimizer *o, int i);
void optimizer_wait_params(Optimizer *o);

/* Bytes of state in the backend's memory (0 with offload) and in host
 * memory (offload: master, m, v and the staging buffer, which with
 * optimizer+params hold the weights as well). */
size_t optimizer_bytes(const Optimizer *o);
size_t optimizer_host_bytes(const Optimizer *o);

#endif
