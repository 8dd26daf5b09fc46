/* vocab_parallel.c — the embedding and the cross-entropy with the
 * vocabulary split over the TP group (tensor_par.h). */
#include <string.h>

#include "core/error.h"
#include "tensor_par/tensor_par.h"

/* ---- embedding ---- */

void tp_embedding_forward(const Backend *be, TpGroup *g, float *out, float *full,
                          const int32_t *tokens, const int32_t *pos, const float *wte,
                          const float *wpe, int N, int T, int C, int vocab_start, int Vp)
{
    if (!tp_active(g)) {
        be->embedding_forward(out, tokens, pos, wte, wpe, N, T, C, vocab_start, Vp);
        return;
    }
    /* Tokens outside this rank's range give zero rows (positions included,
     * backend.h), so the sum over ranks is wte + wpe exactly once per row. */
    be->embedding_forward(full, tokens, pos, wte, wpe, N, T, C, vocab_start, Vp);
    tp_row_output_forward(g, full, NULL, N, C);
    if (out != full)
        be->copy(out, full, (size_t)tp_stream_rows(g, N) * (size_t)C * sizeof(float));
}

void tp_embedding_backward(const Backend *be, TpGroup *g, float *dwte, float *dwpe,
                           float *dwpe_scratch, const float *dout, float *full,
                           const int32_t *tokens, const int32_t *pos, int N, int T, int C,
                           int vocab_start, int Vp)
{
    if (!tp_active(g)) {
        be->embedding_backward(dwte, dwpe, dout, tokens, pos, N, T, C, vocab_start, Vp);
        return;
    }
    const float *d = tp_row_output_backward(g, dout, full, N, C);
    /* dwte: this rank's rows, complete (every token of its range is here).
     * dwpe: only the rows whose token this rank owns; summed over TP. */
    if (dwpe)
        be->zero(dwpe_scratch, (size_t)T * (size_t)C * sizeof(float));
    be->embedding_backward(dwte, dwpe ? dwpe_scratch : NULL, d, tokens, pos, N, T, C, vocab_start,
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

void tp_crossentropy_forward(TpGroup *g, float *losses, float *stats, const float *logits,
                             const int32_t *targets, const int32_t *host_targets, int N, int V,
                             int Vp, int vocab_start, int vocab)
{
    check_targets(host_targets, N, vocab);
    /* Row maxima over the real columns (-inf where this rank has none). */
    g->be->vocab_max(stats, logits, N, V, Vp);
    if (tp_active(g))
        comm_allreduce_max_f32(g->comm, stats, (size_t)N);
    /* Sums of exponentials and target logits, both partial: one all-reduce. */
    g->be->vocab_sumexp(stats, logits, targets, N, V, Vp, vocab_start);
    if (tp_active(g))
        comm_allreduce_f32(g->comm, stats + N, 2 * (size_t)N);
    g->be->vocab_loss(losses, stats, targets, N);
}

void tp_crossentropy_backward(TpGroup *g, float *logits, const float *stats, const int32_t *targets,
                              float dloss, int N, int V, int Vp, int vocab_start)
{
    g->be->vocab_backward(logits, stats, targets, dloss, N, V, Vp, vocab_start);
}
