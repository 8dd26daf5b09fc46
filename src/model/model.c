/* model.c — GPT-2 and Llama-style decoder over the parameter table.
 *
 * Three parts, each with its hand-written backward next to its forward:
 *   embed  tokens -> residual stream entering the first layer  (first stage)
 *   block  one transformer layer, residual stream in -> out   (any stage)
 *   head   final norm -> logits -> fused cross-entropy        (last stage)
 *
 * Memory (docs/design.md): parameters and gradients are one buffer each, carved by
 * the table's offsets into per-layer structs of named pointers at create
 * time; activations are one allocation carved from a table of sizes that
 * depends on the recompute mode; backward scratch is one more allocation.
 * Nothing is allocated or looked up by name during a step.
 *
 * Shapes are the LOCAL ones of the table (heads, ffn and vocabulary rows of
 * this tensor-parallel rank); with tp = 1 this is the whole model.
 *
 * Tensor parallelism (src/tensor_par/tensor_par.h has the collectives and
 * their table).  Per layer: norm -> [column input] -> qkv (column-parallel,
 * by kv group) -> attention (local heads) -> proj (row-parallel) -> [row
 * output] + bias -> residual; the MLP the same way (fc/gate/up column-,
 * proj/down row-parallel).  The embedding is vocabulary-parallel (a row
 * output over the vocabulary), the head column-parallel over the
 * vocabulary with the vocabulary-parallel cross-entropy.  With sequence
 * parallelism the residual stream, the norms and their statistics hold
 * d.Ns = N / tp rows (this rank's block of the b-major token rows); the
 * norm outputs are all-gathered to [N, C] and kept whole for backward.
 *
 * Gradients of the tensors each rank holds (after backward returns, for
 * every micro-batch, so ZeRO may reduce a layer as soon as it is done):
 *   split tensors (qkv q rows, fc/gate/up, proj/down, wte/head rows):
 *     complete for the local piece, no TP reduction.
 *   qkv k,v rows replicated over kv_share ranks (tp > kv_heads): partial
 *     (this rank's query heads only), all-reduced among those ranks here.
 *   row-parallel biases (attn.proj.bias, mlp.proj.bias): complete and equal
 *     on all TP ranks (summed over the whole gathered output gradient).
 *   norm weights and biases (ln1, ln2, final_norm): without SP complete and
 *     equal (every rank computes the same); with SP partial (own token
 *     rows), all-reduced over TP here.
 *   embed.wpe: partial (rows of the tokens this rank's vocabulary holds),
 *     all-reduced over TP here.
 * So after backward every replicated tensor has the same gradient on every
 * TP rank; DP reduction and the optimizer need nothing TP-specific, and the
 * gradient norm counts each element once with params_grad_sumsq. */
#include "model/model.h"
#include "model/model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/layout.h"
#include "core/error.h"
#include "core/rng.h"
#include "tensor_par/tensor_par.h"

/* ---- parameter lookup (create time only) -------------------------------- */

static size_t offset_of(const ParamTable *t, const char *name)
{
    const ParamSpec *p = params_find(t, name);
    return p ? p->offset : NO_TENSOR;
}

/* Does the table hold layer l as a MoE layer (its router)? */
static int moe_layer_in(const ParamTable *t, int l)
{
    char name[PARAM_NAME];
    snprintf(name, sizeof name, "layers.%d.moe.router.weight", l);
    return params_find(t, name) != NULL;
}

/* Field order of LayerParams, by tensor name. */
static void layer_offsets(GroupOffsets *g, const ParamTable *t, int l, int gpt2)
{
    static const char *const gpt2_names[LP_FIELDS] = {"ln1.weight",
                                                      "ln1.bias",
                                                      "attn.qkv.weight",
                                                      "attn.qkv.bias",
                                                      "attn.proj.weight",
                                                      "attn.proj.bias",
                                                      "ln2.weight",
                                                      "ln2.bias",
                                                      "mlp.fc.weight",
                                                      "mlp.fc.bias",
                                                      NULL,
                                                      "mlp.proj.weight",
                                                      "mlp.proj.bias"};
    static const char *const llama_names[LP_FIELDS] = {
        "ln1.weight", NULL, "attn.qkv.weight", NULL, "attn.proj.weight", NULL,
        "ln2.weight", NULL, "mlp.gate.weight", NULL, "mlp.up.weight",    "mlp.down.weight",
        NULL};
    /* A MoE layer: its shared experts in the MLP's fields, then the router
     * and the stacked experts (absent tensors are simply not found). */
    static const char *const gpt2_moe[LP_FIELDS] = {
        [8] = "moe.shared.fc.weight",    [9] = "moe.shared.fc.bias",
        [11] = "moe.shared.proj.weight", [12] = "moe.shared.proj.bias",
        [13] = "moe.router.weight",      [14] = "moe.experts.fc.weight",
        [15] = "moe.experts.fc.bias",    [17] = "moe.experts.proj.weight",
        [18] = "moe.experts.proj.bias"};
    static const char *const llama_moe[LP_FIELDS] = {
        [8] = "moe.shared.gate.weight",   [10] = "moe.shared.up.weight",
        [11] = "moe.shared.down.weight",  [13] = "moe.router.weight",
        [14] = "moe.experts.gate.weight", [16] = "moe.experts.up.weight",
        [17] = "moe.experts.down.weight"};
    const int moe = moe_layer_in(t, l);
    const char *const *names = gpt2 ? gpt2_names : llama_names;
    for (int k = 0; k < LP_FIELDS; k++) {
        const char *nm =
            k < 8 || !moe ? (k < 13 ? names[k] : NULL) : (gpt2 ? gpt2_moe : llama_moe)[k];
        char name[PARAM_NAME];
        snprintf(name, sizeof name, "layers.%d.%s", l, nm ? nm : "");
        g->off[k] = nm ? offset_of(t, name) : NO_TENSOR;
    }
    params_group_range(t, l, &g->lo, &g->hi);
    params_group_range(t, PARAMS_EXPERTS(l), &g->x_lo, &g->x_hi);
    g->x_split = moe && t->ep > 1;
    TRD_ASSERT(g->off[2] != NO_TENSOR && g->off[4] != NO_TENSOR);
    TRD_ASSERT(moe ? g->off[13] != NO_TENSOR && g->off[14] != NO_TENSOR && g->off[17] != NO_TENSOR
                   : g->off[8] != NO_TENSOR && g->off[11] != NO_TENSOR &&
                         (gpt2 || g->off[10] != NO_TENSOR));
}

static void outer_offsets(GroupOffsets *g, const ParamTable *t)
{
    static const char *const names[OP_FIELDS] = {"embed.wte.weight", "embed.wpe.weight",
                                                 "final_norm.weight", "final_norm.bias",
                                                 "head.weight"};
    for (int k = 0; k < LP_FIELDS; k++)
        g->off[k] = k < OP_FIELDS ? offset_of(t, names[k]) : NO_TENSOR;
    params_group_range(t, PARAMS_OUTER, &g->lo, &g->hi);
}

/* Layer l's adapters in the trained table (LoraParams order). */
static void lora_offsets(GroupOffsets *g, const ParamTable *t, int l)
{
    static const char *const base[LORA_TARGETS] = {"attn.qkv", "attn.proj", NULL, "mlp.up", NULL};
    for (int k = 0; k < LP_FIELDS; k++)
        g->off[k] = NO_TENSOR;
    for (int k = 0; k < LORA_TARGETS; k++) {
        const char *const alt[2] = {k == LT_FC       ? "mlp.fc"
                                    : k == LT_FCPROJ ? "mlp.proj"
                                                     : base[k],
                                    k == LT_FC       ? "mlp.gate"
                                    : k == LT_FCPROJ ? "mlp.down"
                                                     : NULL};
        for (int j = 0; j < 2 && alt[j]; j++) {
            char name[PARAM_NAME];
            snprintf(name, sizeof name, "layers.%d.%s.lora_A", l, alt[j]);
            if (g->off[k] == NO_TENSOR)
                g->off[k] = offset_of(t, name);
            snprintf(name, sizeof name, "layers.%d.%s.lora_B", l, alt[j]);
            if (g->off[LORA_TARGETS + k] == NO_TENSOR)
                g->off[LORA_TARGETS + k] = offset_of(t, name);
        }
    }
    params_group_range(t, l, &g->lo, &g->hi);
}

/* Point the fields at storage that holds the group's range [lo, hi). */
static void bind_fields(float **f, int n, const GroupOffsets *g, float *storage)
{
    for (int k = 0; k < (g->x_split && n > LP_EXPERTS ? LP_EXPERTS : n); k++)
        f[k] = g->off[k] == NO_TENSOR ? NULL : storage + (g->off[k] - g->lo);
}

/* The stacked experts' fields of a divided MoE layer, at storage holding
 * [x_lo, x_hi). */
static void bind_expert_fields(float **f, const GroupOffsets *g, float *storage)
{
    for (int k = LP_EXPERTS; g->x_split && k < LP_FIELDS; k++)
        f[k] = g->off[k] == NO_TENSOR ? NULL : storage + (g->off[k] - g->x_lo);
}

static void bind_outer(OuterParams *op, const GroupOffsets *g, float *storage, int tied)
{
    bind_fields(op->f, OP_FIELDS, g, storage);
    if (tied)
        op->head_w = op->wte; /* the head reads (and adds gradient to) wte */
}

/* ---- sizes -------------------------------------------------------------- */

/* Local sizes of this tensor-parallel rank: its query heads, kv heads (its
 * own, or the one group it shares), MLP columns and vocabulary rows.  The
 * table says the same (checked against it in model_create_unbound). */
RopeFreq model_rope_freq(const ModelConfig *mc)
{
    RopeFreq rf = {.theta = mc->rope_theta};
    if (mc->rope_scaling == ROPE_SCALING_LLAMA3) {
        rf.factor = mc->rope_factor;
        rf.low_freq_factor = mc->rope_low_freq_factor;
        rf.high_freq_factor = mc->rope_high_freq_factor;
        rf.original_max = mc->rope_original_max_position_embeddings;
    }
    return rf;
}

static Dims make_dims(const Model *m, int B)
{
    const ModelConfig *mc = &m->mc;
    const int tp = m->sh.tp;
    Dims d = {0};
    d.gpt2 = mc->arch == ARCH_GPT2;
    /* Context parallel: this rank's two chunks of each sequence, chunk-major
     * ([2][B][T/(2cp)], the layout of cp_attention.h), as 2B short sequences. */
    d.B = m->cp > 1 ? 2 * B : B;
    d.T = m->cp > 1 ? mc->seq_len / (2 * m->cp) : mc->seq_len;
    d.Tw = mc->seq_len;
    d.N = d.B * d.T;
    d.Ns = tp_stream_rows(&m->tp, d.N);
    d.C = mc->hidden;
    d.hs = mc->hidden / mc->heads;
    d.eps = mc->norm_eps;
    d.rope = model_rope_freq(mc);

    d.H = mc->heads / tp;
    d.KVH = mc->kv_heads % tp == 0 ? mc->kv_heads / tp : 1;
    d.QKV = (d.H + 2 * d.KVH) * d.hs;
    d.F = mc->ffn_hidden / tp;
    if (mc->moe_experts > 0) {
        d.E = mc->moe_experts;
        d.K = mc->moe_top_k;
        d.Fe = config_moe_ffn(mc) / tp; /* every expert split like the dense MLP */
        d.Fs = mc->moe_shared_experts * d.Fe;
        d.R = d.N * d.K;
        d.El = d.E / m->ep;
        d.Re = m->ep == 1 ? d.R : m->ep * d.N * (d.K < d.El ? d.K : d.El);
    }

    const ParamTable *wt = m->lora ? &m->base_table : &m->table;
    const ParamSpec *v = params_find(wt, "embed.wte.weight");
    if (!v)
        v = params_find(wt, "head.weight");
    d.Vp = v ? (int)v->local_shape[0] : 0;
    d.vocab_start = v ? (int)v->local_start[0] : 0;
    d.vocab = mc->vocab;
    const int real = mc->vocab - d.vocab_start;
    d.V = real < 0 ? 0 : (real > d.Vp ? d.Vp : real);
    return d;
}

/* The activations of a dense layer (moe 0) or of a MoE layer (moe 1),
 * whose MLP fields hold its shared experts. */
static void layer_act_sizes(const Dims *d, int moe, int x16, size_t n[A_COUNT])
{
    const size_t N = (size_t)d->N, C = (size_t)d->C, Ns = (size_t)d->Ns;
    const size_t F = (size_t)(moe ? d->Fs : d->F);
    n[A_LN1] = N * C;                 /* whole (gathered under SP) */
    n[A_LN1_MEAN] = d->gpt2 ? Ns : 0; /* RMSNorm keeps no mean */
    n[A_LN1_RSTD] = Ns;
    n[A_QKV] = N * (size_t)d->QKV;
    n[A_LSE] = (size_t)d->B * (size_t)d->H * (size_t)d->T;
    n[A_ATTY] = N * (size_t)d->H * (size_t)d->hs;
    n[A_ATTY16] = x16 ? n[A_ATTY] : 0; /* bf16: halved with the GemmIn ones */
    n[A_RES_MID] = Ns * C;
    n[A_LN2] = N * C;
    n[A_LN2_MEAN] = d->gpt2 ? Ns : 0;
    n[A_LN2_RSTD] = Ns;
    n[A_FC] = N * F;
    n[A_UP] = d->gpt2 ? 0 : N * F;
    n[A_FC_ACT] = N * F;
    const size_t E = moe ? (size_t)d->E : 0, R = moe ? (size_t)d->R : 0, Fe = (size_t)d->Fe;
    const size_t Re = moe ? (size_t)d->Re : 0;
    n[A_R_LOGITS] = N * E;
    n[A_R_PROBS] = N * E;
    n[A_R_LSE] = moe ? N : 0;
    n[A_R_W] = R;
    n[A_R_IDX] = R;
    n[A_R_SLOT] = R;
    n[A_X_IN] = Re * C;
    n[A_X_FC] = Re * Fe;
    n[A_X_UP] = d->gpt2 ? 0 : Re * Fe;
    n[A_X_ACT] = Re * Fe;
    n[A_X_OUT] = R * C;
}

static void layer_act_slots(LayerActs *a, float **slot[A_COUNT])
{
    slot[A_LN1] = &a->ln1.f;
    slot[A_LN1_MEAN] = &a->ln1_mean;
    slot[A_LN1_RSTD] = &a->ln1_rstd;
    slot[A_QKV] = &a->qkv;
    slot[A_LSE] = &a->lse;
    slot[A_ATTY] = &a->atty;
    slot[A_ATTY16] = (float **)(void *)&a->atty16; /* bf16 in float-sized slots */
    slot[A_RES_MID] = &a->res_mid;
    slot[A_LN2] = &a->ln2.f;
    slot[A_LN2_MEAN] = &a->ln2_mean;
    slot[A_LN2_RSTD] = &a->ln2_rstd;
    slot[A_FC] = &a->fc;
    slot[A_UP] = &a->up;
    slot[A_FC_ACT] = &a->fc_act.f;
    slot[A_R_LOGITS] = &a->r_logits;
    slot[A_R_PROBS] = &a->r_probs;
    slot[A_R_LSE] = &a->r_lse;
    slot[A_R_W] = &a->r_w;
    /* int32 ids in float-sized slots of the one activation buffer */
    slot[A_R_IDX] = (float **)(void *)&a->r_idx;
    slot[A_R_SLOT] = (float **)(void *)&a->r_slot;
    slot[A_X_IN] = &a->x_in;
    slot[A_X_FC] = &a->x_fc;
    slot[A_X_UP] = &a->x_up;
    slot[A_X_ACT] = &a->x_act;
    slot[A_X_OUT] = &a->x_out;
}

/* Does each layer keep its own copy of this activation, or do all layers
 * share one that backward recomputes?
 *   none:      every layer keeps everything.
 *   selective: the attention's output (and its bf16 copy) and log-sum-exp
 *              are shared, and backward reruns the attention (from qkv,
 *              which is kept): N*H*hs + B*H*T fewer floats per layer
 *              (and the copy's N*H*hs/2) for one more attention forward.
 *   full:      everything is shared; only each layer's input (the residual
 *              stream, kept outside this table) survives, and backward
 *              reruns the layer's forward. */
static int kept_per_layer(Recompute r, int field)
{
    switch (r) {
    case RECOMPUTE_NONE:
        return 1;
    case RECOMPUTE_SELECTIVE:
        return field != A_ATTY && field != A_ATTY16 && field != A_LSE;
    case RECOMPUTE_FULL:
        return 0;
    }
    return 1;
}

/* A bump allocator over one buffer: `take` hands out the next n floats.
 * Run once with base == NULL to count, then again to carve. */
typedef struct {
    float *base;
    size_t used;
} Carver;

static float *take(Carver *c, size_t n)
{
    if (n == 0)
        return NULL;
    float *p = c->base ? c->base + c->used : NULL;
    c->used += n;
    return p;
}

/* The floats that hold n bf16 values. */
static size_t halves(size_t n) { return (n + 1) / 2; }

static void carve_activations(Model *m, Carver *c)
{
    const Dims *d = &m->d;
    const size_t NC = (size_t)d->N * (size_t)d->C, NsC = (size_t)d->Ns * (size_t)d->C;
    size_t sz[2][A_COUNT], most[A_COUNT]; /* dense, MoE; the larger for shared slots */
    layer_act_sizes(d, 0, m->x16, sz[0]);
    layer_act_sizes(d, 1, m->x16, sz[1]);
    if (m->x16) /* the GemmIn activations and atty's copy in bf16: half the floats */
        for (int e = 0; e < 2; e++)
            for (int k = 0; k < A_COUNT; k++)
                if (k == A_LN1 || k == A_LN2 || k == A_FC_ACT || k == A_ATTY16)
                    sz[e][k] = halves(sz[e][k]);
    const int any_moe = d->E > 0;
    for (int k = 0; k < A_COUNT; k++)
        most[k] = any_moe && sz[1][k] > sz[0][k] ? sz[1][k] : sz[0][k];

    for (int i = 0; i <= m->nl; i++)
        m->cur.resid[i] = take(c, NsC);

    LayerActs shared = {0};
    float **slot[A_COUNT];
    layer_act_slots(&shared, slot);
    for (int k = 0; k < A_COUNT; k++)
        if (m->nl > 0 && !kept_per_layer(m->recompute, k))
            *slot[k] = take(c, most[k]);
    for (int i = 0; i < m->nl; i++) {
        const int moe = config_moe_layer(&m->mc, m->sh.chunk[0].begin + i);
        m->cur.la[i] = shared;
        layer_act_slots(&m->cur.la[i], slot);
        for (int k = 0; k < A_COUNT; k++)
            if (kept_per_layer(m->recompute, k))
                *slot[k] = take(c, sz[moe][k]);
    }

    if (m->sh.has_head) {
        m->cur.ha.lnf.f = take(c, m->x16 ? halves(NC) : NC);
        m->cur.ha.lnf_mean = take(c, d->gpt2 ? (size_t)d->Ns : 0);
        m->cur.ha.lnf_rstd = take(c, (size_t)d->Ns);
        const size_t NV = (size_t)d->N * (size_t)d->Vp;
        m->cur.ha.logits.f = take(c, m->x16_logits ? halves(NV) : NV);
        m->cur.ha.losses = take(c, (size_t)d->N);
        m->cur.ha.ce_stats = take(c, tp_active(&m->tp) ? 3 * (size_t)d->N : 0);
    }
}

static void carve_scratch(Model *m, Carver *c)
{
    const Dims *d = &m->d;
    const size_t N = (size_t)d->N, NC = N * (size_t)d->C;
    /* dfc, dup, dfc_act serve the dense MLP, the shared experts and the experts */
    size_t NF = N * (size_t)d->F;
    if (N * (size_t)d->Fs > NF)
        NF = N * (size_t)d->Fs;
    if ((size_t)d->Re * (size_t)d->Fe > NF) /* the experts' rows, all at once (moe.c) */
        NF = (size_t)d->Re * (size_t)d->Fe;
    const int blocks = m->nl > 0, tp = tp_active(&m->tp);
    const int moe = blocks && d->E > 0;
    /* first: the buffer's start is aligned for the doubles it holds */
    const size_t step_floats = (sizeof(BackendStepState) + sizeof(float) - 1) / sizeof(float);
    m->s.step = take(c, m->sh.has_head ? step_floats : 0);
    m->s.dres = take(c, (size_t)d->Ns * (size_t)d->C);
    m->s.dln = take(c, NC);
    m->s.branch = take(c, blocks ? NC : 0);
    m->s.dqkv = take(c, blocks ? N * (size_t)d->QKV : 0);
    m->s.datty = take(c, blocks ? N * (size_t)d->H * (size_t)d->hs : 0);
    m->s.dfc = take(c, blocks ? NF : 0);
    m->s.dup = take(c, blocks && !d->gpt2 ? NF : 0);
    m->s.dfc_act = take(c, blocks ? NF : 0);
    m->s.full = take(c, tp ? NC : 0);
    m->s.norm_part = take(c, tp_sequence_parallel(&m->tp) ? 2 * (size_t)d->C : 0);
    m->s.dwpe_part = take(c, tp && d->gpt2 && m->sh.has_embed ? (size_t)d->Tw * (size_t)d->C : 0);
    const size_t kv_rows = 2 * (size_t)d->hs;
    m->s.kv_keep = take(c, blocks && m->tp.kv_share > 1 ? kv_rows * (size_t)(d->C + 1) : 0);
    m->s.x_dy = take(c, moe ? (size_t)d->R * (size_t)d->C : 0);
    m->s.x_dx = take(c, moe ? (size_t)d->R * (size_t)d->C : 0);
    m->s.xr_dy = take(c, moe && m->ep > 1 ? (size_t)d->Re * (size_t)d->C : 0);
    m->s.xr_dx = take(c, moe && m->ep > 1 ? (size_t)d->Re * (size_t)d->C : 0);
    m->s.r_dw = take(c, moe ? (size_t)d->R : 0);
    m->s.r_dlogits = take(c, moe ? N * (size_t)d->E : 0);
    m->s.r_auxdp = take(c, moe ? (size_t)d->E : 0);
    const size_t r = m->lora && blocks ? (size_t)m->mc.lora.rank : 0;
    m->s.lora_t = take(c, N * r);
    m->s.lora_dt = take(c, N * r);
    m->s.lora_part = take(c, tp ? r * (size_t)d->C : 0);
    size_t in = (size_t)d->C > (size_t)d->F ? (size_t)d->C : (size_t)d->F;
    in = in > (size_t)d->H * (size_t)d->hs ? in : (size_t)d->H * (size_t)d->hs;
    m->s.lora_x = take(c, r && m->mc.lora.dropout > 0 ? N * in : 0);
    m->s.frozen_sink = take(c, m->lora ? 2 * (size_t)d->C : 0);
}

/* ---- create / free ------------------------------------------------------ */

/* Whether the GemmIn activations can be stored in bf16 (docs/design.md,
 * "bf16 activation storage"): the backend has the *_x16 ops (the bf16
 * tables), and no reader of them is anything but a GEMM.  Not with
 * sequence parallelism (the norms' outputs are all-gathered in fp32), LoRA
 * (the adapters read them through dropout and their own fp32 GEMMs) or
 * MoE (the dispatch copies ln2's rows): those keep fp32 activations. */
static int x16_layout_ok(const ModelConfig *mc, int sp)
{
    return !sp && mc->lora.rank == 0 && mc->moe_experts == 0;
}

static int model_x16_ok(const Model *m, const Backend *be, int sp)
{
    const int ops = be->matmul_forward_x16 && be->matmul_backward_x16 &&
                    be->matmul_gelu_forward_x16 && be->matmul_backward_dgelu_x16 &&
                    be->swiglu_forward_x16 && be->norm_forward_x16;
    return ops && x16_layout_ok(&m->mc, sp);
}

/* The head's logits in bf16 too (backend.h's head_forward_x16,
 * crossentropy_x16, matmul_backward_d16): not with the vocabulary split over
 * tp ranks (the vocabulary-parallel cross-entropy reads fp32 logits); LoRA
 * is already out through x16.  Decoding keeps its own fp32 logits. */
static int model_x16_logits_ok(const Model *m, const Backend *be)
{
    const int ops = be->head_forward_x16 && be->crossentropy_x16 && be->matmul_backward_d16;
    return ops && m->x16 && m->sh.tp == 1;
}

static void check_config(const ModelConfig *mc, int B)
{
    const char *hint = "check the model section of the config";
    if (B < 1 || mc->seq_len < 1 || mc->layers < 1 || mc->hidden < 1 || mc->heads < 1 ||
        mc->vocab < 1 || mc->ffn_hidden < 1)
        trd_fatal(TRD_EXIT_INPUT, hint,
                  "model: sizes must be positive (B=%d seq_len=%d layers=%d hidden=%d "
                  "heads=%d vocab=%d ffn_hidden=%d)",
                  B, mc->seq_len, mc->layers, mc->hidden, mc->heads, mc->vocab, mc->ffn_hidden);
    LayoutError e;
    if (layout_check_model(mc, &e) != 0)
        trd_fatal(TRD_EXIT_INPUT, hint, "%s", e.msg);
}

/* The layout rules (config/layout.h), for models built without a
 * validated config. */
static void check_tp(const ModelConfig *mc, const ParamShard *sh, int sp, int cp, int B)
{
    const char *hint = "check model and topology.tp (see docs/config.md)";
    LayoutError e;
    if (sh->tp_rank < 0 || sh->tp_rank >= sh->tp)
        trd_fatal(TRD_EXIT_INPUT, hint, "model: tp rank %d of %d", sh->tp_rank, sh->tp);
    if (layout_check_tp(mc, sh->tp, sp, cp, B, &e) != 0)
        trd_fatal(TRD_EXIT_INPUT, hint, "%s", e.msg);
}

/* Adapter dropout on: each activation set keeps its rows' places in the
 * token stream (ActSet.rows), where the backend's masks read them. */
static int lora_drops(const ModelConfig *mc) { return mc->lora.rank > 0 && mc->lora.dropout > 0; }

/* Bytes of the ids an activation set keeps: ActSet.ids and ActSet.rows. */
static size_t set_id_bytes(const ModelConfig *mc, size_t N)
{
    return N * (ID_ROWS * sizeof(int32_t) + (lora_drops(mc) ? sizeof(uint64_t) : 0));
}

static void free_activation_sets(Model *m)
{
    for (int k = 0; k < m->n_sets; k++) {
        free(m->sets[k].resid);
        if (m->sets[k].la)
            free(m->sets[k].la[0].route); /* the set's routes, one allocation */
        free(m->sets[k].la);
        free(m->sets[k].tokens);
    }
    free(m->sets);
    m->be->release(m->acts);
    m->be->release(m->ids);
    m->be->release(m->rows);
    m->sets = NULL;
    m->acts = NULL;
    m->ids = NULL;
    m->rows = NULL;
    m->n_sets = 0;
}

/* n sets carved from one allocation, each laid out by carve_activations. */
static void alloc_activation_sets(Model *m, int n)
{
    free_activation_sets(m);
    Carver count = {0};
    m->cur.resid = trd_calloc((size_t)m->nl + 1, sizeof(float *), "residual pointers");
    m->cur.la = trd_calloc((size_t)m->nl + 1, sizeof(LayerActs), "layer activation pointers");
    carve_activations(m, &count);
    free(m->cur.resid);
    free(m->cur.la);
    m->acts_numel = count.used * (size_t)n;
    m->acts = m->be->alloc(m->acts_numel * sizeof(float), "activations");
    const size_t N3 = ID_ROWS * (size_t)m->d.N;
    if (m->be->device)
        m->ids = m->be->alloc((size_t)n * N3 * sizeof(int32_t), "token ids");
    if (lora_drops(&m->mc))
        m->rows = m->be->alloc((size_t)n * (size_t)m->d.N * sizeof(uint64_t), "dropout rows");
    m->sets = trd_calloc((size_t)n, sizeof(ActSet), "activation sets");
    m->n_sets = n;
    Carver carve = {.base = m->acts};
    for (int k = 0; k < n; k++) {
        ActSet *a = &m->sets[k];
        a->resid = trd_calloc((size_t)m->nl + 1, sizeof(float *), "residual pointers");
        a->la = trd_calloc((size_t)m->nl + 1, sizeof(LayerActs), "layer activation pointers");
        a->tokens = trd_calloc(N3, sizeof(int32_t), "tokens, targets and positions");
        a->targets = a->tokens + m->d.N;
        a->ids = m->be->device ? m->ids + (size_t)k * N3 : a->tokens;
        a->rows = m->rows ? m->rows + (size_t)k * (size_t)m->d.N : NULL;
        m->cur = *a;
        carve_activations(m, &carve);
        *a = m->cur;
        MoeRoute *routes = trd_calloc((size_t)m->nl + 1, sizeof(MoeRoute), "MoE routes");
        for (int i = 0; i <= m->nl; i++)
            a->la[i].route = &routes[i];
    }
    TRD_ASSERT(carve.used == m->acts_numel);
    m->cur_set = 0;
    m->cur = m->sets[0];
}

void model_set_activation_sets(Model *m, int n)
{
    TRD_ASSERT(n >= 1);
    alloc_activation_sets(m, n);
}

void model_set_positions(Model *m, const int32_t *pos)
{
    const size_t N = (size_t)m->d.N;
    m->cur.drop_rows = NULL; /* a forward that names no rows drops nothing */
    if (!pos) {
        m->cur.pos = NULL;
        return;
    }
    int32_t *host = m->cur.tokens + 2 * N, *ids = m->cur.ids + 2 * N;
    memcpy(host, pos, N * sizeof(int32_t));
    if (m->be->device)
        m->be->to_backend(ids, pos, N * sizeof(int32_t));
    m->cur.pos = ids;
}

/* The rows go to the set's backend memory (one copy of 8 bytes a row per
 * micro-batch): the masks are drawn there, from them, and never copied. */
void model_set_dropout_rows(Model *m, const uint64_t *rows)
{
    m->cur.drop_rows = NULL;
    if (!rows || !m->cur.rows)
        return;
    m->be->to_backend(m->cur.rows, rows, (size_t)m->d.N * sizeof(uint64_t));
    m->cur.drop_rows = m->cur.rows;
}

void model_use_activation_set(Model *m, int k)
{
    TRD_ASSERT(k >= 0 && k < m->n_sets);
    m->sets[m->cur_set] = m->cur; /* keeps what the last forward counted */
    m->cur_set = k;
    m->cur = m->sets[k];
}

/* topology.cp of cfg, checked (a config built by hand may leave it 0). */
static int config_cp(const Config *cfg)
{
    const int cp = cfg->topology.cp > 1 ? cfg->topology.cp : 1;
    if (cp > 1 && cfg->model.seq_len % (2 * cp))
        trd_fatal(TRD_EXIT_INPUT, "see docs/context_parallel.md",
                  "model: seq_len %d is not divisible by 2 x topology.cp (%d)", cfg->model.seq_len,
                  cp);
    return cp;
}

/* Where the head's part of a base table's outer group [lo, hi) begins:
 * its first ROLE_HEAD tensor (the table holds the embedding's before the
 * head's), or hi when it has none. */
static size_t outer_split(const ParamTable *t, size_t hi)
{
    for (int i = 0; i < t->n; i++)
        if (t->p[i].role == ROLE_HEAD)
            return t->p[i].offset;
    return hi;
}

/* The largest part widened at once (model.lora.base_dtype bf16): a layer
 * of sh, the embedding, the final norm with the head, or with tied
 * embeddings the whole outer group (the head reads wte). */
static size_t widest_group(const ParamTable *t, const ParamShard *sh, int tied)
{
    size_t lo, hi, w = 0;
    params_group_range(t, PARAMS_OUTER, &lo, &hi);
    const size_t split = outer_split(t, hi);
    if (tied)
        w = hi - lo;
    else
        w = split - lo > hi - split ? split - lo : hi - split;
    for (int l = sh->chunk[0].begin; l < sh->chunk[0].end; l++) {
        params_group_range(t, l, &lo, &hi);
        w = hi - lo > w ? hi - lo : w;
    }
    return w;
}

size_t model_frozen_bytes(const ModelConfig *mc, const ParamShard *sh)
{
    if (mc->lora.rank <= 0)
        return 0;
    ParamTable t;
    params_build_base(&t, mc, sh);
    const size_t bytes =
        mc->lora.base_dtype == LORA_BASE_BF16
            ? t.numel * sizeof(uint16_t) + widest_group(&t, sh, mc->tie_embeddings) * sizeof(float)
            : t.numel * sizeof(float);
    params_free(&t);
    return bytes;
}

/* LoRA: the frozen weights.  fp32 (model.lora.base_dtype): `base` holds
 * them, bound once, never moved.  bf16: `base16` holds their bf16 bits and
 * `base` is one fp32 scratch the size of the largest group, into which
 * lora_widen writes the group a part of forward or backward is about to
 * use, binding that group's pointers there (the other groups' pointers are
 * stale until widened again).  Initialised from the seed as a plain
 * model's are; the trainer then loads the base checkpoint over them
 * (model_load_base). */
static void init_base(Model *m, uint64_t seed, int round)
{
    const ParamTable *t = &m->base_table;
    const Backend *be = m->be;
    m->base_bf16 = m->mc.lora.base_dtype == LORA_BASE_BF16;
    m->wide = WIDE_NONE;
    m->outer_split = outer_split(t, m->outer_off.hi);
    const size_t n = m->base_bf16 ? widest_group(t, &m->sh, m->mc.tie_embeddings) : t->numel;
    m->base =
        be->alloc((n ? n : 1) * sizeof(float),
                  m->base_bf16 ? "frozen base: one group widened to fp32" : "frozen base weights");
    if (m->base_bf16)
        m->base16 =
            be->alloc((t->numel ? t->numel : 1) * sizeof(uint16_t), "frozen base weights (bf16)");
    float *init = be->device || m->base_bf16
                      ? trd_calloc(t->numel + 1, sizeof(float), "base weights")
                      : m->base;
    params_init(t, init, seed);
    if (round) /* bf16 training: weights are bf16 values (the base is never updated) */
        for (size_t k = 0; k < t->numel; k++)
            init[k] = bf16_round(init[k]);
    model_load_base(m, init);
    if (init != m->base)
        free(init);
    if (m->base_bf16)
        return;
    bind_outer(&m->op, &m->outer_off, m->base + m->outer_off.lo, m->mc.tie_embeddings);
    for (int i = 0; i < m->nl; i++)
        bind_fields(m->lp[i].f, LP_FIELDS, &m->lo_off[i], m->base + m->lo_off[i].lo);
}

void model_load_base(Model *m, const float *host)
{
    TRD_ASSERT(m->lora && !m->lora_merged);
    const size_t numel = m->base_table.numel;
    if (!m->base_bf16) {
        if (host != m->base)
            m->be->to_backend(m->base, host, numel * sizeof(float));
        return;
    }
    uint16_t *bits = trd_malloc((numel + 1) * sizeof(uint16_t), "base weights in bf16");
    for (size_t k = 0; k < numel; k++)
        bits[k] = bf16_bits(host[k]); /* round to nearest even */
    m->be->to_backend(m->base16, bits, numel * sizeof(uint16_t));
    free(bits);
    m->wide = WIDE_NONE; /* the scratch holds an older copy */
}

/* The embedding's part of the outer group (WIDE_EMBED) or the head's
 * (WIDE_HEAD) in the scratch, its fields bound there and the other part's
 * set to NULL (not in the scratch); WIDE_OUTER: the whole group. */
static void lora_widen_outer(Model *m, int part)
{
    const GroupOffsets *g = &m->outer_off;
    const size_t lo = part == WIDE_HEAD ? m->outer_split : g->lo;
    const size_t hi = part == WIDE_EMBED ? m->outer_split : g->hi;
    m->be->widen_bf16(m->base, m->base16 + lo, hi - lo);
    for (int k = 0; k < OP_FIELDS; k++)
        m->op.f[k] = g->off[k] != NO_TENSOR && g->off[k] >= lo && g->off[k] < hi
                         ? m->base + (g->off[k] - lo)
                         : NULL;
    if (m->mc.tie_embeddings)
        m->op.head_w = m->op.wte; /* the head reads wte */
}

/* model.lora.base_dtype bf16: the group about to be used (WIDE_EMBED,
 * WIDE_HEAD or a local layer) widened to fp32 in the scratch `base` and its
 * pointers bound there; nothing when it is there already (one pass over a
 * layer's weights per forward and per backward of it, the price of half
 * the bytes).  The embedding and the head are widened one at a time, so
 * the scratch is the largest of them and the layers, not their sum; with
 * tied embeddings the head reads wte, and both are the whole outer group. */
static void lora_widen(Model *m, int group)
{
    if (!m->base_bf16)
        return;
    if (group < 0 && m->mc.tie_embeddings)
        group = WIDE_OUTER;
    if (m->wide == group)
        return;
    if (group < 0) {
        lora_widen_outer(m, group);
    } else {
        const GroupOffsets *g = &m->lo_off[group];
        m->be->widen_bf16(m->base, m->base16 + g->lo, g->hi - g->lo);
        bind_fields(m->lp[group].f, LP_FIELDS, g, m->base);
    }
    m->wide = group;
}

/* topology.ep of cfg for a MoE model (1 for a dense one), checked like cp. */
static int config_ep(const Config *cfg)
{
    const int ep = cfg->model.moe_experts > 0 && cfg->topology.ep > 1 ? cfg->topology.ep : 1;
    if (cfg->model.moe_experts % ep)
        trd_fatal(TRD_EXIT_INPUT, "use a topology.ep that divides model.moe.experts",
                  "model: topology.ep %d does not divide model.moe.experts %d", ep,
                  cfg->model.moe_experts);
    return ep;
}

static Model *create(const Config *cfg, const Backend *be, const ParamShard *sh, int B, int cp)
{
    check_config(&cfg->model, B);
    Model *m = trd_calloc(1, sizeof *m, "model");
    m->be = be;
    m->cp = cp;
    m->mc = cfg->model;
    m->ep = config_ep(cfg);
    m->sh = *sh;
    m->recompute = cfg->training.recompute;
    TRD_ASSERT(sh->n_chunks == 1); /* a model is one chunk: see params_chunk_shard */
    m->nl = sh->chunk[0].end - sh->chunk[0].begin;
    TRD_ASSERT(m->nl >= 0);
    const int sp = cfg->topology.sequence_parallel;
    check_tp(&m->mc, sh, sp, cp, B);
    const int kv_share = m->mc.kv_heads % sh->tp ? sh->tp / m->mc.kv_heads : 1;
    m->tp = tp_group_layout(be, sh->tp, sh->tp_rank, sp, kv_share);
    params_build(&m->table, &m->mc, sh);
    m->lora = m->mc.lora.rank > 0;
    if (m->lora) {
        params_build_base(&m->base_table, &m->mc, sh);
        m->lora_scale = m->mc.lora.alpha / (float)m->mc.lora.rank;
        m->drop_key = rng_mix(cfg->run.seed, rng_hash_str("model.lora.dropout"));
    }
    const ParamTable *wt = m->lora ? &m->base_table : &m->table; /* the weights */

    const int gpt2 = m->mc.arch == ARCH_GPT2;
    m->lp = trd_calloc((size_t)m->nl + 1, sizeof(LayerParams), "layer parameter pointers");
    m->lg = trd_calloc((size_t)m->nl + 1, sizeof(LayerParams), "layer gradient pointers");
    m->lo_off = trd_calloc((size_t)m->nl + 1, sizeof(GroupOffsets), "layer offsets");
    for (int i = 0; i < m->nl; i++)
        layer_offsets(&m->lo_off[i], wt, sh->chunk[0].begin + i, gpt2);
    outer_offsets(&m->outer_off, wt);
    if (m->lora) {
        m->ap = trd_calloc((size_t)m->nl + 1, sizeof(LoraParams), "adapter pointers");
        m->ag = trd_calloc((size_t)m->nl + 1, sizeof(LoraParams), "adapter gradient pointers");
        m->lora_off = trd_calloc((size_t)m->nl + 1, sizeof(GroupOffsets), "adapter offsets");
        for (int i = 0; i < m->nl; i++)
            lora_offsets(&m->lora_off[i], &m->table, sh->chunk[0].begin + i);
    }
    if (sh->has_head && m->mc.tie_embeddings && m->outer_off.off[0] == NO_TENSOR)
        trd_fatal(TRD_EXIT_INPUT,
                  "use untied embeddings (model.tie_embeddings: false) "
                  "or put the embedding and the head on one pipeline stage",
                  "model: the last stage needs the output embedding, but with tied "
                  "embeddings it lives on the first stage only");

    m->d = make_dims(m, B);
    if (m->nl > 0) { /* the table and the dims agree on the qkv split */
        char name[PARAM_NAME];
        snprintf(name, sizeof name, "layers.%d.attn.qkv.weight", sh->chunk[0].begin);
        const ParamSpec *q = params_find(wt, name);
        TRD_ASSERT(q && q->local_shape[0] == m->d.QKV && q->kv_share == kv_share);
    }
    if (m->lora)
        init_base(m, cfg->run.seed, cfg->training.precision == PREC_BF16);

    m->x16 = model_x16_ok(m, be, sp);
    m->x16_logits = model_x16_logits_ok(m, be);
    alloc_activation_sets(m, 1);

    Carver scount = {0};
    carve_scratch(m, &scount);
    m->scratch_numel = scount.used;
    m->scratch_buf = be->alloc(m->scratch_numel * sizeof(float), "backward scratch");
    if (be->device && sh->has_head)
        m->host_losses = trd_calloc((size_t)m->d.N, sizeof(float), "losses read back");
    m->loss_scale = NAN; /* a backward whose scale nobody set shows at once */
    if (m->d.E > 0) {
        if (!be->moe_router_forward)
            trd_fatal(TRD_EXIT_INPUT, "use backend: cpu for model.moe (docs/moe.md)",
                      "model: the %s backend has no mixture-of-experts ops yet", be->name);
        m->moe_idx_host = trd_calloc((size_t)m->d.R, sizeof(int32_t), "MoE routes read back");
        m->moe_slot_host = trd_calloc((size_t)m->d.R, sizeof(int32_t), "MoE dispatch order");
        m->moe_probs_host =
            trd_calloc((size_t)m->d.N * (size_t)(m->d.E + 1), sizeof(float), "MoE router probs");
        m->moe_lse_host = m->moe_probs_host + (size_t)m->d.N * (size_t)m->d.E;
    }
    Carver scarve = {.base = m->scratch_buf};
    carve_scratch(m, &scarve);

    return m;
}

Model *model_create_unbound(const Config *cfg, const Backend *be, const ParamShard *sh, int B)
{
    return create(cfg, be, sh, B, config_cp(cfg));
}

void model_set_context_parallel(Model *m, Comm *cp)
{
    TRD_ASSERT(cp->size == m->cp);
    if (m->cp > 1)
        cp_attention_init(&m->cpa, m->be, cp, m->d.B / 2, m->d.T, m->d.H, m->d.KVH, m->d.hs);
}

void model_set_expert_parallel(Model *m, Comm *ep)
{
    TRD_ASSERT(ep->size == m->ep);
    m->epc = m->ep > 1 ? ep : NULL;
}

double model_take_cp_seconds(Model *m)
{
    const double s = m->cpa.comm_s;
    m->cpa.comm_s = 0;
    return s;
}

Model *model_create(const Config *cfg, const Backend *be, const ParamShard *sh, int B)
{
    Model *m = create(cfg, be, sh, B, 1);
    const size_t bytes = m->table.numel * sizeof(float);
    m->params = be->alloc(bytes, "parameters");
    m->grads = be->alloc(bytes, "gradients");
    float *init =
        be->device ? trd_calloc(m->table.numel, sizeof(float), "initial weights") : m->params;
    params_init(&m->table, init, cfg->run.seed);
    if (init != m->params) {
        be->to_backend(m->params, init, bytes);
        free(init);
    }
    model_bind(m, PARAMS_OUTER, m->params, m->grads);
    for (int l = sh->chunk[0].begin; l < sh->chunk[0].end; l++) {
        const int i = l - sh->chunk[0].begin;
        size_t lo = m->lora ? m->lora_off[i].lo : m->lo_off[i].lo;
        model_bind(m, l, m->params + lo, m->grads + lo);
        model_bind_experts(m, l, m->params + m->lo_off[i].x_lo, m->grads + m->lo_off[i].x_lo);
    }
    return m;
}

void model_bind_experts(Model *m, int l, float *params, float *grads)
{
    const int i = l - m->sh.chunk[0].begin;
    TRD_ASSERT(i >= 0 && i < m->nl);
    if (m->lora) /* the adapters only: never divided */
        return;
    if (params)
        bind_expert_fields(m->lp[i].f, &m->lo_off[i], params);
    if (grads)
        bind_expert_fields(m->lg[i].f, &m->lo_off[i], grads);
}

void model_bind(Model *m, int group, float *params, float *grads)
{
    const int tied = m->mc.tie_embeddings;
    if (m->lora) { /* only the adapters are trained: nothing outside the layers */
        if (group == PARAMS_OUTER)
            return;
        const int i = group - m->sh.chunk[0].begin;
        TRD_ASSERT(i >= 0 && i < m->nl);
        if (params)
            bind_fields(m->ap[i].f, LF_FIELDS, &m->lora_off[i], params);
        if (grads)
            bind_fields(m->ag[i].f, LF_FIELDS, &m->lora_off[i], grads);
        return;
    }
    if (group == PARAMS_OUTER) {
        if (params)
            bind_outer(&m->op, &m->outer_off, params, tied);
        if (grads)
            bind_outer(&m->og, &m->outer_off, grads, tied);
        return;
    }
    const int i = group - m->sh.chunk[0].begin;
    TRD_ASSERT(i >= 0 && i < m->nl);
    if (params)
        bind_fields(m->lp[i].f, LP_FIELDS, &m->lo_off[i], params);
    if (grads)
        bind_fields(m->lg[i].f, LP_FIELDS, &m->lo_off[i], grads);
}

void model_set_tensor_parallel(Model *m, Comm *tp) { tp_group_attach(&m->tp, tp); }

void model_free(Model *m)
{
    if (!m)
        return;
    tp_group_free(&m->tp);
    params_free(&m->table);
    params_free(&m->base_table);
    m->be->release(m->base);
    m->be->release(m->base16);
    free(m->ap);
    free(m->ag);
    free(m->lora_off);
    m->be->release(m->params);
    m->be->release(m->grads);
    free(m->host_losses);
    free(m->moe_idx_host);
    free(m->moe_slot_host);
    free(m->moe_probs_host);
    free(m->lp);
    free(m->lg);
    free(m->lo_off);
    free_activation_sets(m);
    m->be->release(m->scratch_buf);
    if (m->cpa.kv)
        cp_attention_free(&m->cpa);
    free(m);
}

const ParamTable *model_params(const Model *m) { return &m->table; }
const ParamTable *model_base_params(const Model *m) { return m->lora ? &m->base_table : NULL; }
float *model_base_buffer(Model *m) { return m->lora && !m->base_bf16 ? m->base : NULL; }
float *model_param_buffer(Model *m) { return m->params; }
float *model_grad_buffer(Model *m) { return m->grads; }
float *model_stage_input(Model *m) { return m->cur.resid[0]; }
float *model_stage_output(Model *m) { return m->cur.resid[m->nl]; }
float *model_grad_stream(Model *m) { return m->s.dres; }
int model_vocab_padded(const Model *m) { return m->d.Vp; }
int model_stream_rows(const Model *m) { return m->d.Ns; }

MemoryReport model_memory(const Model *m)
{
    MemoryReport r = {0};
    r.params = m->params ? m->table.numel * sizeof(float) : 0;
    r.frozen = m->lora ? model_frozen_bytes(&m->mc, &m->sh) : 0;
    r.grads = m->grads ? m->table.numel * sizeof(float) : 0;
    r.activations =
        m->acts_numel * sizeof(float) + (size_t)m->n_sets * set_id_bytes(&m->mc, (size_t)m->d.N);
    r.scratch = m->scratch_numel * sizeof(float) +
                cp_attention_bytes(m->cp, m->d.B / 2, m->d.T, m->d.H, m->d.KVH, m->d.hs);
    return r;
}

void model_zero_grad(Model *m)
{
    TRD_ASSERT(m->grads);
    m->be->zero(m->grads, m->table.numel * sizeof(float));
}

/* Backward functions accumulate, so a gradient that starts fresh is zeroed,
 * unless the op that writes it first takes GRAD_SET (backend.h). */
static void zero(const Model *m, float *x, size_t n) { m->be->zero(x, n * sizeof *x); }

/* ---- norms: LayerNorm (GPT-2) or RMSNorm (Llama) ------------------------ */

/* Normalise the d.Ns stream rows held here into this rank's rows of out
 * [N, C], then make out whole: the input of the column-parallel layers
 * (all-gather under SP, identity otherwise). */
static void norm_forward(Model *m, GemmIn out, float *mean, float *rstd, const float *inp,
                         const float *w, const float *b)
{
    const Dims *d = &m->d;
    if (m->x16) { /* no SP: out is whole here */
        m->be->norm_forward_x16(NULL, out.h, mean, rstd, inp, NULL, w, b, d->N, d->C, d->eps,
                                !d->gpt2);
        return;
    }
    float *mine = tp_my_rows(&m->tp, out.f, d->N, d->C);
    if (d->gpt2)
        m->be->layernorm_forward(mine, mean, rstd, inp, w, b, d->Ns, d->C, d->eps);
    else
        m->be->rmsnorm_forward(mine, rstd, inp, w, d->Ns, d->C, d->eps);
    tp_column_input_forward(&m->tp, out.f, d->N, d->C);
}

/* res = a + b (the residual stream, d.Ns rows), then norm_forward of res:
 * the backend's residual_norm_forward, one pass instead of two. */
static void residual_norm_forward(Model *m, float *res, GemmIn out, float *mean, float *rstd,
                                  const float *a, const float *b, const float *w, const float *bias)
{
    const Dims *d = &m->d;
    if (m->x16) {
        m->be->norm_forward_x16(res, out.h, mean, rstd, a, b, w, bias, d->N, d->C, d->eps,
                                !d->gpt2);
        return;
    }
    float *mine = tp_my_rows(&m->tp, out.f, d->N, d->C);
    m->be->residual_norm_forward(res, mine, mean, rstd, a, b, w, bias, d->Ns, d->C, d->eps,
                                 !d->gpt2);
    tp_column_input_forward(&m->tp, out.f, d->N, d->C);
}

/* The GEMMs whose activation operand x is a GemmIn: the *_x16 ops where it
 * is stored in bf16 (x16; the model's GemmIn fields: m->x16). */
static void gemm_in_forward(const Backend *be, int x16, float *out, GemmIn x, const float *w,
                            const float *b, int N, int C, int OC)
{
    if (x16)
        be->matmul_forward_x16(out, x.h, w, b, N, C, OC);
    else
        be->matmul_forward(out, x.f, w, b, N, C, OC);
}

static void x_matmul_forward(const Model *m, float *out, GemmIn x, const float *w, const float *b,
                             int N, int C, int OC)
{
    gemm_in_forward(m->be, m->x16, out, x, w, b, N, C, OC);
}

static void x_matmul_backward(const Model *m, float *dinp, GradMode dinp_mode, float *dw, float *db,
                              const float *dout, GemmIn x, const float *w, int N, int C, int OC)
{
    if (m->x16)
        m->be->matmul_backward_x16(dinp, dw, db, dout, x.h, w, N, C, OC, dinp_mode);
    else
        m->be->matmul_backward(dinp, dw, db, dout, x.f, w, N, C, OC, dinp_mode);
}

/* dout [N, C] holds this rank's partial gradient at the norm's output (the
 * column-parallel layers' input): reduced first (all-reduce, or
 * reduce-scatter into its first d.Ns rows under SP), then the norm's
 * backward ADDS the input gradient into dinp (d.Ns rows) and the weight and
 * bias gradients into dw, db.  Under SP those are partial (own rows): they
 * go through norm_part and are all-reduced over TP. */
static void norm_backward(Model *m, float *dinp, float *dw, float *db, float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd)
{
    const Dims *d = &m->d;
    int sp = tp_sequence_parallel(&m->tp);
    tp_column_input_backward(&m->tp, dout, d->N, d->C);
    float *gw = dw, *gb = db;
    if (!dw) { /* a frozen norm (LoRA): its weight gradient is dropped */
        gw = m->s.frozen_sink;
        gb = NULL;
        sp = 0;
        zero(m, gw, (size_t)d->C);
    } else if (sp) {
        gw = m->s.norm_part;
        gb = db ? m->s.norm_part + d->C : NULL;
        zero(m, m->s.norm_part, 2 * (size_t)d->C);
    }
    if (d->gpt2)
        m->be->layernorm_backward(dinp, gw, gb, dout, inp, w, mean, rstd, d->Ns, d->C);
    else
        m->be->rmsnorm_backward(dinp, gw, dout, inp, w, rstd, d->Ns, d->C);
    if (sp) {
        tp_add_reduced_grad(&m->tp, dw, gw, (size_t)d->C);
        if (db)
            tp_add_reduced_grad(&m->tp, db, gb, (size_t)d->C);
    }
}

/* ---- embed -------------------------------------------------------------- */

/* Vocabulary-parallel lookup (tensor_par.h): partial rows summed over TP,
 * reduce-scattered into this rank's stream rows under SP. */
void model_embed_forward(Model *m, const int32_t *tokens)
{
    const Dims *d = &m->d;
    TRD_ASSERT(m->sh.has_embed);
    tp_group_check(&m->tp);
    lora_widen(m, WIDE_EMBED);
    memcpy(m->cur.tokens, tokens, (size_t)d->N * sizeof(int32_t));
    if (m->be->device)
        m->be->to_backend(m->cur.ids, tokens, (size_t)d->N * sizeof(int32_t));
    float *full = tp_sequence_parallel(&m->tp) ? m->s.full : m->cur.resid[0];
    tp_embedding_forward(m->be, &m->tp, m->cur.resid[0], full, m->cur.ids, m->cur.pos, m->op.wte,
                         m->op.wpe, d->N, d->Tw, d->C, d->vocab_start, d->Vp);
}

/* Reads the residual-stream gradient left by the first local layer. */
void model_embed_backward(Model *m)
{
    const Dims *d = &m->d;
    TRD_ASSERT(m->sh.has_embed);
    if (m->lora) /* frozen: the embedding's backward is only its weight gradient */
        return;
    tp_embedding_backward(m->be, &m->tp, m->og.wte, m->og.wpe, m->s.dwpe_part, m->s.dres, m->s.full,
                          m->cur.ids, m->cur.pos, d->N, d->Tw, d->C, d->vocab_start, d->Vp);
}

/* ---- block -------------------------------------------------------------- */

static int local_layer(const Model *m, int l)
{
    TRD_ASSERT(l >= m->sh.chunk[0].begin && l < m->sh.chunk[0].end);
    return l - m->sh.chunk[0].begin;
}

/* ---- LoRA adapters ------------------------------------------------------
 * y = x W^T + s (x A^T) B^T, s = alpha / r, on this rank's piece: a
 * column-parallel base (qkv, fc/gate, up) holds whole x, its B rows and
 * all of A; a row-parallel one (proj, down) its columns of x and A and all
 * of B, so its adapter's output is a partial sum like the base's and is
 * added BEFORE the base's reduction over TP (one reduction for both). */

/* ---- adapter dropout (model.lora.dropout = p) ----------------------------
 * PEFT's lora_dropout: the adapter of a layer sees dropout(x) = x * keep /
 * (1 - p), the base weight x itself.  keep is 0 with probability p, drawn by
 * Philox (core/rng.h) as a pure function of (run.seed, the global layer,
 * the target, the row's place in the token stream, the column's global
 * index): every layout draws the same mask for an element whichever rank
 * holds it (a row-parallel base's columns start at tp_rank x n_in), and
 * backward and a recomputing forward draw the forward's.  The rows' places
 * come from model_set_dropout_rows; a forward without them (validation,
 * eval, generate) drops nothing.  Element (row R, column c): counter
 * (R, c / 4), word c % 4 of the four, dropped when below p x 2^32: the
 * backend's dropout_philox, on the device with CUDA (no mask is stored or
 * copied; the rows are, once per micro-batch). */
static int lora_dropping(const Model *m) { return m->mc.lora.dropout > 0 && m->cur.drop_rows; }

/* x [N, n_in] (this rank's columns from col0) *= keep / (1 - p), in place:
 * the mask of target k of local layer i, on an input or on its gradient. */
static void lora_dropout(const Model *m, int i, int k, float *x, int n_in, int col0)
{
    const int l = m->sh.chunk[0].begin + i;
    const uint64_t key = rng_mix(m->drop_key, (uint64_t)l * LORA_TARGETS + (uint64_t)k);
    m->be->dropout_philox(x, m->cur.drop_rows, m->d.N, n_in, col0, key, m->mc.lora.dropout);
}

/* The adapter's input: x, or dropout(x) in s.lora_x while dropping. */
static const float *lora_input(Model *m, int i, int k, const float *x, int n_in, int col)
{
    if (!lora_dropping(m))
        return x;
    const size_t n = (size_t)m->d.N * (size_t)n_in;
    m->be->copy(m->s.lora_x, x, n * sizeof(float));
    lora_dropout(m, i, k, m->s.lora_x, n_in, col ? 0 : m->sh.tp_rank * n_in);
    return m->s.lora_x;
}

/* out [N, n_out] += s (x [N, n_in] A^T) B^T for target k of local layer i
 * (col: a column-parallel base, x whole; else x holds this rank's columns);
 * tmp [N, n_out] is scratch. */
static void lora_forward(Model *m, int i, int k, float *out, const float *x, int n_in, int n_out,
                         int col, float *tmp)
{
    if (!m->lora || m->lora_merged || !m->ap[i].a[k])
        return;
    const Backend *be = m->be;
    const int N = m->d.N, r = m->mc.lora.rank;
    x = lora_input(m, i, k, x, n_in, col);
    be->matmul_forward(m->s.lora_t, x, m->ap[i].a[k], NULL, N, n_in, r);
    be->scale(m->s.lora_t, m->lora_scale, (size_t)N * (size_t)r);
    be->matmul_forward(tmp, m->s.lora_t, m->ap[i].b[k], NULL, N, r, n_out);
    be->accumulate(out, tmp, (size_t)N * (size_t)n_out);
}

/* dB += dout^T t for the fused qkv adapter when its k and v rows are
 * replicated over kv_share TP ranks (tp > kv_heads), as the base's are:
 * dout's kv columns here come from this rank's query heads only, so those
 * rows of the new gradient are partial; they are summed over the ranks
 * holding them (tp_kv_allreduce), before adding to what earlier
 * micro-batches left, as qkv_weight_backward does for the base's rows.
 * The copies of B's kv rows then get the same update and stay equal.  (A's
 * gradient needs nothing more: dt = dout B sums over this rank's rows, kv
 * rows included, and summing that over the TP group counts each rank's
 * partial kv columns once, which add up to the whole.) */
static void lora_qkv_b_backward(Model *m, float *dB, const float *dout, const float *t,
                                const float *B)
{
    const Dims *d = &m->d;
    const size_t r = (size_t)m->mc.lora.rank, kv = 2 * (size_t)d->hs * r;
    float *gkv = dB + (size_t)d->H * (size_t)d->hs * r, *keep = m->s.lora_part;
    m->be->copy(keep, gkv, kv * sizeof(float));
    zero(m, gkv, kv);
    m->be->matmul_backward(NULL, dB, NULL, dout, t, B, d->N, (int)r, d->QKV, GRAD_ADD);
    tp_kv_allreduce(&m->tp, gkv, kv);
    m->be->accumulate(gkv, keep, kv);
}

/* The adapter's backward: dout [N, n_out] (whole rows for a row-parallel
 * base), x its input; ADDS into dA, dB and dx.  The inner activation
 * t = s x A^T is recomputed (N x r, cheaper than keeping it per layer).
 * With tp > 1 a replicated factor's gradient is a partial sum here: A's of
 * a column-parallel base (dt sums over the ranks' B rows), B's of a
 * row-parallel one (t sums over the ranks' columns); it goes through
 * lora_part and tp_add_reduced_grad, as the norms' do under SP.  dx is
 * this rank's part, reduced with the base's (column input backward). */
static void lora_backward(Model *m, int i, int k, const float *dout, const float *x, float *dx,
                          int n_in, int n_out, int col)
{
    if (!m->lora || !m->ap[i].a[k])
        return;
    TRD_ASSERT(!m->lora_merged);
    const Backend *be = m->be;
    const int N = m->d.N, r = m->mc.lora.rank, tp = tp_active(&m->tp);
    const float *A = m->ap[i].a[k], *B = m->ap[i].b[k];
    float *dA = m->ag[i].a[k], *dB = m->ag[i].b[k], *t = m->s.lora_t, *dt = m->s.lora_dt;
    const size_t Nr = (size_t)N * (size_t)r;
    x = lora_input(m, i, k, x, n_in, col); /* the forward's mask, drawn again */
    be->matmul_forward(t, x, A, NULL, N, n_in, r);
    be->scale(t, m->lora_scale, Nr);
    if (tp && !col) { /* dB = dout^T t, t partial */
        zero(m, m->s.lora_part, (size_t)n_out * (size_t)r);
        be->matmul_backward(NULL, m->s.lora_part, NULL, dout, t, B, N, r, n_out, GRAD_ADD);
        tp_add_reduced_grad(&m->tp, dB, m->s.lora_part, (size_t)n_out * (size_t)r);
    } else if (k == LT_QKV && m->tp.kv_share > 1) {
        lora_qkv_b_backward(m, dB, dout, t, B);
    } else {
        be->matmul_backward(NULL, dB, NULL, dout, t, B, N, r, n_out, GRAD_ADD);
    }
    be->matmul_backward(dt, NULL, NULL, dout, NULL, B, N, r, n_out, GRAD_SET); /* dt = s dout B */
    be->scale(dt, m->lora_scale, Nr);
    if (tp && col) { /* dA = dt^T x, dt partial */
        zero(m, m->s.lora_part, (size_t)r * (size_t)n_in);
        be->matmul_backward(NULL, m->s.lora_part, NULL, dt, x, A, N, n_in, r, GRAD_ADD);
        tp_add_reduced_grad(&m->tp, dA, m->s.lora_part, (size_t)r * (size_t)n_in);
    } else {
        be->matmul_backward(NULL, dA, NULL, dt, x, A, N, n_in, r, GRAD_ADD);
    }
    if (!lora_dropping(m)) {
        be->matmul_backward(dx, NULL, NULL, dt, NULL, A, N, n_in, r, GRAD_ADD);
        return;
    }
    /* dx += dropout'(dt A): the same mask and scale on the gradient (lora_x
     * held dropout(x), no longer needed) */
    const size_t n = (size_t)N * (size_t)n_in;
    be->matmul_backward(m->s.lora_x, NULL, NULL, dt, NULL, A, N, n_in, r, GRAD_SET);
    lora_dropout(m, i, k, m->s.lora_x, n_in, col ? 0 : m->sh.tp_rank * n_in);
    be->accumulate(dx, m->s.lora_x, n);
}

/* Row-parallel linear: out [N, C] = inp [N, K] @ W^T over this rank's K
 * columns, then the row output boundary (sum over TP, kept rows: out's
 * first d.Ns) and the replicated bias, once. */
static void row_linear_forward(Model *m, float *out, GemmIn inp, int x16, const float *w,
                               const float *b, int K, int i, int k)
{
    const Dims *d = &m->d;
    if (!tp_active(&m->tp)) {
        gemm_in_forward(m->be, x16, out, inp, w, b, d->N, K, d->C);
        lora_forward(m, i, k, out, inp.f, K, d->C, 0, m->s.dln);
        return;
    }
    gemm_in_forward(m->be, x16, out, inp, w, NULL, d->N, K, d->C);
    lora_forward(m, i, k, out, inp.f, K, d->C, 0, m->s.dln); /* partial, like out */
    tp_row_output_forward(&m->tp, out, b, d->N, d->C);
}

/* Whether target k of local layer i has an adapter that runs (lora_forward). */
static int lora_on(const Model *m, int i, int k)
{
    return m->lora && !m->lora_merged && m->ap[i].a[k];
}

/* GPT-2's fc + GELU as one backend op (matmul_gelu_forward), where the
 * backend has it and no adapter adds to fc between the two. */
static int mlp_fused_gelu(const Model *m, int i)
{
    return m->d.gpt2 && m->be->matmul_gelu_forward && !lora_on(m, i, LT_FC);
}

/* The MLP projection's backward through the GELU in one op
 * (matmul_backward_dgelu), where no adapter adds to its input gradient. */
static int mlp_fused_dgelu(const Model *m, int i)
{
    return m->d.gpt2 && m->be->matmul_backward_dgelu && !(m->lora && m->ap[i].a[LT_FCPROJ]);
}

/* MLP up to the input of its projection: fc_act = act(fc(ln2)). */
static void mlp_forward(Model *m, int i, const LayerParams *p, LayerActs *a)
{
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const size_t NF = (size_t)d->N * (size_t)d->F;
    if (mlp_fused_gelu(m, i) && m->x16) {
        be->matmul_gelu_forward_x16(a->fc_act.h, a->fc, a->ln2.h, p->fc_w, p->fc_b, d->N, d->C,
                                    d->F);
        return;
    }
    if (mlp_fused_gelu(m, i)) {
        be->matmul_gelu_forward(a->fc_act.f, a->fc, a->ln2.f, p->fc_w, p->fc_b, d->N, d->C, d->F);
        return;
    }
    x_matmul_forward(m, a->fc, a->ln2, p->fc_w, p->fc_b, d->N, d->C, d->F);
    lora_forward(m, i, LT_FC, a->fc, a->ln2.f, d->C, d->F, 1, m->s.dfc);
    if (d->gpt2) {
        TRD_ASSERT(!m->x16); /* x16 tables have the fused op, and no adapter runs */
        be->gelu_forward(a->fc_act.f, a->fc, NF);
    } else {
        x_matmul_forward(m, a->up, a->ln2, p->up_w, NULL, d->N, d->C, d->F);
        lora_forward(m, i, LT_UP, a->up, a->ln2.f, d->C, d->F, 1, m->s.dup);
        if (m->x16)
            be->swiglu_forward_x16(a->fc_act.h, a->fc, a->up, NF);
        else
            be->swiglu_forward(a->fc_act.f, a->fc, a->up, NF);
    }
}

/* The attention of this rank's heads over whole sequences, within the
 * documents model_set_positions gave. */
static AttnArgs model_attn_args(const Model *m)
{
    AttnArgs a = attn_args(m->d.B, m->d.T, m->d.H, m->d.KVH, m->d.hs);
    a.pos = m->cur.pos;
    return a;
}

/* a->atty, a->lse (and with x16 a->atty16) from a->qkv: over whole
 * sequences here, or across the context-parallel group, whose positions
 * model_set_positions always gives. */
static void attention_forward(Model *m, LayerActs *a)
{
    if (m->cp > 1) {
        TRD_ASSERT(m->cur.pos && m->cpa.kv);
        cp_attention_forward(&m->cpa, a->atty, a->atty16, a->lse, a->qkv, m->cur.pos);
        return;
    }
    AttnArgs aa = model_attn_args(m);
    aa.out16 = a->atty16;
    m->be->attention_forward(a->atty, a->lse, a->qkv, a->qkv, &aa);
}

/* The attention projection's input: atty's bf16 copy where x16 (the
 * attention wrote it), else atty; attention_backward reads the fp32 atty
 * either way. */
static GemmIn atty_in(const Model *m, const LayerActs *a)
{
    GemmIn x;
    if (m->x16)
        x.h = a->atty16;
    else
        x.f = a->atty;
    return x;
}

/* Layer i (local index) from resid[i].  With need_output == 0 (recompute
 * inside backward) the last projection is skipped: backward needs only its
 * input, and resid[i+1] must not be touched. */
static void block_forward(Model *m, int i, int need_output)
{
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const LayerParams *p = &m->lp[i];
    LayerActs *a = &m->cur.la[i];
    const float *x = m->cur.resid[i];
    const size_t NsC = (size_t)d->Ns * (size_t)d->C;

    norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1_w, p->ln1_b);
    x_matmul_forward(m, a->qkv, a->ln1, p->qkv_w, p->qkv_b, d->N, d->C, d->QKV);
    lora_forward(m, i, LT_QKV, a->qkv, a->ln1.f, d->C, d->QKV, 1, m->s.dqkv);
    if (!d->gpt2)
        be->rope_forward(a->qkv, m->cur.pos, d->N, d->T, 0, d->H, d->KVH, d->hs, d->rope);
    attention_forward(m, a);
    row_linear_forward(m, m->s.branch, atty_in(m, a), m->x16, p->attn_proj_w, p->attn_proj_b,
                       d->H * d->hs, i, LT_PROJ);
    residual_norm_forward(m, a->res_mid, a->ln2, a->ln2_mean, a->ln2_rstd, x, m->s.branch, p->ln2_w,
                          p->ln2_b);
    if (p->router_w) { /* a MoE layer: its branch whole, or (recompute) its activations */
        moe_forward(m, p, a, need_output ? m->s.branch : NULL);
        if (need_output)
            be->add(m->cur.resid[i + 1], a->res_mid, m->s.branch, NsC);
        return;
    }
    mlp_forward(m, i, p, a);
    if (!need_output)
        return;
    row_linear_forward(m, m->s.branch, a->fc_act, m->x16, p->mlp_proj_w, p->mlp_proj_b, d->F, i,
                       LT_FCPROJ);
    be->add(m->cur.resid[i + 1], a->res_mid, m->s.branch, NsC);
}

void model_block_forward(Model *m, int l)
{
    tp_group_check(&m->tp);
    lora_widen(m, local_layer(m, l));
    block_forward(m, local_layer(m, l), 1);
}

/* Gradient at the MLP projection's input (dfc_act) -> gradient at ln2's
 * output (dln, overwritten).  dfc_set: the gradient at fc (dfc) is already
 * there (matmul_backward_dgelu), dfc_act is not.  The first op to write
 * each of dfc, dup and dln SETS it (no zeroing pass); those after it add. */
static void mlp_backward(Model *m, int i, const LayerParams *p, const LayerParams *g,
                         const LayerActs *a, int dfc_set)
{
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const Scratch *s = &m->s;
    const size_t NF = (size_t)d->N * (size_t)d->F;
    TRD_ASSERT(!dfc_set || d->gpt2);
    GradMode fc_dln = GRAD_SET; /* the fc GEMM writes dln first, unless up did */
    if (!d->gpt2 && m->x16 && be->swiglu_backward_x16 && be->matmul_backward_d16) {
        /* bf16 storage (no LoRA there): the gradients at gate and up are
         * stored in bf16 only, the bits their GEMMs rounded them to, in
         * the first halves of dfc and dup; their GEMMs read them as they
         * are (no bias in a Llama) */
        uint16_t *dgate = (uint16_t *)s->dfc, *dup = (uint16_t *)s->dup;
        TRD_ASSERT(!g->fc_b && !p->fc_b && !m->lora);
        be->swiglu_backward_x16(dgate, dup, s->dfc_act, a->fc, a->up, NF);
        be->matmul_backward_d16(s->dln, g->up_w, dup, a->ln2.h, p->up_w, d->N, d->C, d->F,
                                GRAD_SET);
        be->matmul_backward_d16(s->dln, g->fc_w, dgate, a->ln2.h, p->fc_w, d->N, d->C, d->F,
                                GRAD_ADD);
        return;
    }
    if (d->gpt2) {
        if (!dfc_set)
            be->gelu_backward(s->dfc, a->fc, s->dfc_act, NF, GRAD_SET);
    } else {
        be->swiglu_backward(s->dfc, s->dup, s->dfc_act, a->fc, a->up, NF, GRAD_SET);
        /* ln2's output feeds both gate and up: the two contributions add in dln. */
        x_matmul_backward(m, s->dln, GRAD_SET, g->up_w, NULL, s->dup, a->ln2, p->up_w, d->N, d->C,
                          d->F);
        lora_backward(m, i, LT_UP, s->dup, a->ln2.f, s->dln, d->C, d->F, 1);
        fc_dln = GRAD_ADD;
    }
    x_matmul_backward(m, s->dln, fc_dln, g->fc_w, g->fc_b, s->dfc, a->ln2, p->fc_w, d->N, d->C,
                      d->F);
    lora_backward(m, i, LT_FC, s->dfc, a->ln2.f, s->dln, d->C, d->F, 1);
}

/* The fused qkv weight (and bias) gradient, and the input gradient SET in
 * s.dln (its first writer).  Replicated kv rows (kv_share > 1: the last
 * 2*hs local rows, one kv group) get only this rank's query heads' part
 * here, so they are summed over the ranks sharing them; what earlier
 * micro-batches accumulated in those rows is set aside first, so only the
 * new part is reduced. */
static void qkv_weight_backward(Model *m, const LayerParams *p, const LayerParams *g,
                                const LayerActs *a)
{
    const Dims *d = &m->d;
    const Scratch *s = &m->s;
    if (!g->qkv_w) { /* frozen (LoRA): the input gradient only */
        x_matmul_backward(m, s->dln, GRAD_SET, NULL, NULL, s->dqkv, a->ln1, p->qkv_w, d->N, d->C,
                          d->QKV);
        return;
    }
    const int shared = m->tp.kv_share > 1;
    const size_t kv_w = 2 * (size_t)d->hs * (size_t)d->C, kv_b = 2 * (size_t)d->hs;
    float *gw = g->qkv_w + (size_t)d->H * (size_t)d->hs * (size_t)d->C;
    float *gb = g->qkv_b ? g->qkv_b + (size_t)d->H * (size_t)d->hs : NULL;
    if (shared) {
        m->be->copy(s->kv_keep, gw, kv_w * sizeof(float));
        zero(m, gw, kv_w);
        if (gb) {
            m->be->copy(s->kv_keep + kv_w, gb, kv_b * sizeof(float));
            zero(m, gb, kv_b);
        }
    }
    x_matmul_backward(m, s->dln, GRAD_SET, g->qkv_w, g->qkv_b, s->dqkv, a->ln1, p->qkv_w, d->N,
                      d->C, d->QKV);
    if (shared) {
        tp_kv_allreduce(&m->tp, gw, kv_w);
        m->be->accumulate(gw, s->kv_keep, kv_w);
        if (gb) {
            tp_kv_allreduce(&m->tp, gb, kv_b);
            m->be->accumulate(gb, s->kv_keep + kv_w, kv_b);
        }
    }
}

/* On entry s.dres holds d loss / d (output of layer l); on return it holds
 * d loss / d (input of layer l).  The residual connections make this an
 * in-place update: out = res_mid + mlp(ln2(res_mid)), so d res_mid is
 * dres itself (the identity path) PLUS what flows back through ln2, and
 * norm_backward ADDS into dres.  The same holds for res_mid = x + attn(...).
 * Every other gradient buffer starts fresh: the op that writes it first
 * SETS it (GRAD_SET), the later ones add.  Under SP dres holds this rank's
 * d.Ns rows; each branch's backward reads it made whole
 * (tp_row_output_backward), which also makes the row-parallel bias
 * gradients complete on every rank. */
void model_block_backward(Model *m, int l)
{
    const int i = local_layer(m, l);
    lora_widen(m, i); /* before p's fields are read */
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const Scratch *s = &m->s;
    const LayerParams *p = &m->lp[i], *g = &m->lg[i];
    const LayerActs *a = &m->cur.la[i];
    const size_t N = (size_t)d->N;

    tp_group_check(&m->tp);
    if (m->recompute == RECOMPUTE_FULL)
        block_forward(m, i, 0);
    else if (m->recompute == RECOMPUTE_SELECTIVE)
        /* Into the shared atty (and its copy) and lse, from this layer's own qkv. */
        attention_forward(m, (LayerActs *)a);

    /* MLP branch: its output joined the stream by addition, so its gradient is dres. */
    const float *dout = tp_row_output_backward(&m->tp, s->dres, s->full, d->N, d->C);
    if (p->router_w) {
        moe_backward(m, p, g, a, dout); /* sets dln */
    } else if (mlp_fused_dgelu(m, i)) { /* sets dfc, through the GELU */
        if (m->x16)
            be->matmul_backward_dgelu_x16(s->dfc, g->mlp_proj_w, g->mlp_proj_b, dout, a->fc_act.h,
                                          a->fc, p->mlp_proj_w, d->N, d->F, d->C);
        else
            be->matmul_backward_dgelu(s->dfc, g->mlp_proj_w, g->mlp_proj_b, dout, a->fc_act.f,
                                      a->fc, p->mlp_proj_w, d->N, d->F, d->C);
        mlp_backward(m, i, p, g, a, 1);
    } else {
        x_matmul_backward(m, s->dfc_act, GRAD_SET, g->mlp_proj_w, g->mlp_proj_b, dout, a->fc_act,
                          p->mlp_proj_w, d->N, d->F, d->C);
        lora_backward(m, i, LT_FCPROJ, dout, a->fc_act.f, s->dfc_act, d->F, d->C, 0);
        mlp_backward(m, i, p, g, a, 0);
    }
    norm_backward(m, s->dres, g->ln2_w, g->ln2_b, s->dln, a->res_mid, p->ln2_w, a->ln2_mean,
                  a->ln2_rstd);

    /* Attention branch, same pattern; dres is now d loss / d res_mid. */
    dout = tp_row_output_backward(&m->tp, s->dres, s->full, d->N, d->C);
    x_matmul_backward(m, s->datty, GRAD_SET, g->attn_proj_w, g->attn_proj_b, dout, atty_in(m, a),
                      p->attn_proj_w, d->N, d->H * d->hs, d->C);
    lora_backward(m, i, LT_PROJ, dout, a->atty, s->datty, d->H * d->hs, d->C, 0);
    if (m->cp > 1) { /* block pairs over ranks, each adding its part */
        zero(m, s->dqkv, N * (size_t)d->QKV);
        cp_attention_backward(&m->cpa, s->dqkv, s->datty, a->qkv, a->atty, a->lse, m->cur.pos);
    } else { /* one call writes every element of dqkv */
        AttnArgs aa = model_attn_args(m);
        aa.grad = GRAD_SET;
        be->attention_backward(s->dqkv, s->dqkv, s->datty, a->qkv, a->qkv, a->atty, a->lse, &aa);
    }
    if (!d->gpt2) /* dqkv was w.r.t. rotated q, k: rotate back */
        be->rope_backward(s->dqkv, m->cur.pos, d->N, d->T, 0, d->H, d->KVH, d->hs, d->rope);
    qkv_weight_backward(m, p, g, a);
    lora_backward(m, i, LT_QKV, s->dqkv, a->ln1.f, s->dln, d->C, d->QKV, 1);
    norm_backward(m, s->dres, g->ln1_w, g->ln1_b, s->dln, m->cur.resid[i], p->ln1_w, a->ln1_mean,
                  a->ln1_rstd);
}

/* ---- head --------------------------------------------------------------- */

float model_head_forward(Model *m, const int32_t *targets)
{
    lora_widen(m, WIDE_HEAD);
    const Backend *be = m->be;
    const Dims *d = &m->d;
    HeadActs *h = &m->cur.ha;
    TRD_ASSERT(m->sh.has_head);
    tp_group_check(&m->tp);
    memcpy(m->cur.targets, targets, (size_t)d->N * sizeof(int32_t));
    const int32_t *dev_targets = m->cur.ids + d->N;
    if (be->device)
        be->to_backend(m->cur.ids + d->N, targets, (size_t)d->N * sizeof(int32_t));

    /* The head is column-parallel over the vocabulary: its input (the final
     * norm's output) whole, logits of this rank's vocabulary columns. */
    norm_forward(m, h->lnf, h->lnf_mean, h->lnf_rstd, m->cur.resid[m->nl], m->op.lnf_w,
                 m->op.lnf_b);
    if (m->x16_logits)
        be->head_forward_x16(h->logits.h, h->lnf.h, m->op.head_w, d->N, d->C, d->Vp);
    else
        x_matmul_forward(m, h->logits.f, h->lnf, m->op.head_w, NULL, d->N, d->C, d->Vp);
    int counted = 0;
    for (int n = 0; n < d->N; n++)
        counted += m->cur.targets[n] >= 0;
    m->cur.counted = counted;
    const int fuse = m->fuse_next && !tp_active(&m->tp);
    m->cur.ce_fused = fuse;
    m->cur.ce_scale = m->fuse_scale;
    m->fuse_next = 0;
    const float fuse_dloss = counted ? m->fuse_scale / (float)counted : 0.0f;
    if (m->x16_logits) /* the losses, and with fuse dlogits in place */
        be->crossentropy_x16(h->losses, h->logits.h, dev_targets, fuse, fuse ? fuse_dloss : 0.0f,
                             d->N, d->V, d->Vp);
    else if (fuse) /* model_head_backward's dloss */
        be->crossentropy_fused(h->losses, h->logits.f, dev_targets, fuse_dloss, d->N, d->V, d->Vp);
    else if (tp_active(&m->tp))
        tp_crossentropy_forward(&m->tp, h->losses, h->ce_stats, h->logits.f, dev_targets,
                                m->cur.targets, d->N, d->V, d->Vp, d->vocab_start, d->vocab);
    else
        be->crossentropy_forward(h->losses, h->logits.f, dev_targets, d->N, d->V, d->Vp);
    if (fuse && m->step_state) { /* summed in backend memory: no wait here */
        be->loss_add(m->step_state, h->losses, dev_targets, d->N, m->cur.ce_scale);
        return 0.0f;
    }

    const float *losses = h->losses;
    if (be->device) {
        be->to_host(m->host_losses, h->losses, (size_t)d->N * sizeof(float));
        losses = m->host_losses;
    }
    double sum = 0.0;
    for (int n = 0; n < d->N; n++)
        if (m->cur.targets[n] >= 0)
            sum += losses[n];
    return counted ? (float)(sum / counted) : 0.0f;
}

void model_head_fuse(Model *m, float loss_scale)
{
    m->fuse_next = 1;
    m->fuse_scale = loss_scale;
}

BackendStepState *model_step_state(Model *m)
{
    return m->sh.has_head ? (BackendStepState *)(void *)m->s.step : NULL;
}

void model_set_step_state(Model *m, BackendStepState *s) { m->step_state = s; }

/* Starts the residual-stream gradient: s.dres is SET (zeroed, then the
 * final norm's backward adds into it), since nothing flowed into it yet. */
void model_head_backward(Model *m, float loss_scale)
{
    lora_widen(m, WIDE_HEAD);
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const Scratch *s = &m->s;
    HeadActs *h = &m->cur.ha;
    TRD_ASSERT(m->sh.has_head);

    /* d(loss_scale * mean loss)/d loss[n] for every counted position. */
    const float dloss = m->cur.counted ? loss_scale / (float)m->cur.counted : 0.0f;
    if (m->cur.ce_fused) /* the forward wrote dlogits already, with this scale */
        TRD_ASSERT(m->cur.ce_scale == loss_scale);
    else if (m->x16_logits) /* the bf16 logits again, the max and sum recomputed */
        be->crossentropy_x16(NULL, h->logits.h, m->cur.ids + d->N, 1, dloss, d->N, d->V, d->Vp);
    else if (tp_active(&m->tp))
        tp_crossentropy_backward(&m->tp, h->logits.f, h->ce_stats, m->cur.ids + d->N, dloss, d->N,
                                 d->V, d->Vp, d->vocab_start);
    else
        be->crossentropy_backward(h->logits.f, m->cur.ids + d->N, dloss, d->N, d->V, d->Vp);
    const GemmIn dlogits = h->logits;

    /* dln SET; with tied embeddings og.head_w is the wte gradient: the
     * embedding's backward adds its own contribution to the same rows later. */
    if (m->x16_logits)
        be->matmul_backward_d16(s->dln, m->og.head_w, dlogits.h, h->lnf.h, m->op.head_w, d->N, d->C,
                                d->Vp, GRAD_SET);
    else
        x_matmul_backward(m, s->dln, GRAD_SET, m->og.head_w, NULL, dlogits.f, h->lnf, m->op.head_w,
                          d->N, d->C, d->Vp);
    zero(m, s->dres, (size_t)d->Ns * (size_t)d->C);
    norm_backward(m, s->dres, m->og.lnf_w, m->og.lnf_b, s->dln, m->cur.resid[m->nl], m->op.lnf_w,
                  h->lnf_mean, h->lnf_rstd);
}

/* ---- the whole shard ---------------------------------------------------- */

float model_forward(Model *m, const int32_t *tokens, const int32_t *targets)
{
    if (m->sh.has_embed)
        model_embed_forward(m, tokens);
    for (int l = m->sh.chunk[0].begin; l < m->sh.chunk[0].end; l++)
        model_block_forward(m, l);
    return m->sh.has_head ? model_head_forward(m, targets) : 0.0f;
}

void model_set_loss_scale(Model *m, float loss_scale) { m->loss_scale = loss_scale; }

MoeStats model_take_moe_stats(Model *m)
{
    const MoeStats s = m->moe_stats;
    memset(&m->moe_stats, 0, sizeof m->moe_stats);
    return s;
}

void model_backward(Model *m, float loss_scale)
{
    model_set_loss_scale(m, loss_scale);
    if (m->sh.has_head)
        model_head_backward(m, loss_scale);
    for (int l = m->sh.chunk[0].end - 1; l >= m->sh.chunk[0].begin; l--)
        model_block_backward(m, l);
    if (m->sh.has_embed)
        model_embed_backward(m);
}

/* Model FLOPs per token of one forward + backward (the MFU convention;
 * with model.moe the active weights: the MLPs a token goes through):
 *   6 * P_matmul + 12 * L * T * C
 * P_matmul = L * (qkv + attention projection + MLP weights) + V * C counts
 * every weight that takes part in a matrix multiply, the LM head included
 * (with the real, unpadded vocabulary V); embedding lookups are not matmuls
 * and are excluded.  Each such weight costs 2 FLOPs per token forward and
 * 4 backward.  Attention scores and the weighted sum cost 2 * 2 * T * C per
 * token and layer forward, times 3 with backward; the causal mask's halving
 * is not applied (PaLM / Megatron convention). */
double model_flops_per_token(const ModelConfig *mc)
{
    const double C = mc->hidden, L = mc->layers, T = mc->seq_len, F = mc->ffn_hidden;
    const double H = mc->heads, KVH = mc->kv_heads > 0 ? mc->kv_heads : mc->heads;
    const double hs = C / H;
    const double qkv = (H + 2.0 * KVH) * hs * C;
    const double proj = H * hs * C;
    const double per_f = (mc->arch == ARCH_GPT2 ? 2.0 : 3.0) * C;
    /* A MoE layer's active weights per token: the router, top_k experts
     * and the shared experts. */
    double mlp_total = 0;
    for (int l = 0; l < mc->layers; l++)
        mlp_total += config_moe_layer(mc, l)
                         ? (double)mc->moe_experts * C +
                               per_f * config_moe_ffn(mc) * (mc->moe_top_k + mc->moe_shared_experts)
                         : per_f * F;
    const double matmul_params = L * (qkv + proj) + mlp_total + (double)mc->vocab * C;
    return 6.0 * matmul_params + 12.0 * L * T * C;
}

/* ---- for the planner ------------------------------------------------------ */

MemoryReport model_plan_memory(const Config *cfg, const ParamShard *sh, int B, int n_sets)
{
    TRD_ASSERT(sh->n_chunks == 1 && n_sets >= 1);
    check_config(&cfg->model, B);
    Model m = {.mc = cfg->model,
               .sh = *sh,
               .recompute = cfg->training.recompute,
               .lora = cfg->model.lora.rank > 0}; /* the adapters' scratch */
    m.nl = sh->chunk[0].end - sh->chunk[0].begin;
    const int sp = cfg->topology.sequence_parallel;
    m.cp = config_cp(cfg);
    m.ep = config_ep(cfg);
    check_tp(&m.mc, sh, sp, m.cp, B);
    const int kv_share = m.mc.kv_heads % sh->tp ? sh->tp / m.mc.kv_heads : 1;
    m.tp = tp_group_layout(NULL, sh->tp, sh->tp_rank, sp, kv_share); /* sizes only */
    params_build(&m.table, &m.mc, sh);
    if (m.lora) /* the sizes of the frozen weights' (the vocabulary rows) */
        params_build_base(&m.base_table, &m.mc, sh);
    m.d = make_dims(&m, B);
    /* the bf16 tables (training.precision: bf16) have the *_x16 ops */
    m.x16 = cfg->training.precision == PREC_BF16 && x16_layout_ok(&m.mc, sp);
    m.x16_logits = m.x16 && sh->tp == 1; /* and their head ops */
    /* Count with the carvers model_create_unbound uses (base NULL: sizes only). */
    m.cur.resid = trd_calloc((size_t)m.nl + 1, sizeof(float *), "residual pointers");
    m.cur.la = trd_calloc((size_t)m.nl + 1, sizeof(LayerActs), "layer activation pointers");
    Carver acts = {0}, scratch = {0};
    carve_activations(&m, &acts);
    carve_scratch(&m, &scratch);
    free(m.cur.resid);
    free(m.cur.la);
    params_free(&m.table);
    if (m.lora)
        params_free(&m.base_table);
    MemoryReport r = {0};
    r.activations =
        (size_t)n_sets * (acts.used * sizeof(float) + set_id_bytes(&m.mc, (size_t)m.d.N));
    r.scratch = scratch.used * sizeof(float) +
                cp_attention_bytes(m.cp, m.d.B / 2, m.d.T, m.d.H, m.d.KVH, m.d.hs);
    return r;
}

/* W [rows, cols] += s B [rows, r] A [r, cols], all host memory. */
static void add_low_rank(float *w, const float *b, const float *a, int64_t rows, int64_t cols,
                         int r, float s)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; i++)
        for (int k = 0; k < r; k++) {
            const float f = s * b[i * r + k];
            for (int64_t j = 0; j < cols; j++)
                w[i * cols + j] += f * a[(int64_t)k * cols + j];
        }
}

/* Merged in this rank's pieces: a column-parallel base's rows are its B
 * rows times all of A, a row-parallel base's columns all of B times its
 * A columns, so every piece merges alone. */
void model_lora_merge(Model *m)
{
    if (!m->lora || m->lora_merged)
        return;
    TRD_ASSERT(!m->base_bf16); /* merged in fp32: trainer_load_model's models */
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const int r = m->mc.lora.rank;
    for (int i = 0; i < m->nl; i++) {
        float *w[LORA_TARGETS] = {m->lp[i].qkv_w, m->lp[i].attn_proj_w, m->lp[i].fc_w,
                                  m->lp[i].up_w, m->lp[i].mlp_proj_w};
        const int64_t rows[LORA_TARGETS] = {d->QKV, d->C, d->F, d->F, d->C};
        const int64_t cols[LORA_TARGETS] = {d->C, (int64_t)d->H * d->hs, d->C, d->C, d->F};
        for (int k = 0; k < LORA_TARGETS; k++) {
            if (!m->ap[i].a[k])
                continue;
            const size_t nw = (size_t)(rows[k] * cols[k]), na = (size_t)r * (size_t)cols[k],
                         nb = (size_t)rows[k] * (size_t)r;
            float *hw = trd_malloc((nw + na + nb) * sizeof(float), "merged weight");
            float *ha = hw + nw, *hb = ha + na;
            be->to_host(hw, w[k], nw * sizeof(float));
            be->to_host(ha, m->ap[i].a[k], na * sizeof(float));
            be->to_host(hb, m->ap[i].b[k], nb * sizeof(float));
            add_low_rank(hw, hb, ha, rows[k], cols[k], r, m->lora_scale);
            be->to_backend(w[k], hw, nw * sizeof(float));
            free(hw);
        }
    }
    m->lora_merged = 1;
}
