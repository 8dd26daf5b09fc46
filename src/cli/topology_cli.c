/* topology_cli.c — `trident topology`: the rank map of a config for a given
 * world size, printed without launching anything (no MPI). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_config.h"
#include "cli/commands.h"
#include "core/error.h"
#include "pipeline_par/pp_schedule.h"
#include "topology/topology.h"

typedef struct {
    CliConfig cli;      /* CONFIG and --set */
    int world;          /* 0: from the config (tp * pp * dp) */
    int ranks_per_node; /* 0: from the config, else one node */
    TopoMapFormat format;
    int schedule;      /* 1: print the pipeline schedule, 2: with sends/receives */
    int micro_batches; /* 0: global_batch / (micro_batch * dp) */
} Args;

static void usage(FILE *f)
{
    fprintf(
        f, "usage: trident topology CONFIG [--world N] [--ranks-per-node G] [--json | "
           "--summary]\n"
           "                         [--schedule | --schedule-comm] [--micro-batches M]\n"
           "                         [--set key.path=value ...]\n\n"
           "Print which node, local rank, (tp, dp, pp) coordinates and TP, DP and PP\n"
           "groups every rank of a run of CONFIG would have.  Nothing is launched.\n\n"
           "  --world N            number of ranks (default: tp x pp x dp of the config)\n"
           "  --ranks-per-node G   ranks on each node (default: topology.ranks_per_node,\n"
           "                       else all ranks on one node)\n"
           "  --json               one JSON object instead of the table\n"
           "  --summary            the summary lines only, no per-rank table\n"
           "  --schedule           the summary, then the pipeline schedule of every stage\n"
           "                       (topology.pp, .schedule, .virtual_stages), its bubble\n"
           "                       and activation memory (see docs/pipeline.md)\n"
           "  --schedule-comm      the same with every send and receive\n"
           "  --micro-batches M    micro-batches per step for --schedule (default:\n"
           "                       global_batch / (micro_batch x dp))\n"
           "  --set key.path=value override one config key (repeatable)\n"
           "Exit codes: 0 success, 2 bad input (arguments, config, a layout that does not fit).\n");
}

static int parse_count(const char *opt, const char *s)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > INT_MAX)
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s '%s': expected a whole number >= 1", opt, s);
    return (int)v;
}

/* This command's options (CliOption). */
static int option(void *ctx, int argc, char **argv, int *i)
{
    Args *a = ctx;
    const char *s = argv[*i];
    const int has_value = *i + 1 < argc;
    if (!strcmp(s, "--world") && has_value)
        a->world = parse_count(s, argv[++*i]);
    else if (!strcmp(s, "--ranks-per-node") && has_value)
        a->ranks_per_node = parse_count(s, argv[++*i]);
    else if (!strcmp(s, "--json"))
        a->format = TOPO_MAP_JSON;
    else if (!strcmp(s, "--summary"))
        a->format = TOPO_MAP_SUMMARY;
    else if (!strcmp(s, "--schedule"))
        a->schedule = 1;
    else if (!strcmp(s, "--schedule-comm"))
        a->schedule = 2;
    else if (!strcmp(s, "--micro-batches") && has_value)
        a->micro_batches = parse_count(s, argv[++*i]);
    else
        return 0;
    return 1;
}

/* Returns 1 after --help, 0 otherwise; bad arguments exit with code 2. */
static int parse_args(int argc, char **argv, Args *a)
{
    memset(a, 0, sizeof *a);
    if (cli_parse(argc, argv, &a->cli, usage, option, a))
        return 1;
    if (a->micro_batches && !a->schedule)
        trd_fatal(TRD_EXIT_INPUT, "add --schedule", "--micro-batches only applies to --schedule");
    if (a->schedule && a->format == TOPO_MAP_JSON)
        trd_fatal(TRD_EXIT_INPUT, "drop --json", "--schedule prints text, not JSON");
    return 0;
}

/* The world size: --world, else what the config fixes. */
static int world_of(const Args *a, const Config *cfg)
{
    if (a->world)
        return a->world;
    const TopologyConfig *t = &cfg->topology;
    if (t->dp == 0)
        trd_fatal(TRD_EXIT_INPUT, "e.g. trident topology CONFIG --world 16 --ranks-per-node 8",
                  "topology.dp is auto, so the world size is not known; give --world N");
    return t->tp * t->pp * t->cp * t->dp;
}

/* The pipeline schedule of every stage of cfg (validated, so dp is known),
 * checked and timed by the simulator before it is printed. */
static void print_schedule(const Args *a, const Config *cfg)
{
    const TopologyConfig *t = &cfg->topology;
    const TrainingConfig *tr = &cfg->training;
    int m = a->micro_batches ? a->micro_batches : tr->global_batch / (tr->micro_batch * t->dp);
    char err[CFG_ERR];
    PpSchedule *ranks = trd_calloc((size_t)t->pp, sizeof *ranks, "pipeline schedules");
    if (pp_schedule_build_all(ranks, t->schedule, t->pp, m, t->virtual_stages, err))
        trd_fatal(TRD_EXIT_INPUT, NULL, "pipeline schedule: %s", err);
    PpSimResult sim;
    if (pp_simulate(ranks, t->pp, (PpCost){1, 2}, &sim, err))
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "pipeline schedule fails its check: %s", err);
    printf("\n");
    pp_schedule_print(stdout, ranks, t->pp, &sim, a->schedule == 2);
    pp_sim_free(&sim);
    pp_schedule_free_all(ranks, t->pp);
    free(ranks);
}

int topology_main(int argc, char **argv)
{
    Args a;
    if (parse_args(argc, argv, &a))
        return TRD_EXIT_OK;
    Config cfg;
    char err[CFG_ERR];
    if (cli_read_config(&cfg, &a.cli, -1, err))
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    int world = world_of(&a, &cfg);
    if (config_validate(&cfg, world, err))
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);

    if (a.schedule)
        a.format = TOPO_MAP_SUMMARY;
    int rpn = a.ranks_per_node ? a.ranks_per_node : cfg.topology.ranks_per_node;
    if (!rpn && a.format == TOPO_MAP_TABLE)
        printf("(ranks per node not given: all %d ranks on one node; pass --ranks-per-node G)\n",
               world);
    if (topology_print_map(stdout, &cfg.topology, world, rpn, a.format, err))
        trd_fatal(TRD_EXIT_INPUT, NULL, "%s", err);
    if (a.schedule)
        print_schedule(&a, &cfg);
    return TRD_EXIT_OK;
}
