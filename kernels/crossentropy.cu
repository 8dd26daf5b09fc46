/* crossentropy.cu — fused softmax + cross-entropy over [N, Vp] logits of
 * which the first V columns are real: one block per row.  Targets < 0 are
 * ignored (loss 0, zero gradient row); padded columns never count and get
 * zero gradient.  Backward overwrites the logits with dlogits, so the
 * probabilities are never stored.
 *
 * A target >= V is a tokenizer / config mismatch.  The CPU backend checks
 * the targets before computing; here the kernel can only flag the first
 * bad row it meets in device memory (and leaves that row's loss NaN), and
 * the run ends at the next call that waits for the device (sumsq, a copy
 * to the host, backend_cuda_synchronize) with the CPU's message: the flag
 * travels with that wait, at no wait of its own.
 *
 * The vocabulary-parallel ops (vocab_*) split the same computation around
 * the all-reduces of tensor parallelism; they are at the end. */
#include "ops.cuh"

#include <cuda_bf16.h>

enum { CE_THREADS = 256 };

/* The first bad row met (row -1: none), its target and V: one symbol, so
 * that the host fetches it with one copy. */
struct CeBad {
    int row, target, vocab;
};
__device__ CeBad ce_bad = {-1, 0, 0};

__device__ inline void ce_flag(int n, int target, int V)
{
    if (atomicCAS(&ce_bad.row, -1, n) == -1) {
        ce_bad.target = target;
        ce_bad.vocab = V;
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
__global__ void crossentropy_backward_kernel(float *logits, const int32_t *targets, float dloss,
                                             int V, int Vp)
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

/* A logit: fp32, or bf16 where the head stores its logits in bf16
 * (backend.h's crossentropy_x16: the max, the sum and the loss in fp32,
 * dlogits rounded to nearest even as they are stored, the CPU's bf16_bits). */
__device__ inline float ce_load(const float *x) { return *x; }
__device__ inline float ce_load(const __nv_bfloat16 *x) { return __bfloat162float(*x); }
__device__ inline void ce_store(float *x, float v) { *x = v; }
__device__ inline void ce_store(__nv_bfloat16 *x, float v) { *x = __float2bfloat16(v); }

/* The forward and the backward of a row in one kernel (llm.c's fused
 * classifier): one read of the row for its max and sum (an online
 * softmax: each thread keeps its running max and the sum of exp scaled to
 * it, merged over the block once), then one read and one write for
 * dlogits in place.  The unfused pair reads the row 5 times and writes it
 * twice.  losses NULL: not written; grad 0: the logits are left as they
 * are (the bf16 head's forward and backward apart). */
template <typename T>
__global__ void crossentropy_fused_kernel(float *losses, T *logits, const int32_t *targets,
                                          int grad, float dloss, int V, int Vp)
{
    int n = blockIdx.x, tgt = targets[n];
    T *x = logits + (size_t)n * Vp;
    if (tgt < 0) { /* ignored row: loss 0, no gradient */
        if (threadIdx.x == 0 && losses)
            losses[n] = 0;
        if (grad)
            for (int v = threadIdx.x; v < Vp; v += blockDim.x)
                ce_store(x + v, 0.0f);
        return;
    }
    float mx = -INFINITY, sum = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float xv = ce_load(x + v);
        if (xv > mx) { /* rescale the sum so far to the new max */
            sum = sum * expf(mx - xv) + 1.0f;
            mx = xv;
        } else if (mx > -INFINITY) { /* else xv is -inf too: exp 0 */
            sum += expf(xv - mx);
        }
    }
    float bmx = block_max(mx);
    sum = block_sum(mx == -INFINITY ? 0.0f : sum * expf(mx - bmx));
    if (threadIdx.x == 0) {
        if (tgt >= V) {
            ce_flag(n, tgt, V);
            if (losses)
                losses[n] = NAN;
        } else if (losses) {
            losses[n] = logf(sum) + bmx - ce_load(x + tgt);
        }
    }
    if (!grad)
        return;
    __syncthreads(); /* x[tgt] is read above before any thread overwrites it */
    float k = dloss / sum;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float g = expf(ce_load(x + v) - bmx) * k;
        ce_store(x + v, v == tgt ? g - dloss : g);
    }
    for (int v = V + threadIdx.x; v < Vp; v += blockDim.x)
        ce_store(x + v, 0.0f); /* padded columns are not part of the model */
}

void cuda_crossentropy_fused(float *losses, float *logits, const int32_t *targets, float dloss,
                             int N, int V, int Vp)
{
    if (N <= 0)
        return;
    crossentropy_fused_kernel<float>
        <<<N, CE_THREADS, 0, cuda_stream()>>>(losses, logits, targets, 1, dloss, V, Vp);
    CUDA_CHECK_LAUNCH();
}

void cuda_crossentropy_x16(float *losses, uint16_t *logits, const int32_t *targets, int grad,
                           float dloss, int N, int V, int Vp)
{
    if (N <= 0 || (!losses && !grad))
        return;
    crossentropy_fused_kernel<__nv_bfloat16><<<N, CE_THREADS, 0, cuda_stream()>>>(
        losses, (__nv_bfloat16 *)logits, targets, grad, dloss, V, Vp);
    CUDA_CHECK_LAUNCH();
}

void cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int N,
                               int V, int Vp)
{
    if (N <= 0)
        return;
    crossentropy_forward_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>(losses, logits, targets, V,
                                                                     Vp);
    CUDA_CHECK_LAUNCH();
}

void cuda_crossentropy_backward(float *logits, const int32_t *targets, float dloss, int N, int V,
                                int Vp)
{
    if (N <= 0)
        return;
    crossentropy_backward_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>(logits, targets, dloss, V,
                                                                      Vp);
    CUDA_CHECK_LAUNCH();
}

/* ---- vocabulary-parallel cross-entropy ----
 * The same loss with the vocabulary split over TP ranks, in passes around
 * the caller's two all-reduces (backend.h): vocab_max, then vocab_sumexp
 * with the global max, then vocab_loss / vocab_backward with the global
 * statistics.  stats is [3N]: mx, sum, tgt.  These ops do not know the
 * global vocabulary, so a target no rank holds cannot be flagged here: the
 * caller checks the targets on the host before they are copied in. */

/* The local column of a global target id, or -1 (ignored, or another rank's) */
__device__ inline int vocab_col(int32_t target, int vocab_start, int V)
{
    int c = (int)target - vocab_start;
    return target >= 0 && c >= 0 && c < V ? c : -1;
}

/* mx[n] = max of the V real columns; -inf when V == 0 (a rank of padding) */
__global__ void vocab_max_kernel(float *mx, const float *logits, int V, int Vp)
{
    int n = blockIdx.x;
    float m = row_max(logits + (size_t)n * Vp, V);
    if (threadIdx.x == 0)
        mx[n] = m;
}

/* sum[n] = sum exp(x - mx[n]) over the V real columns (every row, as on the
 * CPU); tgt[n] = the target's logit when this rank holds it, else 0 */
__global__ void vocab_sumexp_kernel(float *stats, const float *logits, const int32_t *targets,
                                    int N, int V, int Vp, int vocab_start)
{
    int n = blockIdx.x;
    const float *x = logits + (size_t)n * Vp;
    float mx = stats[n], sum = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        sum += expf(x[v] - mx);
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        int c = vocab_col(targets[n], vocab_start, V);
        stats[N + n] = sum;
        stats[2 * (size_t)N + n] = c >= 0 ? x[c] : 0.0f;
    }
}

/* loss = log(sum) + mx - tgt from the all-reduced statistics: one thread per row */
__global__ void vocab_loss_kernel(float *losses, const float *stats, const int32_t *targets, int N)
{
    const float *mx = stats, *sum = stats + N, *tgt = stats + 2 * (size_t)N;
    GRID_STRIDE(n, (size_t)N)
    losses[n] = targets[n] < 0 ? 0.0f : logf(sum[n]) + mx[n] - tgt[n];
}

/* dlogits = (softmax - onehot(target)) * dloss over this rank's columns, in
 * place, with the global mx and sum: one block per row, no reduction */
__global__ void vocab_backward_kernel(float *logits, const float *stats, const int32_t *targets,
                                      float dloss, int N, int V, int Vp, int vocab_start)
{
    int n = blockIdx.x, tgt = targets[n];
    float *x = logits + (size_t)n * Vp;
    if (tgt < 0) { /* ignored row: no gradient */
        for (int v = threadIdx.x; v < Vp; v += blockDim.x)
            x[v] = 0;
        return;
    }
    /* the target's column, when it is here, is written by the one thread
     * that owns it: no second pass, no race */
    float mx = stats[n], k = dloss / stats[N + n];
    int c = vocab_col(tgt, vocab_start, V);
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float g = expf(x[v] - mx) * k;
        x[v] = v == c ? g - dloss : g;
    }
    for (int v = V + threadIdx.x; v < Vp; v += blockDim.x)
        x[v] = 0; /* padded columns are not part of the model */
}

void cuda_vocab_max(float *stats, const float *logits, int N, int V, int Vp)
{
    if (N <= 0)
        return;
    vocab_max_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>(stats, logits, V, Vp);
    CUDA_CHECK_LAUNCH();
}

void cuda_vocab_sumexp(float *stats, const float *logits, const int32_t *targets, int N, int V,
                       int Vp, int vocab_start)
{
    if (N <= 0)
        return;
    vocab_sumexp_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>(stats, logits, targets, N, V, Vp,
                                                             vocab_start);
    CUDA_CHECK_LAUNCH();
}

void cuda_vocab_loss(float *losses, const float *stats, const int32_t *targets, int N)
{
    if (N <= 0)
        return;
    vocab_loss_kernel<<<cuda_blocks((size_t)N), CUDA_THREADS, 0, cuda_stream()>>>(losses, stats,
                                                                                  targets, N);
    CUDA_CHECK_LAUNCH();
}

void cuda_vocab_backward(float *logits, const float *stats, const int32_t *targets, float dloss,
                         int N, int V, int Vp, int vocab_start)
{
    if (N <= 0)
        return;
    vocab_backward_kernel<<<N, CE_THREADS, 0, cuda_stream()>>>(logits, stats, targets, dloss, N, V,
                                                               Vp, vocab_start);
    CUDA_CHECK_LAUNCH();
}

/* where the flag lands on the host: page-locked, so that the copy does
 * not wait for the device by itself */
static CeBad *ce_bad_host;

void cuda_crossentropy_fetch_targets(void)
{
    if (!ce_bad_host) {
        ce_bad_host = (CeBad *)backend_cuda_host_alloc(sizeof *ce_bad_host, "target check");
        ce_bad_host->row = -1;
    }
    /* on the ops' stream, after every op issued so far */
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(ce_bad_host, ce_bad, sizeof *ce_bad_host, 0,
                                         cudaMemcpyDeviceToHost, cuda_stream()));
}

void cuda_crossentropy_report_targets(void)
{
    if (!ce_bad_host || ce_bad_host->row < 0)
        return;
    trd_fatal(TRD_EXIT_RUNTIME, "the tokenizer's vocabulary must fit model.vocab_size",
              "target token %d at row %d is outside the vocabulary [0, %d)", ce_bad_host->target,
              ce_bad_host->row, ce_bad_host->vocab);
}
