/*
 * rt_stream.c - streams, events, stream capture and host callbacks of the
 * fake runtime.
 *
 * Streams and events are the fake driver's objects (cuStreamCreate,
 * cuEventCreate): a cudaStream_t is a CUstream, so gpumem's driver backend
 * and torch's runtime calls see the same handles, and events complete by
 * the driver's event mode (GPUMEM_SIM_EVENTS: immediate, never, after:N).
 * cudaEventQuery answers cudaErrorNotReady for an incomplete event and, as
 * the real runtime does, records it as the thread's last error.
 *
 * Stream capture, graphs and cudaLaunchHostFunc are rt_graph.c's. Stream
 * callbacks (cudaStreamAddCallback) run at once, on the calling thread:
 * nothing queued before them can still be running.
 */
#include "rt_internal.h"

/* ------------------------------------------------------------------ */
/* streams                                                              */

RT_API cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *pStream)
{
    SIM_ENTRY("cudaStreamCreate");
    RT_WITH_CTX(cuStreamCreate(pStream, 0));
}

RT_API cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    SIM_ENTRY("cudaStreamCreateWithFlags");
    RT_WITH_CTX(cuStreamCreate(pStream, flags));
}

RT_API cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                                          int priority)
{
    SIM_ENTRY("cudaStreamCreateWithPriority");
    RT_WITH_CTX(cuStreamCreateWithPriority(pStream, flags, priority));
}

RT_API cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream)
{
    SIM_ENTRY("cudaStreamDestroy");
    RT_WITH_CTX(cuStreamDestroy_v2(stream));
}

static cudaError_t cudaStreamQuery_impl(cudaStream_t stream) { RT_WITH_CTX(cuStreamQuery(stream)); }
RT_PTSZ_PAIR(cudaStreamQuery, (stream), (cudaStream_t stream))

static cudaError_t cudaStreamSynchronize_impl(cudaStream_t stream)
{
    RT_WITH_CTX(cuStreamSynchronize(stream));
}
RT_PTSZ_PAIR(cudaStreamSynchronize, (stream), (cudaStream_t stream))

static cudaError_t cudaStreamWaitEvent_impl(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    RT_WITH_CTX(cuStreamWaitEvent(stream, event, flags));
}
RT_PTSZ_PAIR(cudaStreamWaitEvent, (stream, event, flags),
            (cudaStream_t stream, cudaEvent_t event, unsigned int flags))

static cudaError_t cudaStreamGetPriority_impl(cudaStream_t stream, int *priority)
{
    RT_WITH_CTX(cuStreamGetPriority(stream, priority));
}
RT_PTSZ_PAIR(cudaStreamGetPriority, (stream, priority), (cudaStream_t stream, int *priority))

static cudaError_t cudaStreamGetFlags_impl(cudaStream_t stream, unsigned int *flags)
{
    RT_WITH_CTX(cuStreamGetFlags(stream, flags));
}
RT_PTSZ_PAIR(cudaStreamGetFlags, (stream, flags), (cudaStream_t stream, unsigned int *flags))

static cudaError_t cudaStreamGetId_impl(cudaStream_t stream, unsigned long long *streamId)
{
    RT_WITH_CTX(cuStreamGetId(stream, streamId));
}
RT_PTSZ_PAIR(cudaStreamGetId, (stream, streamId), (cudaStream_t stream, unsigned long long *streamId))

static cudaError_t cudaStreamGetDevice_impl(cudaStream_t stream, int *device)
{
    RT_WITH_CTX(cuStreamGetDevice(stream, device));
}
RT_PTSZ_PAIR(cudaStreamGetDevice, (stream, device), (cudaStream_t stream, int *device))

/* ------------------------------------------------------------------ */
/* stream callbacks (host functions and capture: rt_graph.c)            */

static cudaError_t cudaStreamAddCallback_impl(cudaStream_t stream, cudaStreamCallback_t callback,
                                              void *userData, unsigned int flags)
{
    unsigned int sflags;
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!callback || flags != 0)
        return rt_err(cudaErrorInvalidValue);
    if ((e = rt_cu(cuStreamGetFlags(stream, &sflags))) != cudaSuccess)
        return e;
    callback(stream, cudaSuccess, userData);
    return cudaSuccess;
}
RT_PTSZ_PAIR(cudaStreamAddCallback, (stream, callback, userData, flags),
            (cudaStream_t stream, cudaStreamCallback_t callback, void *userData, unsigned int flags))

/* ------------------------------------------------------------------ */
/* events                                                               */

RT_API cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t *event)
{
    SIM_ENTRY("cudaEventCreate");
    RT_WITH_CTX(cuEventCreate(event, 0));
}

/* cudaEvent* flags have the CU_EVENT_* values. */
RT_API cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    SIM_ENTRY("cudaEventCreateWithFlags");
    RT_WITH_CTX(cuEventCreate(event, flags));
}

static cudaError_t cudaEventRecord_impl(cudaEvent_t event, cudaStream_t stream)
{
    RT_WITH_CTX(cuEventRecord(event, stream));
}

RT_API cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    SIM_ENTRY("cudaEventRecord");
    return cudaEventRecord_impl(event, stream);
}

RT_API cudaError_t CUDARTAPI cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
    SIM_ENTRY("cudaEventRecord_ptsz");
    return cudaEventRecord_impl(event, rt_ptsz(stream));
}

static cudaError_t cudaEventRecordWithFlags_impl(cudaEvent_t event, cudaStream_t stream,
                                                 unsigned int flags)
{
    RT_WITH_CTX(cuEventRecordWithFlags(event, stream, flags));
}

RT_API cudaError_t CUDARTAPI cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                                      unsigned int flags)
{
    SIM_ENTRY("cudaEventRecordWithFlags");
    return cudaEventRecordWithFlags_impl(event, stream, flags);
}

RT_API cudaError_t CUDARTAPI cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
                                                           unsigned int flags)
{
    SIM_ENTRY("cudaEventRecordWithFlags_ptsz");
    return cudaEventRecordWithFlags_impl(event, rt_ptsz(stream), flags);
}

RT_API cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event)
{
    SIM_ENTRY("cudaEventQuery");
    RT_WITH_CTX(cuEventQuery(event));
}

RT_API cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event)
{
    SIM_ENTRY("cudaEventSynchronize");
    RT_WITH_CTX(cuEventSynchronize(event));
}

RT_API cudaError_t CUDARTAPI cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    SIM_ENTRY("cudaEventElapsedTime");
    RT_WITH_CTX(cuEventElapsedTime_v2(ms, start, end));
}

RT_API cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event)
{
    SIM_ENTRY("cudaEventDestroy");
    RT_WITH_CTX(cuEventDestroy_v2(event));
}
