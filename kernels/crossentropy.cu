/* crossentropy.cu — fused softmax + cross-entropy over [N, Vp] logits of
 * which the first V columns are real: one block per row.  Targets < 0 are
 * ignored (loss 0, zero gradient row); padded columns never count and get
 * zero gradient.  Backward overwrites the logits with dlogits, so the
 * probabilities are never stored.
 *
 * A target >= V is a tokenizer / config mismatch.  The CPU backend checks
 * the targets before computing; here the kernel can only flag the first
 * bad row it meets in device memory (and leaves that row's loss NaN), and
 * the run ends at the next synchronizing call (sumsq, a copy to the host,
 * backend_cuda_synchronize) with the CPU's message. */
#include "ops.cuh"

enum { CE_THREADS = 256 };

/* The first bad row met (-1: none), its target and V. */
__device__ int ce_bad_row = -1;
__device__ int ce_bad_target, ce_bad_vocab;

__device__ inline void ce_flag(int n, int target, int V)
{
    if (atomicCAS(&ce_bad_row, -1, n) == -1) {
        ce_bad_target = target;
        ce_bad_vocab = V;
    }
}

__device__ inline float row_max(const float *x, int V)
{
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, x[v]);
    return block_max(mx);
}

/* loss = log sum exp(x - max) + max - x[target], over the V real columns */
__global__ void crossentropy_forward_kernel(float *losses, const float *logits,
                                            const int32_t *targets, int V, int Vp)
{
    int n = blockIdx.x, tgt = targets[n];
    const float *x = logits + (size_t)n * Vp;
    if (tgt < 0) { /* the whole block leaves: no block reduction is skipped */
        if (threadIdx.x == 0)
            losses[n] = 0;
        return;
    }
    float mx = row_max(x, V), sum = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        sum += expf(x[v] - mx);
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        if (tgt >= V) {
            ce_flag(n, tgt, V);
            losses[n] = NAN;
        } else {
            losses[n] = logf(sum) + mx - x[tgt];
        }
    }
}

/* dlogits = (softmax - onehot(target)) * dloss, in place */
__global__ void crossentropy_backward_kernel(float *logits, const int32_t *targets,
                                             float dloss, int V, int Vp)
{
    int n = blockIdx.x, tgt = targets[n];
    float *x = logits + (size_t)n * Vp;
    if (tgt < 0) { /* ignored row: no gradient */
        for (int v = threadIdx.x; v < Vp; v += blockDim.x)
            x[v] = 0;
        return;
    }
    if (tgt >= V && threadIdx.x == 0)
        ce_flag(n, tgt, V);
    /* exp written in place, then scaled: one exp per element; each thread
     * rescales the very elements it wrote */
    float mx = row_max(x, V), sum = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float e = expf(x[v] - mx);
        x[v] = e;
        sum += e;
    }
    float k = dloss / block_sum(sum);
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float g = x[v] * k;
        x[v] = v == tgt ? g - dloss : g;
    }
    for (int v = V + threadIdx.x; v < Vp; v += blockDim.x)
        x[v] = 0; /* padded columns are not part of the model */
}

void cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets,
                               int N, int V, int Vp)
{
    if (N <= 0)
        return;
    crossentropy_forward_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>(losses, logits, targets,
                                                                     V, Vp);
    CUDA_CHECK_LAUNCH();
}

void cuda_crossentropy_backward(float *logits, const int32_t *targets, float dloss, int N,
                                int V, int Vp)
{
    if (N <= 0)
        return;
    crossentropy_backward_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>(logits, targets, dloss,
                                                                      V, Vp);
    CUDA_CHECK_LAUNCH();
}

void cuda_crossentropy_check_targets(void)
{
    int row = -1, target = 0, vocab = 0;
    /* on the ops' stream, after every op issued so far */
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&row, ce_bad_row, sizeof row, 0,
                                         cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&target, ce_bad_target, sizeof target, 0,
                                         cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(&vocab, ce_bad_vocab, sizeof vocab, 0,
                                         cudaMemcpyDeviceToHost, cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    if (row < 0)
        return;
    trd_fatal(TRD_EXIT_RUNTIME, "the tokenizer's vocabulary must fit model.vocab_size",
              "target token %d at row %d is outside the vocabulary [0, %d)", target, row,
              vocab);
}
