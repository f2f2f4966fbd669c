/*
 * fakecuda.c - the core of the fake CUDA driver: its state and lock, the
 * entry of every call (counting, failure injection), cuInit, the version
 * and the devices.
 *
 * The configuration is in fakecuda_config.c, contexts in fakecuda_ctx.c,
 * the sorted vector every table uses in fakecuda_vec.c, memory in
 * fakecuda_mem.c (cuMemAlloc) and fakecuda_vmm.c, streams in
 * fakecuda_sync.c, events in fakecuda_event.c, simulated time in
 * fakecuda_timeline.c, error strings, the JSON report and the other
 * fakecuda_* control functions in fakecuda_report.c. README.md documents
 * the behaviour.
 *
 * Invariants: fc is only touched with fc.mu held.
 *
 * Must not: print anything (a bad configuration's one line at cuInit comes
 * from fakecuda_config.c).
 */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <string.h>

fc_state_t fc = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .memfd = -1,
    .next_id = 1,
};

const char *const fc_func_names[FN_COUNT] = {
#define FC_NAME(name) #name,
    FC_FUNCS(FC_NAME)
#undef FC_NAME
};

void fc_lock(void) { pthread_mutex_lock(&fc.mu); }
void fc_unlock(void) { pthread_mutex_unlock(&fc.mu); }

/* fork() while another thread is inside the driver must not leave the child
 * with a lock nobody will release. */
static void atfork_prepare(void) { fc_lock(); }
static void atfork_release(void) { fc_unlock(); }

__attribute__((constructor)) static void fakecuda_load(void)
{
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}

uint64_t fc_new_id_unlocked(void) { return fc.next_id++; }

int fc_valid_device(int dev) { return dev >= 0 && dev < fc.ndev; }

void fc_note_usage_unlocked(int dev)
{
    fc_device_t *d = &fc.dev[dev];
    size_t used = fc_used(d);
    if (used > d->peak_used)
        d->peak_used = used;
}

/* ------------------------------------------------------------------ */
/* call accounting, failure injection                                   */

CUresult fc_injected_unlocked(int fn)
{
    uint64_t seen = fc.fail_seen[fn];
    for (int i = 0; i < fc.nrules; i++) {
        const fc_fail_rule_t *r = &fc.rules[i];
        if (r->fn == fn && (seen == r->nth || (r->and_after && seen > r->nth)))
            return r->code;
    }
    return CUDA_SUCCESS;
}

CUresult fc_enter_unlocked(int fn, int need_init)
{
    fc.calls[fn]++;
    fc.fail_seen[fn]++;
    fc.host_ns += FC_TL_HOST_CALL_NS; /* Note [Device timeline] */
    CUresult r = fc_injected_unlocked(fn);
    if (r != CUDA_SUCCESS)
        return r;
    if (need_init && !fc.initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* initialisation, version, devices                                     */

FC_API CUresult CUDAAPI cuInit(unsigned int Flags)
{
    CUresult res;
    fc_lock();
    fc.calls[FN_cuInit]++;
    /* The configuration is read first (it resets the "Nth call" counters),
     * so GPUMEM_FAKECUDA_FAIL can make this very cuInit fail. */
    if (!fc.config_loaded && fc_load_config_unlocked() != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    fc.fail_seen[FN_cuInit]++;
    if ((res = fc_injected_unlocked(FN_cuInit)) != CUDA_SUCCESS)
        goto done;
    if (Flags != 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (fc.ndev == 0)
        FC_FAIL(CUDA_ERROR_NO_DEVICE);
    fc.initialized = 1;
    FC_END();
}

FC_API CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    FC_BEGIN(FN_cuDriverGetVersion, 0); /* documented to work before cuInit */
    if (!driverVersion)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *driverVersion = FC_DRIVER_VERSION;
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    FC_BEGIN(FN_cuDeviceGetCount, 1);
    if (!count)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    *count = fc.ndev;
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    FC_BEGIN(FN_cuDeviceGet, 1);
    if (!device)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(ordinal))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    *device = ordinal;
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FC_BEGIN(FN_cuDeviceGetName, 1);
    if (!name || len <= 0)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    snprintf(name, (size_t)len, "%s", fc.gpu.name);
    FC_END();
}

static int attribute_value(int attrib, int dev)
{
    const fc_gpu_t *g = &fc.gpu;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return g->clock_khz;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return g->sm_count;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x18 + dev;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return g->mem_clock_khz;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return g->bus_bits;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return g->l2_bytes;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return g->threads_per_sm;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return g->cc_major;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return g->cc_minor;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return g->smem_per_sm;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return g->regs_per_sm;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: return 2;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return g->smem_per_block_optin;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return fc.granularity > 0;
    /* cuMemCreate accepts requestedHandleTypes = POSIX_FILE_DESCRIPTOR (it
     * cannot export one: cuMemExportToShareableHandle is not provided). */
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return fc.granularity > 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return g->blocks_per_sm;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return g->cc_major >= 9;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: return 4;
    case CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: return g->cc_major >= 9;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: return -1;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: return -1;
    /* Everything else, including managed memory, memory pools, fabric
     * handles and GPUDirect RDMA, which the fake does not provide. */
    default: return 0;
    }
}

FC_API CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    FC_BEGIN(FN_cuDeviceGetAttribute, 1);
    if (!pi || (int)attrib < 1 || (int)attrib >= FC_ATTR_LIMIT)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    *pi = attribute_value((int)attrib, dev);
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    FC_BEGIN(FN_cuDeviceTotalMem_v2, 1);
    if (!bytes)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    *bytes = fc.dev[dev].capacity;
    FC_END();
}

static CUresult device_uuid(int fn, CUuuid *uuid, CUdevice dev)
{
    FC_BEGIN(fn, 1);
    if (!uuid)
        FC_FAIL(CUDA_ERROR_INVALID_VALUE);
    if (!fc_valid_device(dev))
        FC_FAIL(CUDA_ERROR_INVALID_DEVICE);
    /* A fixed, version-4-shaped UUID whose last byte is the ordinal. */
    static const unsigned char base[16] = {0x67, 0x70, 0x6d, 0x65, 0x6d, 0x2d, 0x46, 0x41,
                                           0x8b, 0x45, 0x43, 0x55, 0x44, 0x41, 0x00, 0x00};
    memcpy(uuid->bytes, base, 16);
    uuid->bytes[15] = (char)dev;
    FC_END();
}

FC_API CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(FN_cuDeviceGetUuid, uuid, dev);
}

FC_API CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(FN_cuDeviceGetUuid_v2, uuid, dev);
}
