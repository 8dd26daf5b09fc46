/* emu.cpp — the emulated runtime behind cuda_runtime.h / cublas_v2.h.
 *
 * A block's threads are ucontext fibers.  Each round of the scheduler
 * resumes every live fiber once; a fiber runs until its next barrier
 * (__syncthreads, or either half of a shuffle) or its end, so a round is
 * exactly one barrier interval.  A block where some threads end while
 * others wait at a barrier aborts (undefined behaviour on a GPU).  A kernel
 * whose first block never synchronizes runs its other blocks as a plain
 * loop over threads (fast path for elementwise kernels). */
#include <algorithm>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <map>
#include <ucontext.h>

dim3 threadIdx, blockIdx, blockDim, gridDim;

cudaError_t cudaMalloc(void **p, size_t n) { *p = malloc(n); return *p ? 0 : 2; }
cudaError_t cudaFree(void *p) { free(p); return 0; }

enum { STACK = 256 * 1024 };
struct Fiber { ucontext_t ctx; char *stack; int done, waiting; };
static Fiber fib[1024];
static ucontext_t sched;
static int cur = -1, synced;
static const std::function<void()> *cur_fn;
static double shfl_buf[1024];

static void fiber_main()
{
    (*cur_fn)();
    fib[cur].done = 1;
    swapcontext(&fib[cur].ctx, &sched);
}

static void yield_to_sched()
{
    if (cur < 0) { fprintf(stderr, "emu: barrier outside a fiber block\n"); abort(); }
    synced = 1;
    fib[cur].waiting = 1;
    swapcontext(&fib[cur].ctx, &sched);
}

void __syncthreads() { yield_to_sched(); }

double emu_shfl_xor(double v, int o)
{
    int t = threadIdx.x, lane = t % 32, src = (t - lane) + (lane ^ o);
    if (blockDim.x % 32) { fprintf(stderr, "emu: blockDim not a multiple of 32\n"); abort(); }
    shfl_buf[t] = v;
    yield_to_sched();
    double r = shfl_buf[src];
    yield_to_sched();
    return r;
}

static void run_block_fibers(unsigned block, const std::function<void()> &f)
{
    cur_fn = &f;
    for (unsigned t = 0; t < block; t++) {
        if (!fib[t].stack) fib[t].stack = (char *)malloc(STACK);
        getcontext(&fib[t].ctx);
        fib[t].ctx.uc_stack.ss_sp = fib[t].stack;
        fib[t].ctx.uc_stack.ss_size = STACK;
        fib[t].ctx.uc_link = nullptr;
        makecontext(&fib[t].ctx, fiber_main, 0);
        fib[t].done = 0;
    }
    for (;;) {
        int alive = 0, finished_now = 0;
        for (unsigned t = 0; t < block; t++) {
            if (fib[t].done) continue;
            cur = (int)t; threadIdx.x = t; fib[t].waiting = 0;
            swapcontext(&sched, &fib[t].ctx);
            if (fib[t].done)
                finished_now++;
            else
                alive++;
        }
        cur = -1;
        if (!alive) break;
        if (finished_now) { /* some threads left while others wait at a barrier */
            fprintf(stderr, "emu: divergent barrier in block %u\n", blockIdx.x);
            abort();
        }
    }
}

void emu_run(unsigned grid, unsigned block, size_t shmem, const std::function<void()> &f,
             const void *key)
{
    static std::map<const void *, int> uses_sync;
    if (block == 0 || block > 1024 || grid == 0 || shmem) { fprintf(stderr, "emu: bad launch %u %u\n", grid, block); abort(); }
    gridDim.x = grid; blockDim.x = block;
    auto it = uses_sync.find(key);
    for (unsigned b = 0; b < grid; b++) {
        blockIdx.x = b;
        if (it == uses_sync.end() || it->second) {
            synced = 0;
            run_block_fibers(block, f);
            if (it == uses_sync.end()) { uses_sync[key] = synced; it = uses_sync.find(key); }
        } else {
            for (unsigned t = 0; t < block; t++) { threadIdx.x = t; f(); }
        }
    }
}

struct emu_cublas { int x; };
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new emu_cublas(); return 0; }

/* column-major, as documented: C = alpha op(A) op(B) + beta C */
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
        ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0;
            for (int l = 0; l < k; l++) {
                float a = ta == CUBLAS_OP_N ? A[i + (size_t)l * lda] : A[l + (size_t)i * lda];
                float b = tb == CUBLAS_OP_N ? B[l + (size_t)j * ldb] : B[j + (size_t)l * ldb];
                s += a * b;
            }
            C[i + (size_t)j * ldc] = *alpha * s + *beta * C[i + (size_t)j * ldc];
        }
    return 0;
}
