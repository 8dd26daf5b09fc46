/* prepare_cli.c — `trident prepare-data` and `trident tokenize`: their
 * arguments; the work is src/data/prepare.c's (docs/data.md). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "comm/comm.h"
#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

static const char prepare_usage[] =
    "usage: trident prepare-data --input PATH [PATH ...] [--ext EXT[,EXT]]\n"
    "                            [--input-format auto|text|jsonl] [--json-key KEY] [--skip-bad]\n"
    "                            --tokenizer byte|gpt2|tiktoken|sentencepiece|hf\n"
    "                            [--vocab encoder.json --merges vocab.bpe]\n"
    "                            [--encoding cl100k_base|o200k_base] [--ranks FILE.tiktoken]\n"
    "                            [--model FILE.model]\n"
    "                            --out PREFIX [--format megatron|llmc] [--val-every K]\n"
    "                            [--workers N] [--progress] [--shards]\n"
    "                            [--template plain|chatml|llama2|llama3|FILE.json]\n"
    "       mpiexec -n RANKS trident prepare-data ...   (the same options)\n"
    "\n"
    "Tokenize documents into a training dataset: each text file is one document,\n"
    "each line of a JSON lines file is one ({\"text\": \"...\"}).  Each document's\n"
    "tokens are followed by the EOT token.  Under mpiexec (or srun) the input is cut\n"
    "into one range of documents per rank, by size (a plain .jsonl file at line\n"
    "starts, other files whole); the dataset is the one a single process makes.\n"
    "\n"
    "  --input PATH ...   files, one document each (text) or one per line (JSONL);\n"
    "                     .gz and .zst files are decompressed as they are read;\n"
    "                     directories (walked recursively, in name order) and quoted\n"
    "                     glob patterns ('corpus/*.txt') are expanded; may be repeated\n"
    "  --ext EXT[,EXT]    take only files with these extensions from directories and\n"
    "                     patterns (e.g. txt,md; jsonl also takes .jsonl.gz and\n"
    "                     .jsonl.zst); files named explicitly are always taken\n"
    "  --input-format F   auto (default: .jsonl and .json files, compressed or not, are\n"
    "                     JSON lines, others text), text, or jsonl (every input)\n"
    "  --json-key KEY     the string field of a JSON line that holds the text (default text)\n"
    "  --skip-bad         skip bad documents (malformed JSON, missing key, non-string\n"
    "                     value, invalid UTF-8, truncated compressed file), count and\n"
    "                     report them; without it the first one is an error (exit 2)\n"
    "  --tokenizer NAME   byte (ids 0..255 + EOT 256), gpt2 (GPT-2 BPE, vocab 50257),\n"
    "                     tiktoken (a .tiktoken ranks file and --encoding) or\n"
    "                     sentencepiece (a SentencePiece --model; EOT its </s>) or\n"
    "                     hf (a Hugging Face tokenizer.json as --model: byte-level BPE\n"
    "                     with GPT-2's pre-tokenizer; others are refused by name)\n"
    "  --vocab FILE       GPT-2 encoder.json (default " DATA_GPT2_ENCODER_DEFAULT ",\n"
    "                     from the current directory, else from trident's source tree)\n"
    "  --merges FILE      GPT-2 vocab.bpe (default " DATA_GPT2_MERGES_DEFAULT ")\n"
    "  --encoding NAME    tiktoken: cl100k_base (default; vocab 100277, EOT 100257) or\n"
    "                     o200k_base (vocab 200019, EOT 199999): pattern and special tokens\n"
    "  --ranks FILE       tiktoken ranks (default .cache/tiktoken/ENCODING.tiktoken, which\n"
    "                     scripts/get_tiktoken.sh writes)\n"
    "  --model FILE       sentencepiece: the .model file (spm_train's, Llama 2's\n"
    "                     tokenizer.model ...); vocab = its pieces, EOT = its eos id;\n"
    "                     hf: the tokenizer.json (EOT its <|endoftext|>)\n"
    "  --out PREFIX       megatron: writes PREFIX.bin + PREFIX.idx; llmc: writes PREFIX.bin\n"
    "  --format FMT       megatron (default) or llmc (llm.c shard, uint16 tokens)\n"
    "  --val-every K      every K-th document (index % K == K-1) goes to PREFIX_val\n"
    "  --workers N        tokenize on N threads (default 1); the dataset is the same\n"
    "  --progress         print progress every 2 s on stderr (the default when stderr is\n"
    "                     a terminal); under mpiexec rank 0 prints the whole job's\n"
    "  --shards           one dataset per rank instead of one merged dataset:\n"
    "                     PREFIX-00000-of-00004 ... PREFIX-00003-of-00004 (and\n"
    "                     PREFIX_val-...), in input order\n"
    "  --template T       instruction and chat data: each JSON line is {\"prompt\",\n"
    "                     \"completion\"} or {\"messages\": [{\"role\", \"content\"}, ...]},\n"
    "                     rendered with template T (plain, chatml, llama2, llama3, or a\n"
    "                     FILE.json of per-role prefixes and suffixes); writes\n"
    "                     PREFIX.mask beside the dataset, a byte per token: 1 where the\n"
    "                     model learns (assistant turns), 0 elsewhere (docs/data.md)\n"
    "  --help             this text\n"
    "Exit codes: 0 success, 2 bad input (arguments, a bad document; on any rank), 1 failure.\n";

static const char tokenize_usage[] =
    "usage: trident tokenize [--tokenizer byte|gpt2|tiktoken|sentencepiece|hf]\n"
    "                        [--vocab encoder.json --merges vocab.bpe]\n"
    "                        [--encoding cl100k_base|o200k_base] [--ranks FILE.tiktoken]\n"
    "                        [--model FILE.model] [--decode] FILE|-\n"
    "\n"
    "Print the token ids of a file (or stdin for -), space-separated on one line.\n"
    "The tokenizer defaults to gpt2, its files to those scripts/get_corpus.sh installs.\n"
    "Ill-formed UTF-8 reads as U+FFFD, as in the reference encoders.\n"
    "--decode: the file holds ids (separated by white space); print their text and\n"
    "a newline.\n"
    "Exit codes: 0 success, 2 bad input (arguments, an unreadable file), 1 failure.\n";

static int usage_error(const char *cmd, const char *usage, const char *fmt, const char *arg)
{
    fprintf(stderr, "trident %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n---> see `trident %s --help`\n\n%s", cmd, usage);
    return TRD_EXIT_INPUT;
}

#define TOKENIZERS "byte, gpt2, tiktoken, sentencepiece or hf"

/* A tokenizer name that is not known, or sentencepiece without --model
 * (or --model without it): the usage error, and 1. */
static int tokenizer_args_error(const char *name, const char *model, const char *cmd,
                                const char *usage)
{
    const int spm = !strcmp(name, "sentencepiece"), hf = !strcmp(name, "hf");
    if (strcmp(name, "byte") && strcmp(name, "gpt2") && strcmp(name, "tiktoken") && !spm && !hf)
        return usage_error(cmd, usage, "unknown tokenizer '%s' (" TOKENIZERS ")", name) != 0;
    if (spm && !model)
        return usage_error(cmd, usage, "%s",
                           "--tokenizer sentencepiece needs --model FILE.model") != 0;
    if (hf && !model)
        return usage_error(cmd, usage, "%s", "--tokenizer hf needs --model tokenizer.json") != 0;
    if (!spm && !hf && model)
        return usage_error(cmd, usage, "--model is for --tokenizer sentencepiece or hf, not '%s'",
                           name) != 0;
    return 0;
}

/* Value of an option that takes one; NULL when it is missing. */
static const char *option_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)
        return NULL;
    return argv[++*i];
}

/* Parse prepare-data's arguments; returns -1 after --help, else an exit
 * code (0 when args is filled). */
static int parse_prepare(int argc, char **argv, PrepareArgs *a)
{
    const char *cmd = "prepare-data";
    memset(a, 0, sizeof *a);
    a->vocab = DATA_GPT2_ENCODER_DEFAULT;
    a->merges = DATA_GPT2_MERGES_DEFAULT;
    a->format = "megatron";
    a->workers = 1;
    a->encoding = "cl100k_base";
    a->input_format = "auto";
    a->json_key = "text";
    a->inputs = calloc((size_t)argc, sizeof *a->inputs);
    if (!a->inputs)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory parsing arguments");
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], **dst = NULL, *v;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            fputs(prepare_usage, stdout);
            return -1;
        }
        if (strcmp(o, "--input") == 0) {
            int before = a->n_inputs;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                a->inputs[a->n_inputs++] = argv[++i];
            if (a->n_inputs == before)
                return usage_error(cmd, prepare_usage, "%s needs at least one file", o);
            continue;
        }
        if (strcmp(o, "--skip-bad") == 0 || strcmp(o, "--progress") == 0) {
            *(o[2] == 's' ? &a->skip_bad : &a->progress) = 1;
            continue;
        }
        if (strcmp(o, "--shards") == 0) {
            a->shards = 1;
            continue;
        }
        if (strcmp(o, "--tokenizer") == 0)
            dst = &a->tokenizer;
        else if (strcmp(o, "--encoding") == 0)
            dst = &a->encoding;
        else if (strcmp(o, "--ranks") == 0)
            dst = &a->ranks;
        else if (strcmp(o, "--model") == 0)
            dst = &a->model;
        else if (strcmp(o, "--input-format") == 0)
            dst = &a->input_format;
        else if (strcmp(o, "--json-key") == 0)
            dst = &a->json_key;
        else if (strcmp(o, "--vocab") == 0)
            dst = &a->vocab;
        else if (strcmp(o, "--merges") == 0)
            dst = &a->merges;
        else if (strcmp(o, "--out") == 0)
            dst = &a->out;
        else if (strcmp(o, "--format") == 0)
            dst = &a->format;
        else if (strcmp(o, "--ext") == 0)
            dst = &a->ext;
        else if (strcmp(o, "--template") == 0)
            dst = &a->chat_template;
        else if (strcmp(o, "--val-every") != 0 && strcmp(o, "--workers") != 0)
            return usage_error(cmd, prepare_usage, "unknown argument '%s'", o);
        /* --ext '' (files without an extension) is a value, not a missing one */
        if (!strcmp(o, "--ext") && i + 1 < argc && !argv[i + 1][0])
            v = argv[++i];
        else if (!(v = option_value(argc, argv, &i)))
            return usage_error(cmd, prepare_usage, "%s needs a value", o);
        if (dst) {
            *dst = v;
            continue;
        }
        char *end;
        long *num = strcmp(o, "--workers") == 0 ? &a->workers : &a->val_every;
        errno = 0;
        *num = strtol(v, &end, 10);
        if (*end || errno || *num < 1 || (num == &a->workers && *num > 256))
            return usage_error(cmd, prepare_usage,
                               num == &a->workers
                                   ? "--workers needs an integer from 1 to 256, got '%s'"
                                   : "--val-every needs a positive integer, got '%s'",
                               v);
    }
    if (a->n_inputs == 0)
        return usage_error(cmd, prepare_usage, "%s", "no --input files");
    if (!a->out)
        return usage_error(cmd, prepare_usage, "%s", "no --out PREFIX");
    if (!a->tokenizer)
        return usage_error(cmd, prepare_usage, "%s", "no --tokenizer (" TOKENIZERS ")");
    if (tokenizer_args_error(a->tokenizer, a->model, cmd, prepare_usage))
        return TRD_EXIT_INPUT;
    if (strcmp(a->input_format, "auto") && strcmp(a->input_format, "text") &&
        strcmp(a->input_format, "jsonl"))
        return usage_error(cmd, prepare_usage, "unknown --input-format '%s' (auto, text or jsonl)",
                           a->input_format);
    if (!a->json_key[0])
        return usage_error(cmd, prepare_usage, "%s", "--json-key needs a non-empty key");
    if (strcmp(a->format, "megatron") != 0 && strcmp(a->format, "llmc") != 0)
        return usage_error(cmd, prepare_usage, "unknown format '%s' (megatron or llmc)", a->format);
    return 0;
}

int data_prepare_main(int argc, char **argv)
{
    PrepareArgs a;
    int rc = parse_prepare(argc, argv, &a);
    if (rc == 0)
        rc = data_prepare(&a);
    free(a.inputs);
    comm_finalize(); /* under mpiexec (data_prepare started MPI) */
    return rc < 0 ? TRD_EXIT_OK : rc;
}

/* --decode: the ids of a text (decimal, separated by white space); exits 2
 * naming the first word that is not one. */
static int32_t *parse_ids(const char *text, const char *file, size_t *n)
{
    size_t cap = 0;
    int32_t *ids = NULL;
    *n = 0;
    for (const char *p = text;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (!*p)
            return ids;
        char *end;
        errno = 0;
        const long v = strtol(p, &end, 10);
        const int word = (int)strcspn(p, " \t\r\n");
        if (end != p + word || errno || v < INT32_MIN || v > INT32_MAX)
            trd_fatal(TRD_EXIT_INPUT, "--decode reads token ids, e.g. `15496 995`",
                      "%s: '%.*s' is not a token id (at byte %zu)", file, word < 40 ? word : 40, p,
                      (size_t)(p - text));
        if (*n == cap) {
            cap = cap ? 2 * cap : 1024;
            ids = realloc(ids, cap * sizeof *ids);
            if (!ids)
                trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory reading %s", file);
        }
        ids[(*n)++] = (int32_t)v;
        p = end;
    }
}

int data_tokenize_main(int argc, char **argv)
{
    const char *cmd = "tokenize", *name = "gpt2", *vocab = DATA_GPT2_ENCODER_DEFAULT,
               *merges = DATA_GPT2_MERGES_DEFAULT, *encoding = "cl100k_base", *ranks = NULL,
               *model = NULL, *file = NULL;
    int decode = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], **dst = NULL, *v;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            fputs(tokenize_usage, stdout);
            return TRD_EXIT_OK;
        }
        if (strcmp(o, "--tokenizer") == 0)
            dst = &name;
        else if (strcmp(o, "--vocab") == 0)
            dst = &vocab;
        else if (strcmp(o, "--merges") == 0)
            dst = &merges;
        else if (strcmp(o, "--encoding") == 0)
            dst = &encoding;
        else if (strcmp(o, "--ranks") == 0)
            dst = &ranks;
        else if (strcmp(o, "--model") == 0)
            dst = &model;
        else if (strcmp(o, "--decode") == 0) {
            decode = 1;
            continue;
        } else if (strncmp(o, "--", 2) == 0)
            return usage_error(cmd, tokenize_usage, "unknown argument '%s'", o);
        else if (file)
            return usage_error(cmd, tokenize_usage, "more than one FILE ('%s')", o);
        else {
            file = o;
            continue;
        }
        if (!(v = option_value(argc, argv, &i)))
            return usage_error(cmd, tokenize_usage, "%s needs a value", o);
        *dst = v;
    }
    if (!file)
        return usage_error(cmd, tokenize_usage, "%s", "no FILE (use - for stdin)");
    if (tokenizer_args_error(name, model, cmd, tokenize_usage))
        return TRD_EXIT_INPUT;
    TokenizerSpec ts = {name, vocab, merges, encoding, ranks, model};
    Tokenizer *tok = data_tokenizer_make(&ts);
    size_t len, n = 0, cap = 0;
    char *text = data_read_input(file, &len);
    int32_t *ids = NULL;
    if (decode) {
        ids = parse_ids(text, file, &n);
        char *out = tokenizer_decode(tok, ids, n);
        if (!out)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory decoding %s", file);
        fputs(out, stdout);
        free(out);
    } else {
        if (tokenizer_encode(tok, text, len, &ids, &n, &cap) != 0)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "out of memory tokenizing %s", file);
        for (size_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
    }
    putchar('\n');
    free(ids);
    free(text);
    tokenizer_free(tok);
    return fflush(stdout) == 0 ? TRD_EXIT_OK : TRD_EXIT_RUNTIME;
}
