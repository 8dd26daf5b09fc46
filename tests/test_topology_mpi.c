/* test_topology_mpi.c — the live part on 4 real ranks: topology_init builds
 * communicators whose members are the groups worked out by hand.  Each rank
 * all-reduces its world rank over every group communicator; the sum must be
 * the sum of the expected members.
 *
 * Run as a plain unit test (one process), it re-executes itself under
 * `mpiexec -n 4` and exits with mpiexec's status. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "mpi_test.h"
#include "topology/topology.h"

#define WORLD 4

/* Sum of world ranks over a group communicator. */
static double group_sum(Comm *c, int rank)
{
    double v = rank;
    comm_allreduce_f64(c, &v, 1);
    return v;
}

typedef struct {
    const char *name;
    int tp, pp, dp, ranks_per_node;
    const char *order;
    /* Per world rank: the sum of the members of its TP, DP, PP,
     * model-parallel and embedding groups (-1: no embedding group). */
    int tp_sum[WORLD], dp_sum[WORLD], pp_sum[WORLD], mp_sum[WORLD], embed_sum[WORLD];
    int node[WORLD];
} Case;

static const Case CASES[] = {
    /* tp pairs {0,1},{2,3}; pp pairs {0,2},{1,3}; dp singletons; one replica. */
    {"tp2 pp2 dp1, 2 per node",
     2,
     2,
     1,
     2,
     "tp-dp-pp",
     {1, 1, 5, 5},
     {0, 1, 2, 3},
     {2, 4, 2, 4},
     {6, 6, 6, 6},
     {2, 4, 2, 4},
     {0, 0, 1, 1}},
    /* dp pairs {0,1},{2,3}; pp pairs {0,2},{1,3}; replicas {0,2} and {1,3};
     * ranks per node detected: all four on this machine. */
    {"tp1 pp2 dp2, detected",
     1,
     2,
     2,
     0,
     "tp-dp-pp",
     {0, 1, 2, 3},
     {1, 1, 5, 5},
     {2, 4, 2, 4},
     {2, 4, 2, 4},
     {2, 4, 2, 4},
     {0, 0, 0, 0}},
    /* One pipeline of 4 stages, one rank per node: the embedding group is
     * the first and the last stage, {0, 3}. */
    {"pp4, 1 per node",
     1,
     4,
     1,
     1,
     "tp-dp-pp",
     {0, 1, 2, 3},
     {0, 1, 2, 3},
     {6, 6, 6, 6},
     {6, 6, 6, 6},
     {3, -1, -1, 3},
     {0, 1, 2, 3}},
    /* dp fastest: dp pairs {0,1},{2,3}, tp pairs {0,2},{1,3}; no pipeline. */
    {"tp2 dp2 order dp-tp-pp",
     2,
     1,
     2,
     4,
     "dp-tp-pp",
     {2, 4, 2, 4},
     {1, 1, 5, 5},
     {0, 1, 2, 3},
     {2, 4, 2, 4},
     {-1, -1, -1, -1},
     {0, 0, 0, 0}},
};

static void run_case(const Case *k, Comm world)
{
    Config cfg;
    config_defaults(&cfg);
    TopologyConfig *tc = &cfg.topology;
    tc->tp = k->tp;
    tc->pp = k->pp;
    tc->dp = k->dp;
    tc->ranks_per_node = k->ranks_per_node;
    snprintf(tc->order, sizeof tc->order, "%s", k->order);

    Topology t;
    TopologyComms c;
    topology_init(&t, &c, &cfg.topology, world);
    int r = world.rank;
    CHECK(t.node == k->node[r], "%s: rank %d on node %d, want %d", k->name, r, t.node, k->node[r]);
    CHECK(c.world.size == WORLD, "%s: world comm of %d", k->name, c.world.size);
    CHECK(group_sum(&c.tp, r) == k->tp_sum[r], "%s: rank %d tp sum", k->name, r);
    CHECK(group_sum(&c.dp, r) == k->dp_sum[r], "%s: rank %d dp sum", k->name, r);
    CHECK(group_sum(&c.pp, r) == k->pp_sum[r], "%s: rank %d pp sum", k->name, r);
    CHECK(group_sum(&c.mp, r) == k->mp_sum[r], "%s: rank %d mp sum", k->name, r);
    if (k->embed_sum[r] < 0) {
        CHECK(!comm_is_member(&c.embed) && c.embed.size == 0 && c.embed.rank == -1,
              "%s: rank %d should have no embedding group", k->name, r);
    } else {
        CHECK(c.embed.size == 2, "%s: rank %d embedding group of %d", k->name, r, c.embed.size);
        if (c.embed.size == 2) {
            CHECK(c.embed.rank == (t.coord[TOPO_PP] == 0 ? 0 : 1), "%s: rank %d embedding rank %d",
                  k->name, r, c.embed.rank);
            CHECK(group_sum(&c.embed, r) == k->embed_sum[r], "%s: rank %d embed sum", k->name, r);
        }
    }
    topology_comms_free(&c);
    CHECK(!comm_is_member(&c.tp) && !comm_is_member(&c.mp), "%s: comms freed", k->name);
}

/* Expert parallelism: dp 4 with ep 2 gives the groups {0,1} and {2,3}
 * (consecutive dp ranks), and the all-to-alls of src/comm move what each
 * member addressed to each other one: ints, then floats in parts of
 * different lengths (p + 2q + 1 floats from p to q, valued 100p + q). */
static void run_ep(Comm world)
{
    Config cfg;
    config_defaults(&cfg);
    cfg.topology.dp = WORLD;
    cfg.topology.ep = 2;
    cfg.topology.ranks_per_node = WORLD;
    Topology t;
    TopologyComms c;
    topology_init(&t, &c, &cfg.topology, world);
    const int r = world.rank, q = c.ep.rank, n = c.ep.size;
    CHECK(n == 2 && q == r % 2, "ep: rank %d is %d of %d", r, q, n);
    CHECK(group_sum(&c.ep, r) == (r < 2 ? 1 : 5), "ep: rank %d ep sum", r);

    int send_i[2] = {10 * q, 10 * q + 1}, recv_i[2] = {-1, -1};
    comm_alltoall_i32(&c.ep, send_i, recv_i, 1);
    for (int p = 0; p < n; p++)
        CHECK(recv_i[p] == 10 * p + q, "ep: rank %d got %d from %d", r, recv_i[p], p);

    size_t sc[2], sd[2], rc[2], rd[2], at = 0, rat = 0;
    float send[8], recv[8];
    for (int d = 0; d < n; d++) { /* to d: q + 2d + 1 floats; from d: d + 2q + 1 */
        sc[d] = (size_t)(q + 2 * d + 1);
        sd[d] = at;
        for (size_t k = 0; k < sc[d]; k++)
            send[at++] = (float)(100 * q + d);
        rc[d] = (size_t)(d + 2 * q + 1);
        rd[d] = rat;
        rat += rc[d];
    }
    for (size_t k = 0; k < 8; k++)
        recv[k] = -1;
    const uint64_t before = c.ep.bytes_sent;
    comm_alltoallv_f32(&c.ep, send, sc, sd, recv, rc, rd);
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < rc[p]; k++)
            CHECK(recv[rd[p] + k] == (float)(100 * p + q), "ep: rank %d float %zu from %d is %g", r,
                  k, p, recv[rd[p] + k]);
    CHECK(c.ep.bytes_sent - before == sc[1 - q] * sizeof(float), "ep: rank %d counted %llu bytes",
          r, (unsigned long long)(c.ep.bytes_sent - before));
    topology_comms_free(&c);
}

int main(int argc, char **argv)
{
    if (!mpi_test_child())
        return mpi_test_relaunch("topology_mpi", 4);
    comm_init(&argc, &argv);
    alarm(60); /* a hung collective fails the test instead of stalling it */
    Comm world = comm_world();
    if (world.size != WORLD) {
        fprintf(stderr, "topology_mpi: needs %d ranks, got %d\n", WORLD, world.size);
        comm_finalize();
        return 1;
    }
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        run_case(&CASES[i], world);
    run_ep(world);

    int failed = check_failures;
    comm_allreduce_max_i32(&world, &failed, 1);
    int rc = check_summary("topology_mpi");
    comm_finalize();
    return rc || failed;
}
