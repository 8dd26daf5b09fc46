/* model_internal.h — the Model's data structures, shared by the files of
 * src/model that run it (model.c: training forward and backward; decode.c:
 * generation with a key/value cache).  Not for use outside src/model:
 * everything else goes through model.h. */
#ifndef TRD_MODEL_INTERNAL_H
#define TRD_MODEL_INTERNAL_H

#include "model/model.h"
#include "context_par/cp_attention.h"
#include "tensor_par/tensor_par.h"

/* Sizes of one step, local to this rank. */
typedef struct {
    int gpt2;
    int B, T, N, C;  /* N = B*T token rows; with context parallelism B is 2 x the
                        micro-batch (each sequence's two chunks) and T a chunk */
    int Tw;          /* rows of the position table: model.seq_len */
    int Ns;          /* rows of the residual stream held: N, or N/tp with SP */
    int hs;          /* head size */
    int H, KVH;      /* local query heads and kv heads */
    int QKV;         /* local rows of the fused qkv weight: (H + 2*KVH)*hs */
    int E, K;        /* MoE: experts and top_k (0 for a dense model) */
    int Fe, Fs;      /* MoE: an expert's hidden size; the shared experts' (0: none), per TP rank */
    int R;           /* MoE: most rows dispatched, N * K */
    int El, Re;      /* MoE: experts held (E / ep) and most rows they receive
                        (R when ep is 1; else ep x N x min(K, El)) */
    int F;           /* local MLP hidden size */
    int Vp;          /* local (padded) vocabulary rows */
    int V;           /* of which real: columns the loss counts */
    int vocab_start; /* first global vocabulary row held */
    int vocab;       /* the whole real vocabulary (targets are below it) */
    float eps;
    RopeFreq rope; /* model_rope_freq(mc) */
} Dims;

/* One layer's tensors in a flat buffer (parameters or gradients).  Absent
 * tensors (biases in Llama, `up` in GPT-2) are NULL.  The array view lets
 * model_bind re-point all of them at once. */
enum { LP_FIELDS = 19 };
typedef union {
    struct {
        float *ln1_w, *ln1_b;
        float *qkv_w, *qkv_b;
        float *attn_proj_w, *attn_proj_b;
        float *ln2_w, *ln2_b;
        /* The MLP; in a MoE layer its shared experts (moe.shared.*), NULL
         * without them. */
        float *fc_w, *fc_b;             /* GPT-2 mlp.fc; Llama mlp.gate */
        float *up_w;                    /* Llama mlp.up */
        float *mlp_proj_w, *mlp_proj_b; /* GPT-2 mlp.proj; Llama mlp.down */
        /* MoE layers only (moe.router, moe.experts.*: E experts stacked by rows). */
        float *router_w;            /* [E, C] */
        float *x_fc_w, *x_fc_b;     /* [E*Fe, C], [E*Fe]: GPT-2 fc; Llama gate */
        float *x_up_w;              /* [E*Fe, C] Llama up */
        float *x_proj_w, *x_proj_b; /* [E*C, Fe], [E*C]: GPT-2 proj; Llama down */
    };
    float *f[LP_FIELDS];
} LayerParams;

/* LoRA adapters of one layer in a flat buffer (parameters or gradients):
 * A and B of each target, in LORA_* bit order (qkv, proj, fc/gate, up,
 * fc proj/down); NULL where a target has none.  The bind offsets are a
 * GroupOffsets' first LF_FIELDS. */
enum { LORA_TARGETS = 5, LF_FIELDS = 2 * LORA_TARGETS };
enum { LT_QKV = 0, LT_PROJ = 1, LT_FC = 2, LT_UP = 3, LT_FCPROJ = 4 };
typedef union {
    struct {
        float *a[LORA_TARGETS], *b[LORA_TARGETS];
    };
    float *f[LF_FIELDS];
} LoraParams;

/* Embedding and head tensors in a flat buffer (NULL where not held). */
enum { OP_FIELDS = 5 };
typedef union {
    struct {
        float *wte, *wpe; /* [Vp, C], [T, C] */
        float *lnf_w, *lnf_b;
        float *head_w; /* [Vp, C]: head.weight, or wte when tied */
    };
    float *f[OP_FIELDS];
} OuterParams;

/* Where each field of a group lives: the tensor's flat offset, or NO_TENSOR.
 * Computed once from the table; binding a group to storage is then pointer
 * arithmetic, never a lookup by name. */
#define NO_TENSOR ((size_t)-1)
typedef struct {
    size_t lo, hi;         /* the group's flat range */
    size_t off[LP_FIELDS]; /* per field (OuterParams uses the first OP_FIELDS) */
    /* A MoE layer whose experts are divided over ep (params.h): fields from
     * LP_EXPERTS on live in the expert region, group PARAMS_EXPERTS(l) at
     * [x_lo, x_hi), bound by model_bind_experts; model_bind leaves them. */
    int x_split;
    size_t x_lo, x_hi;
} GroupOffsets;
enum { LP_EXPERTS = 14 }; /* the first stacked-experts field of LayerParams */

/* Activations of one layer that its backward reads.  Under recompute some
 * of these point into one set shared by all layers (see carve_activations). */
enum {
    A_LN1,
    A_LN1_MEAN,
    A_LN1_RSTD,
    A_QKV,
    A_LSE,
    A_ATTY,
    A_ATTY16,
    A_RES_MID,
    A_LN2,
    A_LN2_MEAN,
    A_LN2_RSTD,
    A_FC,
    A_UP,
    A_FC_ACT,
    /* MoE layers only (0 elsewhere); R = N * top_k rows at most, Re rows
     * for what this rank's experts receive (A_X_IN .. A_X_ACT) */
    A_R_LOGITS,
    A_R_PROBS,
    A_R_LSE,
    A_R_W,
    A_R_IDX,
    A_R_SLOT,
    A_X_IN,
    A_X_FC,
    A_X_UP,
    A_X_ACT,
    A_X_OUT,
    A_COUNT
};

/* A MoE layer's dispatch plan for one micro-batch, in host memory: which
 * rows each expert got (the backend's r_slot holds the rows themselves). */
typedef struct {
    int R;                        /* rows dispatched: assignments kept */
    int dropped;                  /* assignments over the capacity (0 when dropless) */
    int off[MOE_MAX_EXPERTS + 1]; /* expert e's rows are [off[e], off[e+1]) */
    int count[MOE_MAX_EXPERTS];   /* assignments the router made to e (before capacity) */
    /* What this rank's El experts receive (expert parallelism; with ep 1
     * the same as off): block i = p * El + j, the rows expert-parallel rank
     * p sent to local expert j, is rows [roff[i], roff[i+1]) of x_in. */
    int roff[MOE_MAX_EXPERTS + 1];
    double aux, z; /* load-balancing and z-loss, before their coefficients */
} MoeRoute;
/* An activation whose every reader is a GEMM operand (a norm's output,
 * the MLP projection's input): fp32, or bf16 bits where Model.x16 says so,
 * and then only the backend's *_x16 ops touch it (docs/design.md, "bf16
 * activation storage"). */
typedef union {
    float *f;
    uint16_t *h;
} GemmIn;

typedef struct {
    GemmIn ln1;                 /* [N,C] whole */
    float *ln1_mean, *ln1_rstd; /* [Ns], [Ns] (mean: LayerNorm only) */
    float *qkv;                 /* [N, QKV], after RoPE */
    float *lse;                 /* [B, H, T] attention log-sum-exp per query row */
    float *atty;                /* [N, H*hs] attention output, heads in order */
    uint16_t *atty16;           /* [N, H*hs] its bf16 bits, the projection's input (x16) */
    float *res_mid;             /* [Ns, C] residual stream after the attention branch */
    GemmIn ln2;
    float *ln2_mean, *ln2_rstd;
    float *fc;     /* [N, F] GPT-2: fc output before GELU; Llama: gate output */
    float *up;     /* [N, F] Llama: up output */
    GemmIn fc_act; /* [N, F] GELU(fc) or silu(gate)*up: input of the projection */
    /* MoE layers (src/model/moe.c); fc, up, fc_act are then the shared
     * experts' [N, Fs] (absent without them). */
    float *r_logits, *r_probs; /* [N, E] router logits and softmax */
    float *r_lse;              /* [N] log-sum-exp of the logits (z-loss) */
    float *r_w;                /* [N, k] the chosen experts' renormalised weights */
    int32_t *r_idx;            /* [N, k] the chosen experts (floats' storage, same size) */
    int32_t *r_slot;           /* [R] dispatched row r is assignment slot n*k + j */
    float *x_in;               /* [Re, C] this rank's experts' inputs (route->roff) */
    float *x_out;              /* [R, C] outputs for this rank's token rows, by expert */
    float *x_fc, *x_up;        /* [Re, Fe] fc/gate and up outputs */
    float *x_act;              /* [Re, Fe] the expert projection's input */
    MoeRoute *route;           /* host: this set's plan for the layer */
} LayerActs;

/* Head activations (last stage). */
typedef struct {
    GemmIn lnf;                 /* [N,C] whole */
    float *lnf_mean, *lnf_rstd; /* [Ns], [Ns] */
    GemmIn logits;   /* [N, Vp], bf16 where Model.x16_logits; backward overwrites it with dlogits */
    float *losses;   /* [N] */
    float *ce_stats; /* [3N] vocabulary-parallel cross-entropy (tp > 1) */
} HeadActs;

/* Backward scratch, shared by all layers (one layer is in backward at a time). */
typedef struct {
    float *dres;      /* [Ns,C] d loss / d residual stream, updated in place */
    float *branch;    /* [N,C] a branch's output before it joins the stream */
    float *dln;       /* [N,C] gradient at a norm's output */
    float *dqkv;      /* [N, QKV] */
    float *datty;     /* [N, H*hs] */
    float *dfc, *dup; /* [N, F] gradients at fc/gate and up outputs */
    float *dfc_act;   /* [N, F] gradient at the projection's input */
    /* tp > 1 only: */
    float *full;      /* [N, C] a stream tensor made whole (embedding, SP gathers) */
    float *norm_part; /* [2C] SP: a norm's partial weight/bias gradient */
    float *dwpe_part; /* [T, C] partial position-embedding gradient */
    float *kv_keep;   /* [2hs*(C+1)] replicated kv rows' accumulated gradient */
    /* LoRA only: */
    float *lora_t, *lora_dt; /* [N, r] the adapter's inner activation, its gradient */
    float *lora_part;        /* [r, C] (tp > 1) a replicated adapter's partial gradient */
    float *lora_x;           /* [N, max(C, F, H*hs)] (model.lora.dropout) dropout(x) */
    float *frozen_sink;      /* [2C] a frozen norm's weight gradient, computed and dropped */
    /* head only, first (aligned for its doubles): a BackendStepState */
    float *step;
    /* MoE layers: */
    float *x_dy, *x_dx;   /* [R, C] gradients at the experts' outputs and inputs (forward
                           with ep > 1: x_dy holds the rows it sends) */
    float *xr_dy, *xr_dx; /* [Re, C] ep > 1: the same for the rows this rank's experts
                             received (forward: xr_dy holds their outputs) */
    float *r_dw;          /* [N, k] gradient at the routing weights */
    float *r_dlogits;     /* [N, E] */
    float *r_auxdp;       /* [E] the load-balancing loss's d / d probs[n, e] */
} Scratch;

/* Token ids an activation set keeps per row: its token, its target and its
 * position in its document (ActSet.ids). */
enum { ID_ROWS = 3 };

/* Everything one micro-batch leaves for its backward. */
typedef struct {
    float **resid; /* [nl + 1] x [Ns, C]: resid[i] enters local layer i */
    LayerActs *la; /* [nl] */
    HeadActs ha;
    int32_t *tokens, *targets; /* [N] each, host copies of this micro-batch's */
    int32_t *ids;              /* [3N]: the same in backend memory (tokens, targets,
                                * then positions); the host copies with the CPU backend */
    const int32_t *pos;        /* ids + 2N once model_set_positions gave them, else
                                * NULL (each sequence one document) */
    uint64_t *rows;            /* [N] model.lora.dropout: the rows' places in the token
                                * stream, copied to backend memory (else NULL) */
    const uint64_t *drop_rows; /* rows once model_set_dropout_rows gave them, or NULL:
                                * no adapter dropout */
    int counted;               /* targets >= 0 in it */
    int ce_fused;              /* its head forward wrote the dlogits too (model_head_fuse) */
    float ce_scale;            /* with the loss scale ce_scale */
} ActSet;

/* Model.wide besides local layer indices: the outer group's two parts,
 * widened one at a time (the embedding; the final norm and the head), or
 * all of it with tied embeddings (the head reads wte). */
enum { WIDE_NONE = -4, WIDE_OUTER = -3, WIDE_EMBED = -2, WIDE_HEAD = -1 };

struct Model {
    const Backend *be;
    ModelConfig mc;
    ParamShard sh;
    Recompute recompute;
    ParamTable table;
    TpGroup tp;
    int cp;          /* ranks sharing each sequence (1: none) */
    int ep;          /* expert parallel: ranks splitting the experts (1: none) */
    Comm *epc;       /* their group (model_set_expert_parallel), NULL for ep 1 */
    CpAttention cpa; /* cp > 1: attention across them (model_set_context_parallel) */
    Dims d;
    int nl; /* local layers: sh.chunk[0].end - sh.chunk[0].begin */

    float *params, *grads; /* [table.numel] each, or NULL when the caller binds */
    /* LoRA (model.lora.rank > 0): `table` holds the trained adapters (ap,
     * ag), base_table the frozen weights, in `base` (allocated and owned
     * here, whatever binds the adapters); lp and op point into base, lg and
     * og stay NULL: the base gets no gradient.  lora_merged: the adapters
     * were added into base (model_lora_merge), forward skips them. */
    int lora, lora_merged;
    /* The GemmIn activations are stored in bf16 (model_x16_ok: a backend
     * with the *_x16 ops, no layout that reads them otherwise). */
    int x16;
    /* The logits and dlogits are stored in bf16 too (model_x16_logits_ok:
     * x16, the backend's head ops, one tp rank: no vocabulary split). */
    int x16_logits;
    float lora_scale;  /* alpha / r */
    uint64_t drop_key; /* model.lora.dropout: the masks' Philox key, from run.seed */
    ParamTable base_table;
    float *base;      /* fp32 base, or (base_bf16) the scratch of the widened group */
    uint16_t *base16; /* base_bf16 (model.lora.base_dtype bf16): the base's bf16 bits */
    int base_bf16;
    int wide; /* base_bf16: the group in `base` (a WIDE_ part, a local layer, WIDE_NONE) */
    size_t outer_split;           /* base_bf16: where the head's part of the outer group begins */
    LoraParams *ap, *ag;          /* [nl] */
    GroupOffsets *lora_off;       /* [nl] */
    float *host_losses;           /* [N] the head's losses read back (device backends) */
    int fuse_next;                /* model_head_fuse: the next head forward fuses its backward */
    float fuse_scale;             /* with this loss scale */
    BackendStepState *step_state; /* model_set_step_state, or NULL */
    LayerParams *lp, *lg;         /* [nl]: parameters, gradients */
    OuterParams op, og;
    GroupOffsets *lo_off; /* [nl] */
    GroupOffsets outer_off;

    /* Activations: one allocation holding n_sets sets, one per micro-batch
     * in flight (a pipeline stage under 1F1B holds several between their
     * forward and backward).  `cur` is the set in use; model_use_activation_set
     * switches it. */
    float *acts;       /* backend memory, like every buffer the ops touch */
    size_t acts_numel; /* all sets */
    int32_t *ids;      /* device backends: every set's token ids */
    uint64_t *rows;    /* model.lora.dropout: every set's rows (ActSet.rows) */
    ActSet *sets;
    int n_sets, cur_set;
    ActSet cur;

    float *scratch_buf;
    size_t scratch_numel;
    Scratch s;

    /* MoE: the loss scale of the next backward (model_set_loss_scale), host
     * copies of the router's choices, and what forwards saw since the last
     * model_take_moe_stats. */
    float loss_scale;
    int32_t *moe_idx_host, *moe_slot_host; /* [N*k], [R] (device backends) */
    float *moe_probs_host, *moe_lse_host;  /* [N*E], [N] */
    MoeStats moe_stats;
};

/* moe.c: a MoE layer's MLP branch.  Forward from a->ln2: fills a's router
 * and expert activations and its route; with out != NULL SETS out [N, C] to
 * the branch's output (shared experts plus the weighted experts), and
 * counts the micro-batch in m->moe_stats.  Backward from dout [N, C], the
 * gradient at that output: ADDS the parameter gradients into g and SETS
 * m->s.dln to the gradient at ln2's output, the router's load-balancing
 * and z-losses included with m->loss_scale. */
void moe_forward(Model *m, const LayerParams *p, LayerActs *a, float *out);
void moe_backward(Model *m, const LayerParams *p, const LayerParams *g, const LayerActs *a,
                  const float *dout);

/* act [n, F] = the MLP activation (GELU of fc, or SwiGLU of fc and up) of
 * x [n, C], the fc and up outputs kept in fc and up (moe.c; the decoder's
 * dense and MoE layers use it too). */
void mlp_in_forward(const Model *m, float *fc, float *up, float *act, const float *x,
                    const float *fc_w, const float *fc_b, const float *up_w, int n, int F);

#endif
