/* cuda_runtime.h (emulated) — the part of the CUDA runtime that kernels/
 * uses, on the CPU, so that tests/test_cuda_ops.c can run the kernels'
 * code without a GPU (kernels/emu/run.sh).  A check of indexing, block
 * reductions and cuBLAS argument conventions, not of GPU behaviour: blocks
 * run one after another, the threads of a block as fibers that switch at
 * __syncthreads and at warp shuffles; device memory is host memory. */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>

#define __global__
#define __device__
#define __host__
/* blocks run one at a time: a static is the block's shared memory */
#define __shared__ static
struct dim3 { unsigned x = 1, y = 1, z = 1; };
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

typedef int cudaError_t;
enum { cudaSuccess = 0 };
typedef void *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
struct cudaDeviceProp { char name[256]; int major, minor; size_t totalGlobalMem; };
inline const char *cudaGetErrorString(cudaError_t) { return "emulated error"; }
inline cudaError_t cudaGetLastError() { return 0; }
inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return 0; }
inline cudaError_t cudaSetDevice(int) { return 0; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int)
{
    strcpy(p->name, "CPU emulation (kernels/emu)");
    p->major = 9, p->minor = 0, p->totalGlobalMem = 0;
    return 0;
}
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
    memset(p, v, n);
    return 0;
}
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t)
{
    memcpy(d, s, n);
    return 0;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return 0; }
template <class T>
cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const T &sym, size_t n, size_t off,
                                      cudaMemcpyKind, cudaStream_t)
{
    memcpy(dst, (const char *)&sym + off, n);
    return 0;
}

inline uint32_t __float_as_uint(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
inline int atomicCAS(int *a, int cmp, int val)
{
    int old = *a;
    if (old == cmp)
        *a = val;
    return old;
}

void __syncthreads();
/* every thread of the block must shuffle together (as block_sum does) */
double emu_shfl_xor(double v, int o);
template <class T> T __shfl_xor_sync(unsigned mask, T v, int o)
{
    if (mask != 0xffffffffu) {
        fprintf(stderr, "emu: partial shuffle mask\n");
        abort();
    }
    return (T)emu_shfl_xor((double)v, o);
}

/* kernel<<<grid, block, shmem, stream>>>(args) is rewritten by launch.py
 * into emu_launch(grid, block, shmem, kernel, args) */
void emu_run(unsigned grid, unsigned block, size_t shmem, const std::function<void()> &f,
             const void *key);
template <class... P, class... A>
void emu_launch(unsigned grid, unsigned block, size_t shmem, void (*k)(P...), A... args)
{
    emu_run(grid, block, shmem, [=] { k(args...); }, (const void *)k);
}
