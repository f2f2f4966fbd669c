/*
 * rt_memory.c - memory in the fake runtime: cudaMalloc/cudaFree/
 * cudaMemGetInfo (on the fake driver's cuMemAlloc, so capacity and
 * accounting live in one place), cudaPointerGetAttributes, and the copies
 * and memsets, which really copy. Pinned host memory is in rt_host.c.
 *
 * Everything is synchronous: an async copy has happened when the call
 * returns. Device ranges are checked by the driver; host ranges cannot be
 * (any pointer that is not device memory is host memory).
 *
 * Out of memory: cudaMalloc returns cudaErrorMemoryAllocation and records
 * it as the thread's last error; like the real runtime the error is not
 * sticky, cudaGetLastError returns and clears it.
 */
#include "rt_internal.h"

#include <string.h>

/* ------------------------------------------------------------------ */
/* device memory                                                        */

RT_API cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size)
{
    SIM_ENTRY("cudaMalloc");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!devPtr)
        return rt_err(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc_v2(&p, size);
    if (r != CUDA_SUCCESS)
        return rt_err(r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation : (cudaError_t)r);
    *devPtr = (void *)(uintptr_t)p;
    return cudaSuccess;
}

/* Like the real runtime, cudaFree waits for the device. cuMemFree_v2
 * applies the capture rules of a potentially unsafe call (the caller's
 * capture mode); the wait itself is for uncaptured work only, so it runs in
 * relaxed mode, where cuCtxSynchronize does not touch a capture (Note
 * [Stream capture] in fakecuda_capture.c). Waiting after the free instead
 * of before changes nothing observable: nothing runs in between. */
RT_API cudaError_t CUDARTAPI cudaFree(void *devPtr)
{
    SIM_ENTRY("cudaFree");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!devPtr)
        return cudaSuccess;
    if ((e = rt_cu(cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr))) != cudaSuccess)
        return e;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    cuThreadExchangeStreamCaptureMode(&mode);
    cuCtxSynchronize();
    cuThreadExchangeStreamCaptureMode(&mode);
    return cudaSuccess;
}

static cudaError_t check_stream(cudaStream_t s)
{
    unsigned int flags;
    return rt_cu(cuStreamGetFlags(s, &flags));
}

/* Stream-ordered allocation, without pools: the memory exists at once and
 * is freed at once (every schedule the real one allows includes this). On
 * a capturing stream a GPU would add a memory node to the graph; the fake
 * has no memory nodes and refuses (torch's native allocator never calls
 * these; its cudaMallocAsync backend is not simulated under capture). */
static cudaError_t refuse_capture(cudaStream_t s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = cuStreamIsCapturing(s, &st);
    if (r != CUDA_SUCCESS)
        return rt_cu(r);
    return st != CU_STREAM_CAPTURE_STATUS_NONE ? rt_err(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    SIM_ENTRY("cudaMallocAsync");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if ((e = check_stream(hStream)) != cudaSuccess || (e = refuse_capture(hStream)) != cudaSuccess)
        return e;
    if (!devPtr)
        return rt_err(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    CUresult r = size ? cuMemAlloc_v2(&p, size) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        return rt_err(r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation : (cudaError_t)r);
    *devPtr = (void *)(uintptr_t)p;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    SIM_ENTRY("cudaFreeAsync");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if ((e = check_stream(hStream)) != cudaSuccess || (e = refuse_capture(hStream)) != cudaSuccess)
        return e;
    if (!devPtr)
        return cudaSuccess;
    return rt_cu(cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr));
}

RT_API cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free, size_t *total)
{
    SIM_ENTRY("cudaMemGetInfo");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    return rt_cu(cuMemGetInfo_v2(free, total));
}

RT_API cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                                      const void *ptr)
{
    SIM_ENTRY("cudaPointerGetAttributes");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!attributes)
        return rt_err(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    int host_dev = 0, dev;
    if (rt_host_device(ptr, &host_dev)) {
        attributes->type = cudaMemoryTypeHost;
        attributes->device = host_dev;
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = (void *)ptr;
    } else if (cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                     (CUdeviceptr)(uintptr_t)ptr) == CUDA_SUCCESS) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = dev;
        attributes->devicePointer = (void *)ptr;
    } else {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2; /* cudaInvalidDeviceId */
        attributes->hostPointer = (void *)ptr;
    }
    return cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* copies and memsets                                                   */

/* One 1D copy. stream: NULL for a synchronous call, else a stream pointer
 * (which may itself be 0, the legacy stream). */
static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                        const cudaStream_t *stream)
{
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
    CUstream st = stream ? *stream : NULL;
    if (n == 0)
        return cudaSuccess;
    switch (kind) {
    case cudaMemcpyHostToHost:
        if (!dst || !src)
            return cudaErrorInvalidValue;
        if (stream) /* on the stream's timeline, or a node while it captures */
            return (cudaError_t)cuMemcpyAsync(d, s, n, st);
        memmove(dst, src, n);
        return cudaSuccess;
    case cudaMemcpyHostToDevice:
        return (cudaError_t)(stream ? cuMemcpyHtoDAsync_v2(d, src, n, st) : cuMemcpyHtoD_v2(d, src, n));
    case cudaMemcpyDeviceToHost:
        return (cudaError_t)(stream ? cuMemcpyDtoHAsync_v2(dst, s, n, st) : cuMemcpyDtoH_v2(dst, s, n));
    case cudaMemcpyDeviceToDevice:
        return (cudaError_t)(stream ? cuMemcpyDtoDAsync_v2(d, s, n, st) : cuMemcpyDtoD_v2(d, s, n));
    case cudaMemcpyDefault:
        return (cudaError_t)(stream ? cuMemcpyAsync(d, s, n, st) : cuMemcpy(d, s, n));
    default:
        return cudaErrorInvalidMemcpyDirection;
    }
}

static cudaError_t memcpy_1d(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                             const cudaStream_t *stream)
{
    cudaError_t e = rt_ctx();
    if (e == cudaSuccess)
        e = copy(dst, src, count, kind, stream);
    return rt_err(e);
}

static cudaError_t memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                             size_t height, enum cudaMemcpyKind kind, const cudaStream_t *stream)
{
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (height > 1 && (width > dpitch || width > spitch))
        return rt_err(cudaErrorInvalidPitchValue);
    for (size_t row = 0; row < height && e == cudaSuccess; row++)
        e = copy((char *)dst + row * dpitch, (const char *)src + row * spitch, width, kind, stream);
    return rt_err(e);
}

RT_API cudaError_t CUDARTAPI cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    SIM_ENTRY("cudaMemcpy");
    return memcpy_1d(dst, src, count, kind, NULL);
}

RT_API cudaError_t CUDARTAPI cudaMemcpy_ptds(void *dst, const void *src, size_t count,
                                             enum cudaMemcpyKind kind)
{
    SIM_ENTRY("cudaMemcpy_ptds");
    return memcpy_1d(dst, src, count, kind, NULL);
}

RT_API cudaError_t CUDARTAPI cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                             enum cudaMemcpyKind kind, cudaStream_t stream)
{
    SIM_ENTRY("cudaMemcpyAsync");
    return memcpy_1d(dst, src, count, kind, &stream);
}

RT_API cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
                                                  enum cudaMemcpyKind kind, cudaStream_t stream)
{
    SIM_ENTRY("cudaMemcpyAsync_ptsz");
    stream = rt_ptsz(stream);
    return memcpy_1d(dst, src, count, kind, &stream);
}

RT_API cudaError_t CUDARTAPI cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                          size_t width, size_t height, enum cudaMemcpyKind kind)
{
    SIM_ENTRY("cudaMemcpy2D");
    return memcpy_2d(dst, dpitch, src, spitch, width, height, kind, NULL);
}

RT_API cudaError_t CUDARTAPI cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src,
                                               size_t spitch, size_t width, size_t height,
                                               enum cudaMemcpyKind kind)
{
    SIM_ENTRY("cudaMemcpy2D_ptds");
    return memcpy_2d(dst, dpitch, src, spitch, width, height, kind, NULL);
}

RT_API cudaError_t CUDARTAPI cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src,
                                               size_t spitch, size_t width, size_t height,
                                               enum cudaMemcpyKind kind, cudaStream_t stream)
{
    SIM_ENTRY("cudaMemcpy2DAsync");
    return memcpy_2d(dst, dpitch, src, spitch, width, height, kind, &stream);
}

RT_API cudaError_t CUDARTAPI cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src,
                                                    size_t spitch, size_t width, size_t height,
                                                    enum cudaMemcpyKind kind, cudaStream_t stream)
{
    SIM_ENTRY("cudaMemcpy2DAsync_ptsz");
    stream = rt_ptsz(stream);
    return memcpy_2d(dst, dpitch, src, spitch, width, height, kind, &stream);
}

static cudaError_t memcpy_peer(void *dst, int dstDevice, const void *src, int srcDevice,
                               size_t count, const cudaStream_t *stream)
{
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    CUcontext dc = rt_primary_ctx(dstDevice), sc = rt_primary_ctx(srcDevice);
    if (!dc || !sc)
        return rt_err(cudaErrorInvalidDevice);
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
    if (stream)
        return rt_cu(cuMemcpyPeerAsync(d, dc, s, sc, count, *stream));
    return rt_cu(cuMemcpyPeer(d, dc, s, sc, count));
}

RT_API cudaError_t CUDARTAPI cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
                                            size_t count)
{
    SIM_ENTRY("cudaMemcpyPeer");
    return memcpy_peer(dst, dstDevice, src, srcDevice, count, NULL);
}

RT_API cudaError_t CUDARTAPI cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src,
                                                 int srcDevice, size_t count, cudaStream_t stream)
{
    SIM_ENTRY("cudaMemcpyPeerAsync");
    return memcpy_peer(dst, dstDevice, src, srcDevice, count, &stream);
}

static cudaError_t memset_2d(void *devPtr, size_t pitch, int value, size_t width, size_t height,
                             const cudaStream_t *stream)
{
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (height > 1 && width > pitch)
        return rt_err(cudaErrorInvalidPitchValue);
    for (size_t row = 0; row < height; row++) {
        CUdeviceptr p = (CUdeviceptr)(uintptr_t)devPtr + row * pitch;
        CUresult r = stream ? cuMemsetD8Async(p, (unsigned char)value, width, *stream)
                            : cuMemsetD8_v2(p, (unsigned char)value, width);
        if (r != CUDA_SUCCESS)
            return rt_cu(r);
    }
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaMemset(void *devPtr, int value, size_t count)
{
    SIM_ENTRY("cudaMemset");
    return memset_2d(devPtr, count, value, count, 1, NULL);
}

RT_API cudaError_t CUDARTAPI cudaMemset_ptds(void *devPtr, int value, size_t count)
{
    SIM_ENTRY("cudaMemset_ptds");
    return memset_2d(devPtr, count, value, count, 1, NULL);
}

RT_API cudaError_t CUDARTAPI cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    SIM_ENTRY("cudaMemsetAsync");
    return memset_2d(devPtr, count, value, count, 1, &stream);
}

RT_API cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
                                                  cudaStream_t stream)
{
    SIM_ENTRY("cudaMemsetAsync_ptsz");
    stream = rt_ptsz(stream);
    return memset_2d(devPtr, count, value, count, 1, &stream);
}

RT_API cudaError_t CUDARTAPI cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width,
                                          size_t height)
{
    SIM_ENTRY("cudaMemset2D");
    return memset_2d(devPtr, pitch, value, width, height, NULL);
}

RT_API cudaError_t CUDARTAPI cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width,
                                               size_t height, cudaStream_t stream)
{
    SIM_ENTRY("cudaMemset2DAsync");
    return memset_2d(devPtr, pitch, value, width, height, &stream);
}
