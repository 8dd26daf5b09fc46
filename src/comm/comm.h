/* comm.h — communication behind one interface.
 *
 * A Comm is a group of ranks (the world, or a TP/DP/PP group built by
 * src/topology).  This file has the MPI implementation; an NCCL one with the
 * same functions comes with the CUDA backend.  All reductions are sums unless
 * the name says otherwise.  Every call is checked: a failing collective ends
 * the job with the reason (src/core/error.h). */
#ifndef TRD_COMM_H
#define TRD_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    MPI_Comm mpi;
    int rank, size;
    uint64_t bytes_sent;   /* payload bytes this rank contributed, for reports */
} Comm;

/* MPI_Init (with MPI_THREAD_FUNNELED) unless already done; error handlers
 * set so that a failure returns to us and we abort with a message. */
void comm_init(int *argc, char ***argv);
void comm_finalize(void);
Comm comm_world(void);

void comm_allreduce_f32(Comm *c, float *buf, size_t n);
void comm_allreduce_f64(Comm *c, double *buf, size_t n);
void comm_allreduce_max_i32(Comm *c, int *buf, size_t n);
void comm_broadcast(Comm *c, void *buf, size_t bytes, int root);
void comm_barrier(Comm *c);

#endif
