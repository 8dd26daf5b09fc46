/* common.cuh — what every CUDA file of the backend shares: the checked-call
 * macros, the stream the ops run on, launch sizes and block reductions.
 * Internal to kernels/; C code sees only src/backend/cuda.h. */
#ifndef TRD_KERNELS_COMMON_CUH
#define TRD_KERNELS_COMMON_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

/* error.h is C17: its _Noreturn is not a C++ keyword. */
#define _Noreturn [[noreturn]]
extern "C" {
#include "backend/backend.h"
#include "core/error.h"
}
#undef _Noreturn

#include "backend/cuda.h"

/* Every CUDA runtime call goes through CUDA_CHECK: a failure ends the run
 * with file:line, the call as written and CUDA's own words. */
#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            trd_fatal(TRD_EXIT_RUNTIME,                                                            \
                      "check the GPU (nvidia-smi), the driver and free memory; "                   \
                      "CUDA_LAUNCH_BLOCKING=1 pins the failing kernel",                            \
                      "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(err_));       \
    } while (0)

/* After each launch: a bad configuration (too many threads, too much
 * shared memory) is reported here; faults inside the kernel surface at the
 * next synchronizing call. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

/* The stream every op of the table runs on (backend.cu). */
cudaStream_t cuda_stream(void);
/* Device memory allocated and freed in order on that stream, never
 * synchronizing the device (backend.cu); counted in the memory peak. */
void *cuda_malloc_async(size_t bytes, const char *what);
void cuda_free_async(void *dev);

/* A BackendRange as the multi-range kernels read it: vstart is where the
 * range begins in the ranges' concatenation, so a grid-stride loop over
 * that concatenation finds its range by search (cuda_range_find). */
struct CudaRange {
    size_t lo, hi, vstart;
    int decay;
};
/* The ranges of one call site in device memory, uploaded only when they
 * change (steady training passes the same table every step: no copy, no
 * allocation).  *total receives the elements they cover. */
struct CudaRanges {
    CudaRange *dev, *host; /* host: what dev holds */
    int n, cap;
};
const CudaRange *cuda_ranges_upload(CudaRanges *c, const BackendRange *r, int n, size_t *total);
/* the index of the range holding concatenated element i (the last range
 * whose vstart <= i; ranges are non-empty) */
__device__ inline int cuda_range_find(const CudaRange *r, int n, size_t i)
{
    int a = 0, b = n - 1;
    while (a < b) {
        int m = (a + b + 1) / 2;
        if (r[m].vstart <= i)
            a = m;
        else
            b = m - 1;
    }
    return a;
}

/* Launch sizes.  Elementwise kernels loop with a grid stride, so the grid
 * is capped and any n (size_t) is covered. */
enum { CUDA_THREADS = 256 };
static const size_t CUDA_MAX_BLOCKS = 65535;

static inline unsigned cuda_blocks(size_t n)
{
    size_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    if (b == 0)
        b = 1;
    return (unsigned)(b < CUDA_MAX_BLOCKS ? b : CUDA_MAX_BLOCKS);
}

/* for (size_t i over [0, n)) spread over the whole grid */
#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

/* Sum / max of one value per thread over the whole block (blockDim.x a
 * multiple of 32, at most 1024); every thread gets the result.  The
 * trailing __syncthreads lets a caller reduce again with the same scratch. */
#if defined(TRD_CUDA_EMULATED)
/* the emulation runs the same butterfly at one barrier (kernels/emu) */
template <typename T> __device__ inline T warp_sum(T v)
{
    return emu_warp_butterfly(v, [](T a, T b) { return a + b; });
}

__device__ inline float warp_max(float v)
{
    return emu_warp_butterfly(v, [](float a, float b) { return fmaxf(a, b); });
}

__device__ inline float lane_group_sum(float v, int G)
{
    return G == 1 ? v
                  : emu_warp_butterfly(
                        v, [](float a, float b) { return a + b; }, G / 2);
}
#else
template <typename T> __device__ inline T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The sum over a group of G lanes (G a power of two up to 32: lanes that
 * differ in their low bits); every lane of the warp calls it together. */
__device__ inline float lane_group_sum(float v, int G)
{
    for (int o = G / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#endif

#if defined(TRD_CUDA_EMULATED)
/* the emulation runs the same butterflies at one barrier (kernels/emu) */
template <typename T> __device__ inline T block_sum(T v)
{
    return emu_block_butterfly(
        v, [](T a, T b) { return a + b; }, (T)0);
}

__device__ inline float block_max(float v)
{
    return emu_block_butterfly(
        v, [](float a, float b) { return fmaxf(a, b); }, -INFINITY);
}
#else
template <typename T> __device__ inline T block_sum(T v)
{
    __shared__ T part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_sum(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    T s = lane < nwarps ? part[lane] : (T)0;
    s = warp_sum(s);
    __syncthreads();
    return s;
}

__device__ inline float block_max(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_max(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    float m = lane < nwarps ? part[lane] : -INFINITY;
    m = warp_max(m);
    __syncthreads();
    return m;
}
#endif

/* GELU (tanh approximation) as the CPU computes it (cpu_ops.inc):
 * x sigmoid(2u), u = GELU_K (x + GELU_A x^3), which saturates to 0 without
 * NaN where exp overflows. */
#define GELU_K 0.7978845608028654f
#define GELU_A 0.044715f
__device__ inline float gelu_value(float x)
{
    const float u = GELU_K * (x + GELU_A * x * x * x);
    return x / (1 + expf(-2 * u));
}

/* SwiGLU's output from the gate a and up: silu(a) * up, silu(a) = a *
 * sigmoid(a) (activation.cu's kernels and decode_linear) */
__device__ inline float swiglu_value(float a, float up) { return a / (1 + expf(-a)) * up; }

/* Column sums of a [N, W] row-major array, deterministic and parallel
 * over rows as well as columns: a block of COLSUM_COLS x COLSUM_GROUPS
 * threads covers COLSUM_COLS neighbouring columns (a warp reads 32
 * neighbouring floats of a row) over one chunk of the rows; thread
 * (g, lane) sums rows n0 + g, n0 + g + G, ... of its chunk's column in
 * order, and colsum_groups adds the G partials of each column in order.
 * With more than one chunk (colsum_chunks: enough blocks to fill the GPU,
 * 24 column blocks alone were 24 of an H100's 132 multiprocessors for
 * C = 768) each chunk's sum goes to a scratch row and cuda_colsum_finish
 * adds the rows in chunk order.  The chunks depend on N and W only, so the
 * order, and the bits, are the same on every run and every GPU (not the
 * CPU's, which sums the rows in order); each thread walks N / (R G) rows. */
enum { COLSUM_COLS = 32, COLSUM_GROUPS = 32, COLSUM_TARGET_BLOCKS = 264 };

static inline unsigned colsum_blocks(int W)
{
    return (unsigned)((W + COLSUM_COLS - 1) / COLSUM_COLS);
}

/* The chunks of the rows: about COLSUM_TARGET_BLOCKS blocks in all (two
 * blocks of 1024 threads on each of 132 multiprocessors), each chunk at
 * least 32 rows a thread (one chunk, no second kernel, below 2048 rows). */
static inline int colsum_chunks(int N, int W)
{
    const int cb = (int)colsum_blocks(W), most = N / (COLSUM_GROUPS * 32);
    int r = (COLSUM_TARGET_BLOCKS + cb - 1) / cb;
    if (r > most)
        r = most;
    return r < 1 ? 1 : r;
}

/* this thread's column (may be >= W: it then adds nothing but must still
 * reach the barriers), its row group, and its chunk's rows [*n0, *n1) */
__device__ inline int colsum_col(int W)
{
    return blockIdx.x % ((W + COLSUM_COLS - 1) / COLSUM_COLS) * COLSUM_COLS +
           threadIdx.x % COLSUM_COLS;
}
__device__ inline int colsum_group(void) { return threadIdx.x / COLSUM_COLS; }
__device__ inline int colsum_nchunks(int W)
{
    return gridDim.x / ((W + COLSUM_COLS - 1) / COLSUM_COLS);
}
__device__ inline void colsum_rows(int N, int W, int *n0, int *n1)
{
    const int cb = (W + COLSUM_COLS - 1) / COLSUM_COLS, R = gridDim.x / cb, k = blockIdx.x / cb;
    *n0 = (int)((long long)N * k / R);
    *n1 = (int)((long long)N * (k + 1) / R);
}

/* The sum of v over the row groups of this thread's column, in group
 * order, returned to group 0 (the others get 0).  Every thread of the
 * block must call it; it may be called again at once. */
__device__ inline float colsum_groups(float v)
{
    __shared__ float part[COLSUM_GROUPS][COLSUM_COLS];
    int lane = threadIdx.x % COLSUM_COLS, g = colsum_group();
    part[g][lane] = v;
    __syncthreads();
    float s = 0;
    if (g == 0)
        for (int k = 0; k < COLSUM_GROUPS; k++)
            s += part[k][lane];
    __syncthreads();
    return s;
}

/* Group 0's sum s of column c: added to acc[c] when the grid is one chunk,
 * else stored as the chunk's row of part ([R][W]) for cuda_colsum_finish. */
__device__ inline void colsum_put(float *acc, float *part, int W, int c, float s)
{
    if (colsum_group() != 0 || c >= W || !acc)
        return;
    const int cb = (W + COLSUM_COLS - 1) / COLSUM_COLS;
    if ((int)gridDim.x == cb)
        acc[c] += s;
    else
        part[(size_t)(blockIdx.x / cb) * W + c] = s;
}

/* The scratch of a column sum over R chunks into `outs` outputs of W
 * columns each (NULL for one chunk), and the finish: acc0[c] += the R rows
 * of part in order, acc1 likewise from the next R rows (either may be
 * NULL; nothing to do for one chunk).  backend.cu. */
float *cuda_colsum_scratch(int R, int W, int outs);
void cuda_colsum_finish(float *acc0, float *acc1, const float *part, int R, int W);

/* cuBLAS's workspace, one for both handles (their work is ordered on the
 * ops' stream): 32 MiB, what NVIDIA advises for Hopper, made once and
 * kept, outside the memory report.  backend.cu. */
enum { CUDA_BLAS_WORKSPACE = 32 << 20 };
void *cuda_blas_workspace(void);

/* A scratch buffer of at least `bytes` per slot, grown in stream order and
 * kept: the kernels' small temporaries, outside the memory report like
 * cuBLAS's workspace (backend.cu). */
enum {
    CUDA_SCRATCH_COLSUM,
    CUDA_SCRATCH_ATTN,
    CUDA_SCRATCH_EMB,
    CUDA_SCRATCH_GROUPED, /* matmul.cu's grouped GEMM tables */
    CUDA_SCRATCH_DECODE,  /* decode.cu's attention splits (one size, made once) */
    CUDA_SCRATCH_SLOTS
};
void *cuda_scratch(int slot, size_t bytes);

#endif
