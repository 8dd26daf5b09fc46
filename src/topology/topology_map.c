/* topology_map.c — the rank map as text: a summary and one line per rank, or
 * one JSON object.  Printed by `trident topology` and by the trainer on rank 0
 * at start, from the same pure core, so what is printed is what runs. */
#include "topology/topology.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* What topology_init found about the running job (topology_set_live). */
static struct {
    int world, ranks_per_node, nodes;
    char source[128];
    char *names; /* nodes * TOPO_NAME, or NULL */
} live;

void topology_set_live(int world, int ranks_per_node, const char *source, const char *names,
                       int nodes)
{
    free(live.names);
    memset(&live, 0, sizeof live);
    if (world <= 0)
        return;
    live.world = world;
    live.ranks_per_node = ranks_per_node;
    snprintf(live.source, sizeof live.source, "%s", source ? source : "");
    if (names && nodes > 0) {
        live.nodes = nodes;
        live.names = trd_malloc((size_t)nodes * TOPO_NAME, "node names");
        memcpy(live.names, names, (size_t)nodes * TOPO_NAME);
    }
}

/* The recorded name of node n of the map t, or NULL when t is not the
 * live layout (e.g. `trident topology`). */
static const char *live_name(const Topology *t, int node)
{
    if (!live.names || live.world != t->world || live.ranks_per_node != t->ranks_per_node ||
        node >= live.nodes)
        return NULL;
    return live.names + (size_t)node * TOPO_NAME;
}

/* "placement: ...; nodes: 0 node1 (ranks 0-3), 1 node2 (ranks 4-7)" for
 * the live layout; the first 16 nodes, then a count. */
static void print_live(FILE *f, const Topology *t)
{
    if (live.world != t->world || live.ranks_per_node != t->ranks_per_node)
        return;
    fprintf(f, "placement: %s; a GPU run uses device <local rank>\n", live.source);
    if (!live_name(t, 0))
        return;
    fprintf(f, "nodes:");
    for (int n = 0; n < t->nodes && n < 16; n++)
        fprintf(f, "%s %d %s (ranks %d-%d)", n ? "," : "", n, live_name(t, n),
                n * t->ranks_per_node, (n + 1) * t->ranks_per_node - 1);
    if (t->nodes > 16)
        fprintf(f, ", ... (%d nodes)", t->nodes);
    fputc('\n', f);
}

/* Members of a group for the table: all of them when few, else the first
 * two, the last and the count. */
static void group_text(TopoGroup g, char *buf, size_t size)
{
    if (g.size > 8) {
        snprintf(buf, size, "%d,%d,...,%d (%d)", g.first, topology_member(g, 1),
                 topology_member(g, g.size - 1), g.size);
        return;
    }
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < g.size && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%d", i ? "," : "", topology_member(g, i));
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

static void group_json(FILE *f, TopoGroup g)
{
    fputc('[', f);
    for (int i = 0; i < g.size; i++)
        fprintf(f, "%s%d", i ? ", " : "", topology_member(g, i));
    fputc(']', f);
}

static int node_holds_stage(const Topology *t, int node, int stage)
{
    for (int r = node * t->ranks_per_node; r < (node + 1) * t->ranks_per_node; r++)
        if (r / t->stride[TOPO_PP] % t->size[TOPO_PP] == stage)
            return 1;
    return 0;
}

/* The nodes of one stage: "0-3, 6" in text, [0, 1, 2, 3, 6] in JSON. */
static void stage_nodes(FILE *f, const Topology *t, int stage, int json)
{
    int printed = 0;
    for (int n = 0; n < t->nodes; n++) {
        if (!node_holds_stage(t, n, stage))
            continue;
        if (json) {
            fprintf(f, "%s%d", printed++ ? ", " : "", n);
            continue;
        }
        int last = n;
        while (last + 1 < t->nodes && node_holds_stage(t, last + 1, stage))
            last++;
        fprintf(f, "%s%d", printed++ ? ", " : "", n);
        if (last > n)
            fprintf(f, "-%d", last);
        n = last;
    }
}

/* 1 when every cp group lies on one node. */
static int cp_inside_node(const Topology *t)
{
    const int last = (t->cp - 1) * t->stride[TOPO_DP];
    for (int r = 0; r < t->world; r++) {
        int c[TOPO_AXES];
        topology_coords_of(t, r, c);
        const int first = r - c[TOPO_DP] % t->cp * t->stride[TOPO_DP];
        if (topology_node_of(t, first) != topology_node_of(t, first + last))
            return 0;
    }
    return 1;
}

static void print_summary(FILE *f, const Topology *t, const char *order)
{
    int tp = t->size[TOPO_TP], dp = t->size[TOPO_DP], pp = t->size[TOPO_PP], cp = t->cp;
    if (cp > 1)
        fprintf(f,
                "rank map: world %d = tp %d x cp %d x dp %d x pp %d, order %s (fastest first; "
                "cp is the fastest part of dp), %d node%s x %d ranks\n",
                t->world, tp, cp, dp / cp, pp, order, t->nodes, t->nodes == 1 ? "" : "s",
                t->ranks_per_node);
    else
        fprintf(f,
                "rank map: world %d = tp %d x dp %d x pp %d, order %s (fastest first), "
                "%d node%s x %d ranks\n",
                t->world, tp, dp, pp, order, t->nodes, t->nodes == 1 ? "" : "s", t->ranks_per_node);
    fprintf(f,
            "groups: %d TP of %d, %d DP%s of %d, %d PP of %d, %d model-parallel (tp x pp) "
            "of %d, ",
            dp * pp, tp, tp * pp, cp > 1 ? " (dp x cp)" : "", dp, tp * dp, pp, dp, tp * pp);
    if (pp > 1)
        fprintf(f, "%d embedding (first + last stage) of 2\n", tp * dp);
    else
        fprintf(f, "no embedding groups (pp 1)\n");
    fprintf(f, "TP groups inside one node: %s\n",
            t->tp_inside_node ? "yes" : "no (allowed by topology.allow_tp_across_nodes)");
    if (cp > 1)
        fprintf(f,
                "CP groups: %d of %d (ranks %d apart, inside each DP group of %d), inside one "
                "node: %s\n",
                t->world / cp, cp, t->stride[TOPO_DP], dp, cp_inside_node(t) ? "yes" : "no");
    fprintf(f, "pipeline stages:");
    for (int s = 0; s < pp; s++) {
        int n_nodes = 0;
        for (int n = 0; n < t->nodes; n++)
            n_nodes += node_holds_stage(t, n, s);
        fprintf(f, "%s stage %d on node%s ", s ? ";" : "", s, n_nodes > 1 ? "s" : "");
        stage_nodes(f, t, s, 0);
    }
    fputc('\n', f);
    if (t->nodes < pp)
        fprintf(f, "stages on nodes of their own: not possible (%d node%s for %d stages)\n",
                t->nodes, t->nodes == 1 ? "" : "s", pp);
    else
        fprintf(f, "stages on nodes of their own: %s\n", t->stages_share_nodes ? "no" : "yes");
    if (t->warning[0])
        fprintf(f, "warning: %s\n", t->warning);
    print_live(f, t);
}

/* With the live node names, a host column after the node number. */
static void print_table(FILE *f, const Topology *t)
{
    const int hosts = live_name(t, 0) != NULL;
    fprintf(f, "\n%5s %5s", "rank", "node");
    if (hosts)
        fprintf(f, " %-12s", "host");
    fprintf(f, " %6s %4s %4s %4s  %-20s %-20s %s\n", "local", "tp", "dp", "pp", "tp group",
            "dp group", "pp group");
    for (int r = 0; r < t->world; r++) {
        int c[TOPO_AXES];
        char g[TOPO_AXES][64];
        topology_coords_of(t, r, c);
        for (int a = 0; a < TOPO_AXES; a++)
            group_text(topology_group_of(t, r, (TopoAxis)a), g[a], sizeof g[a]);
        fprintf(f, "%5d %5d", r, topology_node_of(t, r));
        if (hosts)
            fprintf(f, " %-12s", live_name(t, topology_node_of(t, r)));
        fprintf(f, " %6d %4d %4d %4d  %-20s %-20s %s\n", r % t->ranks_per_node, c[TOPO_TP],
                c[TOPO_DP], c[TOPO_PP], g[TOPO_TP], g[TOPO_DP], g[TOPO_PP]);
    }
}

/* A JSON string; the texts printed here hold no control characters, but
 * quotes and backslashes are escaped all the same. */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void print_json(FILE *f, const Topology *t, const char *order)
{
    fprintf(f, "{\"world\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d, \"order\": ", t->world,
            t->size[TOPO_TP], t->size[TOPO_PP], t->size[TOPO_DP]);
    json_string(f, order);
    fprintf(f,
            ", \"ranks_per_node\": %d, \"nodes\": %d, \"tp_inside_node\": %s, "
            "\"stages_share_nodes\": %s, \"stage_nodes\": [",
            t->ranks_per_node, t->nodes, t->tp_inside_node ? "true" : "false",
            t->stages_share_nodes ? "true" : "false");
    for (int s = 0; s < t->size[TOPO_PP]; s++) {
        fprintf(f, "%s[", s ? ", " : "");
        stage_nodes(f, t, s, 1);
        fputc(']', f);
    }
    fprintf(f, "], \"warning\": ");
    if (t->warning[0])
        json_string(f, t->warning);
    else
        fputs("null", f);
    fprintf(f, ",\n \"ranks\": [\n");
    for (int r = 0; r < t->world; r++) {
        int c[TOPO_AXES];
        topology_coords_of(t, r, c);
        fprintf(f,
                "  {\"rank\": %d, \"node\": %d, \"local_rank\": %d, \"tp\": %d, \"dp\": %d, "
                "\"pp\": %d",
                r, topology_node_of(t, r), r % t->ranks_per_node, c[TOPO_TP], c[TOPO_DP],
                c[TOPO_PP]);
        const char *host = live_name(t, topology_node_of(t, r));
        if (host) {
            fputs(", \"host\": ", f);
            json_string(f, host);
        }
        for (int a = 0; a < TOPO_AXES; a++) {
            fprintf(f, ", \"%s_group\": ", topology_axis_name((TopoAxis)a));
            group_json(f, topology_group_of(t, r, (TopoAxis)a));
        }
        fprintf(f, "}%s\n", r + 1 < t->world ? "," : "");
    }
    fprintf(f, " ]}\n");
}

int topology_print_map(FILE *f, const TopologyConfig *tc, int world, int ranks_per_node,
                       TopoMapFormat format, char err[CFG_ERR])
{
    Topology t;
    if (topology_build(&t, tc, world, ranks_per_node, 0, err))
        return -1;
    if (format == TOPO_MAP_JSON) {
        print_json(f, &t, tc->order);
        return 0;
    }
    print_summary(f, &t, tc->order);
    if (format == TOPO_MAP_TABLE)
        print_table(f, &t);
    return 0;
}
