/* ckpt_cli.c — `trident ckpt`: inspect, verify, export (h5 or Hugging
 * Face) and import of checkpoints; the work is src/checkpoint's
 * (ckpt_tools.c, ckpt_hf.c, ckpt_hf_import.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "cli/cli_config.h"
#include "cli/commands.h"
#include "core/error.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: trident ckpt inspect DIR [--verify]\n"
               "       trident ckpt verify DIR\n"
               "       trident ckpt export DIR --out FILE [--master]\n"
               "       trident ckpt export --format hf --out OUTDIR [--dtype fp32|bf16]\n"
               "                           [--max-shard-size SIZE] DIR\n"
               "       trident ckpt import --from hf HF_DIR --out CKPTDIR [--set key=value ...]\n\n"
               "DIR is a checkpoint step directory (DIR/step_00000100) or a checkpoint.dir,\n"
               "whose `latest` is taken.\n"
               "  inspect   saved step, training state, model, topology, config, and every\n"
               "            dataset with its global shape, dtype, size and file; with --verify\n"
               "            also the check of `verify` (else it says \"not verified\")\n"
               "  verify    reads every block of every tensor: checksums and finite values;\n"
               "            exit 1 naming the file and tensor that is wrong, 0 and \"verified\"\n"
               "  export    the model weights (fp32, global shapes, unpadded vocabulary) as\n"
               "            one HDF5 file with a dataset per tensor, e.g. /embed.wte.weight;\n"
               "            (a bf16 run: the bf16 rounding of its master weights); --master\n"
               "            takes the fp32 master weights of a bf16 run instead\n"
               "  export --format hf\n"
               "            a Hugging Face model directory (config.json, safetensors weights,\n"
               "            GPT-2 tokenizer files) for transformers' from_pretrained: gpt2 ->\n"
               "            GPT2LMHeadModel, llama -> LlamaForCausalLM; --dtype (default fp32),\n"
               "            --max-shard-size (default 5GB; e.g. 500MB, 100KiB, bytes)\n"
               "  import --from hf\n"
               "            a Hugging Face directory (GPT2LMHeadModel or LlamaForCausalLM, as\n"
               "            export writes them) as a weights-only checkpoint at step 0 in\n"
               "            CKPTDIR, for checkpoint.init_from; --set records run/data keys\n"
               "Layout: docs/checkpoint.md.  Exit codes: 0 success, 2 bad input (not a\n"
               "checkpoint), 1 failure (a damaged checkpoint, for verify).\n");
}

static int fail(int code, const char *msg)
{
    fprintf(stderr, "trident: error: %s\n", msg);
    return code;
}

/* `ckpt import --from hf HF_DIR --out CKPTDIR [--set k=v ...]`. */
static int import(int argc, char **argv)
{
    const char *from = NULL, *src = NULL, *out = NULL;
    CliConfig sets = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const int val = i + 1 < argc;
        if (!strcmp(a, "--from") && val)
            from = argv[++i];
        else if (!strcmp(a, "--out") && val)
            out = argv[++i];
        else if (cli_take_set(&sets, argc, argv, &i))
            continue;
        else if (a[0] != '-' && !src)
            src = a;
        else {
            usage(stderr);
            char msg[CFG_ERR];
            snprintf(msg, sizeof msg, "ckpt import: unknown or incomplete argument '%s'", a);
            return fail(TRD_EXIT_INPUT, msg);
        }
    }
    int code = TRD_EXIT_INPUT;
    char err[CFG_ERR];
    if (!from || strcmp(from, "hf"))
        snprintf(err, sizeof err, "ckpt import: --from hf is required (the only source format)");
    else if (!src || !out)
        snprintf(err, sizeof err, "ckpt import: %s is required",
                 !src ? "the Hugging Face directory (HF_DIR)" : "--out");
    else
        code = ckpt_hf_import(src, out, (char *const *)sets.sets, sets.n_sets, 0, err);
    return code ? fail(code, err) : TRD_EXIT_OK;
}

int ckpt_main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return TRD_EXIT_OK;
    }
    if (argc == 3 && !strcmp(argv[1], "inspect"))
        return ckpt_inspect(argv[2], 0);
    if (argc == 4 && !strcmp(argv[1], "inspect") && !strcmp(argv[3], "--verify"))
        return ckpt_inspect(argv[2], 1);
    if (argc == 3 && !strcmp(argv[1], "verify"))
        return ckpt_verify(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "export")) {
        /* Options and the checkpoint in any order: `export DIR --out F` and
         * `export --format hf --out DIR CKPT` both read naturally. */
        const char *out = NULL, *src = NULL, *format = "h5", *dtype = NULL, *shard = NULL;
        int master = 0;
        for (int i = 2; i < argc; i++) {
            const char *a = argv[i];
            const int val = i + 1 < argc;
            if (!strcmp(a, "--out") && val)
                out = argv[++i];
            else if (!strcmp(a, "--format") && val)
                format = argv[++i];
            else if (!strcmp(a, "--dtype") && val)
                dtype = argv[++i];
            else if (!strcmp(a, "--max-shard-size") && val)
                shard = argv[++i];
            else if (!strcmp(a, "--master"))
                master = 1;
            else if (a[0] != '-' && !src)
                src = a;
            else {
                usage(stderr);
                char msg[CFG_ERR];
                snprintf(msg, sizeof msg, "ckpt export: unknown or incomplete argument '%s'", a);
                return fail(TRD_EXIT_INPUT, msg);
            }
        }
        if (!src || !out) {
            usage(stderr);
            return fail(TRD_EXIT_INPUT, !src ? "ckpt export: the checkpoint (DIR) is required"
                                             : "ckpt export: --out is required");
        }
        if (!strcmp(format, "hf")) {
            int bf16 = 0;
            int64_t max_shard = 5000000000LL; /* HF's default "5GB" */
            if (dtype && strcmp(dtype, "fp32") && strcmp(dtype, "bf16"))
                return fail(TRD_EXIT_INPUT, "ckpt export: --dtype must be fp32 or bf16");
            bf16 = dtype && !strcmp(dtype, "bf16");
            if (shard && ckpt_hf_parse_size(shard, &max_shard) != 0)
                return fail(TRD_EXIT_INPUT, "ckpt export: --max-shard-size must be a size in "
                                            "bytes, e.g. 5GB, 500MB, 100KiB or 1000000");
            if (master)
                return fail(TRD_EXIT_INPUT, "ckpt export: --master is for --format h5 (--format "
                                            "hf takes the master weights when saved)");
            return ckpt_hf_export(src, out, bf16, max_shard);
        }
        if (strcmp(format, "h5"))
            return fail(TRD_EXIT_INPUT, "ckpt export: --format must be h5 or hf");
        if (dtype || shard)
            return fail(TRD_EXIT_INPUT, "ckpt export: --dtype and --max-shard-size are for "
                                        "--format hf");
        return ckpt_export_h5(src, out, master);
    }
    if (argc >= 2 && !strcmp(argv[1], "import"))
        return import(argc, argv);
    usage(stderr);
    return TRD_EXIT_INPUT;
}
