/* topology.h — the rank mesh: which (tp, dp, pp) coordinates, node and
 * groups each rank of the world has, and the communicators of those groups.
 *
 * This is the one place that does rank arithmetic (docs/design.md: "parallel state
 * is one module"); every other module asks it.  The layout is a 3-D mesh
 * tp x dp x pp laid over the world ranks in the order of topology.order,
 * where the dp axis holds dp x cp ranks with cp (context parallelism: the
 * ranks that share each sequence) its fastest part, so that with the
 * default order a cp group is the ranks tp apart next to a TP group
 * (Megatron-LM's tp-cp-dp-pp),
 * fastest axis first (default "tp-dp-pp": a TP group is consecutive ranks on
 * one node, pipeline stages are the slowest axis and land on different
 * nodes).  Along any axis a group is an arithmetic progression of ranks, so a
 * group is stored as (first, stride, size) and nothing here allocates.
 *
 * Two halves:
 *  - a pure core (topology_build and the queries): no MPI, testable for any
 *    world size, also used by `trident topology` to print the map;
 *  - the live part (topology_init): finds the node of every rank (Slurm
 *    environment, else MPI's shared-memory split, or topology.ranks_per_node),
 *    calls the core, and creates the group communicators once.
 * See docs/topology.md. */
#ifndef TRD_TOPOLOGY_H
#define TRD_TOPOLOGY_H

#include <stdio.h>

#include "comm/comm.h"
#include "config/config.h"

/* Axes of the mesh; also the index of coord[], size[] and stride[]. */
typedef enum { TOPO_TP = 0, TOPO_DP = 1, TOPO_PP = 2, TOPO_AXES = 3 } TopoAxis;

/* The ranks {first + i * stride : 0 <= i < size}; member i has coordinate i
 * along the group's axis. */
typedef struct {
    int first, stride, size;
} TopoGroup;

typedef struct {
    /* The mesh (the same on every rank). */
    int world;
    int size[TOPO_AXES];       /* tp, dp x cp, pp */
    int cp;                    /* context parallel: the fastest cp of the dp axis */
    int stride[TOPO_AXES];     /* rank distance of one step along each axis */
    TopoAxis order[TOPO_AXES]; /* fastest first */
    int ranks_per_node;        /* >= 1; every node runs this many consecutive ranks */
    int nodes;                 /* world / ranks_per_node */
    int allow_tp_across_nodes;
    int tp_inside_node;     /* 1 when every TP group lies on one node */
    int stages_share_nodes; /* 1 when some node holds ranks of two pipeline stages
                                (an error or warning only with >= pp nodes) */
    char warning[CFG_ERR];  /* non-empty: a placement worth telling the user about */

    /* This rank. */
    int rank;
    int coord[TOPO_AXES]; /* tp_rank, dp axis rank (data replica * cp + cp_rank), pp_rank */
    int cp_rank;          /* coord[TOPO_DP] % cp: which chunks of every sequence */
    int data_rank;        /* coord[TOPO_DP] / cp: which sequences */
    int node, local_rank;
    TopoGroup group[TOPO_AXES]; /* this rank's TP, DP (dp x cp) and PP groups */
    TopoGroup cp_group;         /* the ranks sharing this rank's sequences */
} Topology;

/* The communicators of one rank's groups, created once by topology_init.
 * Each Comm's rank is the rank's coordinate in that group: tp.rank is the
 * tp coordinate, and so on. */
typedef struct {
    Comm world;
    Comm tp, dp, pp; /* dp: the dp x cp ranks holding the same weights, over
                        which gradients are reduced and ZeRO shards */
    Comm cp;         /* the cp ranks holding the same sequences (size 1: none) */
    Comm mp;         /* model parallel: the tp x pp ranks with this rank's dp
                     coordinate (one model replica), for the gradient norm;
                     rank = pp * tp_size + tp */
    Comm ep;         /* expert parallel: topology.ep consecutive ranks of the dp
                     group (dp rank / ep equal), which split the experts of
                     each MoE layer; rank = dp rank % ep (size 1: none) */
    Comm edp;        /* expert data parallel: the dp / ep ranks of the dp group
                     with this rank's ep rank (dp rank % ep equal), which hold
                     the same experts when ep divides their memory and
                     reduce their gradients; rank = dp rank / ep */
    Comm embed;      /* first and last pipeline stage with this rank's (tp, dp),
                     to all-reduce tied embedding gradients; rank 0 = first
                     stage.  Only when pp > 1 and this rank is on the first or
                     last stage; otherwise comm_none(): rank -1, size 0. */
} TopologyComms;

/* ---- pure core (no MPI) ---- */

/* Lay out the mesh of tc (tp, pp, dp with 0 = world / (tp*pp), order,
 * allow_tp_across_nodes) over `world` ranks, `ranks_per_node` consecutive
 * ranks per node (0: all on one node), and fill t for `rank`.  Checks, in
 * order: the product equals the world, ranks_per_node divides the world, the
 * order is a permutation, TP groups stay inside a node (unless allowed), and
 * with at least pp nodes no node holds two pipeline stages (an error with the
 * default order, a warning in t->warning with a custom one).  Returns 0, or
 * -1 with the violated constraint and its fix in err. */
int topology_build(Topology *t, const TopologyConfig *tc, int world, int ranks_per_node, int rank,
                   char err[CFG_ERR]);

/* Queries on a built mesh, valid for any rank of the world. */
int topology_rank_of(const Topology *t, int tp, int dp, int pp);
void topology_coords_of(const Topology *t, int rank, int coord[TOPO_AXES]);
TopoGroup topology_group_of(const Topology *t, int rank, TopoAxis axis);
static inline int topology_member(TopoGroup g, int i) { return g.first + i * g.stride; }
static inline int topology_node_of(const Topology *t, int rank) { return rank / t->ranks_per_node; }

/* "tp", "dp", "pp". */
const char *topology_axis_name(TopoAxis a);

/* From key[r] = the lowest world rank on rank r's node (gathered from every
 * rank), the number of ranks per node.  The placement must be equal blocks
 * of consecutive ranks, since the layout takes node = rank / ranks_per_node.
 * Returns it, or -1 with the reason and the fix in err. */
int topology_nodes_from_keys(const int *key, int world, char err[CFG_ERR]);

/* ---- the map, printed ---- */

typedef enum { TOPO_MAP_TABLE = 0, TOPO_MAP_JSON = 1, TOPO_MAP_SUMMARY = 2 } TopoMapFormat;

/* Print the rank map of tc over `world` ranks, `ranks_per_node` per node:
 * TABLE = summary and one line per rank; JSON = one object (docs/topology.md);
 * SUMMARY = the summary lines only (for a training log at scale).  Returns 0,
 * or -1 with the error of topology_build in err. */
int topology_print_map(FILE *f, const TopologyConfig *tc, int world, int ranks_per_node,
                       TopoMapFormat format, char err[CFG_ERR]);

/* ---- the live run's placement, for the printed map ----
 * topology_init records how the nodes were found and, on rank 0, every
 * node's name (SLURMD_NODENAME under srun, else the host name).  When
 * topology_print_map then prints the same world and ranks per node (the
 * trainer's map at start), it adds a line on the placement, the node names
 * and a host column; `trident topology` (nothing launched) has none. */
#define TOPO_NAME 64
/* names: nodes * TOPO_NAME bytes, node n's name at n * TOPO_NAME, or NULL.
 * Copied.  A world of 0 forgets what was recorded. */
void topology_set_live(int world, int ranks_per_node, const char *source, const char *names,
                       int nodes);

/* ---- live part (MPI) ---- */

/* Every rank of `world` calls this once, after config_validate.  Determines
 * the node layout, builds t for this rank and creates the communicators of
 * c.  A topology that does not fit ends the job with exit code 2 and the
 * message of topology_build (printed once, by rank 0). */
void topology_init(Topology *t, TopologyComms *c, const TopologyConfig *tc, Comm world);
void topology_comms_free(TopologyComms *c);

#endif
