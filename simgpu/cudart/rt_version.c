/*
 * rt_version.c - the fake runtime's versions (cudaDriverGetVersion,
 * cudaRuntimeGetVersion), the driver entry points it hands out
 * (cudaGetDriverEntryPoint and its spellings, looked up in the fake
 * libcuda.so.1) and the profiler calls, which do nothing.
 */
#include "rt_internal.h"

#include <dlfcn.h>
#include <stdio.h>

RT_API cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion)
{
    SIM_ENTRY("cudaDriverGetVersion");
    if (!driverVersion)
        return rt_err(cudaErrorInvalidValue);
    return rt_cu(cuDriverGetVersion(driverVersion));
}

RT_API cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion)
{
    SIM_ENTRY("cudaRuntimeGetVersion");
    if (!runtimeVersion)
        return rt_err(cudaErrorInvalidValue);
    *runtimeVersion = SIM_CUDART_VERSION;
    return cudaSuccess;
}

/* The newest ABI of `symbol` the fake driver exports: symbol_v3, _v2, then
 * the plain name. The fake driver exports only current ABIs (and legacy
 * names whose prototype did not change), so the newest one found is right
 * for any cudaVersion the runtime accepts. Not found: cudaSuccess, a NULL
 * pointer and cudaDriverEntryPointSymbolNotFound, as documented. */
static cudaError_t entry_point(const char *symbol, void **funcPtr,
                               enum cudaDriverEntryPointQueryResult *driverStatus)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!symbol || !funcPtr)
        return rt_err(cudaErrorInvalidValue);
    static void *lib;
    void *h = __atomic_load_n(&lib, __ATOMIC_ACQUIRE);
    if (!h) {
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        __atomic_store_n(&lib, h, __ATOMIC_RELEASE);
    }
    void *p = NULL;
    static const char *const suffixes[] = {"_v3", "_v2", ""};
    for (size_t i = 0; h && !p && i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char name[256];
        if ((size_t)snprintf(name, sizeof name, "%s%s", symbol, suffixes[i]) < sizeof name)
            p = dlsym(h, name);
    }
    *funcPtr = p;
    if (!p)
        sim_log("driver entry point %s is not provided by the simulator's libcuda", symbol);
    if (driverStatus)
        *driverStatus = p ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                                     unsigned long long flags,
                                                     enum cudaDriverEntryPointQueryResult *driverStatus)
{
    SIM_ENTRY("cudaGetDriverEntryPoint");
    (void)flags;
    return entry_point(symbol, funcPtr, driverStatus);
}

RT_API cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                              unsigned int cudaVersion,
                                                              unsigned long long flags,
                                                              enum cudaDriverEntryPointQueryResult *driverStatus)
{
    SIM_ENTRY("cudaGetDriverEntryPointByVersion");
    (void)cudaVersion, (void)flags;
    return entry_point(symbol, funcPtr, driverStatus);
}

/* The _ptsz spellings (per-thread default stream builds) look up the same
 * functions. */
RT_API cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                                          unsigned long long flags,
                                                          enum cudaDriverEntryPointQueryResult *driverStatus)
{
    SIM_ENTRY("cudaGetDriverEntryPoint_ptsz");
    (void)flags;
    return entry_point(symbol, funcPtr, driverStatus);
}

RT_API cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    SIM_ENTRY("cudaGetDriverEntryPointByVersion_ptsz");
    (void)cudaVersion, (void)flags;
    return entry_point(symbol, funcPtr, driverStatus);
}

RT_API cudaError_t CUDARTAPI cudaProfilerStart(void)
{
    SIM_ENTRY("cudaProfilerStart");
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaProfilerStop(void)
{
    SIM_ENTRY("cudaProfilerStop");
    return cudaSuccess;
}
