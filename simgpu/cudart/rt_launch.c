/*
 * rt_launch.c - kernels in the fake runtime: the host-side registration
 * calls nvcc's generated code makes at load time (__cudaRegisterFatBinary
 * and friends; __device__ variables are rt_symbol.c's), the launch
 * configuration stack (<<<...>>>), launches (which compute nothing),
 * function attributes and occupancy.
 *
 * Launch path of CUDA 13 host stubs (crt/host_runtime.h): the stub for
 * k<<<g, b, s, st>>>(args) calls __cudaPushCallConfiguration(g, b, s, st),
 * then __cudaGetKernel once per kernel, then __cudaPopCallConfiguration,
 * which must hand back exactly what was pushed, then __cudaLaunchKernel.
 * The stack is per thread (launches happen on autograd threads too).
 *
 * A launch checks its stream, counts itself and hands its simulated work to
 * the fake driver's timeline (fakecuda_launch): a fixed cost per kernel,
 * except torch's _sleep kernel (at::cuda::sleep's spin_kernel(int64_t
 * cycles), recognised by the device name it is registered with), which
 * takes its cycles at the GPU's clock. Device memory is never touched, so
 * the output of a kernel is whatever the memory held (zeros for fresh
 * memory).
 *
 */
#include "rt_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static uint64_t n_fatbins, n_functions, n_launches;
/* The host stub of torch's _sleep kernel, once registered (atomic). */
static const void *sleep_kernel;

/* torch's at::cuda::sleep kernel: spin_kernel(int64_t) in Sleep.cu, whose
 * mangled name has an anonymous namespace named after the file. */
static int is_sleep_kernel(const char *name)
{
    static const char tail[] = "11spin_kernelEl";
    size_t n = name ? strlen(name) : 0, t = sizeof tail - 1;
    return n > t && !strcmp(name + n - t, tail) && strstr(name, "Sleep_cu") &&
           !strncmp(name, "_ZN2at4cuda", 11);
}

/* ------------------------------------------------------------------ */
/* registration                                                         */


/* The handle is a small heap object; the runtime never looks inside. */
RT_API void **CUDARTAPI __cudaRegisterFatBinary(void *fatCubin)
{
    SIM_ENTRY("__cudaRegisterFatBinary");
    void **h = malloc(sizeof *h);
    if (h)
        *h = fatCubin;
    __atomic_fetch_add(&n_fatbins, 1, __ATOMIC_RELAXED);
    return h;
}

RT_API void CUDARTAPI __cudaRegisterFatBinaryEnd(void **fatCubinHandle)
{
    SIM_ENTRY("__cudaRegisterFatBinaryEnd");
    (void)fatCubinHandle;
}

/* Runs from atexit handlers of the registering libraries. The handle is
 * not freed: other atexit handlers may still launch (harmlessly) after it. */
RT_API void CUDARTAPI __cudaUnregisterFatBinary(void **fatCubinHandle)
{
    SIM_ENTRY("__cudaUnregisterFatBinary");
    (void)fatCubinHandle;
}

RT_API void CUDARTAPI __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun,
                                             char *deviceFun, const char *deviceName,
                                             int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim,
                                             dim3 *gDim, int *wSize)
{
    SIM_ENTRY("__cudaRegisterFunction");
    (void)fatCubinHandle, (void)deviceFun, (void)thread_limit;
    (void)tid, (void)bid, (void)bDim, (void)gDim, (void)wSize;
    if (is_sleep_kernel(deviceName))
        __atomic_store_n(&sleep_kernel, (const void *)hostFun, __ATOMIC_RELEASE);
    __atomic_fetch_add(&n_functions, 1, __ATOMIC_RELAXED);
}


/* 1: the module's managed variables are initialised. */
RT_API char CUDARTAPI __cudaInitModule(void **fatCubinHandle)
{
    SIM_ENTRY("__cudaInitModule");
    (void)fatCubinHandle;
    return 1;
}

/* ------------------------------------------------------------------ */
/* launch configuration                                                 */

#define RT_CONFIG_DEPTH 32

typedef struct {
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
} rt_config_t;

static __thread rt_config_t tls_config[RT_CONFIG_DEPTH];
static __thread int tls_config_depth;

RT_API unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                                      struct CUstream_st *stream)
{
    SIM_ENTRY("__cudaPushCallConfiguration");
    if (tls_config_depth == RT_CONFIG_DEPTH)
        return (unsigned)rt_err(cudaErrorInvalidConfiguration);
    rt_config_t *c = &tls_config[tls_config_depth++];
    c->grid = gridDim;
    c->block = blockDim;
    c->shmem = sharedMem;
    c->stream = stream;
    return 0;
}

RT_API cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim,
                                                        size_t *sharedMem, void *stream)
{
    SIM_ENTRY("__cudaPopCallConfiguration");
    if (tls_config_depth == 0)
        return rt_err(cudaErrorMissingConfiguration);
    const rt_config_t *c = &tls_config[--tls_config_depth];
    if (gridDim)
        *gridDim = c->grid;
    if (blockDim)
        *blockDim = c->block;
    if (sharedMem)
        *sharedMem = c->shmem;
    if (stream)
        *(cudaStream_t *)stream = c->stream;
    return cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* launches                                                             */

/* The checks a real launch makes before it is queued. */
static cudaError_t launch(const void *func, dim3 grid, dim3 block, cudaStream_t stream,
                          void **args)
{
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!func)
        return rt_err(cudaErrorInvalidDeviceFunction);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 ||
        block.z == 0 || (unsigned long long)block.x * block.y * block.z > 1024 || grid.y > 65535 ||
        grid.z > 65535 || block.z > 64)
        return rt_err(cudaErrorInvalidConfiguration);
    long long cycles = -1;
    if (func == __atomic_load_n(&sleep_kernel, __ATOMIC_ACQUIRE) && args && args[0])
        memcpy(&cycles, args[0], sizeof cycles);
    if ((e = rt_cu(fakecuda_launch(stream, cycles < 0 ? -1 : cycles))) != cudaSuccess)
        return e;
    __atomic_fetch_add(&n_launches, 1, __ATOMIC_RELAXED);
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernelPtr, const void *funcAddr)
{
    SIM_ENTRY("__cudaGetKernel");
    if (!kernelPtr || !funcAddr)
        return rt_err(cudaErrorInvalidValue);
    *kernelPtr = (cudaKernel_t)funcAddr; /* the host stub's address is the kernel's identity */
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr)
{
    SIM_ENTRY("cudaGetKernel");
    if (!kernelPtr || !entryFuncAddr)
        return rt_err(cudaErrorInvalidValue);
    *kernelPtr = (cudaKernel_t)entryFuncAddr;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                                void **args, size_t sharedMem, cudaStream_t stream)
{
    SIM_ENTRY("__cudaLaunchKernel");
    (void)sharedMem;
    return launch(kernel, gridDim, blockDim, stream, args);
}

RT_API cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim,
                                                     dim3 blockDim, void **args, size_t sharedMem,
                                                     cudaStream_t stream)
{
    SIM_ENTRY("__cudaLaunchKernel_ptsz");
    (void)sharedMem;
    return launch(kernel, gridDim, blockDim, rt_ptsz(stream), args);
}

RT_API cudaError_t CUDARTAPI cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                              void **args, size_t sharedMem, cudaStream_t stream)
{
    SIM_ENTRY("cudaLaunchKernel");
    (void)sharedMem;
    return launch(func, gridDim, blockDim, stream, args);
}

RT_API cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
                                                   void **args, size_t sharedMem, cudaStream_t stream)
{
    SIM_ENTRY("cudaLaunchKernel_ptsz");
    (void)sharedMem;
    return launch(func, gridDim, blockDim, rt_ptsz(stream), args);
}

RT_API cudaError_t CUDARTAPI cudaLaunchCooperativeKernel(const void *func, dim3 gridDim,
                                                         dim3 blockDim, void **args,
                                                         size_t sharedMem, cudaStream_t stream)
{
    SIM_ENTRY("cudaLaunchCooperativeKernel");
    (void)sharedMem;
    return launch(func, gridDim, blockDim, stream, args);
}

RT_API cudaError_t CUDARTAPI cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim,
                                                              dim3 blockDim, void **args,
                                                              size_t sharedMem, cudaStream_t stream)
{
    SIM_ENTRY("cudaLaunchCooperativeKernel_ptsz");
    (void)sharedMem;
    return launch(func, gridDim, blockDim, rt_ptsz(stream), args);
}

RT_API cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                                 void **args)
{
    SIM_ENTRY("cudaLaunchKernelExC");
    if (!config)
        return rt_err(cudaErrorInvalidValue);
    return launch(func, config->gridDim, config->blockDim, config->stream, args);
}

RT_API cudaError_t CUDARTAPI cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config,
                                                      const void *func, void **args)
{
    SIM_ENTRY("cudaLaunchKernelExC_ptsz");
    if (!config)
        return rt_err(cudaErrorInvalidValue);
    return launch(func, config->gridDim, config->blockDim, rt_ptsz(config->stream), args);
}

/* ------------------------------------------------------------------ */
/* function attributes and occupancy                                    */

/* What an ordinary sm_90 kernel reports. */
RT_API cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    SIM_ENTRY("cudaFuncGetAttributes");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!attr)
        return rt_err(cudaErrorInvalidValue);
    if (!func)
        return rt_err(cudaErrorInvalidDeviceFunction);
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = 32;
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->maxDynamicSharedSizeBytes = 48 * 1024;
    attr->preferredShmemCarveout = -1;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    SIM_ENTRY("cudaFuncSetAttribute");
    (void)attr, (void)value;
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    return func ? cudaSuccess : rt_err(cudaErrorInvalidDeviceFunction);
}

RT_API cudaError_t CUDARTAPI cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig)
{
    SIM_ENTRY("cudaFuncSetCacheConfig");
    (void)cacheConfig;
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    return func ? cudaSuccess : rt_err(cudaErrorInvalidDeviceFunction);
}

RT_API cudaError_t CUDARTAPI cudaKernelSetAttributeForDevice(cudaKernel_t kernel,
                                                             enum cudaFuncAttribute attr, int value,
                                                             int device)
{
    SIM_ENTRY("cudaKernelSetAttributeForDevice");
    (void)attr, (void)value;
    if (!rt_valid_device(device))
        return rt_err(cudaErrorInvalidDevice);
    return kernel ? cudaSuccess : rt_err(cudaErrorInvalidDeviceFunction);
}

/* Threads per SM (2048) and blocks per SM (32) bound the answer. */
static cudaError_t occupancy(int *numBlocks, const void *func, int blockSize)
{
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!numBlocks || blockSize <= 0)
        return rt_err(cudaErrorInvalidValue);
    if (!func)
        return rt_err(cudaErrorInvalidDeviceFunction);
    int n = 2048 / blockSize;
    *numBlocks = n > 32 ? 32 : n;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks,
                                                                           const void *func,
                                                                           int blockSize,
                                                                           size_t dynamicSMemSize)
{
    SIM_ENTRY("cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    (void)dynamicSMemSize;
    return occupancy(numBlocks, func, blockSize);
}

RT_API cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *numBlocks, const void *func, int blockSize, size_t dynamicSMemSize, unsigned int flags)
{
    SIM_ENTRY("cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
    (void)dynamicSMemSize, (void)flags;
    return occupancy(numBlocks, func, blockSize);
}

RT_API struct cudaChannelFormatDesc CUDARTAPI cudaCreateChannelDesc(int x, int y, int z, int w,
                                                                    enum cudaChannelFormatKind f)
{
    SIM_ENTRY("cudaCreateChannelDesc");
    struct cudaChannelFormatDesc d = {x, y, z, w, f};
    return d;
}

void rt_launch_report(sim_sb_t *sb)
{
    sim_sb_printf(sb, "\"kernels\": {\"fatbins\": %llu, \"functions\": %llu, \"variables\": %llu, "
                      "\"launches\": %llu}",
                  (unsigned long long)__atomic_load_n(&n_fatbins, __ATOMIC_RELAXED),
                  (unsigned long long)__atomic_load_n(&n_functions, __ATOMIC_RELAXED),
                  (unsigned long long)rt_symbol_count(),
                  (unsigned long long)__atomic_load_n(&n_launches, __ATOMIC_RELAXED));
}
