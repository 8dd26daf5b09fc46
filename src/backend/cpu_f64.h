/* cpu_f64.h — the CPU ops in double precision, for tests only.
 *
 * The same source as the fp32 Backend table (cpu_ops.inc), compiled with
 * real = double.  Finite differences in double are accurate to ~1e-9, so
 * tests check each backward here, then check the fp32 table against these
 * functions on the same inputs.  Arguments and semantics are those of the
 * Backend member of the same name (backend.h); float hyper-parameters
 * (eps, theta, dloss, lr...) stay float so both share one signature. */
#ifndef TRD_BACKEND_CPU_F64_H
#define TRD_BACKEND_CPU_F64_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h" /* AttnArgs */

void cpu_matmul_forward_f64(double *out, const double *inp, const double *weight,
                            const double *bias, int N, int C, int OC);
void cpu_matmul_backward_f64(double *dinp, double *dweight, double *dbias, const double *dout,
                             const double *inp, const double *weight, int N, int C, int OC);
void cpu_embedding_forward_f64(double *out, const int32_t *tokens, const int32_t *pos,
                               const double *wte, const double *wpe, int N, int T, int C,
                               int vocab_start, int V);
void cpu_embedding_backward_f64(double *dwte, double *dwpe, const double *dout,
                                const int32_t *tokens, const int32_t *pos, int N, int T, int C,
                                int vocab_start, int V);
void cpu_layernorm_forward_f64(double *out, double *mean, double *rstd, const double *inp,
                               const double *weight, const double *bias, int N, int C, float eps);
void cpu_layernorm_backward_f64(double *dinp, double *dweight, double *dbias, const double *dout,
                                const double *inp, const double *weight, const double *mean,
                                const double *rstd, int N, int C);
void cpu_rmsnorm_forward_f64(double *out, double *rstd, const double *inp, const double *weight,
                             int N, int C, float eps);
void cpu_rmsnorm_backward_f64(double *dinp, double *dweight, const double *dout, const double *inp,
                              const double *weight, const double *rstd, int N, int C);
void cpu_gelu_forward_f64(double *out, const double *inp, size_t n);
void cpu_gelu_backward_f64(double *dinp, const double *inp, const double *dout, size_t n);
void cpu_gelu_backward_inplace_f64(double *dx, const double *inp, size_t n);
void cpu_swiglu_forward_f64(double *out, const double *gate, const double *up, size_t n);
void cpu_swiglu_backward_f64(double *dgate, double *dup, const double *dout, const double *gate,
                             const double *up, size_t n);
void cpu_rope_forward_f64(double *qkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                          int hs, RopeFreq rf);
void cpu_rope_backward_f64(double *dqkv, const int32_t *pos, int N, int T, int pos0, int H, int KVH,
                           int hs, RopeFreq rf);
void cpu_attention_forward_f64(double *out, double *lse, const double *q, const double *kv,
                               const AttnArgs *a);
void cpu_attention_backward_f64(double *dq, double *dkv, const double *dout, const double *q,
                                const double *kv, const double *out, const double *lse,
                                const AttnArgs *a);
void cpu_crossentropy_forward_f64(double *losses, const double *logits, const int32_t *targets,
                                  int N, int V, int Vp);
void cpu_crossentropy_backward_f64(double *logits, const int32_t *targets, float dloss, int N,
                                   int V, int Vp);
void cpu_add_f64(double *out, const double *a, const double *b, size_t n);
void cpu_accumulate_f64(double *y, const double *x, size_t n);
double cpu_sumsq_f64(const double *x, size_t n);
void cpu_scale_f64(double *x, float s, size_t n);
void cpu_adamw_f64(double *param, double *master, const double *grad, double *m, double *v,
                   size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                   float grad_scale, int t, int round_bf16);

#endif
