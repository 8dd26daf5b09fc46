/* moe.c — the MLP branch of a mixture-of-experts layer (docs/moe.md).
 *
 * Composed from six backend ops (router forward and backward, gather,
 * scatter-add, combine forward and backward) and the grouped matmuls
 * (backend.h), each of which runs one linear of every expert, each on its
 * contiguous block of dispatched rows, in one call:
 *
 *   logits = ln2 @ router^T                 [N, E]
 *   probs, idx, w = router(logits)          softmax, top-k, renormalised
 *   plan (host): the (token, choice) slots in expert order, token order
 *                within an expert; over capacity: dropped
 *   x_in = gather(ln2, slot)                [R, C]
 *   x_out[e's rows] = expert_e(x_in[e's rows])   (the model's MLP kind)
 *   out = shared(ln2) + combine(x_out, w)   out[n] += w[n, j] * x_out[r]
 *
 * The router's losses (added to the training loss, per micro-batch, summed
 * over MoE layers; loss = CE + aux_coef * sum aux + z_coef * sum z):
 *   aux = E * sum_e f_e * P_e (Switch/GShard, Megatron's normalisation:
 *         f_e = assignments to e / (N * k), before capacity, a constant;
 *         P_e = mean over the N rows of probs[n, e]; 1 when balanced)
 *   z   = mean over rows of lse(logits)^2 (ST-MoE)
 * They enter the gradient here, through the router, scaled like the
 * cross-entropy by the loss scale of the micro-batch.
 *
 * Expert parallelism (topology.ep > 1, docs/moe.md): rank q of the ep
 * group runs experts [q * El, (q + 1) * El), El = E / ep.  The plan, the
 * router and its losses stay local (every rank plans its own micro-batch,
 * capacity included, as without ep); x_in's rows, already in expert order,
 * are cut by destination: after an all-to-all of the per-expert counts, an
 * all-to-all of the rows sends each to its expert's rank, which runs its
 * experts on what every member sent (block by block: source p, expert j)
 * and sends the outputs back the same way.  Backward: the gradients at the
 * outputs go to the experts' ranks, the gradients at the inputs come back.
 * An expert's weight gradient on its rank is then the sum over the tokens
 * of the whole ep group.  Where the experts' memory is divided over ep
 * (config_ep_divides: no offload) a rank holds its own E / ep experts only
 * (held() indexes them) and the expert-data-parallel reduction (the dp / ep
 * ranks with the same ep rank) sums each expert's gradient over all tokens;
 * else every rank holds every expert, the others' gradient of it is 0, and
 * the data-parallel all-reduce (or ZeRO's reduce-scatter) gives the same
 * sum.
 *
 * Tensor parallelism (Megatron's expert tensor parallelism): every expert,
 * and the shared experts, split over TP as the dense MLP is (fc, gate, up
 * column-parallel: Fe / tp of each expert's rows; proj, down row-parallel),
 * the router replicated.  ln2 is whole on every TP rank (gathered under
 * SP), so all route, plan and drop alike; with ep each TP rank exchanges
 * with the ranks of its own TP rank (the ep group, topology_mpi.c), which
 * hold the same slice of every expert.  An expert's output is then this
 * rank's partial sum, and so is the combine (linear in it): the branch
 * goes through the row output (all-reduce, or reduce-scatter under SP),
 * which adds the shared experts' replicated bias; the experts' replicated
 * proj bias is added by TP rank 0 only, before the sum.  Backward: the
 * routing weights' gradient dot(dout, x_out) is partial too, and is
 * all-reduced over TP ([N, k] floats) before the router's backward, which
 * every rank then runs alike (the router's gradient replicated); its input
 * gradient is added on TP rank 0 only, as ln2's column-input backward sums
 * the ranks' (the experts' input gradients are partial like the dense
 * MLP's). */
#include "model/model_internal.h"

#include <math.h>
#include <string.h>

#include "comm/comm.h"
#include "core/error.h"

static void zero(const Model *m, float *x, size_t n) { m->be->zero(x, n * sizeof *x); }

/* The dispatch plan from the router's choices (host copies): counts,
 * capacity, each expert's rows, and the losses' values. */
static void moe_plan(Model *m, LayerActs *a)
{
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const int N = d->N, E = d->E, K = d->K;
    const int32_t *idx = a->r_idx;
    const float *probs = a->r_probs, *lse = a->r_lse;
    if (be->device) {
        be->to_host(m->moe_idx_host, a->r_idx, (size_t)N * K * sizeof(int32_t));
        be->to_host(m->moe_probs_host, a->r_probs, (size_t)N * E * sizeof(float));
        be->to_host(m->moe_lse_host, a->r_lse, (size_t)N * sizeof(float));
        idx = m->moe_idx_host;
        probs = m->moe_probs_host;
        lse = m->moe_lse_host;
    }
    MoeRoute *rt = a->route;
    memset(rt->count, 0, (size_t)E * sizeof(int));
    for (int s = 0; s < N * K; s++)
        rt->count[idx[s]]++;
    /* Capacity: ceil(factor * N * k / E) rows per expert (GShard); dropless
     * keeps all (an expert gets a token at most once, so at most N). */
    const float cf = m->mc.moe_capacity_factor;
    const int cap = cf > 0 ? (int)ceil((double)cf * N * K / E) : N;
    rt->off[0] = 0;
    for (int e = 0; e < E; e++)
        rt->off[e + 1] = rt->off[e] + (rt->count[e] < cap ? rt->count[e] : cap);
    rt->R = rt->off[E];
    rt->dropped = N * K - rt->R;
    memcpy(rt->roff, rt->off, sizeof rt->roff); /* ep 1: this rank's rows are its experts' */
    /* Slots in expert order; within an expert in token order, so the first
     * tokens of the micro-batch are kept when an expert overflows. */
    int fill[MOE_MAX_EXPERTS];
    memcpy(fill, rt->off, (size_t)E * sizeof(int));
    int32_t *slot = be->device ? m->moe_slot_host : a->r_slot;
    for (int s = 0; s < N * K; s++) {
        const int e = idx[s];
        if (fill[e] < rt->off[e + 1])
            slot[fill[e]++] = s;
    }
    if (be->device)
        be->to_backend(a->r_slot, slot, (size_t)rt->R * sizeof(int32_t));

    double aux = 0, z = 0;
    for (int e = 0; e < E; e++) {
        double P = 0;
        for (int n = 0; n < N; n++)
            P += probs[(size_t)n * E + e];
        aux += (double)rt->count[e] / ((double)N * K) * (P / N);
    }
    for (int n = 0; n < N; n++)
        z += (double)lse[n] * lse[n];
    rt->aux = aux * E;
    rt->z = z / N;
}

/* ---- expert parallelism: the exchanges ---------------------------------- */

/* The counts first: rank q gets, for each of its El experts, how many rows
 * this rank keeps for it (kept counts in expert order are already cut by
 * destination); rt->roff becomes the blocks this rank's experts receive. */
static void moe_exchange_counts(Model *m, MoeRoute *rt)
{
    const int E = m->d.E;
    int send[MOE_MAX_EXPERTS] = {0}, recv[MOE_MAX_EXPERTS] = {0};
    for (int e = 0; e < E; e++)
        send[e] = rt->off[e + 1] - rt->off[e];
    comm_alltoall_i32(m->epc, send, recv, (size_t)m->d.El);
    rt->roff[0] = 0;
    for (int i = 0; i < E; i++)
        rt->roff[i + 1] = rt->roff[i] + recv[i];
}

/* Rows of C floats.  back 0: this rank's [R, C], in expert order, to the
 * experts' ranks; recv [roff[E], C] gets what the group sent this rank's
 * experts, block by block.  back 1: the reverse, send [roff[E], C] (the
 * results of those rows) back to the ranks that sent them, into recv [R, C]. */
static void moe_exchange(const Model *m, const MoeRoute *rt, const float *send, float *recv,
                         int back)
{
    const int El = m->d.El, ep = m->ep;
    const size_t C = (size_t)m->d.C;
    size_t mine[MOE_MAX_EXPERTS], mine_at[MOE_MAX_EXPERTS];     /* this rank's rows, per rank */
    size_t theirs[MOE_MAX_EXPERTS], theirs_at[MOE_MAX_EXPERTS]; /* received rows, per rank */
    for (int q = 0; q < ep; q++) {
        mine_at[q] = (size_t)rt->off[q * El] * C;
        mine[q] = (size_t)rt->off[(q + 1) * El] * C - mine_at[q];
        theirs_at[q] = (size_t)rt->roff[q * El] * C;
        theirs[q] = (size_t)rt->roff[(q + 1) * El] * C - theirs_at[q];
    }
    if (back)
        comm_alltoallv_f32(m->epc, send, theirs, theirs_at, recv, mine, mine_at);
    else
        comm_alltoallv_f32(m->epc, send, mine, mine_at, recv, theirs, theirs_at);
}

/* Block i of what this rank's experts received (route->roff) is for expert
 * first_expert + i % El (with ep 1, block e is expert e's rows). */
static int first_expert(const Model *m) { return m->ep > 1 ? m->epc->rank * m->d.El : 0; }

/* Expert e's block in the bound expert tensors: e itself when they hold
 * every expert, e's place among this rank's E / ep when the experts'
 * memory is divided over ep (ParamShard.ep, params.h). */
static int held(const Model *m, int e) { return m->sh.ep > 1 ? e - first_expert(m) : e; }

/* The grouped calls' weights: group i (block i of route->roff) is expert
 * first_expert + i % El, whose block of an expert tensor starts this many
 * floats (per floats an expert) into the bound tensor. */
static size_t group_offset(const Model *m, int i, size_t per)
{
    return (size_t)held(m, first_expert(m) + i % m->d.El) * per;
}

/* ptr[i]: group i's block of the expert tensor at base (NULL: absent). */
static void experts(const Model *m, const float **ptr, const float *base, size_t per)
{
    for (int i = 0; i < m->ep * m->d.El; i++)
        ptr[i] = base ? base + group_offset(m, i, per) : NULL;
}

/* The same for a gradient (with ep > 1, the ep groups of one expert share
 * its gradient: theirs add, backend.h). */
static void expert_grads(const Model *m, float **ptr, float *base, size_t per)
{
    for (int i = 0; i < m->ep * m->d.El; i++)
        ptr[i] = base ? base + group_offset(m, i, per) : NULL;
}

static void moe_count(Model *m, const MoeRoute *rt)
{
    MoeStats *st = &m->moe_stats;
    int lo = rt->count[0], hi = rt->count[0];
    for (int e = 1; e < m->d.E; e++) {
        lo = rt->count[e] < lo ? rt->count[e] : lo;
        hi = rt->count[e] > hi ? rt->count[e] : hi;
    }
    st->tokens_min = st->layers == 0 || lo < st->tokens_min ? lo : st->tokens_min;
    st->tokens_max = st->layers == 0 || hi > st->tokens_max ? hi : st->tokens_max;
    st->aux_sum += rt->aux;
    st->z_sum += rt->z;
    st->dropped += rt->dropped;
    st->layers += 1;
}

void mlp_in_forward(const Model *m, float *fc, float *up, float *act, const float *x,
                    const float *fc_w, const float *fc_b, const float *up_w, int n, int F)
{
    const Backend *be = m->be;
    const size_t nF = (size_t)n * (size_t)F;
    be->matmul_forward(fc, x, fc_w, fc_b, n, m->d.C, F);
    if (m->d.gpt2) {
        be->gelu_forward(act, fc, nF);
    } else {
        be->matmul_forward(up, x, up_w, NULL, n, m->d.C, F);
        be->swiglu_forward(act, fc, up, nF);
    }
}

/* From dact (the gradient at act, overwritten as scratch is not needed):
 * ADDS the weight gradients and dx [n, C] += the gradient at x. */
static void mlp_in_backward(const Model *m, float *dx, float *g_fc_w, float *g_fc_b, float *g_up_w,
                            const float *dact, const float *fc, const float *up, const float *x,
                            const float *fc_w, const float *up_w, int n, int F)
{
    const Backend *be = m->be;
    const Scratch *s = &m->s;
    const size_t nF = (size_t)n * (size_t)F;
    if (m->d.gpt2) {
        be->gelu_backward(s->dfc, fc, dact, nF, GRAD_SET);
    } else {
        be->swiglu_backward(s->dfc, s->dup, dact, fc, up, nF, GRAD_SET);
        be->matmul_backward(dx, g_up_w, NULL, s->dup, x, up_w, n, m->d.C, F, GRAD_ADD);
    }
    be->matmul_backward(dx, g_fc_w, g_fc_b, s->dfc, x, fc_w, n, m->d.C, F, GRAD_ADD);
}

void moe_forward(Model *m, const LayerParams *p, LayerActs *a, float *out)
{
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const int N = d->N, C = d->C, K = d->K, Fe = d->Fe, El = d->El, ep = m->ep;
    TRD_ASSERT(ep == 1 || m->epc); /* model_set_expert_parallel */
    be->matmul_forward(a->r_logits, a->ln2.f, p->router_w, NULL, N, C, d->E);
    be->moe_router_forward(a->r_probs, a->r_lse, a->r_idx, a->r_w, a->r_logits, N, d->E, K);
    moe_plan(m, a);
    MoeRoute *rt = a->route;
    /* ep > 1: this rank's rows go out from scratch and the experts' outputs
     * return from scratch; x_in holds what this rank's experts received. */
    float *rows = ep > 1 ? m->s.x_dy : a->x_in, *y = ep > 1 ? m->s.xr_dy : a->x_out;
    be->moe_gather(rows, a->ln2.f, a->r_slot, rt->R, C, K);
    if (ep > 1) {
        moe_exchange_counts(m, rt);
        TRD_ASSERT(rt->roff[d->E] <= d->Re); /* each source sends a token to one expert once */
        moe_exchange(m, rt, rows, a->x_in, 0);
    }
    /* The experts: each of their linears one grouped call over all of this
     * rank's rows (group i: block i of route->roff), the activation one
     * pass over them (the rows are contiguous). */
    const int G = ep * El, Rx = rt->roff[G]; /* the rows this rank's experts run */
    const size_t FC = (size_t)Fe * C, RF = (size_t)Rx * Fe;
    const float *fc_w[MOE_MAX_EXPERTS], *fc_b[MOE_MAX_EXPERTS], *up_w[MOE_MAX_EXPERTS];
    const float *proj_w[MOE_MAX_EXPERTS], *proj_b[MOE_MAX_EXPERTS];
    experts(m, fc_w, p->x_fc_w, FC);
    experts(m, fc_b, p->x_fc_b, (size_t)Fe);
    experts(m, up_w, p->x_up_w, FC);
    experts(m, proj_w, p->x_proj_w, FC);
    experts(m, proj_b, p->x_proj_b, (size_t)C);
    be->matmul_grouped_forward(a->x_fc, a->x_in, fc_w, p->x_fc_b ? fc_b : NULL, rt->roff, G, C, Fe);
    if (d->gpt2) {
        be->gelu_forward(a->x_act, a->x_fc, RF);
    } else {
        be->matmul_grouped_forward(a->x_up, a->x_in, up_w, NULL, rt->roff, G, C, Fe);
        be->swiglu_forward(a->x_act, a->x_fc, a->x_up, RF);
    }
    be->matmul_grouped_forward(y, a->x_act, proj_w, p->x_proj_b && m->tp.rank == 0 ? proj_b : NULL,
                               rt->roff, G, Fe, C);
    if (ep > 1)
        moe_exchange(m, rt, y, a->x_out, 1);
    if (d->Fs > 0)
        mlp_in_forward(m, a->fc, a->up, a->fc_act.f, a->ln2.f, p->fc_w, p->fc_b, p->up_w, N, d->Fs);
    if (!out)
        return;                       /* recompute in backward: the activations are what it needs */
    const int tp = tp_active(&m->tp); /* the shared bias after the sum over TP */
    if (d->Fs > 0)
        be->matmul_forward(out, a->fc_act.f, p->mlp_proj_w, tp ? NULL : p->mlp_proj_b, N, d->Fs, C);
    else
        zero(m, out, (size_t)N * C);
    be->moe_combine_forward(out, a->x_out, a->r_w, a->r_slot, rt->R, C, K);
    if (tp)
        tp_row_output_forward(&m->tp, out, p->mlp_proj_b, N, C);
    if (m->tp.rank == 0) /* the TP ranks route alike: count the group's once */
        moe_count(m, rt);
}

void moe_backward(Model *m, const LayerParams *p, const LayerParams *g, const LayerActs *a,
                  const float *dout)
{
    const Backend *be = m->be;
    const Dims *d = &m->d;
    const Scratch *s = &m->s;
    const int N = d->N, C = d->C, E = d->E, K = d->K, Fe = d->Fe, El = d->El, ep = m->ep;
    const MoeRoute *rt = a->route;
    zero(m, s->dln, (size_t)N * C);

    /* Shared experts: an ordinary MLP of width Fs. */
    if (d->Fs > 0) {
        zero(m, s->dfc_act, (size_t)N * d->Fs);
        be->matmul_backward(s->dfc_act, g->mlp_proj_w, g->mlp_proj_b, dout, a->fc_act.f,
                            p->mlp_proj_w, N, d->Fs, C, GRAD_ADD);
        mlp_in_backward(m, s->dln, g->fc_w, g->fc_b, g->up_w, s->dfc_act, a->fc, a->up, a->ln2.f,
                        p->fc_w, p->up_w, N, d->Fs);
    }

    /* Combine: gradients at the experts' outputs and at the routing weights
     * (0 for dropped slots, which the combine never read). */
    zero(m, s->r_dw, (size_t)N * K);
    be->moe_combine_backward(s->x_dy, s->r_dw, dout, a->x_out, a->r_w, a->r_slot, rt->R, C, K);
    if (tp_active(&m->tp)) /* dot(dout, x_out) over this rank's partial x_out */
        comm_allreduce_f32(m->tp.comm, s->r_dw, (size_t)N * K);

    /* Experts, each on its rows, in grouped calls as in the forward (ep > 1:
     * the gradients go to the experts' ranks and the input gradients come
     * back); then the rows back to their tokens. */
    float *dy = s->x_dy, *dx = s->x_dx;
    if (ep > 1) {
        dy = s->xr_dy;
        dx = s->xr_dx;
        moe_exchange(m, rt, s->x_dy, dy, 0);
    }
    const int G = ep * El, Rx = rt->roff[G]; /* the rows this rank's experts run */
    const size_t FC = (size_t)Fe * C, RF = (size_t)Rx * Fe;
    const float *fc_w[MOE_MAX_EXPERTS], *up_w[MOE_MAX_EXPERTS], *proj_w[MOE_MAX_EXPERTS];
    float *g_fc_w[MOE_MAX_EXPERTS], *g_fc_b[MOE_MAX_EXPERTS], *g_up_w[MOE_MAX_EXPERTS];
    float *g_proj_w[MOE_MAX_EXPERTS], *g_proj_b[MOE_MAX_EXPERTS];
    experts(m, fc_w, p->x_fc_w, FC);
    experts(m, up_w, p->x_up_w, FC);
    experts(m, proj_w, p->x_proj_w, FC);
    expert_grads(m, g_fc_w, g->x_fc_w, FC);
    expert_grads(m, g_fc_b, g->x_fc_b, (size_t)Fe);
    expert_grads(m, g_up_w, g->x_up_w, FC);
    expert_grads(m, g_proj_w, g->x_proj_w, FC);
    expert_grads(m, g_proj_b, g->x_proj_b, (size_t)C);
    zero(m, dx, (size_t)Rx * C);
    zero(m, s->dfc_act, RF); /* the gradient at the projection's input [Rx, Fe] */
    be->matmul_grouped_backward(s->dfc_act, g_proj_w, g->x_proj_b ? g_proj_b : NULL, dy, a->x_act,
                                proj_w, rt->roff, G, Fe, C);
    if (d->gpt2) {
        be->gelu_backward(s->dfc, a->x_fc, s->dfc_act, RF, GRAD_SET);
    } else {
        be->swiglu_backward(s->dfc, s->dup, s->dfc_act, a->x_fc, a->x_up, RF, GRAD_SET);
        be->matmul_grouped_backward(dx, g_up_w, NULL, s->dup, a->x_in, up_w, rt->roff, G, C, Fe);
    }
    be->matmul_grouped_backward(dx, g_fc_w, g->x_fc_b ? g_fc_b : NULL, s->dfc, a->x_in, fc_w,
                                rt->roff, G, C, Fe);
    if (ep > 1)
        moe_exchange(m, rt, dx, s->x_dx, 1);
    be->moe_scatter_add(s->dln, s->x_dx, a->r_slot, rt->R, C, K);

    /* Router: the combine's weights, the load-balancing loss (d aux / d
     * probs[n, e] = E * f_e / N, f_e constant) and the z-loss. */
    const float scale = m->loss_scale;
    float auxdp[MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++)
        auxdp[e] = (float)((double)scale * m->mc.moe_aux_loss_coef * E *
                           ((double)rt->count[e] / ((double)N * K)) / N);
    be->to_backend(s->r_auxdp, auxdp, (size_t)E * sizeof(float));
    const float z_scale = (float)(2.0 * scale * m->mc.moe_z_loss_coef / N);
    be->moe_router_backward(s->r_dlogits, s->r_dw, a->r_probs, a->r_lse, a->r_idx, a->r_w,
                            s->r_auxdp, z_scale, N, E, K);
    /* Every TP rank computes the router's whole (replicated) gradient; its
     * input gradient counts once in the sum over TP at ln2. */
    be->matmul_backward(m->tp.rank == 0 ? s->dln : NULL, g->router_w, NULL, s->r_dlogits, a->ln2.f,
                        p->router_w, N, C, E, GRAD_ADD);
}
