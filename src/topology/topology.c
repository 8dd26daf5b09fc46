/* topology.c — the pure core: the mesh laid over the ranks, the groups of a
 * rank, and the placement rules (TP inside a node, stages across nodes).
 * No MPI here, so every layout can be checked for any world size. */
#include "core/error.h"
#include "topology/topology.h"

#include <stdarg.h>
#include <string.h>

static const char *const AXIS_NAMES[TOPO_AXES] = {"tp", "dp", "pp"};

const char *topology_axis_name(TopoAxis a) { return a >= 0 && a < TOPO_AXES ? AXIS_NAMES[a] : "?"; }

/* "tp-dp-pp" -> {TP, DP, PP}.  The config validates the string too; this
 * check keeps the core safe for callers that build a TopologyConfig by hand. */
static int parse_order(const char *s, TopoAxis order[TOPO_AXES])
{
    int seen = 0;
    for (int i = 0; i < TOPO_AXES; i++) {
        int a = 0;
        while (a < TOPO_AXES && strncmp(s, AXIS_NAMES[a], 2))
            a++;
        if (a == TOPO_AXES || (seen & (1 << a)))
            return -1;
        seen |= 1 << a;
        order[i] = (TopoAxis)a;
        s += 2;
        if (*s != (i < TOPO_AXES - 1 ? '-' : '\0'))
            return -1;
        s += i < TOPO_AXES - 1;
    }
    return 0;
}

void topology_coords_of(const Topology *t, int rank, int coord[TOPO_AXES])
{
    for (int a = 0; a < TOPO_AXES; a++)
        coord[a] = rank / t->stride[a] % t->size[a];
}

int topology_rank_of(const Topology *t, int tp, int dp, int pp)
{
    return tp * t->stride[TOPO_TP] + dp * t->stride[TOPO_DP] + pp * t->stride[TOPO_PP];
}

TopoGroup topology_group_of(const Topology *t, int rank, TopoAxis axis)
{
    int c = rank / t->stride[axis] % t->size[axis];
    return (TopoGroup){
        .first = rank - c * t->stride[axis], .stride = t->stride[axis], .size = t->size[axis]};
}

/* Sizes from the config: dp 0 means world / (tp * cp * pp). */
static int set_sizes(Topology *t, const TopologyConfig *tc, int world, char err[CFG_ERR])
{
    if (world < 1)
        return trd_errorf(err, "the world size (%d) must be >= 1", world);
    const int cp = tc->cp > 0 ? tc->cp : 1; /* 0: a config built by hand without cp */
    if (tc->tp < 1 || tc->pp < 1 || tc->dp < 0 || tc->cp < 0)
        return trd_errorf(err,
                          "topology.tp (%d), topology.pp (%d) and topology.cp (%d) must be >= 1 "
                          "and topology.dp (%d) >= 0 (0 = auto)",
                          tc->tp, tc->pp, tc->cp, tc->dp);
    long long mp = (long long)tc->tp * tc->pp * cp;
    int dp = tc->dp;
    if (dp == 0) {
        if (world % mp)
            return trd_errorf(err,
                              "the world size %d is not divisible by topology.tp (%d) x "
                              "topology.pp (%d) x topology.cp (%d) = %lld; launch a multiple "
                              "of %lld ranks",
                              world, tc->tp, tc->pp, cp, mp, mp);
        dp = (int)(world / mp);
    }
    if (mp * dp != world)
        return trd_errorf(err,
                          "topology.tp (%d) x topology.pp (%d) x topology.cp (%d) x "
                          "topology.dp (%d) = %lld but the world size is %d; set dp: auto or "
                          "launch %lld ranks",
                          tc->tp, tc->pp, cp, dp, mp * dp, world, mp * dp);
    t->world = world;
    t->cp = cp;
    t->size[TOPO_TP] = tc->tp;
    t->size[TOPO_DP] = dp * cp;
    t->size[TOPO_PP] = tc->pp;
    return 0;
}

static int set_nodes(Topology *t, int ranks_per_node, char err[CFG_ERR])
{
    if (ranks_per_node < 0)
        return trd_errorf(err, "ranks per node (%d) must be >= 1 (0 = all ranks on one node)",
                          ranks_per_node);
    int rpn = ranks_per_node ? ranks_per_node : t->world;
    if (t->world % rpn) {
        char d[256];
        trd_divisors(t->world, d, sizeof d);
        return trd_errorf(err,
                          "%d ranks per node do not divide the world size %d: every node must "
                          "run the same number of ranks; use a world size that is a multiple "
                          "of %d, or ranks per node one of %s",
                          rpn, t->world, rpn, d);
    }
    t->ranks_per_node = rpn;
    t->nodes = t->world / rpn;
    return 0;
}

static int set_order(Topology *t, const char *order, char err[CFG_ERR])
{
    if (parse_order(order, t->order))
        return trd_errorf(err,
                          "topology.order '%s' must name tp, dp and pp once each, fastest "
                          "first (e.g. tp-dp-pp)",
                          order);
    int stride = 1;
    for (int i = 0; i < TOPO_AXES; i++) {
        t->stride[t->order[i]] = stride;
        stride *= t->size[t->order[i]];
    }
    return 0;
}

/* The first TP group that spans two nodes, or -1 when all fit. */
static int tp_group_across_nodes(const Topology *t, int *node_a, int *node_b)
{
    for (int r = 0; r < t->world; r++) {
        TopoGroup g = topology_group_of(t, r, TOPO_TP);
        if (g.first != r)
            continue; /* each group once, from its first member */
        int n0 = topology_node_of(t, r);
        for (int i = 1; i < g.size; i++) {
            int n = topology_node_of(t, topology_member(g, i));
            if (n != n0) {
                *node_a = n0;
                *node_b = n;
                return r;
            }
        }
    }
    return -1;
}

static int check_tp_placement(Topology *t, const char *order, char err[CFG_ERR])
{
    int tp = t->size[TOPO_TP], rpn = t->ranks_per_node, na = 0, nb = 0;
    int first = tp_group_across_nodes(t, &na, &nb);
    t->tp_inside_node = first < 0;
    if (first < 0 || t->allow_tp_across_nodes)
        return 0;
    const char *fix = "TP groups must stay inside a node (NVLink)";
    const char *allow = "or set topology.allow_tp_across_nodes: true";
    if (tp > rpn)
        return trd_errorf(err,
                          "topology.tp %d does not fit in %d rank%s per node: %s; use tp <= %d, "
                          "%s",
                          tp, rpn, rpn > 1 ? "s" : "", fix, rpn, allow);
    if (t->order[0] == TOPO_TP) {
        char d[256];
        trd_divisors(rpn, d, sizeof d);
        return trd_errorf(err,
                          "topology.tp %d does not divide the %d ranks per node, so the TP "
                          "group of ranks %d-%d spans nodes %d and %d: %s; use tp one of %s, %s",
                          tp, rpn, first, first + tp - 1, na, nb, fix, d, allow);
    }
    TopoGroup g = topology_group_of(t, first, TOPO_TP);
    return trd_errorf(err,
                      "with topology.order %s the TP group of rank %d (ranks %d, %d, ... "
                      "stride %d) spans nodes %d and %d: %s; put tp first in topology.order "
                      "(e.g. tp-dp-pp), %s",
                      order, first, first, topology_member(g, 1), g.stride, na, nb, fix, allow);
}

/* The first rank whose node also holds another stage (the stage of the
 * node's first rank), or -1. */
static int rank_on_shared_node(const Topology *t, int *stage_a, int *stage_b)
{
    int pp = t->size[TOPO_PP];
    for (int r = 0; r < t->world; r++) {
        int head = topology_node_of(t, r) * t->ranks_per_node;
        *stage_a = head / t->stride[TOPO_PP] % pp;
        *stage_b = r / t->stride[TOPO_PP] % pp;
        if (*stage_a != *stage_b)
            return r;
    }
    return -1;
}

/* With at least pp nodes every stage can have nodes of its own, so that no
 * node hosts two stages and only activations cross the network between
 * stages.  With fewer nodes sharing is unavoidable and only recorded. */
static int check_stage_placement(Topology *t, const char *order, char err[CFG_ERR])
{
    int pp = t->size[TOPO_PP], s0 = 0, s1 = 0;
    int r = rank_on_shared_node(t, &s0, &s1);
    t->stages_share_nodes = r >= 0;
    if (r < 0 || t->nodes < pp)
        return 0;
    int node = topology_node_of(t, r);
    if (!strcmp(order, "tp-dp-pp"))
        return trd_errorf(err,
                          "pipeline stages %d and %d share node %d although there are %d "
                          "nodes for %d stages: a stage has tp x dp = %d ranks, not a multiple "
                          "of the %d ranks per node; choose dp (or the world size) so that "
                          "tp x dp is a multiple of %d",
                          s0, s1, node, t->nodes, pp, t->world / pp, t->ranks_per_node,
                          t->ranks_per_node);
    snprintf(t->warning, sizeof t->warning,
             "with topology.order %s pipeline stages %d and %d share node %d although there "
             "are %d nodes for %d stages; the default order tp-dp-pp puts stages on nodes of "
             "their own",
             order, s0, s1, node, t->nodes, pp);
    return 0;
}

int topology_build(Topology *t, const TopologyConfig *tc, int world, int ranks_per_node, int rank,
                   char err[CFG_ERR])
{
    memset(t, 0, sizeof *t);
    t->allow_tp_across_nodes = tc->allow_tp_across_nodes;
    if (set_sizes(t, tc, world, err) || set_nodes(t, ranks_per_node, err) ||
        set_order(t, tc->order, err) || check_tp_placement(t, tc->order, err) ||
        check_stage_placement(t, tc->order, err))
        return -1;
    if (rank < 0 || rank >= world)
        return trd_errorf(err, "rank %d is outside the world of %d ranks", rank, world);
    t->rank = rank;
    topology_coords_of(t, rank, t->coord);
    t->node = topology_node_of(t, rank);
    t->local_rank = rank % t->ranks_per_node;
    for (int a = 0; a < TOPO_AXES; a++)
        t->group[a] = topology_group_of(t, rank, (TopoAxis)a);
    t->cp_rank = t->coord[TOPO_DP] % t->cp;
    t->data_rank = t->coord[TOPO_DP] / t->cp;
    t->cp_group = (TopoGroup){.first = rank - t->cp_rank * t->stride[TOPO_DP],
                              .stride = t->stride[TOPO_DP],
                              .size = t->cp};
    return 0;
}

int topology_nodes_from_keys(const int *key, int world, char err[CFG_ERR])
{
    /* key[r] is the lowest world rank on r's node.  Block placement means
     * node n holds ranks n*rpn .. n*rpn + rpn-1, so every key must be the
     * first rank of its block. */
    int rpn = 1;
    while (rpn < world && key[rpn] == 0)
        rpn++;
    const char *fix = "launch the same number of ranks on every node with block distribution "
                      "(srun --distribution=block, mpiexec -ppn N), or set "
                      "topology.ranks_per_node";
    for (int r = 0; r < world; r++)
        if (key[r] != r / rpn * rpn)
            return trd_errorf(err,
                              "the ranks are not placed on nodes in blocks of consecutive "
                              "ranks (the first node holds %d rank%s, rank %d does not fit "
                              "that pattern); %s",
                              rpn, rpn > 1 ? "s" : "", r, fix);
    if (world % rpn)
        return trd_errorf(err,
                          "the nodes run different numbers of ranks (the first node holds %d, "
                          "the last %d); %s",
                          rpn, world % rpn, fix);
    return rpn;
}
