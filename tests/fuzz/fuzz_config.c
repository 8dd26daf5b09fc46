/* fuzz_config.c — the YAML config loader, --set and the validator, as
 * cli_read_config runs them for every config-driven command.
 *
 * Input: the YAML file, then optionally a NUL byte and --set assignments,
 * one per line (as many as the command line takes, CLI_MAX_SETS).  The
 * validator runs for one rank and for a world of 8, and a config that
 * passes goes on to the memory check's plan (memcheck_plan). */
#include <stdlib.h>
#include <string.h>

#include "cli/cli_config.h"
#include "fuzz.h"
#include "train/memcheck.h"

FUZZ_INIT(NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *yaml, *sets;
    const uint8_t *rest;
    size_t rest_n;
    fuzz_split(data, size, &yaml, &rest, &rest_n);
    sets = malloc(rest_n + 1);
    if (!sets)
        abort();
    memcpy(sets, rest, rest_n);
    sets[rest_n] = '\0';

    CliConfig cli = {.config_path = fuzz_file("config.yaml", data, strlen(yaml))};
    for (char *save = NULL, *s = strtok_r(sets, "\n", &save); s && cli.n_sets < CLI_MAX_SETS;
         s = strtok_r(NULL, "\n", &save))
        cli.sets[cli.n_sets++] = s;

    FUZZ_GUARD();
    static Config cfg; /* 200 KB: not on libFuzzer's stack */
    char err[CFG_ERR] = "";
    int rc = cli_read_config(&cfg, &cli, 1, err);
    fuzz_check(rc, -1, err, "cli_read_config (world 1)");
    /* What train does next with a valid config, before allocating the
     * model: the memory check's plan (the parameter table, stage split and
     * schedule of every rank), where a count that passed validation but
     * is still absurd would reach the allocator. */
    double total, host;
    if (rc == 0)
        memcheck_plan(&cfg, 1, &total, &host);
    if (rc == 0) {
        err[0] = '\0';
        rc = cli_read_config(&cfg, &cli, 8, err);
        fuzz_check(rc, -1, err, "cli_read_config (world 8)");
        if (rc == 0)
            memcheck_plan(&cfg, 8, &total, &host);
    }
    free(yaml);
    free(sets);
    return 0;
}
