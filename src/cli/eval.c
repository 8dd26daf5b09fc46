/* eval.c — `trident eval`: the loss of a trained model on a dataset
 * (docs/generate.md).
 *
 * The model and its weights come from a trident checkpoint (any layout)
 * or a Hugging Face directory; the job runs on whatever ranks it was
 * launched with (mpiexec / srun, any tp x pp x dp set with --set), through
 * the trainer's validation pass (trainer_validate): the first N sequences of
 * the dataset in the sampler's order, so every layout reads the same
 * tokens and prints the same loss. */
#include "cli/commands.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "cli/cli_config.h"
#include "train/trainer.h"

static const char usage[] =
    "usage: trident eval CKPT|HF_DIR --data PREFIX [--sequences N] [--micro-batch B]\n"
    "           [--format megatron|llmc] [--set key=value ...]\n\n"
    "Prints the mean loss per token, the perplexity and the tokens evaluated of a\n"
    "trained model on a prepared dataset.  Run it on one rank, or under mpiexec /\n"
    "srun on any layout (--set topology.tp=2 ...; dp takes the remaining ranks):\n"
    "the numbers are the same.\n"
    "  CKPT          a trident step directory, or a checkpoint.dir (its latest)\n"
    "  HF_DIR        a Hugging Face directory (config.json + safetensors)\n"
    "  --data        the dataset (trident prepare-data's PREFIX, or an llm.c shard)\n"
    "  --sequences   how many sequences of model.seq_len + 1 tokens (default: every\n"
    "                whole sequence of the dataset)\n"
    "  --micro-batch sequences per forward on each data-parallel rank (default 4)\n"
    "Exit codes: 0 success, 2 bad input (arguments, checkpoint, data), 1 failure.\n";

typedef struct {
    const char *source, *data, *format;
    long sequences, micro;
    CliConfig sets; /* --set only: the model comes from the checkpoint */
} EvalArgs;

static int bad(int rank, const char *fmt, const char *arg)
{
    if (rank == 0) {
        fprintf(stderr, "trident eval: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, "\n---> see `trident eval --help`\n");
    }
    return TRD_EXIT_INPUT;
}

static int parse(int argc, char **argv, EvalArgs *a, int rank)
{
    *a = (EvalArgs){.format = "megatron", .micro = 4};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            if (rank == 0)
                fputs(usage, stdout);
            return -1;
        }
        if (cli_take_set(&a->sets, argc, argv, &i))
            continue;
        if (strncmp(o, "--", 2)) {
            if (a->source)
                return bad(rank, "one model source only, got '%s' too", o);
            a->source = o;
            continue;
        }
        if (i + 1 >= argc)
            return bad(rank, "%s needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "--data"))
            a->data = v;
        else if (!strcmp(o, "--format"))
            a->format = v;
        else if (!strcmp(o, "--sequences") || !strcmp(o, "--micro-batch")) {
            char *end;
            errno = 0;
            long x = strtol(v, &end, 10);
            if (*end || errno || x < 1 || x > (1L << 30))
                return bad(rank, "needs a positive integer, got '%s'", v);
            *(!strcmp(o, "--sequences") ? &a->sequences : &a->micro) = x;
        } else
            return bad(rank, "unknown argument '%s'", o);
    }
    if (!a->source)
        return bad(rank, "%s", "no checkpoint or Hugging Face directory given");
    if (!a->data)
        return bad(rank, "%s", "no --data PREFIX");
    return 0;
}

/* The sequences of seq_len + 1 tokens the dataset holds. */
static long whole_sequences(const EvalArgs *a, const Config *cfg, char err[CFG_ERR])
{
    TokenStream ds;
    Sampler s;
    if (stream_open(&ds, a->data, cfg->data.format, err) != 0)
        return -1;
    const int rc = sampler_init(&s, &ds, cfg->model.seq_len, cfg->run.seed, err);
    stream_close(&ds);
    return rc != 0 ? -1 : (long)s.n_samples;
}

static _Noreturn void refuse(int rank, const char *err)
{
    if (rank == 0)
        fprintf(stderr, "trident: error: %s\n", err);
    comm_finalize();
    exit(TRD_EXIT_INPUT);
}

int eval_main(int argc, char **argv)
{
    comm_init(&argc, &argv);
    Comm world = comm_world();
    EvalArgs a;
    int rc = parse(argc, argv, &a, world.rank);
    if (rc) {
        comm_finalize();
        return rc < 0 ? TRD_EXIT_OK : rc;
    }
    char err[CFG_ERR] = "", step[CFG_STR] = "", tmp[CFG_STR] = "";
    /* A Hugging Face directory: rank 0 imports it into a temporary
     * trident checkpoint (TMPDIR must be shared by the nodes of a job). */
    char json[CFG_STR + 16];
    snprintf(json, sizeof json, "%s/config.json", a.source);
    struct stat st;
    if (stat(json, &st) == 0) {
        int code = 0;
        if (world.rank == 0) {
            snprintf(tmp, sizeof tmp, "%s/trident-eval-XXXXXX",
                     getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
            if (!mkdtemp(tmp)) {
                snprintf(err, sizeof err, "cannot make a temporary directory %s: %s", tmp,
                         strerror(errno));
                code = TRD_EXIT_RUNTIME;
            } else {
                char out[CFG_STR + 16];
                snprintf(out, sizeof out, "%s/model", tmp);
                fflush(stdout);
                const int saved = dup(STDOUT_FILENO);
                dup2(STDERR_FILENO, STDOUT_FILENO); /* the import's report: not the result */
                code = ckpt_hf_import(a.source, out, NULL, 0, 1, err);
                fflush(stdout);
                dup2(saved, STDOUT_FILENO);
                close(saved);
            }
        }
        comm_broadcast(&world, &code, sizeof code, 0);
        comm_broadcast(&world, err, sizeof err, 0);
        comm_broadcast(&world, tmp, sizeof tmp, 0);
        if (code != 0) {
            if (world.rank == 0)
                fprintf(stderr, "trident: error: %s\n", err);
            comm_finalize();
            return code;
        }
        snprintf(step, sizeof step, "%.200s/model/step_00000000", tmp);
    } else if (ckpt_resolve(NULL, RESUME_PATH, a.source, step, err) != 1) {
        refuse(world.rank, err);
    }

    /* The model of the checkpoint; everything else is this evaluation's. */
    Config cfg, def;
    char path[CFG_STR + 32];
    snprintf(path, sizeof path, "%s/config.yaml", step);
    config_defaults(&cfg);
    config_defaults(&def);
    if (config_load(&cfg, path, err) != 0)
        refuse(world.rank, err);
    cfg.training = def.training;
    cfg.checkpoint = def.checkpoint;
    cfg.topology = def.topology;
    cfg.training.steps = 1;
    snprintf(cfg.checkpoint.init_from, sizeof cfg.checkpoint.init_from, "%s", step);
    cfg.checkpoint.resume = RESUME_NEVER;
    if (tmp[0])
        snprintf(cfg.run.dir, sizeof cfg.run.dir, "%s", tmp);
    cfg.run.tensorboard = 0;
    cfg.training.trace = 0;
    if (cli_apply_sets(&cfg, &a.sets, err) != 0)
        refuse(world.rank, err);
    if (strcmp(a.format, "megatron") && strcmp(a.format, "llmc"))
        refuse(world.rank, "--format is megatron or llmc");
    cfg.data.format = strcmp(a.format, "llmc") ? DATA_MEGATRON : DATA_LLMC;
    snprintf(cfg.data.path, sizeof cfg.data.path, "%s", a.data);
    snprintf(cfg.data.val_path, sizeof cfg.data.val_path, "%s", a.data);
    cfg.data.blend[0] = cfg.data.val_blend[0] = '\0'; /* the run's blend: not evaluated */
    const int mp = cfg.topology.tp * cfg.topology.pp * cfg.topology.cp;
    const int dp = cfg.topology.dp > 0 ? cfg.topology.dp : (mp > 0 ? world.size / mp : 1);
    cfg.training.micro_batch = (int)a.micro;
    cfg.training.global_batch = (int)a.micro * (dp > 0 ? dp : 1);
    long n = a.sequences;
    if (!n && (n = whole_sequences(&a, &cfg, err)) < 0)
        refuse(world.rank, err);
    cfg.data.val_sequences = (int)(n < (1L << 30) ? n : (1L << 30));
    if (config_validate(&cfg, world.size, err) != 0)
        refuse(world.rank, err);

    /* The trainer of this layout, its weights from init_from; the
     * validation pass alone (no step, nothing locked or written). */
    Trainer *tr = trainer_create(&cfg, world, TRAINER_EVAL);
    double tokens;
    const double loss = trainer_validate(tr, &tokens);
    trainer_destroy(tr);
    if (world.rank == 0) {
        printf("eval: %s on %s: %d sequences, %.0f tokens | loss %.6f | perplexity %.4f | "
               "tp %d pp %d dp %d\n",
               a.source, a.data, cfg.data.val_sequences, tokens, loss, exp(loss), cfg.topology.tp,
               cfg.topology.pp, cfg.topology.dp);
        if (tmp[0]) {
            char cmd[CFG_STR + 16];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
            if (system(cmd) != 0)
                fprintf(stderr, "trident: warning: cannot remove %s\n", tmp);
        }
    }
    comm_finalize();
    return TRD_EXIT_OK;
}
