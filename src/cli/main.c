/* trident — one binary, subcommands.  Every rank runs the same binary; the
 * YAML config decides what each rank does. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/error.h"

typedef struct {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"train", train_main, "train a model from a YAML config (under mpiexec or srun)"},
    {"run", run_main, "launch `mpiexec -n <world> trident train` for local use"},
    {"prepare-data", data_prepare_main, "tokenize text files into a Megatron .bin/.idx dataset"},
    {"tokenize", data_tokenize_main, "print the token ids of a text file"},
    {"data", data_main, "what a dataset or a config's data blend holds (trident data inspect)"},
    {"ckpt", ckpt_main, "inspect or export a checkpoint (trident ckpt --help)"},
    {"topology", topology_main,
     "print the rank map of a config for a world size, without launching"},
    {"plan", plan_main, "memory, communication and time of a config on a cluster, without running"},
    {"eval", eval_main, "loss and perplexity of a trained model on a dataset (any layout)"},
    {"generate", generate_main, "continue a prompt with a trained model (trident generate --help)"},
    {"report", report_main,
     "one HTML page of a run's curves, memory and config (trident report --help)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: trident COMMAND [ARGS]   (trident COMMAND --help for details)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? TRD_EXIT_INPUT : TRD_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].main(argc - 1, argv + 1);
    fprintf(stderr, "trident: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return TRD_EXIT_INPUT;
}
