/* plan.h — the planner: memory, communication and time of a training run,
 * computed without running it (`trident plan`, docs/plan.md).
 *
 * Everything about the model comes from the code the trainer runs: the
 * parameter table (src/model/params.h) for per-rank parameter counts and
 * GEMM shapes, the model's activation and scratch tables
 * (model_plan_memory), the ZeRO engine's allocation and collective rules
 * (zero_plan_memory, zero_plan_step_bytes), the pipeline schedules
 * (pp_schedule_slots, pp_bubble_fraction) and the stage split
 * (pp_stage_layers).  The planner adds only what a CPU run cannot
 * measure: element sizes on an accelerator, link speeds and a time model.
 *
 * Byte counts of collectives follow src/comm's rule (what one rank sends
 * under ring algorithms); on the CPU reference backend they equal the
 * counters of a real run exactly (tests/test_plan_runs.sh). */
#ifndef TRD_PLAN_H
#define TRD_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "plan/cluster.h"

/* One pipeline rank (all its model chunks), seen from its most loaded rank:
 * TP rank 0 and DP rank 0 (ZeRO's first shard is never shorter). */
typedef struct {
    int layers; /* transformer layers held */
    int has_embed, has_head;
    int inflight; /* micro-batches whose activations are held at peak */
    /* bytes on the device */
    double params, grads, optimizer, buffers, activations, scratch, reserve, total;
    double frozen; /* LoRA: the frozen base weights (in params; params - frozen
                    * are the adapters, the only state grads and optimizer hold) */
    /* host bytes, beside total: the checkpoint's host snapshot (fp32 weights
     * and optimizer state this rank holds) where checkpoint.async is not
     * false on the CPU, and a device backend's host copies of its state */
    double host_ckpt;
    /* topology.offload: the optimizer state in host memory (not in total),
     * the bytes over PCIe in one step (gradients down, weights up) and the
     * optimizer's time in its parts (in t_optimizer) */
    double host_optimizer, pcie_bytes_step, t_pcie, t_host_adamw;
    /* per micro-batch, this rank */
    double flops;                        /* forward + backward, recomputation included */
    double gemm_flops;                   /* of which weight GEMMs without recomputation (the
                               * shapes the backend multiplies: 6 x rows x weights) */
    double t_compute, t_tp, t_p2p, t_mb; /* seconds */
    double t_cp, t_cp_total;             /* the cp exchange: exposed (in t_mb), and all of it */
    double t_ep;                         /* the expert-parallel all-to-alls (in t_mb) */
    /* what src/comm counts on this rank (fp32 elements, the trainer's rule) */
    uint64_t tp_bytes_mb;      /* TP communicator, one micro-batch */
    uint64_t moe_tp_bytes_mb;  /* of which MoE's routing-weight gradient all-reduces */
    double ep_bytes_mb;        /* MoE's all-to-alls, bytes this rank sends (balanced routing) */
    int moe_layers;            /* MoE layers held */
    uint64_t kv_bytes_mb;      /* the kv-sharing sub-group (tp > kv_heads) */
    uint64_t pp_bytes_step;    /* pipeline sends of one step */
    uint64_t dp_bytes_step;    /* DP communicator, one step (the metrics' comm_bytes) */
    uint64_t embed_bytes_step; /* tied-embedding all-reduce, first and last stage */
    uint64_t cp_bytes_mb;      /* the context-parallel K/V exchange, one micro-batch */
    double t_dp_exposed, t_optimizer;
} PlanStage;

/* Link class of a group: none (one rank), in-node (NVLink, or PCIe on the
 * rtx3090 preset: the cluster's nvlink_* figures) or the inter-node network. */
typedef enum { LINK_NONE = 0, LINK_NVLINK = 1, LINK_NETWORK = 2 } PlanLink;

typedef struct {
    /* the layout */
    int tp, pp, dp, zero, micro_batch, virtual_stages, sp;
    int cp; /* context parallel (the dp axis holds dp x cp ranks) */
    Recompute recompute;
    ScheduleKind schedule;
    int world, n_micro, global_batch;
    /* bytes per element on the device */
    int elem_param, elem_grad, elem_act;
    PlanLink tp_link, dp_link, pp_link, cp_link, ep_link;

    PlanStage st[CFG_MAX_STAGES];
    int worst;       /* the pipeline rank with the most memory */
    double capacity; /* device memory usable by trident, bytes */
    int fits;        /* in device memory, and with offload in host memory */
    int offload;     /* topology.offload (OffloadKind: 0 none) */
    /* host bytes per node with offload: the ranks of a node, each its
     * offloaded state and checkpoint copies (the most loaded stage's) */
    double host_node, host_capacity;

    /* per step, the worst stage's rank, device bytes */
    double tp_bytes, pp_bytes, dp_bytes, embed_bytes, cp_bytes;

    double bubble; /* idle share of the pipeline part of the step */
    double t_pipe, t_dp_exposed, t_optimizer, t_embed, t_step;
    double model_flops_step; /* model FLOPs of one step (MFU numerator, no recompute) */
    double tokens_per_s, mfu, tflops_per_gpu;
} PlanResult;

/* Plan cfg (validated for world tp * pp * dp; dp must be a number) on
 * cluster c.  Returns 0, or -1 with what is wrong in err. */
int plan_evaluate(const Config *cfg, const PlanCluster *c, PlanResult *r, char err[CFG_ERR]);

/* Expert parallelism: the all-to-all exchanges of one MoE layer and
 * micro-batch (4: dispatch and combine, forward and backward; 6 with full
 * recompute), and the bytes one rank sends in them with balanced routing
 * (0 without ep). */
int plan_ep_exchanges(const PlanResult *r);
double plan_ep_bytes_layer(const Config *cfg, const PlanResult *r);

/* The report: layout, per-stage memory, communication, time; for a plan
 * that does not fit, by how much and what would. */
void plan_print(FILE *f, const Config *cfg, const PlanCluster *c, const PlanResult *r);

/* Candidates for --search: every valid layout of the whole cluster, ranked
 * by estimated tokens/s among those that fit. */
typedef struct {
    PlanResult r;
    char why[256];
} PlanCandidate;

/* Context parallelism is searched for sequences this long and longer
 * (shorter ones' activations are small next to the weights). */
#define PLAN_CP_MIN_SEQ 8192
int plan_search_cp(const Config *cfg);
/* topology.offload is searched (none, optimizer, and optimizer+params
 * with ZeRO-3) for the CUDA backend. */
int plan_search_offload(const Config *cfg);

/* Fill up to max candidates (best first); *n_fit the number that fit,
 * *n_tried the layouts evaluated.  Returns the number written. */
int plan_search(const Config *cfg, const PlanCluster *c, PlanCandidate *out, int max, int *n_fit,
                int *n_tried);

/* Apply a layout to a config copy (topology and micro-batch keys). */
void plan_apply_layout(Config *cfg, int tp, int pp, int dp, int zero, int micro_batch, int v,
                       Recompute rc);

/* What would fit when r does not: the first layout of the search (same
 * cluster) that fits, described in buf.  Returns 0 when one was found. */
int plan_suggest(const Config *cfg, const PlanCluster *c, char *buf, size_t len);

const char *plan_link_name(PlanLink l);

#endif
