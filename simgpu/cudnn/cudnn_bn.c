/*
 * cudnn_bn.c - batch normalization (PyTorch's cudnn_batch_norm): the
 * derived parameter descriptor, workspace and reserve-space sizes, and the
 * training forward, backward and inference calls, which check shapes and
 * pointers as cuDNN does and compute nothing.
 *
 * Note [cuDNN batch norm sizes]
 * Rationale: PyTorch allocates the reserve space cuDNN asks for and keeps it
 * for the backward pass, and allocates the workspaces, all through its
 * caching allocator; cuDNN documents neither size.
 * Approach: reserve space: none for CUDNN_BATCHNORM_OPS_BN; with a fused
 * activation, one bit per element of x (the activation mask), rounded up to
 * 4 bytes. Workspace: none for PER_ACTIVATION and SPATIAL; for
 * SPATIAL_PERSISTENT (what PyTorch picks for channels-last training), the
 * partial sums of a 128-way reduction: 2 floats per channel and slice,
 * C * 2 * 4 * 128 bytes, forward and backward alike.
 * Limitations: real sizes depend on the GPU and cuDNN's kernel choice.
 */
#include "cudnn_internal.h"

#define BN_SLICES 128

/* x must be 4-d or 5-d; the parameter descriptor [1, C, 1, 1(, 1)] (spatial)
 * or [1, C, H, W(, D)] (per activation). */
static cudnnStatus_t check_bn(const char *fn, cudnnBatchNormMode_t mode,
                              cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y,
                              cudnnTensorDescriptor_t param)
{
    cudnnStatus_t st = sim_dnn_tensor(x, fn);
    if (st == CUDNN_STATUS_SUCCESS && y)
        st = sim_dnn_tensor(y, fn);
    if (st == CUDNN_STATUS_SUCCESS && param)
        st = sim_dnn_tensor(param, fn);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if ((int)mode < 0 || mode > CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: mode %d", fn, (int)mode);
    if (x->nd != 4 && x->nd != 5)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: x has %d dimensions (4 or 5)", fn, x->nd);
    for (int i = 0; y && i < x->nd; i++)
        if (y->nd != x->nd || y->dims[i] != x->dims[i])
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, "%s: y differs from x", fn);
    for (int i = 0; param && i < x->nd; i++) {
        int want = i == 0   ? 1
                   : i == 1 ? x->dims[1]
                   : mode == CUDNN_BATCHNORM_PER_ACTIVATION ? x->dims[i] : 1;
        if (param->nd != x->nd || param->dims[i] != want)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                                "%s: parameter dimension %d is %d, expected %d", fn, i,
                                param->nd == x->nd ? param->dims[i] : -1, want);
    }
    return CUDNN_STATUS_SUCCESS;
}

static size_t bn_workspace(cudnnBatchNormMode_t mode, cudnnTensorDescriptor_t x)
{
    return mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT ? (size_t)x->dims[1] * 2 * 4 * BN_SLICES : 0;
}

static size_t bn_reserve(cudnnBatchNormOps_t ops, cudnnTensorDescriptor_t x)
{
    if (ops == CUDNN_BATCHNORM_OPS_BN)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < x->nd; i++)
        n *= x->dims[i];
    return (size_t)((n + 31) / 32 * 4);
}

/* Hands a size back once the arguments were found good. */
static cudnnStatus_t give_size(cudnnStatus_t st, const char *fn, size_t *out, size_t value)
{
    if (st == CUDNN_STATUS_SUCCESS && !out)
        st = sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: sizeInBytes is NULL", fn);
    if (st == CUDNN_STATUS_SUCCESS)
        *out = value;
    return st;
}

/* The workspace and reserve space given to a training call are big enough. */
static cudnnStatus_t check_spaces(const char *fn, cudnnBatchNormMode_t mode,
                                  cudnnBatchNormOps_t ops, cudnnTensorDescriptor_t x,
                                  const void *ws, size_t ws_size, const void *rs, size_t rs_size)
{
    size_t need_ws = bn_workspace(mode, x), need_rs = bn_reserve(ops, x);
    if (ws_size < need_ws || rs_size < need_rs || (need_ws && !ws) || (need_rs && !rs))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT,
                            "%s: needs %zu bytes of workspace and %zu of reserve space", fn,
                            need_ws, need_rs);
    atomic_fetch_add(&sim_dnn_executions, 1);
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
                                                    const cudnnTensorDescriptor_t xDesc,
                                                    cudnnBatchNormMode_t mode)
{
    SIM_ENTRY("cudnnDeriveBNTensorDescriptor");
    cudnnStatus_t st = check_bn("cudnnDeriveBNTensorDescriptor", mode, xDesc, NULL, NULL);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    int dims[SIM_CUDNN_DIM_MAX], strides[SIM_CUDNN_DIM_MAX], s = 1;
    for (int i = xDesc->nd - 1; i >= 0; i--) {
        dims[i] = i == 0 ? 1 : i == 1 ? xDesc->dims[1]
                  : mode == CUDNN_BATCHNORM_PER_ACTIVATION ? xDesc->dims[i] : 1;
        strides[i] = s;
        s *= dims[i];
    }
    cudnnDataType_t t = xDesc->dtype == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    return cudnnSetTensorNdDescriptor(derivedBnDesc, t, xDesc->nd, dims, strides);
}

SIM_API cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t zDesc,
    const cudnnTensorDescriptor_t yDesc, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes)
{
    SIM_ENTRY("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize");
    static const char fn[] = "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize";
    (void)zDesc;
    (void)activationDesc;
    (void)bnOps;
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_bn(fn, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc);
    return give_size(st, fn, sizeInBytes,
                     st == CUDNN_STATUS_SUCCESS ? bn_workspace(mode, xDesc) : 0);
}

SIM_API cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t yDesc,
    const cudnnTensorDescriptor_t dyDesc, const cudnnTensorDescriptor_t dzDesc,
    const cudnnTensorDescriptor_t dxDesc, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes)
{
    SIM_ENTRY("cudnnGetBatchNormalizationBackwardExWorkspaceSize");
    static const char fn[] = "cudnnGetBatchNormalizationBackwardExWorkspaceSize";
    (void)yDesc;
    (void)dzDesc;
    (void)activationDesc;
    (void)bnOps;
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_bn(fn, mode, xDesc, dyDesc, dBnScaleBiasDesc);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_bn(fn, mode, xDesc, dxDesc, NULL);
    return give_size(st, fn, sizeInBytes,
                     st == CUDNN_STATUS_SUCCESS ? bn_workspace(mode, xDesc) : 0);
}

SIM_API cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t xDesc,
    size_t *sizeInBytes)
{
    SIM_ENTRY("cudnnGetBatchNormalizationTrainingExReserveSpaceSize");
    static const char fn[] = "cudnnGetBatchNormalizationTrainingExReserveSpaceSize";
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_bn(fn, mode, xDesc, NULL, NULL);
    if (st == CUDNN_STATUS_SUCCESS && bnOps != CUDNN_BATCHNORM_OPS_BN &&
        !sim_dnn_live(activationDesc, SIM_DNN_ACTIVATION))
        st = sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: fused ops need an activation descriptor", fn);
    return give_size(st, fn, sizeInBytes,
                     st == CUDNN_STATUS_SUCCESS ? bn_reserve(bnOps, xDesc) : 0);
}

SIM_API cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alpha,
    const void *beta, const cudnnTensorDescriptor_t xDesc, const void *xData,
    const cudnnTensorDescriptor_t zDesc, const void *zData, const cudnnTensorDescriptor_t yDesc,
    void *yData, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance,
    cudnnActivationDescriptor_t activationDesc, void *workspace, size_t workSpaceSizeInBytes,
    void *reserveSpace, size_t reserveSpaceSizeInBytes)
{
    SIM_ENTRY("cudnnBatchNormalizationForwardTrainingEx");
    static const char fn[] = "cudnnBatchNormalizationForwardTrainingEx";
    (void)zDesc;
    (void)zData;
    (void)activationDesc;
    (void)exponentialAverageFactor;
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_bn(fn, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!alpha || !beta || !xData || !yData || !bnScale || !bnBias ||
        (!resultRunningMean != !resultRunningVariance) || (!resultSaveMean != !resultSaveInvVariance))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL pointer argument", fn);
    if (epsilon < 1e-5 * 0.999)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: epsilon %g is below CUDNN_BN_MIN_EPSILON",
                            fn, epsilon);
    return check_spaces(fn, mode, bnOps, xDesc, workspace, workSpaceSizeInBytes, reserveSpace,
                        reserveSpaceSizeInBytes);
}

SIM_API cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const void *alphaDataDiff, const void *betaDataDiff, const void *alphaParamDiff,
    const void *betaParamDiff, const cudnnTensorDescriptor_t xDesc, const void *xData,
    const cudnnTensorDescriptor_t yDesc, const void *yData, const cudnnTensorDescriptor_t dyDesc,
    const void *dyData, const cudnnTensorDescriptor_t dzDesc, void *dzData,
    const cudnnTensorDescriptor_t dxDesc, void *dxData,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScaleData, const void *bnBiasData,
    void *dBnScaleData, void *dBnBiasData, double epsilon, const void *savedMean,
    const void *savedInvVariance, cudnnActivationDescriptor_t activationDesc, void *workSpace,
    size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSizeInBytes)
{
    SIM_ENTRY("cudnnBatchNormalizationBackwardEx");
    static const char fn[] = "cudnnBatchNormalizationBackwardEx";
    (void)yDesc;
    (void)yData;
    (void)dzDesc;
    (void)dzData;
    (void)bnBiasData;
    (void)epsilon;
    (void)activationDesc;
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_bn(fn, mode, xDesc, dyDesc, dBnScaleBiasDesc);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_bn(fn, mode, xDesc, dxDesc, NULL);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!alphaDataDiff || !betaDataDiff || !alphaParamDiff || !betaParamDiff || !xData || !dyData ||
        !dxData || !bnScaleData || !dBnScaleData || !dBnBiasData || (!savedMean != !savedInvVariance))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL pointer argument", fn);
    return check_spaces(fn, mode, bnOps, xDesc, workSpace, workSpaceSizeInBytes, reserveSpace,
                        reserveSpaceSizeInBytes);
}

SIM_API cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, const void *estimatedMean, const void *estimatedVariance, double epsilon)
{
    SIM_ENTRY("cudnnBatchNormalizationForwardInference");
    static const char fn[] = "cudnnBatchNormalizationForwardInference";
    cudnnStatus_t st = sim_dnn_check_handle(handle, fn);
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_bn(fn, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (!alpha || !beta || !x || !y || !bnScale || !bnBias || !estimatedMean || !estimatedVariance)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: NULL pointer argument", fn);
    if (epsilon < 1e-5 * 0.999)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: epsilon %g is below CUDNN_BN_MIN_EPSILON",
                            fn, epsilon);
    atomic_fetch_add(&sim_dnn_executions, 1);
    return CUDNN_STATUS_SUCCESS;
}
