/* nccl_none.c — src/comm/nccl.h in a build without NCCL (no CUDA, or a
 * toolkit without libnccl).  No Comm ever gets an NCCL communicator there:
 * the trainer refuses topology.comm nccl first, so none of these is reached. */
#include "comm/nccl.h"

#include "core/error.h"

static _Noreturn void none(void)
{
    trd_fatal(TRD_EXIT_RUNTIME, "set topology.comm: mpi",
              "NCCL called in a trident built without NCCL");
}

void comm_nccl_unique_id(unsigned char id[COMM_NCCL_ID_BYTES]) { (void)id, none(); }
CommNccl *comm_nccl_init(const unsigned char id[COMM_NCCL_ID_BYTES], int nranks, int rank)
{
    (void)id, (void)nranks, (void)rank, none();
}
CommNccl *comm_nccl_split(CommNccl *parent, int color, int key)
{
    (void)parent, (void)color, (void)key, none();
}
void comm_nccl_free(CommNccl *c) { (void)c; }
void comm_nccl_set_label(CommNccl *c, const char *label) { (void)c, (void)label; }
/* No communicator, so never a fault, never a pending operation. */
int comm_nccl_fault(char *buf, size_t n) { return (void)buf, (void)n, 0; }
int comm_nccl_pending(char *buf, size_t n) { return (void)buf, (void)n, 0; }
void comm_nccl_abort_all(void) {}
CommNcclOp *comm_nccl_allreduce(CommNccl *c, float *buf, size_t n, int max)
{
    (void)c, (void)buf, (void)n, (void)max, none();
}
CommNcclOp *comm_nccl_allgather_block(CommNccl *c, float *buf, size_t n)
{
    (void)c, (void)buf, (void)n, none();
}
CommNcclOp *comm_nccl_reduce_scatter_block(CommNccl *c, float *buf, size_t n)
{
    (void)c, (void)buf, (void)n, none();
}
CommNcclOp *comm_nccl_reduce_parts(CommNccl *c, const float *send, float *recv, const int *counts,
                                   const int *displs)
{
    (void)c, (void)send, (void)recv, (void)counts, (void)displs, none();
}
CommNcclOp *comm_nccl_gather_parts(CommNccl *c, const float *mine, float *out, const int *counts,
                                   const int *displs)
{
    (void)c, (void)mine, (void)out, (void)counts, (void)displs, none();
}
CommNcclOp *comm_nccl_alltoallv(CommNccl *c, const float *send, const size_t *scount,
                                const size_t *sdispl, float *recv, const size_t *rcount,
                                const size_t *rdispl)
{
    (void)c, (void)send, (void)scount, (void)sdispl, (void)recv, (void)rcount, (void)rdispl;
    none();
}
CommNcclOp *comm_nccl_send(CommNccl *c, const float *buf, size_t n, int peer)
{
    (void)c, (void)buf, (void)n, (void)peer, none();
}
CommNcclOp *comm_nccl_recv(CommNccl *c, float *buf, size_t n, int peer)
{
    (void)c, (void)buf, (void)n, (void)peer, none();
}
void comm_nccl_wait(CommNcclOp *op) { (void)op, none(); }
int comm_nccl_test(CommNcclOp *op) { (void)op, none(); }
const void *comm_nccl_op_event(const CommNcclOp *op) { (void)op, none(); }
void comm_nccl_after(CommNccl *c, const void *e) { (void)c, (void)e, none(); }
