/*
 * nvml.c - the fake NVIDIA Management Library (libnvidia-ml.so.1) of the
 * simulated GPU. It describes the fake driver's devices, so that what
 * PyTorch learns through NVML agrees with what it learns through CUDA:
 *
 *   - torch.cuda.device_count() asks NVML first (ctypes, before CUDA is
 *     initialised); on a machine with real GPUs the real NVML would report
 *     those, not the simulated ones;
 *   - PyTorch's expandable segments ask NVML for fabric (multi-node NVLink)
 *     support on sm90 devices and crash if NVML is missing altogether
 *     (c10::cuda::get_fabric_access calls nvmlInit_v2 through a NULL
 *     pointer in 2.14.1);
 *   - out-of-memory messages list the processes using the device.
 *
 * Answers: device count, handles (by index, PCI bus id, UUID), name, UUID
 * ("GPU-" + the fake driver's UUID), memory (the fake driver's capacity and
 * use), compute capability, P2P "OK", no NVLink, fabric state
 * NOT_SUPPORTED, and the compute processes on a device: this process alone
 * (Note [Running processes]). Everything comes from the fake libcuda.so.1,
 * linked with RUNPATH $ORIGIN.
 */
#include "nvml_api.h"

#include "cuda_min.h"
#include "simcommon.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NVML_MAX_DEVICES 16

/* Exported by the fake libcuda.so.1. */
int fakecuda_device_memory(int device, size_t *total, size_t *used);
long long fakecuda_query(const char *key, int device);

struct nvmlDevice_st {
    int index;
};

static struct nvmlDevice_st devices[NVML_MAX_DEVICES];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int init_count, ndev = -1;

static nvmlReturn_t init(void)
{
    pthread_mutex_lock(&mu);
    nvmlReturn_t r = NVML_SUCCESS;
    if (ndev < 0) {
        CUresult c = cuInit(0);
        int n = 0;
        if (c == CUDA_SUCCESS)
            c = cuDeviceGetCount(&n);
        if (c == CUDA_SUCCESS || c == CUDA_ERROR_NO_DEVICE) {
            ndev = n > NVML_MAX_DEVICES ? NVML_MAX_DEVICES : n;
            for (int i = 0; i < ndev; i++)
                devices[i].index = i;
        } else {
            r = NVML_ERROR_UNKNOWN;
        }
    }
    if (r == NVML_SUCCESS)
        init_count++;
    pthread_mutex_unlock(&mu);
    return r;
}

static int ready(void)
{
    pthread_mutex_lock(&mu);
    int ok = init_count > 0;
    pthread_mutex_unlock(&mu);
    return ok;
}

/* The device behind a handle, or -1. Handles are checked by address. */
static int dev_of(nvmlDevice_t d)
{
    if (!ready())
        return -1;
    for (int i = 0; i < ndev; i++)
        if (d == &devices[i])
            return i;
    return -1;
}

#define CHECK_INIT()                                                        \
    do {                                                                    \
        if (!ready())                                                       \
            return NVML_ERROR_UNINITIALIZED;                                \
    } while (0)

SIM_API nvmlReturn_t nvmlInit(void)
{
    SIM_ENTRY("nvmlInit");
    return init();
}

SIM_API nvmlReturn_t nvmlInit_v2(void)
{
    SIM_ENTRY("nvmlInit_v2");
    return init();
}

SIM_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    SIM_ENTRY("nvmlInitWithFlags");
    (void)flags;
    return init();
}

SIM_API nvmlReturn_t nvmlShutdown(void)
{
    SIM_ENTRY("nvmlShutdown");
    pthread_mutex_lock(&mu);
    nvmlReturn_t r = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count > 0)
        init_count--;
    pthread_mutex_unlock(&mu);
    return r;
}

SIM_API const char *nvmlErrorString(nvmlReturn_t result)
{
    SIM_ENTRY("nvmlErrorString");
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_str(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    SIM_ENTRY("nvmlSystemGetDriverVersion");
    CHECK_INIT();
    return copy_str(version, length, "580.0.0");
}

SIM_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    SIM_ENTRY("nvmlSystemGetNVMLVersion");
    CHECK_INIT();
    return copy_str(version, length, "13.580.0");
}

static nvmlReturn_t cuda_version(int *v)
{
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    return cuDriverGetVersion(v) == CUDA_SUCCESS ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

SIM_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    SIM_ENTRY("nvmlSystemGetCudaDriverVersion");
    return cuda_version(cudaDriverVersion);
}

SIM_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    SIM_ENTRY("nvmlSystemGetCudaDriverVersion_v2");
    return cuda_version(cudaDriverVersion);
}

static nvmlReturn_t count(unsigned int *n)
{
    CHECK_INIT();
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned int)ndev;
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    SIM_ENTRY("nvmlDeviceGetCount");
    return count(deviceCount);
}

SIM_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    SIM_ENTRY("nvmlDeviceGetCount_v2");
    return count(deviceCount);
}

static nvmlReturn_t by_index(unsigned int index, nvmlDevice_t *device)
{
    CHECK_INIT();
    if (!device || index >= (unsigned int)ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    SIM_ENTRY("nvmlDeviceGetHandleByIndex");
    return by_index(index, device);
}

SIM_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    SIM_ENTRY("nvmlDeviceGetHandleByIndex_v2");
    return by_index(index, device);
}

static int attr(int dev, CUdevice_attribute a)
{
    int v = 0;
    return cuDeviceGetAttribute(&v, a, dev) == CUDA_SUCCESS ? v : -1;
}

/* "domain:bus:device.function" or "bus:device.function", hex. */
static nvmlReturn_t by_pci(const char *id, nvmlDevice_t *device)
{
    CHECK_INIT();
    unsigned dom = 0, bus = 0, dv = 0;
    if (!id || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sscanf(id, "%x:%x:%x", &dom, &bus, &dv) != 3) {
        dom = 0;
        if (sscanf(id, "%x:%x", &bus, &dv) != 2)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < ndev; i++)
        if ((unsigned)attr(i, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID) == dom &&
            (unsigned)attr(i, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) == bus &&
            (unsigned)attr(i, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID) == dv) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

SIM_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    SIM_ENTRY("nvmlDeviceGetHandleByPciBusId");
    return by_pci(pciBusId, device);
}

SIM_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    SIM_ENTRY("nvmlDeviceGetHandleByPciBusId_v2");
    return by_pci(pciBusId, device);
}

static void uuid_string(int dev, char *out, size_t len)
{
    CUuuid u;
    memset(&u, 0, sizeof u);
    cuDeviceGetUuid_v2(&u, dev);
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

SIM_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    SIM_ENTRY("nvmlDeviceGetHandleByUUID");
    CHECK_INIT();
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < ndev; i++) {
        char s[64];
        uuid_string(i, s, sizeof s);
        if (strcmp(s, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

SIM_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    SIM_ENTRY("nvmlDeviceGetIndex");
    int d = dev_of(device);
    if (d < 0 || !index)
        return d < 0 && !ready() ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)d;
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    SIM_ENTRY("nvmlDeviceGetName");
    int d = dev_of(device);
    if (d < 0)
        return ready() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    char buf[256];
    if (cuDeviceGetName(buf, (int)sizeof buf, d) != CUDA_SUCCESS)
        return NVML_ERROR_UNKNOWN;
    return copy_str(name, length, buf);
}

SIM_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    SIM_ENTRY("nvmlDeviceGetUUID");
    int d = dev_of(device);
    if (d < 0)
        return ready() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    char buf[64];
    uuid_string(d, buf, sizeof buf);
    return copy_str(uuid, length, buf);
}

/* Used memory is what the fake device holds for every process, as on a real
 * device (NVML counts the whole device). */
SIM_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    SIM_ENTRY("nvmlDeviceGetMemoryInfo");
    int d = dev_of(device);
    if (d < 0 || !memory)
        return d < 0 && !ready() ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    size_t total = 0, used = 0;
    if (fakecuda_device_memory(d, &total, &used) != 0)
        return NVML_ERROR_UNKNOWN;
    memory->total = total;
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    SIM_ENTRY("nvmlDeviceGetCudaComputeCapability");
    int d = dev_of(device);
    if (d < 0 || !major || !minor)
        return d < 0 && !ready() ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    *major = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    *minor = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    return NVML_SUCCESS;
}

/* Note [Running processes]
 *
 * Rationale: PyTorch's out-of-memory message lists the processes NVML sees
 * on the device ("Including non-PyTorch memory, this process has X memory
 * in use. ", "Process PID has X memory in use. "), resolving the plain
 * nvmlDeviceGetComputeRunningProcesses, whose entries have the v1 layout
 * (nvml.h declares it so under NVML_NO_UNVERSIONED_FUNC_DEFS, as PyTorch
 * compiles). The message should read as on a GPU.
 *
 * Approach: a simulated device is used by one process, this one: it is
 * listed while it holds device memory or an active primary context, with
 * the driver's accounting as usedGpuMemory (context + cuMemAlloc +
 * cuMemCreate: what cuMemGetInfo's total - free shows), as the real driver
 * counts all of a process's memory. The plain name fills v1 entries
 * (pid, usedGpuMemory: 16 bytes), _v2 and _v3 fill v2 entries (24 bytes,
 * GPU and compute instance 0xFFFFFFFF: no MIG). Errors as nvml.h documents
 * them: UNINITIALIZED before nvmlInit, INVALID_ARGUMENT for a bad handle,
 * a NULL count, or NULL infos with room for entries; INSUFFICIENT_SIZE with
 * the count needed when *infoCount is too small (so *infoCount = 0 asks
 * for the count; SUCCESS and 0 when nothing runs).
 * GPUMEM_SIM_NVML_PROCESSES=unsupported answers NOT_SUPPORTED instead, as
 * NVML does on platforms with partial support (Tegra/Jetson).
 *
 * Limitations: other processes (each rank simulates its own devices) are
 * never listed, so no "Process PID has ..." sentence appears; pids are
 * this process's own, never a host's pid namespace's.
 */
static int processes_unsupported(void)
{
    const char *v = getenv("GPUMEM_SIM_NVML_PROCESSES");
    return v && strcmp(v, "unsupported") == 0;
}

enum { PROC_V1 = 1, PROC_V2 = 2 };

static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, int layout)
{
    int d = dev_of(device);
    if (d < 0)
        return ready() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (processes_unsupported())
        return NVML_ERROR_NOT_SUPPORTED;
    long long used = fakecuda_query("bytes_used", d);
    long long ctx = fakecuda_query("primary_ctx_refcount", d);
    if (used < 0 || ctx < 0)
        return NVML_ERROR_UNKNOWN;
    unsigned int n = (used > 0 || ctx > 0) ? 1 : 0;
    if (*infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = n;
    if (!n)
        return NVML_SUCCESS;
    if (layout == PROC_V1) {
        nvmlProcessInfo_v1_t *p = infos;
        memset(p, 0, sizeof *p);
        p->pid = (unsigned int)getpid();
        p->usedGpuMemory = (unsigned long long)used;
    } else {
        nvmlProcessInfo_v2_t *p = infos;
        memset(p, 0, sizeof *p);
        p->pid = (unsigned int)getpid();
        p->usedGpuMemory = (unsigned long long)used;
        p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                          nvmlProcessInfo_v1_t *infos)
{
    SIM_ENTRY("nvmlDeviceGetComputeRunningProcesses");
    return processes(device, infoCount, infos, PROC_V1);
}

SIM_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                             unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos)
{
    SIM_ENTRY("nvmlDeviceGetComputeRunningProcesses_v2");
    return processes(device, infoCount, infos, PROC_V2);
}

SIM_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                             unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos)
{
    SIM_ENTRY("nvmlDeviceGetComputeRunningProcesses_v3");
    return processes(device, infoCount, infos, PROC_V2);
}

SIM_API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, int p2pIndex,
                                            int *p2pStatus)
{
    SIM_ENTRY("nvmlDeviceGetP2PStatus");
    (void)p2pIndex;
    if (dev_of(device1) < 0 || dev_of(device2) < 0 || !p2pStatus)
        return ready() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    *p2pStatus = NVML_P2P_STATUS_OK;
    return NVML_SUCCESS;
}

SIM_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                         int *pNvLinkDeviceType)
{
    SIM_ENTRY("nvmlDeviceGetNvLinkRemoteDeviceType");
    (void)device, (void)link, (void)pNvLinkDeviceType;
    return NVML_ERROR_NOT_SUPPORTED; /* no NVLink */
}

SIM_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                         void *pci)
{
    SIM_ENTRY("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    (void)device, (void)link, (void)pci;
    return NVML_ERROR_NOT_SUPPORTED;
}

/* Version 2 of the structure; the devices are in no NVLink fabric. */
SIM_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
    SIM_ENTRY("nvmlDeviceGetGpuFabricInfoV");
    if (dev_of(device) < 0 || !info)
        return ready() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    if (info->version != ((unsigned)sizeof *info | (2u << 24)))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->status = NVML_SUCCESS;
    info->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

SIM_API int gpumem_sim_nvml_report_json(char *buf, size_t len)
{
    sim_sb_t sb = {0};
    sim_sb_printf(&sb, "{\"library\": \"%s\", ", sim_table.soname);
    sim_report_calls(&sb);
    sim_sb_printf(&sb, "}");
    return sim_sb_finish(&sb, buf, len);
}
