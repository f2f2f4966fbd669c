/*
 * fakecuda_copy.c - the copy, memset and pointer-query entry points the
 * fake CUDA runtime (csrc/sim/cudart) builds cudaMemcpy*, cudaMemset* and
 * cudaPointerGetAttributes on: cuMemcpy (unified addressing), the
 * DtoD/async/peer variants, cuMemsetD8Async, cuMemsetD32, cuPointerGetAttribute
 * and cuMemGetAddressRange.
 *
 * The data moves before the call returns, which is one valid schedule of
 * the real thing; in the timeline mode the copy also takes simulated time
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

#include <string.h>

/* The current context and, if hStream is given, a check that it is live. */
static CUresult prologue_unlocked(int check_stream, CUstream hStream)
{
    struct CUctx_st *c, *sctx;
    uint64_t key;
    CUresult res = fc_current_ctx_unlocked(&c);
    if (res != CUDA_SUCCESS || !check_stream)
        return res;
    return fc_resolve_stream_unlocked(hStream, c, &key, &sctx);
}

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
static CUresult copy_unlocked(uint64_t dst, int dst_dev, uint64_t src, int src_dev, size_t n)
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
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    FC_BEGIN(FN_cuMemcpy, 1);
    if ((res = prologue_unlocked(0, NULL)) != CUDA_SUCCESS)
        goto done;
    res = copy_unlocked(dst, -1, src, -1, ByteCount);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(NULL, dst, src, ByteCount, 1);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                      CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyAsync, 1);
    if ((res = prologue_unlocked(1, hStream)) != CUDA_SUCCESS)
        goto done;
    res = copy_unlocked(dst, -1, src, -1, ByteCount);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(hStream, dst, src, ByteCount, 0);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                        size_t ByteCount)
{
    FC_BEGIN(FN_cuMemcpyDtoD_v2, 1);
    if ((res = prologue_unlocked(0, NULL)) != CUDA_SUCCESS)
        goto done;
    res = copy_unlocked(dstDevice, 1, srcDevice, 1, ByteCount);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(NULL, dstDevice, srcDevice, ByteCount, 1);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                             size_t ByteCount, CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyHtoDAsync_v2, 1);
    if ((res = prologue_unlocked(1, hStream)) != CUDA_SUCCESS)
        goto done;
    res = copy_unlocked(dstDevice, 1, (uint64_t)(uintptr_t)srcHost, 0, ByteCount);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(hStream, dstDevice, (uint64_t)(uintptr_t)srcHost, ByteCount, 0);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice,
                                             size_t ByteCount, CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyDtoHAsync_v2, 1);
    if ((res = prologue_unlocked(1, hStream)) != CUDA_SUCCESS)
        goto done;
    res = copy_unlocked((uint64_t)(uintptr_t)dstHost, 0, srcDevice, 1, ByteCount);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(hStream, (uint64_t)(uintptr_t)dstHost, srcDevice, ByteCount, 0);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                             size_t ByteCount, CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyDtoDAsync_v2, 1);
    if ((res = prologue_unlocked(1, hStream)) != CUDA_SUCCESS)
        goto done;
    res = copy_unlocked(dstDevice, 1, srcDevice, 1, ByteCount);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(hStream, dstDevice, srcDevice, ByteCount, 0);
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
    if ((res = prologue_unlocked(0, NULL)) != CUDA_SUCCESS)
        goto done;
    if (!is_primary_ctx(dstContext) || !is_primary_ctx(srcContext))
        FC_FAIL(CUDA_ERROR_INVALID_CONTEXT);
    res = copy_unlocked(dstDevice, 1, srcDevice, 1, ByteCount);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(NULL, dstDevice, srcDevice, ByteCount, 1);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                          CUdeviceptr srcDevice, CUcontext srcContext,
                                          size_t ByteCount, CUstream hStream)
{
    FC_BEGIN(FN_cuMemcpyPeerAsync, 1);
    if ((res = prologue_unlocked(1, hStream)) != CUDA_SUCCESS)
        goto done;
    if (!is_primary_ctx(dstContext) || !is_primary_ctx(srcContext))
        FC_FAIL(CUDA_ERROR_INVALID_CONTEXT);
    res = copy_unlocked(dstDevice, 1, srcDevice, 1, ByteCount);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(hStream, dstDevice, srcDevice, ByteCount, 0);
    FC_END();
}

static CUresult set_unlocked(uint64_t dst, unsigned int value, size_t elem, size_t n)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (n > SIZE_MAX / elem || (elem == 4 && dst % 4 != 0))
        return CUDA_ERROR_INVALID_VALUE;
    if (!fc_accessible_unlocked(dst, n * elem, 1))
        return CUDA_ERROR_INVALID_VALUE;
    if (elem == 1) {
        memset((void *)(uintptr_t)dst, (int)(value & 0xff), n);
    } else {
        uint32_t *p = (uint32_t *)(uintptr_t)dst;
        for (size_t i = 0; i < n; i++)
            p[i] = value;
    }
    return CUDA_SUCCESS;
}

FC_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                        CUstream hStream)
{
    FC_BEGIN(FN_cuMemsetD8Async, 1);
    if ((res = prologue_unlocked(1, hStream)) != CUDA_SUCCESS)
        goto done;
    res = set_unlocked(dstDevice, uc, 1, N);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(hStream, dstDevice, 0, N, 0);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    FC_BEGIN(FN_cuMemsetD32_v2, 1);
    if ((res = prologue_unlocked(0, NULL)) != CUDA_SUCCESS)
        goto done;
    res = set_unlocked(dstDevice, ui, 4, N);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(NULL, dstDevice, 0, N * 4, 0);
    FC_END();
}

FC_API CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                         CUstream hStream)
{
    FC_BEGIN(FN_cuMemsetD32Async, 1);
    if ((res = prologue_unlocked(1, hStream)) != CUDA_SUCCESS)
        goto done;
    res = set_unlocked(dstDevice, ui, 4, N);
    if (res == CUDA_SUCCESS)
        fc_tl_copy_unlocked(hStream, dstDevice, 0, N * 4, 0);
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
 * 0 or CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER (1). */
FC_API CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                                unsigned int flags)
{
    FC_BEGIN(FN_cuStreamWriteValue32_v2, 1);
    if ((res = prologue_unlocked(1, stream)) != CUDA_SUCCESS)
        goto done;
    if (flags > 1 || addr % 4 != 0 || !fc_accessible_unlocked(addr, 4, 1))
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *(volatile uint32_t *)(uintptr_t)addr = value;
    FC_END();
}
