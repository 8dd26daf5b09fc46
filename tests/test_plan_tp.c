/* test_plan_tp.c — the planner's tensor-parallel bytes against src/comm's
 * counter of a real forward + backward, exactly.
 *
 * For tp 2 and 4, sequence parallelism off and on, GPT-2 and Llama with 2
 * kv heads (split over tp 2, replicated over tp 4), recompute none and
 * full: build the TP shard, run one micro-batch, and compare the TP
 * communicator's bytes_sent with the plan's tp_bytes_mb for the same
 * config.  The same for mixture-of-experts models (docs/moe.md: GPT-2 with
 * 4 experts, top-2, a shared expert, every layer; Llama with 4 experts,
 * top-1, every 2nd layer, dropping): and what MoE adds over the dense
 * model of the same shape, measured, is the all-reduce of the routing
 * weights' gradient, here computed from its definition (ring all-reduce of
 * B x T x top_k floats per MoE layer: 2 (tp - 1) / tp of its bytes), as is
 * the plan's moe_tp_bytes_mb.  Relaunches itself under `mpiexec -n 4`. */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check.h"
#include "mpi_test.h"
#include "comm/comm.h"
#include "model/model.h"
#include "plan/plan.h"

enum { WORLD = 4, B = 2, T = 16 };

/* moe: 0 dense, else the MoE of the arch (above). */
static void config(Config *c, ModelArch arch, int tp, int sp, Recompute rc, int moe)
{
    char err[CFG_ERR];
    config_defaults(c);
    c->model.arch = arch;
    c->model.layers = 2;
    c->model.hidden = 32;
    c->model.heads = 4;
    c->model.kv_heads = arch == ARCH_LLAMA ? 2 : 0;
    c->model.vocab = 101;
    c->model.vocab_pad_multiple = 8;
    c->model.seq_len = T;
    c->training.steps = 1;
    c->training.lr = 1e-3f;
    c->training.global_batch = B;
    c->training.micro_batch = B;
    c->training.recompute = rc;
    c->topology.tp = tp;
    c->topology.ranks_per_node = tp;
    c->topology.sequence_parallel = sp;
    if (moe) {
        c->model.moe_experts = 4;
        c->model.moe_top_k = arch == ARCH_GPT2 ? 2 : 1;
        c->model.moe_every = arch == ARCH_GPT2 ? 1 : 2;
        c->model.moe_shared_experts = arch == ARCH_GPT2;
        c->model.moe_capacity_factor = arch == ARCH_GPT2 ? 0 : 1.0f;
    }
    snprintf(c->data.path, sizeof c->data.path, "unused");
    if (config_validate(c, tp, err) != 0) {
        fprintf(stderr, "config: %s\n", err);
        exit(1);
    }
}

/* The measured bytes of one micro-batch, after checking the plan's. */
static uint64_t check_case(Comm *tpc, ModelArch arch, int sp, Recompute rc, int moe)
{
    Config c;
    config(&c, arch, tpc->size, sp, rc, moe);
    ParamShard sh = params_full_shard(&c.model);
    sh.tp = tpc->size;
    sh.tp_rank = tpc->rank;
    Model *m = model_create(&c, backend_cpu(), &sh, B);
    model_set_tensor_parallel(m, tpc);
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7) % c.model.vocab;
        tgt[i] = (i * 13 + 5) % c.model.vocab;
    }
    tpc->bytes_sent = 0;
    model_forward(m, tok, tgt);
    model_backward(m, 1.0f);
    const uint64_t measured = tpc->bytes_sent;
    model_free(m);

    PlanCluster cl;
    PlanResult r;
    char err[CFG_ERR];
    CHECK(cluster_preset("cpu", &cl, err) == 0, "%s", err);
    cl.gpus_per_node = tpc->size;
    CHECK(plan_evaluate(&c, &cl, &r, err) == 0, "%s", err);
    CHECK(r.st[0].tp_bytes_mb == measured,
          "%s%s tp %d sp %d recompute %d: planned %llu bytes, measured %llu",
          config_arch_name(arch), moe ? " moe" : "", tpc->size, sp, rc,
          (unsigned long long)r.st[0].tp_bytes_mb, (unsigned long long)measured);
    if (tpc->rank == 0 && getenv("PLAN_TP_VERBOSE"))
        printf("%s%s tp %d sp %d recompute %d: %llu bytes per micro-batch, plan %llu\n",
               config_arch_name(arch), moe ? " moe" : "", tpc->size, sp, rc,
               (unsigned long long)measured, (unsigned long long)r.st[0].tp_bytes_mb);
    return measured;
}

/* The routing weights' gradient all-reduces of one micro-batch, from the
 * definition: each MoE layer's backward all-reduces [B x T, top_k] fp32
 * over tp; a ring all-reduce sends 2 (tp - 1) / tp of the bytes. */
static uint64_t moe_formula(ModelArch arch, int tp)
{
    const uint64_t K = arch == ARCH_GPT2 ? 2 : 1;
    const uint64_t moe_layers = arch == ARCH_GPT2 ? 2 : 1; /* of 2: every layer, every 2nd */
    return moe_layers * 2 * (uint64_t)(tp - 1) * (B * T * K * 4) / (uint64_t)tp;
}

/* A MoE model: the plan equals the counter, the counter exceeds the dense
 * model's by the formula, and the plan names that part. */
static void check_moe(Comm *tpc, ModelArch arch, int sp, Recompute rc)
{
    const uint64_t dense = check_case(tpc, arch, sp, rc, 0);
    const uint64_t moe = check_case(tpc, arch, sp, rc, 1);
    const uint64_t want = moe_formula(arch, tpc->size);
    CHECK(moe - dense == want,
          "%s moe tp %d sp %d recompute %d: measured %llu bytes over the dense model, formula %llu",
          config_arch_name(arch), tpc->size, sp, rc, (unsigned long long)(moe - dense),
          (unsigned long long)want);
    Config c;
    config(&c, arch, tpc->size, sp, rc, 1);
    PlanCluster cl;
    PlanResult r;
    char err[CFG_ERR];
    CHECK(cluster_preset("cpu", &cl, err) == 0, "%s", err);
    cl.gpus_per_node = tpc->size;
    CHECK(plan_evaluate(&c, &cl, &r, err) == 0, "%s", err);
    CHECK(r.st[0].moe_tp_bytes_mb == want,
          "%s moe tp %d: plan's moe_tp_bytes_mb %llu, formula %llu", config_arch_name(arch),
          tpc->size, (unsigned long long)r.st[0].moe_tp_bytes_mb, (unsigned long long)want);
}

int main(int argc, char **argv)
{
    if (!mpi_test_child())
        return mpi_test_relaunch("plan_tp", 4);
    comm_init(&argc, &argv);
    alarm(120);
    omp_set_num_threads(1);
    Comm world = comm_world();
    if (world.size != WORLD) {
        fprintf(stderr, "plan_tp: needs %d ranks, got %d\n", WORLD, world.size);
        comm_finalize();
        return 1;
    }
    for (int tp = 2; tp <= WORLD; tp *= 2) {
        Comm tpc = comm_split(&world, world.rank / tp, world.rank);
        for (int sp = 0; sp <= 1; sp++)
            for (int rc = RECOMPUTE_NONE; rc <= RECOMPUTE_FULL; rc += 2) {
                check_moe(&tpc, ARCH_GPT2, sp, (Recompute)rc);
                check_moe(&tpc, ARCH_LLAMA, sp, (Recompute)rc);
            }
        comm_free(&tpc);
    }
    int failed = check_failures;
    comm_allreduce_max_i32(&world, &failed, 1);
    int rc = 0;
    if (world.rank == 0)
        rc = check_summary("plan_tp");
    comm_finalize();
    return failed ? 1 : rc;
}
