/* cpu.c — the CPU reference backend: the ops of cpu_ops.inc in fp32
 * (OpenBLAS for GEMMs, OpenMP for the rest), gathered in a Backend table. */
#include "backend/backend.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef float real;
#define NAME(x) cpu_##x
#define OPS_API static
#define RM(fn) fn##f
#define GEMM cblas_sgemm
#include "backend/cpu_ops.inc"

/* Round to nearest, ties to even, on the bits: adding 0x7fff plus the lowest
 * kept bit carries into the kept half exactly when the dropped half is
 * above one half, or equal to it with an odd kept half.  Infinities pass
 * through unchanged; NaNs are kept NaN (quiet) rather than truncated,
 * which could turn a NaN whose payload sits in the low half into inf. */
float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        u = (u | 0x00400000u) & 0xffff0000u;
    else
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* FLOPs of the GEMMs the table ran (tests compare the model's FLOP count
 * with the shapes actually multiplied): 2*N*C*OC per product. */
static double gemm_flops;

static void counted_matmul_forward(float *out, const float *inp, const float *weight,
                                   const float *bias, int N, int C, int OC)
{
    gemm_flops += 2.0 * N * C * OC;
    cpu_matmul_forward(out, inp, weight, bias, N, C, OC);
}

static void counted_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, int N, int C, int OC)
{
    gemm_flops += 2.0 * N * C * OC * ((dinp != NULL) + (dweight != NULL));
    cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

double backend_cpu_gemm_flops(void) { return gemm_flops; }
void backend_cpu_gemm_flops_reset(void) { gemm_flops = 0; }

/* Memory of the CPU backend is host memory: the table's memory functions
 * are the C library's. */
static void *cpu_alloc(size_t bytes, const char *what)
{
    return trd_calloc(bytes ? bytes : 1, 1, what);
}

static void cpu_release(void *p) { free(p); }
static void cpu_zero(void *p, size_t bytes) { if (bytes) memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { if (bytes) memcpy(dst, src, bytes); }

static const Backend cpu_backend = {
    .name = "cpu",
    .device = 0,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .to_backend = cpu_copy,
    .to_host = cpu_copy,
    .matmul_forward = counted_matmul_forward,
    .matmul_backward = counted_matmul_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .crossentropy_forward = cpu_crossentropy_forward,
    .crossentropy_backward = cpu_crossentropy_backward,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
    .adamw = cpu_adamw,
};

const Backend *backend_cpu(void) { return &cpu_backend; }
