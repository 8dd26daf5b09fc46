/* topology_mpi.c — the live part: which node each rank runs on, then the
 * group communicators, created once at start.
 *
 * Node detection gives every rank a key, the lowest world rank on its node,
 * and gathers the keys, so all ranks see the same placement and reach the
 * same verdict (a failure on one rank and not another would leave the others
 * waiting in the next collective).  The key comes from Slurm's per-task
 * environment when it is present and consistent, else from MPI's
 * shared-memory split; topology.ranks_per_node > 0 skips detection. */
#include "topology/topology.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

/* An environment variable that is a plain non-negative integer, else -1
 * (absent, or e.g. SLURM_NTASKS_PER_NODE "4(x2),3" on uneven nodes). */
static int env_int(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return -1;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || *end || v < 0 || v > INT_MAX ? -1 : (int)v;
}

/* The lowest world rank of a node communicator: its rank 0, since members
 * are ordered by world rank. */
static int lowest_world_rank(Comm *node, int world_rank)
{
    int lowest = world_rank;
    comm_broadcast(node, &lowest, sizeof lowest, 0);
    return lowest;
}

/* Slurm's SLURM_NODEID / SLURM_LOCALID describe this task only under srun;
 * under an mpiexec inside an allocation every rank inherits the same values.
 * MPI is the source of truth for rank and world: Slurm's SLURM_PROCID and
 * SLURM_NTASKS, when set, must agree with them.  Accept the node ids only
 * when, on every node, the local ids are 0..n-1 once each (and n matches
 * SLURM_NTASKS_PER_NODE when that is a plain number).
 * Returns the key, or -1 on every rank when Slurm cannot be trusted. */
static int slurm_node_key(Comm *world)
{
    int node_id = env_int("SLURM_NODEID"), local_id = env_int("SLURM_LOCALID");
    int per_node = env_int("SLURM_NTASKS_PER_NODE");
    int procid = env_int("SLURM_PROCID"), ntasks = env_int("SLURM_NTASKS");
    int bad = node_id < 0 || local_id < 0 || (procid >= 0 && procid != world->rank) ||
              (ntasks >= 0 && ntasks != world->size);
    comm_allreduce_max_i32(world, &bad, 1);
    if (bad)
        return -1;
    Comm node = comm_split(world, node_id, world->rank);
    int *seen = trd_malloc((size_t)node.size * sizeof *seen, "Slurm local ids");
    for (int i = 0; i < node.size; i++)
        seen[i] = -1;
    if (local_id < node.size)
        seen[local_id] = node.rank;
    comm_allreduce_max_i32(&node, seen, (size_t)node.size);
    for (int i = 0; i < node.size; i++)
        bad |= seen[i] < 0;
    bad |= per_node >= 0 && per_node != node.size;
    free(seen);
    int key = lowest_world_rank(&node, world->rank);
    comm_free(&node);
    comm_allreduce_max_i32(world, &bad, 1);
    return bad ? -1 : key;
}

static int shared_memory_node_key(Comm *world)
{
    Comm node = comm_split_node(world);
    int key = lowest_world_rank(&node, world->rank);
    comm_free(&node);
    return key;
}

/* One message for an error every rank found alike: rank 0 prints it and
 * aborts the job; the others wait for that abort instead of printing the
 * same lines world-size times. */
static _Noreturn void fail_once(Comm *world, const char *err)
{
    if (world->rank == 0)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    comm_barrier(world);
    trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err); /* not reached: rank 0 aborted the job */
}

/* Detected ranks per node, the same on every rank; a placement the layout
 * cannot use ends the job with exit code 2.  *from_slurm: whether Slurm's
 * variables placed the ranks (the same answer on every rank). */
static int detect_ranks_per_node(Comm *world, int *from_slurm)
{
    int key = slurm_node_key(world);
    *from_slurm = key >= 0;
    if (key < 0)
        key = shared_memory_node_key(world);
    /* All-gather by max: every slot starts at -1 and keys are >= 0. */
    int *keys = trd_malloc((size_t)world->size * sizeof *keys, "node keys");
    for (int r = 0; r < world->size; r++)
        keys[r] = -1;
    keys[world->rank] = key;
    comm_allreduce_max_i32(world, keys, (size_t)world->size);
    char err[CFG_ERR];
    int rpn = topology_nodes_from_keys(keys, world->size, err);
    free(keys);
    if (rpn < 0)
        fail_once(world, err);
    return rpn;
}

static void create_comms(const Topology *t, TopologyComms *c, Comm world, int ep)
{
    const int *x = t->coord;
    c->world = world;
    c->tp = comm_split(&world, t->group[TOPO_TP].first, x[TOPO_TP]);
    c->dp = comm_split(&world, t->group[TOPO_DP].first, x[TOPO_DP]);
    c->pp = comm_split(&world, t->group[TOPO_PP].first, x[TOPO_PP]);
    c->cp = comm_split(&world, t->cp_group.first, t->cp_rank);
    c->mp = comm_split(&world, x[TOPO_DP], x[TOPO_PP] * t->size[TOPO_TP] + x[TOPO_TP]);
    /* Expert parallel (Megatron-LM's layout): ep consecutive dp ranks; the
     * world rank of the group's first member names it. */
    TRD_ASSERT(ep >= 1 && t->size[TOPO_DP] % ep == 0);
    const int ep_first = x[TOPO_DP] / ep * ep;
    c->ep =
        comm_split(&world, topology_rank_of(t, x[TOPO_TP], ep_first, x[TOPO_PP]), x[TOPO_DP] % ep);
    /* Expert data parallel: the dp / ep ranks holding the same experts
     * (dp rank % ep equal), named by the first of them. */
    c->edp = comm_split(&world, topology_rank_of(t, x[TOPO_TP], x[TOPO_DP] % ep, x[TOPO_PP]),
                        x[TOPO_DP] / ep);
    /* Tied embeddings live on the first stage (input) and the last (output
     * head); their gradients are summed between exactly those two ranks. */
    int pp = t->size[TOPO_PP], end = x[TOPO_PP] == 0 || x[TOPO_PP] == pp - 1;
    int color = pp > 1 && end ? topology_rank_of(t, x[TOPO_TP], x[TOPO_DP], 0) : -1;
    c->embed = comm_split(&world, color, x[TOPO_PP] == 0 ? 0 : 1);
    comm_set_name(&c->tp, "tp");
    comm_set_name(&c->dp, "dp");
    comm_set_name(&c->cp, "cp");
    comm_set_name(&c->pp, "pp");
    comm_set_name(&c->mp, "mp");
    comm_set_name(&c->ep, "ep");
    comm_set_name(&c->edp, "edp");
    comm_set_name(&c->embed, "embed");

    TRD_ASSERT(c->tp.rank == x[TOPO_TP] && c->tp.size == t->size[TOPO_TP]);
    TRD_ASSERT(c->dp.rank == x[TOPO_DP] && c->dp.size == t->size[TOPO_DP]);
    TRD_ASSERT(c->pp.rank == x[TOPO_PP] && c->pp.size == pp);
    TRD_ASSERT(c->mp.size == t->size[TOPO_TP] * pp);
    TRD_ASSERT(c->ep.size == ep && c->ep.rank == x[TOPO_DP] % ep);
    TRD_ASSERT(c->edp.size == t->size[TOPO_DP] / ep && c->edp.rank == x[TOPO_DP] / ep);
}

/* This rank's node name: Slurm's name for the node when Slurm placed the
 * ranks (several slurmd may share one host, as in slurm/cluster), else the
 * host name. */
static void node_name(int from_slurm, char name[TOPO_NAME])
{
    const char *s = from_slurm ? getenv("SLURMD_NODENAME") : NULL;
    if (s && *s)
        snprintf(name, TOPO_NAME, "%s", s);
    else if (gethostname(name, TOPO_NAME - 1) != 0)
        snprintf(name, TOPO_NAME, "?");
    name[TOPO_NAME - 1] = '\0';
}

/* Gather every node's name on rank 0 (the first rank of each node speaks
 * for it) and record the placement for the printed map. */
static void record_live(Comm *world, int rpn, int from_slurm, const char *source)
{
    char mine[TOPO_NAME] = {0};
    node_name(from_slurm, mine);
    char *all = trd_malloc((size_t)world->size * TOPO_NAME, "node names");
    comm_allgather_bytes(world, mine, all, TOPO_NAME);
    const int nodes = world->size / rpn;
    for (int n = 1; all && n < nodes; n++)
        memmove(all + (size_t)n * TOPO_NAME, all + (size_t)n * rpn * TOPO_NAME, TOPO_NAME);
    topology_set_live(world->size, rpn, source, world->rank == 0 ? all : NULL, nodes);
    free(all);
}

void topology_init(Topology *t, TopologyComms *c, const TopologyConfig *tc, Comm world)
{
    int from_slurm = 0;
    int rpn =
        tc->ranks_per_node > 0 ? tc->ranks_per_node : detect_ranks_per_node(&world, &from_slurm);
    char err[CFG_ERR];
    if (topology_build(t, tc, world.size, rpn, world.rank, err))
        fail_once(&world, err);
    const char *source = tc->ranks_per_node > 0 ? "nodes from topology.ranks_per_node"
                         : from_slurm ? "nodes from Slurm (SLURM_NODEID, SLURM_LOCALID), rank "
                                        "and world from MPI"
                                      : "nodes from MPI's shared-memory split";
    record_live(&world, rpn, from_slurm, source);
    create_comms(t, c, world, tc->ep);
}

void topology_comms_free(TopologyComms *c)
{
    topology_set_live(0, 0, NULL, NULL, 0);
    comm_free(&c->tp);
    comm_free(&c->dp);
    comm_free(&c->cp);
    comm_free(&c->pp);
    comm_free(&c->mp);
    comm_free(&c->ep);
    comm_free(&c->edp);
    comm_free(&c->embed);
    comm_free(&c->world); /* the world stays; its NCCL communicator (if any) goes */
}
