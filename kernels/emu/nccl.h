/* nccl.h (emulated) — the part of NCCL that kernels/nccl.cu uses, played by
 * MPI on the CPU (nccl_emu.cpp), so that the NCCL path of src/comm runs in
 * the multi-rank tests without a GPU.  A check of which buffers, counts,
 * offsets and roots the calls get, and of the data they move, not of NCCL's
 * behaviour:
 *
 * - each call runs at once, in the calling rank (streams are immediate);
 *   a group (ncclGroupStart/End) runs its calls in order;
 * - buffers must be emulated device memory (emu_check_device);
 * - ncclCommInitRank makes a communicator of the whole MPI world only (the
 *   way src/comm uses it), ncclCommSplit is MPI_Comm_split;
 * - ncclSend copies the message and starts a synchronous-mode send
 *   (MPI_Issend): the next call on the same communicator first waits until
 *   the receiver has taken it, as NCCL's stream order does, so sends and
 *   receives that cross on one communicator deadlock here as on GPUs;
 *   ncclRecv waits for its message and checks its length; inside a
 *   group sends and receives are posted at once and completed by the
 *   outermost ncclGroupEnd, so a group may exchange both ways between two
 *   ranks, as NCCL's fused groups do (the all-to-all of expert
 *   parallelism);
 * - faults on demand, for the tests of docs/reliability.md:
 *   TRIDENT_EMU_NCCL_FAULT=KIND:CALL:RANK:N makes world rank RANK's Nth
 *   call of CALL (ncclAllReduce, ncclSend...; 1-based, counted over every
 *   communicator) fail as NCCL would: KIND error runs the call and then
 *   reports ncclRemoteError from ncclCommGetAsyncError on its communicator
 *   (a peer or the network failed after the launch); KIND hang never
 *   returns until ncclCommAbort (a peer that never joins).  ncclCommAbort
 *   marks the communicator aborted; its calls then fail. */
#pragma once
#include <cstddef>
#include <cuda_runtime.h>

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;
typedef enum { ncclFloat32 = 7, ncclFloat = 7 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclMax = 2 } ncclRedOp_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct emu_nccl *ncclComm_t;
typedef struct ncclConfig ncclConfig_t;
#define NCCL_SPLIT_NOCOLOR -1

const char *ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank);
ncclResult_t ncclCommCount(ncclComm_t comm, int *count);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);
ncclResult_t ncclCommAbort(ncclComm_t comm);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
