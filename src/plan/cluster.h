/* cluster.h — the machine a plan is made for: nodes, accelerators, links.
 *
 * A cluster is a built-in preset (a100-40gb, a100-80gb, h100-sxm, h200,
 * rtx3090, cpu) or a YAML file naming a preset and overriding any field:
 *
 *     preset: a100-80gb
 *     nodes: 16
 *     gpus_per_node: 8
 *     network_gbps: 25          # GB/s per GPU per direction
 *
 * Bandwidths are nominal, per GPU and per direction, in GB/s (1e9 bytes);
 * the time model multiplies them by comm_efficiency.  peak_tflops is the
 * dense bf16 tensor-core peak (the MFU denominator); gemm_efficiency is the
 * fraction of it a large GEMM achieves.  docs/plan.md lists the presets,
 * their sources and what the model assumes. */
#ifndef TRD_PLAN_CLUSTER_H
#define TRD_PLAN_CLUSTER_H

#include "config/config.h"

typedef struct {
    char name[64];
    int nodes, gpus_per_node;
    double gpu_memory_gib;                   /* usable memory per GPU */
    double reserve_gib;                      /* of it, taken by the runtime (context, workspaces) */
    double peak_tflops;                      /* dense bf16 per GPU */
    double hbm_gbps;                         /* memory bandwidth per GPU */
    double nvlink_gbps, nvlink_latency_us;   /* within a node */
    double network_gbps, network_latency_us; /* between nodes, per GPU */
    double gemm_efficiency;                  /* achieved fraction of peak for the model's GEMMs */
    double comm_efficiency;                  /* achieved fraction of nominal link bandwidth */
    /* Not the machine's but the plan's: count 2-byte weights, gradients
     * and activations for a bf16 run (`plan --storage bf16`: Megatron-LM's
     * storage, and trident's once its CUDA backend stores bf16).  0, the
     * default: what trident allocates today, fp32 on both backends. */
    int bf16_storage;
    /* The host side, for topology.offload (the optimizer state in host
     * memory, AdamW on the host's cores): RAM per node, the PCIe link of
     * each GPU to it (GB/s per direction) and the node's memory bandwidth
     * (GB/s), which the CPU AdamW of all its GPUs' ranks shares. */
    double host_memory_gib, pcie_gbps, host_memory_gbps;
} PlanCluster;

/* Preset by name; nodes is 1.  Returns 0, or -1 with the preset names in err. */
int cluster_preset(const char *name, PlanCluster *c, char err[CFG_ERR]);

/* A preset name, "NAME:NODESxGPUS" (a100-80gb:16x8), or a YAML file.
 * Errors name file:line:column and the key.  Returns 0 or -1. */
int cluster_load(const char *spec, PlanCluster *c, char err[CFG_ERR]);

/* The dense bf16 peak (TFLOP/s) of the preset a device name belongs to
 * ("NVIDIA H100 80GB HBM3": h100-sxm's); 0 for a device of no preset. */
double cluster_device_peak_tflops(const char *device);

/* "a100-40gb, a100-80gb, ..." */
const char *cluster_preset_names(void);

static inline int cluster_gpus(const PlanCluster *c) { return c->nodes * c->gpus_per_node; }

#endif
