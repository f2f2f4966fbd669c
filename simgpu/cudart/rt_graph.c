/*
 * rt_graph.c - stream capture, CUDA graphs and host functions of the fake
 * runtime, mapped onto the fake driver's (simgpu/driver/fakecuda_capture.c
 * and fakecuda_graph.c, Note [Stream capture] there).
 *
 * The capture state, including the per-thread capture mode that
 * cudaThreadExchangeStreamCaptureMode swaps, lives in the driver, so that
 * captures begun through either API see each other, as on a GPU. The
 * runtime adds nothing but its context rule (rt_ctx) and error recording
 * (rt_err): a cudaGraph_t is a CUgraph, a cudaGraphExec_t a CUgraphExec.
 *
 * Node-level graph construction (cudaGraphAdd*Node, node parameters,
 * conditional nodes, user objects, cudaStreamBeginCaptureToGraph,
 * cudaStreamUpdateCaptureDependencies) is not implemented: those names stay
 * stubs answering cudaErrorNotSupported.
 */
#include "rt_internal.h"

/* ------------------------------------------------------------------ */
/* capture                                                              */

static cudaError_t cudaStreamBeginCapture_impl(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    RT_WITH_CTX(cuStreamBeginCapture_v2(stream, (CUstreamCaptureMode)mode));
}
RT_PTSZ_PAIR(cudaStreamBeginCapture, (stream, mode), (cudaStream_t stream, enum cudaStreamCaptureMode mode))

static cudaError_t cudaStreamEndCapture_impl(cudaStream_t stream, cudaGraph_t *pGraph)
{
    RT_WITH_CTX(cuStreamEndCapture(stream, pGraph));
}
RT_PTSZ_PAIR(cudaStreamEndCapture, (stream, pGraph), (cudaStream_t stream, cudaGraph_t *pGraph))

static cudaError_t cudaStreamIsCapturing_impl(cudaStream_t stream,
                                              enum cudaStreamCaptureStatus *pCaptureStatus)
{
    RT_WITH_CTX(cuStreamIsCapturing(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}
RT_PTSZ_PAIR(cudaStreamIsCapturing, (stream, pCaptureStatus),
          (cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus))

static cudaError_t capture_info(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
                                unsigned long long *id_out, cudaGraph_t *graph_out,
                                const cudaGraphNode_t **dependencies_out,
                                const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    RT_WITH_CTX(cuStreamGetCaptureInfo_v3(stream, (CUstreamCaptureStatus *)captureStatus_out,
                                       (cuuint64_t *)id_out, graph_out, dependencies_out,
                                       (const CUgraphEdgeData **)edgeData_out, numDependencies_out));
}

#if SIM_CUDA_MAJOR >= 13
static cudaError_t cudaStreamGetCaptureInfo_impl(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
           unsigned long long *id_out, cudaGraph_t *graph_out,
           const cudaGraphNode_t **dependencies_out, const cudaGraphEdgeData **edgeData_out,
           size_t *numDependencies_out)
{
    return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}
RT_PTSZ_PAIR(cudaStreamGetCaptureInfo,
          (stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
           numDependencies_out),
          (cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
           unsigned long long *id_out, cudaGraph_t *graph_out,
           const cudaGraphNode_t **dependencies_out, const cudaGraphEdgeData **edgeData_out,
           size_t *numDependencies_out))
#else
/* CUDA 12 has three generations of the query (its header maps
 * cudaStreamGetCaptureInfo onto _v2): CUDA 11's status and id, _v2 with
 * the graph and dependencies, _v3 with the edges too. */
static cudaError_t cudaStreamGetCaptureInfo_v3_impl(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
           unsigned long long *id_out, cudaGraph_t *graph_out,
           const cudaGraphNode_t **dependencies_out, const cudaGraphEdgeData **edgeData_out,
           size_t *numDependencies_out)
{
    return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}
RT_PTSZ_PAIR(cudaStreamGetCaptureInfo_v3,
          (stream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
           numDependencies_out),
          (cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
           unsigned long long *id_out, cudaGraph_t *graph_out,
           const cudaGraphNode_t **dependencies_out, const cudaGraphEdgeData **edgeData_out,
           size_t *numDependencies_out))

static cudaError_t cudaStreamGetCaptureInfo_v2_impl(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
           unsigned long long *id_out, cudaGraph_t *graph_out,
           const cudaGraphNode_t **dependencies_out, size_t *numDependencies_out)
{
    return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                        numDependencies_out);
}
RT_PTSZ_PAIR(cudaStreamGetCaptureInfo_v2,
          (stream, captureStatus_out, id_out, graph_out, dependencies_out, numDependencies_out),
          (cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
           unsigned long long *id_out, cudaGraph_t *graph_out,
           const cudaGraphNode_t **dependencies_out, size_t *numDependencies_out))

static cudaError_t cudaStreamGetCaptureInfo_impl(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
           unsigned long long *id_out)
{
    return capture_info(stream, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}
RT_PTSZ_PAIR(cudaStreamGetCaptureInfo, (stream, captureStatus_out, id_out), (cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
           unsigned long long *id_out))
#endif

/* Needs no context (a per-thread setting), only an initialised driver. */
RT_API cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    SIM_ENTRY("cudaThreadExchangeStreamCaptureMode");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    return rt_cu(cuThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode));
}

/* Runs at once, or becomes a host node on a capturing stream. */
static cudaError_t cudaLaunchHostFunc_impl(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    RT_WITH_CTX(cuLaunchHostFunc(stream, fn, userData));
}
RT_PTSZ_PAIR(cudaLaunchHostFunc, (stream, fn, userData),
          (cudaStream_t stream, cudaHostFn_t fn, void *userData))

/* ------------------------------------------------------------------ */
/* graphs                                                               */

RT_API cudaError_t CUDARTAPI cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags)
{
    SIM_ENTRY("cudaGraphCreate");
    RT_WITH_CTX(cuGraphCreate(pGraph, flags));
}

RT_API cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph)
{
    SIM_ENTRY("cudaGraphDestroy");
    RT_WITH_CTX(cuGraphDestroy(graph));
}

RT_API cudaError_t CUDARTAPI cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes)
{
    SIM_ENTRY("cudaGraphGetNodes");
    RT_WITH_CTX(cuGraphGetNodes(graph, nodes, numNodes));
}

#if SIM_CUDA_MAJOR >= 13
RT_API cudaError_t CUDARTAPI cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *pDependencies,
                                                          cudaGraphEdgeData *edgeData,
                                                          size_t *pNumDependencies)
{
    SIM_ENTRY("cudaGraphNodeGetDependencies");
    RT_WITH_CTX(cuGraphNodeGetDependencies_v2(node, pDependencies, (CUgraphEdgeData *)edgeData,
                                           pNumDependencies));
}
#else /* CUDA 12: the edges are _v2's */
RT_API cudaError_t CUDARTAPI cudaGraphNodeGetDependencies_v2(cudaGraphNode_t node,
                                                             cudaGraphNode_t *pDependencies,
                                                             cudaGraphEdgeData *edgeData,
                                                             size_t *pNumDependencies)
{
    SIM_ENTRY("cudaGraphNodeGetDependencies_v2");
    RT_WITH_CTX(cuGraphNodeGetDependencies_v2(node, pDependencies, (CUgraphEdgeData *)edgeData,
                                           pNumDependencies));
}

RT_API cudaError_t CUDARTAPI cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *pDependencies,
                                                          size_t *pNumDependencies)
{
    SIM_ENTRY("cudaGraphNodeGetDependencies");
    RT_WITH_CTX(cuGraphNodeGetDependencies_v2(node, pDependencies, NULL, pNumDependencies));
}
#endif

RT_API cudaError_t CUDARTAPI cudaGraphDebugDotPrint(cudaGraph_t graph, const char *path, unsigned int flags)
{
    SIM_ENTRY("cudaGraphDebugDotPrint");
    RT_WITH_CTX(cuGraphDebugDotPrint(graph, path, flags));
}

/* cudaGraphInstantiate's flags are cudaGraphInstantiateWithFlags's since
 * CUDA 12 (the header maps one onto the other). */
RT_API cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                  unsigned long long flags)
{
    SIM_ENTRY("cudaGraphInstantiate");
    RT_WITH_CTX(cuGraphInstantiateWithFlags(pGraphExec, graph, flags));
}

RT_API cudaError_t CUDARTAPI cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                           unsigned long long flags)
{
    SIM_ENTRY("cudaGraphInstantiateWithFlags");
    RT_WITH_CTX(cuGraphInstantiateWithFlags(pGraphExec, graph, flags));
}

/* The two parameter structs have the same layout (checked by the tests). */
static cudaError_t instantiate_params(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                      cudaGraphInstantiateParams *p, int ptsz)
{
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (p && ptsz)
        p->uploadStream = rt_ptsz(p->uploadStream);
    return rt_cu(cuGraphInstantiateWithParams(pGraphExec, graph, (CUDA_GRAPH_INSTANTIATE_PARAMS *)p));
}

RT_API cudaError_t CUDARTAPI cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                            cudaGraphInstantiateParams *instantiateParams)
{
    SIM_ENTRY("cudaGraphInstantiateWithParams");
    return instantiate_params(pGraphExec, graph, instantiateParams, 0);
}

RT_API cudaError_t CUDARTAPI cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *pGraphExec,
                                                                 cudaGraph_t graph,
                                                                 cudaGraphInstantiateParams *instantiateParams)
{
    SIM_ENTRY("cudaGraphInstantiateWithParams_ptsz");
    return instantiate_params(pGraphExec, graph, instantiateParams, 1);
}

RT_API cudaError_t CUDARTAPI cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
                                                 cudaGraphExecUpdateResultInfo *resultInfo)
{
    SIM_ENTRY("cudaGraphExecUpdate");
    RT_WITH_CTX(cuGraphExecUpdate_v2(hGraphExec, hGraph, (CUgraphExecUpdateResultInfo *)resultInfo));
}

static cudaError_t cudaGraphUpload_impl(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    RT_WITH_CTX(cuGraphUpload(graphExec, stream));
}
RT_PTSZ_PAIR(cudaGraphUpload, (graphExec, stream), (cudaGraphExec_t graphExec, cudaStream_t stream))

static cudaError_t cudaGraphLaunch_impl(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    RT_WITH_CTX(cuGraphLaunch(graphExec, stream));
}
RT_PTSZ_PAIR(cudaGraphLaunch, (graphExec, stream), (cudaGraphExec_t graphExec, cudaStream_t stream))

RT_API cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    SIM_ENTRY("cudaGraphExecDestroy");
    RT_WITH_CTX(cuGraphExecDestroy(graphExec));
}
