/* vocab_parallel.c — the embedding and the cross-entropy with the
 * vocabulary split over the TP group (tensor_par.h). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "tensor_par/tensor_par.h"

/* ---- embedding ---- */

void tp_embedding_forward(const Backend *be, TpGroup *g, float *out, float *full,
                          const int32_t *tokens, const float *wte, const float *wpe, int N,
                          int T, int C, int vocab_start, int Vp)
{
    if (!tp_active(g)) {
        be->embedding_forward(out, tokens, wte, wpe, N, T, C, vocab_start, Vp);
        return;
    }
    /* Tokens outside this rank's range give zero rows (positions included,
     * backend.h), so the sum over ranks is wte + wpe exactly once per row. */
    be->embedding_forward(full, tokens, wte, wpe, N, T, C, vocab_start, Vp);
    tp_row_output_forward(g, full, NULL, N, C);
    if (out != full)
        be->copy(out, full, (size_t)tp_stream_rows(g, N) * (size_t)C * sizeof(float));
}

void tp_embedding_backward(const Backend *be, TpGroup *g, float *dwte, float *dwpe,
                           float *dwpe_scratch, const float *dout, float *full,
                           const int32_t *tokens, int N, int T, int C, int vocab_start, int Vp)
{
    if (!tp_active(g)) {
        be->embedding_backward(dwte, dwpe, dout, tokens, N, T, C, vocab_start, Vp);
        return;
    }
    const float *d = tp_row_output_backward(g, dout, full, N, C);
    /* dwte: this rank's rows, complete (every token of its range is here).
     * dwpe: only the rows whose token this rank owns; summed over TP. */
    if (dwpe)
        be->zero(dwpe_scratch, (size_t)T * (size_t)C * sizeof(float));
    be->embedding_backward(dwte, dwpe ? dwpe_scratch : NULL, d, tokens, N, T, C, vocab_start,
                           Vp);
    if (dwpe)
        tp_add_reduced_grad(g, dwpe, dwpe_scratch, (size_t)T * (size_t)C);
}

/* ---- cross-entropy ---- */

static void check_targets(const int32_t *targets, int N, int vocab)
{
    for (int n = 0; n < N; n++)
        if (targets[n] >= vocab)
            trd_fatal(TRD_EXIT_RUNTIME, "the tokenizer's vocabulary must fit model.vocab_size",
                      "target token %d at row %d is outside the vocabulary [0, %d)",
                      (int)targets[n], n, vocab);
}

/* The local column of a global id, or -1 when another rank holds it. */
static inline int local_col(int32_t id, int vocab_start, int V)
{
    const int c = (int)id - vocab_start;
    return id >= 0 && c >= 0 && c < V ? c : -1;
}

void tp_crossentropy_forward(TpGroup *g, float *losses, float *stats, const float *logits,
                             const int32_t *targets, int N, int V, int Vp, int vocab_start,
                             int vocab)
{
    check_targets(targets, N, vocab);
    float *mx = stats, *sum = stats + N, *tgt = stats + 2 * (size_t)N;
    /* Row maxima over the real columns (-inf where this rank has none). */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float m = -INFINITY;
        for (int v = 0; v < V; v++)
            m = x[v] > m ? x[v] : m;
        mx[n] = m;
    }
    if (tp_active(g))
        comm_allreduce_max_f32(g->comm, mx, (size_t)N);

    /* Sums of exponentials and target logits, both partial: one all-reduce. */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float s = 0;
        for (int v = 0; v < V; v++)
            s += expf(x[v] - mx[n]);
        sum[n] = s;
        const int c = local_col(targets[n], vocab_start, V);
        tgt[n] = c >= 0 ? x[c] : 0.0f;
    }
    if (tp_active(g))
        comm_allreduce_f32(g->comm, sum, 2 * (size_t)N);

    for (int n = 0; n < N; n++)
        losses[n] = targets[n] < 0 ? 0.0f : logf(sum[n]) + mx[n] - tgt[n];
}

void tp_crossentropy_backward(float *logits, const float *stats, const int32_t *targets,
                              float dloss, int N, int V, int Vp, int vocab_start)
{
    const float *mx = stats, *sum = stats + N;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * Vp;
        if (targets[n] < 0) { /* ignored row: no gradient */
            memset(x, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        const float k = dloss / sum[n];
        for (int v = 0; v < V; v++)
            x[v] = expf(x[v] - mx[n]) * k;
        const int c = local_col(targets[n], vocab_start, V);
        if (c >= 0)
            x[c] -= dloss;
        for (int v = V; v < Vp; v++)
            x[v] = 0; /* padded columns are not part of the model */
    }
}
