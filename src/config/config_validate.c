/* config_validate.c — derived defaults and the range and consistency rules
 * of a Config.
 *
 * Each message starts at the place the offending value came from (the
 * config's origin table): "FILE:LINE:COL: model.heads (12) must be divisible
 * by topology.tp (5); ...", "--set topology.tp=5: ...", or "config error in
 * FILE: ..." for a value nobody wrote (a default).  A cross-key rule is
 * placed at the key its fix changes first.  Checks run from simple ranges
 * to cross-key rules, so the first message is about the root cause. */
#include "core/error.h"
#include "config/config.h"
#include "config/layout.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

typedef struct {
    const Config *cfg;
    char *err;
} Checker;

/* A message about the value of key (its full name). */
static int verr(Checker *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int verr(Checker *c, const char *key, const char *fmt, ...)
{
    char where[CFG_STR + CFG_SET_ARG];
    config_where(c->cfg, key, where, sizeof where);
    int n;
    if (strchr(where, ':') || !strncmp(where, "--set ", 6))
        n = snprintf(c->err, CFG_ERR, "%.400s: ", where);
    else
        n = snprintf(c->err, CFG_ERR, "config error in %.400s: ", where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, CFG_ERR - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static int check_min_int(Checker *c, const char *key, int v, int lo)
{
    if (v < lo)
        return verr(c, key, "%s (%d) must be >= %d", key, v, lo);
    return 0;
}

/* checkpoint.allow_changes: names from {seed, data}, "seed,data" or a
 * `--set` list "[seed, data]"; brackets and spaces are dropped here so the
 * checkpoint code reads one plain form. */
static int check_allow_changes(Checker *c, CheckpointConfig *ck)
{
    char *s = ck->allow_changes, *w = s;
    for (const char *r = s; *r; r++)
        if (*r != '[' && *r != ']' && *r != ' ')
            *w++ = *r;
    *w = '\0';
    for (const char *p = s; *p;) {
        size_t n = strcspn(p, ",");
        if (!(n == 4 && !strncmp(p, "seed", 4)) && !(n == 4 && !strncmp(p, "data", 4)) && n)
            return verr(c, "checkpoint.allow_changes",
                        "checkpoint.allow_changes: unknown change "
                        "'%.*s' (expected seed, data or both: seed,data)",
                        (int)n, p);
        p += n + (p[n] == ',');
    }
    return 0;
}

static int check_ranges(Checker *c)
{
    const Config *g = c->cfg;
    const ModelConfig *m = &g->model;
    const TopologyConfig *t = &g->topology;
    const TrainingConfig *tr = &g->training;
    struct {
        const char *key;
        int v, lo;
    } ints[] = {
        {"run.log_every", g->run.log_every, 1},
        {"model.layers", m->layers, 1},
        {"model.hidden", m->hidden, 1},
        {"model.heads", m->heads, 1},
        {"model.kv_heads", m->kv_heads, 0},
        {"model.ffn_hidden", m->ffn_hidden, 0},
        {"model.vocab", m->vocab, 1},
        {"model.vocab_pad_multiple", m->vocab_pad_multiple, 1},
        {"model.seq_len", m->seq_len, 1},
        {"topology.tp", t->tp, 1},
        {"topology.pp", t->pp, 1},
        {"topology.cp", t->cp, 1},
        {"topology.dp", t->dp, 0},
        {"topology.zero", t->zero, 0},
        {"topology.ranks_per_node", t->ranks_per_node, 0},
        {"topology.virtual_stages", t->virtual_stages, 1},
        {"topology.bucket_mb", t->bucket_mb, 1},
        {"training.steps", tr->steps, 1},
        {"training.global_batch", tr->global_batch, 1},
        {"training.micro_batch", tr->micro_batch, 0},
        {"training.warmup_steps", tr->warmup_steps, 0},
        {"training.hang_timeout", tr->hang_timeout, 0},
        {"training.sample_every", tr->sample_every, 0},
        {"data.val_every", g->data.val_every, 0},
        {"data.val_sequences", g->data.val_sequences, 1},
        {"checkpoint.every", g->checkpoint.every, CKPT_EVERY_AUTO},
        {"checkpoint.keep", g->checkpoint.keep, 1},
        {"training.max_skipped", tr->max_skipped, 1},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (check_min_int(c, ints[i].key, ints[i].v, ints[i].lo))
            return -1;
    if (t->zero > 3)
        return verr(c, "topology.zero", "topology.zero (%d) must be 0, 1, 2 or 3", t->zero);
    if (m->tie_embeddings < -1 || m->tie_embeddings > 1)
        return verr(c, "model.tie_embeddings",
                    "model.tie_embeddings (%d) must be true, false or auto", m->tie_embeddings);
    if (!(m->norm_eps > 0))
        return verr(c, "model.norm_eps", "model.norm_eps (%g) must be > 0", m->norm_eps);
    if (!(m->init_std > 0))
        return verr(c, "model.init_std", "model.init_std (%g) must be > 0", m->init_std);
    if (g->data.document_mask && g->data.eot < 0)
        return verr(c, "data.document_mask",
                    "data.document_mask needs data.eot, the token that ends each document "
                    "(prepare-data prints it: `EOT 50256` for gpt2)");
    if (g->data.eod_mask_loss && g->data.eot < 0)
        return verr(c, "data.eod_mask_loss",
                    "data.eod_mask_loss needs data.eot, the token that ends each document "
                    "(prepare-data prints it: `EOT 50256` for gpt2)");
    if (g->data.eot < -1 || g->data.eot >= m->vocab)
        return verr(c, "data.eot", "data.eot (%d) must be a token id in [0, model.vocab %d)",
                    g->data.eot, m->vocab);
    if (!g->data.path[0] && !g->data.blend[0])
        return verr(c, "data.path",
                    "data.path is required (the dataset prefix or file), or data.blend");
    if (g->data.path[0] && g->data.blend[0])
        return verr(c, "data.blend", "data.blend and data.path are both set: give one of them");
    if (g->data.val_path[0] && g->data.val_blend[0])
        return verr(c, "data.val_blend",
                    "data.val_blend and data.val_path are both set: give one of them");
    BlendSpec spec;
    char why[CFG_ERR];
    if (g->data.blend[0] && config_blend_parse(g->data.blend, &spec, why))
        return verr(c, "data.blend", "data.blend: %s", why);
    if (g->data.val_blend[0] && config_blend_parse(g->data.val_blend, &spec, why))
        return verr(c, "data.val_blend", "data.val_blend: %s", why);
    if (g->checkpoint.resume == RESUME_PATH && !g->checkpoint.resume_path[0])
        return verr(c, "checkpoint.resume", "checkpoint.resume is a path but the path is empty");
    return 0;
}

static int check_optimizer(Checker *c)
{
    const TrainingConfig *tr = &c->cfg->training;
    if (!(tr->lr > 0))
        return verr(c, "training.lr", "training.lr (%g) must be > 0", tr->lr);
    if (!(tr->min_lr >= 0 && tr->min_lr <= tr->lr))
        return verr(c, "training.min_lr",
                    "training.min_lr (%g) must be between 0 and training.lr (%g)", tr->min_lr,
                    tr->lr);
    if (!(tr->beta1 >= 0 && tr->beta1 < 1))
        return verr(c, "training.beta1", "training.beta1 (%g) must be in [0, 1), e.g. 0.9",
                    tr->beta1);
    if (!(tr->beta2 >= 0 && tr->beta2 < 1))
        return verr(c, "training.beta2", "training.beta2 (%g) must be in [0, 1), e.g. 0.95",
                    tr->beta2);
    if (!(tr->eps > 0))
        return verr(c, "training.eps", "training.eps (%g) must be > 0, e.g. 1e-8", tr->eps);
    if (!(tr->weight_decay >= 0))
        return verr(c, "training.weight_decay", "training.weight_decay (%g) must be >= 0",
                    tr->weight_decay);
    const TopologyConfig *t = &c->cfg->topology;
    if (tr->sample_every > 0 && config_ep_divides(c->cfg))
        return verr(c, "training.sample_every",
                    "training.sample_every needs the whole model on rank 0, but topology.ep %d "
                    "divides the experts over ranks at topology.zero %d: sample from a "
                    "checkpoint with `trident generate` instead",
                    t->ep, t->zero);
    if (tr->sample_every > 0 && (t->tp > 1 || t->pp > 1 || t->cp > 1 || t->zero == 3))
        return verr(c, "training.sample_every",
                    "training.sample_every needs the whole model on rank 0, and whole "
                    "sequences (topology.tp 1, topology.pp 1, topology.cp 1, topology.zero "
                    "0-2); here tp %d, pp %d, cp %d, zero %d: sample from a checkpoint with "
                    "`trident generate` instead",
                    t->tp, t->pp, t->cp, t->zero);
    if (tr->sample_every > 0 && c->cfg->model.vocab != 50257 && c->cfg->model.vocab != 257)
        return verr(c, "training.sample_every",
                    "training.sample_every decodes with the GPT-2 "
                    "(vocab 50257) or byte (257) tokenizer; model.vocab is %d",
                    c->cfg->model.vocab);
    if (!(tr->straggler_threshold >= 1))
        return verr(c, "training.straggler_threshold",
                    "training.straggler_threshold (%g) must "
                    "be >= 1 (1.2: report a rank 20%% slower than the median)",
                    tr->straggler_threshold);
    if (!(tr->grad_clip >= 0))
        return verr(c, "training.grad_clip",
                    "training.grad_clip (%g) must be >= 0 (0 disables clipping)", tr->grad_clip);
    return 0;
}

/* The sizes derived from the model and batch keys, in overflow-checked
 * 64-bit arithmetic, before anything multiplies them in int or size_t: a
 * wrapped product would read as a negative token count or a tiny
 * allocation.  The bounds (2^48 parameters, activation elements) are far
 * beyond any model a machine holds, so only absurd values meet them; what
 * fits in memory is the trainer's check (src/train/memcheck.h). */
#define SIZE_LIMIT ((int64_t)1 << 48)

static bool mul3(int64_t a, int64_t b, int64_t c, int64_t *out)
{
    int64_t ab;
    return !__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, out);
}

/* The model's own sizes: ffn_hidden and the padded vocabulary in 32 bits,
 * the parameter count below 2^48.  NULL, or the key to blame with why. */
static const char *model_sizes(const ModelConfig *m, int tp, int64_t *F_out, int64_t *Vp_out,
                               char *why, size_t n)
{
    const int64_t C = m->hidden, L = m->layers, T = m->seq_len;
    /* resolve_model's default ffn_hidden, here in 64 bits. */
    int64_t F = m->ffn_hidden;
    if (F == 0)
        F = m->arch == ARCH_GPT2 ? 4 * C : ((8 * C + 2) / 3 + 63) / 64 * 64;
    *F_out = F;
    if (F > INT32_MAX) {
        snprintf(why, n,
                 "model.ffn_hidden would be %lld (from model.hidden %d), beyond 32 bits; "
                 "use a smaller hidden",
                 (long long)F, m->hidden);
        return "model.hidden";
    }
    const int64_t mult = (int64_t)tp * m->vocab_pad_multiple;
    const int64_t Vp = ((int64_t)m->vocab + mult - 1) / mult * mult;
    *Vp_out = Vp;
    if (Vp > INT32_MAX) {
        snprintf(why, n,
                 "model.vocab (%d) padded to a multiple of topology.tp (%d) x "
                 "model.vocab_pad_multiple (%d) is %lld, beyond 32 bits",
                 m->vocab, tp, m->vocab_pad_multiple, (long long)Vp);
        return "model.vocab";
    }
    /* Weights: the attention and MLP matrices of every layer (kv heads
     * counted as full heads, an upper bound), two embedding tables, the
     * position table. */
    int64_t attn, mlp, layer, blocks, embed, pos, total;
    bool ok =
        mul3(4, C, C, &attn) && mul3(3, C, F, &mlp) && !__builtin_add_overflow(attn, mlp, &layer) &&
        !__builtin_mul_overflow(L, layer, &blocks) && mul3(2, Vp, C, &embed) &&
        !__builtin_mul_overflow(T, C, &pos) && !__builtin_add_overflow(blocks, embed, &total) &&
        !__builtin_add_overflow(total, pos, &total);
    if (!ok || total > SIZE_LIMIT) {
        snprintf(why, n,
                 "model.layers (%d) x model.hidden (%d) (ffn %lld, vocab %d) give %s "
                 "parameters, more than 2^48 (%lld); trident's sizes are 64-bit byte "
                 "counts, so such a model is refused; use a smaller model",
                 m->layers, m->hidden, (long long)F, m->vocab,
                 ok ? "about that many" : "an overflowing count of", (long long)SIZE_LIMIT);
        return "model.layers";
    }
    return NULL;
}

/* Per-layer tables are built before any byte count is checked (the memory
 * check's plan, the import's parameter table): 4e7 layers of hidden 128
 * and vocab 257 pass the bounds above but make a parameter table of
 * gigabytes (issue 34).  Checked last, so that sizes which overflow are
 * reported as such. */
static const char *model_layers(const ModelConfig *m, char *why, size_t n)
{
    if (m->layers <= CFG_MAX_LAYERS)
        return NULL;
    snprintf(why, n,
             "model.layers (%d) is more than %d, the most trident builds a model of "
             "(the deepest published models have about 128 layers)",
             m->layers, CFG_MAX_LAYERS);
    return "model.layers";
}

int config_model_sizes(const ModelConfig *model, char err[CFG_ERR])
{
    ModelConfig m = *model;
    if (m.vocab_pad_multiple < 1) /* unset: the vocabulary as it is */
        m.vocab_pad_multiple = 1;
    if (m.layers < 1 || m.hidden < 1 || m.vocab < 1 || m.seq_len < 1 || m.ffn_hidden < 0) {
        snprintf(err, CFG_ERR,
                 "model.layers %d, hidden %d, vocab %d and seq_len %d must be >= 1, "
                 "ffn_hidden %d >= 0",
                 m.layers, m.hidden, m.vocab, m.seq_len, m.ffn_hidden);
        return -1;
    }
    int64_t F, Vp;
    return model_sizes(&m, 1, &F, &Vp, err, CFG_ERR) || model_layers(&m, err, CFG_ERR) ? -1 : 0;
}

static int check_sizes(Checker *c)
{
    const ModelConfig *m = &c->cfg->model;
    const TopologyConfig *t = &c->cfg->topology;
    const TrainingConfig *tr = &c->cfg->training;
    /* micro_batch auto is at most the global batch */
    const int64_t L = m->layers, T = m->seq_len,
                  B = tr->micro_batch ? tr->micro_batch : tr->global_batch;
    char why[CFG_ERR];
    int64_t F, Vp;
    const char *key = model_sizes(m, t->tp, &F, &Vp, why, sizeof why);
    if (key)
        return verr(c, key, "%s", why);
    /* Activations of one micro-batch: the widest row of every layer, and
     * the attention scores (B x heads x T x T). */
    int64_t wide = F > Vp ? F : Vp, rows, acts, scores;
    bool ok = mul3(B, T, wide, &rows) && !__builtin_mul_overflow(rows, L + 1, &acts) &&
              mul3(B, m->heads, T, &scores) && !__builtin_mul_overflow(scores, T, &scores);
    if (!ok || acts > SIZE_LIMIT || scores > SIZE_LIMIT) {
        /* Placed at the key to change: the batch, unless one sequence is
         * already too much (then the layers, or seq_len for the scores). */
        int64_t rows1, acts1, scores1;
        const bool one = mul3(1, T, wide, &rows1) &&
                         !__builtin_mul_overflow(rows1, L + 1, &acts1) && acts1 <= SIZE_LIMIT;
        const bool one_scores = mul3(m->heads, T, T, &scores1) && scores1 <= SIZE_LIMIT;
        const char *key = !one_scores       ? "model.seq_len"
                          : !one            ? "model.layers"
                          : tr->micro_batch ? "training.micro_batch"
                                            : "training.global_batch";
        char batch[96];
        if (tr->micro_batch)
            snprintf(batch, sizeof batch, "training.micro_batch (%d)", tr->micro_batch);
        else /* auto: up to the whole global batch on one rank */
            snprintf(batch, sizeof batch,
                     "training.micro_batch (auto: up to training.global_batch, %d)",
                     tr->global_batch);
        return verr(c, key,
                    "%s x model.seq_len (%d) with model.layers (%d) and model.hidden (%d) give "
                    "more than 2^48 activation elements per micro-batch; use a smaller %s, "
                    "seq_len or model",
                    batch, m->seq_len, m->layers, m->hidden,
                    tr->micro_batch ? "micro_batch" : "global_batch (or micro_batch)");
    }
    /* Tokens per step are reported as 32-bit counts, tokens so far as 64-bit. */
    int64_t step_tokens, run_tokens;
    if (__builtin_mul_overflow((int64_t)tr->global_batch, T, &step_tokens) ||
        step_tokens > INT32_MAX ||
        __builtin_mul_overflow(step_tokens, (int64_t)tr->steps, &run_tokens))
        return verr(c, "training.global_batch",
                    "training.global_batch (%d) x model.seq_len (%d) = %lld tokens per step, "
                    "more than 2^31; use a smaller global_batch or seq_len",
                    tr->global_batch, m->seq_len, (long long)tr->global_batch * T);
    if ((key = model_layers(m, why, sizeof why)))
        return verr(c, key, "%s", why);
    return 0;
}

/* Fill the "0 / auto means derived" fields; the inputs passed check_ranges. */
static void resolve_model(ModelConfig *m)
{
    if (m->kv_heads == 0)
        m->kv_heads = m->heads;
    if (m->ffn_hidden == 0) {
        if (m->arch == ARCH_GPT2) {
            m->ffn_hidden = 4 * m->hidden;
        } else {
            /* SwiGLU keeps the MLP's parameter count near 4*hidden with three
             * matrices: 8/3 * hidden, rounded up to 64 for GEMM-friendly shapes. */
            long long f = (8LL * m->hidden + 2) / 3;
            m->ffn_hidden = (int)((f + 63) / 64 * 64);
        }
    }
    if (m->tie_embeddings < 0)
        m->tie_embeddings = m->arch == ARCH_GPT2;
}

static bool valid_order(const char *o)
{
    static const char *const perms[] = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                        "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};
    for (size_t i = 0; i < sizeof perms / sizeof perms[0]; i++)
        if (!strcmp(o, perms[i]))
            return true;
    return false;
}

/* The topology's own keys, then the layout rules (layout.h) of the model
 * over it. */
static int check_topology(Checker *c)
{
    const TopologyConfig *t = &c->cfg->topology;
    if (!valid_order(t->order))
        return verr(c, "topology.order",
                    "topology.order '%s' must name tp, dp and pp once "
                    "each, fastest first (e.g. tp-dp-pp)",
                    t->order);
    LayoutError e;
    if (layout_check(&c->cfg->model, t, &e) != 0)
        return verr(c, e.key, "%s", e.msg);
    if (t->comm == COMM_NCCL && c->cfg->backend != BACKEND_CUDA)
        return verr(c, "topology.comm",
                    "topology.comm nccl moves device buffers and needs "
                    "backend: cuda; use comm: auto or mpi with backend: cpu");
    /* The CPU backend's optimizer state is host memory already. */
    if (t->offload != OFFLOAD_NONE && c->cfg->backend != BACKEND_CUDA)
        return verr(c, "topology.offload",
                    "topology.offload moves the optimizer state from GPU to host memory "
                    "and needs backend: cuda; with backend: cpu the state is in host memory "
                    "already: remove the key or set it to none");
    /* Only ZeRO-3 keeps a parameter shard: the other stages keep every
     * weight on every rank, where compute reads them. */
    if (t->offload == OFFLOAD_PARAMS && t->zero != 3)
        return verr(c, "topology.offload",
                    "topology.offload optimizer+params moves each rank's parameter shard to "
                    "host memory, and only ZeRO-3 shards the parameters (topology.zero is %d): "
                    "set topology.zero: 3, or offload: optimizer",
                    t->zero);
    return 0;
}

/* training.micro_batch auto: a rank's share of the global batch in one
 * micro-batch (no accumulation) without pipeline parallelism; with pp > 1
 * the largest size that still gives a step at least 2 x pp micro-batches,
 * which keeps the 1F1B bubble (p-1)/(m+p-1) under 1/3. */
static int auto_micro_batch(int per_rank, int pp)
{
    if (pp == 1)
        return per_rank;
    for (int b = per_rank; b > 1; b--)
        if (per_rank % b == 0 && per_rank / b >= 2 * pp)
            return b;
    return 1;
}

/* A global batch must split into whole micro-batches on every DP rank
 * (dp 0: unknown yet, checked per rank).  The hint names the micro_batch
 * fix first: it keeps the experiment, a new global_batch changes it. */
static int check_batch(Checker *c, const TrainingConfig *tr, int dp, int pp)
{
    const long long unit = (long long)tr->micro_batch * (dp > 0 ? dp : 1);
    if (tr->global_batch % unit == 0)
        return 0;
    char what[96], fix[160];
    if (dp > 0)
        snprintf(what, sizeof what, "training.micro_batch %d x topology.dp %d = %lld",
                 tr->micro_batch, dp, unit);
    else
        snprintf(what, sizeof what, "training.micro_batch %d", tr->micro_batch);
    const int n = snprintf(fix, sizeof fix, "set training.micro_batch: auto");
    if (dp > 0 && tr->global_batch % dp == 0)
        snprintf(fix + n, sizeof fix - (size_t)n, " (here %d) or a divisor of %d",
                 auto_micro_batch(tr->global_batch / dp, pp), tr->global_batch / dp);
    return verr(c, "training.micro_batch",
                "training.global_batch %d is not a multiple of %s; "
                "%s, which keeps the global batch",
                tr->global_batch, what, fix);
}

/* dp from the world size, then the batch arithmetic that depends on it. */
static int check_world(Checker *c, Config *cfg, int world)
{
    TopologyConfig *t = &cfg->topology;
    const TrainingConfig *tr = &cfg->training;
    long long mp = (long long)t->tp * t->pp * t->cp;
    char what[64]; /* "topology.tp (2) x topology.pp (1)", with cp when > 1 */
    int n = snprintf(what, sizeof what, "topology.tp (%d) x topology.pp (%d)", t->tp, t->pp);
    if (t->cp > 1)
        snprintf(what + n, sizeof what - (size_t)n, " x topology.cp (%d)", t->cp);
    if (world > 0) {
        if (t->dp == 0) {
            if (world % mp)
                return verr(c, "topology.tp",
                            "the world size %d is not divisible by %s = %lld; launch a "
                            "multiple of %lld ranks",
                            world, what, mp, mp);
            t->dp = (int)(world / mp);
        } else if (mp * t->dp != world) {
            return verr(c, "topology.dp",
                        "%s x topology.dp (%d) = %lld but the world size is %d; set dp: auto "
                        "or launch %lld rank%s",
                        what, t->dp, mp * t->dp, world, mp * t->dp, mp * t->dp == 1 ? "" : "s");
        }
    }
    if (t->dp == 0) /* dp unknown (no world yet): micro_batch auto waits for it */
        return tr->micro_batch == 0 ? 0 : check_batch(c, tr, t->dp, t->pp);
    if (tr->micro_batch == 0) {
        if (tr->global_batch % t->dp)
            return verr(c, "training.global_batch",
                        "training.global_batch %d is not divisible "
                        "by topology.dp %d: every data-parallel rank takes an equal share of "
                        "a step's sequences; use a multiple of %d",
                        tr->global_batch, t->dp, t->dp);
        cfg->training.micro_batch = auto_micro_batch(tr->global_batch / t->dp, t->pp);
    }
    return check_batch(c, tr, t->dp, t->pp);
}

/* checkpoint.dir auto: <run.dir>/ckpt, so a run given its own run.dir
 * (--set run.dir=...) also gets its own checkpoints. */
static int resolve_checkpoint_dir(Checker *c, Config *cfg)
{
    char *dir = cfg->checkpoint.dir;
    if (strcmp(dir, "auto"))
        return 0;
    if ((size_t)snprintf(dir, CFG_STR, "%s/ckpt", cfg->run.dir) >= CFG_STR)
        return verr(c, "checkpoint.dir",
                    "checkpoint.dir auto (run.dir + /ckpt) is longer "
                    "than %d characters; shorten run.dir",
                    CFG_STR - 1);
    return 0;
}

/* model.moe's own ranges (resolving moe.ffn_hidden 0 to model.ffn_hidden),
 * then what it composes with.  Before the world is known (dp 0) the
 * expert-parallel rules wait for it. */
static int check_moe(Checker *c, ModelConfig *m)
{
    const TopologyConfig *t = &c->cfg->topology;
    if (t->ep < 1)
        return verr(c, "topology.ep", "topology.ep (%d) must be >= 1", t->ep);
    if (m->moe_experts == 0) {
        if (t->ep > 1)
            return verr(c, "topology.ep",
                        "topology.ep (%d) splits the experts of a mixture of experts, but the "
                        "model has none; set model.moe.experts or topology.ep: 1",
                        t->ep);
        return 0;
    }
    if (m->moe_experts < 1 || m->moe_experts > MOE_MAX_EXPERTS)
        return verr(c, "model.moe.experts", "model.moe.experts (%d) must be between 1 and %d",
                    m->moe_experts, MOE_MAX_EXPERTS);
    if (m->moe_top_k < 1 || m->moe_top_k > m->moe_experts)
        return verr(c, "model.moe.top_k",
                    "model.moe.top_k (%d) must be between 1 and model.moe.experts (%d): a "
                    "token goes to top_k different experts",
                    m->moe_top_k, m->moe_experts);
    if (m->moe_every < 1 || m->moe_every > m->layers)
        return verr(c, "model.moe.every",
                    "model.moe.every (%d) must be between 1 and model.layers (%d): layer l "
                    "is a MoE layer when (l + 1) %% every == 0",
                    m->moe_every, m->layers);
    if (m->moe_ffn_hidden < 0)
        return verr(c, "model.moe.ffn_hidden",
                    "model.moe.ffn_hidden (%d) must be >= 0 (0: model.ffn_hidden)",
                    m->moe_ffn_hidden);
    if (m->moe_shared_experts < 0)
        return verr(c, "model.moe.shared_experts", "model.moe.shared_experts (%d) must be >= 0",
                    m->moe_shared_experts);
    if ((long long)m->moe_shared_experts * m->moe_ffn_hidden > INT32_MAX / 2)
        return verr(c, "model.moe.shared_experts",
                    "model.moe.shared_experts x ffn_hidden is beyond 32 bits");
    if (!(m->moe_aux_loss_coef >= 0))
        return verr(c, "model.moe.aux_loss_coef", "model.moe.aux_loss_coef (%g) must be >= 0",
                    m->moe_aux_loss_coef);
    if (!(m->moe_z_loss_coef >= 0))
        return verr(c, "model.moe.z_loss_coef", "model.moe.z_loss_coef (%g) must be >= 0",
                    m->moe_z_loss_coef);
    if (m->moe_ffn_hidden == 0)
        m->moe_ffn_hidden = m->ffn_hidden;
    if (m->lora.rank > 0)
        return verr(c, "model.lora.rank",
                    "model.lora with model.moe: adapters on a mixture of experts are not "
                    "supported yet; fine-tune it without model.lora (or set model.lora.rank: 0)");
    /* tp, cp and sequence parallelism: refused by the layout rules (layout.c) */
    if (m->moe_experts % t->ep)
        return verr(c, "topology.ep",
                    "topology.ep (%d) must divide model.moe.experts (%d): each expert-parallel "
                    "rank holds experts / ep whole experts",
                    t->ep, m->moe_experts);
    if (t->dp > 0 && t->dp % t->ep)
        return verr(c, "topology.ep",
                    "topology.ep (%d) must divide topology.dp (%d): the expert-parallel "
                    "groups are carved out of the data-parallel ranks; use an ep that divides "
                    "%d",
                    t->ep, t->dp, t->dp);
    return 0;
}

/* model.lora (after resolve_model: kv_heads is known). */
static int check_lora(Checker *c, LoraConfig *lo)
{
    const ModelConfig *m = &c->cfg->model;
    /* "[qkv, up]" from --set: one plain form, "qkv,up", for every reader. */
    char *w = lo->targets;
    for (const char *r = lo->targets; *r; r++)
        if (*r != ' ' && *r != '\t')
            *w++ = *r;
    *w = '\0';
    if (lo->rank < 0)
        return verr(c, "model.lora.rank", "model.lora.rank (%d) must be >= 0 (0: no adapters)",
                    lo->rank);
    if (lo->rank == 0)
        return 0;
    if (!(lo->alpha > 0))
        return verr(c, "model.lora.alpha", "model.lora.alpha (%g) must be > 0", lo->alpha);
    if (!(lo->dropout >= 0 && lo->dropout < 1))
        return verr(c, "model.lora.dropout",
                    "model.lora.dropout (%g) must be in [0, 1): the probability of dropping an "
                    "element of an adapter's input",
                    lo->dropout);
    char bad[64];
    const int mask = config_lora_mask(lo->targets, m->arch, bad, sizeof bad);
    if (mask < 0)
        return verr(c, "model.lora.targets",
                    "model.lora.targets: '%s' is not a linear layer of a %s model (expected "
                    "names from qkv, proj, fc, %sfcproj)",
                    bad, m->arch == ARCH_LLAMA ? "llama" : "gpt2",
                    m->arch == ARCH_LLAMA ? "up, " : "");
    if (mask == 0)
        return verr(c, "model.lora.targets",
                    "model.lora.targets is empty: name the layers to adapt (qkv, proj, fc, "
                    "%sfcproj)",
                    m->arch == ARCH_LLAMA ? "up, " : "");
    return 0;
}

int config_validate(Config *cfg, int world, char err[CFG_ERR])
{
    Checker c = {.cfg = cfg, .err = err};
    if (check_ranges(&c) || check_allow_changes(&c, &cfg->checkpoint) || check_optimizer(&c) ||
        check_sizes(&c) || resolve_checkpoint_dir(&c, cfg))
        return -1;
    resolve_model(&cfg->model);
    if (check_lora(&c, &cfg->model.lora) || check_topology(&c) || check_world(&c, cfg, world) ||
        check_moe(&c, &cfg->model))
        return -1;
    return 0;
}
