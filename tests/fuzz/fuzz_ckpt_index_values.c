/* fuzz_ckpt_index_values.c — the checkpoint index's attribute checks on
 * values in memory: ckpt_index_check, the function ckpt_index_read calls
 * on what it read.  A valid index.h5 is written and read once; each input
 * overwrites, in order, the values of the copy its bytes reach (/state
 * step, sampler_position, lr_step, adam_t; /model layers, hidden, heads,
 * kv_heads, ffn_hidden, vocab, seq_len, tie_embeddings; /topology tp, pp,
 * dp, zero, world, stage_layers[]), the rest keeping the real index's.
 * fuzz_ckpt_index fuzzes the same values through HDF5 (a few inputs a
 * second); this one reaches the checks at memory speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt_internal.h"
#include "fuzz.h"
#include "fuzz_index.h"

static CkptIndex base; /* the values of a real index */

static void setup(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/index.h5", fuzz_dir());
    fuzz_write_index(path, "fuzz_ckpt_index_values");
    char err[CFG_ERR];
    if (ckpt_index_read(path, &base, err) != 0) {
        fprintf(stderr, "fuzz_ckpt_index_values: %s\n", err);
        abort();
    }
}

FUZZ_INIT(setup)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    CkptIndex ix = base;
    struct {
        void *p;
        size_t n;
    } field[] = {
        {&ix.state.step, 8},
        {&ix.state.sampler_position, 8},
        {&ix.state.lr_step, 8},
        {&ix.state.adam_t, 8},
        {&ix.layers, 4},
        {&ix.hidden, 4},
        {&ix.heads, 4},
        {&ix.kv_heads, 4},
        {&ix.ffn_hidden, 4},
        {&ix.vocab, 4},
        {&ix.seq_len, 4},
        {&ix.tie_embeddings, 4},
        {&ix.tp, 4},
        {&ix.pp, 4},
        {&ix.dp, 4},
        {&ix.zero, 4},
        {&ix.world, 4},
        {ix.stage_layers, sizeof ix.stage_layers},
    };
    for (size_t i = 0; i < sizeof field / sizeof field[0] && size; i++) {
        const size_t n = size < field[i].n ? size : field[i].n;
        memcpy(field[i].p, data, n);
        data += n;
        size -= n;
    }
    FUZZ_GUARD();
    char err[CFG_ERR] = "";
    const int rc = ckpt_index_check("index.h5", &ix, err);
    fuzz_check(rc, -1, err, "ckpt_index_check");
    if (rc == 0) {
        char line[512];
        ckpt_index_model_line(&ix, line, sizeof line);
    }
    return 0;
}
