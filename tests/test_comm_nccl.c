/* test_comm_nccl.c — the NCCL implementation of src/comm on device buffers.
 *
 * On 4 ranks with the CUDA backend's memory: the world, pairs {0,1} {2,3}
 * and a group {0,2} that ranks 1 and 3 are outside of (NULL) get NCCL
 * (comm_use_nccl), and a group split from the world afterwards inherits it.
 * On each group, every float operation of comm.h is checked against values
 * computed here from the inputs: all-reduce (sum, max, non-blocking, tested
 * and waited), the block all-gather and reduce-scatter, and the ranged
 * reduce-scatter and all-gather of ZeRO over uneven parts (in place and
 * not).  Point to point: one-way channels in both directions around the
 * ring at once (a pipeline's activations and gradients), and a message on
 * the group's own communicator.  Inputs are small integers, so every sum is
 * exact whatever the order.  No host staging buffer may be allocated: NCCL,
 * not MPI, carried every float.
 *
 * Built with NCCL (the emulation, kernels/emu, always; a real toolkit when
 * libnccl is there).  On real GPUs it needs one per rank, else exits 77.
 * Run as a plain unit test it re-executes itself under `mpiexec -n 4`. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda.h"
#include "check.h"
#include "mpi_test.h"
#include "comm/comm.h"

enum { WORLD = 4, CAP = 64 };

static const Backend *be;

/* Rank r's input element i: distinct small integers. */
static float input(int r, size_t i) { return (float)(100 * (r + 1) + (int)i); }

static float *dev_from(const float *host, size_t n)
{
    float *d = be->alloc(n * sizeof(float), "test buffer");
    be->to_backend(d, host, n * sizeof(float));
    return d;
}

/* Device buf (n floats) against want; frees buf. */
static void expect(float *buf, const float *want, size_t n, const char *what, const Comm *c)
{
    float got[CAP * WORLD];
    be->to_host(got, buf, n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += got[i] != want[i];
    CHECK(bad == 0, "%s on %s (rank %d of %d): %zu of %zu wrong, first [0] %g want %g", what,
          c->name, c->rank, c->size, bad, n, got[0], want[0]);
    be->release(buf);
}

static void check_allreduce(Comm *c)
{
    enum { N = 37 };
    float in[N], sum[N], max[N];
    for (size_t i = 0; i < N; i++) {
        in[i] = input(c->rank, i);
        sum[i] = max[i] = 0;
        for (int r = 0; r < c->size; r++) {
            sum[i] += input(r, i);
            max[i] = input(r, i) > max[i] ? input(r, i) : max[i];
        }
    }
    float *d = dev_from(in, N);
    comm_allreduce_f32(c, d, N);
    expect(d, sum, N, "all-reduce", c);
    d = dev_from(in, N);
    comm_allreduce_max_f32(c, d, N);
    expect(d, max, N, "max all-reduce", c);

    d = dev_from(in, N);
    CommHandle h = comm_iallreduce_f32(c, d, N);
    while (!comm_test(&h))
        ;
    comm_wait(&h); /* a completed handle: returns at once */
    expect(d, sum, N, "non-blocking all-reduce (tested)", c);
    d = dev_from(in, N);
    h = comm_iallreduce_f32(c, d, N);
    comm_wait(&h);
    expect(d, sum, N, "non-blocking all-reduce (waited)", c);
}

static void check_blocks(Comm *c)
{
    enum { N = 5 };
    const size_t all = (size_t)N * (size_t)c->size;
    float in[N * WORLD], want[N * WORLD];
    for (size_t i = 0; i < all; i++) {
        in[i] = i / N == (size_t)c->rank ? input(c->rank, i) : -1.0f; /* others: garbage */
        want[i] = input((int)(i / N), i);
    }
    float *d = dev_from(in, all);
    comm_allgather_block_f32(c, d, N);
    expect(d, want, all, "block all-gather", c);

    for (size_t i = 0; i < all; i++)
        in[i] = input(c->rank, i);
    for (size_t i = 0; i < N; i++) {
        want[i] = 0;
        for (int r = 0; r < c->size; r++)
            want[i] += input(r, (size_t)c->rank * N + i);
    }
    d = dev_from(in, all);
    comm_reduce_scatter_block_f32(c, d, N);
    expect(d, want, N, "block reduce-scatter (this rank's block first)", c);
}

/* ZeRO's ranges: a buffer of n elements sharded in blocks of S; [lo, hi). */
static void check_range(Comm *c, size_t n, size_t lo, size_t hi)
{
    const size_t S = (n + (size_t)c->size - 1) / (size_t)c->size;
    size_t a, b;
    comm_shard_part(lo, hi, S, c->rank, &a, &b);
    float in[CAP], want[CAP];
    char what[96];

    for (size_t i = lo; i < hi; i++)
        in[i - lo] = input(c->rank, i);
    for (size_t i = a; i < b; i++) {
        want[i - a] = 0;
        for (int r = 0; r < c->size; r++)
            want[i - a] += input(r, i);
    }
    float *send = dev_from(in, hi - lo);
    float *recv = be->alloc((b - a + 1) * sizeof(float), "test part");
    CommHandle h = comm_ireduce_scatter_range_f32(c, send, recv, lo, hi, S);
    comm_wait(&h);
    snprintf(what, sizeof what, "reduce-scatter of [%zu, %zu) of %zu", lo, hi, n);
    expect(recv, want, b - a, what, c);
    be->release(send);

    /* Each rank's part: what its owner holds (rank r's input there). */
    float mine[CAP] = {0};
    for (size_t i = a; i < b; i++)
        mine[i - a] = input(c->rank, i);
    for (size_t i = lo; i < hi; i++)
        want[i - lo] = input((int)(i / S), i);
    for (int in_place = 0; in_place <= 1; in_place++) {
        float fill[CAP];
        for (size_t i = 0; i < hi - lo; i++)
            fill[i] = -7.0f;
        float *out = dev_from(fill, hi - lo), *part = NULL;
        /* (an empty part is a = b = 0: nothing of this rank's goes in) */
        float *at = b > a ? out + (a - lo) : out;
        if (in_place && b > a)
            be->to_backend(at, mine, (b - a) * sizeof(float));
        if (!in_place)
            part = dev_from(mine, b - a + 1);
        h = comm_iallgather_range_f32(c, in_place ? at : part, out, lo, hi, S);
        comm_wait(&h);
        snprintf(what, sizeof what, "all-gather of [%zu, %zu) of %zu%s", lo, hi, n,
                 in_place ? " in place" : "");
        expect(out, want, hi - lo, what, c);
        if (part)
            be->release(part);
    }
}

static void check_group(Comm *c)
{
    if (!comm_is_member(c))
        return;
    CHECK(comm_stream_ordered(c), "group %s has no NCCL communicator", c->name);
    check_allreduce(c);
    check_blocks(c);
    check_range(c, 23, 0, 23);
    check_range(c, 23, 3, 17);
    check_range(c, 23, 5, 7); /* inside one or two parts; the others empty */
    check_range(c, 40, 10, 40);
}

/* A pipeline's traffic: every rank sends to the next and to the one before
 * at once, then receives both; each direction is a channel of its own. */
static void check_ring(Comm *w)
{
    enum { N = 9, ACT = 1, GRAD = 2, PLAIN = 3 };
    const int next = (w->rank + 1) % w->size, prev = (w->rank - 1 + w->size) % w->size;
    for (int round = 0; round < 2; round++) /* the second opens nothing new */
        for (int r = 0; r < w->size; r++) {
            comm_open_channel(w, r, (r + 1) % w->size, ACT);
            comm_open_channel(w, r, (r - 1 + w->size) % w->size, GRAD);
        }
    CHECK(w->n_chan == 2 * w->size, "%d channels open, want %d", w->n_chan, 2 * w->size);
    float act[N], grad[N], want_act[N], want_grad[N];
    for (size_t i = 0; i < N; i++) {
        act[i] = input(w->rank, i);
        grad[i] = -input(w->rank, i);
        want_act[i] = input(prev, i);
        want_grad[i] = -input(next, i);
    }
    float *dact = dev_from(act, N), *dgrad = dev_from(grad, N);
    float *in_act = be->alloc(N * sizeof(float), "act in");
    float *in_grad = be->alloc(N * sizeof(float), "grad in");
    CommHandle h1 = comm_isend_f32(w, dact, N, next, ACT);
    CommHandle h2 = comm_isend_f32(w, dgrad, N, prev, GRAD);
    CHECK(comm_probe(w, prev, ACT), "probe under NCCL: a receive never blocks");
    comm_recv_f32(w, in_act, N, prev, ACT);
    comm_recv_f32(w, in_grad, N, next, GRAD);
    comm_wait(&h1);
    comm_wait(&h2);
    expect(in_act, want_act, N, "activation from the rank before", w);
    expect(in_grad, want_grad, N, "gradient from the rank after", w);
    be->release(dact);
    be->release(dgrad);

    /* No channel: the group's communicator carries it (one way only). */
    float *d = dev_from(act, N);
    if (w->rank == 0) {
        CommHandle h = comm_isend_f32(w, d, N, 1, PLAIN);
        comm_wait(&h);
        be->release(d);
    } else if (w->rank == 1) {
        for (size_t i = 0; i < N; i++)
            want_act[i] = input(0, i);
        comm_recv_f32(w, d, N, 0, PLAIN);
        expect(d, want_act, N, "message on the group communicator", w);
    } else {
        be->release(d);
    }
}

int main(int argc, char **argv)
{
    if (!mpi_test_child())
        return mpi_test_relaunch("comm_nccl", 4);
    comm_init(&argc, &argv);
    alarm(120); /* a hung collective fails the test instead of stalling it */
    Comm world = comm_world();
    if (world.size != WORLD) {
        fprintf(stderr, "comm_nccl: needs %d ranks, got %d\n", WORLD, world.size);
        comm_finalize();
        return 1;
    }
#ifndef TRD_CUDA_EMULATED
    int few = backend_cuda_devices() < WORLD;
    comm_allreduce_max_i32(&world, &few, 1);
    if (few) {
        if (world.rank == 0)
            printf("SKIP: NCCL needs a GPU per rank; fewer than %d here\n", WORLD);
        comm_finalize();
        return 77;
    }
    backend_cuda_set_device(world.rank);
#endif
    be = backend_cuda();

    Comm pairs = comm_split(&world, world.rank / 2, world.rank);
    Comm evens = comm_split(&world, world.rank % 2 ? -1 : 0, world.rank);
    comm_set_name(&pairs, "pairs");
    comm_set_name(&evens, "evens");
    Comm *groups[] = {&world, &pairs, &evens};
    for (int i = 0; i < 3; i++)
        comm_use_memory(groups[i], be);
    comm_use_nccl(&world, groups, 3);
    /* Split after: NCCL comes along (as the kv groups of tensor_par do). */
    Comm odd_even = comm_split(&world, world.rank % 2, world.rank);
    comm_set_name(&odd_even, "odd-even");

    Comm *all[] = {&world, &pairs, &evens, &odd_even};
    for (int i = 0; i < 4; i++)
        check_group(all[i]);
    check_ring(&world);

    const CommStaging st = comm_staging();
    CHECK(st.allocations == 0, "%llu host staging buffers allocated: MPI carried device floats",
          (unsigned long long)st.allocations);
    CHECK(world.calls > 0 && world.bytes_sent > 0, "world counted %llu calls, %llu bytes",
          (unsigned long long)world.calls, (unsigned long long)world.bytes_sent);

    int failed = check_failures;
    comm_allreduce_max_i32(&world, &failed, 1);
    comm_free(&odd_even);
    comm_free(&evens);
    comm_free(&pairs);
    comm_free(&world);
    int rc = check_summary("comm_nccl");
    comm_finalize();
    return rc || failed;
}
