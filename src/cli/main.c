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
    {"ckpt", ckpt_main,
     "inspect, verify, export (HDF5 or Hugging Face) or import (Hugging Face)\n"
     "                a checkpoint (trident ckpt --help, trident ckpt FORM --help)"},
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
    fprintf(f, "\nExit codes: 0 success, 2 bad input (arguments, config, data), 1 runtime\n"
               "failure, 75 stopped after saving a checkpoint on SIGUSR1/SIGTERM (train, run:\n"
               "run it again and it resumes; docs/slurm.md).\n");
}

/* OpenBLAS (the pthreads build, Debian's default) starts a pool of one
 * thread per core but one when it is loaded, and each spins for about 0.1 s
 * before it sleeps.  trident calls BLAS on one thread inside its own
 * OpenMP split (backend/cpu_ops.inc), and most commands never call it, so
 * the pool is stopped before anything runs; OpenBLAS starts it again at
 * its first call.  Two ranks of a small `ckpt export` on 2 cores took
 * 146 ms with the pools spinning, 96 ms without.  Weak: another BLAS
 * library has no such function. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

int main(int argc, char **argv)
{
    if (blas_thread_shutdown_)
        (void)blas_thread_shutdown_();
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
