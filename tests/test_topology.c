/* test_topology.c — rank maps against layouts worked out by hand from the
 * documented convention (TP fastest, then DP, then PP; first in
 * topology.order = fastest), the structural properties of every map, and the
 * errors of impossible meshes with their messages. */
#include <string.h>

#include "check.h"
#include "topology/topology.h"

static TopologyConfig mesh(int tp, int pp, int dp, const char *order)
{
    TopologyConfig tc;
    memset(&tc, 0, sizeof tc);
    tc.tp = tp;
    tc.pp = pp;
    tc.dp = dp;
    snprintf(tc.order, sizeof tc.order, "%s", order);
    return tc;
}

static int group_equals(TopoGroup g, const int *want, int n)
{
    if (g.size != n)
        return 0;
    for (int i = 0; i < n; i++)
        if (topology_member(g, i) != want[i])
            return 0;
    return 1;
}

/* want: n_groups groups of `size` ranks, each listed in coordinate order.
 * Every rank's group of `axis` must be the listed group that contains it. */
static void check_groups(const char *what, const TopologyConfig *tc, int world, int rpn,
                         TopoAxis axis, const int *want, int n_groups, int size)
{
    char err[CFG_ERR] = "";
    for (int r = 0; r < world; r++) {
        Topology t;
        int rc = topology_build(&t, tc, world, rpn, r, err);
        CHECK(rc == 0, "%s: rank %d: %s", what, r, err);
        if (rc)
            return;
        const int *mine = NULL;
        for (int g = 0; g < n_groups; g++)
            for (int i = 0; i < size; i++)
                if (want[g * size + i] == r)
                    mine = want + g * size;
        CHECK(mine != NULL, "%s: rank %d is in no expected %s group", what, r,
              topology_axis_name(axis));
        if (mine)
            CHECK(group_equals(t.group[axis], mine, size),
                  "%s: rank %d: %s group starts at %d stride %d size %d", what, r,
                  topology_axis_name(axis), t.group[axis].first, t.group[axis].stride,
                  t.group[axis].size);
    }
}

/* Properties every map has: rank <-> coordinates is a bijection; a rank is
 * in exactly one group per axis (its group's members all name the same
 * group); members share the other two coordinates and member i has
 * coordinate i on the group's axis. */
static void check_structure(const char *what, const TopologyConfig *tc, int world, int rpn)
{
    char err[CFG_ERR] = "";
    Topology t;
    if (topology_build(&t, tc, world, rpn, 0, err)) {
        CHECK(0, "%s: %s", what, err);
        return;
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int c[TOPO_AXES];
        topology_coords_of(&t, r, c);
        bad += topology_rank_of(&t, c[TOPO_TP], c[TOPO_DP], c[TOPO_PP]) != r;
        for (int a = 0; a < TOPO_AXES; a++) {
            TopoGroup g = topology_group_of(&t, r, (TopoAxis)a);
            int contains = 0;
            for (int i = 0; i < g.size; i++) {
                int m = topology_member(g, i), mc[TOPO_AXES];
                contains += m == r;
                bad += m < 0 || m >= world;
                bad += topology_group_of(&t, m, (TopoAxis)a).first != g.first;
                topology_coords_of(&t, m, mc);
                for (int b = 0; b < TOPO_AXES; b++)
                    bad += b == a ? mc[b] != i : mc[b] != c[b];
            }
            bad += contains != 1;
        }
    }
    CHECK(bad == 0, "%s: %d structural violations", what, bad);
}

static Topology built(const TopologyConfig *tc, int world, int rpn, int rank)
{
    Topology t;
    char err[CFG_ERR] = "";
    int rc = topology_build(&t, tc, world, rpn, rank, err);
    CHECK(rc == 0, "build world %d rank %d: %s", world, rank, err);
    return t;
}

/* 16 ranks on 2 nodes of 8, tp 2, pp 4, dp auto = 2 (Megatron's example). */
static void test_megatron_16(void)
{
    TopologyConfig tc = mesh(2, 4, 0, "tp-dp-pp");
    static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static const int dp[] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    static const int pp[] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    check_groups("16r", &tc, 16, 8, TOPO_TP, tp, 8, 2);
    check_groups("16r", &tc, 16, 8, TOPO_DP, dp, 8, 2);
    check_groups("16r", &tc, 16, 8, TOPO_PP, pp, 4, 4);
    check_structure("16r", &tc, 16, 8);

    Topology t = built(&tc, 16, 8, 5);
    CHECK(t.coord[TOPO_TP] == 1 && t.coord[TOPO_DP] == 0 && t.coord[TOPO_PP] == 1,
          "rank 5 at (%d,%d,%d), want (1,0,1)", t.coord[0], t.coord[1], t.coord[2]);
    CHECK(t.size[TOPO_DP] == 2 && t.nodes == 2 && t.ranks_per_node == 8, "dp %d nodes %d rpn %d",
          t.size[TOPO_DP], t.nodes, t.ranks_per_node);
    t = built(&tc, 16, 8, 14);
    CHECK(t.coord[TOPO_TP] == 0 && t.coord[TOPO_DP] == 1 && t.coord[TOPO_PP] == 3,
          "rank 14 at (%d,%d,%d), want (0,1,3)", t.coord[0], t.coord[1], t.coord[2]);
    CHECK(t.node == 1 && t.local_rank == 6, "rank 14 node %d local %d", t.node, t.local_rank);
    CHECK(topology_rank_of(&t, 1, 1, 2) == 11, "rank_of(1,1,2) = %d",
          topology_rank_of(&t, 1, 1, 2));
    /* Stages 0, 1 on node 0 and 2, 3 on node 1: fewer nodes than stages, so
     * sharing is expected and no error; TP pairs never straddle the nodes. */
    CHECK(t.tp_inside_node == 1 && t.stages_share_nodes == 1 && t.warning[0] == '\0',
          "tp inside %d share %d warning '%s'", t.tp_inside_node, t.stages_share_nodes, t.warning);
    for (int s = 0; s < 4; s++)
        for (int r = 4 * s; r < 4 * s + 4; r++)
            CHECK(topology_node_of(&t, r) == s / 2 && r / 4 == s, "rank %d of stage %d on node %d",
                  r, s, topology_node_of(&t, r));

    /* The same mesh on 4 nodes of 4: one node per stage. */
    t = built(&tc, 16, 4, 0);
    CHECK(t.nodes == 4 && t.stages_share_nodes == 0, "4 nodes: share %d", t.stages_share_nodes);
}

/* 8 ranks, tp 2, pp 2, dp 2 on 2 nodes of 4. */
static void test_8_ranks(void)
{
    TopologyConfig tc = mesh(2, 2, 2, "tp-dp-pp");
    static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int dp[] = {0, 2, 1, 3, 4, 6, 5, 7};
    static const int pp[] = {0, 4, 1, 5, 2, 6, 3, 7};
    check_groups("8r", &tc, 8, 4, TOPO_TP, tp, 4, 2);
    check_groups("8r", &tc, 8, 4, TOPO_DP, dp, 4, 2);
    check_groups("8r", &tc, 8, 4, TOPO_PP, pp, 4, 2);
    check_structure("8r", &tc, 8, 4);
    Topology t = built(&tc, 8, 4, 6);
    CHECK(t.coord[TOPO_TP] == 0 && t.coord[TOPO_DP] == 1 && t.coord[TOPO_PP] == 1 && t.node == 1 &&
              t.local_rank == 2,
          "rank 6 at (%d,%d,%d) node %d local %d", t.coord[0], t.coord[1], t.coord[2], t.node,
          t.local_rank);
    CHECK(t.stages_share_nodes == 0 && t.warning[0] == '\0', "stage 0 on node 0, 1 on node 1");
}

/* Custom orders: the first axis named is the fastest. */
static void test_custom_orders(void)
{
    TopologyConfig tc = mesh(2, 2, 2, "dp-tp-pp");
    static const int tp[] = {0, 2, 1, 3, 4, 6, 5, 7};
    static const int dp[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int pp[] = {0, 4, 1, 5, 2, 6, 3, 7};
    check_groups("dp-tp-pp", &tc, 8, 8, TOPO_TP, tp, 4, 2);
    check_groups("dp-tp-pp", &tc, 8, 8, TOPO_DP, dp, 4, 2);
    check_groups("dp-tp-pp", &tc, 8, 8, TOPO_PP, pp, 4, 2);
    check_structure("dp-tp-pp", &tc, 8, 8);
    Topology t = built(&tc, 8, 8, 6);
    CHECK(t.coord[TOPO_DP] == 0 && t.coord[TOPO_TP] == 1 && t.coord[TOPO_PP] == 1,
          "dp-tp-pp rank 6 at (%d,%d,%d), want tp 1 dp 0 pp 1", t.coord[0], t.coord[1], t.coord[2]);

    tc = mesh(2, 2, 2, "tp-pp-dp");
    static const int tp2[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int pp2[] = {0, 2, 1, 3, 4, 6, 5, 7};
    static const int dp2[] = {0, 4, 1, 5, 2, 6, 3, 7};
    check_groups("tp-pp-dp", &tc, 8, 8, TOPO_TP, tp2, 4, 2);
    check_groups("tp-pp-dp", &tc, 8, 8, TOPO_PP, pp2, 4, 2);
    check_groups("tp-pp-dp", &tc, 8, 8, TOPO_DP, dp2, 4, 2);

    /* Uneven sizes, every order: structure only. */
    static const char *orders[] = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                   "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};
    for (int i = 0; i < 6; i++) {
        tc = mesh(2, 3, 4, orders[i]);
        tc.allow_tp_across_nodes = 1;
        check_structure(orders[i], &tc, 24, 4);
    }
}

static void test_single_rank(void)
{
    TopologyConfig tc = mesh(1, 1, 0, "tp-dp-pp");
    Topology t = built(&tc, 1, 0, 0);
    CHECK(t.size[TOPO_DP] == 1 && t.nodes == 1 && t.ranks_per_node == 1 && t.node == 0 &&
              t.local_rank == 0,
          "single rank: dp %d nodes %d rpn %d", t.size[TOPO_DP], t.nodes, t.ranks_per_node);
    static const int zero[] = {0};
    for (int a = 0; a < TOPO_AXES; a++)
        CHECK(group_equals(t.group[a], zero, 1) && t.coord[a] == 0, "axis %d", a);
}

/* build must fail and its message contain every one of want[]. */
static void expect_error(const char *what, const TopologyConfig *tc, int world, int rpn,
                         const char *const *want, int n)
{
    Topology t;
    char err[CFG_ERR] = "";
    int rc = topology_build(&t, tc, world, rpn, 0, err);
    CHECK(rc == -1, "%s: expected an error, got none", what);
    for (int i = 0; i < n; i++)
        CHECK(strstr(err, want[i]) != NULL, "%s: message '%s' lacks '%s'", what, err, want[i]);
}

static void test_errors(void)
{
    TopologyConfig tc = mesh(4, 1, 0, "tp-dp-pp");
    const char *exact = "topology.tp 4 does not fit in 2 ranks per node: TP groups must stay "
                        "inside a node (NVLink); use tp <= 2, or set "
                        "topology.allow_tp_across_nodes: true";
    Topology t;
    char err[CFG_ERR] = "";
    CHECK(topology_build(&t, &tc, 8, 2, 0, err) == -1 && !strcmp(err, exact),
          "tp across nodes: got '%s'", err);
    tc.allow_tp_across_nodes = 1;
    t = built(&tc, 8, 2, 0);
    CHECK(t.tp_inside_node == 0, "allowed tp 4 over nodes of 2 still spans nodes");

    tc = mesh(4, 1, 0, "tp-dp-pp"); /* 12 ranks, 6 per node: ranks 4-7 straddle */
    const char *not_divide[] = {"topology.tp 4 does not divide the 6 ranks per node",
                                "ranks 4-7 spans nodes 0 and 1", "use tp one of 1, 2, 3, 6",
                                "allow_tp_across_nodes: true"};
    expect_error("tp vs rpn", &tc, 12, 6, not_divide, 4);
    tc.allow_tp_across_nodes = 1;
    built(&tc, 12, 6, 0);

    tc = mesh(2, 2, 3, "tp-dp-pp");
    const char *product[] = {"topology.dp (3) = 12 but the world size is 8", "dp: auto"};
    expect_error("product", &tc, 8, 0, product, 2);
    tc = mesh(4, 1, 0, "tp-dp-pp");
    const char *auto_dp[] = {"world size 6 is not divisible by topology.tp (4) x topology.pp (1)"};
    expect_error("auto dp", &tc, 6, 0, auto_dp, 1);

    tc = mesh(1, 1, 0, "tp-dp-pp");
    const char *rpn[] = {"3 ranks per node do not divide the world size 8",
                         "ranks per node one of 1, 2, 4, 8"};
    expect_error("rpn", &tc, 8, 3, rpn, 2);
    expect_error("rpn > world", &tc, 4, 8, rpn, 0);

    tc = mesh(2, 2, 2, "tp-tp-pp");
    const char *order[] = {"topology.order 'tp-tp-pp' must name tp, dp and pp once each"};
    expect_error("order", &tc, 8, 0, order, 1);

    /* dp fastest puts the TP pair {0, 2} on nodes 0 and 1 of 2 ranks each. */
    tc = mesh(2, 2, 2, "dp-tp-pp");
    const char *strided[] = {"with topology.order dp-tp-pp the TP group of rank 0",
                             "spans nodes 0 and 1", "put tp first in topology.order"};
    expect_error("order vs nodes", &tc, 8, 2, strided, 3);
    tc.allow_tp_across_nodes = 1;
    built(&tc, 8, 2, 0);
}

/* 12 ranks on 6 nodes of 2 with pp 4: stages of 3 ranks, so stage 0 (ranks
 * 0-2) and stage 1 (3-5) share node 1 (ranks 2, 3). */
static void test_stage_placement(void)
{
    TopologyConfig tc = mesh(1, 4, 0, "tp-dp-pp");
    const char *want[] = {"pipeline stages 0 and 1 share node 1", "tp x dp = 3", "multiple of 2"};
    expect_error("stages", &tc, 12, 2, want, 3);

    /* The same mesh with a custom order (identical here since tp is 1): a
     * warning, not an error. */
    tc = mesh(1, 4, 0, "dp-tp-pp");
    Topology t = built(&tc, 12, 2, 0);
    CHECK(t.stages_share_nodes == 1 && strstr(t.warning, "stages 0 and 1 share node 1"),
          "custom order: share %d warning '%s'", t.stages_share_nodes, t.warning);

    /* 3 nodes of 4 for pp 3 with tp 2 dp 2: one node per stage, no warning. */
    tc = mesh(2, 3, 0, "tp-dp-pp");
    t = built(&tc, 12, 4, 0);
    CHECK(t.stages_share_nodes == 0 && !t.warning[0], "pp 3 on 3 nodes");
}

static void test_node_keys(void)
{
    char err[CFG_ERR] = "";
    static const int blocks[] = {0, 0, 2, 2}, one[] = {0, 0, 0, 0}, solo[] = {0};
    static const int cyclic[] = {0, 1, 0, 1}, uneven[] = {0, 0, 0, 3}, back[] = {0, 0, 2, 2, 0, 0};
    CHECK(topology_nodes_from_keys(blocks, 4, err) == 2, "2 nodes of 2: %s", err);
    CHECK(topology_nodes_from_keys(one, 4, err) == 4, "1 node of 4: %s", err);
    CHECK(topology_nodes_from_keys(solo, 1, err) == 1, "1 rank: %s", err);
    CHECK(topology_nodes_from_keys(cyclic, 4, err) == -1 &&
              strstr(err, "not placed on nodes in blocks") && strstr(err, "rank 2 does not fit"),
          "round robin: '%s'", err);
    CHECK(topology_nodes_from_keys(uneven, 4, err) == -1 &&
              strstr(err, "the first node holds 3, the last 1"),
          "uneven: '%s'", err);
    CHECK(topology_nodes_from_keys(back, 6, err) == -1 && strstr(err, "rank 4 does not fit"),
          "node met twice: '%s'", err);
}

static void test_print_map(void)
{
    TopologyConfig tc = mesh(2, 4, 0, "tp-dp-pp");
    char err[CFG_ERR] = "", text[8192] = "";
    FILE *f = tmpfile();
    CHECK(f != NULL, "tmpfile");
    if (!f)
        return;
    CHECK(topology_print_map(f, &tc, 16, 8, TOPO_MAP_SUMMARY, err) == 0, "%s", err);
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    CHECK(strstr(text, "TP groups inside one node: yes") != NULL, "summary: %s", text);
    CHECK(strstr(text, "stage 0 on node 0; stage 1 on node 0; stage 2 on node 1; stage 3 on "
                       "node 1") != NULL,
          "summary: %s", text);
    tc.tp = 3;
    CHECK(topology_print_map(stdout, &tc, 16, 8, TOPO_MAP_TABLE, err) == -1, "tp 3 of 16");
}

int main(void)
{
    test_megatron_16();
    test_8_ranks();
    test_custom_orders();
    test_single_rank();
    test_errors();
    test_stage_placement();
    test_node_keys();
    test_print_map();
    return check_summary("topology");
}
