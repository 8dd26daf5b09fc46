/* cli_config.h — the part of the command line every config-driven front end
 * shares (train, run, plan, topology, eval, ckpt import):
 *
 *     trident COMMAND CONFIG [--set key.path=value ...] [COMMAND's options]
 *
 * --set (or --set=key.path=value) overrides one config key, in the order
 * given; its errors name the argument (config.h, config_set). */
#ifndef TRD_CLI_CONFIG_H
#define TRD_CLI_CONFIG_H

#include <stdio.h>

#include "config/config.h"

#define CLI_MAX_SETS 64

typedef struct {
    const char *config_path; /* the positional CONFIG (NULL: none given) */
    const char *sets[CLI_MAX_SETS];
    int n_sets;
} CliConfig;

/* A command's own options: take argv[*i] (advancing *i past a value it
 * consumes) and return 1, or return 0 when it is not one of them.  Bad
 * values exit 2. */
typedef int (*CliOption)(void *ctx, int argc, char **argv, int *i);

/* Parse argv[1..]: --help / -h print usage to stdout and return 1; --set
 * and CONFIG are recorded in c; everything else goes to option (may be
 * NULL).  An unknown argument, a second CONFIG or none: usage on stderr,
 * a message, exit 2.  Returns 0. */
int cli_parse(int argc, char **argv, CliConfig *c, void (*usage)(FILE *), CliOption option,
              void *ctx);

/* If argv[*i] is --set VALUE or --set=VALUE: record it, advance *i, return
 * 1; else 0.  (For front ends whose positional argument is not a CONFIG.) */
int cli_take_set(CliConfig *c, int argc, char **argv, int *i);

/* Apply c's --set overrides to cfg in order.  Returns 0 or -1 with err. */
int cli_apply_sets(Config *cfg, const CliConfig *c, char err[CFG_ERR]);

/* config_load(c->config_path) and the overrides; with world >= 0 also
 * config_validate(cfg, world) (0: the world-independent rules only).
 * Returns 0 or -1 with err. */
int cli_read_config(Config *cfg, const CliConfig *c, int world, char err[CFG_ERR]);

#endif
