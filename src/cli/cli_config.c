/* cli_config.c — CONFIG and --set, shared by the front ends (cli_config.h). */
#include "cli/cli_config.h"

#include <string.h>

#include "checkpoint/ckpt.h"
#include "core/error.h"

int cli_take_set(CliConfig *c, int argc, char **argv, int *i)
{
    const char *s = argv[*i];
    const char *value = NULL;
    if (!strcmp(s, "--set") && *i + 1 < argc)
        value = argv[++*i];
    else if (!strncmp(s, "--set=", 6))
        value = s + 6;
    else
        return 0;
    if (c->n_sets == CLI_MAX_SETS)
        trd_fatal(TRD_EXIT_INPUT, NULL, "more than %d --set options", CLI_MAX_SETS);
    c->sets[c->n_sets++] = value;
    return 1;
}

int cli_parse(int argc, char **argv, CliConfig *c, void (*usage)(FILE *), CliOption option,
              void *ctx)
{
    memset(c, 0, sizeof *c);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage(stdout);
            return 1;
        }
        if (cli_take_set(c, argc, argv, &i) || (option && option(ctx, argc, argv, &i)))
            continue;
        if (s[0] == '-' || c->config_path) {
            usage(stderr);
            trd_fatal(TRD_EXIT_INPUT, NULL, "unexpected argument '%s'", s);
        }
        c->config_path = s;
    }
    if (!c->config_path) {
        usage(stderr);
        trd_fatal(TRD_EXIT_INPUT, NULL, "missing CONFIG");
    }
    return 0;
}

int cli_apply_sets(Config *cfg, const CliConfig *c, char err[CFG_ERR])
{
    for (int i = 0; i < c->n_sets; i++)
        if (config_set(cfg, c->sets[i], err) != 0)
            return -1;
    return 0;
}

int cli_read_config(Config *cfg, const CliConfig *c, int world, char err[CFG_ERR])
{
    if (config_load(cfg, c->config_path, err) != 0 || cli_apply_sets(cfg, c, err) != 0 ||
        ckpt_fill_model(cfg, err) != 0)
        return -1;
    return world >= 0 ? config_validate(cfg, world, err) : 0;
}
