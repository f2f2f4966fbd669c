/*
 * rt_host.c - pinned host memory in the fake runtime: cudaHostAlloc,
 * cudaMallocHost, cudaFreeHost, cudaHostRegister/Unregister and the
 * queries on them. Kept here, not in the driver: it is not device memory.
 *
 * Invariants: the ranges are sorted by address and never overlap; every
 * range is pinned (ours, map_size > 0) or registered by the caller.
 */
#include "rt_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
    char *ptr;
    size_t size, map_size; /* map_size 0: registered by the caller, not ours */
    unsigned int flags;
    int device;
} host_range_t;

static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;
static host_range_t *hosts; /* sorted by ptr, non-overlapping */
static size_t nhosts, caphosts;
static size_t host_bytes, host_peak, host_allocs;

/* Index of the range containing p, or -1. Caller holds host_mu. */
static long host_find(const void *p)
{
    size_t lo = 0, hi = nhosts;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (hosts[mid].ptr <= (const char *)p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const host_range_t *h = &hosts[lo - 1];
    return (const char *)p < h->ptr + h->size ? (long)(lo - 1) : -1;
}

/* Inserts r unless it overlaps a range; 0, or a cudaError_t. */
static cudaError_t host_insert(host_range_t r)
{
    size_t i = 0;
    while (i < nhosts && hosts[i].ptr < r.ptr)
        i++;
    if ((i > 0 && hosts[i - 1].ptr + hosts[i - 1].size > r.ptr) ||
        (i < nhosts && r.ptr + r.size > hosts[i].ptr))
        return cudaErrorHostMemoryAlreadyRegistered;
    if (nhosts == caphosts) {
        size_t cap = caphosts ? caphosts * 2 : 64;
        host_range_t *v = realloc(hosts, cap * sizeof *v);
        if (!v)
            return cudaErrorMemoryAllocation;
        hosts = v;
        caphosts = cap;
    }
    memmove(&hosts[i + 1], &hosts[i], (nhosts - i) * sizeof *hosts);
    hosts[i] = r;
    nhosts++;
    return cudaSuccess;
}

static void host_remove_at(size_t i)
{
    memmove(&hosts[i], &hosts[i + 1], (nhosts - i - 1) * sizeof *hosts);
    nhosts--;
}

static cudaError_t host_alloc(void **pHost, size_t size, unsigned int flags)
{
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!pHost || (flags & ~0x0fu))
        return rt_err(cudaErrorInvalidValue);
    if (size == 0) {
        *pHost = NULL;
        return cudaSuccess;
    }
    size_t map = (size + 4095) & ~(size_t)4095;
    if (map < size)
        return rt_err(cudaErrorMemoryAllocation);
    void *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return rt_err(cudaErrorMemoryAllocation);
    host_range_t r = {p, size, map, flags, rt_current_device()};
    pthread_mutex_lock(&host_mu);
    e = host_insert(r);
    if (e == cudaSuccess) {
        host_bytes += size;
        host_allocs++;
        if (host_bytes > host_peak)
            host_peak = host_bytes;
    }
    pthread_mutex_unlock(&host_mu);
    if (e != cudaSuccess) {
        munmap(p, map);
        return rt_err(cudaErrorMemoryAllocation);
    }
    *pHost = p;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    SIM_ENTRY("cudaHostAlloc");
    return host_alloc(pHost, size, flags);
}

RT_API cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size)
{
    SIM_ENTRY("cudaMallocHost");
    return host_alloc(ptr, size, cudaHostAllocDefault);
}

RT_API cudaError_t CUDARTAPI cudaFreeHost(void *ptr)
{
    SIM_ENTRY("cudaFreeHost");
    if (!ptr)
        return cudaSuccess;
    pthread_mutex_lock(&host_mu);
    long i = host_find(ptr);
    host_range_t r = {0};
    if (i >= 0 && hosts[i].ptr == ptr && hosts[i].map_size) {
        r = hosts[i];
        host_remove_at((size_t)i);
        host_bytes -= r.size;
    }
    pthread_mutex_unlock(&host_mu);
    if (!r.ptr)
        return rt_err(cudaErrorInvalidValue);
    munmap(r.ptr, r.map_size);
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    SIM_ENTRY("cudaHostRegister");
    cudaError_t e = rt_ctx();
    if (e != cudaSuccess)
        return rt_err(e);
    if (!ptr || size == 0 || (flags & ~0x0fu))
        return rt_err(cudaErrorInvalidValue);
    host_range_t r = {ptr, size, 0, flags, rt_current_device()};
    pthread_mutex_lock(&host_mu);
    e = host_insert(r);
    pthread_mutex_unlock(&host_mu);
    return rt_err(e);
}

RT_API cudaError_t CUDARTAPI cudaHostUnregister(void *ptr)
{
    SIM_ENTRY("cudaHostUnregister");
    cudaError_t e = cudaErrorHostMemoryNotRegistered;
    pthread_mutex_lock(&host_mu);
    long i = host_find(ptr);
    if (i >= 0 && hosts[i].ptr == ptr && hosts[i].map_size == 0) {
        host_remove_at((size_t)i);
        e = cudaSuccess;
    }
    pthread_mutex_unlock(&host_mu);
    return rt_err(e);
}

RT_API cudaError_t CUDARTAPI cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    SIM_ENTRY("cudaHostGetDevicePointer");
    if (!pDevice || flags != 0)
        return rt_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&host_mu);
    long i = host_find(pHost);
    pthread_mutex_unlock(&host_mu);
    if (i < 0)
        return rt_err(cudaErrorInvalidValue);
    *pDevice = pHost; /* unified addressing: the same address */
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
    SIM_ENTRY("cudaHostGetFlags");
    if (!pFlags)
        return rt_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&host_mu);
    long i = host_find(pHost);
    if (i >= 0)
        *pFlags = hosts[i].flags | cudaHostAllocMapped;
    pthread_mutex_unlock(&host_mu);
    return i >= 0 ? cudaSuccess : rt_err(cudaErrorInvalidValue);
}

void rt_host_report(sim_sb_t *sb)
{
    pthread_mutex_lock(&host_mu);
    sim_sb_printf(sb, "\"host\": {\"bytes\": %zu, \"peak_bytes\": %zu, \"allocations\": %zu, "
                      "\"ranges\": %zu}",
                  host_bytes, host_peak, host_allocs, nhosts);
    pthread_mutex_unlock(&host_mu);
}

int rt_host_device(const void *p, int *device)
{
    pthread_mutex_lock(&host_mu);
    long i = host_find(p);
    if (i >= 0)
        *device = hosts[i].device;
    pthread_mutex_unlock(&host_mu);
    return i >= 0;
}
