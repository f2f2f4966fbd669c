/*
 * nccl_coll.c - the fake NCCL's operations: collectives (AllReduce,
 * Broadcast/Bcast, Reduce, AllGather, ReduceScatter, AlltoAll, Gather,
 * Scatter), point-to-point (Send, Recv), groups (ncclGroupStart/End) and
 * user reduction operations (ncclRedOpCreatePreMulSum / Destroy).
 *
 * Each call is checked as NCCL's enqueue checks it (src/enqueue.cc,
 * ArgsCheck): a live communicator, a datatype below ncclNumTypes, a
 * built-in operation or one created on this communicator, a root or peer
 * in 0..nranks-1, and, only when NCCL_CHECK_POINTERS=1 (NCCL's default is
 * 0), buffers that are device memory of the communicator's device. Then it
 * becomes one kernel on its stream, on the communicator's device
 * (fakecuda_launch(stream, -1), the driver's kernel entry: it rejects a
 * stream that is not valid, takes simulated time on the stream's timeline
 * and is captured into a graph while the stream captures). No data moves:
 * between ranks: they are separate processes that never talk to each other.
 * Inside
 * ncclGroupStart/End the kernels are launched at the outermost
 * ncclGroupEnd, one per (device, stream), as NCCL fuses a group's work.
 */
#include "nccl_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Note [NCCL data]. No data crosses ranks, but PyTorch reads some results
 * (DDP all-gathers every rank's parameter shapes and compares them), so
 * each rank behaves as if every other rank held exactly what it holds:
 * AllGather writes its send buffer into every rank's slot, Gather does so
 * on the root, AlltoAll fills every block with the block meant for this
 * rank, ReduceScatter takes this rank's block, Broadcast and Scatter copy
 * on the root, and reductions copy the send buffer to the receive buffer
 * (no arithmetic: kernels do not run, values are meaningless). Send and
 * Recv move nothing. Copies are plain memcpy of the fake device memory, at
 * the call, and only between ranges the driver knows as device memory;
 * in the driver's no-host-memory mode only copies of at most 64 KiB (Note
 * [No host memory] in driver/fakecuda_nohost.c). */
static const size_t type_size[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

static int dev_range(const void *p, size_t bytes)
{
    unsigned int type = 0;
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
    return p && bytes &&
           cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a) == CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE &&
           cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + bytes - 1) ==
               CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE;
}

static void copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && !sim_no_host_memory_drops(bytes) && dev_range(dst, bytes) && dev_range(src, bytes))
        memmove(dst, src, bytes);
}

unsigned long long nc_ops_launched;

#define GROUP_MAX 64
struct pending {
    CUcontext ctx;
    cudaStream_t stream;
};
static __thread int group_depth;
static __thread int n_pending;
static __thread struct pending pending[GROUP_MAX];
static __thread ncclResult_t group_error;

/* An operation that fails inside a group fails the whole group: its
 * ncclGroupEnd returns the error and launches nothing (NCCL's group error). */
static ncclResult_t group_failed(ncclResult_t r)
{
    if (group_depth > 0 && group_error == ncclSuccess)
        group_error = r;
    return r;
}

static ncclResult_t launch(CUcontext ctx, cudaStream_t stream, const char *fn)
{
    CUcontext prev;
    CUresult r = cuCtxPushCurrent_v2(ctx);
    if (r == CUDA_SUCCESS) {
        r = fakecuda_launch((CUstream)stream, -1);
        cuCtxPopCurrent_v2(&prev);
    }
    if (r != CUDA_SUCCESS)
        return nc_cuda_fail(r, fn);
    __atomic_fetch_add(&nc_ops_launched, 1, __ATOMIC_RELAXED);
    return ncclSuccess;
}

static ncclResult_t enqueue(ncclComm_t comm, cudaStream_t stream, const char *fn)
{
    /* A stream of another device: NCCL's event record and launch on it fail
     * (CUDA: invalid resource handle). 0, 1 (legacy) and 2 (per-thread)
     * name the communicator's device's own streams. */
    CUdevice d;
    if ((uintptr_t)stream > 2 && cuStreamGetDevice((CUstream)stream, &d) == CUDA_SUCCESS &&
        (int)d != comm->cudaDev)
        return group_failed(nc_cuda_fail(CUDA_ERROR_INVALID_HANDLE, fn));
    if (group_depth == 0)
        return launch(comm->ctx, stream, fn);
    for (int i = 0; i < n_pending; i++)
        if (pending[i].ctx == comm->ctx && pending[i].stream == stream)
            return ncclSuccess;
    if (n_pending == GROUP_MAX) { /* a full group: launch what it holds so far */
        for (int i = 0; i < n_pending; i++) {
            ncclResult_t r = launch(pending[i].ctx, pending[i].stream, fn);
            if (r != ncclSuccess)
                return r;
        }
        n_pending = 0;
    }
    pending[n_pending].ctx = comm->ctx;
    pending[n_pending].stream = stream;
    n_pending++;
    return ncclSuccess;
}

static ncclResult_t check_ptr(ncclComm_t comm, const void *p, const char *what, const char *fn)
{
    unsigned int type = 0;
    int ordinal = -1;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)p;
    if (!p || cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE ||
        cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d) != CUDA_SUCCESS ||
        ordinal != comm->cudaDev)
        return nc_fail(ncclInvalidArgument, "%s : %s %p is not a valid pointer on device %d", fn,
                         what, p, comm->cudaDev);
    return ncclSuccess;
}

static int check_pointers(void)
{
    const char *s = getenv("NCCL_CHECK_POINTERS");
    return s && atoi(s) != 0;
}

#define OP_NONE INT_MIN   /* operations that do not reduce */
#define ROOT_NONE LLONG_MIN /* operations without a root or peer (no int is) */
enum { AT_ROOT = 2 };  /* a buffer used only on the root rank */

/* NCCL's ArgsCheck. root: the root or peer, or ROOT_NONE. send/recv:
 * whether the buffers are used (1), not (0) or on the root only (AT_ROOT),
 * for the pointer check. */
static ncclResult_t check(ncclComm_t comm, ncclDataType_t type, int op, long long root,
                          const void *send, int use_send, const void *recv, int use_recv,
                          const char *fn)
{
    ncclResult_t r = nc_comm_check(comm, fn);
    if (r != ncclSuccess)
        return r;
    if (comm->finalized)
        return nc_fail(ncclInvalidUsage, "%s : comm %p is finalized", fn, (void *)comm);
    if (root != ROOT_NONE && (root < 0 || root >= comm->nranks))
        return nc_fail(ncclInvalidArgument, "%s : invalid root %lld (root should be in the 0..%d range)",
                         fn, root, comm->nranks - 1);
    if ((int)type < 0 || (int)type >= ncclNumTypes)
        return nc_fail(ncclInvalidArgument, "%s : invalid type %d", fn, (int)type);
    if (op != OP_NONE) {
        if (op < 0 || op >= ncclNumOps + NCCL_MAX_USER_OPS)
            return nc_fail(ncclInvalidArgument, "%s : invalid reduction operation %d", fn, op);
        if (op >= ncclNumOps && !comm->user_ops[op - ncclNumOps])
            return nc_fail(ncclInvalidArgument,
                             "%s : reduction operation %d unknown to this communicator", fn, op);
    }
    if (check_pointers()) {
        use_send = use_send == AT_ROOT ? comm->rank == root : use_send;
        use_recv = use_recv == AT_ROOT ? comm->rank == root : use_recv;
        if (use_send && (r = check_ptr(comm, send, "sendbuff", fn)) != ncclSuccess)
            return r;
        if (use_recv && (r = check_ptr(comm, recv, "recvbuff", fn)) != ncclSuccess)
            return r;
    }
    return ncclSuccess;
}

#define RUN(fn, comm, stream, checkexpr, data)              \
    do {                                                    \
        SIM_ENTRY(fn);                                      \
        ncclResult_t r_ = (checkexpr);                      \
        if (r_ != ncclSuccess)                              \
            return group_failed(r_);                        \
        size_t esz_ = type_size[datatype];                  \
        (void)esz_;                                         \
        data;                                               \
        return enqueue(comm, stream, fn);                   \
    } while (0)

NCCL_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream)
{
    RUN("ncclAllReduce", comm, stream,
        check(comm, datatype, op, ROOT_NONE, sendbuff, 1, recvbuff, 1, "AllReduce"),
        copy(recvbuff, sendbuff, count * esz_));
}
NCCL_ALIAS(ncclAllReduce);

NCCL_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream)
{
    RUN("ncclBroadcast", comm, stream,
        check(comm, datatype, OP_NONE, root, sendbuff, AT_ROOT, recvbuff, 1,
              "Broadcast"),
        if (comm->rank == root) copy(recvbuff, sendbuff, count * esz_));
}
NCCL_ALIAS(ncclBroadcast);

NCCL_API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream)
{
    RUN("ncclBcast", comm, stream,
        check(comm, datatype, OP_NONE, root, buff, 0, buff, 1, "Bcast"), (void)count);
}
NCCL_ALIAS(ncclBcast);

NCCL_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, int root,
                                 ncclComm_t comm, cudaStream_t stream)
{
    RUN("ncclReduce", comm, stream,
        check(comm, datatype, op, root, sendbuff, 1, recvbuff, AT_ROOT,
              "Reduce"),
        if (comm->rank == root) copy(recvbuff, sendbuff, count * esz_));
}
NCCL_ALIAS(ncclReduce);

NCCL_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream)
{
    RUN("ncclReduceScatter", comm, stream,
        check(comm, datatype, op, ROOT_NONE, sendbuff, 1, recvbuff, 1, "ReduceScatter"),
        copy(recvbuff, (const char *)sendbuff + (size_t)comm->rank * recvcount * esz_,
             recvcount * esz_));
}
NCCL_ALIAS(ncclReduceScatter);

NCCL_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    RUN("ncclAllGather", comm, stream,
        check(comm, datatype, OP_NONE, ROOT_NONE, sendbuff, 1, recvbuff, 1, "AllGather"),
        for (int r = 0; r < comm->nranks; r++)
            copy((char *)recvbuff + (size_t)r * sendcount * esz_, sendbuff, sendcount * esz_));
}
NCCL_ALIAS(ncclAllGather);

NCCL_API ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    RUN("ncclAlltoAll", comm, stream,
        check(comm, datatype, OP_NONE, ROOT_NONE, sendbuff, 1, recvbuff, 1, "AlltoAll"),
        for (int r = 0; r < comm->nranks; r++)
            copy((char *)recvbuff + (size_t)r * count * esz_,
                 (const char *)sendbuff + (size_t)comm->rank * count * esz_, count * esz_));
}
NCCL_ALIAS(ncclAlltoAll);

NCCL_API ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream)
{
    RUN("ncclGather", comm, stream,
        check(comm, datatype, OP_NONE, root, sendbuff, 1, recvbuff, AT_ROOT,
              "Gather"),
        if (comm->rank == root) for (int r = 0; r < comm->nranks; r++)
            copy((char *)recvbuff + (size_t)r * count * esz_, sendbuff, count * esz_));
}
NCCL_ALIAS(ncclGather);

NCCL_API ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream)
{
    RUN("ncclScatter", comm, stream,
        check(comm, datatype, OP_NONE, root, sendbuff, AT_ROOT, recvbuff, 1,
              "Scatter"),
        if (comm->rank == root)
            copy(recvbuff, (const char *)sendbuff + (size_t)root * count * esz_, count * esz_));
}
NCCL_ALIAS(ncclScatter);

/* Point-to-point: NCCL checks the peer like a root; a count of 0 needs no buffer. */
NCCL_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                               int peer, ncclComm_t comm, cudaStream_t stream)
{
    RUN("ncclSend", comm, stream,
        check(comm, datatype, OP_NONE, peer, sendbuff, count > 0, NULL, 0, "Send"), (void)0);
}
NCCL_ALIAS(ncclSend);

NCCL_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, cudaStream_t stream)
{
    RUN("ncclRecv", comm, stream,
        check(comm, datatype, OP_NONE, peer, NULL, 0, recvbuff, count > 0, "Recv"), (void)0);
}
NCCL_ALIAS(ncclRecv);

/* ------------------------------------------------------------------ */
/* groups                                                               */

NCCL_API ncclResult_t ncclGroupStart(void)
{
    SIM_ENTRY("ncclGroupStart");
    if (group_depth == 0) {
        n_pending = 0;
        group_error = ncclSuccess;
    }
    group_depth++;
    return ncclSuccess;
}
NCCL_ALIAS(ncclGroupStart);

NCCL_API ncclResult_t ncclGroupEnd(void)
{
    SIM_ENTRY("ncclGroupEnd");
    if (group_depth == 0)
        return nc_fail(ncclInvalidUsage, "ncclGroupEnd: not in a group call.");
    if (--group_depth > 0)
        return ncclSuccess;
    ncclResult_t r = group_error;
    for (int i = 0; i < n_pending && r == ncclSuccess; i++)
        r = launch(pending[i].ctx, pending[i].stream, "ncclGroupEnd");
    n_pending = 0;
    group_error = ncclSuccess;
    return r;
}
NCCL_ALIAS(ncclGroupEnd);

/* ------------------------------------------------------------------ */
/* user reduction operations                                            */

NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                               ncclDataType_t datatype,
                                               ncclScalarResidence_t residence, ncclComm_t comm)
{
    SIM_ENTRY("ncclRedOpCreatePreMulSum");
    ncclResult_t r = nc_comm_check(comm, "ncclRedOpCreatePreMulSum");
    if (r != ncclSuccess)
        return r;
    if (!op || !scalar)
        return nc_fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : NULL op or scalar");
    if ((int)datatype < 0 || (int)datatype >= ncclNumTypes)
        return nc_fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : invalid type %d",
                         (int)datatype);
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
        return nc_fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : invalid residence %d",
                         (int)residence);
    for (int i = 0; i < NCCL_MAX_USER_OPS; i++)
        if (__atomic_exchange_n(&comm->user_ops[i], 1, __ATOMIC_ACQ_REL) == 0) {
            *op = (ncclRedOp_t)(ncclNumOps + i);
            return ncclSuccess;
        }
    return nc_fail(ncclInternalError, "ncclRedOpCreatePreMulSum : too many live operations");
}
NCCL_ALIAS(ncclRedOpCreatePreMulSum);

NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    SIM_ENTRY("ncclRedOpDestroy");
    ncclResult_t r = nc_comm_check(comm, "ncclRedOpDestroy");
    if (r != ncclSuccess)
        return r;
    if ((int)op < ncclNumOps)
        return nc_fail(ncclInvalidArgument, "ncclRedOpDestroy : operation %d is built in",
                         (int)op);
    int i = (int)op - ncclNumOps;
    if (i >= NCCL_MAX_USER_OPS || !__atomic_exchange_n(&comm->user_ops[i], 0, __ATOMIC_ACQ_REL))
        return nc_fail(ncclInvalidArgument,
                         "ncclRedOpDestroy : operation %d unknown to this communicator", (int)op);
    return ncclSuccess;
}
NCCL_ALIAS(ncclRedOpDestroy);
