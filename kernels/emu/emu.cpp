/* emu.cpp — the emulated runtime behind cuda_runtime.h / cublas_v2.h.
 *
 * Device memory.  Each cudaMalloc is a private mapping of its own:
 *
 *     guard page | slack | ptr .. ptr + size | < 256 bytes | guard page
 *
 * ptr is 256-byte aligned (as cudaMalloc promises) and placed so that its
 * end, rounded up to 256 bytes, meets the trailing guard page: an overrun
 * faults at once instead of reading the next buffer.  The data pages are
 * PROT_NONE except while emulated device work runs (a kernel, a cuBLAS
 * call, a memset or a copy opens the allocations it touches, DeviceWork;
 * the emulated NCCL opens all, emu_device_open), so host code that
 * dereferences a device pointer faults; the SIGSEGV handler below turns
 * that fault into a message naming the allocation.  Under
 * AddressSanitizer the slack and guards are also poisoned, so ASan reports
 * even the small overruns that stay inside the last page.
 *
 * Threads.  A block's threads are fibers (see ctx_switch).  Each round of the
 * scheduler resumes every live fiber once; a fiber runs until its next
 * barrier (__syncthreads, a shuffle, or either half of a warp gather, the
 * emulated tensor-core product's exchange) or its end, so a
 * round is exactly one barrier interval.  A block where some threads end
 * while others wait at a barrier aborts (undefined behaviour on a GPU).  A
 * block whose thread 0 meets no barrier runs its other threads as a plain
 * loop (fast path for elementwise kernels). */
#include <algorithm>
#include <cblas.h>
#include <cerrno>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <vector>
#include <execinfo.h>
#include <map>
#include <string>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMU_POISON(p, n) __asan_poison_memory_region((p), (n))
#define EMU_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define EMU_POISON(p, n) ((void)(p), (void)(n))
#define EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;

/* The calls that led here, one frame a line ("binary(function+offset)" or
 * "binary(+offset)": `addr2line -f -e binary offset` names the line).
 * backtrace_symbols_fd does not allocate, so the SIGSEGV handler may call
 * it; backtrace is called once before any fault, while loading what it
 * needs is still safe (install_segv_handler). */
static void print_backtrace()
{
    void *frames[48];
    int n = backtrace(frames, 48);
    static const char head[] = "emu: called from:\n";
    ssize_t w = write(STDERR_FILENO, head, sizeof head - 1);
    (void)w;
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

[[noreturn]] __attribute__((format(printf, 1, 2))) static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("emu: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    print_backtrace();
    abort();
}

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (emulated: one device, 0)";
    case cudaErrorNotSupported: return "operation not supported (emulated: TRIDENT_EMU_NO_GRAPHS=1)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (emulated)";
    default: return "unknown error (emulated)";
    }
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (d != 0)
        return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CPU emulation (kernels/emu)");
    p->major = 9, p->minor = 0;
    p->totalGlobalMem = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    return cudaSuccess;
}

/* ------------------------------------------------------- step counts */

/* What the host asked of the device since the last step mark
 * (cuda_runtime.h, emu_stats_step).  Counted always (a few adds per
 * call); written only with TRD_EMU_STATS. */
struct KernelCount {
    long launches = 0;
    unsigned long long threads_min = ~0ull, threads_max = 0;
};
static struct {
    long syncs, h2d, d2h, d2d, memsets, mallocs, frees, host_allocs, gemms, gemm_calls;
    long graph_launches, graph_nodes;
    double h2d_bytes, d2h_bytes, gemm_flops;
    std::map<std::string, KernelCount> kernels;
    /* per stream: "h2d.copy" (copies host to device issued on the copy
     * stream), "wait.compute<comm" (the compute stream waits for an event
     * recorded on a communicator's stream), ...; written after the totals,
     * only those counted this step */
    std::map<std::string, long> streams;
} stats;

struct emu_stream {
    const char *name;
};

static const char *stream_name(cudaStream_t s) { return s ? s->name : "compute"; }

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    *s = new emu_stream{"stream"};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    delete s;
    return cudaSuccess;
}

void emu_stream_name(cudaStream_t s, const char *name)
{
    if (s)
        s->name = name;
}

static void count_sync() { stats.syncs++; }

static void count_launch(const char *name, unsigned long long threads)
{
    KernelCount &k = stats.kernels[name];
    k.launches++;
    k.threads_min = std::min(k.threads_min, threads);
    k.threads_max = std::max(k.threads_max, threads);
}

/* One "step" line with the totals, then one "kernel" line per kernel name
 * (tab-separated, docs/cuda.md), and the counts start again. */
extern "C" void emu_stats_step(int step)
{
    const char *path = getenv("TRD_EMU_STATS");
    if (path && *path) {
        FILE *f = fopen(path, "a");
        if (!f)
            die("TRD_EMU_STATS=%s: %s", path, strerror(errno));
        long launches = 0;
        for (auto &kv : stats.kernels)
            launches += kv.second.launches;
        fprintf(f, "step\t%d\tlaunches\t%ld\tsyncs\t%ld\th2d\t%ld\td2h\t%ld\td2d\t%ld\t"
                   "memsets\t%ld\tmallocs\t%ld\tfrees\t%ld\thost_allocs\t%ld\tgemms\t%ld\t"
                   "gemm_calls\t%ld\tgemm_flops\t%.0f\th2d_bytes\t%.0f\td2h_bytes\t%.0f\t"
                   "graph_launches\t%ld\tgraph_nodes\t%ld",
                step, launches, stats.syncs, stats.h2d, stats.d2h, stats.d2d, stats.memsets,
                stats.mallocs, stats.frees, stats.host_allocs, stats.gemms, stats.gemm_calls,
                stats.gemm_flops, stats.h2d_bytes, stats.d2h_bytes, stats.graph_launches,
                stats.graph_nodes);
        for (auto &kv : stats.streams)
            fprintf(f, "\t%s\t%ld", kv.first.c_str(), kv.second);
        fprintf(f, "\n");
        for (auto &kv : stats.kernels)
            fprintf(f, "kernel\t%d\t%s\t%ld\t%llu\t%llu\n", step, kv.first.c_str(),
                    kv.second.launches, kv.second.threads_min, kv.second.threads_max);
        if (fclose(f) != 0)
            die("TRD_EMU_STATS=%s: %s", path, strerror(errno));
    }
    stats.kernels.clear();
    stats.streams.clear();
    stats.syncs = stats.h2d = stats.d2h = stats.d2d = stats.memsets = 0;
    stats.mallocs = stats.frees = stats.host_allocs = stats.gemms = stats.gemm_calls = 0;
    stats.h2d_bytes = stats.d2h_bytes = stats.gemm_flops = 0;
    stats.graph_launches = stats.graph_nodes = 0;
}

/* ------------------------------------------------------------ graphs */

struct emu_graph {
    std::vector<std::function<void()>> nodes;
};
static emu_graph *capture; /* the graph being captured, or null */

/* device work the host asked for while capturing (cuda_runtime.h) */
static void no_capture(const char *call)
{
    if (capture)
        die("%s while a stream is captured (CUDA would invalidate the capture)", call);
}

bool emu_capture(std::function<void()> f)
{
    if (!capture)
        return false;
    capture->nodes.push_back(std::move(f));
    return true;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode)
{
    if (!s || capture)
        return cudaErrorStreamCaptureUnsupported;
    capture = new emu_graph;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    if (!s || !capture)
        return cudaErrorInvalidValue;
    *g = capture;
    capture = nullptr;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long)
{
    const char *no = getenv("TRIDENT_EMU_NO_GRAPHS");
    if (no && strcmp(no, "1") == 0)
        return cudaErrorNotSupported;
    *e = new emu_graph(*g);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t)
{
    no_capture("cudaGraphLaunch");
    stats.graph_launches++;
    for (auto &node : e->nodes) {
        stats.graph_nodes++;
        node();
    }
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    no_capture("cudaStreamSynchronize");
    count_sync();
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize()
{
    no_capture("cudaDeviceSynchronize");
    count_sync();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t)
{
    no_capture("cudaEventSynchronize");
    count_sync();
    return cudaSuccess;
}

struct emu_event {
    double t;       /* seconds, CLOCK_MONOTONIC, of the last record; < 0: never */
    const char *on; /* the stream of the last record (stream_name) */
};

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new emu_event{-1, "none"};
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned)
{
    if (!e)
        return cudaErrorInvalidValue;
    stats.streams[std::string("wait.") + stream_name(s) + "<" + e->on]++;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e)
        return cudaErrorInvalidValue;
    e->on = stream_name(s);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!start || !end || start->t < 0 || end->t < 0)
        return cudaErrorInvalidValue;
    *ms = (float)(1e3 * (end->t - start->t));
    return cudaSuccess;
}

/* ------------------------------------------------------ device memory */

enum { DEVICE_ALIGN = 256 };

struct Alloc {
    char *map;       /* the whole mapping, guard pages included */
    size_t map_size;
    char *ptr;       /* what cudaMalloc returned */
    size_t size;     /* what it was asked for */
    bool open;       /* readable and writable (device work runs and touched it) */
};

/* live allocations by mapping address; device_open counts nested opens;
 * opened: the allocations made accessible since device work began, made
 * inaccessible again when it ends */
static std::map<uintptr_t, Alloc> allocs;
static int device_open;
static std::vector<Alloc *> opened;
static struct sigaction prev_segv;

static size_t page_size()
{
    static size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return page;
}

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* the allocation whose mapping holds addr (guards included), or NULL */
static Alloc *find_alloc(uintptr_t addr)
{
    auto it = allocs.upper_bound(addr);
    if (it == allocs.begin())
        return nullptr;
    --it;
    return addr < it->first + it->second.map_size ? &it->second : nullptr;
}

static void protect(const Alloc &a, int prot)
{
    size_t page = page_size();
    if (mprotect(a.map + page, a.map_size - 2 * page, prot) != 0)
        die("mprotect of the allocation of %zu bytes at %p failed: %s", a.size,
            (void *)a.ptr, strerror(errno));
}

/* Device work opens only the allocations it touches: those its call
 * names (a kernel's pointer arguments, a copy's or a GEMM's operands)
 * at once, any other (a pointer inside a struct argument) at its first
 * access, by the SIGSEGV handler (on_segv).  Opening every allocation for
 * every launch and closing them again cost two mprotect calls per
 * allocation per launch, which was most of a small model's emulated
 * step.  Outside device work every allocation is closed, as before. */
static void open_alloc(Alloc &a)
{
    if (a.open)
        return;
    protect(a, PROT_READ | PROT_WRITE);
    a.open = true;
    opened.push_back(&a); /* no allocation: reserved in work_begin */
}

static void work_begin()
{
    if (device_open++ == 0)
        opened.reserve(allocs.size());
}

/* opens the allocation that holds p, if any (the call's checks come first) */
static void work_touch(const void *p)
{
    if (Alloc *a = find_alloc((uintptr_t)p))
        open_alloc(*a);
}

/* Every allocation, as the emulated NCCL needs (MPI may reach the buffers
 * from the other ranks' processes, where no fault would open them). */
void emu_device_open()
{
    work_begin();
    for (auto &kv : allocs)
        open_alloc(kv.second);
}

void emu_device_close()
{
    if (device_open <= 0)
        die("emu_device_close without emu_device_open");
    if (--device_open == 0) {
        for (Alloc *a : opened) {
            protect(*a, PROT_NONE);
            a->open = false;
        }
        opened.clear();
    }
}

/* The scope of device work that opens what it touches (above). */
struct DeviceWork {
    DeviceWork() { work_begin(); }
    ~DeviceWork() { emu_device_close(); }
    DeviceWork(const DeviceWork &) = delete;
    DeviceWork &operator=(const DeviceWork &) = delete;
};

/* "K bytes past the end of" / "K bytes before the start of" an allocation */
static void describe_outside(char *buf, size_t size, uintptr_t addr, const Alloc &a)
{
    uintptr_t beg = (uintptr_t)a.ptr, end = beg + a.size;
    if (addr >= end)
        snprintf(buf, size, "%zu bytes past the end of", (size_t)(addr - end));
    else
        snprintf(buf, size, "%zu bytes before the start of", (size_t)(beg - addr));
}

/* A fault inside a device mapping is reported and aborts; any other fault
 * goes back to the handler that was there before (the default, or
 * AddressSanitizer's): returning re-runs the access, which faults again. */
static void on_segv(int, siginfo_t *si, void *)
{
    uintptr_t addr = (uintptr_t)si->si_addr;
    Alloc *a = find_alloc(addr);
    if (!a) {
        sigaction(SIGSEGV, &prev_segv, nullptr);
        return;
    }
    uintptr_t page = page_size(), map = (uintptr_t)a->map;
    if (device_open && !a->open && addr >= map + page && addr < map + a->map_size - page) {
        open_alloc(*a); /* device work's first access: returning re-runs it */
        return;
    }
    char msg[400], where[80];
    uintptr_t beg = (uintptr_t)a->ptr;
    if (addr >= beg && addr < beg + a->size) /* closed: only host code runs */
        snprintf(msg, sizeof msg,
                 "emu: host code touched device memory at %p (allocation of %zu bytes at %p)\n",
                 (void *)addr, a->size, (void *)a->ptr);
    else {
        describe_outside(where, sizeof where, addr, *a);
        snprintf(msg, sizeof msg,
                 "emu: %s touched %p, %s the device allocation of %zu bytes at %p\n",
                 device_open ? "device code (kernel, cuBLAS or copy)" : "host code",
                 (void *)addr, where, a->size, (void *)a->ptr);
    }
    ssize_t w = write(STDERR_FILENO, msg, strlen(msg));
    (void)w;
    print_backtrace();
    abort();
}

static void install_segv_handler()
{
    static bool done;
    if (done)
        return;
    done = true;
    void *frame;
    backtrace(&frame, 1); /* loads libgcc's unwinder now, not in the handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK; /* ONSTACK: ASan's alternate stack, if any */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &prev_segv) != 0)
        die("sigaction(SIGSEGV): %s", strerror(errno));
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = nullptr;
    if (n == 0)
        return cudaSuccess;
    if (n > ((size_t)1 << 48)) /* more than any address space; and no overflow below */
        return cudaErrorMemoryAllocation;
    install_segv_handler();
    size_t page = page_size(), span = round_up(n, DEVICE_ALIGN), data = round_up(span, page);
    /* mapped writable first, so that memory the system cannot commit fails
     * here, as an out-of-memory cudaMalloc would, and not at first use */
    size_t map_size = data + 2 * page;
    void *m = mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return cudaErrorMemoryAllocation;
    Alloc a = {(char *)m, map_size, (char *)m + page + data - span, n, false};
    if (mprotect(a.map, page, PROT_NONE) || mprotect(a.map + page + data, page, PROT_NONE))
        die("mprotect of a guard page: %s", strerror(errno));
    protect(a, PROT_NONE); /* opened when device work touches it */
    EMU_POISON(a.map, (size_t)(a.ptr - a.map));
    EMU_POISON(a.ptr + n, map_size - (size_t)(a.ptr - a.map) - n);
    allocs[(uintptr_t)m] = a;
    if (device_open) /* room for it in opened, which the SIGSEGV handler may not grow */
        opened.reserve(allocs.size());
    stats.mallocs++;
    *p = a.ptr;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    const Alloc *a = find_alloc((uintptr_t)p);
    if (!a)
        die("cudaFree: the pointer is not device memory (%p: never allocated, or freed "
            "already)", p);
    if (a->ptr != p)
        die("cudaFree: the pointer is not the start of its device allocation (%p; the "
            "allocation is %zu bytes at %p)", p, a->size, (void *)a->ptr);
    Alloc gone = *a;
    if (gone.open) /* freed during device work */
        opened.erase(std::find(opened.begin(), opened.end(), a));
    stats.frees++;
    allocs.erase((uintptr_t)gone.map);
    EMU_UNPOISON(gone.map, gone.map_size);
    if (munmap(gone.map, gone.map_size) != 0)
        die("munmap: %s", strerror(errno));
    return cudaSuccess;
}

static std::map<uintptr_t, size_t> pinned; /* cudaMallocHost's live buffers */

cudaError_t cudaMallocHost(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    if (!*p)
        return cudaErrorMemoryAllocation;
    pinned[(uintptr_t)*p] = n;
    stats.host_allocs++;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    if (!pinned.erase((uintptr_t)p))
        die("cudaFreeHost: %p is not a live cudaMallocHost buffer", p);
    free(p);
    return cudaSuccess;
}

void emu_check_device(const char *call, const char *what, const void *p, size_t n)
{
    uintptr_t addr = (uintptr_t)p;
    const Alloc *a = find_alloc(addr);
    if (!a)
        die("%s: %s is not device memory (%p)", call, what, p);
    uintptr_t beg = (uintptr_t)a->ptr, end = beg + a->size;
    char where[80];
    if (addr < beg || addr >= end) {
        describe_outside(where, sizeof where, addr, *a);
        die("%s: %s is out of bounds: %p is %s the device allocation of %zu bytes at %p", call,
            what, p, where, a->size, (void *)a->ptr);
    }
    if (n > end - addr)
        die("%s: %s is out of bounds: [%p, +%zu bytes) runs %zu bytes past the end of the "
            "device allocation of %zu bytes at %p",
            call, what, p, n, (size_t)(n - (end - addr)), a->size, (void *)a->ptr);
}

void emu_check_host(const char *call, const char *what, const void *p, size_t n)
{
    if (!p)
        die("%s: %s is NULL", call, what);
    uintptr_t addr = (uintptr_t)p;
    /* the last mapping that starts before the end of [p, p + n) */
    auto it = allocs.lower_bound(addr + (n ? n : 1));
    if (it == allocs.begin())
        return;
    --it;
    const Alloc &a = it->second;
    if (addr < it->first + a.map_size)
        die("%s: %s is device memory, not host memory (%p, in the allocation of %zu bytes at %p)",
            call, what, p, a.size, (void *)a.ptr);
}

/* the allocations of the next launch's pointer arguments (emu_run opens
 * them; more than fit are opened at their first access) */
enum { LAUNCH_ARGS = 32 };
static Alloc *launch_args[LAUNCH_ARGS];
static int n_launch_args;

void emu_check_kernel_pointer(const char *name, int index, const void *p)
{
    uintptr_t addr = (uintptr_t)p;
    Alloc *a = find_alloc(addr);
    if (!a)
        die("%s: argument %d is not device memory (%p)", name, index, p);
    /* one past the end is a valid pointer (an empty range); beyond is not */
    uintptr_t beg = (uintptr_t)a->ptr;
    if (addr < beg || addr > beg + a->size) {
        char where[80];
        describe_outside(where, sizeof where, addr, *a);
        die("%s: argument %d is out of bounds: %p is %s the device allocation of %zu bytes at %p",
            name, index, p, where, a->size, (void *)a->ptr);
    }
    if (n_launch_args < LAUNCH_ARGS)
        launch_args[n_launch_args++] = a;
}

/* whether [p, p + n) lies in one live cudaMallocHost buffer */
static bool is_pinned(const void *p, size_t n)
{
    auto it = pinned.upper_bound((uintptr_t)p);
    if (it == pinned.begin())
        return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

/* A copy counted by direction; `sync`: the call itself waits for the
 * device (cuda_runtime.h, "step counts"), and so does an asynchronous
 * copy into pageable host memory. */
static void count_copy(cudaMemcpyKind kind, const void *dst, size_t n, bool sync)
{
    if (kind == cudaMemcpyHostToDevice)
        stats.h2d++, stats.h2d_bytes += (double)n;
    else if (kind == cudaMemcpyDeviceToHost) {
        stats.d2h++, stats.d2h_bytes += (double)n;
        sync = sync || !is_pinned(dst, n);
    } else if (kind == cudaMemcpyDeviceToDevice)
        stats.d2d++;
    if (sync)
        count_sync();
}

/* ... and by the stream it was issued on (host <-> device only) */
static void count_copy_stream(cudaMemcpyKind kind, cudaStream_t s)
{
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost)
        stats.streams[std::string(kind == cudaMemcpyHostToDevice ? "h2d." : "d2h.") +
                      stream_name(s)]++;
}

static const char *kind_name(cudaMemcpyKind kind)
{
    switch (kind) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    }
    return "an unknown kind";
}

/* dst and src must lie where `kind` says */
static void copy_checked(const char *fn, void *dst, const void *src, size_t n,
                         cudaMemcpyKind kind)
{
    no_capture(fn);
    if (n == 0)
        return;
    char call[80];
    snprintf(call, sizeof call, "%s(%s)", fn, kind_name(kind));
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((unsigned)kind > cudaMemcpyDeviceToDevice)
        die("%s: unsupported copy kind %d", call, (int)kind);
    if (dst_dev)
        emu_check_device(call, "dst", dst, n);
    else
        emu_check_host(call, "dst", dst, n);
    if (src_dev)
        emu_check_device(call, "src", src, n);
    else
        emu_check_host(call, "src", src, n);
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d < s + n && s < d + n) /* undefined for cudaMemcpy as for memcpy */
        die("%s: dst and src overlap (%p and %p, %zu bytes)", call, dst, src, n);
    DeviceWork work;
    work_touch(dst);
    work_touch(src);
    memcpy(dst, src, n);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    copy_checked("cudaMemcpyAsync", dst, src, n, kind);
    count_copy(kind, dst, n, false);
    count_copy_stream(kind, s);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    copy_checked("cudaMemcpy", dst, src, n, kind);
    count_copy(kind, dst, n, true);
    count_copy_stream(kind, 0);
    return cudaSuccess;
}

static void memset_checked(const char *call, void *p, int v, size_t n)
{
    no_capture(call);
    if (n == 0)
        return;
    emu_check_device(call, "dst", p, n);
    stats.memsets++;
    DeviceWork work;
    work_touch(p);
    memset(p, v, n);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
    memset_checked("cudaMemsetAsync", p, v, n);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset_checked("cudaMemset", p, v, n);
    return cudaSuccess;
}

void emu_copy_from_symbol(const char *call, void *dst, const void *sym, size_t sym_size,
                          size_t n, size_t off, cudaMemcpyKind kind)
{
    if (off > sym_size || n > sym_size - off)
        die("%s: bytes [%zu, %zu) are outside the symbol of %zu bytes", call, off, off + n,
            sym_size);
    if (n == 0)
        return;
    if (kind == cudaMemcpyDeviceToHost)
        emu_check_host(call, "dst", dst, n);
    else if (kind == cudaMemcpyDeviceToDevice)
        emu_check_device(call, "dst", dst, n);
    else
        die("%s: kind %s (a copy from a symbol is DeviceToHost or DeviceToDevice)", call,
            kind_name(kind));
    /* the synchronous form (no "Async" in its name) waits */
    count_copy(kind, dst, n, strstr(call, "Async") == nullptr);
    DeviceWork work;
    work_touch(dst);
    memcpy(dst, (const char *)sym + off, n);
}

/* ------------------------------------------------------------ threads */

/* Fibers switch at every barrier: hundreds of thousands of times for one
 * cross-entropy over a 50k vocabulary.  swapcontext saves and restores the
 * signal mask with a system call at each switch, which was half of the
 * emulation's time; on x86-64 the switch is therefore the few instructions
 * below (the callee-saved registers and the stack pointer, nothing else),
 * elsewhere swapcontext.  A fiber is made once and then runs block after
 * block: it never returns from its first function. */
#if defined(__x86_64__)
struct Ctx { void *sp; };
/* emu_ctx_switch(&from->sp, to->sp): push the callee-saved registers, save
 * the stack pointer, load the other one, pop its registers, return there */
extern "C" void emu_ctx_switch(void **save_sp, void *next_sp);
asm(".text\n"
    ".p2align 4\n"
    ".type emu_ctx_switch, @function\n"
    "emu_ctx_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");

static void ctx_switch(Ctx &from, Ctx &to) { emu_ctx_switch(&from.sp, to.sp); }

/* a stack whose first switch "returns" into entry, with the alignment of a
 * function entry (rsp + 8 a multiple of 16), six zero registers above it */
static void ctx_make(Ctx &c, char *stack, size_t size, void (*entry)())
{
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    void **sp = (void **)(top - 16);
    *sp = (void *)entry;
    for (int i = 0; i < 6; i++)
        *--sp = nullptr;
    c.sp = sp;
}
#else
struct Ctx { ucontext_t uc; };
static void ctx_switch(Ctx &from, Ctx &to) { swapcontext(&from.uc, &to.uc); }
static void ctx_make(Ctx &c, char *stack, size_t size, void (*entry)())
{
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

/* AddressSanitizer must be told when the stack changes (its fiber API). */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_START_SWITCH(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define EMU_FINISH_SWITCH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define EMU_START_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define EMU_FINISH_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#endif

/* a fiber stack: 256 KiB above an inaccessible guard page, so that an
 * overflow faults instead of overwriting the next stack */
enum { STACK = 256 * 1024 };
struct Fiber {
    Ctx ctx;
    char *stack;   /* lowest usable byte, above the guard page */
    void *fake;    /* ASan's fake stack while switched away */
    int done;
};
static Fiber fib[1024];
static Ctx sched;
static void *sched_fake;
static const void *sched_bottom; /* the scheduler's stack, for ASan */
static size_t sched_size;
static int cur = -1;
static const std::function<void()> *cur_fn;
/* A shuffle's values, in two buffers used in turn by each thread (its
 * parity): a thread that has read shuffle n's values may write shuffle
 * n + 1's before the others have read shuffle n's, but not shuffle n + 2's,
 * whose barrier every thread must pass first.  So a shuffle is one barrier,
 * not two. */
static double shfl_buf[2][1024];
static unsigned char shfl_par[1024];
/* A block reduction's result, one per parity, computed by the first thread
 * to read the values of reduction number gen (every thread counts its
 * shuffles and reductions: the same count in every thread of a block). */
static long shfl_gen[1024];
static long slot_gen[2];
static double slot_val[2];

/* from fiber `cur` back to the scheduler; returns when resumed */
static void to_sched()
{
    Fiber &f = fib[cur];
    EMU_START_SWITCH(&f.fake, sched_bottom, sched_size);
    ctx_switch(f.ctx, sched);
    EMU_FINISH_SWITCH(f.fake, &sched_bottom, &sched_size);
}

static void fiber_main()
{
    EMU_FINISH_SWITCH(nullptr, &sched_bottom, &sched_size);
    for (;;) { /* one thread of one block per turn */
        (*cur_fn)();
        fib[cur].done = 1;
        to_sched();
    }
}

static void yield_to_sched()
{
    if (cur < 0) /* the plain loop of run_block */
        die("divergent barrier in block %u: thread %u meets a barrier that thread 0 ended "
            "without", blockIdx.x, threadIdx.x);
    to_sched();
}

void __syncthreads() { yield_to_sched(); }

/* Every thread's value to the block, one barrier: the 32 values of the
 * caller's warp (valid until the caller's next shuffle but one). */
const double *emu_warp_values(double v)
{
    int t = threadIdx.x, p = shfl_par[t];
    if (blockDim.x % 32)
        die("blockDim not a multiple of 32");
    shfl_par[t] ^= 1;
    shfl_gen[t]++;
    shfl_buf[p][t] = v;
    yield_to_sched();
    return &shfl_buf[p][t - t % 32];
}

/* The same for the whole block: all blockDim.x values, and the slot of
 * this reduction's result, *fresh when the caller is the first to read
 * (it then computes the result into the slot; the others read it). */
const double *emu_block_values(double v, double **slot, int *fresh)
{
    int t = threadIdx.x;
    const double *warp = emu_warp_values(v);
    int p = shfl_par[t] ^ 1; /* the parity emu_warp_values used */
    *fresh = slot_gen[p] != shfl_gen[t];
    slot_gen[p] = shfl_gen[t];
    *slot = &slot_val[p];
    return warp - (t - t % 32);
}

double emu_shfl_xor(double v, int o)
{
    return emu_warp_values(v)[(threadIdx.x % 32) ^ o];
}

enum { GATHER_MAX = 64 };
static unsigned char gather_buf[1024][GATHER_MAX];

void emu_warp_gather(const void *mine, void *all, size_t n)
{
    int t = threadIdx.x, first = t - t % 32;
    if (blockDim.x % 32)
        die("blockDim not a multiple of 32");
    if (n > GATHER_MAX)
        die("emu_warp_gather: %zu bytes per lane, at most %d", n, (int)GATHER_MAX);
    memcpy(gather_buf[t], mine, n);
    yield_to_sched();
    for (int l = 0; l < 32; l++)
        memcpy((unsigned char *)all + (size_t)l * n, gather_buf[first + l], n);
    yield_to_sched();
}

static void make_fiber(Fiber &f)
{
    size_t page = page_size();
    void *m = mmap(nullptr, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0)
        die("no memory for a fiber stack: %s", strerror(errno));
    f.stack = (char *)m + page;
    ctx_make(f.ctx, f.stack, STACK, fiber_main);
}

/* run fiber t until its next barrier or the end of its thread */
static void resume(unsigned t)
{
    cur = (int)t;
    threadIdx.x = t;
    EMU_START_SWITCH(&sched_fake, fib[t].stack, STACK);
    ctx_switch(sched, fib[t].ctx);
    EMU_FINISH_SWITCH(sched_fake, nullptr, nullptr);
}

/* One block.  Thread 0 runs first, as a fiber.  If it ends without meeting
 * a barrier, no thread may meet one (that would be a divergent barrier):
 * the others run as a plain loop, the fast path of elementwise kernels.
 * Otherwise every thread becomes a fiber and the block runs in rounds, one
 * barrier interval each, thread 0 having done its first already. */
static void run_block(unsigned block, const std::function<void()> &f)
{
    cur_fn = &f;
    memset(shfl_par, 0, block);
    memset(shfl_gen, 0, block * sizeof shfl_gen[0]);
    slot_gen[0] = slot_gen[1] = -1;
    if (!fib[0].stack)
        make_fiber(fib[0]);
    fib[0].done = 0;
    resume(0);
    cur = -1;
    if (fib[0].done) {
        for (unsigned t = 1; t < block; t++) {
            threadIdx.x = t;
            f();
        }
        return;
    }
    for (unsigned t = 1; t < block; t++) {
        if (!fib[t].stack)
            make_fiber(fib[t]);
        fib[t].done = 0;
    }
    for (unsigned first = 1;; first = 0) {
        int alive = 0, finished_now = 0;
        for (unsigned t = 0; t < block; t++) {
            if (fib[t].done)
                continue;
            if (t >= first)
                resume(t);
            if (fib[t].done)
                finished_now++;
            else
                alive++;
        }
        cur = -1;
        if (!alive)
            break;
        if (finished_now) /* some threads left while others wait at a barrier */
            die("divergent barrier in block %u", blockIdx.x);
    }
}

/* the blocks of a launch, with the allocations of its pointer arguments */
static void run_grid(unsigned grid, unsigned block, const std::function<void()> &f,
                     Alloc *const *args, int n_args)
{
    gridDim.x = grid;
    blockDim.x = block;
    DeviceWork work;
    for (int i = 0; i < n_args; i++)
        open_alloc(*args[i]);
    for (unsigned b = 0; b < grid; b++) {
        blockIdx.x = b;
        run_block(block, f);
    }
}

void emu_run(unsigned grid, unsigned block, size_t shmem, const std::function<void()> &f,
             const char *name)
{
    if (block == 0 || block > 1024 || grid == 0 || shmem)
        die("%s: bad launch <<<%u, %u, %zu>>>", name, grid, block, shmem);
    std::vector<Alloc *> args(launch_args, launch_args + n_launch_args);
    n_launch_args = 0;
    if (emu_capture([=] { run_grid(grid, block, f, args.data(), (int)args.size()); }))
        return;
    count_launch(name, (unsigned long long)grid * block);
    run_grid(grid, block, f, args.data(), (int)args.size());
}

/* ------------------------------------------------------------- cuBLAS */

struct emu_cublas { int x; };
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new emu_cublas(); return 0; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return 0; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!h)
        return CUBLAS_STATUS_INVALID_VALUE;
    emu_check_device("cublasSetWorkspace", "workspace", ws, bytes);
    return CUBLAS_STATUS_SUCCESS;
}

/* gemms: the products (each problem of a grouped call is one); gemm_calls:
 * the calls that ran them (a grouped call is one, as it is one launch) */
static void count_gemm(int m, int n, int k)
{
    stats.gemms++;
    stats.gemm_flops += 2.0 * m * n * k;
}
/* the same for the emulated cuBLASLt (cublaslt_emu.cpp) */
void emu_count_gemm(int m, int n, int k)
{
    stats.gemm_calls++;
    count_gemm(m, n, k);
}

/* a column-major rows x cols matrix with leading dimension ld, in device
 * memory and within its allocation */
static size_t matrix_elems(int rows, int cols, int ld)
{
    return (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
}

static void check_matrix(const char *what, const float *p, int rows, int cols, int ld,
                         const char *call = "cublasSgemm", size_t elem = sizeof(float))
{
    emu_check_device(call, what, p, matrix_elems(rows, cols, ld) * elem);
}

/* The checks of a GEMM call, column-major as documented (C = alpha op(A)
 * op(B) + beta C, alpha and beta host pointers: CUBLAS_POINTER_MODE_HOST,
 * the default): cuBLAS's own on the sizes, then the emulation's on memory
 * (A and B of `elem` bytes an element, C of c_elem).  *empty: nothing to do. */
static cublasStatus_t check_gemm(const char *call, cublasHandle_t h, bool na, bool nb, int m,
                                 int n, int k, const void *alpha, const void *A, int lda,
                                 const void *B, int ldb, const void *beta, const void *C,
                                 int ldc, size_t elem, size_t c_elem, bool *empty)
{
    if (!h || m < 0 || n < 0 || k < 0 || lda < std::max(1, na ? m : k) ||
        ldb < std::max(1, nb ? k : n) || ldc < std::max(1, m))
        return CUBLAS_STATUS_INVALID_VALUE;
    *empty = m == 0 || n == 0;
    if (*empty)
        return CUBLAS_STATUS_SUCCESS;
    emu_check_host(call, "alpha", alpha, sizeof(float));
    emu_check_host(call, "beta", beta, sizeof(float));
    if (k > 0) {
        check_matrix("A", (const float *)A, na ? m : k, na ? k : m, lda, call, elem);
        check_matrix("B", (const float *)B, nb ? k : n, nb ? n : k, ldb, call, elem);
    }
    check_matrix("C", (const float *)C, m, n, ldc, call, c_elem);
    return CUBLAS_STATUS_SUCCESS;
}

/* x rounded to TF32 (10 mantissa bits, to nearest even), as
 * CUBLAS_COMPUTE_32F_FAST_TF32 lets the tensor cores read fp32 operands
 * (a value with fewer mantissa bits, such as a bf16 one, is unchanged) */
static float tf32_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) /* finite */
        u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&x, &u, sizeof x);
    return x;
}

static std::vector<float> tf32_copy(const float *p, size_t n)
{
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++)
        f[i] = tf32_round(p[i]);
    return f;
}

/* One fp32 product after its checks (the caller counts the call): with
 * tf32, the operands rounded as the tensor cores read them. */
static cublasStatus_t sgemm(const char *call, cublasHandle_t h, cublasOperation_t ta,
                            cublasOperation_t tb, int m, int n, int k, const float *alpha,
                            const float *A, int lda, const float *B, int ldb, const float *beta,
                            float *C, int ldc, bool tf32)
{
    bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N, empty;
    cublasStatus_t st = check_gemm(call, h, na, nb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                                   sizeof(float), sizeof(float), &empty);
    if (st != CUBLAS_STATUS_SUCCESS || empty)
        return st;
    count_gemm(m, n, k);
    DeviceWork work;
    work_touch(A);
    work_touch(B);
    work_touch(C);
    std::vector<float> a, b;
    if (tf32 && k > 0) {
        a = tf32_copy(A, matrix_elems(na ? m : k, na ? k : m, lda));
        b = tf32_copy(B, matrix_elems(nb ? k : n, nb ? n : k, ldb));
        A = a.data();
        B = b.data();
    }
    cblas_sgemm(CblasColMajor, na ? CblasNoTrans : CblasTrans, nb ? CblasNoTrans : CblasTrans,
                m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    if (emu_capture([=, a = *alpha, b = *beta] {
            sgemm("cublasSgemm", h, ta, tb, m, n, k, &a, A, lda, B, ldb, &b, C, ldc, false);
        }))
        return CUBLAS_STATUS_SUCCESS;
    stats.gemm_calls++;
    return sgemm("cublasSgemm", h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, false);
}

/* The grouped GEMMs (cuBLAS 12.5): the documented loop over the groups
 * and their problems, fp32 only.  The per-group arrays (transposes,
 * sizes, leading dimensions, alpha, beta, group sizes) are host memory,
 * the matrices' pointer arrays device memory, as the documentation's
 * table has them; the argument checks of cublasSgemm per problem, all
 * before any product.  TRIDENT_EMU_NO_GROUPED=1 (tests) makes them answer
 * CUBLAS_STATUS_NOT_SUPPORTED, as a library without them for a type does,
 * to test the callers' fallback. */
static cublasStatus_t grouped(const char *call, cublasHandle_t h,
                              const cublasOperation_t transa[], const cublasOperation_t transb[],
                              const int m[], const int n[], const int k[], const float alpha[],
                              const float *const A[], const int lda[], const float *const B[],
                              const int ldb[], const float beta[], float *const C[],
                              const int ldc[], int group_count, const int group_size[], bool tf32)
{
    const char *off = getenv("TRIDENT_EMU_NO_GROUPED");
    if (off && strcmp(off, "1") == 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!h || group_count < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (group_count == 0)
        return CUBLAS_STATUS_SUCCESS;
    const size_t G = (size_t)group_count;
    emu_check_host(call, "transa_array", transa, G * sizeof *transa);
    emu_check_host(call, "transb_array", transb, G * sizeof *transb);
    emu_check_host(call, "m_array", m, G * sizeof *m);
    emu_check_host(call, "n_array", n, G * sizeof *n);
    emu_check_host(call, "k_array", k, G * sizeof *k);
    emu_check_host(call, "alpha_array", alpha, G * sizeof *alpha);
    emu_check_host(call, "lda_array", lda, G * sizeof *lda);
    emu_check_host(call, "ldb_array", ldb, G * sizeof *ldb);
    emu_check_host(call, "beta_array", beta, G * sizeof *beta);
    emu_check_host(call, "ldc_array", ldc, G * sizeof *ldc);
    emu_check_host(call, "group_size", group_size, G * sizeof *group_size);
    size_t problems = 0;
    for (size_t i = 0; i < G; i++) {
        if (group_size[i] < 0)
            return CUBLAS_STATUS_INVALID_VALUE;
        problems += (size_t)group_size[i];
    }
    if (problems == 0)
        return CUBLAS_STATUS_SUCCESS;
    emu_check_device(call, "Aarray", A, problems * sizeof *A);
    emu_check_device(call, "Barray", B, problems * sizeof *B);
    emu_check_device(call, "Carray", C, problems * sizeof *C);
    /* the pointers, read as the device reads them */
    std::vector<const float *> a(problems), b(problems);
    std::vector<float *> c(problems);
    {
        DeviceWork work;
        work_touch(A);
        work_touch(B);
        work_touch(C);
        std::copy(A, A + problems, a.begin());
        std::copy(B, B + problems, b.begin());
        std::copy(C, C + problems, c.begin());
    }
    /* "the C[idx] matrices must not overlap" (the documentation; on a GPU
     * the problems run at once): a grouped call may not sum into one */
    {
        std::vector<std::pair<uintptr_t, uintptr_t>> span;
        size_t idx = 0;
        for (size_t i = 0; i < G; i++)
            for (int j = 0; j < group_size[i]; j++, idx++)
                if (m[i] > 0 && n[i] > 0)
                    span.push_back({(uintptr_t)c[idx],
                                    (uintptr_t)(c[idx] + matrix_elems(m[i], n[i], ldc[i]))});
        std::sort(span.begin(), span.end());
        for (size_t q = 1; q < span.size(); q++)
            if (span[q].first < span[q - 1].second)
                die("%s: the C matrices of two problems overlap (at %p): undefined behaviour on "
                    "a GPU",
                    call, (void *)span[q].first);
    }
    /* with a FAST compute type, "if (k * AtypeSize) % 16 == 0, ensure
     * intptr_t(ptr) % 16 == 0" (the documentation; a GPU faults) */
    if (tf32) {
        size_t idx = 0;
        for (size_t i = 0; i < G; i++)
            for (int j = 0; j < group_size[i]; j++, idx++) {
                const void *ptr[3] = {a[idx], b[idx], c[idx]};
                for (int q = 0; q < 3; q++)
                    if ((size_t)k[i] * sizeof(float) % 16 == 0 && (uintptr_t)ptr[q] % 16 != 0)
                        die("%s: problem %zu's %c at %p is not 16-byte aligned (k %d)", call, idx,
                            "ABC"[q], ptr[q], k[i]);
            }
    }
    for (int pass = 0; pass < 2; pass++) { /* the checks, then the products */
        size_t idx = 0;
        for (size_t i = 0; i < G; i++)
            for (int j = 0; j < group_size[i]; j++, idx++) {
                bool na = transa[i] == CUBLAS_OP_N, nb = transb[i] == CUBLAS_OP_N, empty;
                if ((!na && transa[i] != CUBLAS_OP_T) || (!nb && transb[i] != CUBLAS_OP_T))
                    return CUBLAS_STATUS_INVALID_VALUE;
                cublasStatus_t st =
                    pass == 0 ? check_gemm(call, h, na, nb, m[i], n[i], k[i], &alpha[i], a[idx],
                                           lda[i], b[idx], ldb[i], &beta[i], c[idx], ldc[i],
                                           sizeof(float), sizeof(float), &empty)
                              : sgemm(call, h, transa[i], transb[i], m[i], n[i], k[i], &alpha[i],
                                      a[idx], lda[i], b[idx], ldb[i], &beta[i], c[idx], ldc[i],
                                      tf32);
                if (st != CUBLAS_STATUS_SUCCESS)
                    return st;
            }
    }
    stats.gemm_calls++;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmGroupedBatched(cublasHandle_t h, const cublasOperation_t transa[],
                                         const cublasOperation_t transb[], const int m[],
                                         const int n[], const int k[], const float alpha[],
                                         const float *const A[], const int lda[],
                                         const float *const B[], const int ldb[],
                                         const float beta[], float *const C[], const int ldc[],
                                         int group_count, const int group_size[])
{
    return grouped("cublasSgemmGroupedBatched", h, transa, transb, m, n, k, alpha, A, lda, B, ldb,
                   beta, C, ldc, group_count, group_size, false);
}

/* fp32 A, B and C (documented with CUBLAS_COMPUTE_32F, _PEDANTIC and
 * _FAST_TF32) are emulated; bf16 A and B with an fp32 C are not among the
 * documented types: CUBLAS_STATUS_NOT_SUPPORTED, as the library answers. */
cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t h, const cublasOperation_t transa[], const cublasOperation_t transb[],
    const int m[], const int n[], const int k[], const void *alpha, const void *const A[],
    cudaDataType Atype, const int lda[], const void *const B[], cudaDataType Btype,
    const int ldb[], const void *beta, void *const C[], cudaDataType Ctype, const int ldc[],
    int group_count, const int group_size[], cublasComputeType_t compute)
{
    const char *call = "cublasGemmGroupedBatchedEx";
    if (Atype == CUDA_R_16BF && Btype == CUDA_R_16BF && Ctype == CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (Atype != CUDA_R_32F || Btype != CUDA_R_32F || Ctype != CUDA_R_32F ||
        (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
         compute != CUBLAS_COMPUTE_32F_FAST_TF32)) {
        fprintf(stderr, "emu: %s: only fp32 A, B and C are emulated\n", call);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return grouped(call, h, transa, transb, m, n, k, (const float *)alpha, (const float *const *)A,
                   lda, (const float *const *)B, ldb, (const float *)beta, (float *const *)C, ldc,
                   group_count, group_size, compute == CUBLAS_COMPUTE_32F_FAST_TF32);
}

/* The bf16 operands widened to fp32 (exact), then cublasSgemm's product. */
static std::vector<float> widen(const void *p, size_t n)
{
    std::vector<float> f(n);
    const __nv_bfloat16 *b = (const __nv_bfloat16 *)p;
    for (size_t i = 0; i < n; i++)
        f[i] = __bfloat162float(b[i]);
    return f;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                            int lda, const void *B, cudaDataType Btype, int ldb,
                            const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    if (emu_capture([=, a = *(const float *)alpha, b = *(const float *)beta] {
            cublasGemmEx(h, ta, tb, m, n, k, &a, A, Atype, lda, B, Btype, ldb, &b, C, Ctype, ldc,
                         compute, algo);
        }))
        return CUBLAS_STATUS_SUCCESS;
    const char *call = "cublasGemmEx";
    if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF ||
        (Ctype != CUDA_R_32F && Ctype != CUDA_R_16BF) || compute != CUBLAS_COMPUTE_32F ||
        algo != CUBLAS_GEMM_DEFAULT) {
        fprintf(stderr,
                "emu: %s: only bf16 A and B, fp32 or bf16 C, and fp32 compute are emulated\n",
                call);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const bool c16 = Ctype == CUDA_R_16BF;
    bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N, empty;
    cublasStatus_t st = check_gemm(call, h, na, nb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                                   sizeof(__nv_bfloat16), c16 ? 2 : 4, &empty);
    if (st != CUBLAS_STATUS_SUCCESS || empty)
        return st;
    const int ar = na ? m : k, ac = na ? k : m, br = nb ? k : n, bc = nb ? n : k;
    stats.gemm_calls++;
    count_gemm(m, n, k);
    DeviceWork work;
    work_touch(A);
    work_touch(B);
    work_touch(C);
    std::vector<float> a = k > 0 ? widen(A, matrix_elems(ar, ac, lda)) : std::vector<float>(1);
    std::vector<float> b = k > 0 ? widen(B, matrix_elems(br, bc, ldb)) : std::vector<float>(1);
    /* a bf16 C: the fp32 result (C widened when beta reads it) rounded to
     * nearest even as it is stored */
    const size_t nc = matrix_elems(m, n, ldc);
    std::vector<float> c = c16 ? (*(const float *)beta != 0 ? widen(C, nc) : std::vector<float>(nc))
                               : std::vector<float>();
    float *cf = c16 ? c.data() : (float *)C;
    cblas_sgemm(CblasColMajor, na ? CblasNoTrans : CblasTrans, nb ? CblasNoTrans : CblasTrans,
                m, n, k, *(const float *)alpha, a.data(), lda, b.data(), ldb,
                *(const float *)beta, cf, ldc);
    if (c16)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++)
                ((__nv_bfloat16 *)C)[(size_t)j * ldc + i] = __float2bfloat16(cf[(size_t)j * ldc + i]);
    return CUBLAS_STATUS_SUCCESS;
}
