/* ckpt_cli.c — `trident ckpt`: inspect, verify, export (h5 or Hugging
 * Face) and import of checkpoints; the work is src/checkpoint's
 * (ckpt_tools.c, ckpt_hf.c, ckpt_hf_import.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/ckpt.h"
#include "cli/cli_config.h"
#include "cli/commands.h"
#include "core/error.h"

/* The sub-forms, each with its synopsis and what it does: `ckpt FORM
 * --help` prints its own, `ckpt --help` all of them. */
typedef struct {
    const char *name, *synopsis, *text;
} Form;

static const Form forms[] = {
    {"inspect", "trident ckpt inspect DIR [--verify]",
     "  inspect   saved step, training state, model, topology, config, and every\n"
     "            dataset with its global shape, dtype, size and file; with --verify\n"
     "            also the check of `verify` (else it says \"not verified\")\n"},
    {"verify", "trident ckpt verify DIR",
     "  verify    reads every block of every tensor: checksums and finite values;\n"
     "            exit 1 naming the file and tensor that is wrong, 0 and \"verified\"\n"},
    {"export",
     "trident ckpt export DIR --out FILE [--master]\n"
     "       trident ckpt export --format hf --out OUTDIR [--dtype fp32|bf16]\n"
     "                           [--max-shard-size SIZE] DIR\n"
     "       trident ckpt export --format peft --out OUTDIR DIR",
     "  export    the model weights (fp32, global shapes, unpadded vocabulary) as\n"
     "            one HDF5 file with a dataset per tensor, e.g. /embed.wte.weight;\n"
     "            (a bf16 run: the bf16 rounding of its master weights); --master\n"
     "            takes the fp32 master weights of a bf16 run instead\n"
     "  export --format hf\n"
     "            a Hugging Face model directory (config.json, safetensors weights,\n"
     "            GPT-2 tokenizer files) for transformers' from_pretrained: gpt2 ->\n"
     "            GPT2LMHeadModel, llama -> LlamaForCausalLM; --dtype (default fp32),\n"
     "            --max-shard-size (default 5GB; e.g. 500MB, 100KiB, bytes); of a LoRA\n"
     "            checkpoint (model.lora) the merged model: base + (alpha/r) B A\n"
     "  export --format peft\n"
     "            a LoRA checkpoint's adapters as a PEFT adapter directory\n"
     "            (adapter_config.json, adapter_model.safetensors; llama, fp32)\n"},
    {"import", "trident ckpt import --from hf HF_DIR --out CKPTDIR [--set key=value ...]",
     "  import --from hf\n"
     "            a Hugging Face directory (GPT2LMHeadModel or LlamaForCausalLM; F32,\n"
     "            F16 or BF16 safetensors, widened exactly to fp32) as a weights-only\n"
     "            checkpoint at step 0 in CKPTDIR, for checkpoint.init_from; the model\n"
     "            comes from its config.json; --set records run/data keys and\n"
     "            model.seq_len\n"},
};
enum { N_FORMS = sizeof forms / sizeof forms[0] };

/* One sub-form's usage (form >= 0) or all of them (form < 0). */
static void usage_form(FILE *f, int form)
{
    for (int k = 0, first = 1; k < N_FORMS; k++)
        if (form < 0 || form == k) {
            fprintf(f, "%s %s\n", first ? "usage:" : "      ", forms[k].synopsis);
            first = 0;
        }
    if (form != 3)
        fprintf(f, "\nDIR is a checkpoint step directory (DIR/step_00000100) or a "
                   "checkpoint.dir,\nwhose `latest` is taken.\n");
    else
        fprintf(f, "\n");
    for (int k = 0; k < N_FORMS; k++)
        if (form < 0 || form == k)
            fputs(forms[k].text, f);
    fprintf(f, "Layout: docs/checkpoint.md.  Exit codes: 0 success, 2 bad input (bad\n"
               "arguments, not a checkpoint), 1 failure (a damaged checkpoint, for verify).\n");
}

static void usage(FILE *f) { usage_form(f, -1); }

static int find_form(const char *name)
{
    for (int k = 0; k < N_FORMS; k++)
        if (!strcmp(name, forms[k].name))
            return k;
    return -1;
}

/* --help or -h anywhere after the sub-form: its usage, exit 0, nothing run. */
static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return 1;
    return 0;
}

static int fail(int code, const char *msg)
{
    fprintf(stderr, "trident: error: %s\n", msg);
    return code;
}

/* A bad command line of one sub-form: its usage and the message, exit 2. */
static int bad_args(int form, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad_args(int form, const char *fmt, ...)
{
    usage_form(stderr, form);
    char msg[CFG_ERR];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fail(TRD_EXIT_INPUT, msg);
}

/* The DIR of inspect and verify, checked here so that the message names
 * the command's argument. */
static int check_dir(const char *form, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    char msg[CFG_ERR];
    snprintf(msg, sizeof msg, "ckpt %s: DIR %s: no such checkpoint directory", form, dir);
    return fail(TRD_EXIT_INPUT, msg);
}

/* `ckpt inspect DIR [--verify]` and `ckpt verify DIR`. */
static int inspect_or_verify(int argc, char **argv, int form)
{
    const char *dir = NULL;
    int verify = 0;
    for (int i = 2; i < argc; i++) {
        if (form == 0 && !strcmp(argv[i], "--verify"))
            verify = 1;
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else
            return bad_args(form, "ckpt %s: unknown or extra argument '%s'", forms[form].name,
                            argv[i]);
    }
    if (!dir)
        return bad_args(form, "ckpt %s: the checkpoint (DIR) is required", forms[form].name);
    if (check_dir(forms[form].name, dir) != 0)
        return TRD_EXIT_INPUT;
    return form == 0 ? ckpt_inspect(dir, verify) : ckpt_verify(dir);
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
        else
            return bad_args(3, "ckpt import: unknown or incomplete argument '%s'", a);
    }
    char err[CFG_ERR];
    if (!from || strcmp(from, "hf"))
        return bad_args(3, "%s", "ckpt import: --from hf is required (the only source format)");
    if (!src || !out)
        return bad_args(3, "ckpt import: %s is required",
                        !src ? "the Hugging Face directory (HF_DIR)" : "--out");
    const int code = ckpt_hf_import(src, out, (char *const *)sets.sets, sets.n_sets, 0, err);
    return code ? fail(code, err) : TRD_EXIT_OK;
}

int ckpt_main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return TRD_EXIT_OK;
    }
    const int form = argc >= 2 ? find_form(argv[1]) : -1;
    if (form < 0) {
        usage(stderr);
        if (argc < 2)
            return fail(TRD_EXIT_INPUT, "ckpt: a sub-form is required (inspect, verify, export "
                                        "or import)");
        char msg[CFG_ERR];
        snprintf(msg, sizeof msg, "ckpt: unknown sub-form '%s' (inspect, verify, export or import)",
                 argv[1]);
        return fail(TRD_EXIT_INPUT, msg);
    }
    if (wants_help(argc, argv)) {
        usage_form(stdout, form);
        return TRD_EXIT_OK;
    }
    if (form <= 1)
        return inspect_or_verify(argc, argv, form);
    if (form == 2) {
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
            else
                return bad_args(2, "ckpt export: unknown or incomplete argument '%s'", a);
        }
        if (!src || !out)
            return bad_args(2, "%s",
                            !src ? "ckpt export: the checkpoint (DIR) is required"
                                 : "ckpt export: --out is required");
        if (check_dir("export", src) != 0)
            return TRD_EXIT_INPUT;
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
            return lora_export(src, out, 0, bf16, max_shard); /* a LoRA one: merged */
        }
        if (!strcmp(format, "peft")) {
            if (dtype || shard || master)
                return fail(TRD_EXIT_INPUT, "ckpt export: --format peft takes no --dtype, "
                                            "--max-shard-size or --master (fp32 adapters)");
            return lora_export(src, out, 1, 0, 0);
        }
        if (strcmp(format, "h5"))
            return fail(TRD_EXIT_INPUT, "ckpt export: --format must be h5, hf or peft");
        if (dtype || shard)
            return fail(TRD_EXIT_INPUT, "ckpt export: --dtype and --max-shard-size are for "
                                        "--format hf");
        return ckpt_export_h5(src, out, master);
    }
    return import(argc, argv);
}
