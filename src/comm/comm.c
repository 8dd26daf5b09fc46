#include "comm/comm.h"

#include <limits.h>

#include "core/error.h"

static void check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    trd_fatal(TRD_EXIT_RUNTIME, "another rank probably failed; see its message above",
              "MPI %s failed: %s", what, msg);
}

void comm_init(int *argc, char ***argv)
{
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
        check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "init");
    /* Errors come back to check(), which aborts the job with a message
     * instead of MPI's default silent abort. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

void comm_finalize(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Finalize();
}

Comm comm_world(void)
{
    Comm c = {.mpi = MPI_COMM_WORLD};
    MPI_Comm_rank(c.mpi, &c.rank);
    MPI_Comm_size(c.mpi, &c.size);
    return c;
}

/* MPI counts are int: large buffers go in chunks. */
static void allreduce(Comm *c, void *buf, size_t n, size_t elem, MPI_Datatype t, MPI_Op op)
{
    if (c->size == 1)
        return;
    const size_t chunk = (size_t)INT_MAX / 2;
    for (size_t off = 0; off < n; off += chunk) {
        size_t k = n - off < chunk ? n - off : chunk;
        check(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)k, t, op, c->mpi),
              "all-reduce");
    }
    c->bytes_sent += n * elem;
}

void comm_allreduce_f32(Comm *c, float *buf, size_t n)
{
    allreduce(c, buf, n, sizeof(float), MPI_FLOAT, MPI_SUM);
}

void comm_allreduce_f64(Comm *c, double *buf, size_t n)
{
    allreduce(c, buf, n, sizeof(double), MPI_DOUBLE, MPI_SUM);
}

void comm_allreduce_max_i32(Comm *c, int *buf, size_t n)
{
    allreduce(c, buf, n, sizeof(int), MPI_INT, MPI_MAX);
}

void comm_broadcast(Comm *c, void *buf, size_t bytes, int root)
{
    if (c->size == 1)
        return;
    TRD_ASSERT(bytes <= (size_t)INT_MAX);
    check(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, c->mpi), "broadcast");
}

void comm_barrier(Comm *c)
{
    check(MPI_Barrier(c->mpi), "barrier");
}
