/* decode.c — generation with a key/value cache (model.h, "Decoding").
 *
 * The same layer as block_forward in model.c, written for n new rows of
 * one sequence at positions pos .. pos+n-1: norms, the fused qkv
 * projection, RoPE from the position offset (rope_decode), attention of
 * the new rows against the cache (attention_decode, which appends their
 * keys and values first), the output projection and the MLP.  The head
 * runs on the last row only: its logits are the next token's.  Every
 * buffer is in backend memory and sized for max_len rows once; a step
 * allocates nothing. */
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
    float **kc, **vc;   /* [layers] caches [max_len][KVH][hs] */
    int32_t *ids;       /* [max_len] token ids in backend memory */
    float *host_logits; /* [Vp] */
};

Decoder *decoder_create(Model *m, int max_len)
{
    const Dims *d = &m->d;
    if (tp_active(&m->tp) || !m->sh.has_embed || !m->sh.has_head || m->nl != m->mc.layers)
        trd_fatal(TRD_EXIT_INPUT, "decode on one rank: tp 1, pp 1",
                  "decoding needs the whole model on one rank (tp 1, one pipeline stage)");
    if (d->E > 0)
        trd_fatal(TRD_EXIT_INPUT, "eval works on MoE checkpoints; generation does not yet",
                  "decoding a mixture-of-experts model (model.moe) is not implemented yet");
    TRD_ASSERT(max_len >= 1 && max_len <= m->mc.seq_len);
    Decoder *dc = trd_calloc(1, sizeof *dc, "decoder");
    dc->m = m;
    dc->max_len = max_len;
    const size_t L = (size_t)max_len, C = (size_t)d->C, F = (size_t)d->F;
    const size_t cache = L * (size_t)d->KVH * (size_t)d->hs;
    const size_t sizes[] = {
        L * C, L * C, L,     L,     L * (size_t)d->QKV, L * (size_t)d->H * d->hs,
        L * C, L * F, L * F, L * F, (size_t)d->Vp};
    float **slots[] = {&dc->x,      &dc->ln, &dc->mean, &dc->rstd,   &dc->qkv,   &dc->atty,
                       &dc->branch, &dc->fc, &dc->up,   &dc->fc_act, &dc->logits};
    const int n_slots = (int)(sizeof sizes / sizeof *sizes);
    size_t total = 2 * cache * (size_t)m->nl;
    for (int i = 0; i < n_slots; i++)
        total += sizes[i];
    dc->buf = m->be->alloc(total * sizeof(float), "decoder activations and key/value cache");
    float *p = dc->buf;
    for (int i = 0; i < n_slots; i++) {
        *slots[i] = p;
        p += sizes[i];
    }
    dc->kc = trd_calloc((size_t)m->nl, sizeof(float *), "key caches");
    dc->vc = trd_calloc((size_t)m->nl, sizeof(float *), "value caches");
    for (int l = 0; l < m->nl; l++) {
        dc->kc[l] = p;
        dc->vc[l] = p + cache;
        p += 2 * cache;
    }
    dc->ids = m->be->alloc(L * sizeof(int32_t), "decoder token ids");
    dc->host_logits = trd_malloc((size_t)d->Vp * sizeof(float), "logits");
    return dc;
}

void decoder_free(Decoder *dc)
{
    if (!dc)
        return;
    dc->m->be->release(dc->buf);
    dc->m->be->release(dc->ids);
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

static void layer(Decoder *dc, int l, int n)
{
    const Model *m = dc->m;
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const LayerParams *p = &m->lp[l];
    const size_t nC = (size_t)n * (size_t)d->C, nF = (size_t)n * (size_t)d->F;

    norm(dc, dc->ln, dc->x, p->ln1_w, p->ln1_b, n);
    be->matmul_forward(dc->qkv, dc->ln, p->qkv_w, p->qkv_b, n, d->C, d->QKV);
    if (!d->gpt2)
        be->rope_decode(dc->qkv, n, dc->pos, d->H, d->KVH, d->hs, d->rope);
    be->attention_decode(dc->atty, dc->qkv, dc->kc[l], dc->vc[l], n, dc->pos, d->H, d->KVH, d->hs);
    be->matmul_forward(dc->branch, dc->atty, p->attn_proj_w, p->attn_proj_b, n, d->H * d->hs, d->C);
    be->add(dc->x, dc->x, dc->branch, nC);

    norm(dc, dc->ln, dc->x, p->ln2_w, p->ln2_b, n);
    be->matmul_forward(dc->fc, dc->ln, p->fc_w, p->fc_b, n, d->C, d->F);
    if (d->gpt2) {
        be->gelu_forward(dc->fc_act, dc->fc, nF);
    } else {
        be->matmul_forward(dc->up, dc->ln, p->up_w, NULL, n, d->C, d->F);
        be->swiglu_forward(dc->fc_act, dc->fc, dc->up, nF);
    }
    be->matmul_forward(dc->branch, dc->fc_act, p->mlp_proj_w, p->mlp_proj_b, n, d->F, d->C);
    be->add(dc->x, dc->x, dc->branch, nC);
}

const float *decoder_step(Decoder *dc, const int32_t *tokens, int n)
{
    Model *m = dc->m;
    const Backend *be = m->be;
    const Dims *d = &m->d;
    TRD_ASSERT(n >= 1 && dc->pos + n <= dc->max_len);
    for (int i = 0; i < n; i++)
        TRD_ASSERT(tokens[i] >= 0 && tokens[i] < d->vocab);
    be->to_backend(dc->ids, tokens, (size_t)n * sizeof(int32_t));
    /* Position of row i is i % T with T = n: the position table from row pos. */
    be->embedding_forward(dc->x, dc->ids, NULL, m->op.wte,
                          m->op.wpe ? m->op.wpe + (size_t)dc->pos * d->C : NULL, n, n, d->C, 0,
                          d->Vp);
    for (int l = 0; l < m->nl; l++)
        layer(dc, l, n);
    const float *last = dc->x + (size_t)(n - 1) * d->C;
    norm(dc, dc->ln, last, m->op.lnf_w, m->op.lnf_b, 1);
    be->matmul_forward(dc->logits, dc->ln, m->op.head_w, NULL, 1, d->C, d->Vp);
    be->to_host(dc->host_logits, dc->logits, (size_t)d->V * sizeof(float));
    dc->pos += n;
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
