/* cpu_f64.c — the ops of cpu_ops.inc compiled once more in double
 * precision, for the tests (see cpu_f64.h). */
#include "backend/cpu_f64.h"

#include <cblas.h>

#include "backend/backend.h" /* bf16_round, used by adamw */

typedef double real;
#define NAME(x) cpu_##x##_f64
#define OPS_API
#define RM(fn) fn
#define GEMM   cblas_dgemm
#include "backend/cpu_ops.inc"
