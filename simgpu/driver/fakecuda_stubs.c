/*
 * fakecuda_stubs.c - driver entry points that exist only so that PyTorch's
 * libraries load against the fake libcuda.so.1.
 *
 * torch/lib/libcaffe2_nvrtc.so has DT_NEEDED libcuda.so.1 and imports these
 * names; torch loads it (RTLD_NOW) the first time a device guard asks the
 * driver for cuDevicePrimaryCtxGetState, so a missing name would abort the
 * process. The fake has no JIT linker: the cuLink* functions return
 * CUDA_ERROR_NOT_SUPPORTED after the usual accounting (call counts, failure
 * injection, the cuInit rule), and write nothing through their pointers.
 * (Modules, functions, launches and tensor maps are simulated:
 * fakecuda_module.c, fakecuda_func.c, fakecuda_launch.c,
 * fakecuda_tensormap.c.)
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
