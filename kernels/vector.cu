/* vector.cu — the elementwise helpers (add_bias, add, accumulate, scale,
 * widen_bf16, dropout_philox), the sum of squares behind the gradient norm, and the step's
 * scalars kept on the device (loss_add, grad_check: backend.h's
 * BackendStepState). */
#include "ops.cuh"

#include "core/philox.h"

/* y[r, c] += bias[c], one thread per element of y */
__global__ void add_bias_kernel(float *y, const float *bias, size_t n, int C)
{
    GRID_STRIDE(i, n)
    y[i] += bias[i % (size_t)C];
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n)
    out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float *y, const float *x, size_t n)
{
    GRID_STRIDE(i, n)
    y[i] += x[i];
}

__global__ void scale_kernel(float *x, float s, size_t n)
{
    GRID_STRIDE(i, n)
    x[i] *= s;
}

__global__ void widen_bf16_kernel(float *dst, const uint16_t *src, size_t n)
{
    GRID_STRIDE(i, n)
    dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

/* backend.h's dropout_philox, one thread per element: each draws the four
 * words of its group of columns and keeps its own (the group's other
 * threads draw the same four: 10 rounds of integer arithmetic, no memory,
 * cheaper than sharing them across threads).  The mask is never stored:
 * backward draws it again from the same counters. */
__global__ void dropout_philox_kernel(float *x, const uint64_t *rows, size_t total, int n, int col0,
                                      uint64_t key, double cut, float inv)
{
    GRID_STRIDE(e, total)
    {
        const size_t i = e / (size_t)n;
        const uint64_t c = (uint64_t)col0 + (uint64_t)(e % (size_t)n);
        uint32_t r[4];
        trd_philox4x32(r, rows[i], c / 4, key); /* rng_philox's steps */
        x[e] = (double)r[c % 4] < cut ? 0.0f : x[e] * inv;
    }
}

void cuda_dropout_philox(float *x, const uint64_t *rows, int N, int n, int col0, uint64_t key,
                         float p)
{
    const size_t total = (size_t)N * (size_t)n;
    if (!total)
        return;
    const float inv = 1.0f / (1.0f - p); /* the CPU's fp32 factor */
    dropout_philox_kernel<<<cuda_blocks(total), CUDA_THREADS, 0, cuda_stream()>>>(
        x, rows, total, n, col0, key, (double)p * 4294967296.0, inv);
    CUDA_CHECK_LAUNCH();
}

void cuda_add_bias(float *y, const float *bias, int rows, int C)
{
    if (rows <= 0 || C <= 0)
        return;
    size_t n = (size_t)rows * (size_t)C;
    add_bias_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(y, bias, n, C);
    CUDA_CHECK_LAUNCH();
}

void cuda_add(float *out, const float *a, const float *b, size_t n)
{
    if (!n)
        return;
    add_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_accumulate(float *y, const float *x, size_t n)
{
    if (!n)
        return;
    accumulate_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(y, x, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_scale(float *x, float s, size_t n)
{
    if (!n)
        return;
    scale_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(x, s, n);
    CUDA_CHECK_LAUNCH();
}

void cuda_widen_bf16(float *dst, const uint16_t *src, size_t n)
{
    if (!n)
        return;
    widen_bf16_kernel<<<cuda_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(dst, src, n);
    CUDA_CHECK_LAUNCH();
}

/* Sum of squares in double, in a fixed shape: SUMSQ_BLOCKS blocks of
 * CUDA_THREADS threads whatever n (1024: 256 kept 16 warps a
 * multiprocessor, 0.56 TB/s over GPT-2's 124M gradients on an H200), each
 * block's partial sum stored, then one block adds the partials.  The same input always gives the same bits
 * (gradient clipping feeds on it and resumed runs continue bit for bit);
 * they may differ from the CPU's, which sums in another order. */
enum { SUMSQ_BLOCKS = 4 * CUDA_THREADS }; /* also the finishing block's threads */

__device__ double sumsq_part[SUMSQ_BLOCKS];
__device__ double sumsq_total;

__global__ void sumsq_blocks_kernel(const float *x, size_t n)
{
    double s = 0;
    GRID_STRIDE(i, n)
    s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        sumsq_part[blockIdx.x] = s;
}

/* one block of SUMSQ_BLOCKS threads */
__global__ void sumsq_total_kernel(void)
{
    double s = block_sum(sumsq_part[threadIdx.x]);
    if (threadIdx.x == 0)
        sumsq_total = s;
}

/* sum of squares over the concatenation of ranges r[0 .. nr) of x, total
 * elements, in the shape of sumsq_blocks_kernel */
__global__ void sumsq_ranges_kernel(const float *x, const CudaRange *r, int nr, size_t total)
{
    double s = 0;
    int k = -1;
    GRID_STRIDE(i, total)
    {
        /* i only grows: search once, then step forward */
        if (k < 0)
            k = cuda_range_find(r, nr, i);
        while (i >= r[k].vstart + (r[k].hi - r[k].lo))
            k++;
        double v = x[r[k].lo + (i - r[k].vstart)];
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        sumsq_part[blockIdx.x] = s;
}

/* The total of sumsq_total_kernel to the host, with the cross-entropy
 * flag, in one wait: into page-locked memory, so neither copy waits by
 * itself. */
static double read_total(void)
{
    static double *host;
    if (!host)
        host = (double *)backend_cuda_host_alloc(sizeof *host, "sum of squares");
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(host, sumsq_total, sizeof *host, 0, cudaMemcpyDeviceToHost,
                                         cuda_stream()));
    cuda_crossentropy_fetch_targets();
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    cuda_crossentropy_report_targets();
    return *host;
}

double cuda_sumsq(const float *x, size_t n)
{
    if (!n)
        return 0;
    sumsq_blocks_kernel<<<SUMSQ_BLOCKS, CUDA_THREADS, 0, cuda_stream()>>>(x, n);
    CUDA_CHECK_LAUNCH();
    sumsq_total_kernel<<<1, SUMSQ_BLOCKS, 0, cuda_stream()>>>();
    CUDA_CHECK_LAUNCH();
    return read_total();
}

double cuda_sumsq_ranges(const float *x, const BackendRange *ranges, int n)
{
    static CudaRanges table;
    size_t total = 0;
    const CudaRange *r = cuda_ranges_upload(&table, ranges, n, &total);
    if (!total)
        return 0;
    sumsq_ranges_kernel<<<SUMSQ_BLOCKS, CUDA_THREADS, 0, cuda_stream()>>>(x, r, n, total);
    CUDA_CHECK_LAUNCH();
    sumsq_total_kernel<<<1, SUMSQ_BLOCKS, 0, cuda_stream()>>>();
    CUDA_CHECK_LAUNCH();
    return read_total();
}

/* sumsq_total_kernel's sum, then the step's decision from it and the loss
 * already in s (backend.h grad_check), by thread 0: the host's arithmetic
 * in trainer.c, so that AdamW reads the clip factor and the skip flag from
 * device memory and the host never waits for them. */
__global__ void grad_check_total_kernel(BackendStepState *st, float clip, int empty)
{
    double s = block_sum(empty ? 0.0 : sumsq_part[threadIdx.x]);
    if (threadIdx.x == 0) {
        double norm = sqrt(s);
        int skip = !(isfinite(st->loss) && isfinite(norm));
        st->sumsq = s;
        st->skip = skip;
        st->grad_scale = !skip && clip > 0 && norm > clip ? clip / (float)(norm + 1e-6) : 1.0f;
    }
}

void cuda_grad_check(BackendStepState *st, const float *g, const BackendRange *ranges, int n,
                     float clip)
{
    static CudaRanges table;
    size_t total = 0;
    const CudaRange *r = cuda_ranges_upload(&table, ranges, n, &total);
    if (total) {
        sumsq_ranges_kernel<<<SUMSQ_BLOCKS, CUDA_THREADS, 0, cuda_stream()>>>(g, r, n, total);
        CUDA_CHECK_LAUNCH();
    }
    grad_check_total_kernel<<<1, SUMSQ_BLOCKS, 0, cuda_stream()>>>(st, clip, total == 0);
    CUDA_CHECK_LAUNCH();
}

/* The loss of a micro-batch into the step's sum (backend.h loss_add): one
 * block, each thread adding every LOSS_THREADS-th row in double, then the
 * block's sum in a fixed order (deterministic); the fp32 mean and its
 * share as model.c and the trainer compute them on the host.  At GPT-2's
 * 8192 rows a thread adds 8 losses (32 KiB read in all). */
enum { LOSS_THREADS = 1024 };

__global__ void loss_add_kernel(BackendStepState *st, const float *losses, const int32_t *targets,
                                int N, float share)
{
    double s = 0;
    int counted = 0;
    for (int n = threadIdx.x; n < N; n += blockDim.x)
        if (targets[n] >= 0) {
            s += losses[n];
            counted++;
        }
    s = block_sum(s);
    counted = block_sum(counted);
    if (threadIdx.x == 0) {
        float mean = counted ? (float)(s / counted) : 0.0f;
        st->loss += share * mean;
    }
}

void cuda_loss_add(BackendStepState *st, const float *losses, const int32_t *targets, int N,
                   float share)
{
    if (N <= 0)
        return;
    loss_add_kernel<<<1, LOSS_THREADS, 0, cuda_stream()>>>(st, losses, targets, N, share);
    CUDA_CHECK_LAUNCH();
}
