/* ops.cuh — the CUDA ops, one file per concern, gathered into the Backend
 * table by backend.cu.  Arguments and semantics are those of the Backend
 * member of the same name (src/backend/backend.h); every pointer is a
 * device pointer; each call only enqueues work on cuda_stream(). */
#ifndef TRD_KERNELS_OPS_CUH
#define TRD_KERNELS_OPS_CUH

#include "common.cuh"

/* matmul.cu (cuBLAS, strict fp32) */
void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC);
void cuda_matmul_forward_acc(float *out, const float *inp, const float *weight, int N, int C,
                             int OC);
void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC,
                          GradMode dinp_mode);
/* matmul.cu, bf16 operands on tensor cores (backend_cuda_bf16) */
void cuda_matmul_forward_bf16(float *out, const float *inp, const float *weight, const float *bias,
                              int N, int C, int OC);
void cuda_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int N, int C, int OC,
                               GradMode dinp_mode);
/* matmul.cu, grouped linears (one grouped GEMM per product; fp32, and
 * bf16 operands as backend_cuda_bf16's) */
void cuda_matmul_grouped_forward(float *out, const float *inp, const float *const *w,
                                 const float *const *b, const int *off, int G, int C, int OC);
void cuda_matmul_grouped_backward(float *dinp, float *const *dw, float *const *db,
                                  const float *dout, const float *inp, const float *const *w,
                                  const int *off, int G, int C, int OC);
void cuda_matmul_grouped_forward_bf16(float *out, const float *inp, const float *const *w,
                                      const float *const *b, const int *off, int G, int C, int OC);
void cuda_matmul_grouped_backward_bf16(float *dinp, float *const *dw, float *const *db,
                                       const float *dout, const float *inp, const float *const *w,
                                       const int *off, int G, int C, int OC);
/* matmul.cu, the step's bf16 copy of the weights (backend.h weights_bf16) */
void cuda_weights_bf16(const float *params, size_t n);
void cuda_weights_bf16_drop(void);
/* matmul.cu, bf16 GEMMs whose activation operand is stored in bf16
 * (backend.h's *_x16; backend_cuda_bf16) */
void cuda_matmul_forward_x16(float *out, const uint16_t *inp, const float *weight,
                             const float *bias, int N, int C, int OC);
void cuda_matmul_backward_x16(float *dinp, float *dweight, float *dbias, const float *dout,
                              const uint16_t *inp, const float *weight, int N, int C, int OC,
                              GradMode dinp_mode);
void cuda_matmul_gelu_forward_x16(uint16_t *out, float *pre, const uint16_t *inp,
                                  const float *weight, const float *bias, int N, int C, int OC);
void cuda_matmul_backward_dgelu_x16(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const uint16_t *inp, const float *pre, const float *weight,
                                    int N, int C, int OC);
/* norm.cu, activation.cu: their forwards into bf16 */
void cuda_norm_forward_x16(float *res, uint16_t *out, float *mean, float *rstd, const float *a,
                           const float *b, const float *weight, const float *bias, int N, int C,
                           float eps, int rms);
void cuda_gelu_forward_x16(uint16_t *out, const float *inp, size_t n);
void cuda_swiglu_forward_x16(uint16_t *out, const float *gate, const float *up, size_t n);
void cuda_head_forward_x16(uint16_t *logits, const uint16_t *inp, const float *weight, int N, int C,
                           int OC);
void cuda_crossentropy_x16(float *losses, uint16_t *logits, const int32_t *targets, int grad,
                           float dloss, int N, int V, int Vp);
void cuda_matmul_backward_d16(float *dinp, float *dweight, const uint16_t *dout,
                              const uint16_t *inp, const float *weight, int N, int C, int OC,
                              GradMode dinp_mode);
void cuda_swiglu_backward_x16(uint16_t *dgate, uint16_t *dup, const float *dout, const float *gate,
                              const float *up, size_t n);
/* matmul.cu through cuBLASLt's epilogues (matmul_lt.cu; backend_cuda_bf16) */
void cuda_matmul_gelu_forward_bf16(float *out, float *pre, const float *inp, const float *weight,
                                   const float *bias, int N, int C, int OC);
void cuda_matmul_backward_dgelu_bf16(float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *pre, const float *weight, int N,
                                     int C, int OC);

/* embedding.cu */
void cuda_embedding_forward(float *out, const int32_t *tokens, const int32_t *pos, const float *wte,
                            const float *wpe, int N, int T, int C, int vocab_start, int V);
void cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             const int32_t *pos, int N, int T, int C, int vocab_start, int V);

/* norm.cu */
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps);
void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);
void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                          int C, float eps);
void cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);

void cuda_residual_norm_forward(float *res, float *out, float *mean, float *rstd, const float *a,
                                const float *b, const float *weight, const float *bias, int N,
                                int C, float eps, int rms);

/* activation.cu */
void cuda_gelu_forward(float *out, const float *inp, size_t n);
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, GradMode mode);
/* dx = gelu'(inp) * dx in place (matmul.cu's fallback for the DGELU epilogue) */
void cuda_gelu_backward_inplace(float *dx, const float *inp, size_t n);
void cuda_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, size_t n, GradMode mode);

/* moe.cu */
void cuda_moe_router_forward(float *probs, float *lse, int32_t *idx, float *w, const float *logits,
                             int N, int E, int k);
void cuda_moe_router_backward(float *dlogits, const float *dw, const float *probs, const float *lse,
                              const int32_t *idx, const float *w, const float *aux_dp,
                              float z_scale, int N, int E, int k);
void cuda_moe_gather(float *out, const float *inp, const int32_t *slot, int R, int C, int k);
void cuda_moe_scatter_add(float *dinp, const float *dout, const int32_t *slot, int R, int C, int k);
void cuda_moe_combine_forward(float *out, const float *y, const float *w, const int32_t *slot,
                              int R, int C, int k);
void cuda_moe_combine_backward(float *dy, float *dw, const float *dout, const float *y,
                               const float *w, const int32_t *slot, int R, int C, int k);

/* rope.cu */
void cuda_rope_forward(float *qkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                       int hs, RopeFreq rf);
void cuda_rope_backward(float *dqkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                        int hs, RopeFreq rf);
void cuda_rope_decode(float *qkv, int n, int pos0, int H, int KVH, int hs, RopeFreq rf);

/* decode.cu */
void cuda_attention_decode(float *out, const float *qkv, float *kcache, float *vcache, int n,
                           const int32_t *at, int pos0, int H, int KVH, int hs);
void cuda_decode_choose(int32_t *state, const float *logits, int V, double temperature,
                        const double *u, int n);
void cuda_decode_linear(float *out, const float *x, const DecodeNorm *norm, const float *w,
                        const float *up, const float *b, int n, int C, int OC, DecodeEpi epi);

/* attention.cu */
void cuda_attention_forward(float *out, float *lse, const float *q, const float *kv,
                            const AttnArgs *a);
void cuda_attention_backward(float *dq, float *dkv, const float *dout, const float *q,
                             const float *kv, const float *out, const float *lse,
                             const AttnArgs *a);
/* attention_tc.cu, bf16 on tensor cores (backend_cuda_bf16): head sizes 64
 * and 128 (cuda_attention_tc_serves); any other call goes to the fp32
 * kernels above. */
int cuda_attention_tc_serves(const AttnArgs *a);
void cuda_attention_forward_bf16(float *out, float *lse, const float *q, const float *kv,
                                 const AttnArgs *a);
void cuda_attention_backward_bf16(float *dq, float *dkv, const float *dout, const float *q,
                                  const float *kv, const float *out, const float *lse,
                                  const AttnArgs *a);
/* attention_cudnn.cu: cuDNN's fused attention for the calls of the two
 * above that it serves (1: done), loaded at run time, self-checked against
 * them on each shape's first call; 0: the caller's kernels take the call.
 * cuda_attention_cudnn_on: 1 once cuDNN's result served a call and it is
 * still on. */
int cuda_attention_cudnn_forward(float *out, float *lse, const float *q, const float *kv,
                                 const AttnArgs *a);
int cuda_attention_cudnn_backward(float *dq, float *dkv, const float *dout, const float *q,
                                  const float *kv, const float *out, const float *lse,
                                  const AttnArgs *a);
int cuda_attention_cudnn_on(void);

/* crossentropy.cu */
void cuda_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int N,
                               int V, int Vp);
void cuda_crossentropy_backward(float *logits, const int32_t *targets, float dloss, int N, int V,
                                int Vp);
void cuda_crossentropy_fused(float *losses, float *logits, const int32_t *targets, float dloss,
                             int N, int V, int Vp);
/* A target >= V ends the run (the CPU backend checks before computing;
 * the GPU can only flag it).  fetch enqueues the copy of the flag into
 * page-locked memory, without waiting; report, called once the host has
 * waited for the device after a fetch, ends the run when a kernel before
 * the fetch met such a target.  So the check costs no wait of its own. */
void cuda_crossentropy_fetch_targets(void);
void cuda_crossentropy_report_targets(void);
void cuda_vocab_max(float *stats, const float *logits, int N, int V, int Vp);
void cuda_vocab_sumexp(float *stats, const float *logits, const int32_t *targets, int N, int V,
                       int Vp, int vocab_start);
void cuda_vocab_loss(float *losses, const float *stats, const int32_t *targets, int N);
void cuda_vocab_backward(float *logits, const float *stats, const int32_t *targets, float dloss,
                         int N, int V, int Vp, int vocab_start);

/* vector.cu */
void cuda_add_bias(float *y, const float *bias, int rows, int C);
void cuda_add(float *out, const float *a, const float *b, size_t n);
void cuda_accumulate(float *y, const float *x, size_t n);
double cuda_sumsq(const float *x, size_t n);
double cuda_sumsq_ranges(const float *x, const BackendRange *ranges, int n);
void cuda_grad_check(BackendStepState *st, const float *g, const BackendRange *ranges, int n,
                     float clip);
void cuda_loss_add(BackendStepState *st, const float *losses, const int32_t *targets, int N,
                   float share);
void cuda_scale(float *x, float s, size_t n);
void cuda_widen_bf16(float *dst, const uint16_t *src, size_t n);
void cuda_dropout_philox(float *x, const uint64_t *rows, int N, int n, int col0, uint64_t key,
                         float p);

/* profile.cu: a step's end for TRIDENT_PROFILE (nothing when it is off) */
void cuda_profile_step(int step, double wall_ms);

/* A part of the op being called, timed under TRIDENT_PROFILE as a row of
 * its own under the op's ("op/part", profile.cu), with its nominal bytes
 * and FLOPs; without it, a test of a static pointer.  Not inside a CUDA
 * graph's capture (the profiled table has no graph ops). */
int cuda_profile_part_begin(void);
void cuda_profile_part_end(int k, const char *part, double bytes, double flops);
#define PROFILE_PART(part, bytes, flops, ...) /* ...: the statements (commas and all) */           \
    do {                                                                                           \
        const int part_k_ = cuda_profile_part_begin();                                             \
        __VA_ARGS__;                                                                               \
        cuda_profile_part_end(part_k_, part, bytes, flops);                                        \
    } while (0)

/* adamw.cu */
void cuda_adamw_ranges(float *param, float *master, const float *grad, float *m, float *v,
                       const BackendRange *ranges, int n, float lr, float beta1, float beta2,
                       float eps, float weight_decay, float grad_scale, int t, int round_bf16,
                       const BackendStepState *state);
void cuda_adamw(float *param, float *master, const float *grad, float *m, float *v, size_t n,
                float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                int t, int round_bf16);

#endif
