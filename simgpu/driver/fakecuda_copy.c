/*
 * fakecuda_copy.c - the copy, memset and pointer-query entry points the
 * fake CUDA runtime (simgpu/cudart) builds cudaMemcpy*, cudaMemset* and
 * cudaPointerGetAttributes on: cuMemcpy (unified addressing), the
 * DtoD/async/peer variants, cuMemsetD8Async, cuMemsetD32, cuPointerGetAttribute
 * and cuMemGetAddressRange.
 *
 * The data moves before the call returns, which is one valid schedule of
 * the real thing (on a capturing stream it moves when the graph is
 * launched: Note [Stream capture] in fakecuda_capture.c); in the timeline mode the copy also takes simulated time
 * on its stream, and a synchronous copy involving host memory makes the
 * host wait for it (Note [Device timeline]). The stream argument is
 * checked (INVALID_HANDLE for a dead stream).
 *
 * Device ranges are checked like cuMemcpyHtoD does (inside one allocation,
 * or inside mappings the device may access). A pointer that is not device
 * memory is host memory under unified addressing; it cannot be checked and
 * is used as is.
 *
 * Must not: call an exported cu* function (the lock is not recursive).
 */
#include "fakecuda_internal.h"

/* 1 if [p, p+n) may be used: host memory, or accessible device memory. */
static int side_ok_unlocked(uint64_t p, size_t n, int write)
{
    uint64_t base;
    size_t size;
    int dev;
    if (!fc_lookup_device_ptr_unlocked(p, &base, &size, &dev))
        return p != 0;
    return fc_accessible_unlocked(p, n, write);
}

/* dst_dev/src_dev: 1 = must be device memory, 0 = host memory (unchecked),
 * -1 = either (unified addressing). */
static CUresult check_copy_unlocked(uint64_t dst, int dst_dev, uint64_t src, int src_dev, size_t n)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (dst == 0 || src == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (dst_dev == 1 ? !fc_accessible_unlocked(dst, n, 1)
                     : dst_dev == -1 && !side_ok_unlocked(dst, n, 1))
        return CUDA_ERROR_INVALID_VALUE;
    if (src_dev == 1 ? !fc_accessible_unlocked(src, n, 0)
                     : src_dev == -1 && !side_ok_unlocked(src, n, 0))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult check_set_unlocked(uint64_t dst, size_t elem, size_t n)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (n > SIZE_MAX / elem || (elem == 4 && dst % 4 != 0))
        return CUDA_ERROR_INVALID_VALUE;
    return fc_accessible_unlocked(dst, n * elem, 1) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The stream of an operation, resolved in the current context; sync: a
 * synchronous call, which is potentially unsafe during a capture and uses
 * the legacy stream (Note [Stream capture] in fakecuda_capture.c). */
static CUresult stream_of_unlocked(int sync, CUstream h, struct CUctx_st **sctx, uint64_t *key)
{
    struct CUctx_st *c;
    CUresult res = fc_current_ctx_unlocked(&c);
    if (res == CUDA_SUCCESS && sync)
        res = fc_cap_unsafe_unlocked();
    if (res == CUDA_SUCCESS)
        res = fc_resolve_stream_unlocked(sync ? NULL : h, c, key, sctx);
    return res;
}

/* A copy: checked, then captured as a node, or done (and timed) now. */
static CUresult copy_op_unlocked(int sync, CUstream h, uint64_t dst, int dst_dev, uint64_t src,
                                 int src_dev, size_t n)
{
    struct CUctx_st *sctx;
    uint64_t key;
    int captured;
    CUresult res = stream_of_unlocked(sync, h, &sctx, &key);
    if (res == CUDA_SUCCESS)
        res = check_copy_unlocked(dst, dst_dev, src, src_dev, n);
    struct CUgraphNode_st proto = {.type = FC_NODE_MEMCPY, .u.copy = {dst, src, n}};
    if (res == CUDA_SUCCESS)
        res = fc_cap_work_unlocked(sctx, key, n ? &proto : NULL, &captured);
    if (res != CUDA_SUCCESS || captured || n == 0)
        return res;
    fc_move_unlocked(dst, src, n); /* Note [No host memory] */
    fc_tl_copy_unlocked(sync ? NULL : h, dst, src, n, sync);
    return CUDA_SUCCESS;
}

/* A memset of n elements of elem (1 or 4) bytes, like copy_op_unlocked. */
static CUresult set_op_unlocked(int sync, CUstream h, uint64_t dst, unsigned int value, size_t elem,
                                size_t n)
{
    struct CUctx_st *sctx;
    uint64_t key;
    int captured;
    CUresult res = stream_of_unlocked(sync, h, &sctx, &key);
    if (res == CUDA_SUCCESS)
        res = check_set_unlocked(dst, elem, n);
    struct CUgraphNode_st proto = {.type = FC_NODE_MEMSET, .u.set = {dst, value, elem, n}};
    if (res == CUDA_SUCCESS)
        res = fc_cap_work_unlocked(sctx, key, n ? &proto : NULL, &captured);
    if (res != CUDA_SUCCESS || captured || n == 0)
        return res;
    fc_fill_unlocked(dst, value, elem, n);
    fc_tl_copy_unlocked(sync ? NULL : h, dst, 0, n * elem, 0);
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    FC_BEGIN(FN_cuMemcpy, 1);
    res = copy_op_unlocked(1, NULL, dst, -1, src, -1, ByteCount);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                      CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyAsync, 1);
    res = copy_op_unlocked(0, hStream, dst, -1, src, -1, ByteCount);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                        size_t ByteCount)
{
    FC_BEGIN(FN_cuMemcpyDtoD_v2, 1);
    res = copy_op_unlocked(1, NULL, dstDevice, 1, srcDevice, 1, ByteCount);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                             size_t ByteCount, CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyHtoDAsync_v2, 1);
    res = copy_op_unlocked(0, hStream, dstDevice, 1, (uint64_t)(uintptr_t)srcHost, 0, ByteCount);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice,
                                             size_t ByteCount, CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyDtoHAsync_v2, 1);
    res = copy_op_unlocked(0, hStream, (uint64_t)(uintptr_t)dstHost, 0, srcDevice, 1, ByteCount);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                             size_t ByteCount, CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyDtoDAsync_v2, 1);
    res = copy_op_unlocked(0, hStream, dstDevice, 1, srcDevice, 1, ByteCount);
    FC_END();
}

static int is_primary_ctx(CUcontext c)
{
    for (int i = 0; i < fc.ndev; i++)
        if (c == &fc.dev[i].ctx)
            return c->refcount > 0;
    return 0;
}

/* All memory is one host address space, so a peer copy is a device copy
 * once both contexts are known to be live. */
FC_API CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext,
                                     CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount)
{
    FC_BEGIN(FN_cuMemcpyPeer, 1);
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (!is_primary_ctx(dstContext) || !is_primary_ctx(srcContext))
        FC_FAIL(CUDA_ERROR_INVALID_CONTEXT);
    res = copy_op_unlocked(1, NULL, dstDevice, 1, srcDevice, 1, ByteCount);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                          CUdeviceptr srcDevice, CUcontext srcContext,
                                          size_t ByteCount, CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyPeerAsync, 1);
    struct CUctx_st *c, *sctx;
    uint64_t key;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS ||
        (res = fc_resolve_stream_unlocked(hStream, c, &key, &sctx)) != CUDA_SUCCESS)
        goto done;
    if (!is_primary_ctx(dstContext) || !is_primary_ctx(srcContext))
        FC_FAIL(CUDA_ERROR_INVALID_CONTEXT);
    res = copy_op_unlocked(0, hStream, dstDevice, 1, srcDevice, 1, ByteCount);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                        CUstream hStream)
{
    FC_BEGIN(FN_cuMemsetD8Async, 1);
    res = set_op_unlocked(0, hStream, dstDevice, uc, 1, N);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    FC_BEGIN(FN_cuMemsetD32_v2, 1);
    res = set_op_unlocked(1, NULL, dstDevice, ui, 4, N);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                         CUstream hStream)
{
    FC_BEGIN(FN_cuMemsetD32Async, 1);
    res = set_op_unlocked(0, hStream, dstDevice, ui, 4, N);
    FC_END();
}

/* Device memory only: like the real driver without host registration, a
 * pointer the driver did not allocate is CUDA_ERROR_INVALID_VALUE. */
FC_API CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                                              CUdeviceptr ptr)
{
    FC_BEGIN(FN_cuPointerGetAttribute, 1);
    uint64_t base;
    size_t size;
    int dev;
    if (!data)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_lookup_device_ptr_unlocked(ptr, &base, &size, &dev))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = &fc.dev[dev].ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        *(int *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = dev;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(CUdeviceptr *)data = size ? base : 0;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = size > 0;
        break;
    default:
        FC_FAIL(CUDA_ERROR_NOT_SUPPORTED);
    }
    FC_END();
}

/* The allocation (or the VMM mapping) holding dptr; NOT_FOUND otherwise. */
FC_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FC_BEGIN(FN_cuMemGetAddressRange_v2, 1);
    uint64_t base;
    size_t size;
    int dev;
    struct CUctx_st *c;
    if ((res = fc_current_ctx_unlocked(&c)) != CUDA_SUCCESS)
        goto done;
    if (!fc_lookup_device_ptr_unlocked(dptr, &base, &size, &dev) || size == 0)
        FC_FAIL(CUDA_ERROR_NOT_FOUND);
    if (pbase)
        *pbase = base;
    if (psize)
        *psize = size;
    FC_END();
}

/* Writes the value at once (the stream is checked, nothing waits). Flags:
 * 0 or CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER (1). The unversioned name
 * (what torch 2.6 resolves) takes the same arguments. */
static CUresult write_value32(int fn, CUstream stream, CUdeviceptr addr, cuuint32_t value,
                              unsigned int flags)
{
    FC_BEGIN(fn, 1);
    struct CUctx_st *sctx;
    uint64_t key;
    int captured;
    if ((res = stream_of_unlocked(0, stream, &sctx, &key)) != CUDA_SUCCESS)
        goto done;
    if (flags > 1 || addr % 4 != 0 || !fc_accessible_unlocked(addr, 4, 1))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    /* captured as a one-word memset, which is what it does */
    struct CUgraphNode_st proto = {.type = FC_NODE_MEMSET, .u.set = {addr, value, 4, 1}};
    if ((res = fc_cap_work_unlocked(sctx, key, &proto, &captured)) != CUDA_SUCCESS || captured)
        goto done;
    fc_fill_unlocked(addr, value, 4, 1); /* Note [No host memory] */
    FC_END();
}

FC_API CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                                unsigned int flags)
{
    return write_value32(FN_cuStreamWriteValue32_v2, stream, addr, value, flags);
}

FC_API CUresult CUDAAPI cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                             unsigned int flags)
{
    return write_value32(FN_cuStreamWriteValue32, stream, addr, value, flags);
}
