/* fuzz_index.h — the valid checkpoint index both index harnesses start
 * from (fuzz_ckpt_index: its HDF5 bytes; fuzz_ckpt_index_values: its
 * values): tests/fuzz/seeds/config/tiny.yaml's model, one rank, one
 * tensor, written to `path`.  Aborts (a broken harness) on failure. */
#ifndef TRD_FUZZ_INDEX_H
#define TRD_FUZZ_INDEX_H

#include <stdio.h>
#include <stdlib.h>

#include "checkpoint/ckpt_internal.h"

static inline void fuzz_write_index(const char *path, const char *who)
{
    static Config cfg;
    char err[CFG_ERR];
    if (config_load(&cfg, TRD_SOURCE_ROOT "/tests/fuzz/seeds/config/tiny.yaml", err) ||
        config_validate(&cfg, 1, err)) {
        fprintf(stderr, "%s: %s\n", who, err);
        abort();
    }
    CkptIndex ix = {.tp = 1, .pp = 1, .dp = 1, .world = 1, .n = 1};
    ckpt_index_describe(&ix, &cfg, PREC_FP32);
    ix.stage_layers[0] = cfg.model.layers;
    ix.state = (CkptState){.step = 10, .sampler_position = 80, .lr_step = 10, .adam_t = 10};
    ix.yaml = "run:\n  name: fuzz\n";
    CkptEntry e = {.name = "wte.weight",
                   .kind = "params",
                   .file = "stage_0.h5",
                   .dtype = "float32",
                   .ndim = 2,
                   .shape = {50304, 128},
                   .nbytes = 50304 * 128 * 4};
    ix.e = &e;
    if (ckpt_index_write(path, &ix, err) != 0) {
        fprintf(stderr, "%s: %s\n", who, err);
        abort();
    }
}

#endif
