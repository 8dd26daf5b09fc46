/* plan_search.c — every valid layout of a cluster, ranked (trident plan --search).
 *
 * Enumerated: tp (divisors of the GPUs per node, so TP stays on NVLink),
 * pp (divisors of what is left, up to the layer count), dp the rest; ZeRO
 * stage 0-3; micro-batch 1, 2, 4, 8 (dividing the per-rank batch); virtual
 * stages 1, 2, 4 with pp > 1; recompute none, selective, full; context
 * parallelism cp 1, 2, 4, ... (dividing what tp and pp leave, 2 cp dividing
 * seq_len) for sequences of PLAN_CP_MIN_SEQ tokens and more; with the
 * CUDA backend, topology.offload none, optimizer and (ZeRO-3) optimizer+params.  Sequence
 * parallelism is on whenever tp > 1 (it only saves memory; the bytes are
 * the same).  Each candidate goes through the trainer's config validation
 * and refusals, then plan_evaluate; those that fit are ranked by tokens/s,
 * ties going to less memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static int better(const PlanResult *a, const PlanResult *b)
{
    if (a->fits != b->fits)
        return a->fits;
    if (!a->fits) /* among those that do not fit: the closest */
        return a->st[a->worst].total < b->st[b->worst].total;
    if (fabs(a->tokens_per_s - b->tokens_per_s) > 1e-9 * b->tokens_per_s)
        return a->tokens_per_s > b->tokens_per_s;
    return a->st[a->worst].total < b->st[b->worst].total;
}

/* Keep the best `max` in out[0..*n), best first (insertion). */
static void keep(PlanCandidate *out, int max, int *n, const PlanResult *r)
{
    int at = *n;
    while (at > 0 && better(r, &out[at - 1].r))
        at--;
    if (at >= max)
        return;
    int last = *n < max ? *n : max - 1;
    memmove(&out[at + 1], &out[at], (size_t)(last - at) * sizeof *out);
    out[at].r = *r;
    out[at].why[0] = '\0';
    if (*n < max)
        (*n)++;
}

/* The few numbers that decide a candidate's rank, in words. */
static void explain(PlanCandidate *c, double capacity)
{
    const PlanResult *r = &c->r;
    const PlanStage *w = &r->st[r->worst];
    double tp_share = 0, p2p_share = 0, cp_share = 0;
    for (int k = 0; k < r->pp; k++) {
        tp_share = fmax(tp_share, r->st[k].t_tp * r->n_micro / r->t_step);
        p2p_share = fmax(p2p_share, r->st[k].t_p2p * r->n_micro / r->t_step);
        cp_share = fmax(cp_share, r->st[k].t_cp * r->n_micro / r->t_step);
    }
    const int n = snprintf(c->why, sizeof c->why,
                           "%.1f/%.0f GiB; bubble %.1f%%; TP comm %.1f%% of step (%s); PP p2p "
                           "%.1f%%; DP+optimizer %.1f%%",
                           w->total / GIB, capacity / GIB, 100 * r->bubble * r->t_pipe / r->t_step,
                           100 * tp_share, plan_link_name(r->tp_link), 100 * p2p_share,
                           100 * r->t_dp_exposed / r->t_step);
    int m = n;
    if (r->cp > 1 && m > 0 && (size_t)m < sizeof c->why)
        m += snprintf(c->why + m, sizeof c->why - (size_t)m, "; CP comm %.1f%% (%s)",
                      100 * cp_share, plan_link_name(r->cp_link));
    if (r->offload && m > 0 && (size_t)m < sizeof c->why)
        snprintf(c->why + m, sizeof c->why - (size_t)m, "; host %.0f/%.0f GiB per node",
                 r->host_node / GIB, r->host_capacity / GIB);
}

int plan_search_cp(const Config *cfg) { return cfg->model.seq_len >= PLAN_CP_MIN_SEQ; }

int plan_search_offload(const Config *cfg) { return cfg->backend == BACKEND_CUDA; }

/* The trainer's own config validation decides what a valid layout is. */
static int valid(Config *cfg, int world)
{
    char err[CFG_ERR];
    return config_validate(cfg, world, err) == 0;
}

int plan_search(const Config *cfg, const PlanCluster *c, PlanCandidate *out, int max, int *n_fit,
                int *n_tried)
{
    static const int micro[] = {1, 2, 4, 8};
    static const int virt[] = {1, 2, 4};
    static const Recompute rcs[] = {RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL};
    const int world = cluster_gpus(c), gpn = c->gpus_per_node;
    int n = 0;
    *n_fit = *n_tried = 0;
    for (int tp = 1; tp <= gpn; tp++) {
        if (gpn % tp)
            continue;
        for (int pp = 1; pp <= cfg->model.layers && pp <= CFG_MAX_STAGES; pp++) {
            if ((world / tp) % pp || world % tp)
                continue;
            const int max_cp = plan_search_cp(cfg) ? world / (tp * pp) : 1;
            for (int cp = 1; cp <= max_cp; cp *= 2) {
                if ((world / (tp * pp)) % cp || (cp > 1 && cfg->model.seq_len % (2 * cp)))
                    continue;
                const int dp = world / (tp * pp * cp);
                const int n_off = plan_search_offload(cfg) ? 3 : 1;
                for (int off = 0; off < n_off; off++)
                    for (int z = 0; z <= 3; z++)
                        for (size_t mi = 0; mi < sizeof micro / sizeof *micro; mi++)
                            for (size_t vi = 0; vi < sizeof virt / sizeof *virt; vi++)
                                for (size_t ri = 0; ri < sizeof rcs / sizeof *rcs; ri++) {
                                    const int v = virt[vi];
                                    if (v > 1 && (pp == 1 || cfg->model.layers % (pp * v)))
                                        continue;
                                    Config cand = *cfg;
                                    plan_apply_layout(&cand, tp, pp, dp, z, micro[mi], v, rcs[ri]);
                                    cand.topology.cp = cp;
                                    if (n_off > 1) /* validation: params with ZeRO-3 only */
                                        cand.topology.offload = (OffloadKind)off;
                                    cand.topology.ranks_per_node = gpn < world ? gpn : world;
                                    if (!valid(&cand, world))
                                        continue;
                                    PlanResult r;
                                    char err[CFG_ERR];
                                    if (plan_evaluate(&cand, c, &r, err) != 0)
                                        continue;
                                    (*n_tried)++;
                                    *n_fit += r.fits;
                                    keep(out, max, &n, &r);
                                }
            }
        }
    }
    for (int i = 0; i < n; i++)
        explain(&out[i], out[i].r.capacity);
    return n;
}

static const char *offload_phrase(int offload)
{
    return offload == OFFLOAD_PARAMS      ? ", offload optimizer+params"
           : offload == OFFLOAD_OPTIMIZER ? ", offload optimizer"
                                          : "";
}

int plan_suggest(const Config *cfg, const PlanCluster *c, char *buf, size_t len)
{
    PlanCandidate best;
    int fit, tried;
    if (plan_search(cfg, c, &best, 1, &fit, &tried) < 1 || !best.r.fits) {
        snprintf(buf, len,
                 "no layout of %d GPUs fits (%d tried): use more GPUs, a smaller "
                 "global batch or a smaller model",
                 cluster_gpus(c), tried);
        return -1;
    }
    const PlanResult *r = &best.r;
    char cp[16] = "";
    if (r->cp > 1)
        snprintf(cp, sizeof cp, ", cp %d", r->cp);
    snprintf(buf, len,
             "tp %d, pp %d, dp %d%s, zero %d%s, micro_batch %d, virtual_stages %d, recompute %s: "
             "%.1f GiB per GPU, %.0f tokens/s, MFU %.1f%% (best of %d layouts that fit; "
             "trident plan --search lists more)",
             r->tp, r->pp, r->dp, cp, r->zero, offload_phrase(r->offload), r->micro_batch,
             r->virtual_stages,
             r->recompute == RECOMPUTE_NONE        ? "none"
             : r->recompute == RECOMPUTE_SELECTIVE ? "selective"
                                                   : "full",
             r->st[r->worst].total / GIB, r->tokens_per_s, 100 * r->mfu, fit);
    return 0;
}
