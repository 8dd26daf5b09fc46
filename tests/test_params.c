/* The parameter table: shapes, offsets, decay flags, and the invariant that
 * a tensor-parallel shard initialises to exactly its slice of the unsplit
 * tensor (docs/design.md, invariant 1). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/params.h"

static ModelConfig tiny(ModelArch arch)
{
    ModelConfig m = {0};
    m.arch = arch;
    m.layers = 2;
    m.hidden = 16;
    m.heads = 4;
    m.kv_heads = arch == ARCH_LLAMA ? 2 : 4;
    m.ffn_hidden = arch == ARCH_LLAMA ? 48 : 64;
    m.vocab = 50;
    m.vocab_pad_multiple = 8;
    m.seq_len = 8;
    m.tie_embeddings = arch == ARCH_GPT2;
    m.init_std = 0.02f;
    return m;
}

/* Element (r, c) of the global tensor `name`, taken from a shard's buffer;
 * *owned says whether this rank is its one owner (params_row_owned). */
static float shard_value(const ParamTable *t, const float *buf, const char *name, int64_t r,
                         int64_t c, int *held, int *owned)
{
    const ParamSpec *p = params_find(t, name);
    int64_t lr = -1, lc = c - p->local_start[1];
    for (int64_t k = 0; k < p->local_shape[0]; k++)
        if (params_global_row(p, k) == r)
            lr = k;
    *held = lr >= 0 && lc >= 0 && lc < p->local_shape[1];
    *owned = *held && params_row_owned(t, p, lr);
    return *held ? buf[p->offset + (size_t)(lr * p->local_shape[1] + lc)] : 0.0f;
}

static void check_shards_match_full(ModelArch arch, int tp, int kv_heads)
{
    ModelConfig m = tiny(arch);
    m.kv_heads = kv_heads;
    /* Padding depends on tp, so compare against a full table padded for tp. */
    ParamShard full_sh = params_full_shard(&m);
    full_sh.tp = 1;
    ParamTable full;
    m.vocab_pad_multiple *= tp; /* same padded rows as the tp-way table */
    params_build(&full, &m, &full_sh);
    m.vocab_pad_multiple /= tp;
    float *fbuf = malloc(full.numel * sizeof(float));
    params_init(&full, fbuf, 42);

    int mismatches = 0, covered_total = 0, owned_total = 0;
    size_t kv_extra = 0; /* replicated kv elements held beyond the first copy */
    for (int r = 0; r < tp; r++) {
        ParamShard sh = params_full_shard(&m);
        sh.tp = tp;
        sh.tp_rank = r;
        ParamTable t;
        params_build(&t, &m, &sh);
        CHECK(t.n == full.n, "same tensors on every TP rank (%d vs %d)", t.n, full.n);
        for (int i = 0; i < t.n; i++) {
            const ParamSpec *p = &t.p[i];
            const int qkv = strstr(p->name, "attn.qkv") != NULL;
            const int share = qkv && kv_heads < tp ? tp / kv_heads : 1;
            CHECK(p->kv_share == share, "tp %d kv %d: %s kv_share %d, want %d", tp, kv_heads,
                  p->name, p->kv_share, share);
            if (p->kv_share > 1)
                kv_extra += (size_t)((p->local_shape[0] - p->kv_row) * p->local_shape[1]) *
                            (size_t)(p->kv_share - 1) / (size_t)p->kv_share;
        }
        float *buf = malloc(t.numel * sizeof(float));
        params_init(&t, buf, 42);
        for (int i = 0; i < full.n; i++) {
            const ParamSpec *fp = &full.p[i];
            for (int64_t a = 0; a < fp->shape[0]; a++)
                for (int64_t b = 0; b < fp->shape[1]; b++) {
                    int held, owned;
                    float v = shard_value(&t, buf, fp->name, a, b, &held, &owned);
                    if (!held)
                        continue;
                    covered_total++;
                    owned_total += owned;
                    if (v != fbuf[fp->offset + (size_t)(a * fp->shape[1] + b)])
                        mismatches++;
                }
        }
        free(buf);
        params_free(&t);
    }
    CHECK(mismatches == 0, "arch %d tp %d kv %d: %d shard elements differ from the full tensor",
          arch, tp, kv_heads, mismatches);
    CHECK((size_t)owned_total == full.numel,
          "arch %d tp %d kv %d: each element owned once "
          "(%d owned of %zu)",
          arch, tp, kv_heads, owned_total, full.numel);
    /* Replicated tensors are counted tp times, split ones once. */
    size_t replicated = 0;
    for (int i = 0; i < full.n; i++)
        if (full.p[i].split_dim < 0)
            replicated += full.p[i].numel;
    CHECK((size_t)covered_total == full.numel + (size_t)(tp - 1) * replicated + kv_extra,
          "tp %d kv %d: shards cover every element (%d vs %zu)", tp, kv_heads, covered_total,
          full.numel + (size_t)(tp - 1) * replicated + kv_extra);
    free(fbuf);
    params_free(&full);
}

int main(void)
{
    ModelConfig m = tiny(ARCH_GPT2);
    ParamShard sh = params_full_shard(&m);
    ParamTable t;
    params_build(&t, &m, &sh);

    /* GPT-2 count, by hand: wte Vp*C + wpe T*C + per layer
     * (2C ln1) + (3C*C + 3C qkv) + (C*C + C proj) + (2C ln2) + (4C*C + 4C fc)
     * + (4C*C + C proj) + final norm 2C; head tied. */
    const size_t C = 16, L = 2, T = 8, Vp = 56, F = 64;
    size_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
    CHECK(t.numel == Vp * C + T * C + L * per_layer + 2 * C, "gpt2 numel %zu", t.numel);
    CHECK(params_padded_vocab(&m, 1) == 56 && params_padded_vocab(&m, 4) == 64,
          "padded vocab %d %d", params_padded_vocab(&m, 1), params_padded_vocab(&m, 4));
    CHECK(params_count_real(&m) == t.numel - (Vp - 50) * C, "real count excludes padding");
    /* Issue 34: a multiple near 2^31 (config_validate allows it while the
     * padded size fits 32 bits) wrapped vocab + mult - 1 to a negative. */
    ModelConfig wide = m;
    wide.vocab_pad_multiple = INT32_MAX;
    CHECK(params_padded_vocab(&wide, 1) == INT32_MAX, "padded vocab near 2^31: %d",
          params_padded_vocab(&wide, 1));
    CHECK(params_find(&t, "head.weight") == NULL, "tied: no head");

    /* Offsets are contiguous in table order; layers contiguous. */
    size_t off = 0;
    int last_layer = -1, layers_in_order = 1;
    for (int i = 0; i < t.n; i++) {
        CHECK(t.p[i].offset == off, "offset of %s", t.p[i].name);
        off += t.p[i].numel;
        if (t.p[i].role == ROLE_BLOCK) {
            if (t.p[i].layer < last_layer)
                layers_in_order = 0;
            last_layer = t.p[i].layer;
        }
    }
    CHECK(layers_in_order, "layers are contiguous and in order");
    CHECK(params_find(&t, "layers.1.attn.qkv.weight")->decay == 1, "matrices decay");
    CHECK(params_find(&t, "layers.1.ln1.weight")->decay == 0, "norms do not decay");
    CHECK(params_find(&t, "layers.0.mlp.fc.bias")->decay == 0, "biases do not decay");

    float *buf = malloc(t.numel * sizeof(float));
    params_init(&t, buf, 7);
    const ParamSpec *ln = params_find(&t, "layers.0.ln1.weight");
    const ParamSpec *bias = params_find(&t, "layers.0.attn.qkv.bias");
    CHECK(buf[ln->offset] == 1.0f && buf[bias->offset] == 0.0f, "ones and zeros");
    const ParamSpec *w = params_find(&t, "layers.0.mlp.fc.weight");
    double s2 = 0;
    for (size_t k = 0; k < w->numel; k++)
        s2 += (double)buf[w->offset + k] * buf[w->offset + k];
    CHECK_CLOSE(sqrt(s2 / (double)w->numel), 0.02, 0.15, 0, "fc weight std");
    const ParamSpec *wo = params_find(&t, "layers.0.mlp.proj.weight");
    s2 = 0;
    for (size_t k = 0; k < wo->numel; k++)
        s2 += (double)buf[wo->offset + k] * buf[wo->offset + k];
    CHECK_CLOSE(sqrt(s2 / (double)wo->numel), 0.02 / sqrt(2.0 * 2), 0.15, 0,
                "residual projection std scaled by 1/sqrt(2L)");
    /* Different names give different values; same seed same values. */
    const ParamSpec *q0 = params_find(&t, "layers.0.attn.qkv.weight");
    const ParamSpec *q1 = params_find(&t, "layers.1.attn.qkv.weight");
    CHECK(buf[q0->offset] != buf[q1->offset], "layers differ");
    float *buf2 = malloc(t.numel * sizeof(float));
    params_init(&t, buf2, 7);
    CHECK(memcmp(buf, buf2, t.numel * sizeof(float)) == 0, "init is deterministic");

    /* Groups tile the buffer: outer first, then layers in order. */
    size_t lo, hi, at = 0;
    params_group_range(&t, PARAMS_OUTER, &lo, &hi);
    CHECK(lo == 0 && hi > 0, "outer group starts the buffer");
    at = hi;
    for (int l = 0; l < 2; l++) {
        params_group_range(&t, l, &lo, &hi);
        CHECK(lo == at && hi > lo, "layer %d follows at %zu (got %zu)", l, at, lo);
        at = hi;
    }
    CHECK(at == t.numel, "groups cover the buffer");
    /* Any flat range initialises to the same values as the whole. */
    const size_t cuts[][2] = {{0, 5}, {3, 700}, {t.numel - 9, t.numel}, {100, 101}};
    for (int k = 0; k < 4; k++) {
        float *part = malloc((cuts[k][1] - cuts[k][0]) * sizeof(float));
        params_init_range(&t, part, 7, cuts[k][0], cuts[k][1]);
        CHECK(memcmp(part, buf + cuts[k][0], (cuts[k][1] - cuts[k][0]) * sizeof(float)) == 0,
              "range [%zu, %zu) equals the slice of the whole", cuts[k][0], cuts[k][1]);
        free(part);
    }
    params_init(&t, buf2, 8);
    CHECK(memcmp(buf, buf2, t.numel * sizeof(float)) != 0, "seed matters");
    free(buf);
    free(buf2);
    params_free(&t);

    ModelConfig l = tiny(ARCH_LLAMA);
    sh = params_full_shard(&l);
    params_build(&t, &l, &sh);
    CHECK(params_find(&t, "embed.wpe.weight") == NULL, "llama: no learned positions");
    CHECK(params_find(&t, "head.weight") != NULL, "llama: untied head");
    CHECK(params_find(&t, "layers.0.attn.qkv.weight")->shape[0] == (4 + 2 * 2) * 4,
          "GQA qkv rows = (H + 2 KVH) hs");
    CHECK(params_find(&t, "layers.0.ln1.bias") == NULL, "llama: no biases");
    params_free(&t);

    /* kv heads split (kv_heads % tp == 0) and replicated (tp % kv_heads == 0). */
    for (int tp = 2; tp <= 4; tp *= 2) {
        check_shards_match_full(ARCH_GPT2, tp, 4);
        check_shards_match_full(ARCH_GPT2, tp, 1);
        check_shards_match_full(ARCH_LLAMA, tp, 2);
        check_shards_match_full(ARCH_LLAMA, tp, 1);
    }
    /* tp 4 over 2 kv heads (head size 4): the second group is rows 16..31,
     * [q2 q3 k1 v1]; rank 3 holds q3 (rows 20..23) and k1, v1 (24..31). */
    {
        ModelConfig lm = tiny(ARCH_LLAMA);
        ParamShard s4 = params_full_shard(&lm);
        s4.tp = 4;
        s4.tp_rank = 3;
        params_build(&t, &lm, &s4);
        const ParamSpec *q = params_find(&t, "layers.0.attn.qkv.weight");
        CHECK(q->local_shape[0] == 12 && q->kv_share == 2 && q->kv_row == 4,
              "replicated kv: 3 heads of 4 rows, kv from row 4 (got %lld rows, share %d, "
              "kv_row %lld)",
              (long long)q->local_shape[0], q->kv_share, (long long)q->kv_row);
        CHECK(params_global_row(q, 0) == 20 && params_global_row(q, 3) == 23 &&
                  params_global_row(q, 4) == 24 && params_global_row(q, 11) == 31,
              "replicated kv: rows 20..23 then 24..31");
        CHECK(!params_row_owned(&t, q, 4) && params_row_owned(&t, q, 0),
              "rank 3 owns its q rows, rank 2 the shared kv rows");
        params_free(&t);
    }
    return check_summary("params");
}
