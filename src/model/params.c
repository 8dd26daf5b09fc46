#include "model/params.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

ParamShard params_full_shard(const ModelConfig *m)
{
    ParamShard sh = {.tp = 1,
                     .tp_rank = 0,
                     .n_chunks = 1,
                     .chunk = {{0, m->layers}},
                     .has_embed = 1,
                     .has_head = 1,
                     .ep = 1,
                     .ep_rank = 0};
    return sh;
}

ParamShard params_chunk_shard(const ParamShard *sh, int c)
{
    TRD_ASSERT(c >= 0 && c < sh->n_chunks);
    ParamShard one = *sh;
    one.n_chunks = 1;
    one.chunk[0] = sh->chunk[c];
    one.has_embed = sh->has_embed && c == 0;
    one.has_head = sh->has_head && c == sh->n_chunks - 1;
    return one;
}

int params_shard_layers(const ParamShard *sh)
{
    int n = 0;
    for (int c = 0; c < sh->n_chunks; c++)
        n += sh->chunk[c].end - sh->chunk[c].begin;
    return n;
}

int params_shard_chunk_of(const ParamShard *sh, int l)
{
    for (int c = 0; c < sh->n_chunks; c++)
        if (l >= sh->chunk[c].begin && l < sh->chunk[c].end)
            return c;
    return -1;
}

int params_padded_vocab(const ModelConfig *m, int tp)
{
    /* In 64 bits: vocab + mult - 1 wraps an int for a mult near 2^31,
     * which config_validate allows as long as the padded size fits. */
    const int64_t mult = (int64_t)tp * (m->vocab_pad_multiple > 0 ? m->vocab_pad_multiple : 1);
    return (int)(((int64_t)m->vocab + mult - 1) / mult * mult);
}

typedef struct {
    ParamTable *t;
    int cap;
    const ParamShard *sh;
    int64_t vocab_rows; /* real (unpadded) vocabulary rows, for counting */
    int64_t hs;         /* head size */
    int heads, kv_heads;
    int experts; /* row blocks of a SPLIT_EXPERTS tensor (model.moe.experts) */
} Builder;

/* split_dim argument of add() for the fused qkv rows: split by kv group
 * (stored as split_dim 0). */
enum { SPLIT_QKV = 2 };
/* split_dim argument of add() for the stacked experts' rows (fc, gate, up
 * and the fc bias of a MoE layer): each of the b->experts blocks of rows is
 * split over TP like a tensor of its own (stored as split_dim 0 with
 * row_blocks, params.h). */
enum { SPLIT_EXPERTS = 3 };

/* The local rows of a qkv tensor, laid out per kv group as [query heads of
 * the group, k, v] (backend.h).  With kv_heads % tp == 0 a contiguous chunk
 * holds whole groups.  With tp % kv_heads == 0 the s = tp / kv_heads ranks
 * of a group split its query heads and all hold its k and v: the local
 * layout is then one group [q/s query heads, k, v] as the backend expects. */
static void qkv_piece(const Builder *b, ParamSpec *p)
{
    const int tp = b->sh->tp, r = b->sh->tp_rank;
    p->kv_share = 1;
    if (b->kv_heads % tp == 0) {
        p->local_shape[0] = p->shape[0] / tp;
        p->local_start[0] = r * p->local_shape[0];
        p->kv_row = p->local_shape[0];
        return;
    }
    TRD_ASSERT(tp % b->kv_heads == 0);
    const int s = tp / b->kv_heads, g = r / s, j = r % s;
    const int64_t q_group = b->heads / b->kv_heads, q_mine = q_group / s;
    const int64_t group_first = (int64_t)g * (q_group + 2) * b->hs;
    p->local_shape[0] = (q_mine + 2) * b->hs;
    p->local_start[0] = group_first + j * q_mine * b->hs;
    p->kv_share = s;
    p->kv_row = q_mine * b->hs;
    p->kv_start = group_first + q_group * b->hs;
}

static ParamSpec *add(Builder *b, int64_t rows, int64_t cols, int split_dim, ParamRole role,
                      int layer, InitKind init, float std, const char *fmt, ...)
{
    if (b->t->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->t->p = realloc(b->t->p, (size_t)b->cap * sizeof(ParamSpec));
        TRD_ASSERT(b->t->p);
    }
    ParamSpec *p = &b->t->p[b->t->n++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->real_rows = rows;
    p->shape[1] = cols > 0 ? cols : 1;
    p->split_dim = split_dim == SPLIT_QKV || split_dim == SPLIT_EXPERTS ? 0 : split_dim;
    p->row_blocks = 1;
    p->role = role;
    p->layer = layer;
    p->init = init;
    p->std = std;
    /* Matrices decay; vectors (biases, norm weights) do not. */
    p->decay = p->ndim == 2;

    int tp = b->sh->tp, r = b->sh->tp_rank;
    for (int d = 0; d < 2; d++) {
        p->local_shape[d] = p->shape[d];
        p->local_start[d] = 0;
    }
    if (split_dim == SPLIT_QKV) {
        qkv_piece(b, p);
    } else if (split_dim == SPLIT_EXPERTS && tp > 1) {
        /* Rows [e*R + r*R/tp, e*R + (r+1)*R/tp) of every expert e (R rows
         * each): local rows in expert order, each expert's contiguous. */
        const int64_t R = p->shape[0] / b->experts;
        TRD_ASSERT(p->shape[0] % b->experts == 0 && R % tp == 0);
        p->row_blocks = b->experts;
        p->block_rows = R;
        p->local_shape[0] = p->shape[0] / tp;
        p->local_start[0] = r * (R / tp);
    } else if (split_dim >= 0 && tp > 1) {
        /* Validation guarantees divisibility (heads, ffn, padded vocab). */
        TRD_ASSERT(p->shape[split_dim] % tp == 0);
        p->local_shape[split_dim] = p->shape[split_dim] / tp;
        p->local_start[split_dim] = r * p->local_shape[split_dim];
    }
    if (split_dim != SPLIT_QKV) {
        p->kv_share = 1;
        p->kv_row = p->local_shape[0];
    }
    p->numel = (size_t)(p->local_shape[0] * p->local_shape[1]);
    p->offset = b->t->numel;
    b->t->numel += p->numel;
    b->t->global_numel += (size_t)(p->shape[0] * p->shape[1]);
    return p;
}

/* A stacked experts tensor p just added (R rows per expert) with the
 * experts divided over ep: keep the rows of this rank's E / ep experts. */
static void ep_divide(Builder *b, ParamSpec *p)
{
    const int ep = b->sh->ep;
    if (ep <= 1)
        return;
    const int64_t R = p->shape[0] / b->experts, El = b->experts / ep;
    const int64_t first = (int64_t)b->sh->ep_rank * El * R; /* the first expert's first row */
    b->t->numel -= p->numel;
    if (p->row_blocks > 1) { /* split over TP by each expert's rows */
        p->local_shape[0] = p->local_shape[0] / b->experts * El;
        p->row_blocks = (int)El;
    } else {
        p->local_shape[0] = El * R;
    }
    p->local_start[0] += first;
    p->kv_row = p->local_shape[0];
    p->numel = (size_t)(p->local_shape[0] * p->local_shape[1]);
    b->t->numel += p->numel;
    p->ep_region = 1;
}

/* The MLP of a mixture-of-experts layer (docs/moe.md): the router, the E
 * experts stacked along the rows (expert e's rows are [e*R, (e+1)*R) of a
 * tensor whose one expert has R rows), then the shared experts fused into
 * one MLP of width shared_experts * Fe.  Over TP every expert is split like
 * the dense MLP (Megatron's expert tensor parallelism): fc, gate, up by the
 * rows of each expert (SPLIT_EXPERTS), proj, down by columns, their bias
 * replicated; the shared experts exactly as the dense MLP; the router
 * replicated (every TP rank routes the same whole rows alike). */
static void add_moe(Builder *b, const ModelConfig *m, int l, float std, float std_out)
{
    const int64_t C = m->hidden, E = m->moe_experts, Fe = config_moe_ffn(m);
    const int64_t Fs = (int64_t)m->moe_shared_experts * Fe;
    const int gpt2 = m->arch == ARCH_GPT2;
    b->experts = (int)E;
    add(b, E, C, -1, ROLE_BLOCK, l, INIT_NORMAL, std, "layers.%d.moe.router.weight", l);
    if (gpt2) {
        ep_divide(b, add(b, E * Fe, C, SPLIT_EXPERTS, ROLE_BLOCK, l, INIT_NORMAL, std,
                         "layers.%d.moe.experts.fc.weight", l));
        ep_divide(b, add(b, E * Fe, 0, SPLIT_EXPERTS, ROLE_BLOCK, l, INIT_ZEROS, 0,
                         "layers.%d.moe.experts.fc.bias", l));
        ep_divide(b, add(b, E * C, Fe, 1, ROLE_BLOCK, l, INIT_NORMAL, std_out,
                         "layers.%d.moe.experts.proj.weight", l));
        ep_divide(b, add(b, E * C, 0, -1, ROLE_BLOCK, l, INIT_ZEROS, 0,
                         "layers.%d.moe.experts.proj.bias", l));
    } else {
        ep_divide(b, add(b, E * Fe, C, SPLIT_EXPERTS, ROLE_BLOCK, l, INIT_NORMAL, std,
                         "layers.%d.moe.experts.gate.weight", l));
        ep_divide(b, add(b, E * Fe, C, SPLIT_EXPERTS, ROLE_BLOCK, l, INIT_NORMAL, std,
                         "layers.%d.moe.experts.up.weight", l));
        ep_divide(b, add(b, E * C, Fe, 1, ROLE_BLOCK, l, INIT_NORMAL, std_out,
                         "layers.%d.moe.experts.down.weight", l));
    }
    if (Fs == 0)
        return;
    if (gpt2) {
        add(b, Fs, C, 0, ROLE_BLOCK, l, INIT_NORMAL, std, "layers.%d.moe.shared.fc.weight", l);
        add(b, Fs, 0, 0, ROLE_BLOCK, l, INIT_ZEROS, 0, "layers.%d.moe.shared.fc.bias", l);
        add(b, C, Fs, 1, ROLE_BLOCK, l, INIT_NORMAL, std_out, "layers.%d.moe.shared.proj.weight",
            l);
        add(b, C, 0, -1, ROLE_BLOCK, l, INIT_ZEROS, 0, "layers.%d.moe.shared.proj.bias", l);
    } else {
        add(b, Fs, C, 0, ROLE_BLOCK, l, INIT_NORMAL, std, "layers.%d.moe.shared.gate.weight", l);
        add(b, Fs, C, 0, ROLE_BLOCK, l, INIT_NORMAL, std, "layers.%d.moe.shared.up.weight", l);
        add(b, C, Fs, 1, ROLE_BLOCK, l, INIT_NORMAL, std_out, "layers.%d.moe.shared.down.weight",
            l);
    }
}

/* The tensors of transformer layer l, in the order the model reads them. */
static void add_layer(Builder *b, const ModelConfig *m, int l, int64_t qkv_rows, float std,
                      float std_out)
{
    const int64_t C = m->hidden, F = m->ffn_hidden, hs = b->hs;
    const int gpt2 = m->arch == ARCH_GPT2;
    add(b, C, 0, -1, ROLE_BLOCK, l, INIT_ONES, 0, "layers.%d.ln1.weight", l);
    if (gpt2)
        add(b, C, 0, -1, ROLE_BLOCK, l, INIT_ZEROS, 0, "layers.%d.ln1.bias", l);
    add(b, qkv_rows, C, SPLIT_QKV, ROLE_BLOCK, l, INIT_NORMAL, std, "layers.%d.attn.qkv.weight", l);
    if (gpt2)
        add(b, qkv_rows, 0, SPLIT_QKV, ROLE_BLOCK, l, INIT_ZEROS, 0, "layers.%d.attn.qkv.bias", l);
    add(b, C, m->heads * hs, 1, ROLE_BLOCK, l, INIT_NORMAL, std_out, "layers.%d.attn.proj.weight",
        l);
    if (gpt2)
        add(b, C, 0, -1, ROLE_BLOCK, l, INIT_ZEROS, 0, "layers.%d.attn.proj.bias", l);
    add(b, C, 0, -1, ROLE_BLOCK, l, INIT_ONES, 0, "layers.%d.ln2.weight", l);
    if (gpt2)
        add(b, C, 0, -1, ROLE_BLOCK, l, INIT_ZEROS, 0, "layers.%d.ln2.bias", l);
    if (config_moe_layer(m, l)) {
        add_moe(b, m, l, std, std_out);
        return;
    }
    if (gpt2) {
        add(b, F, C, 0, ROLE_BLOCK, l, INIT_NORMAL, std, "layers.%d.mlp.fc.weight", l);
        add(b, F, 0, 0, ROLE_BLOCK, l, INIT_ZEROS, 0, "layers.%d.mlp.fc.bias", l);
        add(b, C, F, 1, ROLE_BLOCK, l, INIT_NORMAL, std_out, "layers.%d.mlp.proj.weight", l);
        add(b, C, 0, -1, ROLE_BLOCK, l, INIT_ZEROS, 0, "layers.%d.mlp.proj.bias", l);
    } else {
        add(b, F, C, 0, ROLE_BLOCK, l, INIT_NORMAL, std, "layers.%d.mlp.gate.weight", l);
        add(b, F, C, 0, ROLE_BLOCK, l, INIT_NORMAL, std, "layers.%d.mlp.up.weight", l);
        add(b, C, F, 1, ROLE_BLOCK, l, INIT_NORMAL, std_out, "layers.%d.mlp.down.weight", l);
    }
}

/* One adapter pair on a linear layer "layers.l.<base>" of global shape
 * [out, in]: col 1 for a column-parallel base (rows split; split QKV for
 * the fused qkv), 0 for a row-parallel one (columns split). */
static void add_lora(Builder *b, int l, const char *base, int64_t out, int64_t in, int col, int qkv,
                     int r)
{
    const float bound = 1.0f / sqrtf((float)in);
    add(b, r, in, col ? -1 : 1, ROLE_BLOCK, l, INIT_UNIFORM, bound, "layers.%d.%s.lora_A", l, base);
    add(b, out, r, col ? (qkv ? SPLIT_QKV : 0) : -1, ROLE_BLOCK, l, INIT_ZEROS, 0,
        "layers.%d.%s.lora_B", l, base);
}

static void build_lora(ParamTable *t, const ModelConfig *m, const ParamShard *sh)
{
    const int64_t C = m->hidden, hs = m->hidden / m->heads, F = m->ffn_hidden;
    Builder b = {.t = t, .sh = sh, .hs = hs, .heads = m->heads, .kv_heads = m->kv_heads};
    const int gpt2 = m->arch == ARCH_GPT2, r = m->lora.rank;
    const int64_t qkv_rows = (int64_t)(m->heads + 2 * m->kv_heads) * hs;
    char bad[64];
    const int mask = config_lora_mask(m->lora.targets, m->arch, bad, sizeof bad);
    if (mask < 0)
        trd_fatal(TRD_EXIT_INPUT, "see docs/finetune.md",
                  "model.lora.targets: '%s' is not a linear layer of this model", bad);
    for (int c = 0; c < sh->n_chunks; c++)
        for (int l = sh->chunk[c].begin; l < sh->chunk[c].end; l++) {
            if (mask & LORA_QKV)
                add_lora(&b, l, "attn.qkv", qkv_rows, C, 1, 1, r);
            if (mask & LORA_PROJ)
                add_lora(&b, l, "attn.proj", C, m->heads * hs, 0, 0, r);
            if (mask & LORA_FC)
                add_lora(&b, l, gpt2 ? "mlp.fc" : "mlp.gate", F, C, 1, 0, r);
            if (mask & LORA_UP)
                add_lora(&b, l, "mlp.up", F, C, 1, 0, r);
            if (mask & LORA_FCPROJ)
                add_lora(&b, l, gpt2 ? "mlp.proj" : "mlp.down", C, F, 0, 0, r);
        }
    for (int i = 0; i < t->n; i++)
        t->p[i].decay = 1; /* both adapter matrices, as PEFT's optimizers see them */
}

void params_build(ParamTable *t, const ModelConfig *m, const ParamShard *sh)
{
    if (m->lora.rank > 0) {
        memset(t, 0, sizeof *t);
        t->tp = sh->tp;
        t->tp_rank = sh->tp_rank;
        t->ep = 1;
        build_lora(t, m, sh);
        t->dense_numel = t->numel;
        return;
    }
    params_build_base(t, m, sh);
}

void params_build_base(ParamTable *t, const ModelConfig *m, const ParamShard *sh)
{
    memset(t, 0, sizeof *t);
    t->tp = sh->tp;
    t->tp_rank = sh->tp_rank;
    t->ep = sh->ep > 1 ? sh->ep : 1;
    t->ep_rank = sh->ep > 1 ? sh->ep_rank : 0;
    TRD_ASSERT(t->ep == 1 || (m->moe_experts % t->ep == 0 && m->lora.rank == 0));
    const int64_t C = m->hidden, hs = m->hidden / m->heads;
    Builder b = {.t = t, .sh = sh, .hs = hs, .heads = m->heads, .kv_heads = m->kv_heads};
    const int gpt2 = m->arch == ARCH_GPT2;
    const int64_t qkv_rows = (int64_t)(m->heads + 2 * m->kv_heads) * hs;
    const int64_t Vp = params_padded_vocab(m, sh->tp);
    const float std = m->init_std;
    /* GPT-2: residual projections scaled by 1/sqrt(2L) (two per layer). */
    const float std_out = std / sqrtf(2.0f * (float)m->layers);

    if (sh->has_embed) {
        add(&b, Vp, C, 0, ROLE_EMBED, -1, INIT_NORMAL, std, "embed.wte.weight")->real_rows =
            m->vocab;
        if (gpt2)
            add(&b, m->seq_len, C, -1, ROLE_EMBED, -1, INIT_NORMAL, std, "embed.wpe.weight");
    }
    if (sh->has_head) {
        add(&b, C, 0, -1, ROLE_HEAD, -1, INIT_ONES, 0, "final_norm.weight");
        if (gpt2)
            add(&b, C, 0, -1, ROLE_HEAD, -1, INIT_ZEROS, 0, "final_norm.bias");
        if (!m->tie_embeddings)
            add(&b, Vp, C, 0, ROLE_HEAD, -1, INIT_NORMAL, std, "head.weight")->real_rows = m->vocab;
        else if (!sh->has_embed)
        /* Tied embeddings across pipeline stages: the last stage holds a
             * copy of the first stage's embedding.  Same name, so the same
             * initial values; its gradient is summed with the first stage's
             * (the embedding group) and the copy is never counted twice. */
        {
            ParamSpec *w = add(&b, Vp, C, 0, ROLE_HEAD, -1, INIT_NORMAL, std, "embed.wte.weight");
            w->tied_copy = 1;
            w->real_rows = m->vocab;
        }
    }
    for (int c = 0; c < sh->n_chunks; c++)
        for (int l = sh->chunk[c].begin; l < sh->chunk[c].end; l++)
            add_layer(&b, m, l, qkv_rows, std, std_out);
    t->dense_numel = t->numel;
    if (t->ep <= 1)
        return;
    /* The experts divided over ep: the dense tensors first, in table order,
     * then the expert region, layer by layer (params.h). */
    size_t at = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < t->n; i++)
            if (t->p[i].ep_region == pass) {
                t->p[i].offset = at;
                at += t->p[i].numel;
            }
        if (pass == 0)
            t->dense_numel = at;
    }
    TRD_ASSERT(at == t->numel);
}

void params_free(ParamTable *t)
{
    free(t->p);
    memset(t, 0, sizeof *t);
}

const ParamSpec *params_find(const ParamTable *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->p[i].name, name) == 0)
            return &t->p[i];
    return NULL;
}

void params_init(const ParamTable *t, float *buf, uint64_t seed)
{
    params_init_range(t, buf, seed, 0, t->numel);
}

void params_init_range(const ParamTable *t, float *buf, uint64_t seed, size_t lo, size_t hi)
{
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        const size_t a = p->offset > lo ? p->offset : lo;
        const size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a >= b)
            continue;
        float *w = buf + (a - lo);
        if (p->init != INIT_NORMAL && p->init != INIT_UNIFORM) {
            float v = p->init == INIT_ONES ? 1.0f : 0.0f;
            for (size_t k = 0; k < b - a; k++)
                w[k] = v;
            continue;
        }
        /* The key depends on the name, never on the shard: a shard draws
         * exactly the values the unsplit tensor has at its coordinates. */
        const uint64_t key = rng_mix(seed, rng_hash_str(p->name));
        const int64_t cols = p->shape[1], lcols = p->local_shape[1];
        const int64_t first = (int64_t)(a - p->offset), count = (int64_t)(b - a);
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < count; k++) {
            const int64_t r = (first + k) / lcols, c = (first + k) % lcols;
            const uint64_t grow = (uint64_t)params_global_row(p, r);
            const uint64_t gidx = grow * (uint64_t)cols + (uint64_t)(p->local_start[1] + c);
            /* Vocabulary padding starts at zero: with no gradient and
             * decoupled decay it stays zero, whatever the optimizer does. */
            if ((int64_t)grow >= p->real_rows)
                w[k] = 0.0f;
            else if (p->init == INIT_UNIFORM) /* 24 random bits: u in [0, 1) */
                w[k] = p->std * (2.0f * (float)(rng_u64(key, gidx) >> 40) * 0x1p-24f - 1.0f);
            else
                w[k] = p->std * rng_normal(key, gidx);
        }
    }
}

void params_group_range(const ParamTable *t, int group, size_t *lo, size_t *hi)
{
    *lo = *hi = 0;
    int found = 0;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        const int in = group == PARAMS_OUTER ? p->role != ROLE_BLOCK
                       : group >= 0          ? p->layer == group && !p->ep_region
                                             : p->layer == -2 - group && p->ep_region;
        if (!in)
            continue;
        if (!found)
            *lo = p->offset;
        found = 1;
        *hi = p->offset + p->numel;
    }
}

int params_row_owned(const ParamTable *t, const ParamSpec *p, int64_t r)
{
    if (p->tied_copy)
        return 0;
    if (p->split_dim < 0)
        return t->tp_rank == 0;
    if (r < p->kv_row)
        return 1;
    return t->tp_rank % p->kv_share == 0;
}

/* The owned runs of every tensor in [lo, hi), offsets from lo, into a new
 * array (*n of them), for one backend call over all of them: on a GPU one
 * reduction, not one per tensor. */
static BackendRange *owned_ranges(const ParamTable *t, size_t lo, size_t hi, int *count)
{
    BackendRange *r = trd_malloc(2 * (size_t)t->n * sizeof *r + 1, "gradient norm ranges");
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        const size_t a = p->offset > lo ? p->offset : lo;
        const size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a >= b)
            continue;
        const size_t cols = (size_t)p->local_shape[1];
        /* Ownership is per row (replicated kv rows), and owned rows come in
         * at most two runs per tensor (the size of r). */
        size_t run = a; /* start of the current owned run */
        int owned = 0;
        for (size_t k = a; k < b;) {
            const size_t row = (k - p->offset) / cols;
            const size_t row_end = p->offset + (row + 1) * cols;
            const size_t e = row_end < b ? row_end : b;
            const int mine = params_row_owned(t, p, (int64_t)row);
            if (mine && !owned)
                run = k;
            if (!mine && owned)
                r[n++] = (BackendRange){.lo = run - lo, .hi = k - lo};
            owned = mine;
            k = e;
        }
        if (owned)
            r[n++] = (BackendRange){.lo = run - lo, .hi = b - lo};
    }
    *count = n;
    return r;
}

double params_grad_sumsq(const ParamTable *t, const Backend *be, const float *g, size_t lo,
                         size_t hi)
{
    int n;
    BackendRange *r = owned_ranges(t, lo, hi, &n);
    const double total = n ? be->sumsq_ranges(g, r, n) : 0.0;
    free(r);
    return total;
}

void params_grad_check(const ParamTable *t, const Backend *be, const float *g, size_t lo, size_t hi,
                       BackendStepState *state, float clip)
{
    int n;
    BackendRange *r = owned_ranges(t, lo, hi, &n);
    be->grad_check(state, g, r, n, clip);
    free(r);
}

size_t params_count_active(const ModelConfig *m)
{
    const size_t total = params_count_real(m);
    if (m->moe_experts == 0)
        return total;
    const size_t C = (size_t)m->hidden, Fe = (size_t)config_moe_ffn(m);
    const size_t expert = m->arch == ARCH_GPT2 ? 2 * C * Fe + Fe + C : 3 * C * Fe;
    size_t idle = 0;
    for (int l = 0; l < m->layers; l++)
        if (config_moe_layer(m, l))
            idle += (size_t)(m->moe_experts - m->moe_top_k) * expert;
    return total - idle;
}

size_t params_count_real(const ModelConfig *m)
{
    ModelConfig unpadded = *m;
    unpadded.vocab_pad_multiple = 1;
    ParamShard sh = params_full_shard(&unpadded);
    ParamTable t;
    params_build_base(&t, &unpadded, &sh);
    size_t n = t.global_numel;
    params_free(&t);
    return n;
}
