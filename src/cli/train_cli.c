/* train_cli.c — `trident train` (one rank of a job, under mpiexec or srun)
 * and `trident run` (launches mpiexec for local use). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_config.h"
#include "cli/commands.h"
#include "comm/comm.h"
#include "core/error.h"
#include "core/launch.h"
#include "train/train.h"

static void usage_train(FILE *f)
{
    fprintf(f, "usage: trident train CONFIG [--set key.path=value ...]\n"
               "       mpiexec -n N trident train CONFIG ...\n\n"
               "Trains the model described by the YAML CONFIG (see docs/config.md).\n"
               "  --set key.path=value   override one config key (repeatable),\n"
               "                         e.g. --set training.steps=100 --set model.arch=llama\n"
               "Writes <run.dir>/metrics.jsonl, <run.dir>/config.yaml and TensorBoard events in\n"
               "<run.dir>/tb/ (docs/monitoring.md; `trident report RUN_DIR` makes an HTML page).\n"
               "Exit codes: 0 success, 2 bad input, 1 runtime failure, 75 stopped after\n"
               "saving a checkpoint on SIGUSR1/SIGTERM (run it again and it resumes).\n");
}

static void usage_run(FILE *f)
{
    fprintf(f, "usage: trident run CONFIG [-n WORLD] [--set key.path=value ...]\n\n"
               "Launches `mpiexec -n WORLD trident train CONFIG ...` on this machine.\n"
               "WORLD defaults to topology.tp * pp * cp * dp of the config\n"
               "(dp must then be a number, not auto).\n"
               "  --set key.path=value   override one config key (repeatable)\n"
               "Exit codes: 0 success, 2 bad input, 1 runtime failure (any rank's crash\n"
               "too), 75 stopped after saving a checkpoint (as train).\n");
}

/* Load, override and validate; on bad input every rank exits 2 (they all
 * read the same file, so they all fail the same way) and rank 0 says why.
 * world 0: not known yet (`trident run` before it launches). */
static void load_config(Config *cfg, const CliConfig *c, int world, int rank)
{
    char err[CFG_ERR];
    if (cli_read_config(cfg, c, world, err) == 0)
        return;
    if (rank == 0)
        fprintf(stderr, "trident: error: %s\n", err);
    comm_finalize();
    exit(TRD_EXIT_INPUT);
}

int train_main(int argc, char **argv)
{
    CliConfig c;
    if (cli_parse(argc, argv, &c, usage_train, NULL, NULL))
        return TRD_EXIT_OK;
    comm_init(&argc, &argv);
    Comm world = comm_world();
    Config cfg;
    load_config(&cfg, &c, world.size, world.rank);
    int rc = train_run(&cfg, world);
    comm_finalize();
    return rc;
}

/* `trident run`'s -n WORLD. */
static int run_option(void *ctx, int argc, char **argv, int *i)
{
    int *world = ctx;
    if (strcmp(argv[*i], "-n") || *i + 1 >= argc)
        return 0;
    *world = atoi(argv[++*i]);
    if (*world < 1)
        trd_fatal(TRD_EXIT_INPUT, NULL, "-n needs a positive rank count, got '%s'", argv[*i]);
    return 1;
}

int run_main(int argc, char **argv)
{
    CliConfig c;
    int world = 0;
    if (cli_parse(argc, argv, &c, usage_run, run_option, &world))
        return TRD_EXIT_OK;
    Config cfg;
    load_config(&cfg, &c, 0, 0);
    if (!world) {
        if (cfg.topology.dp == 0)
            trd_fatal(TRD_EXIT_INPUT, "pass -n WORLD or set topology.dp to a number",
                      "topology.dp is auto, so the world size is unknown");
        world = cfg.topology.tp * cfg.topology.pp * cfg.topology.cp * cfg.topology.dp;
    }
    /* The world-dependent rules too, before anything is launched: a bad
     * layout is one message and exit 2, not one per rank. */
    load_config(&cfg, &c, world, 0);
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "cannot find the trident binary: %s", strerror(errno));
    self[len] = '\0';

    char n[16];
    snprintf(n, sizeof n, "%d", world);
    char *args[8 + 2 * CLI_MAX_SETS];
    int k = 0;
    args[k++] = "mpiexec";
    args[k++] = "-n";
    args[k++] = n;
    args[k++] = self;
    args[k++] = "train";
    args[k++] = (char *)c.config_path;
    for (int i = 0; i < c.n_sets; i++) {
        args[k++] = "--set";
        args[k++] = (char *)c.sets[i];
    }
    args[k] = NULL;
    printf("trident run: mpiexec -n %s %s train %s ...\n", n, self, c.config_path);
    return launch_wait(args, "install MPICH (apt-get install mpich)");
}
