/* layout.c — the layout rules (layout.h).  Each message names the values
 * and says what to change; the order is from the model's own shape to the
 * split over ranks to the combinations the engine refuses, so the first
 * message is about the root cause. */
#include "config/layout.h"

#include <stdarg.h>
#include <stdio.h>

#include "core/error.h"

static int fail(LayoutError *e, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(LayoutError *e, const char *key, const char *fmt, ...)
{
    e->key = key;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* model.rope_scaling: Llama 3's needs its four parameters, in the ranges
 * where its formula is defined (rope_inv_freq, backend.h); the
 * parameters without it are a mistake worth naming. */
static int layout_check_rope_scaling(const ModelConfig *m, LayoutError *e)
{
    if (m->rope_scaling == ROPE_SCALING_NONE) {
        if (m->rope_factor != 0 || m->rope_low_freq_factor != 0 || m->rope_high_freq_factor != 0 ||
            m->rope_original_max_position_embeddings != 0)
            return fail(e, "model.rope_scaling",
                        "model.rope_factor, rope_low_freq_factor, rope_high_freq_factor and "
                        "rope_original_max_position_embeddings apply only with "
                        "model.rope_scaling: llama3 (it is none)");
        return 0;
    }
    if (m->arch != ARCH_LLAMA)
        return fail(e, "model.rope_scaling",
                    "model.rope_scaling: llama3 needs arch llama (gpt2 has learned positions)");
    if (!(m->rope_factor >= 1))
        return fail(e, "model.rope_factor",
                    "model.rope_factor (%g) must be >= 1 with model.rope_scaling: llama3 "
                    "(Llama 3.1: 8)",
                    m->rope_factor);
    if (!(m->rope_low_freq_factor > 0) || !(m->rope_high_freq_factor > m->rope_low_freq_factor))
        return fail(e, "model.rope_high_freq_factor",
                    "model.rope_low_freq_factor (%g) must be > 0 and "
                    "model.rope_high_freq_factor (%g) greater than it with "
                    "model.rope_scaling: llama3 (Llama 3.1: 1 and 4)",
                    m->rope_low_freq_factor, m->rope_high_freq_factor);
    if (m->rope_original_max_position_embeddings < 1)
        return fail(e, "model.rope_original_max_position_embeddings",
                    "model.rope_original_max_position_embeddings (%d) must be >= 1 with "
                    "model.rope_scaling: llama3 (Llama 3.1: 8192)",
                    m->rope_original_max_position_embeddings);
    return 0;
}

int layout_check_model(const ModelConfig *m, LayoutError *e)
{
    if (m->heads < 1 || m->kv_heads < 1)
        return fail(e, "model.heads", "model.heads (%d) and model.kv_heads (%d) must be >= 1",
                    m->heads, m->kv_heads);
    if (m->hidden % m->heads) {
        const int lo = m->hidden / m->heads * m->heads, hi = lo + m->heads;
        return fail(e, "model.hidden",
                    "model.hidden (%d) must be divisible by model.heads (%d); "
                    "use e.g. hidden %d or %d",
                    m->hidden, m->heads, lo > 0 ? lo : hi, hi);
    }
    if (m->heads % m->kv_heads) {
        char d[256];
        trd_divisors(m->heads, d, sizeof d);
        return fail(e, "model.heads",
                    "model.heads (%d) must be divisible by model.kv_heads "
                    "(%d); use kv_heads one of %s",
                    m->heads, m->kv_heads, d);
    }
    if (m->arch == ARCH_LLAMA) {
        const int hs = m->hidden / m->heads;
        if (hs % 2)
            return fail(e, "model.hidden",
                        "model.hidden / model.heads = %d must be even for "
                        "arch llama (RoPE rotates pairs of dimensions); change hidden or heads",
                        hs);
        /* Llama has no learned position table: RoPE is its only position
         * information, so a usable base frequency is required. */
        if (!(m->rope_theta > 0))
            return fail(e, "model.rope_theta",
                        "model.rope_theta (%g) must be > 0 for arch "
                        "llama (RoPE is its only position encoding)",
                        m->rope_theta);
    }
    return layout_check_rope_scaling(m, e);
}

int layout_check_tp(const ModelConfig *m, int tp, int sequence_parallel, int cp, int micro_batch,
                    LayoutError *e)
{
    char d[256];
    if (tp < 1)
        return fail(e, "topology.tp", "topology.tp (%d) must be >= 1", tp);
    if (m->moe_experts > 0 && cp > 1)
        return fail(e, "topology.cp",
                    "model.moe does not compose with context parallelism yet (topology.cp "
                    "%d); use cp: 1 (data, tensor, sequence, pipeline and expert parallelism "
                    "and ZeRO work)",
                    cp);
    if (m->heads % tp) {
        trd_divisors(m->heads, d, sizeof d);
        return fail(e, "topology.tp",
                    "model.heads (%d) must be divisible by topology.tp (%d); "
                    "use tp one of %s",
                    m->heads, tp, d);
    }
    if (m->kv_heads % tp && tp % m->kv_heads)
        return fail(e, "topology.tp",
                    "model.kv_heads (%d) and topology.tp (%d): one must "
                    "divide the other (kv heads are split over, or replicated across, the tp "
                    "ranks)",
                    m->kv_heads, tp);
    if (m->ffn_hidden % tp)
        return fail(e, "topology.tp",
                    "model.ffn_hidden (%d) must be divisible by topology.tp "
                    "(%d)",
                    m->ffn_hidden, tp);
    /* An expert's MLP is split over tp like the dense one (docs/moe.md). */
    if (m->moe_experts > 0 && config_moe_ffn(m) % tp)
        return fail(e, "model.moe.ffn_hidden",
                    "model.moe.ffn_hidden (%d) must be divisible by topology.tp (%d): each "
                    "expert's MLP is split over the tp ranks; use a multiple of %d",
                    config_moe_ffn(m), tp, tp);
    /* a rank's token rows: its 1/cp of every sequence */
    const long long rows = (long long)(micro_batch > 0 ? micro_batch : 1) * m->seq_len / cp;
    if (sequence_parallel && tp > 1 && rows % tp && cp > 1)
        return fail(e, "model.seq_len",
                    "model.seq_len (%d) / topology.cp (%d) must be divisible by topology.tp "
                    "(%d) with topology.sequence_parallel (each tp rank holds a slice of the "
                    "token rows); change seq_len or turn it off",
                    m->seq_len, cp, tp);
    if (sequence_parallel && tp > 1 && rows % tp)
        return fail(e, "model.seq_len",
                    "model.seq_len (%d) must be divisible by topology.tp "
                    "(%d) with topology.sequence_parallel (each tp rank holds a slice of the "
                    "token rows); change seq_len or turn it off",
                    m->seq_len, tp);
    return 0;
}

/* The pipeline's model stages: pp x virtual_stages of them, each with at
 * least one layer; topology.stage_layers, when given, one count each. */
static int check_stages(const ModelConfig *m, const TopologyConfig *t, LayoutError *e)
{
    if (t->virtual_stages > 1 && t->schedule != SCHED_INTERLEAVED)
        return fail(e, "topology.virtual_stages",
                    "topology.virtual_stages (%d) > 1 needs "
                    "topology.schedule interleaved; set schedule: interleaved or "
                    "virtual_stages: 1",
                    t->virtual_stages);
    if (t->virtual_stages > CFG_MAX_VIRTUAL)
        return fail(e, "topology.virtual_stages",
                    "topology.virtual_stages (%d) is above %d; "
                    "each chunk adds a pipeline round trip, so a few (2-4) are what pays",
                    t->virtual_stages, CFG_MAX_VIRTUAL);
    if (t->n_stage_layers == 0) {
        if (m->layers < t->pp * t->virtual_stages)
            return fail(e, "model.layers",
                        "model.layers (%d) is less than topology.pp (%d) x "
                        "topology.virtual_stages (%d); every model chunk needs a layer",
                        m->layers, t->pp, t->virtual_stages);
        return 0;
    }
    /* Stage c * pp + r is chunk c of pipeline rank r. */
    if (t->n_stage_layers != t->pp * t->virtual_stages)
        return fail(e, "topology.stage_layers",
                    "topology.stage_layers has %d entries but "
                    "topology.pp (%d) x topology.virtual_stages (%d) is %d; give one layer "
                    "count per model stage",
                    t->n_stage_layers, t->pp, t->virtual_stages, t->pp * t->virtual_stages);
    int sum = 0;
    for (int i = 0; i < t->n_stage_layers; i++) {
        if (t->stage_layers[i] < 1)
            return fail(e, "topology.stage_layers",
                        "topology.stage_layers[%d] (%d) must be "
                        ">= 1",
                        i, t->stage_layers[i]);
        sum += t->stage_layers[i];
    }
    if (sum != m->layers)
        return fail(e, "topology.stage_layers",
                    "topology.stage_layers sums to %d but "
                    "model.layers is %d; the stages must hold every layer exactly once",
                    sum, m->layers);
    return 0;
}

/* Context parallelism: every sequence is cut into 2 cp chunks and cp rank
 * r holds chunks r and 2cp-1-r (docs/context_parallel.md). */
static int check_cp(const ModelConfig *m, const TopologyConfig *t, LayoutError *e)
{
    if (t->cp < 1)
        return fail(e, "topology.cp", "topology.cp (%d) must be >= 1 (1: no context parallelism)",
                    t->cp);
    if (t->cp > 1 && m->seq_len % (2 * t->cp)) {
        char d[256];
        trd_divisors(m->seq_len % 2 ? 1 : m->seq_len / 2, d, sizeof d);
        return fail(e, "topology.cp",
                    "model.seq_len (%d) must be divisible by 2 x topology.cp (%d): each cp "
                    "rank holds two chunks of seq_len / (2 cp) positions, one early and one "
                    "late, so that the causal attention work is even; use cp one of %s, or a "
                    "seq_len that is a multiple of %d",
                    m->seq_len, t->cp, d, 2 * t->cp);
    }
    return 0;
}

/* What the engine does not run, though each setting alone is fine. */
static int check_refused(const ModelConfig *m, const TopologyConfig *t, LayoutError *e)
{
    if (t->pp > 1 && t->zero == 3)
        return fail(e, "topology.zero",
                    "topology.zero 3 with topology.pp %d: ZeRO-3 "
                    "re-gathers every layer for every micro-batch, which pipelining "
                    "multiplies; like Megatron-LM, trident refuses it; use topology.zero 0, 1 "
                    "or 2 with pipeline parallelism",
                    t->pp);
    if (t->pp == 1 && t->virtual_stages > 1)
        return fail(e, "topology.virtual_stages",
                    "topology.virtual_stages %d with topology.pp "
                    "1: interleaving splits each pipeline rank's layers into chunks, and there "
                    "is no pipeline; set topology.virtual_stages: 1, or use topology.pp >= 2",
                    t->virtual_stages);
    if (t->pp > 1 && t->zero == 2 && m->tie_embeddings)
        return fail(e, "topology.zero",
                    "topology.zero 2 with topology.pp > 1 and tied "
                    "embeddings: the embedding gradient must be summed over the first and last "
                    "stage before it is sharded, which ZeRO-2's per-micro-batch reduction does "
                    "not allow; use topology.zero 1, or model.tie_embeddings: false");
    return 0;
}

int layout_check(const ModelConfig *m, const TopologyConfig *t, LayoutError *e)
{
    if (layout_check_model(m, e) || check_stages(m, t, e) || check_cp(m, t, e) ||
        layout_check_tp(m, t->tp, t->sequence_parallel, t->cp, 0, e) || check_refused(m, t, e))
        return -1;
    return 0;
}
