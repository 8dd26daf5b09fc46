/* test_plan_tp.c — the planner's tensor-parallel bytes against src/comm's
 * counter of a real forward + backward, exactly.
 *
 * For tp 2 and 4, sequence parallelism off and on, GPT-2 and Llama with 2
 * kv heads (split over tp 2, replicated over tp 4), recompute none and
 * full: build the TP shard, run one micro-batch, and compare the TP
 * communicator's bytes_sent with the plan's tp_bytes_mb for the same
 * config.  Relaunches itself under `mpiexec -n 4`. */
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

static void config(Config *c, ModelArch arch, int tp, int sp, Recompute rc)
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
    snprintf(c->data.path, sizeof c->data.path, "unused");
    if (config_validate(c, tp, err) != 0) {
        fprintf(stderr, "config: %s\n", err);
        exit(1);
    }
}

static void check_case(Comm *tpc, ModelArch arch, int sp, Recompute rc)
{
    Config c;
    config(&c, arch, tpc->size, sp, rc);
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
          "%s tp %d sp %d recompute %d: planned %llu bytes, measured %llu", config_arch_name(arch),
          tpc->size, sp, rc, (unsigned long long)r.st[0].tp_bytes_mb, (unsigned long long)measured);
    if (tpc->rank == 0 && getenv("PLAN_TP_VERBOSE"))
        printf("%s tp %d sp %d recompute %d: %llu bytes per micro-batch, plan %llu\n",
               config_arch_name(arch), tpc->size, sp, rc, (unsigned long long)measured,
               (unsigned long long)r.st[0].tp_bytes_mb);
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
                check_case(&tpc, ARCH_GPT2, sp, (Recompute)rc);
                check_case(&tpc, ARCH_LLAMA, sp, (Recompute)rc);
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
