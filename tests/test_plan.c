/* test_plan.c — the planner's FLOPs against the GEMMs actually run, its
 * memory against the model's own report, and the cluster description.
 *
 *  - FLOPs: one forward + backward of a tiny GPT-2 and Llama on the CPU
 *    backend, counting 2*N*C*OC per GEMM (backend_cpu_gemm_flops); the
 *    count must equal the plan's GEMM FLOPs per micro-batch, and the model
 *    FLOPs of model_flops_per_token once its two conventions are undone by
 *    hand (attention 12*L*T*C is not a weight GEMM; the head multiplies by
 *    the padded vocabulary, the MFU numerator counts the real one).
 *  - Memory: model_plan_memory equals model_memory of a created model for
 *    each recompute mode and several activation-set counts.
 *  - Cluster: presets, PRESET:NxG, a YAML file, and errors naming
 *    file:line:column.
 *  - Expert parallelism: the all-to-alls' bytes and time in the
 *    micro-batch's time, by hand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "model/model.h"
#include "plan/plan.h"

enum { B = 2, T = 16 };

static void tiny(Config *c, ModelArch arch, Recompute rc)
{
    char err[CFG_ERR];
    config_defaults(c);
    c->model.arch = arch;
    c->model.layers = 3;
    c->model.hidden = 32;
    c->model.heads = 4;
    c->model.kv_heads = arch == ARCH_LLAMA ? 2 : 0;
    c->model.vocab = 101;
    c->model.vocab_pad_multiple = 16; /* Vp = 112: 11 padding rows */
    c->model.seq_len = T;
    c->training.steps = 1;
    snprintf(c->data.path, sizeof c->data.path, "unused");
    c->training.lr = 1e-3f;
    c->training.global_batch = B;
    c->training.micro_batch = B;
    c->training.recompute = rc;
    c->topology.ranks_per_node = 1;
    if (config_validate(c, 1, err) != 0) {
        fprintf(stderr, "config: %s\n", err);
        exit(1);
    }
}

static void check_flops(ModelArch arch)
{
    Config c;
    tiny(&c, arch, RECOMPUTE_NONE);
    const ModelConfig *mc = &c.model;
    ParamShard sh = params_full_shard(mc);
    Model *m = model_create(&c, backend_cpu(), &sh, B);
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7) % mc->vocab;
        tgt[i] = (i * 13 + 5) % mc->vocab;
    }
    backend_cpu_gemm_flops_reset();
    model_forward(m, tok, tgt);
    model_backward(m, 1.0f);
    const double counted = backend_cpu_gemm_flops();
    model_free(m);

    PlanCluster cl;
    char err[CFG_ERR];
    CHECK(cluster_preset("cpu", &cl, err) == 0, "%s", err);
    PlanResult r;
    CHECK(plan_evaluate(&c, &cl, &r, err) == 0, "%s", err);
    CHECK_CLOSE(r.st[0].gemm_flops, counted, 0, 0.5, "plan GEMM FLOPs per micro-batch");

    /* By hand from the shapes: per layer qkv (H + 2 KVH) hs x C, proj C x C,
     * MLP 2 (GPT-2) or 3 (Llama) C x F; the head Vp x C; 6 FLOPs per weight
     * and token (forward 2, backward 4). */
    const double C = mc->hidden, F = mc->ffn_hidden, hs = C / mc->heads, N = B * T;
    const double Vp = params_padded_vocab(mc, 1);
    const double layer =
        (mc->heads + 2.0 * mc->kv_heads) * hs * C + C * C + (arch == ARCH_GPT2 ? 2 : 3) * C * F;
    const double by_hand = 6 * N * (mc->layers * layer + Vp * C);
    CHECK_CLOSE(counted, by_hand, 0, 0.5, "GEMM FLOPs from the shapes by hand");
    const double model = model_flops_per_token(mc) * N - 12.0 * mc->layers * T * C * N +
                         6 * N * (Vp - mc->vocab) * C;
    CHECK_CLOSE(counted, model, 1e-12, 0.5, "model_flops_per_token, conventions undone");
    CHECK_CLOSE(r.model_flops_step, model_flops_per_token(mc) * N, 1e-12, 0,
                "plan model FLOPs per step");
    printf("flops %s: counted %.0f, plan %.0f, by hand %.0f\n", config_arch_name(arch), counted,
           r.st[0].gemm_flops, by_hand);
}

static void check_memory(ModelArch arch, Recompute rc, int sets)
{
    Config c;
    tiny(&c, arch, rc);
    ParamShard sh = params_full_shard(&c.model);
    Model *m = model_create_unbound(&c, backend_cpu(), &sh, B);
    model_set_activation_sets(m, sets);
    const MemoryReport real = model_memory(m), plan = model_plan_memory(&c, &sh, B, sets);
    model_free(m);
    CHECK(real.activations == plan.activations, "activations %zu vs %zu (rc %d, sets %d)",
          real.activations, plan.activations, rc, sets);
    CHECK(real.scratch == plan.scratch, "scratch %zu vs %zu", real.scratch, plan.scratch);
}

/* LoRA (with adapter dropout): the adapters' scratch (their inner
 * activation and its gradient, the dropped input) and each activation
 * set's dropout rows are in the plan as allocated. */
static void check_memory_lora(ModelArch arch, int sets)
{
    Config c;
    tiny(&c, arch, RECOMPUTE_NONE);
    char err[CFG_ERR];
    CHECK(config_set(&c, "model.lora.rank=4", err) == 0 &&
              config_set(&c, "model.lora.dropout=0.1", err) == 0 &&
              config_set(&c,
                         arch == ARCH_LLAMA ? "model.lora.targets=qkv,proj,fc,up,fcproj"
                                            : "model.lora.targets=qkv,proj,fc,fcproj",
                         err) == 0 &&
              config_validate(&c, 1, err) == 0,
          "%s", err);
    ParamShard sh = params_full_shard(&c.model);
    Model *m = model_create_unbound(&c, backend_cpu(), &sh, B);
    model_set_activation_sets(m, sets);
    const MemoryReport real = model_memory(m), plan = model_plan_memory(&c, &sh, B, sets);
    model_free(m);
    CHECK(real.activations == plan.activations, "lora: activations %zu vs %zu (sets %d)",
          real.activations, plan.activations, sets);
    CHECK(real.scratch == plan.scratch, "lora: scratch %zu vs %zu", real.scratch, plan.scratch);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void check_cluster(void)
{
    PlanCluster c;
    char err[CFG_ERR];
    CHECK(cluster_load("a100-80gb:16x8", &c, err) == 0, "%s", err);
    CHECK(c.nodes == 16 && c.gpus_per_node == 8 && cluster_gpus(&c) == 128, "16x8");
    CHECK(c.peak_tflops == 312.0 && c.gpu_memory_gib == 80.0, "A100 80GB preset");
    CHECK(cluster_load("h100-sxm", &c, err) == 0 && c.peak_tflops == 989.0, "H100 preset");
    CHECK(cluster_load("a100-80gb:16", &c, err) != 0 && strstr(err, "NODESxGPUS"), "%s", err);

    char dir[] = "/tmp/trd_plan_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256];
    snprintf(path, sizeof path, "%s/ok.yaml", dir);
    write_file(path, "preset: h200\nnodes: 4\nnetwork_gbps: 40\n");
    CHECK(cluster_load(path, &c, err) == 0, "%s", err);
    CHECK(c.nodes == 4 && c.network_gbps == 40 && c.gpu_memory_gib == 140, "h200 file");

    snprintf(path, sizeof path, "%s/bad_key.yaml", dir);
    write_file(path, "preset: h200\nnodes: 4\nnvlink_gbs: 40\n");
    CHECK(cluster_load(path, &c, err) != 0 && strstr(err, "bad_key.yaml:3:1") &&
              strstr(err, "nvlink_gbs"),
          "unknown key: %s", err);
    snprintf(path, sizeof path, "%s/bad_value.yaml", dir);
    write_file(path, "preset: a100-40gb\nnodes: -2\n");
    CHECK(cluster_load(path, &c, err) != 0 && strstr(err, "bad_value.yaml:2:8") &&
              strstr(err, "nodes"),
          "bad value: %s", err);
    snprintf(path, sizeof path, "%s/no_preset.yaml", dir);
    write_file(path, "nodes: 2\n");
    CHECK(cluster_load(path, &c, err) != 0 && strstr(err, "preset"), "no preset: %s", err);
    snprintf(path, sizeof path, "%s/bad_preset.yaml", dir);
    write_file(path, "preset: v100\n");
    CHECK(cluster_load(path, &c, err) != 0 && strstr(err, "bad_preset.yaml:1:9"), "bad preset: %s",
          err);
    printf("cluster error: %s\n", err);
    const char *names[] = {"ok", "bad_key", "bad_value", "no_preset", "bad_preset"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s.yaml", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* Expert parallelism in the step time: a MoE at dp 4 with ep 2 (and ep 1,
 * and ep 2 with full recompute); the all-to-all bytes and seconds by hand
 * from the shapes and the cluster's link figures, and their place in the
 * micro-batch's time.  The bytes' formula is the one docs/moe.md derives
 * and tests/test_moe_train.sh compares with a run's trace. */
static void check_expert_parallel(int ep, Recompute rc, int gpus_per_node)
{
    Config c;
    char err[CFG_ERR];
    config_defaults(&c);
    c.model.layers = 4;
    c.model.hidden = 32;
    c.model.heads = 4;
    c.model.vocab = 101;
    c.model.seq_len = T;
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    c.model.moe_every = 2; /* layers 1 and 3 */
    snprintf(c.data.path, sizeof c.data.path, "unused");
    c.training.steps = 1;
    c.training.lr = 1e-3f;
    c.training.global_batch = 8 * B;
    c.training.micro_batch = B;
    c.training.recompute = rc;
    c.topology.dp = 4;
    c.topology.ep = ep;
    c.topology.ranks_per_node = 1;
    CHECK(config_validate(&c, 4, err) == 0, "config: %s", err);
    PlanCluster cl;
    CHECK(cluster_preset("h100-sxm", &cl, err) == 0, "%s", err);
    cl.nodes = 4 / gpus_per_node;
    cl.gpus_per_node = gpus_per_node;
    PlanResult r;
    CHECK(plan_evaluate(&c, &cl, &r, err) == 0, "%s", err);
    const PlanStage *s = &r.st[0];
    /* B*T tokens x top-2 rows, (ep-1)/ep of them to other ranks, 32 floats
     * each, 4 exchanges (6 with full recompute), 2 MoE layers */
    const double ex = rc == RECOMPUTE_FULL ? 6 : 4;
    const double bytes = ep > 1 ? B * T * 2.0 * (ep - 1) / ep * 32 * 4 * ex * 2 : 0;
    char what[96];
    snprintf(what, sizeof what, "ep %d, %d GPUs a node, recompute %d", ep, gpus_per_node, (int)rc);
    CHECK_CLOSE(s->ep_bytes_mb, bytes, 1e-12, 0, what);
    const int network = gpus_per_node < ep;
    const double bw = (network ? cl.network_gbps : cl.nvlink_gbps) * 1e9 * cl.comm_efficiency;
    const double lat = 1e-6 * (network ? cl.network_latency_us : cl.nvlink_latency_us);
    const double t = ep > 1 ? ex * 2 * (ep - 1) * lat + bytes / bw : 0;
    CHECK_CLOSE(s->t_ep, t, 1e-12, 0, what);
    CHECK(ep == 1 || r.ep_link == (network ? LINK_NETWORK : LINK_NVLINK), "ep %d: link %d", ep,
          (int)r.ep_link);
    CHECK_CLOSE(s->t_mb, s->t_compute + s->t_tp + s->t_p2p + s->t_cp + s->t_ep, 1e-12, 0, what);
    printf("%s: all-to-all %.0f bytes, %.3g s a micro-batch\n", what, s->ep_bytes_mb, s->t_ep);
}

int main(void)
{
    check_flops(ARCH_GPT2);
    check_flops(ARCH_LLAMA);
    for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_FULL; rc++)
        for (int sets = 1; sets <= 3; sets += 2) {
            check_memory(ARCH_GPT2, (Recompute)rc, sets);
            check_memory(ARCH_LLAMA, (Recompute)rc, sets);
        }
    for (int sets = 1; sets <= 2; sets++) {
        check_memory_lora(ARCH_GPT2, sets);
        check_memory_lora(ARCH_LLAMA, sets);
    }
    check_cluster();
    check_expert_parallel(1, RECOMPUTE_NONE, 4);
    check_expert_parallel(2, RECOMPUTE_NONE, 4);
    check_expert_parallel(2, RECOMPUTE_FULL, 4);
    check_expert_parallel(2, RECOMPUTE_NONE, 1); /* the pair on two nodes */
    return check_summary("plan");
}
