/*
 * rt_device.c - the fake runtime's per-thread state, initialisation,
 * devices (count, current device, properties, attributes, PCI ids, peer
 * access, limits, flags) and errors. Versions and driver entry points are
 * in rt_version.c.
 *
 * Devices are the fake driver's: their number, capacity and attributes come
 * from libcuda.so.1 (GPUMEM_SIM_DEVICES / GPUMEM_SIM_MEMORY there), so
 * cudaGetDeviceProperties and cuDeviceGetAttribute always agree.
 *
 * Invariants: primary[d] is retained at most once by the runtime and never
 * released (the runtime holds it until the process exits); the current
 * device and last error are per thread and start at 0 / cudaSuccess.
 */
#include "rt_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RT_MAX_DEVICES 16

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static cudaError_t init_result = cudaErrorInitializationError;
static int ndev;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* primary[], peer[], limits */
static CUcontext primary[RT_MAX_DEVICES];
static unsigned char peer[RT_MAX_DEVICES][RT_MAX_DEVICES];
static unsigned int device_flags[RT_MAX_DEVICES];
static enum cudaFuncCache cache_config[RT_MAX_DEVICES];
/* cudaLimit values, as an H100 reports them by default. */
#define RT_NLIMITS 11
static size_t limits[RT_NLIMITS] = {1024, 1 << 20, 8 << 20, 2, 2048, 0, 0x1000, 0, 0, 0, 0};

static __thread int tls_device;
static __thread cudaError_t tls_error;

/* ------------------------------------------------------------------ */
/* errors                                                               */

cudaError_t rt_err(cudaError_t e)
{
    if (e != cudaSuccess)
        tls_error = e;
    return e;
}

/* The driver's CUresult codes and the runtime's cudaError_t codes agree for
 * everything the fake driver returns (1, 2, 3, 100, 101, 201, 400, 500, 600,
 * 709, 801, ...). */
cudaError_t rt_cu(CUresult r) { return rt_err((cudaError_t)r); }

static const struct {
    int code;
    const char *name, *text;
} errors[] = {
#define RT_ERROR_ROW(name, value, text) {value, #name, text},
    RT_ERRORS(RT_ERROR_ROW)
#undef RT_ERROR_ROW
};

static int find_error(int code)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == code)
            return (int)i;
    return -1;
}

RT_API const char *CUDARTAPI cudaGetErrorName(cudaError_t error)
{
    SIM_ENTRY("cudaGetErrorName");
    int i = find_error((int)error);
    return i >= 0 ? errors[i].name : "unrecognized error code";
}

RT_API const char *CUDARTAPI cudaGetErrorString(cudaError_t error)
{
    SIM_ENTRY("cudaGetErrorString");
    int i = find_error((int)error);
    return i >= 0 ? errors[i].text : "unrecognized error code";
}

RT_API cudaError_t CUDARTAPI cudaGetLastError(void)
{
    SIM_ENTRY("cudaGetLastError");
    cudaError_t e = tls_error;
    tls_error = cudaSuccess;
    return e;
}

RT_API cudaError_t CUDARTAPI cudaPeekAtLastError(void)
{
    SIM_ENTRY("cudaPeekAtLastError");
    return tls_error;
}

/* Stubs of the generated file call this: an unimplemented call is an error
 * like any other. */
void sim_lib_on_unsupported(int code) { rt_err((cudaError_t)code); }

/* ------------------------------------------------------------------ */
/* initialisation and contexts                                          */

static void do_init(void)
{
    CUresult r = cuInit(0);
    int n = 0;
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetCount(&n);
    if (r == CUDA_SUCCESS) {
        ndev = n > RT_MAX_DEVICES ? RT_MAX_DEVICES : n;
        init_result = cudaSuccess;
    } else {
        init_result = r == CUDA_ERROR_NO_DEVICE ? cudaErrorNoDevice : cudaErrorInitializationError;
    }
}

cudaError_t rt_init(void)
{
    pthread_once(&init_once, do_init);
    return init_result;
}

int rt_device_count(void) { return rt_init() == cudaSuccess ? ndev : 0; }
int rt_current_device(void) { return tls_device; }
int rt_valid_device(int dev) { return dev >= 0 && dev < rt_device_count(); }

CUcontext rt_primary_ctx(int dev)
{
    if (!rt_valid_device(dev))
        return NULL;
    pthread_mutex_lock(&mu);
    if (!primary[dev] && cuDevicePrimaryCtxRetain(&primary[dev], dev) != CUDA_SUCCESS)
        primary[dev] = NULL;
    CUcontext c = primary[dev];
    pthread_mutex_unlock(&mu);
    return c;
}

cudaError_t rt_ctx_for(int dev)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    CUcontext want = rt_primary_ctx(dev);
    if (!want)
        return cudaErrorInvalidDevice;
    CUcontext cur = NULL;
    if (cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != want)
        if (cuCtxSetCurrent(want) != CUDA_SUCCESS)
            return cudaErrorDeviceUninitialized;
    return cudaSuccess;
}

cudaError_t rt_ctx(void) { return rt_ctx_for(tls_device); }

/* ------------------------------------------------------------------ */
/* devices                                                              */

RT_API cudaError_t CUDARTAPI cudaGetDeviceCount(int *count)
{
    SIM_ENTRY("cudaGetDeviceCount");
    if (!count)
        return rt_err(cudaErrorInvalidValue);
    cudaError_t e = rt_init();
    *count = e == cudaSuccess ? ndev : 0;
    return rt_err(e);
}

RT_API cudaError_t CUDARTAPI cudaGetDevice(int *device)
{
    SIM_ENTRY("cudaGetDevice");
    if (!device)
        return rt_err(cudaErrorInvalidValue);
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    *device = tls_device;
    return cudaSuccess;
}

/* Since CUDA 12.0 cudaSetDevice initialises the device's primary context. */
RT_API cudaError_t CUDARTAPI cudaSetDevice(int device)
{
    SIM_ENTRY("cudaSetDevice");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!rt_valid_device(device))
        return rt_err(cudaErrorInvalidDevice);
    tls_device = device;
    return rt_err(rt_ctx());
}

RT_API cudaError_t CUDARTAPI cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
    SIM_ENTRY("cudaInitDevice");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!rt_valid_device(device))
        return rt_err(cudaErrorInvalidDevice);
    if (flags != 0)
        return rt_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&mu);
    device_flags[device] = deviceFlags;
    pthread_mutex_unlock(&mu);
    return rt_err(rt_primary_ctx(device) ? cudaSuccess : cudaErrorInvalidDevice);
}

static int attr(int dev, int a)
{
    int v = 0;
    if (cuDeviceGetAttribute(&v, (CUdevice_attribute)a, dev) != CUDA_SUCCESS)
        v = 0;
    return v;
}

/* CUDA 12 exports this layout as cudaGetDeviceProperties_v2 (its header
 * maps the name onto it); its cudaGetDeviceProperties has CUDA 11's
 * layout and stays a stub. */
#if SIM_CUDA_MAJOR >= 13
#define RT_DEVICE_PROPERTIES cudaGetDeviceProperties
#else
#define RT_DEVICE_PROPERTIES cudaGetDeviceProperties_v2
#endif
#define RT_NAME_(f) #f
#define RT_NAME(f) RT_NAME_(f)

RT_API cudaError_t CUDARTAPI RT_DEVICE_PROPERTIES(struct cudaDeviceProp *prop, int device)
{
    SIM_ENTRY(RT_NAME(RT_DEVICE_PROPERTIES));
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!prop)
        return rt_err(cudaErrorInvalidValue);
    if (!rt_valid_device(device))
        return rt_err(cudaErrorInvalidDevice);
    int d = device;
    memset(prop, 0, sizeof *prop);
    cuDeviceGetName(prop->name, (int)sizeof prop->name, d);
    cuDeviceGetUuid_v2(&prop->uuid, d);
    cuDeviceTotalMem_v2(&prop->totalGlobalMem, d);
    prop->sharedMemPerBlock = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    prop->regsPerBlock = attr(d, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    prop->warpSize = attr(d, CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    prop->memPitch = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_MAX_PITCH);
    prop->maxThreadsPerBlock = attr(d, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    for (int i = 0; i < 3; i++) {
        prop->maxThreadsDim[i] = attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + i);
        prop->maxGridSize[i] = attr(d, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X + i);
    }
    prop->totalConstMem = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
    prop->major = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    prop->minor = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    prop->textureAlignment = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
    prop->texturePitchAlignment = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT);
    prop->multiProcessorCount = attr(d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    prop->canMapHostMemory = attr(d, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
    prop->surfaceAlignment = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT);
    prop->concurrentKernels = attr(d, CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
    prop->ECCEnabled = attr(d, CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
    prop->pciBusID = attr(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    prop->pciDeviceID = attr(d, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    prop->pciDomainID = attr(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
    prop->asyncEngineCount = attr(d, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
    prop->unifiedAddressing = attr(d, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
    prop->memoryBusWidth = attr(d, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    prop->l2CacheSize = attr(d, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    prop->maxThreadsPerMultiProcessor = attr(d, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    prop->streamPrioritiesSupported = attr(d, CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED);
    prop->globalL1CacheSupported = attr(d, CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED);
    prop->localL1CacheSupported = attr(d, CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED);
    prop->sharedMemPerMultiprocessor =
        (size_t)attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    prop->regsPerMultiprocessor = attr(d, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
    prop->computePreemptionSupported = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED);
    prop->cooperativeLaunch = attr(d, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
    prop->sharedMemPerBlockOptin = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    prop->maxBlocksPerMultiProcessor = attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
    prop->reservedSharedMemPerBlock = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
    prop->clusterLaunch = attr(d, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH);
#if SIM_CUDA_MAJOR >= 13
    prop->deviceNumaId = attr(d, CU_DEVICE_ATTRIBUTE_NUMA_ID);
    prop->hostNumaId = attr(d, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID);
#else /* fields CUDA 13 removed */
    prop->clockRate = attr(d, CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
    prop->memoryClockRate = attr(d, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
    prop->deviceOverlap = attr(d, CU_DEVICE_ATTRIBUTE_GPU_OVERLAP);
#endif
    /* Host-side features that hold for host memory posing as device memory. */
    prop->hostRegisterSupported = 1;
    prop->ipcEventSupported = 0;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr a, int device)
{
    SIM_ENTRY("cudaDeviceGetAttribute");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!value)
        return rt_err(cudaErrorInvalidValue);
    if (!rt_valid_device(device))
        return rt_err(cudaErrorInvalidDevice);
    return rt_cu(cuDeviceGetAttribute(value, (CUdevice_attribute)a, device));
}

RT_API cudaError_t CUDARTAPI cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    SIM_ENTRY("cudaDeviceGetPCIBusId");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!pciBusId || len <= 0)
        return rt_err(cudaErrorInvalidValue);
    if (!rt_valid_device(device))
        return rt_err(cudaErrorInvalidDevice);
    snprintf(pciBusId, (size_t)len, "%08X:%02X:%02X.0", attr(device, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
             attr(device, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID), attr(device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaDeviceGetByPCIBusId(int *device, const char *pciBusId)
{
    SIM_ENTRY("cudaDeviceGetByPCIBusId");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    unsigned dom = 0, bus = 0, dv = 0;
    if (!device || !pciBusId)
        return rt_err(cudaErrorInvalidValue);
    if (sscanf(pciBusId, "%x:%x:%x", &dom, &bus, &dv) != 3) {
        dom = 0;
        if (sscanf(pciBusId, "%x:%x", &bus, &dv) != 2)
            return rt_err(cudaErrorInvalidValue);
    }
    for (int d = 0; d < ndev; d++) {
        if ((unsigned)attr(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID) == dom &&
            (unsigned)attr(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) == bus &&
            (unsigned)attr(d, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID) == dv) {
            *device = d;
            return cudaSuccess;
        }
    }
    return rt_err(cudaErrorInvalidDevice);
}

/* Every simulated device shares the host's address space, so each can
 * reach every other once peer access is enabled. */
RT_API cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    SIM_ENTRY("cudaDeviceCanAccessPeer");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!canAccessPeer)
        return rt_err(cudaErrorInvalidValue);
    if (!rt_valid_device(device) || !rt_valid_device(peerDevice))
        return rt_err(cudaErrorInvalidDevice);
    *canAccessPeer = device != peerDevice;
    return cudaSuccess;
}

static cudaError_t set_peer(int peerDevice, int enable)
{
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    int d = tls_device;
    if (!rt_valid_device(peerDevice) || peerDevice == d)
        return rt_err(cudaErrorInvalidDevice);
    pthread_mutex_lock(&mu);
    if (enable && peer[d][peerDevice])
        e = cudaErrorPeerAccessAlreadyEnabled;
    else if (!enable && !peer[d][peerDevice])
        e = cudaErrorPeerAccessNotEnabled;
    else
        peer[d][peerDevice] = (unsigned char)enable;
    pthread_mutex_unlock(&mu);
    return rt_err(e);
}

RT_API cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    SIM_ENTRY("cudaDeviceEnablePeerAccess");
    if (flags != 0)
        return rt_err(cudaErrorInvalidValue);
    return set_peer(peerDevice, 1);
}

RT_API cudaError_t CUDARTAPI cudaDeviceDisablePeerAccess(int peerDevice)
{
    SIM_ENTRY("cudaDeviceDisablePeerAccess");
    return set_peer(peerDevice, 0);
}

RT_API cudaError_t CUDARTAPI cudaDeviceSynchronize(void)
{
    SIM_ENTRY("cudaDeviceSynchronize");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    return rt_cu(cuCtxSynchronize());
}

RT_API cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    SIM_ENTRY("cudaDeviceGetStreamPriorityRange");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    return rt_cu(cuCtxGetStreamPriorityRange(leastPriority, greatestPriority));
}

RT_API cudaError_t CUDARTAPI cudaDeviceSetLimit(enum cudaLimit limit, size_t value)
{
    SIM_ENTRY("cudaDeviceSetLimit");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if ((unsigned)limit >= RT_NLIMITS)
        return rt_err(cudaErrorUnsupportedLimit);
    pthread_mutex_lock(&mu);
    limits[limit] = value;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaDeviceGetLimit(size_t *pValue, enum cudaLimit limit)
{
    SIM_ENTRY("cudaDeviceGetLimit");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!pValue)
        return rt_err(cudaErrorInvalidValue);
    if ((unsigned)limit >= RT_NLIMITS)
        return rt_err(cudaErrorUnsupportedLimit);
    pthread_mutex_lock(&mu);
    *pValue = limits[limit];
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaDeviceSetCacheConfig(enum cudaFuncCache cacheConfig)
{
    SIM_ENTRY("cudaDeviceSetCacheConfig");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if ((unsigned)cacheConfig > cudaFuncCachePreferEqual)
        return rt_err(cudaErrorInvalidValue);
    cache_config[tls_device] = cacheConfig;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaDeviceGetCacheConfig(enum cudaFuncCache *pCacheConfig)
{
    SIM_ENTRY("cudaDeviceGetCacheConfig");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!pCacheConfig)
        return rt_err(cudaErrorInvalidValue);
    *pCacheConfig = cache_config[tls_device];
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaSetDeviceFlags(unsigned int flags)
{
    SIM_ENTRY("cudaSetDeviceFlags");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (flags & ~0x1fu) /* schedule mask, map host, resize local mem */
        return rt_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&mu);
    device_flags[tls_device] = flags;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaGetDeviceFlags(unsigned int *flags)
{
    SIM_ENTRY("cudaGetDeviceFlags");
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!flags)
        return rt_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&mu);
    *flags = device_flags[tls_device] | 0x08; /* cudaDeviceMapHost is always on */
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}
