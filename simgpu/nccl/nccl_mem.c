/*
 * nccl_mem.c - device memory of the fake NCCL: the buffers every
 * communicator holds (charged to the device through the fake driver, so
 * they show in cudaMemGetInfo and the device's used bytes but never in
 * PyTorch's allocator), ncclMemAlloc / ncclMemFree, and buffer
 * registration (ncclCommRegister / Deregister: bookkeeping only).
 *
 * Note [NCCL buffer memory]. A real communicator connects, for each of its
 * channels, a ring and a tree to its peers, and allocates for every
 * connection one buffer per protocol (NCCL src/init.cc, computeBuffSizes):
 * Simple NCCL_BUFFSIZE (default 1 << 22 = 4 MiB), LL NCCL_LL_BUFFSIZE
 * (default 8 lines per thread x 512 threads x 8 steps x 16 bytes = 512 KiB)
 * and LL128 NCCL_LL128_BUFFSIZE (default 120 elements per thread x 640
 * threads x 8 steps x 8 bytes = 4,915,200 bytes). The channel count comes
 * from NCCL's topology search; the fake takes 16, then NCCL_MIN_NCHANNELS
 * and NCCL_MAX_NCHANNELS (1..64) bound it. So, per communicator:
 *
 *     bytes = channels x connections x (BUFFSIZE + LL_BUFFSIZE + LL128_BUFFSIZE)
 *     connections = 0 for a single rank, else 2 (the ring's and the tree's)
 *
 * 294 MiB for 2 or more ranks by default; nothing for one rank. Freed by
 * ncclCommDestroy / ncclCommAbort. Connections NCCL makes lazily (send/recv
 * peers, NVLS, CollNet) are not modelled.
 */
#include "nccl_internal.h"

#include <pthread.h>
#include <stdlib.h>

#define DEFAULT_CHANNELS 16
#define DEFAULT_BUFFSIZE ((size_t)1 << 22)
#define DEFAULT_LL_BUFFSIZE ((size_t)8 * 512 * 8 * 16)
#define DEFAULT_LL128_BUFFSIZE ((size_t)120 * 640 * 8 * 8)

static long long env_ll(const char *name, long long dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    long long v = strtoll(s, &end, 0);
    return (*end || v <= 0) ? dflt : v; /* NCCL ignores values it cannot use (-2: default) */
}

size_t nc_comm_buffer_bytes(int nranks)
{
    if (nranks <= 1)
        return 0;
    long long ch = DEFAULT_CHANNELS;
    long long lo = env_ll("NCCL_MIN_NCHANNELS", 1), hi = env_ll("NCCL_MAX_NCHANNELS", 64);
    if (hi > 64)
        hi = 64;
    if (ch < lo)
        ch = lo;
    if (ch > hi)
        ch = hi;
    size_t per = (size_t)env_ll("NCCL_BUFFSIZE", DEFAULT_BUFFSIZE) +
                 (size_t)env_ll("NCCL_LL_BUFFSIZE", DEFAULT_LL_BUFFSIZE) +
                 (size_t)env_ll("NCCL_LL128_BUFFSIZE", DEFAULT_LL128_BUFFSIZE);
    return (size_t)ch * 2 * per;
}

ncclResult_t nc_charge(struct ncclComm *c)
{
    CUresult r = cuDevicePrimaryCtxRetain(&c->ctx, c->cudaDev);
    if (r != CUDA_SUCCESS)
        return nc_cuda_fail(r, "cuDevicePrimaryCtxRetain");
    size_t bytes = nc_comm_buffer_bytes(c->nranks);
    if (bytes == 0)
        return ncclSuccess;
    CUcontext prev;
    if ((r = cuCtxPushCurrent_v2(c->ctx)) == CUDA_SUCCESS) {
        r = cuMemAlloc_v2(&c->buffers, bytes);
        cuCtxPopCurrent_v2(&prev);
    }
    if (r != CUDA_SUCCESS) {
        cuDevicePrimaryCtxRelease_v2(c->cudaDev);
        c->ctx = NULL;
        return nc_cuda_fail(r, "allocating the communicator's buffers");
    }
    c->buffer_bytes = bytes;
    return ncclSuccess;
}

void nc_release(struct ncclComm *c)
{
    if (!c->ctx)
        return;
    if (c->buffers) {
        CUcontext prev;
        if (cuCtxPushCurrent_v2(c->ctx) == CUDA_SUCCESS) {
            cuMemFree_v2(c->buffers);
            cuCtxPopCurrent_v2(&prev);
        }
        c->buffers = 0;
        c->buffer_bytes = 0;
    }
    cuDevicePrimaryCtxRelease_v2(c->cudaDev);
    c->ctx = NULL;
}

/* ncclMemAlloc: NCCL maps physical memory (cuMemCreate) rounded up to the
 * allocation granularity on the current device; the fake allocates the
 * same rounded size with cuMemAlloc there. */
#define MEM_GRANULARITY ((size_t)2 << 20)

NCCL_API ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    SIM_ENTRY("ncclMemAlloc");
    if (!ptr)
        return nc_fail(ncclInvalidArgument, "ncclMemAlloc : ptr argument is NULL");
    *ptr = NULL;
    if (size == 0)
        return ncclSuccess;
    CUresult r = cuInit(0);
    CUcontext ctx = NULL;
    if (r == CUDA_SUCCESS && (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)) {
        /* no current context: the runtime's default device, as cudaMalloc would */
        if ((r = cuDevicePrimaryCtxRetain(&ctx, 0)) == CUDA_SUCCESS)
            r = cuCtxSetCurrent(ctx);
    }
    CUdeviceptr p = 0;
    if (r == CUDA_SUCCESS)
        r = cuMemAlloc_v2(&p, (size + MEM_GRANULARITY - 1) / MEM_GRANULARITY * MEM_GRANULARITY);
    if (r != CUDA_SUCCESS)
        return nc_cuda_fail(r, "ncclMemAlloc");
    *ptr = (void *)(uintptr_t)p;
    return ncclSuccess;
}
NCCL_ALIAS(ncclMemAlloc);

NCCL_API ncclResult_t ncclMemFree(void *ptr)
{
    SIM_ENTRY("ncclMemFree");
    if (!ptr)
        return ncclSuccess;
    CUresult r = cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr);
    return r == CUDA_SUCCESS ? ncclSuccess : nc_cuda_fail(r, "ncclMemFree");
}
NCCL_ALIAS(ncclMemFree);

/* Registration: a handle per (comm, buffer); nothing is mapped. */
struct reg {
    ncclComm_t comm;
    void *buff;
    size_t size;
    struct reg *next;
};
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct reg *regs;

NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    SIM_ENTRY("ncclCommRegister");
    ncclResult_t r = nc_comm_check(comm, "ncclCommRegister");
    if (r != ncclSuccess)
        return r;
    if (!handle)
        return nc_fail(ncclInvalidArgument, "ncclCommRegister : handle argument is NULL");
    if (!buff || size == 0)
        return nc_fail(ncclInvalidArgument, "ncclCommRegister : invalid buffer %p or size %zu",
                         buff, size);
    struct reg *g = calloc(1, sizeof *g);
    if (!g)
        return nc_fail(ncclSystemError, "out of host memory");
    g->comm = comm;
    g->buff = buff;
    g->size = size;
    pthread_mutex_lock(&reg_mu);
    g->next = regs;
    regs = g;
    pthread_mutex_unlock(&reg_mu);
    *handle = g;
    return ncclSuccess;
}
NCCL_ALIAS(ncclCommRegister);

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    SIM_ENTRY("ncclCommDeregister");
    ncclResult_t r = nc_comm_check(comm, "ncclCommDeregister");
    if (r != ncclSuccess)
        return r;
    pthread_mutex_lock(&reg_mu);
    struct reg **pp = &regs;
    while (*pp && !(*pp == handle && (*pp)->comm == comm))
        pp = &(*pp)->next;
    struct reg *g = *pp;
    if (g)
        *pp = g->next;
    pthread_mutex_unlock(&reg_mu);
    if (!g)
        return nc_fail(ncclInvalidArgument,
                         "ncclCommDeregister : handle %p is not registered with comm %p", handle,
                         (void *)comm);
    free(g);
    return ncclSuccess;
}
NCCL_ALIAS(ncclCommDeregister);
