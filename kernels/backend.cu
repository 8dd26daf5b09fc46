/* backend.cu — the CUDA Backend table and the C helpers of cuda.h: device
 * selection, device memory, copies, synchronization. */
#include "ops.cuh"

#include <stdio.h>

/* One stream for every op: the legacy default stream.  It orders the ops
 * with each other and with cudaMemset / cudaMemcpy / cudaFree without any
 * event bookkeeping; overlap (a compute and a communication stream) comes
 * with the NCCL step of issue 8, and only this function changes then.
 * While a graph is captured (graph_begin .. graph_end), the ops go to the
 * capture stream instead: the legacy stream cannot be captured. */
static cudaStream_t ops_stream;
cudaStream_t cuda_stream(void) { return ops_stream; }

/* CUDA graphs (backend.h, graph_begin): captured on a stream of their
 * own, launched on the legacy stream (in order with every op there). */
static cudaStream_t capture_stream;

static void backend_cuda_graph_begin(void)
{
    if (!capture_stream)
        CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal));
    ops_stream = capture_stream;
}

static void *backend_cuda_graph_end(void)
{
    ops_stream = 0;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t err = cudaStreamEndCapture(capture_stream, &g);
    if (err == cudaSuccess)
        err = cudaGraphInstantiate(&exec, g, 0);
    if (g)
        CUDA_CHECK(cudaGraphDestroy(g));
    if (err != cudaSuccess) {
        fprintf(stderr,
                "trident: note: CUDA graph capture failed (%s); running the ops one by one\n",
                cudaGetErrorString(err));
        (void)cudaGetLastError(); /* clear it for later calls */
        return NULL;
    }
    return exec;
}

static void backend_cuda_graph_launch(void *g)
{
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)g, cuda_stream()));
}

static void backend_cuda_graph_free(void *g)
{
    if (g)
        CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)g));
}

extern "C" int backend_cuda_devices(void)
{
    int n = 0;
    /* No driver or no GPU is an answer here, not an error. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear it for later calls */
        return 0;
    }
    return n;
}

extern "C" void backend_cuda_set_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

extern "C" void backend_cuda_device_name(int device, char *buf, size_t size)
{
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    snprintf(buf, size, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

extern "C" size_t backend_cuda_device_memory(int device)
{
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    return prop.totalGlobalMem;
}

/* What trident allocated on the device, for the memory report: live
 * allocations with their sizes (a few dozen: every category is one buffer),
 * the bytes they hold, and the most they ever held. */
static struct {
    void **ptr;
    size_t *bytes;
    int n, cap;
    size_t live, peak;
} allocs;

static void track(void *p, size_t bytes)
{
    if (allocs.n == allocs.cap) {
        allocs.cap = allocs.cap ? 2 * allocs.cap : 64;
        allocs.ptr = (void **)realloc(allocs.ptr, (size_t)allocs.cap * sizeof(void *));
        allocs.bytes = (size_t *)realloc(allocs.bytes, (size_t)allocs.cap * sizeof(size_t));
        if (!allocs.ptr || !allocs.bytes)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of host memory tracking device buffers");
    }
    allocs.ptr[allocs.n] = p;
    allocs.bytes[allocs.n++] = bytes;
    allocs.live += bytes;
    if (allocs.live > allocs.peak)
        allocs.peak = allocs.live;
}

static void untrack(void *p)
{
    for (int i = 0; i < allocs.n; i++)
        if (allocs.ptr[i] == p) {
            allocs.live -= allocs.bytes[i];
            allocs.ptr[i] = allocs.ptr[--allocs.n];
            allocs.bytes[i] = allocs.bytes[allocs.n];
            return;
        }
}

extern "C" void backend_cuda_memory(size_t *live, size_t *peak)
{
    *live = allocs.live;
    *peak = allocs.peak;
}

extern "C" void *backend_cuda_malloc(size_t bytes, const char *what)
{
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess)
        trd_fatal(TRD_EXIT_RUNTIME,
                  "reduce model size or batch, use more ranks, or free the GPU (nvidia-smi)",
                  "cudaMalloc of %.1f MiB for %s: %s (trident holds %.1f MiB)", trd_mib(bytes),
                  what, cudaGetErrorString(err), trd_mib(allocs.live));
    track(p, bytes);
    return p;
}

/* Stream-ordered (cudaMallocAsync on the ops' stream): for buffers that
 * grow while NCCL work may be in flight, since cudaFree would wait for the
 * whole device, NCCL streams included.  Tracked like the others. */
void *cuda_malloc_async(size_t bytes, const char *what)
{
    void *p = NULL;
    cudaError_t err = cudaMallocAsync(&p, bytes ? bytes : 1, cuda_stream());
    if (err != cudaSuccess)
        trd_fatal(TRD_EXIT_RUNTIME,
                  "reduce model size or batch, use more ranks, or free the GPU (nvidia-smi)",
                  "cudaMallocAsync of %.1f MiB for %s: %s (trident holds %.1f MiB)", trd_mib(bytes),
                  what, cudaGetErrorString(err), trd_mib(allocs.live));
    track(p, bytes);
    return p;
}

void cuda_free_async(void *dev)
{
    if (!dev)
        return;
    untrack(dev);
    CUDA_CHECK(cudaFreeAsync(dev, cuda_stream()));
}

void *cuda_scratch(int slot, size_t bytes)
{
    static void *buf[CUDA_SCRATCH_SLOTS];
    static size_t cap[CUDA_SCRATCH_SLOTS];
    TRD_ASSERT(slot >= 0 && slot < CUDA_SCRATCH_SLOTS);
    if (bytes > cap[slot]) {
        if (buf[slot])
            CUDA_CHECK(cudaFreeAsync(buf[slot], cuda_stream()));
        CUDA_CHECK(cudaMallocAsync(&buf[slot], bytes, cuda_stream()));
        cap[slot] = bytes;
    }
    return buf[slot];
}

void *cuda_blas_workspace(void)
{
    static void *ws;
    if (!ws)
        CUDA_CHECK(cudaMalloc(&ws, CUDA_BLAS_WORKSPACE));
    return ws;
}

float *cuda_colsum_scratch(int R, int W, int outs)
{
    if (R <= 1)
        return NULL;
    return (float *)cuda_scratch(CUDA_SCRATCH_COLSUM, (size_t)outs * R * W * sizeof(float));
}

__global__ void colsum_finish_kernel(float *acc0, float *acc1, const float *part, int R, int W)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= W)
        return;
    float *acc[2] = {acc0, acc1};
    for (int k = 0; k < 2; k++) {
        if (!acc[k])
            continue;
        const float *p = part + (size_t)k * R * W + c;
        float s = 0;
        for (int r = 0; r < R; r++)
            s += p[(size_t)r * W];
        acc[k][c] += s;
    }
}

void cuda_colsum_finish(float *acc0, float *acc1, const float *part, int R, int W)
{
    if (R <= 1 || (!acc0 && !acc1))
        return;
    colsum_finish_kernel<<<(W + 255) / 256, 256, 0, cuda_stream()>>>(acc0, acc1, part, R, W);
    CUDA_CHECK_LAUNCH();
}

const CudaRange *cuda_ranges_upload(CudaRanges *c, const BackendRange *r, int n, size_t *total)
{
    if (n > c->cap) {
        /* a few KiB, stream-ordered, and like cuBLAS's workspace outside
         * the memory report (which counts the model's categories) */
        if (c->dev)
            CUDA_CHECK(cudaFreeAsync(c->dev, cuda_stream()));
        free(c->host);
        c->cap = n;
        c->dev = NULL;
        CUDA_CHECK(cudaMallocAsync((void **)&c->dev, (size_t)n * sizeof(CudaRange), cuda_stream()));
        c->host = (CudaRange *)malloc((size_t)n * sizeof(CudaRange));
        if (!c->host)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of host memory for a range table");
        c->n = -1; /* nothing uploaded yet */
    }
    size_t v = 0;
    int changed = n != c->n;
    for (int k = 0; k < n; k++) {
        CudaRange e = {r[k].lo, r[k].hi, v, r[k].decay};
        const CudaRange *o = &c->host[k];
        changed = changed || o->lo != e.lo || o->hi != e.hi || o->vstart != e.vstart ||
                  o->decay != e.decay;
        c->host[k] = e;
        v += r[k].hi - r[k].lo;
    }
    *total = v;
    if (changed && n > 0) /* from pageable memory: staged by the driver, no wait */
        CUDA_CHECK(cudaMemcpyAsync(c->dev, c->host, (size_t)n * sizeof(CudaRange),
                                   cudaMemcpyHostToDevice, cuda_stream()));
    c->n = n;
    return c->dev;
}

extern "C" void *backend_cuda_calloc(size_t bytes, const char *what)
{
    void *p = backend_cuda_malloc(bytes, what);
    backend_cuda_zero(p, bytes);
    return p;
}

extern "C" void backend_cuda_free(void *dev)
{
    if (!dev)
        return;
    untrack(dev);
    CUDA_CHECK(cudaFree(dev));
}

extern "C" void backend_cuda_zero(void *dev, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemsetAsync(dev, 0, bytes, cuda_stream()));
}

extern "C" void backend_cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
}

/* Page-locked buffers: the live ones of backend_cuda_host_alloc (the
 * kernels' own result buffers among them).  A copy between the device and one of them is
 * asynchronous, so the host must wait before it reuses or reads it; a copy
 * from pageable memory is staged by the driver before cudaMemcpyAsync
 * returns, and one into pageable memory returns only once it is done. */
static struct {
    const char **ptr;
    size_t *bytes;
    int n, cap;
} pinned;

static void pinned_add(const void *p, size_t bytes)
{
    if (pinned.n == pinned.cap) {
        pinned.cap = pinned.cap ? 2 * pinned.cap : 16;
        pinned.ptr = (const char **)realloc(pinned.ptr, (size_t)pinned.cap * sizeof(char *));
        pinned.bytes = (size_t *)realloc(pinned.bytes, (size_t)pinned.cap * sizeof(size_t));
        if (!pinned.ptr || !pinned.bytes)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of host memory tracking pinned buffers");
    }
    pinned.ptr[pinned.n] = (const char *)p;
    pinned.bytes[pinned.n++] = bytes;
}

static void pinned_remove(const void *p)
{
    for (int i = 0; i < pinned.n; i++)
        if (pinned.ptr[i] == p) {
            pinned.ptr[i] = pinned.ptr[--pinned.n];
            pinned.bytes[i] = pinned.bytes[pinned.n];
            return;
        }
}

static int is_pinned(const void *p)
{
    const char *c = (const char *)p;
    for (int i = 0; i < pinned.n; i++)
        if (c >= pinned.ptr[i] && c < pinned.ptr[i] + pinned.bytes[i])
            return 1;
    return 0;
}

extern "C" void backend_cuda_to_device(void *dev, const void *host, size_t bytes)
{
    if (!bytes)
        return;
    CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, cuda_stream()));
    if (is_pinned(host)) /* the caller may overwrite it on return */
        CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

/* The copy stream (backend.h) and the event that orders its copies after
 * the compute stream's work (made on first use: copy_made, not a null
 * test: the emulation's waits must be counted from the first). */
static cudaStream_t copy_stream;
static cudaEvent_t copy_after;
static int copy_made;

static void copy_stream_make(void)
{
    if (copy_made)
        return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
#ifdef TRD_CUDA_EMULATED
    emu_stream_name(copy_stream, "copy");
#endif
    CUDA_CHECK(cudaEventCreateWithFlags(&copy_after, cudaEventDisableTiming));
    copy_made = 1;
}

/* The copy stream waits for `after`, or for the compute stream's work so far. */
static void copy_stream_after(const void *after)
{
    copy_stream_make();
    if (!after) {
        CUDA_CHECK(cudaEventRecord(copy_after, cuda_stream()));
        after = copy_after;
    }
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream, (cudaEvent_t)after, 0));
}

static void *backend_cuda_event_create(void)
{
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

static void backend_cuda_event_destroy(void *e)
{
    if (e)
        CUDA_CHECK(cudaEventDestroy((cudaEvent_t)e));
}

static void backend_cuda_wait_event(const void *e)
{
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), (cudaEvent_t)e, 0));
}

static void backend_cuda_to_host_async(void *host, const void *dev, size_t bytes, const void *after)
{
    if (!bytes)
        return;
    copy_stream_after(after);
    CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, copy_stream));
}

/* An empty copy still records `done`: the caller's wait on it must hold. */
static void backend_cuda_to_device_copy(void *dev, const void *host, size_t bytes, void *done)
{
    copy_stream_after(NULL);
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, copy_stream));
    if (done)
        CUDA_CHECK(cudaEventRecord((cudaEvent_t)done, copy_stream));
}

static void backend_cuda_host_copies_wait(void)
{
    if (copy_made)
        CUDA_CHECK(cudaStreamSynchronize(copy_stream));
}

/* Wait for the device once, with the cross-entropy flag fetched before the
 * wait (crossentropy.cu) and checked after it: results read on the host
 * must not come from an invalid target. */
extern "C" void backend_cuda_to_host(void *host, const void *dev, size_t bytes)
{
    cuda_crossentropy_fetch_targets();
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
    if (!bytes || is_pinned(host)) /* else the copy itself waited */
        CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    cuda_crossentropy_report_targets();
}

extern "C" void *backend_cuda_host_alloc(size_t bytes, const char *what)
{
    void *p = NULL;
    cudaError_t err = cudaMallocHost(&p, bytes ? bytes : 1);
    if (err != cudaSuccess)
        trd_fatal(TRD_EXIT_RUNTIME, "page-locked host memory is limited (ulimit -l, RAM)",
                  "cudaMallocHost of %.1f MiB for %s: %s", trd_mib(bytes), what,
                  cudaGetErrorString(err));
    pinned_add(p, bytes ? bytes : 1);
    return p;
}

extern "C" void backend_cuda_host_free(void *host)
{
    if (!host)
        return;
    pinned_remove(host);
    CUDA_CHECK(cudaFreeHost(host));
}

extern "C" void backend_cuda_synchronize(void)
{
    cuda_crossentropy_fetch_targets();
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    cuda_crossentropy_report_targets();
}

extern "C" void backend_cuda_step_end(int step, double wall_ms)
{
    cuda_profile_step(step, wall_ms);
#ifdef TRD_CUDA_EMULATED
    emu_stats_step(step);
#endif
}

static const Backend cuda_backend = {
    .name = "cuda",
    .device = 1,
    .alloc = backend_cuda_calloc,
    .release = backend_cuda_free,
    .zero = backend_cuda_zero,
    .copy = backend_cuda_copy,
    .to_backend = backend_cuda_to_device,
    .to_host = backend_cuda_to_host,
    .event_create = backend_cuda_event_create,
    .event_destroy = backend_cuda_event_destroy,
    .to_host_async = backend_cuda_to_host_async,
    .to_backend_copy = backend_cuda_to_device_copy,
    .wait_event = backend_cuda_wait_event,
    .host_copies_wait = backend_cuda_host_copies_wait,
    .host_alloc = backend_cuda_host_alloc,
    .host_release = backend_cuda_host_free,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .matmul_grouped_forward = cuda_matmul_grouped_forward,
    .matmul_grouped_backward = cuda_matmul_grouped_backward,
    /* fp32 stays on cuBLAS pedantic and the separate GELU kernels: the
     * model calls the unfused ops (backend_cuda_bf16 fills these) */
    .matmul_gelu_forward = NULL,
    .matmul_backward_dgelu = NULL,
    /* fp32: activations stay fp32 (backend_cuda_bf16 fills these) */
    .matmul_forward_x16 = NULL,
    .matmul_backward_x16 = NULL,
    .matmul_gelu_forward_x16 = NULL,
    .matmul_backward_dgelu_x16 = NULL,
    .swiglu_forward_x16 = NULL,
    .norm_forward_x16 = NULL,
    .head_forward_x16 = NULL,
    .crossentropy_x16 = NULL,
    .matmul_backward_d16 = NULL,
    .swiglu_backward_x16 = NULL,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .residual_norm_forward = cuda_residual_norm_forward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .moe_router_forward = cuda_moe_router_forward,
    .moe_router_backward = cuda_moe_router_backward,
    .moe_gather = cuda_moe_gather,
    .moe_scatter_add = cuda_moe_scatter_add,
    .moe_combine_forward = cuda_moe_combine_forward,
    .moe_combine_backward = cuda_moe_combine_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .rope_decode = cuda_rope_decode,
    .attention_decode = cuda_attention_decode,
    .decode_choose = cuda_decode_choose,
    .decode_linear = cuda_decode_linear,
    .graph_begin = backend_cuda_graph_begin,
    .graph_end = backend_cuda_graph_end,
    .graph_launch = backend_cuda_graph_launch,
    .graph_free = backend_cuda_graph_free,
    .crossentropy_forward = cuda_crossentropy_forward,
    .crossentropy_backward = cuda_crossentropy_backward,
    .crossentropy_fused = cuda_crossentropy_fused,
    .loss_add = cuda_loss_add,
    .vocab_max = cuda_vocab_max,
    .vocab_sumexp = cuda_vocab_sumexp,
    .vocab_loss = cuda_vocab_loss,
    .vocab_backward = cuda_vocab_backward,
    .add_bias = cuda_add_bias,
    .add = cuda_add,
    .accumulate = cuda_accumulate,
    .sumsq = cuda_sumsq,
    .sumsq_ranges = cuda_sumsq_ranges,
    .grad_check = cuda_grad_check,
    .scale = cuda_scale,
    .widen_bf16 = cuda_widen_bf16,
    .dropout_philox = cuda_dropout_philox,
    .adamw = cuda_adamw,
    .adamw_ranges = cuda_adamw_ranges,
    .weights_bf16 = NULL, /* fp32: no conversions (backend_cuda_bf16 fills these) */
    .weights_bf16_drop = NULL,
};

extern "C" const Backend *backend_cuda(void) { return &cuda_backend; }

extern "C" const Backend *backend_cuda_bf16(void)
{
    static Backend t;
    if (!t.name) {
        t = cuda_backend;
        t.matmul_forward = cuda_matmul_forward_bf16;
        t.matmul_backward = cuda_matmul_backward_bf16;
        t.matmul_grouped_forward = cuda_matmul_grouped_forward_bf16;
        t.matmul_grouped_backward = cuda_matmul_grouped_backward_bf16;
        t.matmul_gelu_forward = cuda_matmul_gelu_forward_bf16;
        t.matmul_backward_dgelu = cuda_matmul_backward_dgelu_bf16;
        t.matmul_forward_x16 = cuda_matmul_forward_x16;
        t.matmul_backward_x16 = cuda_matmul_backward_x16;
        t.matmul_gelu_forward_x16 = cuda_matmul_gelu_forward_x16;
        t.matmul_backward_dgelu_x16 = cuda_matmul_backward_dgelu_x16;
        t.swiglu_forward_x16 = cuda_swiglu_forward_x16;
        t.norm_forward_x16 = cuda_norm_forward_x16;
        t.head_forward_x16 = cuda_head_forward_x16;
        t.crossentropy_x16 = cuda_crossentropy_x16;
        t.matmul_backward_d16 = cuda_matmul_backward_d16;
        t.swiglu_backward_x16 = cuda_swiglu_backward_x16;
        t.attention_forward = cuda_attention_forward_bf16;
        t.attention_backward = cuda_attention_backward_bf16;
        t.decode_linear = NULL; /* the decoder's matmul_forward: bf16 GEMMs */
        t.weights_bf16 = cuda_weights_bf16;
        t.weights_bf16_drop = cuda_weights_bf16_drop;
    }
    return &t;
}
