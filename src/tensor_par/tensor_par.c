/* tensor_par.c — the TP group and the collectives at the boundaries of the
 * parallel layers (the table in tensor_par.h). */
#include "tensor_par/tensor_par.h"

#include <string.h>

#include "core/error.h"

TpGroup tp_group_layout(const Backend *be, int size, int rank, int sequence_parallel, int kv_share)
{
    TRD_ASSERT(size >= 1 && rank >= 0 && rank < size && kv_share >= 1);
    TpGroup g = {.be = be,
                 .comm = NULL,
                 .kv = comm_none(),
                 .size = size,
                 .rank = rank,
                 .sp = size > 1 && sequence_parallel,
                 .kv_share = kv_share};
    return g;
}

void tp_group_attach(TpGroup *g, Comm *tp)
{
    const int size = tp ? tp->size : 1, rank = tp ? tp->rank : 0;
    if (size != g->size || rank != g->rank)
        trd_fatal(TRD_EXIT_RUNTIME, "pass the TP communicator of this rank (TopologyComms.tp)",
                  "tensor parallel: the model was built for tp rank %d of %d, but the "
                  "communicator is rank %d of %d",
                  g->rank, g->size, rank, size);
    g->comm = tp;
    comm_free(&g->kv);
    if (g->kv_share > 1)
    /* Ranks r with the same r / kv_share hold the same kv group. */
    {
        g->kv = comm_split(tp, g->rank / g->kv_share, g->rank);
        comm_set_name(&g->kv, "tp-kv");
    }
}

void tp_group_free(TpGroup *g)
{
    comm_free(&g->kv);
    g->comm = NULL;
}

void tp_group_check(const TpGroup *g)
{
    if (g->size > 1 && !g->comm)
        trd_fatal(TRD_EXIT_RUNTIME, "call model_set_tensor_parallel before the first step",
                  "tensor parallel: the model is split %d ways but has no TP communicator",
                  g->size);
}

int tp_stream_rows(const TpGroup *g, int N)
{
    if (!tp_sequence_parallel(g))
        return N;
    TRD_ASSERT(N % g->size == 0);
    return N / g->size;
}

float *tp_my_rows(const TpGroup *g, float *full, int N, int C)
{
    if (!tp_sequence_parallel(g))
        return full;
    return full + (size_t)g->rank * (size_t)tp_stream_rows(g, N) * (size_t)C;
}

/* ---- the four boundaries ---- */

void tp_column_input_forward(TpGroup *g, float *x, int N, int C)
{
    if (!tp_sequence_parallel(g))
        return; /* the input is already whole and equal on every rank */
    comm_allgather_block_f32(g->comm, x, (size_t)tp_stream_rows(g, N) * (size_t)C);
}

void tp_column_input_backward(TpGroup *g, float *dx, int N, int C)
{
    if (!tp_active(g))
        return;
    /* Each rank's heads (or MLP columns) saw the whole input: the input
     * gradient is the sum of the ranks' contributions. */
    if (g->sp)
        comm_reduce_scatter_block_f32(g->comm, dx, (size_t)tp_stream_rows(g, N) * (size_t)C);
    else
        comm_allreduce_f32(g->comm, dx, (size_t)N * (size_t)C);
}

void tp_row_output_forward(TpGroup *g, float *y, const float *bias, int N, int C)
{
    const int rows = tp_stream_rows(g, N);
    if (tp_active(g)) {
        if (g->sp)
            comm_reduce_scatter_block_f32(g->comm, y, (size_t)rows * (size_t)C);
        else
            comm_allreduce_f32(g->comm, y, (size_t)N * (size_t)C);
    }
    /* Replicated bias: after the sum, so it counts once. */
    if (bias)
        g->be->add_bias(y, bias, rows, C);
}

const float *tp_row_output_backward(TpGroup *g, const float *dy, float *full, int N, int C)
{
    if (!tp_sequence_parallel(g))
        return dy; /* identity: every rank holds the whole gradient */
    const size_t n = (size_t)tp_stream_rows(g, N) * (size_t)C;
    g->be->copy(full + (size_t)g->rank * n, dy, n * sizeof(float));
    comm_allgather_block_f32(g->comm, full, n);
    return full;
}

/* ---- replicated parameters ---- */

void tp_add_reduced_grad(TpGroup *g, float *grad, float *partial, size_t n)
{
    if (tp_active(g))
        comm_allreduce_f32(g->comm, partial, n);
    /* Reduce the new contribution alone, then add: reducing grad itself
     * would count earlier micro-batches size times. */
    g->be->accumulate(grad, partial, n);
}

void tp_kv_allreduce(TpGroup *g, float *rows, size_t n)
{
    if (g->kv_share > 1)
        comm_allreduce_f32(&g->kv, rows, n);
}
