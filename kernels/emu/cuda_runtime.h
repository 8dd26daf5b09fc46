/* cuda_runtime.h (emulated) — the part of the CUDA runtime that kernels/
 * uses, on the CPU, so that the CUDA backend and the trainer that calls it
 * run without a GPU (meson -Demulate_cuda=true; docs/cuda.md).  A check
 * of indexing, block reductions, cuBLAS argument conventions and of which
 * memory the host code touches, not of GPU behaviour: blocks run one after
 * another, the threads of a block as fibers that switch at __syncthreads,
 * at warp shuffles and at warp-level matrix products (kernels/mma.cuh).
 *
 * Device memory is strict (emu.cpp): every cudaMalloc is its own mapping,
 * inaccessible (PROT_NONE) except while emulated device work runs (a
 * kernel, cuBLAS, a memset or copy).  Host code that dereferences a device
 * pointer therefore faults, and the SIGSEGV handler names the allocation.
 * Copies check their direction, memsets their bounds, kernel launches that
 * every pointer argument is device memory; a violation aborts with
 * "emu: <call>: ...". */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* blocks run one at a time: a static is the block's shared memory */
#define __shared__ static
/* vector_types.h's float4: 16 bytes, 16-aligned */
struct alignas(16) float4 {
    float x, y, z, w;
};

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

/* Error codes: the values of the real runtime. */
typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorNotReady = 600,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900
};
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
};
struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
};

/* One device, 0, whose memory is the host's RAM; launch errors abort at
 * once, so there is never a pending error to fetch. */
const char *cudaGetErrorString(cudaError_t err);
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);

/* ------------------------------------------------------ device memory */

cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
/* Stream-ordered allocation: immediate here, like every stream operation. */
inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
inline cudaError_t cudaFreeAsync(void *p, cudaStream_t) { return cudaFree(p); }
/* Page-locked host memory is ordinary host memory here; cudaFreeHost takes
 * only what cudaMallocHost returned and is still live. */
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s = 0);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);

/* Device work: every live allocation readable and writable between open
 * and close (nested calls count; the outermost close shuts them again). */
void emu_device_open();
void emu_device_close();
struct emu_device_scope {
    emu_device_scope() { emu_device_open(); }
    ~emu_device_scope() { emu_device_close(); }
    emu_device_scope(const emu_device_scope &) = delete;
    emu_device_scope &operator=(const emu_device_scope &) = delete;
};
/* Abort with "emu: <call>: <what> ..." unless [p, p + n) lies inside one
 * device allocation (emu_check_device) or touches none (emu_check_host). */
void emu_check_device(const char *call, const char *what, const void *p, size_t n);
void emu_check_host(const char *call, const char *what, const void *p, size_t n);

/* A __device__ variable is an ordinary global here (host memory). */
void emu_copy_from_symbol(const char *call, void *dst, const void *sym, size_t sym_size, size_t n,
                          size_t off, cudaMemcpyKind kind);
template <class T>
cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const T &sym, size_t n, size_t off = 0,
                                      cudaMemcpyKind kind = cudaMemcpyDeviceToHost,
                                      cudaStream_t = 0)
{
    emu_copy_from_symbol("cudaMemcpyFromSymbolAsync", dst, &sym, sizeof sym, n, off, kind);
    return cudaSuccess;
}
template <class T>
cudaError_t cudaMemcpyFromSymbol(void *dst, const T &sym, size_t n, size_t off = 0,
                                 cudaMemcpyKind kind = cudaMemcpyDeviceToHost)
{
    emu_copy_from_symbol("cudaMemcpyFromSymbol", dst, &sym, sizeof sym, n, off, kind);
    return cudaSuccess;
}

/* ----------------------------- streams and events: all work is synchronous */

/* A created stream is its own object (the compute stream, cuda_stream(),
 * is the null one), so that the step counts can say which stream a copy or
 * an event wait was issued on; its work still runs at once.  A stream
 * unnamed by emu_stream_name counts as "stream". */
cudaError_t cudaStreamCreate(cudaStream_t *s);
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    return cudaStreamCreate(s);
}
cudaError_t cudaStreamDestroy(cudaStream_t s);
/* Name a stream for the counts: "copy" (backend.cu's copy stream), "comm"
 * (an NCCL communicator's); the null stream is "compute". */
void emu_stream_name(cudaStream_t s, const char *name);
/* The waits do nothing here but are counted (emu_stats below). */
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaDeviceSynchronize();
/* An event holds the host time of its last record: work runs at once, so
 * that is when the work before it ended, and cudaEventElapsedTime gives
 * the emulation's (meaningless for a GPU) time between two records. */
cudaError_t cudaEventCreate(cudaEvent_t *e);
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = 0);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventSynchronize(cudaEvent_t);
/* Nothing to wait for (the work ran), but counted per pair of streams:
 * the waiting one and the one the event was last recorded on. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0);

/* ------------------------------------------- graphs: stream capture
 * While a stream is captured, kernel launches and cuBLAS / cuBLASLt calls
 * are recorded, their arguments by value (a GEMM's alpha and beta as the
 * values they point to, a cuBLASLt call's descriptors as they are), and do
 * not run; cudaGraphLaunch runs the records in order.  The null stream
 * cannot be captured (nor in CUDA); a copy, memset or synchronization while
 * capturing ends the emulation (in CUDA it invalidates the capture).  The
 * step counts have graph_launches, and graph_nodes: the kernels and GEMM
 * calls the launches ran, which are not counted as launches or
 * gemm_calls (the host issued one launch for them).  TRIDENT_EMU_NO_GRAPHS=1
 * (tests) makes cudaGraphInstantiate fail, to test the callers' fallback. */
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph *cudaGraphExec_t;
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
/* For the stand-ins of device work: while a capture is open, keep f as
 * the graph's next node and return true; else false (run it now). */
bool emu_capture(std::function<void()> f);

/* ------------------------------------------------------- device code */

inline uint32_t __float_as_uint(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
inline float __uint_as_float(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}
inline int atomicCAS(int *a, int cmp, int val)
{
    int old = *a;
    if (old == cmp)
        *a = val;
    return old;
}

/* Blocks run one after another, each to its end: a fence has nothing to
 * order, an atomic nothing to race with, and every load reads memory. */
inline int atomicAdd(int *a, int v)
{
    int old = *a;
    *a = old + v;
    return old;
}
inline void __threadfence() {}
template <class T> T __ldcg(const T *p) { return *p; }

void __syncthreads();
/* every thread of the block must shuffle together (as block_sum does) */
double emu_shfl_xor(double v, int o);
const double *emu_warp_values(double v);
/* An xor butterfly over n lanes' values (n a power of two, top < n): for
 * o = top, top / 2, .. 1, lane l's value becomes op(its value, lane l ^ o's). */
template <class T, class Op> void emu_butterfly(T *x, int n, Op op, int top)
{
    T y[32];
    for (int o = top; o > 0; o >>= 1) {
        for (int l = 0; l < n; l++)
            y[l] = op(x[l], x[l ^ o]);
        for (int l = 0; l < n; l++)
            x[l] = y[l];
    }
}

/* warp_sum and warp_max (five shuffles) at one barrier instead of five:
 * the same operations on the same values in the same order, so the same
 * result bit for bit.  A butterfly from `top` down mixes only the 2 top
 * lanes that differ from the caller's in the bits below 2 top (a group of
 * 8 for top 4), so only those are computed. */
template <class T, class Op> T emu_warp_butterfly(T v, Op op, int top = 16)
{
    const double *w = emu_warp_values((double)v);
    const int lane = (int)(threadIdx.x % 32), n = 2 * top, first = lane & ~(n - 1);
    T x[32];
    for (int l = 0; l < n; l++)
        x[l] = (T)w[first + l];
    emu_butterfly(x, n, op, top);
    return x[lane - first];
}

/* block_sum and block_max (two warp butterflies and two __syncthreads) at
 * one barrier, computed once for the block: each warp's butterfly, lane
 * 0's result as its partial, the partials (identity past the last warp)
 * through a butterfly again.  The butterflies of a sum or a max leave the
 * same value in every lane (op is commutative), so every thread's result
 * is lane 0's. */
const double *emu_block_values(double v, double **slot, int *fresh);
template <class T, class Op> T emu_block_butterfly(T v, Op op, T identity)
{
    double *slot;
    int fresh;
    const double *all = emu_block_values((double)v, &slot, &fresh);
    if (fresh) {
        int nwarps = blockDim.x / 32;
        T part[32], x[32];
        for (int w = 0; w < 32; w++) {
            part[w] = identity;
            if (w >= nwarps)
                continue;
            for (int l = 0; l < 32; l++)
                x[l] = (T)all[32 * w + l];
            emu_butterfly(x, 32, op, 16);
            part[w] = x[0];
        }
        emu_butterfly(part, 32, op, 16);
        *slot = (double)part[0];
    }
    return (T)*slot;
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int o)
{
    if (mask != 0xffffffffu) {
        fprintf(stderr, "emu: partial shuffle mask\n");
        abort();
    }
    return (T)emu_shfl_xor((double)v, o);
}

/* A warp-wide exchange for the emulated warp-level matrix operations
 * (kernels/mma.cuh): each thread of the warp gives n bytes (n <= 64) and
 * receives the 32 lanes' contributions in lane order in all[32 * n].  Like
 * a shuffle, every thread of the block must call it together. */
void emu_warp_gather(const void *mine, void *all, size_t n);

/* -------------------------------------------------------- step counts */

/* With TRD_EMU_STATS=FILE, what the host asks of the device is counted and
 * appended to FILE at every emu_stats_step (the trainer's step boundary,
 * through backend_cuda_step_end): kernel launches per kernel name with
 * their fewest and most threads (grid x block), host synchronizations,
 * copies per direction, memsets, device allocations and frees, pinned host
 * allocations, cuBLAS GEMMs and their FLOPs (2mnk).  A host
 * synchronization is a wait of the host for the device: a stream, device
 * or event synchronize, a synchronous cudaMemcpy / cudaMemcpyFromSymbol,
 * and an asynchronous copy to pageable (not cudaMallocHost) host memory,
 * which CUDA completes before returning.  An asynchronous copy from
 * pageable host memory is staged by the driver without waiting for the
 * device, so it is a copy, not a synchronization.  The file format is in
 * docs/cuda.md ("Step budget"). */
extern "C" void emu_stats_step(int step);

/* ---------------------------------------------------------- launches */

/* kernel<<<grid, block, shmem, stream>>>(args) is rewritten by launch.py
 * into emu_launch(grid, block, shmem, kernel, "kernel", args). */
void emu_run(unsigned grid, unsigned block, size_t shmem, const std::function<void()> &f,
             const char *name);
/* A non-null pointer argument that is not device memory aborts: a host
 * buffer handed to a kernel is the bug this emulation exists to find. */
void emu_check_kernel_pointer(const char *name, int index, const void *p);
template <class P, class A> void emu_check_kernel_arg(const char *name, int index, const A &a)
{
    if constexpr (std::is_pointer_v<P>) {
        P p = a; /* the conversion the call itself makes */
        if (p)
            emu_check_kernel_pointer(name, index, (const void *)p);
    }
}
template <class... P, class... A>
void emu_launch(unsigned grid, unsigned block, size_t shmem, void (*k)(P...), const char *name,
                A... args)
{
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with a wrong argument count");
    int index = 0;
    (emu_check_kernel_arg<P>(name, index++, args), ...);
    emu_run(
        grid, block, shmem, [=] { k(args...); }, name);
}
