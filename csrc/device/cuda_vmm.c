/*
 * cuda_vmm.c - the CUDA driver backend's virtual memory management, for
 * expandable segments: VMM support and granularity, address reservations,
 * and mapping physical memory into them (see cuda_backend.h).
 *
 * Rules it follows (CUDA driver API semantics):
 *   - Expandable segments map one physical handle per granule (cuMemCreate)
 *     so any granule can be unmapped and released on its own; the handle of
 *     each mapped granule is kept in c->handles, keyed by its address.
 *   - A map either completes or is rolled back entirely; an unmap either
 *     completes or maps back what it had unmapped. Either way the error
 *     reported is the one that caused the rollback.
 *   - A handle the driver would not release is kept and retried by later
 *     map/unmap calls (and at close), so a transient error leaks nothing.
 * The backend table's entries run in the device's primary context
 * (GM_CUDA_IN_CTX); gm_cuda_vmm_supported needs no context.
 * Must not: call into the allocator, take the GIL, or abort.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "cuda_internal.h"

static void fill_prop(CUmemAllocationProp *prop, int device) {
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = device;
}

int gm_cuda_vmm_supported(gm_cuda_t *c, int device) {
    if (device < 0 || device >= c->n_devices)
        return 0;
    pthread_mutex_lock(&c->lock);
    int known = c->vmm[device];
    pthread_mutex_unlock(&c->lock);
    if (known >= 0)
        return known;
    CUdevice dev;
    int v = 0;
    CUresult r = c->p_cuDeviceGet(&dev, device);
    if (r != CUDA_SUCCESS)
        return gm_cuda_fail(c, "cuDeviceGet", r);
    r = c->p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    if (r != CUDA_SUCCESS)
        return gm_cuda_fail(c, "cuDeviceGetAttribute", r); /* an error is not "unsupported" */
    pthread_mutex_lock(&c->lock);
    c->vmm[device] = v ? 1 : 0;
    pthread_mutex_unlock(&c->lock);
    return v ? 1 : 0;
}

static int do_granularity(gm_cuda_t *c, int device, size_t *out) {
    CUmemAllocationProp prop;
    fill_prop(&prop, device);
    size_t g = 0;
    CUresult r = c->p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS)
        return gm_cuda_fail(c, "cuMemGetAllocationGranularity", r);
    if (g == 0 || (g & (g - 1)))
        return GM_ENOTSUP;
    *out = g;
    return GM_OK;
}

int gm_cuda_vmm_granularity(void *ctx, int device, size_t *out) {
    gm_cuda_t *c = ctx;
    int supported = gm_cuda_vmm_supported(c, device);
    if (supported < 0)
        return supported;
    if (!supported)
        return gm_cuda_set_error(GM_ENOTSUP, CUDA_ERROR_NOT_SUPPORTED,
                                 "device %d does not support virtual memory management", device);
    GM_CUDA_IN_CTX(c, device, do_granularity(c, device, out));
}

static int do_reserve(gm_cuda_t *c, size_t size, size_t align, uintptr_t *out) {
    CUdeviceptr p = 0;
    CUresult r = c->p_cuMemAddressReserve(&p, size, align, 0, 0);
    if (r != CUDA_SUCCESS)
        return gm_cuda_fail(c, "cuMemAddressReserve", r);
    *out = (uintptr_t)p;
    return GM_OK;
}

int gm_cuda_va_reserve(void *ctx, int device, size_t size, size_t align, uintptr_t *out) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, do_reserve(c, size, align, out));
}

int gm_cuda_va_free(void *ctx, int device, uintptr_t va, size_t size) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, gm_cuda_ok_or(c, c->p_cuMemAddressFree((CUdeviceptr)va, size),
                                            "cuMemAddressFree"));
}

/* Release a physical handle; a handle the driver would not release is kept
 * and retried by later map/unmap calls, so a transient error leaks nothing. */
static int release_handle(gm_cuda_t *c, CUmemGenericAllocationHandle h) {
    CUresult r = c->p_cuMemRelease(h);
    if (r == CUDA_SUCCESS)
        return GM_OK;
    int rc = gm_cuda_fail(c, "cuMemRelease", r);
    pthread_mutex_lock(&c->lock);
    if (c->n_unreleased < (int)(sizeof c->unreleased / sizeof c->unreleased[0]))
        c->unreleased[c->n_unreleased++] = h;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void gm_cuda_retry_releases(gm_cuda_t *c) {
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->n_unreleased;) {
        if (c->p_cuMemRelease(c->unreleased[i]) == CUDA_SUCCESS)
            c->unreleased[i] = c->unreleased[--c->n_unreleased];
        else
            i++;
    }
    pthread_mutex_unlock(&c->lock);
}

static int set_access(gm_cuda_t *c, int device, uintptr_t va, size_t size) {
    CUmemAccessDesc desc;
    memset(&desc, 0, sizeof desc);
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = c->p_cuMemSetAccess((CUdeviceptr)va, size, &desc, 1);
    return r == CUDA_SUCCESS ? GM_OK : gm_cuda_fail(c, "cuMemSetAccess", r);
}

static uintptr_t handle_of(gm_cuda_t *c, uintptr_t at) {
    uintptr_t h = 0;
    pthread_mutex_lock(&c->lock);
    gm_ptrmap_get(&c->handles, at, &h);
    pthread_mutex_unlock(&c->lock);
    return h;
}

/* Release the handles of granules [va, va + n*g), which are unmapped. */
static int release_granules(gm_cuda_t *c, uintptr_t va, size_t n, size_t g) {
    int first = GM_OK;
    for (size_t i = 0; i < n; i++) {
        uintptr_t h = 0;
        pthread_mutex_lock(&c->lock);
        int found = gm_ptrmap_del(&c->handles, va + i * g, &h);
        pthread_mutex_unlock(&c->lock);
        if (found) {
            int rc = release_handle(c, (CUmemGenericAllocationHandle)h);
            if (rc != GM_OK && first == GM_OK)
                first = rc;
        }
    }
    gm_cuda_retry_releases(c);
    return first;
}

/* Unmap granules [va, va + n*g) all or nothing: if the driver refuses one,
 * the granules already unmapped are mapped again with their handles (their
 * contents do not matter: only free memory is unmapped), so the allocator's
 * view, "nothing changed", stays true. Then the handles are released. */
static int unmap_granules(gm_cuda_t *c, int device, uintptr_t va, size_t n, size_t g) {
    gm_cuda_retry_releases(c);
    for (size_t i = 0; i < n; i++) {
        CUresult r = c->p_cuMemUnmap((CUdeviceptr)(va + i * g), g);
        if (r == CUDA_SUCCESS)
            continue;
        int rc = gm_cuda_fail(c, "cuMemUnmap", r);
        gm_cuda_error_state_t saved;
        gm_cuda_error_save(&saved);
        for (size_t j = 0; j < i; j++) {
            uintptr_t at = va + j * g;
            if (c->p_cuMemMap((CUdeviceptr)at, g, 0, handle_of(c, at), 0) == CUDA_SUCCESS)
                set_access(c, device, at, g);
        }
        gm_cuda_error_restore(&saved);
        return rc;
    }
    return release_granules(c, va, n, g);
}

static int do_map(gm_cuda_t *c, int device, uintptr_t va, size_t size) {
    size_t g = 0;
    int rc = do_granularity(c, device, &g);
    if (rc)
        return rc;
    if (size % g || va % g)
        return gm_cuda_set_error(GM_EINVAL, CUDA_ERROR_INVALID_VALUE,
                                 "map of a range not aligned to the granularity");
    gm_cuda_retry_releases(c);
    CUmemAllocationProp prop;
    fill_prop(&prop, device);
    size_t n = size / g, done = 0;
    for (; done < n; done++) {
        uintptr_t at = va + done * g;
        CUmemGenericAllocationHandle h = 0;
        CUresult r = c->p_cuMemCreate(&h, g, &prop, 0);
        if (r != CUDA_SUCCESS) {
            rc = gm_cuda_fail(c, "cuMemCreate", r);
            break;
        }
        r = c->p_cuMemMap((CUdeviceptr)at, g, 0, h, 0);
        if (r != CUDA_SUCCESS) {
            rc = gm_cuda_fail(c, "cuMemMap", r);
            release_handle(c, h);
            break;
        }
        pthread_mutex_lock(&c->lock);
        int prc = gm_ptrmap_put(&c->handles, at, (uintptr_t)h);
        pthread_mutex_unlock(&c->lock);
        if (prc) {
            c->p_cuMemUnmap((CUdeviceptr)at, g);
            release_handle(c, h);
            rc = prc;
            break;
        }
    }
    if (rc == GM_OK)
        rc = set_access(c, device, va, size);
    if (rc != GM_OK) {
        /* Roll back: a map either completes or leaves nothing behind. */
        gm_cuda_error_state_t saved;
        gm_cuda_error_save(&saved);
        for (size_t i = 0; i < done; i++)
            c->p_cuMemUnmap((CUdeviceptr)(va + i * g), g);
        release_granules(c, va, done, g);
        gm_cuda_error_restore(&saved);
    }
    return rc;
}

int gm_cuda_map(void *ctx, int device, uintptr_t va, size_t size) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, do_map(c, device, va, size));
}

static int do_unmap(gm_cuda_t *c, int device, uintptr_t va, size_t size) {
    size_t g = 0;
    int rc = do_granularity(c, device, &g);
    if (rc)
        return rc;
    return unmap_granules(c, device, va, size / g, g);
}

int gm_cuda_unmap(void *ctx, int device, uintptr_t va, size_t size) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, do_unmap(c, device, va, size));
}
