/*
 * cudnn_legacy_desc.c - the legacy (cuDNN 7 style) descriptors PyTorch
 * imports: tensor, filter, convolution, activation and dropout descriptors.
 * Create registers, Destroy unregisters and frees, Set validates as cuDNN
 * does (1..8 dimensions, positive sizes and strides, known data types).
 *
 * Must not: dereference a descriptor the registry does not know.
 */
#include <stdlib.h>
#include <string.h>

#include "cudnn_internal.h"

#define CREATE(fn, type, kind, out)                                                         \
    do {                                                                                    \
        SIM_ENTRY(fn);                                                                      \
        if (!(out))                                                                         \
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, fn ": NULL argument"); \
        type *o_ = calloc(1, sizeof *o_);                                                   \
        if (!o_ || sim_dnn_register(o_, kind) != 0) {                                       \
            free(o_);                                                                       \
            return sim_dnn_fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,         \
                                fn ": out of host memory");                                 \
        }                                                                                   \
        *(out) = o_;                                                                        \
        return CUDNN_STATUS_SUCCESS;                                                        \
    } while (0)

#define DESTROY(fn, kind, d)                                                                \
    do {                                                                                    \
        SIM_ENTRY(fn);                                                                      \
        if (!(d))                                                                           \
            return CUDNN_STATUS_SUCCESS; /* cuDNN accepts NULL */                           \
        if (!sim_dnn_live(d, kind))                                                         \
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, fn ": not a live descriptor");      \
        sim_dnn_unregister(d);                                                              \
        free(d);                                                                            \
        return CUDNN_STATUS_SUCCESS;                                                        \
    } while (0)

#define LIVE(fn, kind, d)                                                                   \
    do {                                                                                    \
        if (!sim_dnn_live(d, kind))                                                         \
            return sim_dnn_fail((d) ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_BAD_PARAM_NULL_POINTER, \
                                fn ": not a live descriptor");                              \
    } while (0)

cudnnStatus_t sim_dnn_tensor(const struct cudnnTensorStruct *t, const char *fn)
{
    if (!sim_dnn_live(t, SIM_DNN_TENSOR))
        return sim_dnn_fail(t ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "%s: not a live tensor descriptor", fn);
    if (!t->set)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: tensor descriptor was never set", fn);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t sim_dnn_filter(const struct cudnnFilterStruct *f, const char *fn)
{
    if (!sim_dnn_live(f, SIM_DNN_FILTER))
        return sim_dnn_fail(f ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                            "%s: not a live filter descriptor", fn);
    if (!f->set)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "%s: filter descriptor was never set", fn);
    return CUDNN_STATUS_SUCCESS;
}

int64_t sim_dnn_tensor_bytes(const struct cudnnTensorStruct *t)
{
    int64_t last = 0;
    for (int i = 0; i < t->nd; i++)
        last += (int64_t)(t->dims[i] - 1) * t->strides[i];
    return (last + 1) * (int64_t)sim_dnn_dtype_size(t->dtype);
}

/* ---- tensors ---- */
SIM_API cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc)
{
    CREATE("cudnnCreateTensorDescriptor", struct cudnnTensorStruct, SIM_DNN_TENSOR, tensorDesc);
}

SIM_API cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc)
{
    DESTROY("cudnnDestroyTensorDescriptor", SIM_DNN_TENSOR, tensorDesc);
}

SIM_API cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                                 cudnnDataType_t dataType, int nbDims,
                                                 const int dimA[], const int strideA[])
{
    SIM_ENTRY("cudnnSetTensorNdDescriptor");
    LIVE("cudnnSetTensorNdDescriptor", SIM_DNN_TENSOR, tensorDesc);
    if (nbDims < 1 || nbDims > SIM_CUDNN_DIM_MAX || !dimA || !strideA)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "cudnnSetTensorNdDescriptor: %d dimensions (1..8, arrays non-NULL)",
                            nbDims);
    if (!sim_dnn_dtype_size(dataType))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensorNdDescriptor: data type %d",
                            (int)dataType);
    for (int i = 0; i < nbDims; i++)
        if (dimA[i] <= 0 || strideA[i] <= 0)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                "cudnnSetTensorNdDescriptor: dimension %d is %d, stride %d", i,
                                dimA[i], strideA[i]);
    tensorDesc->dtype = dataType;
    tensorDesc->nd = nbDims;
    memcpy(tensorDesc->dims, dimA, (size_t)nbDims * sizeof(int));
    memcpy(tensorDesc->strides, strideA, (size_t)nbDims * sizeof(int));
    tensorDesc->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t set_packed(cudnnTensorDescriptor_t t, cudnnTensorFormat_t format,
                                cudnnDataType_t dtype, int nd, const int *dims)
{
    int strides[SIM_CUDNN_DIM_MAX];
    if (nd < 3 || nd > SIM_CUDNN_DIM_MAX || !dims)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "tensor descriptor: %d dimensions", nd);
    if (format == CUDNN_TENSOR_NHWC) { /* C fastest, then the spatial dims, then N */
        strides[1] = 1;
        int s = dims[1];
        for (int i = nd - 1; i >= 2; i--) {
            strides[i] = s;
            s *= dims[i];
        }
        strides[0] = s;
    } else {
        int s = 1;
        for (int i = nd - 1; i >= 0; i--) {
            strides[i] = s;
            s *= dims[i];
        }
    }
    return cudnnSetTensorNdDescriptor(t, dtype, nd, dims, strides);
}

SIM_API cudnnStatus_t cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t tensorDesc,
                                                   cudnnTensorFormat_t format,
                                                   cudnnDataType_t dataType, int nbDims,
                                                   const int dimA[])
{
    SIM_ENTRY("cudnnSetTensorNdDescriptorEx");
    return set_packed(tensorDesc, format, dataType, nbDims, dimA);
}

SIM_API cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                                 cudnnTensorFormat_t format,
                                                 cudnnDataType_t dataType, int n, int c, int h,
                                                 int w)
{
    SIM_ENTRY("cudnnSetTensor4dDescriptor");
    const int dims[4] = {n, c, h, w};
    return set_packed(tensorDesc, format, dataType, 4, dims);
}

SIM_API cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc,
                                                 int nbDimsRequested, cudnnDataType_t *dataType,
                                                 int *nbDims, int dimA[], int strideA[])
{
    SIM_ENTRY("cudnnGetTensorNdDescriptor");
    cudnnStatus_t st = sim_dnn_tensor(tensorDesc, "cudnnGetTensorNdDescriptor");
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (nbDimsRequested < 0 || !dataType || !nbDims || (nbDimsRequested > 0 && (!dimA || !strideA)))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetTensorNdDescriptor: bad arguments");
    *dataType = tensorDesc->dtype;
    *nbDims = tensorDesc->nd;
    for (int i = 0; i < nbDimsRequested && i < tensorDesc->nd; i++) {
        dimA[i] = tensorDesc->dims[i];
        strideA[i] = tensorDesc->strides[i];
    }
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnGetTensorSizeInBytes(const cudnnTensorDescriptor_t tensorDesc,
                                                size_t *size)
{
    SIM_ENTRY("cudnnGetTensorSizeInBytes");
    cudnnStatus_t st = sim_dnn_tensor(tensorDesc, "cudnnGetTensorSizeInBytes");
    if (st == CUDNN_STATUS_SUCCESS && !size)
        st = sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnGetTensorSizeInBytes: NULL");
    if (st == CUDNN_STATUS_SUCCESS)
        *size = (size_t)sim_dnn_tensor_bytes(tensorDesc);
    return st;
}

/* ---- filters ---- */
SIM_API cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc)
{
    CREATE("cudnnCreateFilterDescriptor", struct cudnnFilterStruct, SIM_DNN_FILTER, filterDesc);
}

SIM_API cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc)
{
    DESTROY("cudnnDestroyFilterDescriptor", SIM_DNN_FILTER, filterDesc);
}

SIM_API cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t filterDesc,
                                                 cudnnDataType_t dataType,
                                                 cudnnTensorFormat_t format, int nbDims,
                                                 const int filterDimA[])
{
    SIM_ENTRY("cudnnSetFilterNdDescriptor");
    LIVE("cudnnSetFilterNdDescriptor", SIM_DNN_FILTER, filterDesc);
    if (nbDims < 3 || nbDims > SIM_CUDNN_DIM_MAX || !filterDimA || !sim_dnn_dtype_size(dataType) ||
        (int)format < 0 || format > CUDNN_TENSOR_NCHW_VECT_C)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "cudnnSetFilterNdDescriptor: %d dimensions, type %d, format %d", nbDims,
                            (int)dataType, (int)format);
    for (int i = 0; i < nbDims; i++)
        if (filterDimA[i] <= 0)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                "cudnnSetFilterNdDescriptor: dimension %d is %d", i, filterDimA[i]);
    filterDesc->dtype = dataType;
    filterDesc->format = format;
    filterDesc->nd = nbDims;
    memcpy(filterDesc->dims, filterDimA, (size_t)nbDims * sizeof(int));
    filterDesc->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnGetFilterNdDescriptor(const cudnnFilterDescriptor_t filterDesc,
                                                 int nbDimsRequested, cudnnDataType_t *dataType,
                                                 cudnnTensorFormat_t *format, int *nbDims,
                                                 int filterDimA[])
{
    SIM_ENTRY("cudnnGetFilterNdDescriptor");
    cudnnStatus_t st = sim_dnn_filter(filterDesc, "cudnnGetFilterNdDescriptor");
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    if (nbDimsRequested < 0 || !dataType || !format || !nbDims || (nbDimsRequested > 0 && !filterDimA))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetFilterNdDescriptor: bad arguments");
    *dataType = filterDesc->dtype;
    *format = filterDesc->format;
    *nbDims = filterDesc->nd;
    for (int i = 0; i < nbDimsRequested && i < filterDesc->nd; i++)
        filterDimA[i] = filterDesc->dims[i];
    return CUDNN_STATUS_SUCCESS;
}

/* ---- convolutions ---- */
SIM_API cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc)
{
    CREATE("cudnnCreateConvolutionDescriptor", struct cudnnConvolutionStruct, SIM_DNN_CONV, convDesc);
}

SIM_API cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc)
{
    DESTROY("cudnnDestroyConvolutionDescriptor", SIM_DNN_CONV, convDesc);
}

SIM_API cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t convDesc,
                                                      int arrayLength, const int padA[],
                                                      const int filterStrideA[],
                                                      const int dilationA[],
                                                      cudnnConvolutionMode_t mode,
                                                      cudnnDataType_t computeType)
{
    SIM_ENTRY("cudnnSetConvolutionNdDescriptor");
    LIVE("cudnnSetConvolutionNdDescriptor", SIM_DNN_CONV, convDesc);
    if (arrayLength < 1 || arrayLength > SIM_CUDNN_DIM_MAX - 2 || !padA || !filterStrideA ||
        !dilationA || (int)mode < 0 || mode > CUDNN_CROSS_CORRELATION ||
        !sim_dnn_dtype_size(computeType))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                            "cudnnSetConvolutionNdDescriptor: length %d, mode %d, type %d",
                            arrayLength, (int)mode, (int)computeType);
    for (int i = 0; i < arrayLength; i++)
        if (padA[i] < 0 || filterStrideA[i] < 1 || dilationA[i] < 1)
            return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM,
                                "cudnnSetConvolutionNdDescriptor: pad %d stride %d dilation %d",
                                padA[i], filterStrideA[i], dilationA[i]);
    convDesc->nspatial = arrayLength;
    memcpy(convDesc->pad, padA, (size_t)arrayLength * sizeof(int));
    memcpy(convDesc->stride, filterStrideA, (size_t)arrayLength * sizeof(int));
    memcpy(convDesc->dilation, dilationA, (size_t)arrayLength * sizeof(int));
    convDesc->mode = mode;
    convDesc->compute = computeType;
    if (!convDesc->groups)
        convDesc->groups = 1;
    convDesc->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnGetConvolutionNdDescriptor(const cudnnConvolutionDescriptor_t convDesc,
                                                      int arrayLengthRequested, int *arrayLength,
                                                      int padA[], int strideA[], int dilationA[],
                                                      cudnnConvolutionMode_t *mode,
                                                      cudnnDataType_t *computeType)
{
    SIM_ENTRY("cudnnGetConvolutionNdDescriptor");
    LIVE("cudnnGetConvolutionNdDescriptor", SIM_DNN_CONV, convDesc);
    if (!arrayLength || !mode || !computeType || arrayLengthRequested < 0 ||
        (arrayLengthRequested > 0 && (!padA || !strideA || !dilationA)))
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolutionNdDescriptor: bad arguments");
    *arrayLength = convDesc->nspatial;
    for (int i = 0; i < arrayLengthRequested && i < convDesc->nspatial; i++) {
        padA[i] = convDesc->pad[i];
        strideA[i] = convDesc->stride[i];
        dilationA[i] = convDesc->dilation[i];
    }
    *mode = convDesc->mode;
    *computeType = convDesc->compute;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc,
                                                    int groupCount)
{
    SIM_ENTRY("cudnnSetConvolutionGroupCount");
    LIVE("cudnnSetConvolutionGroupCount", SIM_DNN_CONV, convDesc);
    if (groupCount < 1)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: %d", groupCount);
    convDesc->groups = groupCount;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc,
                                                    int *groupCount)
{
    SIM_ENTRY("cudnnGetConvolutionGroupCount");
    LIVE("cudnnGetConvolutionGroupCount", SIM_DNN_CONV, convDesc);
    if (!groupCount)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnGetConvolutionGroupCount");
    *groupCount = convDesc->groups ? convDesc->groups : 1;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
                                                  cudnnMathType_t mathType)
{
    SIM_ENTRY("cudnnSetConvolutionMathType");
    LIVE("cudnnSetConvolutionMathType", SIM_DNN_CONV, convDesc);
    if ((int)mathType < 0 || mathType > CUDNN_FMA_MATH)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: %d", (int)mathType);
    convDesc->math = mathType;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
                                                  cudnnMathType_t *mathType)
{
    SIM_ENTRY("cudnnGetConvolutionMathType");
    LIVE("cudnnGetConvolutionMathType", SIM_DNN_CONV, convDesc);
    if (!mathType)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnGetConvolutionMathType");
    *mathType = convDesc->math;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- activations and dropout ---- */
SIM_API cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc)
{
    CREATE("cudnnCreateActivationDescriptor", struct cudnnActivationStruct, SIM_DNN_ACTIVATION,
           activationDesc);
}

SIM_API cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc)
{
    DESTROY("cudnnDestroyActivationDescriptor", SIM_DNN_ACTIVATION, activationDesc);
}

SIM_API cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
                                                   cudnnActivationMode_t mode,
                                                   cudnnNanPropagation_t reluNanOpt, double coef)
{
    SIM_ENTRY("cudnnSetActivationDescriptor");
    LIVE("cudnnSetActivationDescriptor", SIM_DNN_ACTIVATION, activationDesc);
    if ((int)mode < 0 || mode > CUDNN_ACTIVATION_SWISH || (int)reluNanOpt < 0 || reluNanOpt > 1)
        return sim_dnn_fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetActivationDescriptor: mode %d",
                            (int)mode);
    activationDesc->mode = mode;
    activationDesc->nan = reluNanOpt;
    activationDesc->coef = coef;
    return CUDNN_STATUS_SUCCESS;
}

SIM_API cudnnStatus_t cudnnCreateDropoutDescriptor(cudnnDropoutDescriptor_t *dropoutDesc)
{
    CREATE("cudnnCreateDropoutDescriptor", struct cudnnDropoutStruct, SIM_DNN_DROPOUT, dropoutDesc);
}

SIM_API cudnnStatus_t cudnnDestroyDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc)
{
    DESTROY("cudnnDestroyDropoutDescriptor", SIM_DNN_DROPOUT, dropoutDesc);
}
