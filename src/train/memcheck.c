/* memcheck.c — the memory a rank needs against the memory it has (memcheck.h). */
#include "train/memcheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "plan/plan.h"

static const double GIB = 1024.0 * 1024.0 * 1024.0;

MemBudget memcheck_host_budget(int ranks_per_node)
{
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) { /* a job step under Slurm usually has one; "max" does not scan */
        double lim;
        if (fscanf(f, "%lf", &lim) == 1 && lim > 0 && lim < ram)
            ram = lim;
        fclose(f);
    }
    return (MemBudget){.bytes = ram, .sharers = ranks_per_node, .what = "this machine's RAM"};
}

/* The planner on a cluster shaped like this job: its per-rank bytes do not
 * depend on link speeds or peaks, only on the layout and element sizes. */
static int plan_job(const Config *cfg, int ranks_per_node, PlanResult *r)
{
    PlanCluster c;
    char err[CFG_ERR];
    if (cluster_preset("cpu", &c, err) != 0)
        return -1;
    const int world = cfg->topology.tp * cfg->topology.pp * cfg->topology.dp * cfg->topology.cp;
    c.gpus_per_node = ranks_per_node > 0 ? ranks_per_node : 1;
    c.nodes = (world + c.gpus_per_node - 1) / c.gpus_per_node;
    c.reserve_gib = 0;
    return plan_evaluate(cfg, &c, r, err);
}

int memcheck_plan(const Config *cfg, int ranks_per_node, double *total, double *host_ckpt)
{
    PlanResult *r = trd_malloc(sizeof *r, "memory plan");
    const int rc = plan_job(cfg, ranks_per_node, r);
    *total = rc == 0 ? r->st[r->worst].total : 0;
    *host_ckpt = rc == 0 ? r->st[r->worst].host_ckpt : 0;
    free(r);
    return rc;
}

void memcheck(const Config *cfg, int ranks_per_node, MemBudget budget, Comm *world)
{
    PlanResult *r = trd_malloc(sizeof *r, "memory plan");
    int refuse = plan_job(cfg, ranks_per_node, r) == 0 &&
                 r->st[r->worst].total * budget.sharers > budget.bytes;
    /* Nodes and devices may differ: any rank short of memory stops the job. */
    comm_allreduce_max_i32(world, &refuse, 1);
    if (!refuse) {
        free(r);
        return;
    }
    if (world->rank == 0) {
        const PlanStage *s = &r->st[r->worst];
        fprintf(stderr,
                "trident: error: a rank of pipeline stage %d needs %.1f GiB (parameters "
                "%.1f, gradients %.1f, optimizer %.1f, buffers %.1f, activations %.1f, "
                "scratch %.1f GiB, as `trident plan` counts them); %d rank(s) share %s: "
                "%.1f GiB, more than its %.1f GiB\n"
                "---> split the model over more ranks (topology.tp, topology.pp), shard the "
                "optimizer state, gradients and weights over data-parallel ranks "
                "(topology.zero 1-3), lower training.micro_batch or model.seq_len, or set "
                "training.recompute: full (activations); `trident plan CONFIG --search` "
                "finds a layout that fits\n",
                r->worst, s->total / GIB, s->params / GIB, s->grads / GIB, s->optimizer / GIB,
                s->buffers / GIB, s->activations / GIB, s->scratch / GIB, budget.sharers,
                budget.what, s->total * budget.sharers / GIB, budget.bytes / GIB);
        fflush(stderr);
    }
    free(r);
    comm_finalize();
    exit(TRD_EXIT_INPUT);
}
