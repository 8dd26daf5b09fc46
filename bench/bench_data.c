/* bench_data — the data loader alone: global batches of samples read from
 * a blend (data/blend.h) as a training rank reads them, timed per step.
 *
 *   bench_data --blend "W1 PATH1 W2 PATH2 ..." [--seq T] [--batch B] [--steps N]
 *
 * Prints the milliseconds per step (best and mean after the first, which
 * maps the shards it touches) and the tokens per second. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "data/blend.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    const char *blend = NULL;
    int seq = 1024, batch = 512, steps = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--blend"))
            blend = argv[i + 1];
        else if (!strcmp(argv[i], "--seq"))
            seq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch"))
            batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
    }
    char err[CFG_ERR];
    BlendSpec spec;
    if (!blend || seq < 1 || batch < 1 || steps < 2 || config_blend_parse(blend, &spec, err)) {
        fprintf(stderr,
                "usage: bench_data --blend \"W1 PATH1 ...\" [--seq T] [--batch B] "
                "[--steps N >= 2]%s%s\n",
                blend ? ": " : "", blend ? err : "");
        return 2;
    }
    Blend b;
    double t0 = now_s();
    if (blend_open(&b, &spec, DATA_MEGATRON, seq, 1234, 1 << 30, err) != 0) {
        fprintf(stderr, "bench_data: %s\n", err);
        return 2;
    }
    const double open_s = now_s() - t0;
    int32_t *tok = malloc((size_t)seq * sizeof *tok), *tgt = malloc((size_t)seq * sizeof *tgt);
    double best = 1e30, sum = 0, first = 0;
    for (int s = 0; s < steps; s++) {
        t0 = now_s();
        for (int j = 0; j < batch; j++)
            if (blend_read(&b, (uint64_t)s * (uint64_t)batch + (uint64_t)j, tok, tgt, err) != 0) {
                fprintf(stderr, "bench_data: %s\n", err);
                return 1;
            }
        const double ms = 1e3 * (now_s() - t0);
        if (s == 0)
            first = ms;
        else {
            sum += ms;
            best = ms < best ? ms : best;
        }
    }
    int shards = 0;
    for (int d = 0; d < b.n; d++)
        shards += b.data[d].n_shards;
    printf("loader: %d datasets, %d shards, opened in %.1f ms; %d x %d tokens per step: best %.2f "
           "ms, mean %.2f ms (%.1f M tokens/s); first step %.2f ms (mapping its shards)\n",
           b.n, shards, 1e3 * open_s, batch, seq + 1, best, sum / (steps - 1),
           (double)batch * (seq + 1) / best / 1e3, first);
    free(tok);
    free(tgt);
    blend_close(&b);
    return 0;
}
