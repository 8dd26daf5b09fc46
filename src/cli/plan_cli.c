/* plan_cli.c — `trident plan`: the report of one layout, or --search. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_config.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/params.h"
#include "pipeline_par/pp_schedule.h"
#include "plan/plan.h"
#include "zero/zero.h"

#define GIB     (1024.0 * 1024.0 * 1024.0)
#define MAX_TOP 50

typedef struct {
    CliConfig cli; /* CONFIG and --set */
    const char *cluster;
    int search, top, json;
    int bf16_storage; /* --storage bf16 */
} Args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: trident plan CONFIG [--cluster CLUSTER] [--search [--top N]] [--json]\n"
            "                           [--set key.path=value ...]\n\n"
            "Estimate, without running anything, what a training run of CONFIG needs and\n"
            "how fast it goes: per-rank memory of the most loaded rank of every pipeline\n"
            "stage (parameters, gradients, optimizer state, ZeRO buffers, activations of\n"
            "the micro-batches in flight, scratch), communication per step per group and\n"
            "link, the pipeline bubble, step time, tokens/s and MFU.  See docs/plan.md.\n\n"
            "  --cluster CLUSTER  a preset (%s),\n"
            "                     PRESET:NODESxGPUS (a100-80gb:16x8), or a YAML file\n"
            "                     (configs/clusters/).  Default: the cpu preset for\n"
            "                     backend cpu, else a100-80gb with enough nodes\n"
            "  --search           rank every valid (tp, pp, dp, zero, micro_batch,\n"
            "                     virtual_stages, recompute) of the whole cluster\n"
            "  --top N            candidates --search prints (default 5)\n"
            "  --json             one JSON object (per-stage memory and bytes) instead\n"
            "  --storage fp32|bf16  bytes of weights, gradients and activations: fp32\n"
            "                     (default) is what trident allocates today on both\n"
            "                     backends; bf16 plans a bf16 run as Megatron-LM stores\n"
            "                     it (2 bytes each, fp32 master weights and moments)\n"
            "  --set key.path=value  override one config key (repeatable)\n"
            "Exit codes: 0 (also when the layout does not fit: the report says so), 2 bad input.\n",
            cluster_preset_names());
}

/* This command's options (CliOption). */
static int option(void *ctx, int argc, char **argv, int *i)
{
    Args *a = ctx;
    const char *s = argv[*i];
    const int has_value = *i + 1 < argc;
    if (!strcmp(s, "--cluster") && has_value) {
        a->cluster = argv[++*i];
    } else if (!strcmp(s, "--search")) {
        a->search = 1;
    } else if (!strcmp(s, "--json")) {
        a->json = 1;
    } else if (!strcmp(s, "--storage") && has_value) {
        const char *v = argv[++*i];
        if (strcmp(v, "fp32") && strcmp(v, "bf16"))
            trd_fatal(TRD_EXIT_INPUT, NULL, "--storage '%s': expected fp32 or bf16", v);
        a->bf16_storage = !strcmp(v, "bf16");
    } else if (!strcmp(s, "--top") && has_value) {
        char *end = NULL;
        errno = 0;
        long v = strtol(argv[++*i], &end, 10);
        if (errno || *end || v < 1 || v > MAX_TOP)
            trd_fatal(TRD_EXIT_INPUT, NULL, "--top '%s': expected 1 to %d", argv[*i], MAX_TOP);
        a->top = (int)v;
    } else {
        return 0;
    }
    return 1;
}

static int parse_args(int argc, char **argv, Args *a)
{
    memset(a, 0, sizeof *a);
    a->top = 5;
    if (cli_parse(argc, argv, &a->cli, usage, option, a))
        return 1;
    if (a->json && a->search)
        trd_fatal(TRD_EXIT_INPUT, "drop one of them", "--json and --search do not combine");
    return 0;
}

static const char *recompute_name(Recompute r)
{
    return r == RECOMPUTE_NONE ? "none" : r == RECOMPUTE_SELECTIVE ? "selective" : "full";
}

static void print_bytes_row(FILE *f, const char *group, int size, PlanLink l, double bytes,
                            const char *what)
{
    fprintf(f, "  %-6s %5d  %-8s %12.3f GiB   %s\n", group, size, plan_link_name(l), bytes / GIB,
            what);
}

/* Expert parallelism (docs/moe.md): the all-to-all bytes one rank sends
 * per MoE layer and micro-batch (plan_ep_bytes_layer); their time is EP in
 * the micro-batch's time. */
static void print_expert_parallel(FILE *f, const Config *cfg, const PlanResult *r)
{
    const ModelConfig *mc = &cfg->model;
    const int ep = cfg->topology.ep;
    const double layer = plan_ep_bytes_layer(cfg, r);
    int moe_layers = 0;
    for (int l = 0; l < mc->layers; l++)
        moe_layers += config_moe_layer(mc, l);
    fprintf(f,
            "expert parallel: ep %d of dp %d, each rank running %d of %d experts; all-to-all "
            "%.4g MiB per rank per MoE layer and micro-batch (balanced routing), %.4g MiB per "
            "rank per step over %d MoE layer(s) / pp %d; %s\n",
            ep, r->dp, mc->moe_experts / ep, mc->moe_experts, layer / (1024.0 * 1024.0),
            layer * r->n_micro * moe_layers / r->pp / (1024.0 * 1024.0), moe_layers, r->pp,
            config_ep_divides(cfg)
                ? "expert weights, gradients and optimizer state divided over ep, "
                  "their gradients reduced over the dp / ep ranks holding them"
                : "expert weights replicated over dp (offload)");
}

/* Tensor parallelism (docs/moe.md): the one collective MoE adds, the
 * all-reduce of the routing weights' gradient ([N, top_k] floats) in each
 * MoE layer's backward, on the stage that sends the most of it.  In the tp
 * row and the TP time below. */
static void print_expert_tensor_parallel(FILE *f, const PlanResult *r)
{
    int k = 0;
    for (int i = 1; i < r->pp; i++)
        if (r->st[i].moe_tp_bytes_mb > r->st[k].moe_tp_bytes_mb)
            k = i;
    const PlanStage *s = &r->st[k];
    if (s->moe_layers == 0)
        return;
    const double mb = (double)s->moe_tp_bytes_mb * r->elem_act / 4; /* bytes, one micro-batch */
    fprintf(f,
            "expert tensor parallel: tp %d; the routing weights' gradient all-reduced over tp, "
            "%.4g KiB per rank per MoE layer and micro-batch, %.4g KiB per rank per step over %d "
            "MoE layer(s) of stage %d (in the tp row)\n",
            r->tp, mb / s->moe_layers / 1024.0, mb * r->n_micro / 1024.0, s->moe_layers, k);
}

/* The experts' weights a rank holds (docs/moe.md): the stacked experts of
 * every MoE layer of its pipeline stage, each expert split over tp like
 * the dense MLP (the table of tp rank 0 over the whole model, / pp), and
 * E / ep of them where ep divides their memory (config_ep_divides), else
 * all of them, replicated over dp. */
static void print_expert_memory(FILE *f, const Config *cfg, const PlanResult *r)
{
    ParamShard sh = params_full_shard(&cfg->model);
    sh.tp = r->tp;
    sh.tp_rank = 0;
    const int divided = config_ep_divides(cfg);
    if (divided) /* the trainer's shard (trainer.c): ep rank 0's */
        sh.ep = cfg->topology.ep;
    ParamTable t;
    params_build_base(&t, &cfg->model, &sh);
    double n = 0;
    for (int i = 0; i < t.n; i++)
        if (strstr(t.p[i].name, ".moe.experts."))
            n += (double)t.p[i].numel;
    params_free(&t);
    n /= r->pp;
    char held[64] = "replicated over dp";
    if (divided)
        snprintf(held, sizeof held, "%d of %d experts (ep %d)", cfg->model.moe_experts / sh.ep,
                 cfg->model.moe_experts, sh.ep);
    fprintf(f,
            "expert weights per rank: %.4g M parameters (%.4g MiB at %d bytes): each expert "
            "split over tp %d, the MoE layers of 1 of pp %d stage(s), %s\n",
            1e-6 * n, n * r->elem_param / (1024.0 * 1024.0), r->elem_param, r->tp, r->pp, held);
}

static void print_layout(FILE *f, const Config *cfg, const PlanCluster *c, const PlanResult *r)
{
    const ModelConfig *mc = &cfg->model;
    fprintf(f,
            "cluster: %s, %d node(s) x %d GPUs, %.0f GiB each, %.4g TFLOP/s bf16 peak, "
            "in-node %.0f GB/s, network %.0f GB/s per GPU\n",
            c->name, c->nodes, c->gpus_per_node, c->gpu_memory_gib, c->peak_tflops, c->nvlink_gbps,
            c->network_gbps);
    fprintf(f,
            "model: %s, %d layers, hidden %d, heads %d (kv %d), ffn %d, vocab %d (padded %d), "
            "seq %d: %.2f B parameters\n",
            config_arch_name(mc->arch), mc->layers, mc->hidden, mc->heads, mc->kv_heads,
            mc->ffn_hidden, mc->vocab, params_padded_vocab(mc, r->tp), mc->seq_len,
            1e-9 * (double)params_count_real(mc));
    if (mc->moe_experts > 0)
        fprintf(f,
                "mixture of experts: %d experts, top-%d, every %d layer(s): %.4g M parameters, "
                "%.4g M active per token\n",
                mc->moe_experts, mc->moe_top_k, mc->moe_every, 1e-6 * (double)params_count_real(mc),
                1e-6 * (double)params_count_active(mc));
    char cp[32] = "";
    if (r->cp > 1)
        snprintf(cp, sizeof cp, " x cp %d", r->cp);
    fprintf(f,
            "layout: tp %d (%s) x pp %d (%s) x dp %d (%s)%s = %d GPUs | zero %d | %s schedule, "
            "virtual stages %d | sequence parallel %s | recompute %s\n",
            r->tp, plan_link_name(r->tp_link), r->pp, plan_link_name(r->pp_link), r->dp,
            plan_link_name(r->dp_link), cp, r->world, r->zero, pp_schedule_name(r->schedule),
            r->virtual_stages, r->sp ? "on" : "off", recompute_name(r->recompute));
    if (r->cp > 1)
        fprintf(f,
                "context parallel: cp %d (%s), each rank holding %d of every sequence's %d "
                "tokens; gradients and ZeRO over dp x cp = %d ranks\n",
                r->cp, plan_link_name(r->cp_link), mc->seq_len / r->cp, mc->seq_len, r->dp * r->cp);
    fprintf(f, "batch: global %d = micro_batch %d x %d micro-batches x dp %d | %d tokens/step\n",
            r->global_batch, r->micro_batch, r->n_micro, r->dp, r->global_batch * mc->seq_len);
    if (mc->moe_experts > 0)
        print_expert_memory(f, cfg, r);
    if (mc->moe_experts > 0 && cfg->topology.ep > 1)
        print_expert_parallel(f, cfg, r);
    if (mc->moe_experts > 0 && r->tp > 1)
        print_expert_tensor_parallel(f, r);
    fprintf(f,
            "bytes per element: weights %d, gradients %d, activations %d, optimizer state 4 "
            "(%s backend, %s; %s)\n\n",
            r->elem_param, r->elem_grad, r->elem_act,
            cfg->backend == BACKEND_CUDA ? "cuda" : "cpu reference",
            config_precision_name(cfg->training.precision),
            c->bf16_storage ? "--storage bf16: as Megatron-LM stores a bf16 run"
                            : "as trident allocates today; --storage bf16 for 2-byte storage");
}

static void print_memory(FILE *f, const PlanResult *r)
{
    fprintf(f, "memory per GPU (GiB), most loaded rank of each pipeline stage:\n");
    fprintf(f, "  stage layers in-flight   params    grads optimizer  buffers activations  "
               "scratch  reserve    total\n");
    for (int k = 0; k < r->pp; k++) {
        const PlanStage *s = &r->st[k];
        fprintf(f, "  %5d %6d %9d %8.2f %8.2f %9.2f %8.2f %11.2f %8.2f %8.2f %8.2f%s\n", k,
                s->layers, s->inflight, s->params / GIB, s->grads / GIB, s->optimizer / GIB,
                s->buffers / GIB, s->activations / GIB, s->scratch / GIB, s->reserve / GIB,
                s->total / GIB, k == r->worst ? "  <- most" : "");
    }
    const PlanStage *w = &r->st[r->worst];
    if (w->frozen > 0)
        fprintf(f,
                "lora: params hold the frozen base (%.2f GiB, no gradients, no optimizer "
                "state) and the adapters (%.4f GiB); grads and optimizer are the adapters'\n",
                w->frozen / GIB, (w->params - w->frozen) / GIB);
    if (w->host_ckpt > 0)
        fprintf(f,
                "host memory per rank, beside the table: checkpoint snapshot %.2f GiB "
                "(checkpoint.async, or a GPU's host copies)\n",
                w->host_ckpt / GIB);
    if (r->offload)
        fprintf(f,
                "offload (topology.offload: %s): the optimizer state in host memory, "
                "%.2f GiB per rank (fp32 master weights, Adam m and v, gradient staging%s);\n"
                "  host memory per node %.2f of %.2f GiB (its ranks' offloaded state and "
                "checkpoint copies)\n",
                r->offload == OFFLOAD_PARAMS ? "optimizer+params" : "optimizer",
                w->host_optimizer / GIB,
                r->offload == OFFLOAD_PARAMS ? "; the weights' shard is among them" : "",
                r->host_node / GIB, r->host_capacity / GIB);
    const int device_fits = w->total <= r->capacity;
    if (r->fits)
        fprintf(f,
                "fits: the most loaded GPU (stage %d) needs %.2f of %.2f GiB (%.2f GiB free)\n\n",
                r->worst, w->total / GIB, r->capacity / GIB, (r->capacity - w->total) / GIB);
    else if (device_fits) /* offload: the host is what does not fit */
        fprintf(f,
                "DOES NOT FIT: the GPUs do (stage %d needs %.2f of %.2f GiB), but a node's host "
                "memory needs %.2f GiB, more than its %.2f GiB\n\n",
                r->worst, w->total / GIB, r->capacity / GIB, r->host_node / GIB,
                r->host_capacity / GIB);
    else
        fprintf(f,
                "DOES NOT FIT: stage %d needs %.2f GiB, %.2f GiB (%.0f%%) more than the "
                "%.2f GiB of a GPU\n\n",
                r->worst, w->total / GIB, (w->total - r->capacity) / GIB,
                100 * (w->total - r->capacity) / r->capacity, r->capacity / GIB);
}

static void print_comm(FILE *f, const PlanResult *r)
{
    fprintf(f,
            "communication per GPU per step (the busiest stage; bytes sent, ring algorithms):\n");
    print_bytes_row(f, "tp", r->tp, r->tp_link, r->tp_bytes,
                    r->sp ? "all-gather/reduce-scatter per layer" : "all-reduce per layer");
    print_bytes_row(f, "pp", r->pp, r->pp_link, r->pp_bytes, "activations and their gradients");
    print_bytes_row(f, r->cp > 1 ? "dp x cp" : "dp", r->dp * r->cp, r->dp_link, r->dp_bytes,
                    r->zero <= 1 ? "gradient buckets (+ parameter all-gather with zero 1)"
                                 : "per-micro-batch reduce-scatter (+ gathers)");
    if (r->embed_bytes > 0)
        print_bytes_row(f, "embed", 2, r->pp_link, r->embed_bytes, "tied embedding all-reduce");
    if (r->cp > 1)
        print_bytes_row(f, "cp", r->cp, r->cp_link, r->cp_bytes,
                        "K/V all-gathers (2) and gradient reduce-scatter per layer");
}

static void print_time(FILE *f, const PlanCluster *c, const PlanResult *r)
{
    double t_c = 0, t_tp = 0, t_p2p = 0, t_cp = 0, t_cp_all = 0, t_ep = 0;
    for (int k = 0; k < r->pp; k++)
        if (r->st[k].t_mb > t_c + t_tp + t_p2p + t_cp + t_ep) {
            t_c = r->st[k].t_compute;
            t_tp = r->st[k].t_tp;
            t_p2p = r->st[k].t_p2p;
            t_cp = r->st[k].t_cp;
            t_cp_all = r->st[k].t_cp_total;
            t_ep = r->st[k].t_ep;
        }
    fprintf(f,
            "\ntime per micro-batch (slowest stage): compute %.2f ms, TP %.2f ms, PP p2p %.2f ms",
            1e3 * t_c, 1e3 * t_tp, 1e3 * t_p2p);
    if (r->cp > 1)
        fprintf(f, ", CP %.2f ms exposed of %.2f (the all-gathers beside the local blocks)",
                1e3 * t_cp, 1e3 * t_cp_all);
    if (r->ep_link != LINK_NONE)
        fprintf(f, ", EP all-to-all %.2f ms (%s)", 1e3 * t_ep, plan_link_name(r->ep_link));
    fputc('\n', f);
    fprintf(f, "pipeline bubble: %.1f%% of the pipeline phase (pp %d, %d micro-batches, v %d)\n",
            100 * r->bubble, r->pp, r->n_micro, r->virtual_stages);
    fprintf(f, "step: %.3f s = pipeline %.3f + DP exposed and optimizer %.3f + embedding %.3f\n",
            r->t_step, r->t_pipe, r->t_dp_exposed, r->t_embed);
    if (r->offload) {
        const PlanStage *w = &r->st[r->worst];
        fprintf(f,
                "offload: optimizer %.3f s a step = PCIe %.3f s (%.2f GiB: gradients down, "
                "weights up%s, at %.0f GB/s x %.2f) + AdamW on the host %.3f s (8 fp32 passes at "
                "%.0f GB/s shared by a node's ranks)\n",
                w->t_optimizer, w->t_pcie, w->pcie_bytes_step / GIB,
                r->offload == OFFLOAD_PARAMS ? " in every ZeRO-3 gather" : "", c->pcie_gbps,
                c->comm_efficiency, w->t_host_adamw, c->host_memory_gbps);
    }
    fprintf(f, "throughput: %.0f tokens/s | %.1f TFLOP/s per GPU (model FLOPs) | MFU %.1f%%\n",
            r->tokens_per_s, r->tflops_per_gpu, 100 * r->mfu);
    fprintf(f,
            "assumes: compute at gemm_efficiency %.2f of the %.0f TFLOP/s peak, the figure "
            "fitted to\n  Megatron-LM's published runs (docs/plan.md); trident's CUDA backend "
            "is far below it today\n  (GPT-2 124M on one H200: 3.5%% MFU, 0.13 of llm.c; "
            "docs/cuda.md)\n",
            c->gemm_efficiency, c->peak_tflops);
}

void plan_print(FILE *f, const Config *cfg, const PlanCluster *c, const PlanResult *r)
{
    print_layout(f, cfg, c, r);
    print_memory(f, r);
    print_comm(f, r);
    print_time(f, c, r);
}

static void print_json(FILE *f, const PlanCluster *c, const PlanResult *r)
{
    fprintf(f, "{\"gemm_efficiency\": %.6g, \"elem_param\": %d, \"elem_act\": %d, ",
            c->gemm_efficiency, r->elem_param, r->elem_act);
    fprintf(f,
            "\"tp\": %d, \"pp\": %d, \"dp\": %d, \"zero\": %d, \"micro_batch\": %d, "
            "\"n_micro\": %d, \"fits\": %s, \"capacity\": %.0f, \"worst\": %d, \"offload\": %s, "
            "\"host_node\": %.0f, "
            "\"step_s\": %.6g, \"tokens_per_s\": %.6g, \"mfu\": %.6g, "
            "\"model_flops_step\": %.17g, \"stages\": [",
            r->tp, r->pp, r->dp, r->zero, r->micro_batch, r->n_micro, r->fits ? "true" : "false",
            r->capacity, r->worst, r->offload ? "true" : "false", r->host_node, r->t_step,
            r->tokens_per_s, r->mfu, r->model_flops_step);
    for (int k = 0; k < r->pp; k++) {
        const PlanStage *s = &r->st[k];
        fprintf(
            f,
            "%s{\"layers\": %d, \"inflight\": %d, \"params\": %.0f, \"grads\": %.0f, "
            "\"optimizer\": %.0f, \"buffers\": %.0f, \"activations\": %.0f, "
            "\"scratch\": %.0f, \"total\": %.0f, \"host_ckpt\": %.0f, \"host_optimizer\": %.0f, "
            "\"pcie_bytes_step\": %.0f, \"flops_mb\": %.17g, "
            "\"gemm_flops_mb\": %.17g, \"tp_bytes_mb\": %llu, \"moe_tp_bytes_mb\": %llu, "
            "\"ep_bytes_mb\": %.0f, \"t_ep_mb\": %.9g, "
            "\"kv_bytes_mb\": %llu, \"pp_bytes_step\": %llu, \"dp_bytes_step\": %llu, \"embed_bytes_step\": %llu}",
            k ? ", " : "", s->layers, s->inflight, s->params, s->grads, s->optimizer, s->buffers,
            s->activations, s->scratch, s->total, s->host_ckpt, s->host_optimizer,
            s->pcie_bytes_step, s->flops, s->gemm_flops, (unsigned long long)s->tp_bytes_mb,
            (unsigned long long)s->moe_tp_bytes_mb, s->ep_bytes_mb, s->t_ep,
            (unsigned long long)s->kv_bytes_mb, (unsigned long long)s->pp_bytes_step,
            (unsigned long long)s->dp_bytes_step, (unsigned long long)s->embed_bytes_step);
    }
    fprintf(f, "]}\n");
}

static void print_search(const Config *cfg, const PlanCluster *c, int top)
{
    PlanCandidate *best = calloc((size_t)top, sizeof *best);
    if (!best)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory for %d candidates", top);
    int fit, tried;
    const int n = plan_search(cfg, c, best, top, &fit, &tried);
    printf("cluster: %s, %d node(s) x %d GPUs (%d GPUs), %.0f GiB each\n", c->name, c->nodes,
           c->gpus_per_node, cluster_gpus(c), c->gpu_memory_gib);
    printf("model: %s, %d layers, hidden %d, seq %d, global batch %d: %.2f B parameters\n",
           config_arch_name(cfg->model.arch), cfg->model.layers, cfg->model.hidden,
           cfg->model.seq_len, cfg->training.global_batch,
           1e-9 * (double)params_count_real(&cfg->model));
    printf("search: %d valid layouts evaluated, %d fit; best %d by estimated tokens/s:\n\n", tried,
           fit, n < top ? n : top);
    const int cp = plan_search_cp(cfg);       /* a cp column, for long sequences */
    const int off = plan_search_offload(cfg); /* an offload column, for GPUs */
    printf("  #  tp  pp   dp%s zero%s mb  v recompute  GiB/GPU   step s   tokens/s    MFU  why\n",
           cp ? "  cp" : "", off ? " offload          " : "");
    for (int i = 0; i < n; i++) {
        const PlanResult *r = &best[i].r;
        char cpcol[16] = "";
        if (cp)
            snprintf(cpcol, sizeof cpcol, " %3d", r->cp);
        const char *offcol = !off                              ? ""
                             : r->offload == OFFLOAD_PARAMS    ? " optimizer+params"
                             : r->offload == OFFLOAD_OPTIMIZER ? " optimizer       "
                                                               : " none            ";
        printf("%3d %3d %3d %4d%s %4d%s %2d %2d %-9s %8.1f %8.3f %10.0f %5.1f%%  %s%s\n", i + 1,
               r->tp, r->pp, r->dp, cpcol, r->zero, offcol, r->micro_batch, r->virtual_stages,
               recompute_name(r->recompute), r->st[r->worst].total / GIB, r->t_step,
               r->tokens_per_s, 100 * r->mfu, r->fits ? "" : "DOES NOT FIT: ", best[i].why);
    }
    free(best);
}

/* The default cluster: this machine's class for the CPU backend, else
 * enough A100 80 GB nodes for the world. */
static void default_cluster(const Config *cfg, int world, PlanCluster *c)
{
    char err[CFG_ERR];
    const int cpu = cfg->backend == BACKEND_CPU;
    TRD_ASSERT(cluster_preset(cpu ? "cpu" : "a100-80gb", c, err) == 0);
    if (cpu) {
        c->gpus_per_node = world > 0 ? world : 1;
    } else {
        c->nodes = world > 8 ? (world + 7) / 8 : 1;
        if (world < 8 && world > 0)
            c->gpus_per_node = world;
    }
}

int plan_main(int argc, char **argv)
{
    Args a;
    if (parse_args(argc, argv, &a))
        return TRD_EXIT_OK;
    Config cfg;
    char err[CFG_ERR];
    if (cli_read_config(&cfg, &a.cli, -1, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);

    PlanCluster c;
    if (a.cluster && cluster_load(a.cluster, &c, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, "see docs/plan.md for the cluster keys and presets", "%s", err);
    const TopologyConfig *t = &cfg.topology;
    int world = t->dp > 0 ? t->tp * t->pp * t->cp * t->dp : 0;
    if (a.search && !a.cluster)
        trd_fatal(TRD_EXIT_INPUT, "e.g. --cluster a100-80gb:16x8",
                  "--search needs --cluster: it lays out the whole cluster");
    if (a.search || (!world && a.cluster))
        world = cluster_gpus(&c);
    if (!world) { /* dp auto and no cluster: the one data-parallel replica of tp x pp */
        world = t->tp * t->pp * t->cp;
        fprintf(stderr,
                "plan: topology.dp is auto and no --cluster: planning dp 1 (%d ranks); "
                "give --cluster or --set topology.dp=N for another world\n",
                world);
    }
    if (!a.cluster)
        default_cluster(&cfg, world, &c);
    c.bf16_storage = a.bf16_storage;
    if (world > cluster_gpus(&c))
        trd_fatal(TRD_EXIT_INPUT, "give a larger --cluster (PRESET:NODESxGPUS) or a smaller layout",
                  "the layout needs %d GPUs; cluster %s has %d", world, c.name, cluster_gpus(&c));
    if (cfg.topology.ranks_per_node == 0)
        cfg.topology.ranks_per_node = c.gpus_per_node < world ? c.gpus_per_node : world;
    if (config_validate(&cfg, a.search ? 0 : world, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);

    if (a.search) {
        print_search(&cfg, &c, a.top);
        return TRD_EXIT_OK;
    }
    PlanResult r;
    if (plan_evaluate(&cfg, &c, &r, err) != 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    if (a.json) {
        print_json(stdout, &c, &r);
        return TRD_EXIT_OK;
    }
    printf("trident plan: %s\n", a.cli.config_path);
    plan_print(stdout, &cfg, &c, &r);
    if (!r.fits) {
        PlanCluster same = c;
        same.nodes = (world + c.gpus_per_node - 1) / c.gpus_per_node;
        char hint[512];
        if (plan_suggest(&cfg, &same, hint, sizeof hint) == 0) {
            printf("what fits on %d GPUs: %s\n", cluster_gpus(&same), hint);
        } else { /* nothing on this many GPUs: the smallest power-of-two multiple that fits */
            printf("what fits on %d GPUs: nothing (%s)\n", cluster_gpus(&same), hint);
            for (int k = 0; k < 7; k++) {
                same.nodes *= 2;
                if (plan_suggest(&cfg, &same, hint, sizeof hint) == 0) {
                    printf("smallest %s cluster that fits: %d node(s) x %d GPUs: %s\n", c.name,
                           same.nodes, same.gpus_per_node, hint);
                    break;
                }
            }
        }
    }
    return TRD_EXIT_OK;
}
