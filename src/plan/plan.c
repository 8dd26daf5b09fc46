/* plan.c — memory, communication and time of one layout (plan.h).
 *
 * Per pipeline rank: build the rank's shard as the trainer does
 * (pp_rank_shard), ask the ZeRO engine and the model what they would allocate
 * and send, the schedule how many micro-batches are in flight, then turn
 * element counts into device bytes and bytes into seconds with the
 * cluster's figures.  The time model (docs/plan.md) is deliberately simple:
 * GEMMs at a fixed fraction of peak, tensor-parallel collectives exposed,
 * data-parallel reduction overlapped with one micro-batch's backward, the
 * pipeline bubble of the schedule. */
#include "plan/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/layout.h"
#include "core/error.h"
#include "model/model.h"
#include "model/params.h"
#include "pipeline_par/executor.h"
#include "pipeline_par/pp_schedule.h"
#include "zero/zero.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

const char *plan_link_name(PlanLink l)
{
    return l == LINK_NVLINK ? "in-node" : l == LINK_NETWORK ? "network" : "-";
}

/* src/comm's rule: bytes one rank sends for `passes` ring passes over n
 * floats of a group of p (all-reduce 2, reduce-scatter / all-gather 1). */
static uint64_t ring(uint64_t n, int passes, int p)
{
    return p <= 1 ? 0 : (uint64_t)passes * n * 4u * (uint64_t)(p - 1) / (uint64_t)p;
}

/* ---- layout and links ------------------------------------------------------ */

/* topology.cp, 1 in a config built by hand without it. */
static int cp_of(const TopologyConfig *t) { return t->cp > 1 ? t->cp : 1; }

/* Ranks between neighbours of a group in topology.order ("tp-dp-pp": TP
 * fastest): the product of the sizes of the dimensions before it. */
static int group_stride(const TopologyConfig *t, const char *dim)
{
    int stride = 1;
    for (const char *o = t->order; *o; o += o[2] ? 3 : 2) {
        if (!strncmp(o, dim, 2))
            return stride;
        /* the dp axis holds dp x cp ranks, cp its fastest part */
        stride *= !strncmp(o, "tp", 2) ? t->tp : !strncmp(o, "dp", 2) ? t->dp * cp_of(t) : t->pp;
        if (!o[2])
            break;
    }
    return stride;
}

/* A group of `size` ranks `stride` apart sits on one node when its span does. */
static PlanLink group_link(const TopologyConfig *t, const char *dim, int size, int gpn)
{
    if (size <= 1)
        return LINK_NONE;
    return (long long)group_stride(t, dim) * (size - 1) < gpn ? LINK_NVLINK : LINK_NETWORK;
}

static double link_bw(const PlanCluster *c, PlanLink l)
{
    double g = l == LINK_NETWORK ? c->network_gbps : c->nvlink_gbps;
    return g * 1e9 * c->comm_efficiency;
}

static double link_lat(const PlanCluster *c, PlanLink l)
{
    return 1e-6 * (l == LINK_NETWORK ? c->network_latency_us : c->nvlink_latency_us);
}

/* Seconds for `calls` collectives moving `bytes` from this rank over link l. */
static double comm_time(const PlanCluster *c, PlanLink l, double bytes, double calls, int p)
{
    if (l == LINK_NONE || bytes <= 0)
        return 0;
    return calls * (p > 1 ? p - 1 : 1) * link_lat(c, l) + bytes / link_bw(c, l);
}

/* ---- tensor parallelism: what the TP communicator counts per micro-batch ----
 * One entry per collective the model issues (model.c, tensor_par.h; the
 * same list bench/bench_tp.c checks against a real run). */
typedef struct {
    uint64_t tp, kv;
    uint64_t moe; /* of tp: MoE's routing-weight gradients */
    double calls;
} TpCount;

/* MoE layers held (every chunk of the shard). */
static int shard_moe_layers(const ModelConfig *mc, const ParamShard *sh)
{
    int n = 0;
    for (int c = 0; c < sh->n_chunks; c++)
        for (int l = sh->chunk[c].begin; l < sh->chunk[c].end; l++)
            n += config_moe_layer(mc, l);
    return n;
}

static TpCount tp_per_microbatch(const Config *cfg, const ParamShard *sh)
{
    const ModelConfig *mc = &cfg->model;
    const int p = sh->tp, sp = cfg->topology.sequence_parallel && p > 1;
    const int gpt2 = mc->arch == ARCH_GPT2;
    const uint64_t N = (uint64_t)cfg->training.micro_batch * (uint64_t)mc->seq_len;
    const uint64_t C = (uint64_t)mc->hidden, NC = N * C, T = (uint64_t)mc->seq_len;
    TpCount r = {0};
    if (p == 1)
        return r;
    const uint64_t bound = sp ? ring(NC, 1, p) : ring(NC, 2, p); /* one b*s*h boundary */
    const int L = params_shard_layers(sh);
    /* Per layer: forward and backward each cross two boundaries (all-reduces);
     * with SP each is an all-gather plus a reduce-scatter, the same bytes.  SP leaves the norms' weight gradients
     * partial (all-reduced over TP); full recompute reruns the attention
     * half of the forward's collectives (and, with SP, both norm gathers). */
    uint64_t layer = sp ? 8 * bound : 4 * bound, calls = sp ? 8 : 4;
    if (sp) {
        layer += (uint64_t)(gpt2 ? 4 : 2) * ring(C, 2, p);
        calls += gpt2 ? 4 : 2;
    }
    if (cfg->training.recompute == RECOMPUTE_FULL) {
        layer += sp ? 3 * ring(NC, 1, p) : ring(NC, 2, p);
        calls += sp ? 3 : 1;
    }
    r.tp = (uint64_t)L * layer;
    r.calls = (double)L * (double)calls;
    /* Replicated kv heads: their rows' gradients are summed over the ranks
     * sharing them, on a sub-group. */
    const int kv_share = mc->kv_heads % p ? p / mc->kv_heads : 1;
    if (kv_share > 1) {
        const uint64_t hs = C / (uint64_t)mc->heads;
        r.kv =
            (uint64_t)L * (ring(2 * hs * C, 2, kv_share) + (gpt2 ? ring(2 * hs, 2, kv_share) : 0));
    }
    if (sh->has_embed) { /* vocabulary-parallel lookup; GPT-2's wpe gradient is partial */
        r.tp += bound + (sp ? ring(NC, 1, p) : 0) + (gpt2 ? ring(T * C, 2, p) : 0);
        r.calls += 1 + sp + gpt2;
    }
    /* MoE (moe.c): the experts' outputs are partial sums over TP, so is the
     * routing weights' gradient dot(dout, x_out); each MoE layer's backward
     * all-reduces it, N x top_k floats (N the micro-batch's rows, whole on
     * every rank, SP or not).  The rest of the branch crosses the dense
     * MLP's boundaries, counted above; recompute stops before them. */
    const int moe = shard_moe_layers(mc, sh);
    if (moe > 0) {
        r.moe = (uint64_t)moe * ring(N * (uint64_t)mc->moe_top_k, 2, p);
        r.tp += r.moe;
        r.calls += moe;
    }
    if (sh->has_head) { /* head input gathered (SP); cross-entropy max and sums */
        r.tp += (sp ? ring(NC, 1, p) : 0) + ring(N, 2, p) + ring(2 * N, 2, p);
        r.tp += bound + (sp ? (uint64_t)(gpt2 ? 2 : 1) * ring(C, 2, p) : 0);
        r.calls += 4 + (sp ? 1 + (gpt2 ? 2 : 1) : 0);
    }
    return r;
}

/* ---- FLOPs from the parameter table ------------------------------------------ */

typedef struct {
    double block_fwd;     /* 2 * rows * (layer weights in matrix multiplies), this rank */
    double head_fwd;      /* 2 * rows * (head rows held) * hidden */
    double attn_fwd;      /* scores and weighted sum, this rank's heads */
    double last_proj_fwd; /* the MLP output projection (full recompute skips it) */
} StageFlops;

static StageFlops stage_flops(const Config *cfg, const ParamShard *sh)
{
    const ModelConfig *mc = &cfg->model;
    ParamTable t;
    params_build_base(&t, mc, sh); /* the model's weights, LoRA's frozen base included */
    /* this rank's rows: 1/cp of each sequence, each row attending to as
     * many keys on average as without cp (the chunks are balanced) */
    const double N = (double)cfg->training.micro_batch * mc->seq_len / cp_of(&cfg->topology);
    double block = 0, proj = 0, head = 0;
    for (int i = 0; i < t.n; i++) {
        const ParamSpec *p = &t.p[i];
        if (p->role != ROLE_BLOCK || p->ndim != 2)
            continue;
        block += (double)p->numel;
        if (strstr(p->name, "mlp.proj.weight") || strstr(p->name, "mlp.down.weight"))
            proj += (double)p->numel;
    }
    if (sh->has_head) { /* the head multiplies by head.weight, or by wte when tied */
        const ParamSpec *h = params_find(&t, "head.weight");
        if (!h)
            h = params_find(&t, "embed.wte.weight");
        head = h ? (double)h->numel : 0;
    }
    const double local_width = (double)mc->hidden / sh->tp; /* heads * head size held */
    StageFlops f = {.block_fwd = 2 * N * block,
                    .head_fwd = 2 * N * head,
                    .attn_fwd = params_shard_layers(sh) * 4.0 * N * mc->seq_len * local_width,
                    .last_proj_fwd = 2 * N * proj};
    params_free(&t);
    return f;
}

/* ---- one pipeline rank --------------------------------------------------------- */

/* Activation sets each chunk holds at peak: what the schedule needs
 * (pp_stage.c sizes the model's sets the same way); one without a pipeline. */
static int chunk_slots(const Config *cfg, int pp_rank, int n_micro, int chunk, char err[CFG_ERR])
{
    const TopologyConfig *t = &cfg->topology;
    if (t->pp == 1)
        return 1;
    PpSchedule s;
    if (pp_schedule_build(&s, t->schedule, t->pp, pp_rank, n_micro, t->virtual_stages, err) != 0)
        return -1;
    int n = pp_schedule_chunk_slots(&s, chunk);
    pp_schedule_free(&s);
    return n;
}

/* Elements of one activation message between stages: the residual stream
 * rows a rank holds (a 1/tp block of them under sequence parallelism). */
static uint64_t stream_elems(const Config *cfg)
{
    const TopologyConfig *t = &cfg->topology;
    const uint64_t N =
        (uint64_t)cfg->training.micro_batch * (uint64_t)cfg->model.seq_len / (uint64_t)cp_of(t);
    const int sp = t->sequence_parallel && t->tp > 1;
    return (sp ? N / (uint64_t)t->tp : N) * (uint64_t)cfg->model.hidden;
}

/* Memory: what the engine and the chunk models would allocate (fp32 on the
 * CPU reference), scaled to the device's element sizes. */
static int stage_memory(const Config *cfg, const PlanCluster *c, const PlanResult *r, int rank,
                        const ParamShard *sh, PlanStage *st, char err[CFG_ERR])
{
    const ZeroMemory zm =
        zero_plan_memory(cfg, sh, cfg->topology.dp * cp_of(&cfg->topology), 0); /* dp x cp */
    double acts = 0, scratch = 0;
    for (int k = 0; k < sh->n_chunks; k++) {
        const ParamShard one = params_chunk_shard(sh, k);
        const int sets = chunk_slots(cfg, rank, r->n_micro, k, err);
        if (sets < 0)
            return -1;
        st->inflight += sets;
        /* --storage bf16 halves every activation below, so it starts from
         * the all-fp32 sizes, not from those of trident's bf16 runs, which
         * already keep the GEMM-only activations in bf16 (model.c,
         * model_x16_ok) */
        Config sized = *cfg;
        if (r->elem_act == 2)
            sized.training.precision = PREC_FP32;
        const MemoryReport mm = model_plan_memory(&sized, &one, cfg->training.micro_batch, sets);
        acts += (double)mm.activations;
        if (cfg->topology.pp > 1 && pp_stage(cfg->topology.pp, rank, k) > 0)
            acts += (double)sets * (double)stream_elems(cfg) * 4; /* pp_stage_memory's messages */
        scratch += (double)mm.scratch;
        if (cfg->model.lora.rank > 0) { /* the frozen base each chunk model holds */
            ParamTable base;
            params_build_base(&base, &cfg->model, &one);
            /* bf16 storage (model.lora.base_dtype): what the model allocates */
            st->frozen += cfg->model.lora.base_dtype == LORA_BASE_BF16
                              ? (double)model_frozen_bytes(&cfg->model, &one)
                              : (double)base.numel * r->elem_param;
            params_free(&base);
        }
    }
    st->params = (double)zm.params * r->elem_param / 4 + st->frozen;
    st->grads = (double)zm.grads * r->elem_grad / 4;
    st->optimizer = (double)zm.optimizer;
    st->buffers = (double)zm.buffers * r->elem_param / 4;
    st->activations = acts * r->elem_act / 4;
    st->scratch = scratch * r->elem_act / 4;
    st->reserve = c->reserve_gib * GIB;
    const CheckpointConfig *ck = &cfg->checkpoint;
    const int host_copy = cfg->backend == BACKEND_CUDA || ck->async != ASYNC_OFF;
    st->host_optimizer = (double)zm.host_optimizer;
    /* The checkpoint's host copy of the optimizer state: m, v and bf16's
     * master weights (offload keeps fp32's master and a staging buffer
     * beside them, 4 of host_optimizer's elements, which it does not save). */
    const double ckpt_optimizer =
        cfg->topology.offload != OFFLOAD_NONE
            ? (double)zm.host_optimizer / 4 * (cfg->training.precision == PREC_BF16 ? 3 : 2)
            : (double)zm.optimizer;
    /* optimizer+params: the weights' shard is in host_optimizer's buffers
     * (zm.params is 0), and the checkpoint copies it all the same */
    const double ckpt_params =
        cfg->topology.offload == OFFLOAD_PARAMS ? (double)zm.host_optimizer / 4 : (double)zm.params;
    st->host_ckpt = ck->dir[0] && host_copy ? ckpt_params + ckpt_optimizer : 0;
    st->total = st->params + st->grads + st->optimizer + st->buffers + st->activations +
                st->scratch + st->reserve;
    return 0;
}

/* Expert parallelism (docs/moe.md): the bytes one rank sends in one MoE
 * layer's all-to-alls, one micro-batch.  Its N x top_k rows go out and
 * come back in forward (dispatch, combine) and again in backward (their
 * gradients), a third time in forward under full recompute; with balanced
 * routing (ep - 1) / ep of them leave the rank, C fp32 each. */
double plan_ep_bytes_layer(const Config *cfg, const PlanResult *r)
{
    const ModelConfig *mc = &cfg->model;
    const int ep = cfg->topology.ep;
    if (ep <= 1 || mc->moe_experts <= 0)
        return 0;
    const double rows = (double)r->micro_batch * mc->seq_len * mc->moe_top_k * (ep - 1) / ep;
    return rows * mc->hidden * sizeof(float) * plan_ep_exchanges(r);
}

int plan_ep_exchanges(const PlanResult *r) { return r->recompute == RECOMPUTE_FULL ? 6 : 4; }

/* Communication in src/comm's rule. */
static void stage_comm(const Config *cfg, const PlanResult *r, int rank, const ParamShard *sh,
                       PlanStage *st)
{
    const TopologyConfig *t = &cfg->topology;
    const TpCount tc = tp_per_microbatch(cfg, sh);
    st->tp_bytes_mb = tc.tp;
    st->kv_bytes_mb = tc.kv;
    st->moe_tp_bytes_mb = tc.moe;
    st->moe_layers = shard_moe_layers(&cfg->model, sh);
    st->ep_bytes_mb = plan_ep_bytes_layer(cfg, r) * st->moe_layers;
    if (t->pp > 1) { /* every (micro-batch, chunk) sends its output and input gradient,
                      * except out of the last model stage and into the first */
        uint64_t sends = 2 * (uint64_t)t->virtual_stages - (rank == t->pp - 1) - (rank == 0);
        st->pp_bytes_step = sends * (uint64_t)r->n_micro * stream_elems(cfg) * 4u;
    }
    /* The trainer all-reduces over DP the step's loss and, on the stages
     * that read the batch (all with data.document_mask), the count of its
     * targets (one double each), and the ZeRO engine the rest
     * (zero_plan_step_bytes). */
    const int D = t->dp * cp_of(t); /* gradients and ZeRO shards over dp x cp */
    const int reads_batch =
        t->pp == 1 || cfg->data.document_mask || cp_of(t) > 1 || rank == 0 || rank == t->pp - 1;
    st->dp_bytes_step = zero_plan_step_bytes(cfg, sh, D, r->n_micro) + ring(2, 2, D) +
                        (reads_batch ? ring(2, 2, D) : 0);
    /* Context parallelism (context_par/cp_attention.h): per layer and
     * micro-batch an all-gather of the rank's qkv rows forward, and in
     * backward an all-gather again and a reduce-scatter of their gradients:
     * 3 (cp-1) n floats, n = the rank's rows x its qkv width; the last
     * layer's backward finds its rows still gathered when nothing ran
     * between (pp 1, no recompute). */
    if (cp_of(t) > 1) {
        const int cp = cp_of(t), H = cfg->model.heads / t->tp;
        const int KVH = cfg->model.kv_heads % t->tp ? 1 : cfg->model.kv_heads / t->tp;
        const uint64_t n = (uint64_t)cfg->training.micro_batch * (uint64_t)cfg->model.seq_len /
                           (uint64_t)cp * (uint64_t)(H + 2 * KVH) *
                           (uint64_t)(cfg->model.hidden / cfg->model.heads);
        const int held = t->pp == 1 && cfg->training.recompute == RECOMPUTE_NONE;
        st->cp_bytes_mb = (3 * (uint64_t)params_shard_layers(sh) - (uint64_t)held) *
                          ring(n * (uint64_t)cp, 1, cp);
    }
    if (cfg->model.tie_embeddings && t->pp > 1 && (sh->has_embed || sh->has_head)) {
        ParamTable tab;
        params_build(&tab, &cfg->model, sh);
        const ParamSpec *w = params_find(&tab, "embed.wte.weight");
        st->embed_bytes_step = w ? ring(w->numel, 2, 2) : 0;
        params_free(&tab);
    }
}

/* Time of one micro-batch on this rank: compute, then the exposed TP
 * collectives and pipeline sends. */
static void stage_microbatch_time(const Config *cfg, const PlanCluster *c, const PlanResult *r,
                                  const ParamShard *sh, PlanStage *st)
{
    const TopologyConfig *t = &cfg->topology;
    const StageFlops f = stage_flops(cfg, sh);
    /* Backward is twice the forward.  Full recompute reruns each layer's
     * forward but its last projection; selective reruns attention (model.c). */
    const double fwd = f.block_fwd + f.head_fwd + f.attn_fwd;
    double extra = 0;
    if (cfg->training.recompute == RECOMPUTE_FULL)
        extra = f.block_fwd + f.attn_fwd - f.last_proj_fwd;
    else if (cfg->training.recompute == RECOMPUTE_SELECTIVE)
        extra = f.attn_fwd;
    st->gemm_flops = 3 * (f.block_fwd + f.head_fwd);
    st->flops = 3 * fwd + extra;
    st->t_compute = st->flops / (c->peak_tflops * 1e12 * c->gemm_efficiency);
    const TpCount tc = tp_per_microbatch(cfg, sh);
    st->t_tp = comm_time(c, r->tp_link, (double)(tc.tp + tc.kv) * r->elem_act / 4, tc.calls, t->tp);
    if (t->pp > 1)
        st->t_p2p = 2.0 * t->virtual_stages *
                    comm_time(c, r->pp_link, (double)stream_elems(cfg) * r->elem_act, 1, 2);
    /* The cp exchange, per layer: each all-gather runs beside the attention
     * blocks whose keys the rank holds, 3 of its 2cp + 1 (forward, and the
     * backward's at twice the work), and is exposed only beyond them; the
     * reduce-scatter of the gradients is exposed whole. */
    const int layers = params_shard_layers(sh), cp = cp_of(t);
    if (cp > 1 && layers > 0) {
        const int held = t->pp == 1 && cfg->training.recompute == RECOMPUTE_NONE;
        const int calls = 3 * layers - held; /* as stage_comm counts the bytes */
        const double one =
            comm_time(c, r->cp_link, (double)st->cp_bytes_mb / calls * r->elem_act / 4, 1, cp);
        const double local =
            3.0 / (2 * cp + 1) * f.attn_fwd / layers / (c->peak_tflops * 1e12 * c->gemm_efficiency);
        const int regathers = calls - 2 * layers; /* the backward's all-gathers */
        st->t_cp_total = one * calls;
        st->t_cp = layers * (fmax(one - local, 0) + one) + regathers * fmax(one - 2 * local, 0);
    }
    /* The all-to-alls block the layer (the experts wait for their rows),
     * each exchanging with ep - 1 ranks. */
    st->t_ep = comm_time(c, r->ep_link, st->ep_bytes_mb,
                         (double)plan_ep_exchanges(r) * st->moe_layers, t->ep);
    st->t_mb = st->t_compute + st->t_tp + st->t_p2p + st->t_cp + st->t_ep;
}

/* Data parallelism and the optimizer, once a step.  Stages 0-1 reduce once,
 * overlapped with the last micro-batch's backward (a tenth stays exposed:
 * the last bucket); stages 2-3 reduce-scatter (stage 3 also gathers) every
 * micro-batch, overlapped with its compute; stages 1-2 all-gather the
 * parameters after the step, exposed.  AdamW reads and writes its shard of
 * weights, gradients and state once. */
static void stage_step_time(const Config *cfg, const PlanCluster *c, const PlanResult *r,
                            const ParamShard *sh, PlanStage *st)
{
    const TopologyConfig *t = &cfg->topology;
    ParamTable tab;
    params_build(&tab, &cfg->model, sh);
    const double P = (double)tab.numel;
    params_free(&tab);
    const int D = t->dp * cp_of(t);
    if (D > 1) {
        const double t_dp =
            comm_time(c, r->dp_link, (double)st->dp_bytes_step * r->elem_grad / 4, 4, D);
        const double gather_bytes = (double)ring((uint64_t)P, 1, D) * r->elem_param / 4;
        const double t_gather =
            t->zero == 1 || t->zero == 2 ? comm_time(c, r->dp_link, gather_bytes, 1, D) : 0;
        const double t_red = t_dp - t_gather, t_bwd = st->t_compute * 2 / 3;
        if (t->zero <= 1)
            st->t_dp_exposed = fmax(t_red - t_bwd, t_red * 0.1) + t_gather;
        else
            st->t_dp_exposed = r->n_micro * fmax(t_red / r->n_micro - st->t_compute, 0) + t_gather;
    }
    const double own = t->zero == 0 ? P : ceil(P / D);
    if (t->offload != OFFLOAD_NONE) {
        /* optimizer.c's step, in turn: the owned gradients down, AdamW on
         * the host (it reads the staged gradient, master, m and v and
         * writes master, m, v and the weights: 8 fp32 passes), the weights
         * up.  The node's ranks share its memory bandwidth.  With
         * optimizer+params nothing goes up after the step: each ZeRO-3
         * gather copies the rank's part of its layer up instead, on the
         * compute stream (counted here, not overlapped). */
        const double up = t->offload == OFFLOAD_PARAMS
                              ? (double)zero_plan_host_gather_elems(cfg, sh, D, r->n_micro)
                              : own;
        st->pcie_bytes_step = own * r->elem_grad + up * r->elem_param;
        st->t_pcie = st->pcie_bytes_step / (c->pcie_gbps * 1e9 * c->comm_efficiency);
        const int sharers = c->gpus_per_node < r->world ? c->gpus_per_node : r->world;
        st->t_host_adamw = own * 8 * 4 / (c->host_memory_gbps * 1e9 / sharers);
        st->t_optimizer = st->t_pcie + st->t_host_adamw;
        return;
    }
    st->t_optimizer =
        2 * (st->optimizer + own * (r->elem_param + r->elem_grad)) / (c->hbm_gbps * 1e9);
}

/* Pipeline rank `rank`: the shard the trainer builds for it (pp_rank_shard). */
static int plan_stage(const Config *cfg, const PlanCluster *c, PlanResult *r, int rank,
                      char err[CFG_ERR])
{
    PlanStage *st = &r->st[rank];
    const ParamShard sh = pp_rank_shard(&cfg->model, &cfg->topology, rank, cfg->topology.tp, 0);
    /* What the rank stores: with the experts divided over ep, ep rank 0's
     * (trainer.c); its compute is every layout's (sh). */
    ParamShard held = sh;
    if (config_ep_divides(cfg))
        held.ep = cfg->topology.ep;
    memset(st, 0, sizeof *st);
    st->layers = params_shard_layers(&sh);
    st->has_embed = sh.has_embed;
    st->has_head = sh.has_head;
    if (stage_memory(cfg, c, r, rank, &held, st, err) != 0)
        return -1;
    stage_comm(cfg, r, rank, &held, st);
    stage_microbatch_time(cfg, c, r, &sh, st);
    stage_step_time(cfg, c, r, &held, st);
    return 0;
}

/* ---- the whole layout ---------------------------------------------------------- */

static int check_layout(const Config *cfg, char err[CFG_ERR])
{
    const TopologyConfig *t = &cfg->topology;
    if (t->dp < 1)
        return trd_errorf(err, "topology.dp is auto: give it a number, or plan with --search");
    if (t->pp > CFG_MAX_STAGES)
        return trd_errorf(err, "topology.pp %d: the planner reports at most %d stages", t->pp,
                          CFG_MAX_STAGES);
    /* The layout rules config validation applied (config/layout.h), for
     * a Config a caller built or changed without it (plan_search). */
    LayoutError e;
    if (layout_check(&cfg->model, t, &e) != 0)
        return trd_errorf(err, "%s", e.msg);
    return 0;
}

int plan_evaluate(const Config *cfg, const PlanCluster *c, PlanResult *r, char err[CFG_ERR])
{
    const TopologyConfig *t = &cfg->topology;
    memset(r, 0, sizeof *r);
    if (check_layout(cfg, err) != 0)
        return -1;
    r->tp = t->tp;
    r->pp = t->pp;
    r->dp = t->dp;
    r->zero = t->zero;
    r->micro_batch = cfg->training.micro_batch;
    r->virtual_stages = t->virtual_stages;
    r->sp = t->sequence_parallel && t->tp > 1;
    r->recompute = cfg->training.recompute;
    r->schedule = t->schedule;
    r->cp = cp_of(t);
    r->world = t->tp * t->pp * t->dp * r->cp;
    r->global_batch = cfg->training.global_batch;
    r->n_micro = cfg->training.global_batch / (cfg->training.micro_batch * t->dp);
    /* What the backends allocate today: fp32 weights, gradients and
     * activations whatever the precision (on the CPU bf16 is a rounding of
     * fp32 values; the CUDA backend keeps fp32 buffers and rounds for its
     * bf16 GEMMs), except the activations only GEMMs read, which a bf16
     * run stores in bf16 (model_plan_memory counts them so).  With c->bf16_storage a bf16 run keeps them in 16 bits
     * and the optimizer's master weights and moments in fp32 (ZeRO paper,
     * 2 + 2 + 12 bytes), as Megatron-LM does: the published comparisons. */
    const int half = c->bf16_storage && cfg->training.precision == PREC_BF16;
    r->elem_param = r->elem_grad = r->elem_act = half ? 2 : 4;
    const int gpn = c->gpus_per_node;
    r->tp_link = group_link(t, "tp", t->tp, gpn);
    r->dp_link = group_link(t, "dp", t->dp * r->cp, gpn);
    r->cp_link = group_link(t, "dp", r->cp, gpn); /* the first cp of the dp axis */
    r->pp_link = group_link(t, "pp", t->pp, gpn);
    /* ep consecutive ranks of the dp axis (cp is refused with MoE) */
    r->ep_link = group_link(t, "dp", t->ep, gpn);
    r->capacity = c->gpu_memory_gib * GIB;

    double t_max = 0, dp_opt = 0;
    for (int k = 0; k < t->pp; k++) {
        if (plan_stage(cfg, c, r, k, err) != 0)
            return -1;
        const PlanStage *s = &r->st[k];
        if (s->total > r->st[r->worst].total)
            r->worst = k;
        t_max = fmax(t_max, s->t_mb);
        dp_opt = fmax(dp_opt, s->t_dp_exposed + s->t_optimizer);
        r->tp_bytes = fmax(r->tp_bytes, (double)(s->tp_bytes_mb + s->kv_bytes_mb) * r->n_micro *
                                            r->elem_act / 4);
        r->pp_bytes = fmax(r->pp_bytes, (double)s->pp_bytes_step * r->elem_act / 4);
        r->dp_bytes = fmax(r->dp_bytes, (double)s->dp_bytes_step * r->elem_grad / 4);
        r->cp_bytes = fmax(r->cp_bytes, (double)s->cp_bytes_mb * r->n_micro * r->elem_act / 4);
        r->embed_bytes = fmax(r->embed_bytes, (double)s->embed_bytes_step * r->elem_grad / 4);
    }
    r->fits = r->st[r->worst].total <= r->capacity;
    r->offload = (int)t->offload;
    if (r->offload) { /* the host must hold what its GPUs' ranks put there */
        double host = 0;
        for (int k = 0; k < t->pp; k++)
            host = fmax(host, r->st[k].host_optimizer + r->st[k].host_ckpt);
        r->host_node = host * (gpn < r->world ? gpn : r->world);
        r->host_capacity = c->host_memory_gib * GIB;
        r->fits = r->fits && r->host_node <= r->host_capacity;
    }

    r->bubble = t->pp > 1 ? pp_bubble_fraction(t->pp, r->n_micro, t->virtual_stages) : 0;
    r->t_pipe = r->n_micro * t_max / (1 - r->bubble);
    r->t_dp_exposed = dp_opt;
    r->t_embed = r->embed_bytes > 0 ? comm_time(c, r->pp_link, r->embed_bytes, 1, 2) : 0;
    r->t_step = r->t_pipe + dp_opt + r->t_embed;
    const double tokens = (double)cfg->training.global_batch * cfg->model.seq_len;
    r->model_flops_step = model_flops_per_token(&cfg->model) * tokens;
    r->tokens_per_s = tokens / r->t_step;
    r->tflops_per_gpu = r->model_flops_step / r->t_step / r->world / 1e12;
    r->mfu = r->tflops_per_gpu / c->peak_tflops;
    return 0;
}

void plan_apply_layout(Config *cfg, int tp, int pp, int dp, int zero, int micro_batch, int v,
                       Recompute rc)
{
    TopologyConfig *t = &cfg->topology;
    t->tp = tp;
    t->pp = pp;
    t->dp = dp;
    t->zero = zero;
    t->virtual_stages = v;
    t->schedule =
        v > 1 ? SCHED_INTERLEAVED : (t->schedule == SCHED_GPIPE ? SCHED_GPIPE : SCHED_1F1B);
    t->sequence_parallel = tp > 1;
    t->n_stage_layers = 0;
    cfg->training.micro_batch = micro_batch;
    cfg->training.recompute = rc;
}
