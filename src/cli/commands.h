/* commands.h — the trident binary's subcommands, one front end each in
 * src/cli (main.c dispatches).  Each takes argv[0] = its own name and
 * returns the process exit code: 0 done, 2 bad arguments or input, 1 a
 * runtime failure (core/error.h).  Those that read a CONFIG share its
 * parsing (cli_config.h). */
#ifndef TRD_CLI_COMMANDS_H
#define TRD_CLI_COMMANDS_H

#include <stdint.h>

int train_main(int argc, char **argv);         /* train_cli.c: one rank of a training job */
int run_main(int argc, char **argv);           /* train_cli.c: mpiexec -n WORLD trident train */
int data_prepare_main(int argc, char **argv);  /* prepare_cli.c: documents into a dataset */
int data_tokenize_main(int argc, char **argv); /* prepare_cli.c: the ids of a text */
int data_main(int argc, char **argv);          /* data_cli.c: data inspect */
int ckpt_main(int argc, char **argv);          /* ckpt_cli.c: inspect, verify, export, import */
int topology_main(int argc, char **argv);      /* topology_cli.c: the rank map, no launch */
int plan_main(int argc, char **argv);          /* plan_cli.c: memory, traffic, time; --search */
int eval_main(int argc, char **argv);          /* eval.c: loss and perplexity, any layout */
int generate_main(int argc, char **argv);      /* generate.c: text from a trained model */
int report_main(int argc, char **argv);        /* report.c: one HTML page of a run */

/* lora_cli.c: `ckpt export --format hf` (merged) or `--format peft` of a
 * checkpoint; a plain one goes to the usual HF export (peft: refused). */
int lora_export(const char *src, const char *out, int peft, int bf16, int64_t max_shard);

#endif
