/* grads.h — data parallelism proper: the reduction of a rank's gradients
 * over its data-parallel replicas, overlapped with backward, and the
 * finalize step of a pipelined step (Megatron-LM's DistributedDataParallel
 * plus finalize_model_grads, for ZeRO stages 0 and 1).
 *
 * The flat gradient buffer [P] is cut into buckets (buckets.h).  On the
 * last micro-batch of a step, backward tells dp_grads_ready which group
 * (layer, or the outer tensors) has its final gradient; a bucket's
 * reduction starts as soon as all its groups are final, so the reduction
 * of late layers overlaps the backward of early ones.  ZeRO 0 all-reduces
 * each bucket in place; ZeRO 1 reduce-scatters it into this rank's shard.
 *
 * With the optimizer offloaded (topology.offload, dp_grads_stream) each
 * bucket's result (ZeRO 0: the bucket; ZeRO 1: this rank's part of it)
 * goes to the host on the backend's copy stream (to_host_async) as its
 * reduction completes, overlapping the next reductions and the rest of
 * backward: under NCCL the copy is queued with the reduction and waits for
 * its completion event, ordering neither the host nor the compute stream;
 * under MPI (host staging) the reduction is polled whenever a later group
 * is final and the copy follows once it has completed (dp_grads_finish
 * waits for the rest).  The host waits for the copies once, in the optimizer step.
 *
 * A tied embedding split over pipeline stages (the first stage's input
 * embedding and the last stage's copy as head) has its gradient summed over
 * the embedding group first: its bucket waits for dp_grads_finish, which
 * does that sum and then starts it. */
#ifndef TRD_DATA_PAR_GRADS_H
#define TRD_DATA_PAR_GRADS_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "model/params.h"

typedef struct DpGrads DpGrads;

/* layers: the held layers ascending (nl of them), as dp_make_buckets takes
 * them.  grads: the [t->numel] gradient buffer.  shard: NULL to all-reduce;
 * else the reduce-scattered block [own_lo, own_lo + its length) of blocks of
 * S elements lands there.  embed: the embedding group when this rank holds
 * a tied embedding split over pipeline stages, else NULL. */
DpGrads *dp_grads_create(const ParamTable *t, const int *layers, int nl, int bucket_mb, Comm *dp,
                         float *grads, float *shard, size_t own_lo, size_t S, Comm *embed);
void dp_grads_free(DpGrads *g);
/* Offload: from now on send each bucket's reduced part to host (page-
 * locked, the optimizer's range: [P] indexed by flat offset when
 * all-reducing, else this rank's block from own_lo) as above. */
void dp_grads_stream(DpGrads *g, const Backend *be, float *host);

/* A new step: every bucket waits for all its groups again. */
void dp_grads_begin_step(DpGrads *g);
/* The group at backward position pos (0: the last held layer, ..., nl - 1:
 * the first, nl: the outer tensors) has its final gradient. */
void dp_grads_ready(DpGrads *g, int pos);
/* Sum the tied embedding over its group (then start its bucket) and wait
 * for every bucket (streaming: send those not sent yet; the copies may
 * still be running: the caller waits with host_copies_wait).  Returns the
 * seconds spent waiting for buckets this step. */
double dp_grads_finish(DpGrads *g);

/* The planner's count: bytes this rank sends for one step's reduction, the
 * buckets dp_grads_create would make, each all-reduced (shard: reduce-
 * scattered) over dp ranks (comm_ring_bytes). */
uint64_t dp_grads_plan_bytes(const ParamTable *t, const int *layers, int nl, int bucket_mb, int dp,
                             int shard);

#endif
