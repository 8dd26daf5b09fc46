/* comm_mpi.h — the MPI communicator behind a Comm, for the few places that
 * hand one to an MPI-aware library: HDF5's MPI-IO file access
 * (src/checkpoint) and the trace's gather (trace.c).  Everything else goes
 * through comm.h's calls, which are checked and counted. */
#ifndef TRD_COMM_MPI_H
#define TRD_COMM_MPI_H

#include <mpi.h>

#include "comm/comm.h"

MPI_Comm comm_mpi(const Comm *c);

#endif
