/* attention_cudnn.cu — cuDNN's fused flash attention (SDPA) for the bf16
 * training path (backend_cuda_bf16), forward and backward, NOT YET RUN ON
 * A GPU (docs/cuda.md "cuDNN attention").  Everything here is optional and
 * guarded: cuDNN is loaded at run time (dlopen; no link dependency, no
 * cuDNN header: the few enum values of its C backend API below are those
 * of cudnn_graph.h, an ABI stable across cuDNN 9), and when anything is
 * missing or fails, trident's own kernels (attention_tc.cu) serve the call
 * and stderr says once why.
 *
 * Which calls: causal self-attention of whole sequences (q == kv in the
 * fused qkv layout, no offsets, no packed documents, no merge: the
 * context-parallel block calls and packed documents keep trident's
 * kernels), MHA (H == KVH: GQA's fused rows interleave the query heads of
 * a group, and cuDNN's GQA backward needs the per-head reductions of
 * cudnn-frontend's graph, left for later), head size 64 or 128, T a
 * multiple of 128 (cuDNN up to 9.15 needs a padding-mask workaround
 * otherwise).
 *
 * The graph: cuDNN 9's classic fused-attention pattern, the chain of
 * matmul, pointwise and reduction operations that cudnn-frontend's SDPA
 * node emits (its engines match that pattern); cuDNN 9.19's single
 * SDPA_FWD/BWD operations have no causal attribute of their own.  The
 * forward: S = Q K^T (fp32), S *= scale, causal by gen_index rows >= cols
 * and binary_select with -inf, the softmax as max, sub, exp, sum, div,
 * stats = max + log(sum) (= trident's lse: same [B, H, T] layout, natural
 * log), O = P V with P in bf16.  The backward recomputes P = exp(S scale
 * - stats) under the same mask; D = rowsum(dO * O) goes to a buffer of
 * ours (softmax_sum), dQ through an fp32 accumulator of ours (dq_accum,
 * zeroed before cuDNN 9.6), dV = P^T dO, dK = dS^T Q, dS = P (dP - D) scale.
 *
 * Operands: cuDNN reads bf16, trident keeps qkv, out and dout in fp32, so
 * each call converts: q, k, v into three bf16 [B, T, H, hs] arrays (the
 * BSHD layout: strides {T H hs, hs, H hs, 1}), O back to fp32 (out has
 * that layout already), and in the backward out and dout to bf16 and dQ,
 * dK, dV (bf16, BSHD) into dqkv's fp32 rows (set or added, as a.grad
 * says).  GPT-2 124M at B8 T1024 moves about 0.15 GB a layer forward and
 * 0.3 GB backward for these: ~0.15 ms a layer on an H200, which the
 * prediction in docs/cuda.md counts.
 *
 * Safe when wrong: the first call of each shape runs trident's kernel on
 * the same inputs too and compares out, lse (forward) and dq, dk, dv
 * (backward); a difference beyond the bf16 tolerances below turns cuDNN
 * off for the run (stderr says so with the numbers) and trident's result
 * stands.  Plans are built once per shape and kept. */
#include "attention.cuh"

#include <cuda_bf16.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the C backend API of cuDNN 9 (values from cudnn_graph.h) ---- */
typedef void *DnnDesc;
typedef void *DnnHandle;
typedef int DnnStatus;
enum {
    /* cudnnBackendDescriptorType_t */
    D_POINTWISE = 0,
    D_ENGINECFG = 3,
    D_ENGINEHEUR = 4,
    D_PLAN = 5,
    D_OP_POINTWISE = 13,
    D_OPGRAPH = 15,
    D_VARIANT_PACK = 16,
    D_TENSOR = 17,
    D_MATMUL = 18,
    D_OP_MATMUL = 19,
    D_REDUCTION = 21,
    D_OP_REDUCTION = 22,
    D_OP_RESHAPE = 31,
    /* cudnnBackendAttributeType_t */
    T_HANDLE = 0,
    T_DATA_TYPE = 1,
    T_BOOLEAN = 2,
    T_INT64 = 3,
    T_FLOAT = 4,
    T_VOID_PTR = 6,
    T_HEUR_MODE = 8,
    T_POINTWISE_MODE = 14,
    T_DESCRIPTOR = 15,
    T_REDUCTION_OP = 18,
    /* cudnnBackendAttributeName_t */
    A_PW_MODE = 0,
    A_PW_MATH_PREC = 1,
    A_PW_AXIS = 9,
    A_HEUR_MODE = 200,
    A_HEUR_GRAPH = 201,
    A_HEUR_RESULTS = 202,
    A_PLAN_HANDLE = 400,
    A_PLAN_CONFIG = 401,
    A_PLAN_WORKSPACE = 402,
    A_OP_PW_DESC = 750,
    A_OP_PW_X = 751,
    A_OP_PW_B = 752,
    A_OP_PW_Y = 753,
    A_OP_PW_T = 758,
    A_GRAPH_HANDLE = 800,
    A_GRAPH_OPS = 801,
    A_T_ALIGNMENT = 900,
    A_T_DATA_TYPE = 901,
    A_T_DIMS = 902,
    A_T_STRIDES = 903,
    A_T_UID = 906,
    A_T_VIRTUAL = 907,
    A_T_BY_VALUE = 908,
    A_VP_UIDS = 1000,
    A_VP_POINTERS = 1001,
    A_VP_WORKSPACE = 1003,
    A_MATMUL_COMP = 1500,
    A_OP_MM_A = 1520,
    A_OP_MM_B = 1521,
    A_OP_MM_C = 1522,
    A_OP_MM_DESC = 1523,
    A_RED_OP = 1600,
    A_RED_COMP = 1601,
    A_OP_RED_X = 1610,
    A_OP_RED_Y = 1611,
    A_OP_RED_DESC = 1612,
    A_OP_RESHAPE_X = 2200,
    A_OP_RESHAPE_Y = 2201,
    /* cudnnDataType_t */
    DT_FLOAT = 0,
    DT_INT32 = 4,
    DT_BF16 = 9,
    DT_BOOL = 11,
    /* cudnnPointwiseMode_t */
    PW_ADD = 0,
    PW_MUL = 1,
    PW_DIV = 6,
    PW_SUB = 9,
    PW_EXP = 13,
    PW_LOG = 15,
    PW_IDENTITY = 21,
    PW_CMP_GE = 303,
    PW_GEN_INDEX = 501,
    PW_BINARY_SELECT = 601,
    /* cudnnReduceTensorOp_t */
    RED_ADD = 0,
    RED_MAX = 3,
    HEUR_MODE_A = 3
};

/* Where the build sees cuDNN's own header (the CUDA toolkit's include
 * directory: the real builds here), every value above is checked against
 * it, so a mistyped number fails the build instead of a GPU run. */
#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define DNN_SAME(ours, theirs) static_assert((int)(ours) == (int)(theirs), #ours " is " #theirs)
DNN_SAME(D_POINTWISE, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
DNN_SAME(D_ENGINECFG, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
DNN_SAME(D_ENGINEHEUR, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
DNN_SAME(D_PLAN, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
DNN_SAME(D_OP_POINTWISE, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
DNN_SAME(D_OPGRAPH, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
DNN_SAME(D_VARIANT_PACK, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
DNN_SAME(D_TENSOR, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
DNN_SAME(D_MATMUL, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
DNN_SAME(D_OP_MATMUL, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
DNN_SAME(D_REDUCTION, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
DNN_SAME(D_OP_REDUCTION, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
DNN_SAME(D_OP_RESHAPE, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
DNN_SAME(T_HANDLE, CUDNN_TYPE_HANDLE);
DNN_SAME(T_DATA_TYPE, CUDNN_TYPE_DATA_TYPE);
DNN_SAME(T_BOOLEAN, CUDNN_TYPE_BOOLEAN);
DNN_SAME(T_INT64, CUDNN_TYPE_INT64);
DNN_SAME(T_FLOAT, CUDNN_TYPE_FLOAT);
DNN_SAME(T_VOID_PTR, CUDNN_TYPE_VOID_PTR);
DNN_SAME(T_HEUR_MODE, CUDNN_TYPE_HEUR_MODE);
DNN_SAME(T_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE);
DNN_SAME(T_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR);
DNN_SAME(T_REDUCTION_OP, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE);
DNN_SAME(A_PW_MODE, CUDNN_ATTR_POINTWISE_MODE);
DNN_SAME(A_PW_MATH_PREC, CUDNN_ATTR_POINTWISE_MATH_PREC);
DNN_SAME(A_PW_AXIS, CUDNN_ATTR_POINTWISE_AXIS);
DNN_SAME(A_HEUR_MODE, CUDNN_ATTR_ENGINEHEUR_MODE);
DNN_SAME(A_HEUR_GRAPH, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
DNN_SAME(A_HEUR_RESULTS, CUDNN_ATTR_ENGINEHEUR_RESULTS);
DNN_SAME(A_PLAN_HANDLE, CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
DNN_SAME(A_PLAN_CONFIG, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
DNN_SAME(A_PLAN_WORKSPACE, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
DNN_SAME(A_OP_PW_DESC, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
DNN_SAME(A_OP_PW_X, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
DNN_SAME(A_OP_PW_B, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
DNN_SAME(A_OP_PW_Y, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
DNN_SAME(A_OP_PW_T, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
DNN_SAME(A_GRAPH_HANDLE, CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
DNN_SAME(A_GRAPH_OPS, CUDNN_ATTR_OPERATIONGRAPH_OPS);
DNN_SAME(A_T_ALIGNMENT, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
DNN_SAME(A_T_DATA_TYPE, CUDNN_ATTR_TENSOR_DATA_TYPE);
DNN_SAME(A_T_DIMS, CUDNN_ATTR_TENSOR_DIMENSIONS);
DNN_SAME(A_T_STRIDES, CUDNN_ATTR_TENSOR_STRIDES);
DNN_SAME(A_T_UID, CUDNN_ATTR_TENSOR_UNIQUE_ID);
DNN_SAME(A_T_VIRTUAL, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
DNN_SAME(A_T_BY_VALUE, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
DNN_SAME(A_VP_UIDS, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
DNN_SAME(A_VP_POINTERS, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
DNN_SAME(A_VP_WORKSPACE, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
DNN_SAME(A_MATMUL_COMP, CUDNN_ATTR_MATMUL_COMP_TYPE);
DNN_SAME(A_OP_MM_A, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
DNN_SAME(A_OP_MM_B, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
DNN_SAME(A_OP_MM_C, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
DNN_SAME(A_OP_MM_DESC, CUDNN_ATTR_OPERATION_MATMUL_DESC);
DNN_SAME(A_RED_OP, CUDNN_ATTR_REDUCTION_OPERATOR);
DNN_SAME(A_RED_COMP, CUDNN_ATTR_REDUCTION_COMP_TYPE);
DNN_SAME(A_OP_RED_X, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
DNN_SAME(A_OP_RED_Y, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
DNN_SAME(A_OP_RED_DESC, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
DNN_SAME(A_OP_RESHAPE_X, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
DNN_SAME(A_OP_RESHAPE_Y, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
DNN_SAME(DT_FLOAT, CUDNN_DATA_FLOAT);
DNN_SAME(DT_INT32, CUDNN_DATA_INT32);
DNN_SAME(DT_BF16, CUDNN_DATA_BFLOAT16);
DNN_SAME(DT_BOOL, CUDNN_DATA_BOOLEAN);
DNN_SAME(PW_ADD, CUDNN_POINTWISE_ADD);
DNN_SAME(PW_MUL, CUDNN_POINTWISE_MUL);
DNN_SAME(PW_DIV, CUDNN_POINTWISE_DIV);
DNN_SAME(PW_SUB, CUDNN_POINTWISE_SUB);
DNN_SAME(PW_EXP, CUDNN_POINTWISE_EXP);
DNN_SAME(PW_LOG, CUDNN_POINTWISE_LOG);
DNN_SAME(PW_IDENTITY, CUDNN_POINTWISE_IDENTITY);
DNN_SAME(PW_CMP_GE, CUDNN_POINTWISE_CMP_GE);
DNN_SAME(PW_GEN_INDEX, CUDNN_POINTWISE_GEN_INDEX);
DNN_SAME(PW_BINARY_SELECT, CUDNN_POINTWISE_BINARY_SELECT);
DNN_SAME(RED_ADD, CUDNN_REDUCE_TENSOR_ADD);
DNN_SAME(RED_MAX, CUDNN_REDUCE_TENSOR_MAX);
DNN_SAME(HEUR_MODE_A, CUDNN_HEUR_MODE_A);
#undef DNN_SAME
#endif
#endif

static struct {
    int state;    /* 0 not tried, 1 on, -1 off */
    int checking; /* a self-check's reference call: trident's kernels */
    int served;   /* 1 once a call took cuDNN's result */
    size_t version;
    DnnHandle handle;
    DnnStatus (*create)(DnnHandle *);
    DnnStatus (*set_stream)(DnnHandle, cudaStream_t);
    size_t (*get_version)(void);
    const char *(*error)(DnnStatus);
    DnnStatus (*create_desc)(int, DnnDesc *);
    DnnStatus (*finalize)(DnnDesc);
    DnnStatus (*set)(DnnDesc, int, int, int64_t, const void *);
    DnnStatus (*get)(DnnDesc, int, int, int64_t, int64_t *, void *);
    DnnStatus (*execute)(DnnHandle, DnnDesc, DnnDesc);
} dnn;

/* cuDNN off for the rest of the run, said once on stderr */
static void dnn_off(const char *fmt, ...)
{
    if (dnn.state < 0)
        return;
    dnn.state = -1;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "trident: cuDNN attention off (");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "); trident's attention kernels serve (TRIDENT_CUDNN=0 silences this)\n");
    va_end(ap);
}

/* dlopen: TRIDENT_CUDNN_LIB, else libcudnn.so.9 on the loader's path
 * (LD_LIBRARY_PATH: bench/gpu.sh adds PyTorch's nvidia/cudnn/lib).  In the
 * CUDA emulation cuDNN never runs: only TRIDENT_CUDNN_LIB makes it try,
 * to say why not (tests/test_cuda_emu's check of that line). */
static int dnn_load(void)
{
    const char *env = getenv("TRIDENT_CUDNN"), *path = getenv("TRIDENT_CUDNN_LIB");
    if (env && strcmp(env, "0") == 0) {
        dnn.state = -1; /* asked for: no line */
        return 0;
    }
#if defined(TRD_CUDA_EMULATED)
    if (!path) {
        dnn.state = -1;
        return 0;
    }
#endif
    const char *name = path && *path ? path : "libcudnn.so.9";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        dnn_off("%s not loaded: %s", name, dlerror());
        return 0;
    }
#if defined(TRD_CUDA_EMULATED)
    dnn_off("the CUDA emulation cannot run cuDNN");
    return 0;
#else
    struct {
        const char *sym;
        void **fn;
    } syms[] = {{"cudnnCreate", (void **)&dnn.create},
                {"cudnnSetStream", (void **)&dnn.set_stream},
                {"cudnnGetVersion", (void **)&dnn.get_version},
                {"cudnnGetErrorString", (void **)&dnn.error},
                {"cudnnBackendCreateDescriptor", (void **)&dnn.create_desc},
                {"cudnnBackendFinalize", (void **)&dnn.finalize},
                {"cudnnBackendSetAttribute", (void **)&dnn.set},
                {"cudnnBackendGetAttribute", (void **)&dnn.get},
                {"cudnnBackendExecute", (void **)&dnn.execute}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].fn = dlsym(lib, syms[i].sym))) {
            dnn_off("%s lacks %s", name, syms[i].sym);
            return 0;
        }
    dnn.version = dnn.get_version();
    if (dnn.version < 90000) {
        dnn_off("%s is cuDNN %zu, older than 9.0", name, dnn.version);
        return 0;
    }
    DnnStatus st = dnn.create(&dnn.handle);
    if (st) {
        dnn_off("cudnnCreate: %s", dnn.error(st));
        return 0;
    }
    dnn.state = 1;
    return 1;
#endif
}

/* Whether cuDNN may serve this call (AttnArgs's whole causal sequences,
 * MHA, hs 64 or 128, T a multiple of 128, 16-byte aligned rows). */
static int dnn_shape_ok(const float *q, const float *kv, const AttnArgs *a)
{
    return q == kv && !a->kv_packed && !a->merge && !a->pos && a->q_pos0 == 0 && a->k_pos0 == 0 &&
           a->Tq == a->Tk && a->H == a->KVH && (a->hs == 64 || a->hs == 128) && a->Tq % 128 == 0 &&
           a->B > 0 && a->Tq > 0 && (uintptr_t)q % 16 == 0;
}

/* ---- building a graph: every step checked, the first failure kept ---- */
typedef struct {
    const char *fail; /* the step that failed, or NULL */
    DnnStatus st;
    int64_t next_uid; /* the virtual tensors' ids */
    DnnDesc ops[40];
    int nops;
} Gb;

static DnnDesc gb_desc(Gb *g, int type, const char *what)
{
    DnnDesc d = NULL;
    if (g->fail)
        return NULL;
    DnnStatus st = dnn.create_desc(type, &d);
    if (st)
        g->fail = what, g->st = st;
    return d;
}

static void gb_set(Gb *g, DnnDesc d, int name, int type, int64_t n, const void *v, const char *what)
{
    if (g->fail)
        return;
    DnnStatus st = dnn.set(d, name, type, n, v);
    if (st)
        g->fail = what, g->st = st;
}

static void gb_finalize(Gb *g, DnnDesc d, const char *what)
{
    if (g->fail)
        return;
    DnnStatus st = dnn.finalize(d);
    if (st)
        g->fail = what, g->st = st;
}

/* A tensor: uid (0: a new virtual one), its type, 4 dims and strides. */
static DnnDesc gb_tensor(Gb *g, int64_t uid, int dtype, const int64_t *dim, const int64_t *str,
                         int by_value)
{
    const bool virt = uid == 0, byv = by_value != 0;
    const int64_t align = 16, id = virt ? g->next_uid++ : uid;
    DnnDesc t = gb_desc(g, D_TENSOR, "tensor");
    gb_set(g, t, A_T_UID, T_INT64, 1, &id, "tensor uid");
    gb_set(g, t, A_T_DATA_TYPE, T_DATA_TYPE, 1, &dtype, "tensor type");
    gb_set(g, t, A_T_DIMS, T_INT64, 4, dim, "tensor dims");
    gb_set(g, t, A_T_STRIDES, T_INT64, 4, str, "tensor strides");
    gb_set(g, t, A_T_ALIGNMENT, T_INT64, 1, &align, "tensor alignment");
    gb_set(g, t, A_T_VIRTUAL, T_BOOLEAN, 1, &virt, "tensor virtual");
    gb_set(g, t, A_T_BY_VALUE, T_BOOLEAN, 1, &byv, "tensor by value");
    gb_finalize(g, t, "tensor");
    return t;
}

static void gb_op(Gb *g, DnnDesc op, const char *what)
{
    gb_finalize(g, op, what);
    if (!g->fail && g->nops < (int)(sizeof g->ops / sizeof g->ops[0]))
        g->ops[g->nops++] = op;
    else if (!g->fail)
        g->fail = "too many operations", g->st = 0;
}

/* y = mode(x, b, t) (b, t NULL where the mode takes fewer), computed in
 * prec; axis >= 0 for GEN_INDEX. */
static void gb_pointwise(Gb *g, int mode, int prec, DnnDesc x, DnnDesc b, DnnDesc t, DnnDesc y,
                         int64_t axis)
{
    DnnDesc pw = gb_desc(g, D_POINTWISE, "pointwise");
    gb_set(g, pw, A_PW_MODE, T_POINTWISE_MODE, 1, &mode, "pointwise mode");
    gb_set(g, pw, A_PW_MATH_PREC, T_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0)
        gb_set(g, pw, A_PW_AXIS, T_INT64, 1, &axis, "pointwise axis");
    gb_finalize(g, pw, "pointwise");
    DnnDesc op = gb_desc(g, D_OP_POINTWISE, "pointwise op");
    gb_set(g, op, A_OP_PW_DESC, T_DESCRIPTOR, 1, &pw, "pointwise op desc");
    gb_set(g, op, A_OP_PW_X, T_DESCRIPTOR, 1, &x, "pointwise x");
    if (b)
        gb_set(g, op, A_OP_PW_B, T_DESCRIPTOR, 1, &b, "pointwise b");
    if (t)
        gb_set(g, op, A_OP_PW_T, T_DESCRIPTOR, 1, &t, "pointwise t");
    gb_set(g, op, A_OP_PW_Y, T_DESCRIPTOR, 1, &y, "pointwise y");
    gb_op(g, op, "pointwise op");
}

static void gb_matmul(Gb *g, DnnDesc a, DnnDesc b, DnnDesc c)
{
    const int comp = DT_FLOAT;
    DnnDesc mm = gb_desc(g, D_MATMUL, "matmul");
    gb_set(g, mm, A_MATMUL_COMP, T_DATA_TYPE, 1, &comp, "matmul compute type");
    gb_finalize(g, mm, "matmul");
    DnnDesc op = gb_desc(g, D_OP_MATMUL, "matmul op");
    gb_set(g, op, A_OP_MM_A, T_DESCRIPTOR, 1, &a, "matmul a");
    gb_set(g, op, A_OP_MM_B, T_DESCRIPTOR, 1, &b, "matmul b");
    gb_set(g, op, A_OP_MM_C, T_DESCRIPTOR, 1, &c, "matmul c");
    gb_set(g, op, A_OP_MM_DESC, T_DESCRIPTOR, 1, &mm, "matmul desc");
    gb_op(g, op, "matmul op");
}

static void gb_reduce(Gb *g, int mode, DnnDesc x, DnnDesc y)
{
    const int comp = DT_FLOAT;
    DnnDesc r = gb_desc(g, D_REDUCTION, "reduction");
    gb_set(g, r, A_RED_OP, T_REDUCTION_OP, 1, &mode, "reduction operator");
    gb_set(g, r, A_RED_COMP, T_DATA_TYPE, 1, &comp, "reduction compute type");
    gb_finalize(g, r, "reduction");
    DnnDesc op = gb_desc(g, D_OP_REDUCTION, "reduction op");
    gb_set(g, op, A_OP_RED_X, T_DESCRIPTOR, 1, &x, "reduction x");
    gb_set(g, op, A_OP_RED_Y, T_DESCRIPTOR, 1, &y, "reduction y");
    gb_set(g, op, A_OP_RED_DESC, T_DESCRIPTOR, 1, &r, "reduction desc");
    gb_op(g, op, "reduction op");
}

static void gb_reshape(Gb *g, DnnDesc x, DnnDesc y)
{
    DnnDesc op = gb_desc(g, D_OP_RESHAPE, "reshape op");
    gb_set(g, op, A_OP_RESHAPE_X, T_DESCRIPTOR, 1, &x, "reshape x");
    gb_set(g, op, A_OP_RESHAPE_Y, T_DESCRIPTOR, 1, &y, "reshape y");
    gb_op(g, op, "reshape op");
}

/* The operation graph, heuristics (mode A) and the first engine
 * configuration whose plan finalizes: the plan, its workspace in *ws. */
static DnnDesc gb_plan(Gb *g, int64_t *ws)
{
    DnnDesc graph = gb_desc(g, D_OPGRAPH, "operation graph");
    if (!g->fail) /* deprecated in newer cuDNN, needed by older: its status ignored */
        dnn.set(graph, A_GRAPH_HANDLE, T_HANDLE, 1, &dnn.handle);
    gb_set(g, graph, A_GRAPH_OPS, T_DESCRIPTOR, g->nops, g->ops, "graph operations");
    gb_finalize(g, graph, "operation graph");
    const int mode = HEUR_MODE_A;
    DnnDesc heur = gb_desc(g, D_ENGINEHEUR, "heuristics");
    gb_set(g, heur, A_HEUR_GRAPH, T_DESCRIPTOR, 1, &graph, "heuristics graph");
    gb_set(g, heur, A_HEUR_MODE, T_HEUR_MODE, 1, &mode, "heuristics mode");
    gb_finalize(g, heur, "heuristics");
    if (g->fail)
        return NULL;
    enum { CFGS = 16 };
    DnnDesc cfg[CFGS];
    for (int i = 0; i < CFGS; i++)
        cfg[i] = gb_desc(g, D_ENGINECFG, "engine config");
    int64_t n = 0;
    if (!g->fail) {
        DnnStatus st = dnn.get(heur, A_HEUR_RESULTS, T_DESCRIPTOR, CFGS, &n, cfg);
        if (st)
            g->fail = "heuristics results", g->st = st;
        n = n < (int64_t)CFGS ? n : (int64_t)CFGS; /* the count may be of all it has */
    }
    for (int64_t i = 0; i < n && !g->fail; i++) {
        DnnDesc plan = NULL;
        if (dnn.create_desc(D_PLAN, &plan))
            break;
        dnn.set(plan, A_PLAN_HANDLE, T_HANDLE, 1, &dnn.handle);
        if (dnn.set(plan, A_PLAN_CONFIG, T_DESCRIPTOR, 1, &cfg[i]) || dnn.finalize(plan))
            continue; /* this engine refused the graph: the next one (plan leaks, once a shape) */
        int64_t got = 0;
        if (dnn.get(plan, A_PLAN_WORKSPACE, T_INT64, 1, &got, ws))
            continue;
        return plan;
    }
    if (!g->fail)
        g->fail = n ? "no engine config finalized a plan" : "heuristics offered no engine",
        g->st = 0;
    return NULL;
}

/* ---- the two graphs (uids of the caller's tensors) ---- */
enum {
    U_Q = 1,
    U_K,
    U_V,
    U_O,
    U_STATS,
    U_SCALE,
    U_NEGINF,
    U_DO,
    U_ONE,
    U_DQ,
    U_DK,
    U_DV,
    U_DSUM,
    U_DQACC,
    U_VIRTUAL = 100
};

typedef struct {
    int64_t b, h, s, d;
} Dims;

/* [b, h, s, d] over a BSHD array: row stride h d */
static void bshd(const Dims &x, int64_t *dim, int64_t *str, int transposed)
{
    const int64_t d4[4] = {x.b, x.h, transposed ? x.d : x.s, transposed ? x.s : x.d};
    const int64_t s4[4] = {x.s * x.h * x.d, x.d, transposed ? 1 : x.h * x.d,
                           transposed ? x.h * x.d : 1};
    memcpy(dim, d4, sizeof d4), memcpy(str, s4, sizeof s4);
}

/* S (fp32, virtual) masked causally: entries with column > row become
 * neginf (cudnn-frontend's diagonal band with right bound 0). */
static DnnDesc gb_causal(Gb *g, DnnDesc s, DnnDesc neginf, const int64_t *sd, const int64_t *ss)
{
    DnnDesc row = gb_tensor(g, 0, DT_INT32, sd, ss, 0), col = gb_tensor(g, 0, DT_INT32, sd, ss, 0);
    DnnDesc keep = gb_tensor(g, 0, DT_BOOL, sd, ss, 0), out = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0);
    gb_pointwise(g, PW_GEN_INDEX, DT_FLOAT, s, NULL, NULL, row, 2);
    gb_pointwise(g, PW_GEN_INDEX, DT_FLOAT, s, NULL, NULL, col, 3);
    gb_pointwise(g, PW_CMP_GE, DT_BOOL, row, col, NULL, keep, -1);
    gb_pointwise(g, PW_BINARY_SELECT, DT_FLOAT, s, neginf, keep, out, -1);
    return out;
}

static DnnDesc build_forward(const Dims &x, int64_t *ws, Gb *g)
{
    int64_t qd[4], qs[4], kd[4], ks[4];
    bshd(x, qd, qs, 0), bshd(x, kd, ks, 1);
    const int64_t one[4] = {1, 1, 1, 1}, sd[4] = {x.b, x.h, x.s, x.s},
                  ss[4] = {x.h * x.s * x.s, x.s * x.s, x.s, 1}, rd[4] = {x.b, x.h, x.s, 1},
                  rs[4] = {x.h * x.s, x.s, 1, 1};
    DnnDesc Q = gb_tensor(g, U_Q, DT_BF16, qd, qs, 0), K = gb_tensor(g, U_K, DT_BF16, kd, ks, 0);
    DnnDesc V = gb_tensor(g, U_V, DT_BF16, qd, qs, 0), O = gb_tensor(g, U_O, DT_BF16, qd, qs, 0);
    DnnDesc stats = gb_tensor(g, U_STATS, DT_FLOAT, rd, rs, 0);
    DnnDesc scale = gb_tensor(g, U_SCALE, DT_FLOAT, one, one, 1);
    DnnDesc neginf = gb_tensor(g, U_NEGINF, DT_FLOAT, one, one, 1);

    DnnDesc S = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0), Ss = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0);
    gb_matmul(g, Q, K, S);
    gb_pointwise(g, PW_MUL, DT_FLOAT, S, scale, NULL, Ss, -1);
    DnnDesc Sm = gb_causal(g, Ss, neginf, sd, ss);
    DnnDesc mx = gb_tensor(g, 0, DT_FLOAT, rd, rs, 0), sub = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0);
    DnnDesc e = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0), sum = gb_tensor(g, 0, DT_FLOAT, rd, rs, 0);
    DnnDesc lg = gb_tensor(g, 0, DT_FLOAT, rd, rs, 0), P = gb_tensor(g, 0, DT_BF16, sd, ss, 0);
    gb_reduce(g, RED_MAX, Sm, mx);
    gb_pointwise(g, PW_SUB, DT_FLOAT, Sm, mx, NULL, sub, -1);
    gb_pointwise(g, PW_EXP, DT_FLOAT, sub, NULL, NULL, e, -1);
    gb_reduce(g, RED_ADD, e, sum);
    gb_pointwise(g, PW_LOG, DT_FLOAT, sum, NULL, NULL, lg, -1);
    gb_pointwise(g, PW_ADD, DT_FLOAT, mx, lg, NULL, stats, -1);
    gb_pointwise(g, PW_DIV, DT_FLOAT, e, sum, NULL, P, -1);
    gb_matmul(g, P, V, O);
    return gb_plan(g, ws);
}

static DnnDesc build_backward(const Dims &x, int64_t *ws, Gb *g)
{
    int64_t qd[4], qs[4], kd[4], ks[4];
    bshd(x, qd, qs, 0), bshd(x, kd, ks, 1);
    const int64_t one[4] = {1, 1, 1, 1}, sd[4] = {x.b, x.h, x.s, x.s},
                  ss[4] = {x.h * x.s * x.s, x.s * x.s, x.s, 1},
                  sts[4] = {x.h * x.s * x.s, x.s * x.s, 1, x.s}, rd[4] = {x.b, x.h, x.s, 1},
                  rs[4] = {x.h * x.s, x.s, 1, 1};
    /* dO * O (virtual; cudnn-frontend's strides), the fp32 dQ accumulator (BHSD) */
    const int64_t ms[4] = {x.h * x.s * x.d, x.s * x.d, x.h * x.d, 1};
    const int64_t as[4] = {x.h * x.s * x.d, x.s * x.d, x.d, 1};
    DnnDesc Q = gb_tensor(g, U_Q, DT_BF16, qd, qs, 0), K = gb_tensor(g, U_K, DT_BF16, kd, ks, 0);
    DnnDesc V = gb_tensor(g, U_V, DT_BF16, kd, ks, 0), O = gb_tensor(g, U_O, DT_BF16, qd, qs, 0);
    DnnDesc dO = gb_tensor(g, U_DO, DT_BF16, qd, qs, 0);
    DnnDesc stats = gb_tensor(g, U_STATS, DT_FLOAT, rd, rs, 0);
    DnnDesc scale = gb_tensor(g, U_SCALE, DT_FLOAT, one, one, 1);
    DnnDesc neginf = gb_tensor(g, U_NEGINF, DT_FLOAT, one, one, 1);
    DnnDesc unit = gb_tensor(g, U_ONE, DT_FLOAT, one, one, 1);
    DnnDesc dQ = gb_tensor(g, U_DQ, DT_BF16, qd, qs, 0),
            dK = gb_tensor(g, U_DK, DT_BF16, qd, qs, 0);
    DnnDesc dV = gb_tensor(g, U_DV, DT_BF16, qd, qs, 0);
    DnnDesc dsum = gb_tensor(g, U_DSUM, DT_FLOAT, rd, rs, 0);
    DnnDesc dqacc = gb_tensor(g, U_DQACC, DT_FLOAT, qd, as, 0);

    /* D = rowsum(dO * O) (times 1: the place of dropout's scale) */
    DnnDesc m = gb_tensor(g, 0, DT_FLOAT, qd, ms, 0), r = gb_tensor(g, 0, DT_FLOAT, rd, rs, 0);
    gb_pointwise(g, PW_MUL, DT_FLOAT, dO, O, NULL, m, -1);
    gb_reduce(g, RED_ADD, m, r);
    gb_pointwise(g, PW_MUL, DT_FLOAT, r, unit, NULL, dsum, -1);

    /* P = exp(S scale - stats), causal */
    DnnDesc S = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0), Ss = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0);
    DnnDesc Sl = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0);
    gb_matmul(g, Q, K, S);
    gb_pointwise(g, PW_MUL, DT_FLOAT, S, scale, NULL, Ss, -1);
    gb_pointwise(g, PW_SUB, DT_FLOAT, Ss, stats, NULL, Sl, -1);
    DnnDesc Sm = gb_causal(g, Sl, neginf, sd, ss);
    DnnDesc P = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0), Pt = gb_tensor(g, 0, DT_BF16, sd, sts, 0);
    gb_pointwise(g, PW_EXP, DT_FLOAT, Sm, NULL, NULL, P, -1);
    gb_reshape(g, P, Pt);
    gb_matmul(g, Pt, dO, dV);

    /* dS = P (dO V^T - D) scale */
    DnnDesc dP = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0), dPd = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0);
    DnnDesc dS = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0), dSs = gb_tensor(g, 0, DT_FLOAT, sd, ss, 0);
    DnnDesc dSt = gb_tensor(g, 0, DT_BF16, sd, sts, 0);
    gb_matmul(g, dO, V, dP);
    gb_pointwise(g, PW_SUB, DT_FLOAT, dP, dsum, NULL, dPd, -1);
    gb_pointwise(g, PW_MUL, DT_FLOAT, dPd, P, NULL, dS, -1);
    gb_pointwise(g, PW_MUL, DT_FLOAT, dS, scale, NULL, dSs, -1);
    gb_reshape(g, dSs, dSt);
    gb_matmul(g, dSt, Q, dK);

    /* dQ = dS K, through the fp32 accumulator */
    DnnDesc Kn = gb_tensor(g, 0, DT_BF16, qd, qs, 0);
    gb_reshape(g, K, Kn);
    gb_matmul(g, dSs, Kn, dqacc);
    gb_pointwise(g, PW_IDENTITY, DT_FLOAT, dqacc, NULL, NULL, dQ, -1);
    return gb_plan(g, ws);
}

/* ---- plans per shape ---- */
typedef struct {
    Dims x;
    int bwd;
    DnnDesc plan;
    int64_t ws;
} Plan;

enum { PLANS = 16 };
static Plan plans[PLANS];
static int nplans;

/* The plan of this shape and direction (built on first use), NULL when
 * cuDNN refused it (then off for the run: said once). */
static const Plan *dnn_plan(const Dims &x, int bwd, int *fresh)
{
    *fresh = 0;
    for (int i = 0; i < nplans; i++)
        if (plans[i].bwd == bwd && !memcmp(&plans[i].x, &x, sizeof x))
            return &plans[i];
    if (nplans == PLANS) {
        dnn_off("more than %d attention shapes", (int)PLANS);
        return NULL;
    }
    Gb g = {};
    g.next_uid = U_VIRTUAL;
    Plan p = {x, bwd, NULL, 0};
    p.plan = bwd ? build_backward(x, &p.ws, &g) : build_forward(x, &p.ws, &g);
    if (!p.plan) {
        dnn_off("cuDNN %zu, %s graph B=%lld T=%lld H=%lld hs=%lld: %s%s%s", dnn.version,
                bwd ? "backward" : "forward", (long long)x.b, (long long)x.s, (long long)x.h,
                (long long)x.d, g.fail, g.st ? ": " : "", g.st ? dnn.error(g.st) : "");
        return NULL;
    }
    *fresh = 1;
    plans[nplans] = p;
    return &plans[nplans++];
}

/* ---- device buffers, grown and kept ---- */
enum { B_Q, B_K, B_V, B_O, B_DO, B_DQ, B_DK, B_DV, B_DSUM, B_DQACC, B_WS, BUFS };
static struct {
    void *p;
    size_t bytes;
} bufs[BUFS];

static void *dnn_buf(int i, size_t bytes)
{
    if (bufs[i].bytes < bytes) {
        if (bufs[i].p)
            CUDA_CHECK(cudaFree(bufs[i].p));
        bufs[i].p = NULL, bufs[i].bytes = 0;
        if (cudaMalloc(&bufs[i].p, bytes) != cudaSuccess) {
            bufs[i].p = NULL;
            (void)cudaGetLastError();
            return NULL;
        }
        bufs[i].bytes = bytes;
    }
    return bufs[i].p;
}

/* ---- conversions between trident's fp32 rows and cuDNN's bf16 BSHD ---- */
__global__ void dnn_split_kernel(__nv_bfloat16 *q, __nv_bfloat16 *k, __nv_bfloat16 *v,
                                 const float *qkv, size_t n, int H, int hs)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    /* i over [row][head][channel] of one BSHD array; MHA: q, k, v of head
     * h at 3 h hs, (3 h + 1) hs, (3 h + 2) hs of the fused row */
    const size_t row = i / ((size_t)H * hs);
    const int h = (int)(i / hs % H), c = (int)(i % hs);
    const float *src = qkv + row * 3 * H * hs + (size_t)3 * h * hs + c;
    q[i] = __float2bfloat16(src[0]);
    k[i] = __float2bfloat16(src[hs]);
    v[i] = __float2bfloat16(src[2 * hs]);
}

__global__ void dnn_narrow_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = __float2bfloat16(src[i]);
}

/* cuDNN's bf16 output as fp32 out, and its bits as out's bf16 copy
 * (AttnArgs.out16, when asked for: bf16(out) is the output itself) */
__global__ void dnn_widen_kernel(float *dst, uint16_t *dst16, const __nv_bfloat16 *src, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    dst[i] = __bfloat162float(src[i]);
    if (dst16)
        dst16[i] = __bfloat16_as_ushort(src[i]);
}

/* dq, dk, dv (bf16 BSHD) into the fused fp32 gradient rows, set or added */
__global__ void dnn_merge_kernel(float *dqkv, const __nv_bfloat16 *dq, const __nv_bfloat16 *dk,
                                 const __nv_bfloat16 *dv, size_t n, int H, int hs, int set)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const size_t row = i / ((size_t)H * hs);
    const int h = (int)(i / hs % H), c = (int)(i % hs);
    float *dst = dqkv + row * 3 * H * hs + (size_t)3 * h * hs + c;
    grad_put(dst, __bfloat162float(dq[i]), set);
    grad_put(dst + hs, __bfloat162float(dk[i]), set);
    grad_put(dst + 2 * hs, __bfloat162float(dv[i]), set);
}

/* n floats of device memory for a self-check, NULL when there is none */
static float *dnn_floats(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (float *)p;
}

static void dnn_free(float *p)
{
    if (p)
        CUDA_CHECK(cudaFree(p));
}

static unsigned dnn_blocks(size_t n) { return (unsigned)((n + CUDA_THREADS - 1) / CUDA_THREADS); }

/* ---- the self-check: cuDNN against trident's kernels, once a shape ---- */

/* max |a - b| / max(max |b|, floor) over n device floats; entries where
 * both are -inf (lse of a row that sees nothing: none here) match */
static double dnn_rel_err(const float *d_a, const float *d_b, size_t n, double floor)
{
    float *a = (float *)malloc(n * sizeof(float)), *b = (float *)malloc(n * sizeof(float));
    TRD_ASSERT(a && b);
    CUDA_CHECK(cudaMemcpy(a, d_a, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(b, d_b, n * sizeof(float), cudaMemcpyDeviceToHost));
    double err = 0, ref = floor;
    for (size_t i = 0; i < n; i++) {
        ref = fmax(ref, fabs((double)b[i]));
        const double e = a[i] == b[i] ? 0 : fabs((double)a[i] - (double)b[i]);
        err = isnan(e) ? INFINITY : fmax(err, e);
    }
    free(a), free(b);
    return err / ref;
}

/* The tolerances: cuDNN rounds O and dQ, dK, dV to bf16 (2^-9 relative)
 * on top of what trident's kernels round (P, dS: docs/cuda.md "bf16
 * attention"), and sums in another order; 2e-2 of the largest magnitude
 * leaves room for that and none for a wrong mask, scale or layout (those
 * miss by O(1)).  lse: fp32 sums of the same bf16 products, 1e-3. */
#define DNN_TOL    2e-2
#define DNN_TOL_LS 1e-3

static int dnn_check(const char *what, double err, double tol, const Dims &x)
{
    if (err <= tol && !isnan(err))
        return 1;
    dnn_off("self-check failed: %s differs from trident's kernel by %.3g (tolerance %g) at B=%lld "
            "T=%lld H=%lld hs=%lld",
            what, err, tol, (long long)x.b, (long long)x.s, (long long)x.h, (long long)x.d);
    return 0;
}

static int dnn_ready(const float *q, const float *kv, const AttnArgs *a)
{
    if (dnn.checking || dnn.state < 0)
        return 0;
    if (dnn.state == 0 && !dnn_load())
        return 0;
    return dnn_shape_ok(q, kv, a);
}

static int dnn_exec(const Plan *p, const int64_t *uids, void *const *ptrs, int n)
{
    void *ws = p->ws ? dnn_buf(B_WS, (size_t)p->ws) : NULL;
    if (p->ws && !ws) {
        dnn_off("no memory for cuDNN's workspace of %lld bytes", (long long)p->ws);
        return 0;
    }
    DnnDesc vp = NULL;
    DnnStatus st = dnn.create_desc(D_VARIANT_PACK, &vp);
    if (!st)
        st = dnn.set(vp, A_VP_UIDS, T_INT64, n, uids);
    if (!st)
        st = dnn.set(vp, A_VP_POINTERS, T_VOID_PTR, n, ptrs);
    if (!st)
        st = dnn.set(vp, A_VP_WORKSPACE, T_VOID_PTR, 1, &ws);
    if (!st)
        st = dnn.finalize(vp);
    if (!st)
        st = dnn.set_stream(dnn.handle, cuda_stream());
    if (!st)
        st = dnn.execute(dnn.handle, p->plan, vp);
    if (st) {
        dnn_off("cudnnBackendExecute: %s", dnn.error(st));
        return 0; /* the variant pack leaks: once a run */
    }
    return 1;
}

static Dims dnn_dims(const AttnArgs *a)
{
    Dims x = {a->B, a->H, a->Tq, a->hs};
    return x;
}

/* bf16 q, k, v of qkv in B_Q, B_K, B_V (NULL when out of memory) */
static int dnn_split(const float *qkv, const Dims &x)
{
    const size_t n = (size_t)x.b * x.s * x.h * x.d, bytes = n * 2;
    void *q = dnn_buf(B_Q, bytes), *k = dnn_buf(B_K, bytes), *v = dnn_buf(B_V, bytes);
    if (!q || !k || !v) {
        dnn_off("no memory for the bf16 operands");
        return 0;
    }
    PROFILE_PART("cudnn_split", 3.0 * 6 * (double)n, 0, {
        dnn_split_kernel<<<dnn_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
            (__nv_bfloat16 *)q, (__nv_bfloat16 *)k, (__nv_bfloat16 *)v, qkv, n, (int)x.h, (int)x.d);
        CUDA_CHECK_LAUNCH();
    });
    return 1;
}

int cuda_attention_cudnn_forward(float *out, float *lse, const float *q, const float *kv,
                                 const AttnArgs *a)
{
    if (!dnn_ready(q, kv, a))
        return 0;
    const Dims x = dnn_dims(a);
    int fresh;
    const Plan *p = dnn_plan(x, 0, &fresh);
    if (!p || !dnn_split(q, x))
        return 0;
    const size_t n = (size_t)x.b * x.s * x.h * x.d;
    void *o = dnn_buf(B_O, n * 2);
    if (!o) {
        dnn_off("no memory for the bf16 output");
        return 0;
    }
    float scale = 1 / sqrtf((float)a->hs), neginf = dnn.version < 91000 ? -FLT_MAX : -INFINITY;
    const int64_t uids[] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF};
    void *const ptrs[] = {bufs[B_Q].p, bufs[B_K].p, bufs[B_V].p, o, lse, &scale, &neginf};
    int ran;
    PROFILE_PART("cudnn", 0, 0, ran = dnn_exec(p, uids, ptrs, 7));
    if (!ran)
        return 0; /* nothing written that trident's kernel will not overwrite */
    PROFILE_PART("cudnn_widen", (a->out16 ? 8.0 : 6.0) * (double)n, 0, {
        dnn_widen_kernel<<<dnn_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
            out, a->out16, (const __nv_bfloat16 *)o, n);
        CUDA_CHECK_LAUNCH();
    });
    if (!fresh)
        return dnn.served = 1;
    /* first call of this shape: trident's kernel on the same inputs (its
     * out16 not written: cuDNN's stands unless the check fails) */
    AttnArgs r = *a;
    r.out16 = NULL;
    const size_t nl = (size_t)x.b * x.h * x.s;
    float *ref = dnn_floats(n), *ref_lse = dnn_floats(nl);
    if (!ref || !ref_lse) {
        dnn_free(ref), dnn_free(ref_lse);
        dnn_off("no memory for the self-check");
        return 0;
    }
    dnn.checking = 1;
    cuda_attention_forward_bf16(ref, ref_lse, q, kv, &r);
    dnn.checking = 0;
    const int ok = dnn_check("out", dnn_rel_err(out, ref, n, 1e-3), DNN_TOL, x) &&
                   dnn_check("lse", dnn_rel_err(lse, ref_lse, nl, 1.0), DNN_TOL_LS, x);
    if (!ok) { /* trident's result stands */
        CUDA_CHECK(cudaMemcpy(out, ref, n * 4, cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaMemcpy(lse, ref_lse, nl * 4, cudaMemcpyDeviceToDevice));
        if (a->out16) {
            dnn_narrow_kernel<<<dnn_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>(
                (__nv_bfloat16 *)a->out16, out, n);
            CUDA_CHECK_LAUNCH();
        }
    } else {
        dnn.served = 1;
        fprintf(stderr,
                "trident: cuDNN %zu serves attention forward (B=%lld T=%lld H=%lld hs=%lld; "
                "self-check passed)\n",
                dnn.version, (long long)x.b, (long long)x.s, (long long)x.h, (long long)x.d);
    }
    dnn_free(ref), dnn_free(ref_lse);
    return 1;
}

int cuda_attention_cudnn_backward(float *dq, float *dkv, const float *dout, const float *q,
                                  const float *kv, const float *out, const float *lse,
                                  const AttnArgs *a)
{
    if (!dnn_ready(q, kv, a) || dq != dkv)
        return 0;
    const Dims x = dnn_dims(a);
    int fresh;
    const Plan *p = dnn_plan(x, 1, &fresh);
    if (!p || !dnn_split(q, x))
        return 0;
    const size_t n = (size_t)x.b * x.s * x.h * x.d, nl = (size_t)x.b * x.h * x.s;
    void *o = dnn_buf(B_O, n * 2), *dO = dnn_buf(B_DO, n * 2), *gq = dnn_buf(B_DQ, n * 2);
    void *gk = dnn_buf(B_DK, n * 2), *gv = dnn_buf(B_DV, n * 2);
    void *dsum = dnn_buf(B_DSUM, nl * 4), *acc = dnn_buf(B_DQACC, n * 4);
    if (!o || !dO || !gq || !gk || !gv || !dsum || !acc) {
        dnn_off("no memory for the backward's bf16 buffers");
        return 0;
    }
    PROFILE_PART("cudnn_narrow", 2 * 6.0 * (double)n, 0, {
        dnn_narrow_kernel<<<dnn_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>((__nv_bfloat16 *)o,
                                                                             out, n);
        CUDA_CHECK_LAUNCH();
        dnn_narrow_kernel<<<dnn_blocks(n), CUDA_THREADS, 0, cuda_stream()>>>((__nv_bfloat16 *)dO,
                                                                             dout, n);
        CUDA_CHECK_LAUNCH();
    });
    if (dnn.version < 90600) /* cudnn-frontend zeroes the accumulator before 9.6 */
        CUDA_CHECK(cudaMemsetAsync(acc, 0, n * 4, cuda_stream()));
    float scale = 1 / sqrtf((float)a->hs), neginf = dnn.version < 91000 ? -FLT_MAX : -INFINITY,
          unit = 1;
    const int64_t uids[] = {U_Q,      U_K,   U_V,  U_O,  U_DO, U_STATS, U_SCALE,
                            U_NEGINF, U_ONE, U_DQ, U_DK, U_DV, U_DSUM,  U_DQACC};
    void *const ptrs[] = {bufs[B_Q].p, bufs[B_K].p, bufs[B_V].p, o,  dO, (void *)lse, &scale,
                          &neginf,     &unit,       gq,          gk, gv, dsum,        acc};
    int ran;
    PROFILE_PART("cudnn", 0, 0, ran = dnn_exec(p, uids, ptrs, 14));
    if (!ran)
        return 0; /* dq untouched: trident's kernels take the call */
    const unsigned blocks = dnn_blocks(n);
    if (fresh) {
        /* cuDNN's gradients and trident's, each SET into a zeroed copy of
         * the fused rows (the heads are all written: MHA), compared before
         * either reaches dq */
        const size_t nq = (size_t)x.b * x.s * 3 * x.h * x.d;
        float *mine = dnn_floats(nq), *ref = dnn_floats(nq);
        if (!mine || !ref) {
            dnn_free(mine), dnn_free(ref);
            dnn_off("no memory for the self-check");
            return 0;
        }
        dnn_merge_kernel<<<blocks, CUDA_THREADS, 0, cuda_stream()>>>(
            mine, (const __nv_bfloat16 *)gq, (const __nv_bfloat16 *)gk, (const __nv_bfloat16 *)gv,
            n, (int)x.h, (int)x.d, 1);
        CUDA_CHECK_LAUNCH();
        AttnArgs s = *a;
        s.grad = GRAD_SET;
        dnn.checking = 1;
        cuda_attention_backward_bf16(ref, ref, dout, q, kv, out, lse, &s);
        dnn.checking = 0;
        const int ok = dnn_check("dq, dk, dv", dnn_rel_err(mine, ref, nq, 1e-3), DNN_TOL, x);
        dnn_free(mine), dnn_free(ref);
        if (!ok)
            return 0; /* dq untouched: trident's kernels take the call */
        fprintf(stderr,
                "trident: cuDNN %zu serves attention backward (B=%lld T=%lld H=%lld hs=%lld; "
                "self-check passed)\n",
                dnn.version, (long long)x.b, (long long)x.s, (long long)x.h, (long long)x.d);
    }
    PROFILE_PART("cudnn_merge", 3.0 * (a->grad == GRAD_SET ? 6 : 10) * (double)n, 0, {
        dnn_merge_kernel<<<blocks, CUDA_THREADS, 0, cuda_stream()>>>(
            dq, (const __nv_bfloat16 *)gq, (const __nv_bfloat16 *)gk, (const __nv_bfloat16 *)gv, n,
            (int)x.h, (int)x.d, a->grad == GRAD_SET);
        CUDA_CHECK_LAUNCH();
    });
    return dnn.served = 1;
}

int cuda_attention_cudnn_on(void) { return dnn.state > 0 && dnn.served; }

extern "C" int backend_cuda_cudnn_attention(int load)
{
    if (load && dnn.state == 0)
        dnn_load();
    return dnn.state > 0;
}
