/* cuda.h — the CUDA backend (kernels/), callable from C.
 *
 * backend_cuda() returns the same table of ops as backend_cpu(), with the
 * same semantics (backend.h), but every pointer it is given is a DEVICE
 * pointer.  The ops run in order on one stream owned by the backend and
 * return before the GPU has finished; only sumsq (which returns a value)
 * and the copy-to-host / synchronize helpers below wait for it.
 *
 * Built only with -Dcuda=enabled, which also defines TRD_HAVE_CUDA for C
 * code; see docs/cuda.md. */
#ifndef TRD_BACKEND_CUDA_H
#define TRD_BACKEND_CUDA_H

#include <stddef.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA ops table (matmuls through cuBLAS in strict fp32). */
const Backend *backend_cuda(void);
/* The same with bf16 GEMMs on tensor cores (the semantics of
 * backend_cpu_bf16 in backend.h) and, for head sizes 64 and 128, bf16
 * flash attention on tensor cores (kernels/attention_tc.cu: bf16 operands,
 * fp32 accumulation; its rounding and tolerance in docs/cuda.md). */
const Backend *backend_cuda_bf16(void);

/* cuDNN's fused attention in backend_cuda_bf16 (kernels/attention_cudnn.cu,
 * docs/cuda.md "cuDNN attention"): 1 while cuDNN is loaded and serving
 * attention, 0 when it is absent, turned off (TRIDENT_CUDNN=0) or refused
 * a graph or a self-check (stderr said why).  load: load it now if no
 * attention call has yet. */
int backend_cuda_cudnn_attention(int load);

/* D = A B + C through one warp's tensor-core instruction (kernels/mma.cuh,
 * mma.sync m16n8k16 with bf16 operands, fp32 accumulation): A 16 x 16 and
 * B 16 x 8 (element (k, n) at b[8k + n]) rounded to bf16, C and D 16 x 8,
 * all row-major device arrays; ldmatrix_b: B's fragment loaded by
 * ldmatrix.x2.trans from shared memory rather than element by element.
 * For the test of the fragment layout. */
void backend_cuda_mma_check(float *d, const float *a, const float *b, const float *c,
                            int ldmatrix_b);

/* Number of usable CUDA devices; 0 when there is no GPU or no driver
 * (never aborts, so a caller can fall back or skip). */
int backend_cuda_devices(void);
/* Select the device of this process (e.g. the node-local rank). */
void backend_cuda_set_device(int device);
/* The device's name ("NVIDIA H100 80GB HBM3") into buf. */
void backend_cuda_device_name(int device, char *buf, size_t size);
/* The device's total memory in bytes (the emulation: the host's RAM). */
size_t backend_cuda_device_memory(int device);

/* Device memory; `what` names the buffer in the out-of-memory message.
 * backend_cuda_calloc returns zeroed memory. */
void *backend_cuda_malloc(size_t bytes, const char *what);
void *backend_cuda_calloc(size_t bytes, const char *what);
void backend_cuda_free(void *dev);
/* Bytes of device memory this process holds through backend_cuda_malloc (and
 * the kernels' own stream-ordered workspaces) now,
 * and the most it ever held (cuBLAS's own workspace not included). */
void backend_cuda_memory(size_t *live, size_t *peak);
/* dev[0..bytes) = 0, in order with the ops (asynchronous). */
void backend_cuda_zero(void *dev, size_t bytes);

/* dst = src, both device memory, in order with the ops (asynchronous). */
void backend_cuda_copy(void *dst, const void *src, size_t bytes);

/* Copies between host and device memory, in order with the ops.  Both
 * wait until the copy is done (the host buffer may be reused at once). */
void backend_cuda_to_device(void *dev, const void *host, size_t bytes);
void backend_cuda_to_host(void *host, const void *dev, size_t bytes);

/* Page-locked host memory (cudaMallocHost): the fastest host side of a
 * copy.  The Backend table's host_alloc / host_release. */
void *backend_cuda_host_alloc(size_t bytes, const char *what);
void backend_cuda_host_free(void *host);

/* Wait until every op issued so far has finished; reports a kernel fault
 * or a cross-entropy target outside the vocabulary found since. */
void backend_cuda_synchronize(void);

/* The trainer's step `step` (1-based) ends here, after wall_ms of host
 * time: a mark for the emulation's step counts (TRD_EMU_STATS, docs/cuda.md
 * "Step budget") and for the profile. */
void backend_cuda_step_end(int step, double wall_ms);

/* TRIDENT_PROFILE=1 (docs/cuda.md "Profile"): `base` with every op timed
 * on the device by CUDA events; and, at the end of the run, the table of
 * what the steps after the first spent per op, on stdout and in
 * DIR/profile.tsv (nothing when the profiled table was never made). */
const Backend *backend_cuda_profiled(const Backend *base);
void backend_cuda_profile_report(const char *dir);

#ifdef __cplusplus
}
#endif

#endif
