/*
 * cudnn_legacy_conv.c - the legacy convolution API: output dimensions,
 * algorithm queries (cudnnGetConvolution*Algorithm_v7), searches
 * (cudnnFindConvolution*AlgorithmEx), workspace sizes and the three
 * convolutions, which check their arguments and compute nothing.
 *
 * The algorithms offered are the engines of Note [cuDNN workspace sizes]
 * (IMPLICIT_GEMM / ALGO_0, PRECOMP_GEMM / ALGO_1, GEMM / ALGO_3); the others
 * answer CUDNN_STATUS_NOT_SUPPORTED, as cuDNN does for an algorithm that
 * does not support a problem.
 *
 * Must not: touch the tensors (kernels are no-ops on the simulator).
 */
#include <string.h>

#include "cudnn_internal.h"

/* legacy algorithm of direction dir -> simulated engine, or -1 */
static int engine_of(int dir, int algo)
{
    if (algo == 0 || algo == 1)
        return algo;
    if ((dir == SIM_CONV_FWD && algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM) ||
        (dir == SIM_CONV_BWD_FILTER && algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3))
        return 2;
    return -1;
}
static const int algo_of[3][SIM_CONV_ENGINES] = {{0, 1, 2}, {0, 1, -1}, {0, 1, 3}};

static cudnnStatus_t geometry(const char *fn, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                              cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t y,
                              sim_conv_geom_t *g)
{
    cudnnStatus_t st = sim_dnn_tensor(x, fn);
    if (st == CUDNN_STATUS_SUCCESS)
        st = sim_dnn_filter(w, fn);
    if (st == CUDNN_STATUS_SUCCESS && y)
        st = sim_dnn_tensor(y, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!sim_dnn_live(c, SIM_DNN_CONV) || !c->set)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: not a set convolution descriptor", fn);
    if (x->nd != c->nspatial + 2 || w->nd != x->nd || (y && y->nd != x->nd))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "%s: tensors of %d/%d/%d dimensions for %d spatial dimensions", fn,
                            x->nd, w->nd, y ? y->nd : 0, c->nspatial);
    if (x->dtype != w->dtype || (y && y->dtype != x->dtype))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: tensor data types differ", fn);
    memset(g, 0, sizeof *g);
    g->nspatial = c->nspatial;
    for (int i = 0; i < x->nd; i++) {
        g->x[i] = x->dims[i];
        g->w[i] = w->dims[i];
        g->y[i] = y ? y->dims[i] : 1;
    }
    for (int i = 0; i < c->nspatial; i++) {
        g->pre[i] = g->post[i] = c->pad[i];
        g->stride[i] = c->stride[i];
        g->dilation[i] = c->dilation[i];
    }
    g->groups = c->groups;
    g->elem = sim_dnn_dtype_size(x->dtype);
    if (!y)
        return CUDNN_STATUS_SUCCESS;
    return sim_conv_check(g);
}

SIM_API cudnnStatus_t cudnnGetConvolutionNdForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnTensorDescriptor_t inputTensorDesc,
                                                            const cudnnFilterDescriptor_t filterDesc,
                                                            int nbDims, int tensorOuputDimA[])
{
    SIM_ENTRY("cudnnGetConvolutionNdForwardOutputDim");
    static const char fn[] = "cudnnGetConvolutionNdForwardOutputDim";
    sim_conv_geom_t g;
    cudnnStatus_t st = geometry(fn, inputTensorDesc, filterDesc, convDesc, NULL, &g);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (nbDims != inputTensorDesc->nd || !tensorOuputDimA)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: nbDims %d for a %d-d input", fn, nbDims,
                            inputTensorDesc->nd);
    int64_t y[SIM_CUDNN_DIM_MAX];
    if (g.x[1] != g.w[1] * g.groups || sim_conv_out_dims(&g, y) != 0)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: the filter does not fit the input", fn);
    for (int i = 0; i < nbDims; i++)
        tensorOuputDimA[i] = (int)y[i];
    return CUDNN_STATUS_SUCCESS;
}

#define MAX_COUNT(name, n)                                                                    \
    SIM_API cudnnStatus_t name(cudnnHandle_t handle, int *count)                              \
    {                                                                                         \
        SIM_ENTRY(#name);                                                                     \
        cudnnStatus_t st = sim_dnn_check_handle(handle, #name);                               \
        if (st == CUDNN_STATUS_SUCCESS && !count)                                             \
            st = sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, #name ": count is NULL");  \
        if (st == CUDNN_STATUS_SUCCESS)                                                       \
            *count = n;                                                                       \
        return st;                                                                            \
    }
MAX_COUNT(cudnnGetConvolutionForwardAlgorithmMaxCount, CUDNN_CONVOLUTION_FWD_ALGO_COUNT)
MAX_COUNT(cudnnGetConvolutionBackwardDataAlgorithmMaxCount, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT)
MAX_COUNT(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT)

/* All three perf structs share one layout (checked against cuDNN's header). */
typedef cudnnConvolutionFwdAlgoPerf_t perf_t;

/* Fills perf results in heuristic order (1, 0, 2) */
static cudnnStatus_t algorithms(const char *fn, cudnnHandle_t handle, int dir, sim_conv_geom_t *g,
                                cudnnConvolutionDescriptor_t c, int requested, int *returned,
                                perf_t *perf)
{
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (requested < 1 || !returned || !perf)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: %d results requested", fn, requested);
    static const int order[] = {1, 0, 2};
    int n = 0;
    for (int i = 0; i < 3 && n < requested; i++) {
        int e = order[i];
        if (algo_of[dir][e] < 0)
            continue;
        memset(&perf[n], 0, sizeof perf[n]);
        perf[n].algo = (cudnnConvolutionFwdAlgo_t)algo_of[dir][e];
        perf[n].status = CUDNN_STATUS_SUCCESS;
        perf[n].time = 0.01f * (float)(i + 1);
        perf[n].memory = (size_t)sim_conv_workspace(g, dir, e);
        perf[n].determinism = (dir != SIM_CONV_FWD && e == 1) ? CUDNN_NON_DETERMINISTIC
                                                               : CUDNN_DETERMINISTIC;
        perf[n].mathType = c->math;
        n++;
    }
    *returned = n;
    return CUDNN_STATUS_SUCCESS;
}

/* cudnnFind*AlgorithmEx: the algorithms in heuristic order, as if timed;
 * those whose workspace exceeds the caller's are marked as failing. */
static cudnnStatus_t search(const char *fn, cudnnHandle_t handle, int dir, sim_conv_geom_t *g,
                            cudnnConvolutionDescriptor_t c, const void *a, const void *b,
                            const void *out, int requested, int *returned, perf_t *perf,
                            const void *ws, size_t ws_size)
{
    if (!a || !b || !out || (ws_size && !ws))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL data pointer", fn);
    cudnnStatus_t st = algorithms(fn, handle, dir, g, c, requested, returned, perf);
    for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < *returned; i++)
        if (perf[i].memory > ws_size)
            perf[i].status = CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
    return st;
}

static cudnnStatus_t workspace(const char *fn, cudnnHandle_t handle, int dir, sim_conv_geom_t *g,
                               int algo, size_t *size)
{
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!size)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: sizeInBytes is NULL", fn);
    int e = engine_of(dir, algo);
    if (e < 0)
        return sim_dnn_fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: algorithm %d is not supported", fn,
                            algo);
    *size = (size_t)sim_conv_workspace(g, dir, e);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t run(const char *fn, cudnnHandle_t handle, int dir, sim_conv_geom_t *g, int algo,
                         const void *a, const void *b, const void *c, const void *alpha,
                         const void *beta, void *ws, size_t ws_size)
{
    size_t need;
    cudnnStatus_t st = workspace(fn, handle, dir, g, algo, &need);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!a || !b || !c || !alpha || !beta)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL data or scaling pointer",
                            fn);
    if (ws_size < need || (need && !ws))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT,
                            "%s: algorithm %d needs %zu bytes of workspace, got %zu", fn, algo, need,
                            ws ? ws_size : 0);
    atomic_fetch_add(&sim_dnn_executions, 1);
    return CUDNN_STATUS_SUCCESS;
}

#define GEOM(fn, x, w, c, y)                                                \
    sim_conv_geom_t g;                                                      \
    cudnnStatus_t st = geometry(fn, x, w, c, y, &g);                        \
    if (st != CUDNN_STATUS_SUCCESS)                                         \
        return st

SIM_API cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnFilterDescriptor_t filterDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionFwdAlgoPerf_t *perfResults)
{
    SIM_ENTRY("cudnnGetConvolutionForwardAlgorithm_v7");
    GEOM("cudnnGetConvolutionForwardAlgorithm_v7", srcDesc, filterDesc, convDesc, destDesc);
    return algorithms("cudnnGetConvolutionForwardAlgorithm_v7", handle, SIM_CONV_FWD, &g, convDesc,
                      requestedAlgoCount, returnedAlgoCount, perfResults);
}

SIM_API cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults)
{
    SIM_ENTRY("cudnnGetConvolutionBackwardDataAlgorithm_v7");
    GEOM("cudnnGetConvolutionBackwardDataAlgorithm_v7", gradDesc, filterDesc, convDesc, diffDesc);
    return algorithms("cudnnGetConvolutionBackwardDataAlgorithm_v7", handle, SIM_CONV_BWD_DATA, &g,
                      convDesc, requestedAlgoCount, returnedAlgoCount, (perf_t *)perfResults);
}

SIM_API cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
    const cudnnTensorDescriptor_t diffDesc, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnFilterDescriptor_t gradDesc, const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults)
{
    SIM_ENTRY("cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    GEOM("cudnnGetConvolutionBackwardFilterAlgorithm_v7", srcDesc, gradDesc, convDesc, diffDesc);
    return algorithms("cudnnGetConvolutionBackwardFilterAlgorithm_v7", handle, SIM_CONV_BWD_FILTER,
                      &g, convDesc, requestedAlgoCount, returnedAlgoCount, (perf_t *)perfResults);
}

SIM_API cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,
    const cudnnTensorDescriptor_t yDesc, void *y, const int requestedAlgoCount,
    int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace,
    size_t workSpaceSizeInBytes)
{
    SIM_ENTRY("cudnnFindConvolutionForwardAlgorithmEx");
    static const char fn[] = "cudnnFindConvolutionForwardAlgorithmEx";
    GEOM(fn, xDesc, wDesc, convDesc, yDesc);
    return search(fn, handle, SIM_CONV_FWD, &g, convDesc, x, w, y, requestedAlgoCount,
                  returnedAlgoCount, (perf_t *)perfResults, workSpace, workSpaceSizeInBytes);
}

SIM_API cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const void *w,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdDataAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes)
{
    SIM_ENTRY("cudnnFindConvolutionBackwardDataAlgorithmEx");
    static const char fn[] = "cudnnFindConvolutionBackwardDataAlgorithmEx";
    GEOM(fn, dxDesc, wDesc, convDesc, dyDesc);
    return search(fn, handle, SIM_CONV_BWD_DATA, &g, convDesc, w, dy, dx, requestedAlgoCount,
                  returnedAlgoCount, (perf_t *)perfResults, workSpace, workSpaceSizeInBytes);
}

SIM_API cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *y,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void *dw,
    const int requestedAlgoCount, int *returnedAlgoCount,
    cudnnConvolutionBwdFilterAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes)
{
    SIM_ENTRY("cudnnFindConvolutionBackwardFilterAlgorithmEx");
    static const char fn[] = "cudnnFindConvolutionBackwardFilterAlgorithmEx";
    GEOM(fn, xDesc, dwDesc, convDesc, dyDesc);
    return search(fn, handle, SIM_CONV_BWD_FILTER, &g, convDesc, x, y, dw, requestedAlgoCount,
                  returnedAlgoCount, (perf_t *)perfResults, workSpace, workSpaceSizeInBytes);
}

SIM_API cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes)
{
    SIM_ENTRY("cudnnGetConvolutionForwardWorkspaceSize");
    GEOM("cudnnGetConvolutionForwardWorkspaceSize", xDesc, wDesc, convDesc, yDesc);
    return workspace("cudnnGetConvolutionForwardWorkspaceSize", handle, SIM_CONV_FWD, &g, algo,
                     sizeInBytes);
}

SIM_API cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes)
{
    SIM_ENTRY("cudnnGetConvolutionBackwardDataWorkspaceSize");
    GEOM("cudnnGetConvolutionBackwardDataWorkspaceSize", dxDesc, wDesc, convDesc, dyDesc);
    return workspace("cudnnGetConvolutionBackwardDataWorkspaceSize", handle, SIM_CONV_BWD_DATA, &g,
                     algo, sizeInBytes);
}

SIM_API cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes)
{
    SIM_ENTRY("cudnnGetConvolutionBackwardFilterWorkspaceSize");
    GEOM("cudnnGetConvolutionBackwardFilterWorkspaceSize", xDesc, gradDesc, convDesc, dyDesc);
    return workspace("cudnnGetConvolutionBackwardFilterWorkspaceSize", handle, SIM_CONV_BWD_FILTER,
                     &g, algo, sizeInBytes);
}

SIM_API cudnnStatus_t cudnnConvolutionForward(
    cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    const cudnnTensorDescriptor_t yDesc, void *y)
{
    SIM_ENTRY("cudnnConvolutionForward");
    GEOM("cudnnConvolutionForward", xDesc, wDesc, convDesc, yDesc);
    return run("cudnnConvolutionForward", handle, SIM_CONV_FWD, &g, algo, x, w, y, alpha, beta,
               workSpace, workSpaceSizeInBytes);
}

SIM_API cudnnStatus_t cudnnConvolutionBackwardData(
    cudnnHandle_t handle, const void *alpha, const cudnnFilterDescriptor_t wDesc, const void *w,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdDataAlgo_t algo,
    void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    const cudnnTensorDescriptor_t dxDesc, void *dx)
{
    SIM_ENTRY("cudnnConvolutionBackwardData");
    GEOM("cudnnConvolutionBackwardData", dxDesc, wDesc, convDesc, dyDesc);
    return run("cudnnConvolutionBackwardData", handle, SIM_CONV_BWD_DATA, &g, algo, w, dy, dx, alpha,
               beta, workSpace, workSpaceSizeInBytes);
}

SIM_API cudnnStatus_t cudnnConvolutionBackwardFilter(
    cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdFilterAlgo_t algo,
    void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    const cudnnFilterDescriptor_t dwDesc, void *dw)
{
    SIM_ENTRY("cudnnConvolutionBackwardFilter");
    GEOM("cudnnConvolutionBackwardFilter", xDesc, dwDesc, convDesc, dyDesc);
    return run("cudnnConvolutionBackwardFilter", handle, SIM_CONV_BWD_FILTER, &g, algo, x, dy, dw,
               alpha, beta, workSpace, workSpaceSizeInBytes);
}
