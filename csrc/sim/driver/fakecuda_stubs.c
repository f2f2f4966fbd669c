/*
 * fakecuda_stubs.c - driver entry points that exist only so that PyTorch's
 * libraries load against the fake libcuda.so.1.
 *
 * torch/lib/libcaffe2_nvrtc.so has DT_NEEDED libcuda.so.1 and imports these
 * names; torch loads it (RTLD_NOW) the first time a device guard asks the
 * driver for cuDevicePrimaryCtxGetState, so a missing name would abort the
 * process. The fake has no modules, kernels, JIT linker or tensor maps:
 * every one of these returns CUDA_ERROR_NOT_SUPPORTED after the usual
 * accounting (call counts, failure injection, the cuInit rule), and writes
 * nothing through its pointers.
 *
 * The last three are in PyTorch's DriverAPI list of required driver
 * functions (c10/cuda/driver_api.h), which it resolves all at once when it
 * first needs the driver directly (expandable segments, IPC): they must
 * exist. Exporting and importing memory between processes is not simulated.
 */
#include "fakecuda_internal.h"

#define NOT_SUPPORTED(fn)                                                   \
    FC_BEGIN(fn, 1);                                                        \
    FC_FAIL(CUDA_ERROR_NOT_SUPPORTED);                                      \
    FC_END()

FC_API CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    (void)module, (void)fname;
    NOT_SUPPORTED(FN_cuModuleLoad);
}

FC_API CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    (void)module, (void)image;
    NOT_SUPPORTED(FN_cuModuleLoadData);
}

FC_API CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image,
                                           unsigned int numOptions, CUjit_option *options,
                                           void **optionValues)
{
    (void)module, (void)image, (void)numOptions, (void)options, (void)optionValues;
    NOT_SUPPORTED(FN_cuModuleLoadDataEx);
}

FC_API CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    (void)hmod;
    NOT_SUPPORTED(FN_cuModuleUnload);
}

FC_API CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    (void)hfunc, (void)hmod, (void)name;
    NOT_SUPPORTED(FN_cuModuleGetFunction);
}

FC_API CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                       unsigned int gridDimZ, unsigned int blockDimX,
                                       unsigned int blockDimY, unsigned int blockDimZ,
                                       unsigned int sharedMemBytes, CUstream hStream,
                                       void **kernelParams, void **extra)
{
    (void)f, (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY;
    (void)blockDimZ, (void)sharedMemBytes, (void)hStream, (void)kernelParams, (void)extra;
    NOT_SUPPORTED(FN_cuLaunchKernel);
}

FC_API CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                                  unsigned int gridDimY, unsigned int gridDimZ,
                                                  unsigned int blockDimX, unsigned int blockDimY,
                                                  unsigned int blockDimZ,
                                                  unsigned int sharedMemBytes, CUstream hStream,
                                                  void **kernelParams)
{
    (void)f, (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY;
    (void)blockDimZ, (void)sharedMemBytes, (void)hStream, (void)kernelParams;
    NOT_SUPPORTED(FN_cuLaunchCooperativeKernel);
}

FC_API CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options,
                                        void **optionValues, CUlinkState *stateOut)
{
    (void)numOptions, (void)options, (void)optionValues, (void)stateOut;
    NOT_SUPPORTED(FN_cuLinkCreate_v2);
}

FC_API CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data,
                                         size_t size, const char *name, unsigned int numOptions,
                                         CUjit_option *options, void **optionValues)
{
    (void)state, (void)type, (void)data, (void)size, (void)name, (void)numOptions;
    (void)options, (void)optionValues;
    NOT_SUPPORTED(FN_cuLinkAddData_v2);
}

FC_API CUresult CUDAAPI cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    (void)state, (void)cubinOut, (void)sizeOut;
    NOT_SUPPORTED(FN_cuLinkComplete);
}

FC_API CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    (void)pi, (void)attrib, (void)hfunc;
    NOT_SUPPORTED(FN_cuFuncGetAttribute);
}

FC_API CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    (void)hfunc, (void)attrib, (void)value;
    NOT_SUPPORTED(FN_cuFuncSetAttribute);
}

FC_API CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    (void)hfunc, (void)config;
    NOT_SUPPORTED(FN_cuFuncSetCacheConfig);
}

FC_API CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                                    int blockSize,
                                                                    size_t dynamicSMemSize)
{
    (void)numBlocks, (void)func, (void)blockSize, (void)dynamicSMemSize;
    NOT_SUPPORTED(FN_cuOccupancyMaxActiveBlocksPerMultiprocessor);
}

FC_API CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
    void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
    const cuuint32_t *boxDim, const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill)
{
    (void)tensorMap, (void)tensorDataType, (void)tensorRank, (void)globalAddress, (void)globalDim;
    (void)globalStrides, (void)boxDim, (void)elementStrides, (void)interleave, (void)swizzle;
    (void)l2Promotion, (void)oobFill;
    NOT_SUPPORTED(FN_cuTensorMapEncodeTiled);
}

FC_API CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle,
                                                     CUmemGenericAllocationHandle handle,
                                                     CUmemAllocationHandleType handleType,
                                                     unsigned long long flags)
{
    (void)shareableHandle, (void)handle, (void)handleType, (void)flags;
    NOT_SUPPORTED(FN_cuMemExportToShareableHandle);
}

FC_API CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                       void *osHandle,
                                                       CUmemAllocationHandleType shHandleType)
{
    (void)handle, (void)osHandle, (void)shHandleType;
    NOT_SUPPORTED(FN_cuMemImportFromShareableHandle);
}

FC_API CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    (void)handle, (void)addr;
    NOT_SUPPORTED(FN_cuMemRetainAllocationHandle);
}
