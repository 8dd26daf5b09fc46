/* The CPU emulation of the CUDA runtime (kernels/emu, -Demulate_cuda=true)
 * is strict about device memory, so that host code of the trainer that
 * touches it, or a host pointer handed to the device side, fails here
 * instead of on the first GPU run.  Memory a kernel reaches through a
 * pointer that is not one of its arguments (inside a struct) is opened at
 * its first access, and closed again after the launch.
 *
 * Each misuse below runs in a forked child, through the C API of
 * src/backend/cuda.h only.  The child must die (abort, or AddressSanitizer's
 * exit in a sanitized build) and print the expected message on stderr; a
 * child that finishes the misuse and exits 0 is a failure.  A fault outside
 * device memory must stay an ordinary crash.  Then correct sequences must
 * run in this process and give the right numbers: malloc, to_device, add,
 * to_host, zero, sumsq, free; and a cross-entropy whose first block meets
 * no barrier while the others do.
 *
 * Built and run only in the emulated build (suite 'emu'). */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda.h"
#include "check.h"

enum { N = 1000 };

static float *dev_floats(size_t n) { return backend_cuda_malloc(n * sizeof(float), "test"); }

/* exactly representable values, so that a + b is exact */
static void fill(float *x, size_t n, float k)
{
    for (size_t i = 0; i < n; i++)
        x[i] = k * (float)(i % 64) - 16.0f;
}

/* -------------------------------------------- misuses: each must die */

/* after device work (the scale kernel) has opened and closed it again */
static void host_reads_device(void)
{
    static float h[N];
    fill(h, N, 0.5f);
    float *d = dev_floats(N);
    backend_cuda_to_device(d, h, sizeof h);
    backend_cuda()->scale(d, 2.0f, N);
    volatile float x = d[N / 2];
    (void)x;
}

static void host_writes_device(void)
{
    float *d = dev_floats(N);
    d[0] = 1.0f;
}

static void host_out_to_kernel(void)
{
    static float out[N];
    float *a = dev_floats(N), *b = dev_floats(N);
    backend_cuda()->add(out, a, b, N);
}

static void host_weight_to_gemm(void)
{
    static float w[16 * 8];
    float *out = dev_floats(4 * 8), *inp = dev_floats(4 * 16);
    backend_cuda()->matmul_forward(out, inp, w, NULL, 4, 16, 8);
}

static void to_device_swapped(void)
{
    static float h[N];
    float *d = dev_floats(N);
    backend_cuda_to_device(h, d, sizeof h);
}

static void to_host_swapped(void)
{
    static float h[N];
    float *d = dev_floats(N);
    backend_cuda_to_host(d, h, sizeof h);
}

static void zero_past_end(void)
{
    float *d = dev_floats(N);
    backend_cuda_zero(d, (N + 1) * sizeof(float));
}

/* a and b fill one page each: the element after their last is in the
 * guard page that follows every allocation */
static void kernel_reads_past_end(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE) / sizeof(float);
    float *a = dev_floats(page), *b = dev_floats(page), *out = dev_floats(2 * page);
    backend_cuda()->add(out, a, b, 2 * page);
}

static void free_host_pointer(void)
{
    static float h[N];
    backend_cuda_free(h);
}

static void free_twice(void)
{
    float *d = dev_floats(N);
    backend_cuda_free(d);
    backend_cuda_free(d);
}

/* a fault outside device memory (a page of our own, inaccessible), after
 * the emulation's SIGSEGV handler is installed by the first cudaMalloc: it
 * must stay an ordinary crash */
static void fault_after_malloc(void)
{
    (void)dev_floats(N);
    volatile float *p = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return;
    float x = *p;
    (void)x;
}

/* An attention whose document positions (AttnArgs.pos, a pointer inside
 * the struct argument, not an argument of the launch) are device memory:
 * the kernel opens that allocation at its first access; when the launch
 * ends it is closed again, so the host's read after it must die. */
static void host_reads_pointer_a_kernel_reached(void)
{
    enum { B = 1, T = 40, H = 2, HS = 8, W = 3 * H * HS }; /* KVH = H */
    static float qkv[B * T * W];
    static int32_t pos[B * T];
    fill(qkv, B * T * W, 1.0f / 64);
    for (int t = 0; t < T; t++)
        pos[t] = t % 13; /* documents of 13 rows */
    float *d_qkv = dev_floats(B * T * W), *d_out = dev_floats(B * T * H * HS);
    float *d_lse = dev_floats(B * H * T);
    int32_t *d_pos = backend_cuda_malloc(sizeof pos, "pos");
    backend_cuda_to_device(d_qkv, qkv, sizeof qkv);
    backend_cuda_to_device(d_pos, pos, sizeof pos);
    AttnArgs a = attn_args(B, T, H, H, HS);
    a.pos = d_pos;
    backend_cuda()->attention_forward(d_out, d_lse, d_qkv, d_qkv, &a);
    fprintf(stderr, "attention with device document positions ran\n");
    volatile int32_t x = d_pos[T / 2];
    (void)x;
}

/* Run fn in a forked child, its stderr into err; returns its wait status. */
static int run_child(void (*fn)(void), char *err, size_t size)
{
    int fd[2];
    if (pipe(fd) != 0) {
        perror("pipe");
        exit(1);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        dup2(fd[1], STDERR_FILENO);
        close(fd[0]);
        fn();
        _exit(0); /* survived the misuse: the emulation missed it */
    }
    close(fd[1]);
    size_t used = 0;
    ssize_t got;
    while ((got = read(fd[0], err + used, size - 1 - used)) > 0)
        used += (size_t)got;
    err[used] = '\0';
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static int died(int status)
{
    return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
}

/* fn must end abnormally with `expect` on its stderr */
static void expect_death(const char *what, void (*fn)(void), const char *expect)
{
    char err[8192];
    int status = run_child(fn, err, sizeof err);
    const char *line = strstr(err, expect);
    CHECK(died(status), "%s: the child exited normally (stderr: %s)", what, err);
    CHECK(line != NULL, "%s: no \"%s\" on stderr: %s", what, expect, err);
    if (died(status) && line)
        printf("%s: died as expected: %.*s\n", what, (int)strcspn(line, "\n"), line);
}

/* ------------------------------------------------ correct use: must work */

static void correct_sequence(void)
{
    static float ha[N], hb[N], hout[N];
    fill(ha, N, 0.5f);
    fill(hb, N, -0.25f);
    float *a = dev_floats(N), *b = dev_floats(N), *out = dev_floats(N);
    backend_cuda_to_device(a, ha, sizeof ha);
    backend_cuda_to_device(b, hb, sizeof hb);
    backend_cuda()->add(out, a, b, N);
    backend_cuda_to_host(hout, out, sizeof hout);
    int wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += hout[i] != ha[i] + hb[i];
    CHECK(wrong == 0, "add: %d of %d elements wrong", wrong, N);
    /* zero, then the sum of squares of a + b over the device copy */
    backend_cuda_zero(out, sizeof hout);
    backend_cuda_to_host(hout, out, sizeof hout);
    wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += hout[i] != 0.0f;
    CHECK(wrong == 0, "zero: %d of %d elements not zero", wrong, N);
    double want = 0;
    for (int i = 0; i < N; i++)
        want += (double)ha[i] * ha[i];
    CHECK(backend_cuda()->sumsq(a, N) == want, "sumsq %.17g, expected %.17g",
          backend_cuda()->sumsq(a, N), want);
    backend_cuda_free(a), backend_cuda_free(b), backend_cuda_free(out);
    printf("correct sequence: malloc, to_device, add, to_host, zero, sumsq, free: ok\n");
}

/* Block 0 of this first cross-entropy launch leaves at once (an ignored
 * target) and meets no barrier; blocks 1 and 2 reduce over their row with
 * barriers.  The emulation must decide per block, not per kernel, whether
 * a block runs as fibers.  Losses against log-sum-exp in double. */
static void barriers_after_a_block_without(void)
{
    enum { R = 3, V = 5, VP = 8 };
    float logits[R * VP], losses[R];
    int32_t targets[R] = {-1, 2, 4};
    for (int i = 0; i < R * VP; i++)
        logits[i] = 0.25f * (float)((i * 7) % 11) - 1.0f;
    float *d_logits = dev_floats(R * VP), *d_losses = dev_floats(R);
    int32_t *d_targets = backend_cuda_malloc(sizeof targets, "targets");
    backend_cuda_to_device(d_logits, logits, sizeof logits);
    backend_cuda_to_device(d_targets, targets, sizeof targets);
    backend_cuda()->crossentropy_forward(d_losses, d_logits, d_targets, R, V, VP);
    backend_cuda_to_host(losses, d_losses, sizeof losses);
    CHECK(losses[0] == 0.0f, "ignored row: loss %g", losses[0]);
    for (int r = 1; r < R; r++) {
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, logits[r * VP + v]);
        for (int v = 0; v < V; v++)
            sum += exp(logits[r * VP + v] - mx);
        double want = log(sum) + mx - logits[r * VP + targets[r]];
        CHECK_CLOSE(losses[r], want, 1e-5, 1e-6, "cross-entropy loss");
    }
    backend_cuda_free(d_logits), backend_cuda_free(d_losses), backend_cuda_free(d_targets);
    printf("cross-entropy with an ignored first row (a block without barriers, then blocks "
           "with): ok\n");
}

/* TRIDENT_CUDNN_LIB naming a missing file (kernels/attention_cudnn.cu): one
 * line on stderr saying why cuDNN is off, however many calls, and
 * trident's own attention serves: the bf16 attention of a shape cuDNN
 * would take (MHA, T 128, hs 64) against the CPU's (tensor-core tolerance:
 * exit 0 when within, 1 when not). */
static void cudnn_missing(void)
{
    enum { T = 128, H = 2, HS = 64, W = 3 * H * HS, O = H * HS };
    setenv("TRIDENT_CUDNN_LIB", "/nonexistent/libcudnn.so.9", 1);
    static float qkv[T * W], out[T * O], lse[H * T], got[T * O];
    for (int i = 0; i < T * W; i++) /* bf16-exact */
        qkv[i] = (float)((i * 37) % 29 - 14) / 16.0f;
    float *d_qkv = dev_floats(T * W), *d_out = dev_floats(T * O), *d_lse = dev_floats(H * T);
    backend_cuda_to_device(d_qkv, qkv, sizeof qkv);
    const AttnArgs a = attn_args(1, T, H, H, HS);
    for (int k = 0; k < 2; k++)
        backend_cuda_bf16()->attention_forward(d_out, d_lse, d_qkv, d_qkv, &a);
    backend_cuda_to_host(got, d_out, sizeof got);
    backend_cpu()->attention_forward(out, lse, qkv, qkv, &a);
    for (int i = 0; i < T * O; i++)
        if (fabsf(got[i] - out[i]) > 1e-2f)
            _exit(1);
    _exit(0);
}

int main(void)
{
#if defined(__SANITIZE_ADDRESS__)
    /* ASan sees the poisoned guard page before the fault does */
    const char *past_end = "AddressSanitizer: use-after-poison";
#else
    const char *past_end = "emu: device code (kernel, cuBLAS or copy) touched";
#endif
    CHECK(backend_cuda_devices() == 1, "emulated devices: %d", backend_cuda_devices());
    expect_death("host read of device memory", host_reads_device,
                 "emu: host code touched device memory at");
    expect_death("host write of device memory", host_writes_device,
                 "emu: host code touched device memory at");
    expect_death("host out given to add", host_out_to_kernel,
                 "emu: add_kernel: argument 0 is not device memory");
    expect_death("host weight given to matmul", host_weight_to_gemm,
                 "emu: cublasSgemm: A is not device memory");
    expect_death("to_device with swapped arguments", to_device_swapped,
                 "emu: cudaMemcpyAsync(HostToDevice): dst is not device memory");
    expect_death("to_host with swapped arguments", to_host_swapped,
                 "emu: cudaMemcpyAsync(DeviceToHost): dst is device memory");
    expect_death("zero past the end", zero_past_end, "emu: cudaMemsetAsync: dst is out of bounds");
    expect_death("kernel reading past the end", kernel_reads_past_end, past_end);
    char cudnn[8192];
    const char *off = "trident: cuDNN attention off (/nonexistent/libcudnn.so.9 not loaded";
    int cudnn_status = run_child(cudnn_missing, cudnn, sizeof cudnn);
    const char *nl = strchr(cudnn, '\n');
    const int cudnn_ok = !died(cudnn_status) && strstr(cudnn, off) == cudnn && nl && nl[1] == '\0';
    CHECK(cudnn_ok, "TRIDENT_CUDNN_LIB missing: status %d, stderr (one line expected): %s",
          cudnn_status, cudnn);
    if (cudnn_ok)
        printf("cuDNN missing: one line, trident's attention served: ok\n");
    char ran[8192];
    int ran_status = run_child(host_reads_pointer_a_kernel_reached, ran, sizeof ran);
    int ran_ok = died(ran_status) &&
                 strstr(ran, "attention with device document positions ran\n") &&
                 strstr(ran, "emu: host code touched device memory at");
    CHECK(ran_ok, "a kernel reading memory named in a struct argument, then the host: %s", ran);
    if (ran_ok)
        printf("kernel reaching memory through a struct argument: ran; the host's read after it "
               "died as expected\n");
    expect_death("free of a host pointer", free_host_pointer,
                 "emu: cudaFree: the pointer is not device memory");
    expect_death("free twice", free_twice, "emu: cudaFree: the pointer is not device memory");

    /* not device memory: the emulation stays silent and the crash is the
     * usual one (SIGSEGV, or AddressSanitizer's report) */
    char err[8192];
    int status = run_child(fault_after_malloc, err, sizeof err);
#if defined(__SANITIZE_ADDRESS__)
    CHECK(died(status) && strstr(err, "AddressSanitizer: SEGV"), "other fault: %s", err);
#else
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "other fault: status %#x", status);
#endif
    CHECK(!strstr(err, "emu:"), "other fault reported as device memory: %s", err);
    printf("fault outside device memory: an ordinary crash, as expected\n");

    correct_sequence();
    barriers_after_a_block_without();
    return check_summary("cuda_emu");
}
