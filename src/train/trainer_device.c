/* trainer_device.c — where a rank's trainer runs: OpenMP threads, its GPU
 * and NCCL, the device memory it held, and the peak FLOP/s its MFU is
 * measured against. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#ifdef TRD_HAVE_CUDA
#include "backend/cuda.h"
#endif
#include "core/error.h"
#include "plan/cluster.h"
#include "train/trainer_internal.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double train_cpu_peak_flops(int n)
{
    float *a = trd_malloc((size_t)n * n * sizeof(float), "peak probe");
    float *b = trd_malloc((size_t)n * n * sizeof(float), "peak probe");
    float *c = trd_malloc((size_t)n * n * sizeof(float), "peak probe");
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    /* The backend runs BLAS single-threaded inside its own OpenMP split;
     * the machine's limit is BLAS on every thread this rank has. */
    const int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(omp_get_max_threads());
    double best = 1e30;
    for (int rep = 0; rep < 10; rep++) { /* best of several: other work may share the cores */
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = now_s() - t0;
        if (rep > 0 && dt < best) /* the first call warms up the thread pool */
            best = dt;
    }
    openblas_set_num_threads(blas_threads);
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * (double)n / best;
}

/* Ranks sharing a machine split its cores, unless OMP_NUM_THREADS says
 * otherwise: oversubscribed OpenMP and BLAS threads crawl. */
void trainer_set_threads(Comm world)
{
    Comm node = comm_split_node(&world);
    int threads = omp_get_num_procs() / node.size;
    comm_free(&node);
    if (threads < 1)
        threads = 1;
    if (!getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(threads);
}

/* NCCL for device buffers: asked for, or (auto) built in and every rank on a
 * GPU of its own.  The emulated build takes NCCL only when asked: its MPI
 * staging path is the one the rest of the tests exercise. */
static int want_nccl(CommKind kind, int shared)
{
    if (kind != COMM_AUTO)
        return kind == COMM_NCCL;
#if defined(TRD_HAVE_NCCL) && !defined(TRD_CUDA_EMULATED)
    return !shared;
#else
    (void)shared;
    return 0;
#endif
}

/* Device backends: pick this rank's GPU (node-local rank, round robin when
 * ranks outnumber GPUs: they then share one through the MPI path), and let
 * every group's float buffers live in device memory (comm.h staging). */
void trainer_use_device(Trainer *tr)
{
    if (!tr->be->device)
        return;
#ifdef TRD_HAVE_CUDA
    const int n = backend_cuda_devices();
    if (n < 1)
        trd_fatal(TRD_EXIT_RUNTIME,
                  "run on a machine with an NVIDIA GPU and driver, or set "
                  "backend: cpu",
                  "backend cuda: no CUDA device is visible to rank %d", tr->topo.rank);
    const int dev = tr->topo.local_rank % n;
    backend_cuda_set_device(dev);
    backend_cuda_device_name(dev, tr->device, sizeof tr->device);
    tr->device_memory = (MemBudget){.bytes = (double)backend_cuda_device_memory(dev),
                                    .sharers = (tr->topo.ranks_per_node + n - 1) / n,
                                    .what = tr->device};
    /* NCCL wants a GPU per rank: two ranks of a communicator on one GPU
     * fail.  Whether any rank shares is agreed by all (the choice is
     * collective). */
    int shared = tr->topo.local_rank >= n;
    comm_allreduce_max_i32(&tr->comms.world, &shared, 1);
#ifdef TRD_CUDA_EMULATED
    shared = 0; /* the emulation's NCCL is MPI: any number of ranks share its device */
#endif
#else
    const int shared = 0;
#endif
    /* Then, with ep > 1, the expert-parallel group, whose all-to-all goes
     * device to device under NCCL (comm_nccl_alltoallv), and the
     * expert-data-parallel group, which reduces device gradients only where
     * ep divides the experts (and gets a NCCL communicator then). */
    Comm *groups[9] = {&tr->comms.world, &tr->comms.tp, &tr->comms.dp,   &tr->comms.pp,
                       &tr->comms.mp,    &tr->comms.cp, &tr->comms.embed};
    int n_groups = 7;
    if (tr->cfg->topology.ep > 1)
        groups[n_groups++] = &tr->comms.ep;
    if (config_ep_divides(tr->cfg))
        groups[n_groups++] = &tr->comms.edp;
    for (int i = 0; i < n_groups; i++)
        comm_use_memory(groups[i], tr->be);
    tr->nccl = want_nccl(tr->cfg->topology.comm, shared);
#ifndef TRD_HAVE_NCCL
    if (tr->nccl)
        guard_exit_agreed(tr->topo.rank, TRD_EXIT_INPUT,
                          "set topology.comm: mpi, or rebuild where the CUDA toolkit has "
                          "NCCL (libnccl beside libcudart; docs/cuda.md)",
                          "topology.comm nccl: this trident was built without NCCL");
#endif
    if (tr->nccl && shared)
        guard_exit_agreed(tr->topo.rank, TRD_EXIT_INPUT,
                          "set topology.comm: mpi (host staging), or give every rank a GPU "
                          "of its own",
                          "topology.comm nccl: ranks of a node share a GPU, which NCCL does "
                          "not allow");
    if (tr->nccl)
        comm_use_nccl(&tr->comms.world, groups, n_groups);
}

/* Device backends: the most device memory a rank held (rank 0 prints the
 * largest), against the report's categories above. */
void trainer_report_device_memory(Trainer *tr)
{
    if (!tr->be->device)
        return;
    size_t live = 0, peak = 0;
#ifdef TRD_HAVE_CUDA
    backend_cuda_memory(&live, &peak);
#endif
    (void)live;
    /* Staging buffers are pooled: after the first step, a steady run
     * allocates none (each step repeats the same transfers). */
    const CommStaging st = comm_staging();
    double v[3] = {(double)peak, (double)st.allocations,
                   (double)(st.allocations - tr->staged_first)};
    comm_allreduce_max_f64(&tr->comms.world, v, 3);
    if (tr->topo.rank == 0) {
        printf("device memory: peak %.0f bytes (%.1f MiB) held by trident on the busiest rank "
               "(rank 0: %zu bytes)\n",
               v[0], v[0] / (1024.0 * 1024.0), peak);
        printf("host staging: %.0f buffers allocated (busiest rank), %.0f of them after the "
               "first step; rank 0 holds %.1f MiB\n",
               v[1], v[2], trd_mib(st.bytes));
    }
    comm_staging_free();
}

double trainer_peak_flops(const Trainer *tr)
{
    const char *env = getenv("TRIDENT_PEAK_TFLOPS");
    double peak;
    if (!tr->be->device)
        peak = train_cpu_peak_flops(512);
    else if (env && *env)
        peak = 1e12 * atof(env);
    else
        peak = 1e12 * cluster_device_peak_tflops(tr->device);
    return peak * tr->comms.world.size;
}
