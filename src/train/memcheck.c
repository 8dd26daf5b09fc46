/* memcheck.c — the state a rank needs against the machine's RAM (memcheck.h). */
#include "train/memcheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/error.h"

double memcheck_state_bytes(const Config *cfg)
{
    const ModelConfig *m = &cfg->model;
    const TopologyConfig *t = &cfg->topology;
    /* Doubles: config validation bounded the counts to 2^48, so these are
     * exact enough and cannot wrap. */
    const double C = m->hidden, F = m->ffn_hidden, L = m->layers;
    const double kvd = C / m->heads * m->kv_heads;
    const int mult = t->tp * m->vocab_pad_multiple;
    const double Vp = (double)((m->vocab + mult - 1) / mult) * mult;
    /* Per layer: q and output projections, k and v, the MLP matrices (two
     * for GPT-2, three for SwiGLU); one embedding table.  Norms, biases and
     * the position table are left out: a lower bound. */
    const double per_layer = 2 * C * C + 2 * C * kvd + (m->arch == ARCH_GPT2 ? 2 : 3) * C * F;
    const double params = L * per_layer + Vp * C;
    const double dp = t->dp > 0 ? t->dp : 1;
    const int z = t->zero;
    const double adam = cfg->training.precision == PREC_BF16 ? 12 : 8; /* m, v [, master] */
    const double per_param = 4 / (z >= 3 ? dp : 1) + 4 / (z >= 2 ? dp : 1) +
                             adam / (z >= 1 ? dp : 1);
    return params / ((double)t->tp * t->pp) * per_param;
}

/* Physical memory, or the cgroup (v2) limit when that is lower: a job
 * step under Slurm usually has one. */
static double machine_bytes(void)
{
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        double lim;
        if (fscanf(f, "%lf", &lim) == 1 && lim > 0 && lim < ram) /* "max" does not scan */
            ram = lim;
        fclose(f);
    }
    return ram;
}

void memcheck_host(const Config *cfg, int ranks_per_node, int device_backend, Comm *world)
{
    if (device_backend)
        return;
    const double need = memcheck_state_bytes(cfg), node = need * ranks_per_node;
    const double ram = machine_bytes();
    /* Nodes may differ: any node short of memory stops the job. */
    int refuse = node > ram;
    comm_allreduce_max_i32(world, &refuse, 1);
    if (!refuse)
        return;
    if (world->rank == 0) {
        const double gib = 1024.0 * 1024.0 * 1024.0;
        fprintf(stderr, "trident: error: the model needs at least %.1f GiB per rank for "
                "parameters, gradients and optimizer state (%d rank(s) per node: %.1f GiB), "
                "more than this machine's %.1f GiB of RAM\n"
                "---> split it over more ranks (topology.tp, topology.pp), shard the optimizer "
                "state over data-parallel ranks (topology.zero 1-3), or train a smaller model\n",
                need / gib, ranks_per_node, node / gib, ram / gib);
        fflush(stderr);
    }
    comm_finalize();
    exit(TRD_EXIT_INPUT);
}
