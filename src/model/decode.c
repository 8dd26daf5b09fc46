/* decode.c — generation with a key/value cache (model.h, "Decoding").
 *
 * The same layer as block_forward in model.c, written for n new rows of
 * one sequence at positions pos .. pos+n-1: norms, the fused qkv
 * projection, RoPE from the position offset (rope_decode), attention of
 * the new rows against the cache (attention_decode, which appends their
 * keys and values first), the output projection and the MLP, or in a
 * mixture-of-experts layer the experts (moe_branch below).  Each linear
 * layer goes with its bias and the GELU or the residual add after it, and
 * the norm before it (prenorm), through linear() (one GEMV kernel a linear
 * on CUDA, the norm recomputed inside it: a few rows of C floats; Llama's
 * gate, up and SwiGLU one of them).  The head runs on the last row only:
 * its logits are the next token's.  Every buffer is in backend memory and
 * sized for max_len rows once; a step allocates nothing.
 *
 * decoder_next chooses the next token on the backend (decode_choose) and
 * feeds it to the next step there: the position and the input id live in
 * backend memory (state), so a one-row step has the same arguments every
 * time, and the host reads back 4 bytes a token.  Where the backend has
 * graphs, that step is captured once and launched as one graph per token
 * (docs/cuda.md, "Decoding"). */
#include "model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct Decoder {
    Model *m;
    int max_len, pos;
    float *buf; /* one allocation, carved below */
    float *x, *ln, *mean, *rstd, *qkv, *atty, *branch, *fc, *up, *fc_act, *logits;
    float **kc, **vc; /* [layers] caches [max_len][KVH][hs] */
    /* state[0]: the position, state[1 ..]: the input ids (decode_choose,
     * backend.h); [max_len + 1] in backend memory, staged in host_state */
    int32_t *state, *host_state;
    float *host_logits; /* [Vp] */
    /* decoder_next: the temperature, the uniform numbers [max_len + 1]
     * (backend memory; NULL: greedy), the token read back (host_alloc),
     * the one-row step's graph (NULL: none yet or none to be), and
     * whether to capture it (the backend has graphs, the model no MoE
     * layer, whose routing goes through the host) and have (warm: one
     * one-row step ran eagerly, so every workspace has its size) */
    double temperature;
    double *u;
    int32_t *token;
    DecodeNorm nm; /* prenorm's, for the linears after it */
    void *graph;
    int graph_ok, warm;
    /* MoE layers (NULL in a dense model), for max_len rows: the router's
     * logits, probabilities, log-sum-exp, choices and weights; the rows
     * dispatched (at most max_len x top_k) in expert order, through the
     * experts.  fc, up and fc_act serve the shared experts as well. */
    float *r_logits, *r_probs, *r_lse, *r_w, *x_in, *x_fc, *x_up, *x_act, *x_out;
    int32_t *r_ints;               /* one allocation: r_idx, r_slot */
    int32_t *r_idx, *r_slot;       /* [max_len * k] each */
    int32_t *idx_host, *slot_host; /* host copies, [max_len * k] each */
};

Decoder *decoder_create(Model *m, int max_len)
{
    const Dims *d = &m->d;
    if (tp_active(&m->tp) || !m->sh.has_embed || !m->sh.has_head || m->nl != m->mc.layers)
        trd_fatal(TRD_EXIT_INPUT, "decode on one rank: tp 1, pp 1",
                  "decoding needs the whole model on one rank (tp 1, one pipeline stage)");
    TRD_ASSERT(max_len >= 1 && max_len <= m->mc.seq_len);
    Decoder *dc = trd_calloc(1, sizeof *dc, "decoder");
    dc->m = m;
    dc->max_len = max_len;
    /* The MLP buffers serve the dense layers (F) and a MoE layer's shared
     * experts (Fs), whichever is wider. */
    const size_t L = (size_t)max_len, C = (size_t)d->C, F = (size_t)(d->Fs > d->F ? d->Fs : d->F);
    const size_t cache = L * (size_t)d->KVH * (size_t)d->hs;
    const size_t E = (size_t)d->E, R = L * (size_t)d->K, Fe = (size_t)d->Fe;
    const struct {
        float **slot;
        size_t n;
    } carve[] = {
        {&dc->x, L * C},
        {&dc->ln, L * C},
        {&dc->mean, L},
        {&dc->rstd, L},
        {&dc->qkv, L * (size_t)d->QKV},
        {&dc->atty, L * (size_t)d->H * d->hs},
        {&dc->branch, L * C},
        {&dc->fc, L * F},
        {&dc->up, L * F},
        {&dc->fc_act, L * F},
        {&dc->logits, (size_t)d->Vp},
        /* MoE layers (all 0 in a dense model: E = R = 0) */
        {&dc->r_logits, L * E},
        {&dc->r_probs, L * E},
        {&dc->r_lse, E ? L : 0},
        {&dc->r_w, R},
        {&dc->x_in, R * C},
        {&dc->x_fc, R * Fe},
        {&dc->x_up, d->gpt2 ? 0 : R * Fe},
        {&dc->x_act, R * Fe},
        {&dc->x_out, R * C},
    };
    const int n_slots = (int)(sizeof carve / sizeof *carve);
    size_t total = 2 * cache * (size_t)m->nl;
    for (int i = 0; i < n_slots; i++)
        total += carve[i].n;
    dc->buf = m->be->alloc(total * sizeof(float), "decoder activations and key/value cache");
    float *p = dc->buf;
    for (int i = 0; i < n_slots; i++) {
        *carve[i].slot = p;
        p += carve[i].n;
    }
    dc->kc = trd_calloc((size_t)m->nl, sizeof(float *), "key caches");
    dc->vc = trd_calloc((size_t)m->nl, sizeof(float *), "value caches");
    for (int l = 0; l < m->nl; l++) {
        dc->kc[l] = p;
        dc->vc[l] = p + cache;
        p += 2 * cache;
    }
    dc->state = m->be->alloc((L + 1) * sizeof(int32_t), "decoder position and token ids");
    dc->host_state = trd_malloc((L + 1) * sizeof(int32_t), "decoder token ids");
    dc->token = m->be->host_alloc(sizeof(int32_t), "decoder token read back");
    dc->graph_ok = m->be->graph_begin != NULL && d->E == 0;
    dc->host_logits = trd_malloc((size_t)d->Vp * sizeof(float), "logits");
    if (d->E > 0) {
        dc->r_ints = m->be->alloc(2 * R * sizeof(int32_t), "decoder MoE routes");
        dc->r_idx = dc->r_ints;
        dc->r_slot = dc->r_ints + R;
        dc->idx_host = trd_malloc(2 * R * sizeof(int32_t), "decoder MoE routes read back");
        dc->slot_host = dc->idx_host + R;
    }
    return dc;
}

void decoder_free(Decoder *dc)
{
    if (!dc)
        return;
    const Backend *be = dc->m->be;
    if (dc->graph)
        be->graph_free(dc->graph);
    be->release(dc->buf);
    be->release(dc->state);
    be->release(dc->u);
    be->host_release(dc->token);
    free(dc->host_state);
    be->release(dc->r_ints);
    free(dc->idx_host);
    free(dc->kc);
    free(dc->vc);
    free(dc->host_logits);
    free(dc);
}

int decoder_pos(const Decoder *dc) { return dc->pos; }
int decoder_max_len(const Decoder *dc) { return dc->max_len; }
void decoder_reset(Decoder *dc) { dc->pos = 0; }

static void norm(const Decoder *dc, float *out, const float *inp, const float *w, const float *b,
                 int n)
{
    const Model *m = dc->m;
    if (m->d.gpt2)
        m->be->layernorm_forward(out, dc->mean, dc->rstd, inp, w, b, n, m->d.C, m->d.eps);
    else
        m->be->rmsnorm_forward(out, dc->rstd, inp, w, n, m->d.C, m->d.eps);
}

/* Whether decode_linear takes a norm and DECODE_SWIGLU at n rows. */
static int gemv_rows(const Decoder *dc, int n)
{
    return dc->m->be->decode_linear && n <= DECODE_GEMV_ROWS;
}

/* The norm of the n rows of inp before the linears that read them: folded
 * into each of those linears where the backend can (decode_linear with a
 * norm: returns it, *in = inp), else the norm op into dc->ln (returns
 * NULL, *in = dc->ln). */
static const DecodeNorm *prenorm(Decoder *dc, const float **in, const float *inp, const float *w,
                                 const float *b, int n)
{
    const Model *m = dc->m;
    if (gemv_rows(dc, n)) {
        dc->nm = (DecodeNorm){w, m->d.gpt2 ? b : NULL, m->d.eps, !m->d.gpt2};
        *in = inp;
        return &dc->nm;
    }
    norm(dc, dc->ln, inp, w, b, n);
    *in = dc->ln;
    return NULL;
}

/* A linear layer and its epilogue (backend.h, decode_linear), its input
 * normed first with nm (prenorm): one op where the backend has it, else
 * matmul_forward into tmp [n, OC], then the GELU or the residual add from
 * there (the training ops in order). */
static void linear(const Decoder *dc, float *out, float *tmp, const float *x, const DecodeNorm *nm,
                   const float *w, const float *b, int n, int C, int OC, DecodeEpi epi)
{
    const Backend *be = dc->m->be;
    if (be->decode_linear) {
        be->decode_linear(out, x, nm, w, NULL, b, n, C, OC, epi);
        return;
    }
    TRD_ASSERT(!nm);
    const size_t nOC = (size_t)n * (size_t)OC;
    if (epi == DECODE_BIAS) {
        be->matmul_forward(out, x, w, b, n, C, OC);
    } else if (epi == DECODE_GELU) {
        be->matmul_forward(tmp, x, w, b, n, C, OC);
        be->gelu_forward(out, tmp, nOC);
    } else {
        be->matmul_forward(tmp, x, w, b, n, C, OC);
        be->add(out, out, tmp, nOC);
    }
}

/* A MoE layer's MLP branch over the n rows of dc->ln into dc->branch: the
 * function of moe_forward (moe.c), routed alike (softmax, top-k, ties to
 * the lower expert, renormalised), the rows of each expert in token order,
 * combined in expert order.  Dropless: the capacity factor is a training
 * device that bounds an expert's rows per micro-batch (as at Megatron-LM
 * and in Mixtral's inference, which drops nothing); here every token goes
 * through its top_k experts. */
static void moe_branch(Decoder *dc, const LayerParams *p, int n)
{
    const Model *m = dc->m;
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const int C = d->C, E = d->E, K = d->K, Fe = d->Fe, R = n * K;
    be->matmul_forward(dc->r_logits, dc->ln, p->router_w, NULL, n, C, E);
    be->moe_router_forward(dc->r_probs, dc->r_lse, dc->r_idx, dc->r_w, dc->r_logits, n, E, K);
    /* The dispatch order on the host: slot n*K + j (token n's j-th choice)
     * in expert order, token order within an expert. */
    be->to_host(dc->idx_host, dc->r_idx, (size_t)R * sizeof(int32_t));
    int off[MOE_MAX_EXPERTS + 1] = {0}, fill[MOE_MAX_EXPERTS];
    for (int s = 0; s < R; s++)
        off[dc->idx_host[s] + 1]++;
    for (int e = 0; e < E; e++) {
        off[e + 1] += off[e];
        fill[e] = off[e];
    }
    for (int s = 0; s < R; s++)
        dc->slot_host[fill[dc->idx_host[s]]++] = s;
    be->to_backend(dc->r_slot, dc->slot_host, (size_t)R * sizeof(int32_t));

    be->moe_gather(dc->x_in, dc->ln, dc->r_slot, R, C, K);
    for (int e = 0; e < E; e++) {
        const int o = off[e], rows = off[e + 1] - o;
        if (rows == 0)
            continue;
        const size_t eF = (size_t)e * Fe * C; /* expert e's first weight of fc/up and proj */
        mlp_in_forward(dc->m, dc->x_fc + (size_t)o * Fe,
                       dc->x_up ? dc->x_up + (size_t)o * Fe : NULL, dc->x_act + (size_t)o * Fe,
                       dc->x_in + (size_t)o * C, p->x_fc_w + eF,
                       p->x_fc_b ? p->x_fc_b + (size_t)e * Fe : NULL,
                       p->x_up_w ? p->x_up_w + eF : NULL, rows, Fe);
        be->matmul_forward(dc->x_out + (size_t)o * C, dc->x_act + (size_t)o * Fe, p->x_proj_w + eF,
                           p->x_proj_b ? p->x_proj_b + (size_t)e * C : NULL, rows, Fe, C);
    }
    if (d->Fs > 0) { /* the shared experts: one MLP of width Fs, unweighted */
        mlp_in_forward(dc->m, dc->fc, dc->up, dc->fc_act, dc->ln, p->fc_w, p->fc_b, p->up_w, n,
                       d->Fs);
        be->matmul_forward(dc->branch, dc->fc_act, p->mlp_proj_w, p->mlp_proj_b, n, d->Fs, C);
    } else {
        be->zero(dc->branch, (size_t)n * C * sizeof(float));
    }
    be->moe_combine_forward(dc->branch, dc->x_out, dc->r_w, dc->r_slot, R, C, K);
}

static void layer(Decoder *dc, int l, int n)
{
    const Model *m = dc->m;
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const LayerParams *p = &m->lp[l];

    const float *in;
    const DecodeNorm *nm = prenorm(dc, &in, dc->x, p->ln1_w, p->ln1_b, n);
    linear(dc, dc->qkv, NULL, in, nm, p->qkv_w, p->qkv_b, n, d->C, d->QKV, DECODE_BIAS);
    /* one row: at the position in backend memory (rope_forward reads it
     * as the row's position) */
    if (!d->gpt2 && n == 1)
        be->rope_forward(dc->qkv, dc->state, 1, 1, 0, d->H, d->KVH, d->hs, d->rope);
    else if (!d->gpt2)
        be->rope_decode(dc->qkv, n, dc->pos, d->H, d->KVH, d->hs, d->rope);
    be->attention_decode(dc->atty, dc->qkv, dc->kc[l], dc->vc[l], n, n == 1 ? dc->state : NULL,
                         dc->pos, d->H, d->KVH, d->hs);
    linear(dc, dc->x, dc->branch, dc->atty, NULL, p->attn_proj_w, p->attn_proj_b, n, d->H * d->hs,
           d->C, DECODE_RESIDUAL);

    if (p->router_w) { /* the router and the experts read dc->ln */
        norm(dc, dc->ln, dc->x, p->ln2_w, p->ln2_b, n);
        moe_branch(dc, p, n);
        be->add(dc->x, dc->x, dc->branch, (size_t)n * (size_t)d->C);
        return;
    }
    /* mlp_in_forward's ops (moe.c), through linear; SwiGLU's gate and up
     * one decode_linear where it takes them */
    nm = prenorm(dc, &in, dc->x, p->ln2_w, p->ln2_b, n);
    if (d->gpt2) {
        linear(dc, dc->fc_act, dc->fc, in, nm, p->fc_w, p->fc_b, n, d->C, d->F, DECODE_GELU);
    } else if (gemv_rows(dc, n)) {
        be->decode_linear(dc->fc_act, in, nm, p->fc_w, p->up_w, p->fc_b, n, d->C, d->F,
                          DECODE_SWIGLU);
    } else {
        linear(dc, dc->fc, NULL, in, nm, p->fc_w, p->fc_b, n, d->C, d->F, DECODE_BIAS);
        linear(dc, dc->up, NULL, in, nm, p->up_w, NULL, n, d->C, d->F, DECODE_BIAS);
        be->swiglu_forward(dc->fc_act, dc->fc, dc->up, (size_t)n * (size_t)d->F);
    }
    linear(dc, dc->x, dc->branch, dc->fc_act, NULL, p->mlp_proj_w, p->mlp_proj_b, n, d->F, d->C,
           DECODE_RESIDUAL);
}

/* The position and the n tokens into backend memory, one copy. */
static void upload(Decoder *dc, const int32_t *tokens, int n)
{
    const Dims *d = &dc->m->d;
    TRD_ASSERT(n >= 1 && dc->pos + n <= dc->max_len);
    for (int i = 0; i < n; i++)
        TRD_ASSERT(tokens[i] >= 0 && tokens[i] < d->vocab);
    dc->host_state[0] = dc->pos;
    memcpy(dc->host_state + 1, tokens, (size_t)n * sizeof(int32_t));
    dc->m->be->to_backend(dc->state, dc->host_state, (size_t)(n + 1) * sizeof(int32_t));
}

/* The model over the n input ids in state, up to the last row's logits.
 * One row takes its position from state[0] (learned positions: the
 * embedding's pos, state[0]); several from dc->pos. */
static void forward(Decoder *dc, int n)
{
    Model *m = dc->m;
    const Backend *be = m->be;
    const Dims *d = &m->d;
    if (n == 1)
        be->embedding_forward(dc->x, dc->state + 1, dc->state, m->op.wte, m->op.wpe, 1, 1, d->C, 0,
                              d->Vp);
    else /* position of row i is i % T with T = n: the position table from row pos */
        be->embedding_forward(dc->x, dc->state + 1, NULL, m->op.wte,
                              m->op.wpe ? m->op.wpe + (size_t)dc->pos * d->C : NULL, n, n, d->C, 0,
                              d->Vp);
    for (int l = 0; l < m->nl; l++)
        layer(dc, l, n);
    const float *last = dc->x + (size_t)(n - 1) * d->C;
    const float *in;
    const DecodeNorm *nm = prenorm(dc, &in, last, m->op.lnf_w, m->op.lnf_b, 1);
    linear(dc, dc->logits, NULL, in, nm, m->op.head_w, NULL, 1, d->C, d->Vp, DECODE_BIAS);
}

const float *decoder_step(Decoder *dc, const int32_t *tokens, int n)
{
    upload(dc, tokens, n);
    forward(dc, n);
    dc->m->be->to_host(dc->host_logits, dc->logits, (size_t)dc->m->d.V * sizeof(float));
    dc->pos += n;
    return dc->host_logits;
}

void decoder_sampling(Decoder *dc, double temperature, const double *u)
{
    const Backend *be = dc->m->be;
    dc->temperature = temperature;
    if (temperature > 0) {
        const size_t bytes = (size_t)(dc->max_len + 1) * sizeof(double);
        if (!dc->u)
            dc->u = be->alloc(bytes, "decoder uniform numbers");
        be->to_backend(dc->u, u, bytes);
    }
    if (dc->graph) /* it holds the old temperature */
        be->graph_free(dc->graph);
    dc->graph = NULL;
}

/* One row from the id the last choice left in state, then the choice. */
static void step_one(Decoder *dc)
{
    forward(dc, 1);
    dc->m->be->decode_choose(dc->state, dc->logits, dc->m->d.V, dc->temperature, dc->u, 1);
}

int decoder_next(Decoder *dc, const int32_t *tokens, int n)
{
    const Backend *be = dc->m->be;
    if (tokens) {
        upload(dc, tokens, n);
        forward(dc, n);
        be->decode_choose(dc->state, dc->logits, dc->m->d.V, dc->temperature, dc->u, n);
    } else {
        TRD_ASSERT(n == 1 && dc->pos >= 1 && dc->pos < dc->max_len);
        if (dc->graph_ok && dc->warm && !dc->graph) {
            be->graph_begin();
            step_one(dc);
            dc->graph = be->graph_end();
            dc->graph_ok = dc->graph != NULL;
        }
        if (dc->graph)
            be->graph_launch(dc->graph);
        else
            step_one(dc);
        dc->warm = 1;
    }
    /* 4 bytes into page-locked memory on the copy stream, which waits for
     * the ops so far; a single copy and a single wait */
    be->to_host_async(dc->token, dc->state + 1, sizeof(int32_t), NULL);
    be->host_copies_wait();
    dc->pos += n;
    return *dc->token;
}

int decoder_graphed(const Decoder *dc) { return dc->graph != NULL; }

const float *decoder_logits(Decoder *dc)
{
    dc->m->be->to_host(dc->host_logits, dc->logits, (size_t)dc->m->d.V * sizeof(float));
    return dc->host_logits;
}

int decoder_vocab(const Decoder *dc) { return dc->m->d.V; }

int decoder_sample(const float *logits, int V, float temperature, double u)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    if (temperature <= 0)
        return best;
    double sum = 0;
    for (int v = 0; v < V; v++)
        sum += exp((logits[v] - logits[best]) / temperature);
    double acc = 0;
    const double target = u * sum;
    for (int v = 0; v < V; v++) {
        acc += exp((logits[v] - logits[best]) / temperature);
        if (target < acc)
            return v;
    }
    return best;
}
