/* bench_ckpt — checkpoint write and read bandwidth (bench/ckpt.sh runs it).
 *
 *   bench_ckpt save DIR [--layers L] [--hidden C] [--bf16]
 *   bench_ckpt load DIR [--layers L] [--hidden C] [--bf16]
 *   bench_ckpt size - [--layers L] [--hidden C] [--bf16]   (bytes a save writes)
 *
 * A GPT-2 shaped model (vocab 50257) on every rank of `mpiexec -n N`,
 * N = dp (ZeRO 1: weights written in dp pieces, optimizer state sharded).
 * save writes DIR/step_00000001 and prints bytes, seconds and MB/s; load
 * reads it back into the same layout and checks a few values.  The two are
 * separate runs so that the script can drop the page cache in between. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "comm/comm.h"
#include "core/error.h"

static float value(size_t i, int k)
{
    return (float)((i * 2654435761u + (size_t)k) % 1000) * 1e-3f;
}

int main(int argc, char **argv)
{
    comm_init(&argc, &argv);
    Comm world = comm_world();
    if (argc < 3 ||
        (strcmp(argv[1], "save") && strcmp(argv[1], "load") && strcmp(argv[1], "size"))) {
        if (world.rank == 0)
            fprintf(stderr,
                    "usage: bench_ckpt save|load|size DIR [--layers L] [--hidden C] [--bf16]\n");
        comm_finalize();
        return 2;
    }
    const int save = !strcmp(argv[1], "save");
    const char *dir = argv[2];
    Config cfg;
    config_defaults(&cfg);
    ModelConfig *m = &cfg.model;
    m->arch = ARCH_GPT2;
    m->layers = 8;
    m->hidden = 512;
    m->heads = 8;
    m->vocab = 50257;
    m->vocab_pad_multiple = 128;
    m->seq_len = 1024;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            m->layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc)
            m->hidden = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bf16"))
            cfg.training.precision = PREC_BF16;
    }
    m->kv_heads = m->heads;
    m->ffn_hidden = 4 * m->hidden;
    m->tie_embeddings = 1;
    cfg.topology.dp = world.size;
    cfg.topology.zero = 1;

    ParamShard sh = params_full_shard(m);
    ParamTable t;
    params_build(&t, m, &sh);
    const int master = cfg.training.precision == PREC_BF16;
    /* Stored bytes: real vocabulary rows only, each kind once. */
    size_t elems = 0;
    for (int i = 0; i < t.n; i++) {
        int64_t rows = t.p[i].shape[0];
        if (t.p[i].role != ROLE_BLOCK && t.p[i].split_dim == 0)
            rows = m->vocab;
        elems += (size_t)(rows * t.p[i].shape[1]);
    }
    const double bytes = (double)elems * sizeof(float) * (master ? 4 : 3);
    if (!strcmp(argv[1], "size")) {
        if (world.rank == 0)
            printf("%.0f\n", bytes);
        params_free(&t);
        comm_finalize();
        return 0;
    }
    CkptShardView v;
    ckpt_view_init(&v, &t, 1, world.rank, world.size, 0, &world);
    for (int k = 0; k < CKPT_KINDS; k++) {
        if (k == CKPT_MASTER && !master)
            continue;
        size_t n = v.part[k].hi - v.part[k].lo;
        v.part[k].data = trd_malloc(n * sizeof(float), "bench buffer");
        for (size_t i = 0; i < n; i++)
            v.part[k].data[i] = save ? value(v.part[k].lo + i, k) : -1.0f;
    }

    char err[CFG_ERR];
    CkptState st = {.step = 1, .sampler_position = 8};
    comm_barrier(&world);
    double t0 = comm_wtime();
    int rc;
    if (save) {
        rc = ckpt_save(dir, &v, &st, &cfg, 1, err);
    } else {
        char step_dir[CFG_STR];
        snprintf(step_dir, sizeof step_dir, "%s/step_00000001", dir);
        rc = ckpt_load(step_dir, &v, &st, &cfg, err);
    }
    comm_barrier(&world);
    double dt = comm_wtime() - t0;
    if (rc != 0)
        trd_fatal(TRD_EXIT_RUNTIME, NULL, "bench_ckpt: %s", err);

    if (!save) {
        /* A spot check that what came back is what was written. */
        int bad = 0;
        for (int k = 0; k < CKPT_KINDS; k++) {
            if (!v.part[k].data)
                continue;
            size_t n = v.part[k].hi - v.part[k].lo, step = n / 1000 + 1;
            for (size_t i = 0; i < n; i += step) {
                size_t flat = v.part[k].lo + i;
                const ParamSpec *wte = params_find(&t, "embed.wte.weight");
                int pad = flat >= wte->offset + (size_t)m->vocab * (size_t)m->hidden &&
                          flat < wte->offset + wte->numel;
                if (!pad && v.part[k].data[i] != value(flat, k))
                    bad++;
            }
        }
        comm_allreduce_max_i32(&world, &bad, 1);
        if (bad)
            trd_fatal(TRD_EXIT_RUNTIME, NULL, "bench_ckpt: %d values read back wrong", bad);
    }
    if (world.rank == 0)
        printf("%s ranks %d params %zu bytes %.0f seconds %.3f MBps %.1f\n", argv[1], world.size,
               t.global_numel, bytes, dt, bytes / dt / 1e6);
    for (int k = 0; k < CKPT_KINDS; k++)
        free(v.part[k].data);
    params_free(&t);
    comm_finalize();
    return 0;
}
