/*
 * cuda_backend.c - the CUDA driver backend (see cuda_backend.h).
 *
 * Rules it follows (CUDA driver API semantics):
 *   - The driver is dlopen'ed; every entry point is looked up by its
 *     versioned name (cuMemAlloc_v2, ...). cuGetProcAddress is not used.
 *   - Work happens in the device's primary context (the one the CUDA
 *     runtime, and so torch, uses), retained once per device. A thread with
 *     no current context gets the primary context set, as the runtime would;
 *     a thread whose current context is another one gets the primary context
 *     pushed for the call and popped afterwards, so the caller's context is
 *     never changed behind its back.
 *   - Every failed call records its CUresult and text (cuGetErrorName /
 *     cuGetErrorString) in thread-local storage; CUDA_ERROR_OUT_OF_MEMORY
 *     becomes GM_EOOM (the allocator frees its cache and retries),
 *     CUDA_ERROR_NOT_READY becomes GM_ENOTREADY (a normal answer).
 *   - Expandable segments map one physical handle per granule (cuMemCreate)
 *     so any granule can be unmapped and released on its own; a map either
 *     completes or is rolled back entirely.
 * Must not: call into the allocator, take the GIL, or abort.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cuda_backend.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GM_HAVE_CUDA_H
#include <cuda.h>
#else
#include "cuda_decls.h"
#endif

#include "../base/ptrmap.h"

#define GM_CUDA_MAX_DEVICES 64

#define DRIVER_FUNCS(X)                                                        \
    X(cuInit)                                                                  \
    X(cuDriverGetVersion)                                                      \
    X(cuDeviceGetCount)                                                        \
    X(cuDeviceGet)                                                             \
    X(cuDeviceGetAttribute)                                                    \
    X(cuDevicePrimaryCtxRetain)                                                \
    X(cuDevicePrimaryCtxRelease_v2)                                            \
    X(cuCtxGetCurrent)                                                         \
    X(cuCtxSetCurrent)                                                         \
    X(cuCtxPushCurrent_v2)                                                     \
    X(cuCtxPopCurrent_v2)                                                      \
    X(cuMemAlloc_v2)                                                           \
    X(cuMemFree_v2)                                                            \
    X(cuMemGetInfo_v2)                                                         \
    X(cuEventCreate)                                                           \
    X(cuEventDestroy_v2)                                                       \
    X(cuEventRecord)                                                           \
    X(cuEventQuery)                                                            \
    X(cuEventSynchronize)                                                      \
    X(cuStreamSynchronize)                                                     \
    X(cuMemAddressReserve)                                                     \
    X(cuMemAddressFree)                                                        \
    X(cuMemCreate)                                                             \
    X(cuMemRelease)                                                            \
    X(cuMemMap)                                                                \
    X(cuMemUnmap)                                                              \
    X(cuMemSetAccess)                                                          \
    X(cuMemGetAllocationGranularity)                                           \
    X(cuGetErrorName)                                                          \
    X(cuGetErrorString)

struct gm_cuda {
    gm_backend_t backend; /* immutable after open */
    void *lib;            /* immutable after open */
    char path[512];       /* immutable after open */
#define X(name) __typeof__(name) *p_##name;
    DRIVER_FUNCS(X) /* immutable after open */
#undef X
    pthread_mutex_t lock;
    int n_devices;                            /* immutable after open */
    CUcontext primary[GM_CUDA_MAX_DEVICES];   /* protected by: lock */
    int vmm[GM_CUDA_MAX_DEVICES];             /* protected by: lock; -1 unknown */
    gm_ptrmap_t handles;                      /* granule va -> handle; protected by: lock */
    CUmemGenericAllocationHandle unreleased[64]; /* releases to retry; protected by: lock */
    int n_unreleased;                         /* protected by: lock */
};

static _Thread_local int tls_result;
static _Thread_local char tls_error[256];

int gm_cuda_last_result(void) { return tls_result; }

static int fail(gm_cuda_t *c, const char *fn, CUresult r) {
    const char *name = NULL, *text = NULL;
    if (c && c->p_cuGetErrorName)
        c->p_cuGetErrorName(r, &name);
    if (c && c->p_cuGetErrorString)
        c->p_cuGetErrorString(r, &text);
    tls_result = (int)r;
    snprintf(tls_error, sizeof tls_error, "%s failed: %s (%d): %s", fn, name ? name : "CUDA_ERROR",
             (int)r, text ? text : "unknown error");
    switch ((int)r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
        return GM_EOOM;
    case CUDA_ERROR_NOT_READY:
        return GM_ENOTREADY;
    case CUDA_ERROR_NOT_SUPPORTED:
        return GM_ENOTSUP;
    default:
        return GM_EDEVICE;
    }
}

#define CHECK(c, call, fn)                                                     \
    do {                                                                       \
        CUresult r_ = (call);                                                  \
        if (r_ != CUDA_SUCCESS)                                                \
            return fail((c), (fn), r_);                                        \
    } while (0)

/* ------------------------------------------------------------ contexts */

typedef struct ctx_guard {
    int pushed;
} ctx_guard_t;

static int primary_ctx(gm_cuda_t *c, int device, CUcontext *out) {
    if (device < 0 || device >= c->n_devices) {
        tls_result = 0;
        snprintf(tls_error, sizeof tls_error, "invalid device ordinal %d (%d devices)", device,
                 c->n_devices);
        return GM_EINVAL;
    }
    pthread_mutex_lock(&c->lock);
    if (!c->primary[device]) {
        CUdevice dev;
        CUresult r = c->p_cuDeviceGet(&dev, device);
        if (r == CUDA_SUCCESS)
            r = c->p_cuDevicePrimaryCtxRetain(&c->primary[device], dev);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&c->lock);
            return fail(c, "cuDevicePrimaryCtxRetain", r);
        }
    }
    *out = c->primary[device];
    pthread_mutex_unlock(&c->lock);
    return GM_OK;
}

/* Make the device's primary context current for one call. */
static int enter(gm_cuda_t *c, int device, ctx_guard_t *g) {
    g->pushed = 0;
    CUcontext want = NULL, cur = NULL;
    int rc = primary_ctx(c, device, &want);
    if (rc)
        return rc;
    CHECK(c, c->p_cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
    if (cur == want)
        return GM_OK;
    if (!cur) {
        CHECK(c, c->p_cuCtxSetCurrent(want), "cuCtxSetCurrent");
        return GM_OK;
    }
    CHECK(c, c->p_cuCtxPushCurrent_v2(want), "cuCtxPushCurrent");
    g->pushed = 1;
    return GM_OK;
}

static int leave(gm_cuda_t *c, ctx_guard_t *g, int rc) {
    if (g->pushed) {
        CUcontext popped;
        CUresult r = c->p_cuCtxPopCurrent_v2(&popped);
        if (r != CUDA_SUCCESS && rc == GM_OK)
            return fail(c, "cuCtxPopCurrent", r);
    }
    return rc;
}

/* Runs `body` (an expression yielding a gm code) inside the primary ctx. */
#define IN_CTX(c, device, body)                                                \
    do {                                                                       \
        ctx_guard_t g_;                                                        \
        int rc_ = enter((c), (device), &g_);                                   \
        if (rc_)                                                               \
            return rc_;                                                        \
        rc_ = (body);                                                          \
        return leave((c), &g_, rc_);                                           \
    } while (0)

static int ok_or(gm_cuda_t *c, CUresult r, const char *fn) {
    return r == CUDA_SUCCESS ? GM_OK : fail(c, fn, r);
}

/* ------------------------------------------------------------ backend */

static int cu_mem_get_info(void *ctx, int device, size_t *free_b, size_t *total) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, ok_or(c, c->p_cuMemGetInfo_v2(free_b, total), "cuMemGetInfo_v2"));
}

static int do_alloc(gm_cuda_t *c, size_t size, uintptr_t *out) {
    CUdeviceptr p = 0;
    CUresult r = c->p_cuMemAlloc_v2(&p, size);
    if (r != CUDA_SUCCESS)
        return fail(c, "cuMemAlloc_v2", r);
    *out = (uintptr_t)p;
    return GM_OK;
}

static int cu_seg_alloc(void *ctx, int device, size_t size, uintptr_t *out) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, do_alloc(c, size, out));
}

static int cu_seg_free(void *ctx, int device, uintptr_t ptr, size_t size) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, ok_or(c, c->p_cuMemFree_v2((CUdeviceptr)ptr), "cuMemFree_v2"));
}

static int do_event_create(gm_cuda_t *c, uintptr_t *out) {
    CUevent ev = NULL;
    CUresult r = c->p_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS)
        return fail(c, "cuEventCreate", r);
    *out = (uintptr_t)ev;
    return GM_OK;
}

static int cu_event_create(void *ctx, int device, uintptr_t *out) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, do_event_create(c, out));
}

static int cu_event_destroy(void *ctx, int device, uintptr_t ev) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, ok_or(c, c->p_cuEventDestroy_v2((CUevent)ev), "cuEventDestroy_v2"));
}

static int cu_event_record(void *ctx, int device, uintptr_t ev, uintptr_t stream) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device,
           ok_or(c, c->p_cuEventRecord((CUevent)ev, (CUstream)stream), "cuEventRecord"));
}

static int do_event_query(gm_cuda_t *c, uintptr_t ev) {
    CUresult r = c->p_cuEventQuery((CUevent)ev);
    if (r == CUDA_ERROR_NOT_READY)
        return GM_ENOTREADY; /* not an error: keep no error state */
    return ok_or(c, r, "cuEventQuery");
}

static int cu_event_query(void *ctx, int device, uintptr_t ev) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, do_event_query(c, ev));
}

static int cu_event_synchronize(void *ctx, int device, uintptr_t ev) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, ok_or(c, c->p_cuEventSynchronize((CUevent)ev), "cuEventSynchronize"));
}

static int cu_stream_synchronize(void *ctx, int device, uintptr_t stream) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device,
           ok_or(c, c->p_cuStreamSynchronize((CUstream)stream), "cuStreamSynchronize"));
}

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
        return fail(c, "cuDeviceGet", r);
    r = c->p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    if (r != CUDA_SUCCESS)
        return fail(c, "cuDeviceGetAttribute", r); /* an error is not "unsupported" */
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
        return fail(c, "cuMemGetAllocationGranularity", r);
    if (g == 0 || (g & (g - 1)))
        return GM_ENOTSUP;
    *out = g;
    return GM_OK;
}

static int cu_vmm_granularity(void *ctx, int device, size_t *out) {
    gm_cuda_t *c = ctx;
    int supported = gm_cuda_vmm_supported(c, device);
    if (supported < 0)
        return supported;
    if (!supported) {
        tls_result = CUDA_ERROR_NOT_SUPPORTED;
        snprintf(tls_error, sizeof tls_error,
                 "device %d does not support virtual memory management", device);
        return GM_ENOTSUP;
    }
    IN_CTX(c, device, do_granularity(c, device, out));
}

static int do_reserve(gm_cuda_t *c, size_t size, size_t align, uintptr_t *out) {
    CUdeviceptr p = 0;
    CUresult r = c->p_cuMemAddressReserve(&p, size, align, 0, 0);
    if (r != CUDA_SUCCESS)
        return fail(c, "cuMemAddressReserve", r);
    *out = (uintptr_t)p;
    return GM_OK;
}

static int cu_va_reserve(void *ctx, int device, size_t size, size_t align, uintptr_t *out) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, do_reserve(c, size, align, out));
}

static int cu_va_free(void *ctx, int device, uintptr_t va, size_t size) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, ok_or(c, c->p_cuMemAddressFree((CUdeviceptr)va, size), "cuMemAddressFree"));
}

/* Release a physical handle; a handle the driver would not release is kept
 * and retried by later map/unmap calls, so a transient error leaks nothing. */
static int release_handle(gm_cuda_t *c, CUmemGenericAllocationHandle h) {
    CUresult r = c->p_cuMemRelease(h);
    if (r == CUDA_SUCCESS)
        return GM_OK;
    int rc = fail(c, "cuMemRelease", r);
    pthread_mutex_lock(&c->lock);
    if (c->n_unreleased < (int)(sizeof c->unreleased / sizeof c->unreleased[0]))
        c->unreleased[c->n_unreleased++] = h;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static void retry_releases(gm_cuda_t *c) {
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
    return r == CUDA_SUCCESS ? GM_OK : fail(c, "cuMemSetAccess", r);
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
    retry_releases(c);
    return first;
}

/* Unmap granules [va, va + n*g) all or nothing: if the driver refuses one,
 * the granules already unmapped are mapped again with their handles (their
 * contents do not matter: only free memory is unmapped), so the allocator's
 * view, "nothing changed", stays true. Then the handles are released. */
static int unmap_granules(gm_cuda_t *c, int device, uintptr_t va, size_t n, size_t g) {
    retry_releases(c);
    for (size_t i = 0; i < n; i++) {
        CUresult r = c->p_cuMemUnmap((CUdeviceptr)(va + i * g), g);
        if (r == CUDA_SUCCESS)
            continue;
        int rc = fail(c, "cuMemUnmap", r);
        int saved = tls_result;
        char text[sizeof tls_error];
        memcpy(text, tls_error, sizeof text);
        for (size_t j = 0; j < i; j++) {
            uintptr_t at = va + j * g;
            if (c->p_cuMemMap((CUdeviceptr)at, g, 0, handle_of(c, at), 0) == CUDA_SUCCESS)
                set_access(c, device, at, g);
        }
        tls_result = saved;
        memcpy(tls_error, text, sizeof text);
        return rc;
    }
    return release_granules(c, va, n, g);
}

static int do_map(gm_cuda_t *c, int device, uintptr_t va, size_t size) {
    size_t g = 0;
    int rc = do_granularity(c, device, &g);
    if (rc)
        return rc;
    if (size % g || va % g) {
        tls_result = CUDA_ERROR_INVALID_VALUE;
        snprintf(tls_error, sizeof tls_error, "map of a range not aligned to the granularity");
        return GM_EINVAL;
    }
    retry_releases(c);
    CUmemAllocationProp prop;
    fill_prop(&prop, device);
    size_t n = size / g, done = 0;
    for (; done < n; done++) {
        uintptr_t at = va + done * g;
        CUmemGenericAllocationHandle h = 0;
        CUresult r = c->p_cuMemCreate(&h, g, &prop, 0);
        if (r != CUDA_SUCCESS) {
            rc = fail(c, "cuMemCreate", r);
            break;
        }
        r = c->p_cuMemMap((CUdeviceptr)at, g, 0, h, 0);
        if (r != CUDA_SUCCESS) {
            rc = fail(c, "cuMemMap", r);
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
        int saved = tls_result;
        char text[sizeof tls_error];
        memcpy(text, tls_error, sizeof text);
        for (size_t i = 0; i < done; i++)
            c->p_cuMemUnmap((CUdeviceptr)(va + i * g), g);
        release_granules(c, va, done, g);
        tls_result = saved;
        memcpy(tls_error, text, sizeof text);
    }
    return rc;
}

static int cu_map(void *ctx, int device, uintptr_t va, size_t size) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, do_map(c, device, va, size));
}

static int do_unmap(gm_cuda_t *c, int device, uintptr_t va, size_t size) {
    size_t g = 0;
    int rc = do_granularity(c, device, &g);
    if (rc)
        return rc;
    return unmap_granules(c, device, va, size / g, g);
}

static int cu_unmap(void *ctx, int device, uintptr_t va, size_t size) {
    gm_cuda_t *c = ctx;
    IN_CTX(c, device, do_unmap(c, device, va, size));
}

static const char *cu_last_error(void *ctx) { return tls_error; }

/* ------------------------------------------------------------ lifecycle */

int gm_cuda_open(const char *path, gm_cuda_t **out, char *err, size_t errlen) {
    if (!path || !path[0])
        path = getenv("GPUMEM_LIBCUDA");
    if (!path || !path[0])
        path = "libcuda.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(err, errlen,
                 "cannot load the CUDA driver library %s (%s); gpumem's simulated device is "
                 "still available",
                 path, why ? why : "not found");
        return GM_EDEVICE;
    }
    gm_cuda_t *c = calloc(1, sizeof *c);
    if (!c || gm_ptrmap_init(&c->handles, 256)) {
        free(c);
        snprintf(err, errlen, "out of host memory");
        return GM_ENOMEM;
    }
    c->lib = lib;
    snprintf(c->path, sizeof c->path, "%s", path);
#define X(name)                                                                \
    c->p_##name = (__typeof__(name) *)dlsym(lib, #name);                       \
    if (!c->p_##name) {                                                        \
        snprintf(err, errlen,                                                  \
                 "the CUDA driver library %s has no %s; it is too old or not " \
                 "NVIDIA's libcuda (gpumem's simulated device is still "       \
                 "available)",                                                 \
                 path, #name);                                                 \
        gm_ptrmap_free(&c->handles);                                           \
        free(c);                                                               \
        return GM_EDEVICE;                                                     \
    }
    DRIVER_FUNCS(X)
#undef X
    CUresult r = c->p_cuInit(0);
    const char *step = "cuInit";
    int n = 0;
    if (r == CUDA_SUCCESS) {
        step = "cuDeviceGetCount";
        r = c->p_cuDeviceGetCount(&n);
    }
    if (r != CUDA_SUCCESS) {
        fail(c, step, r);
        snprintf(err, errlen, "the CUDA driver (%s) did not initialise: %s", path, tls_error);
        gm_ptrmap_free(&c->handles);
        free(c);
        return GM_EDEVICE;
    }
    c->n_devices = n > GM_CUDA_MAX_DEVICES ? GM_CUDA_MAX_DEVICES : n;
    for (int i = 0; i < GM_CUDA_MAX_DEVICES; i++)
        c->vmm[i] = -1;
    pthread_mutex_init(&c->lock, NULL);
    gm_backend_t *b = &c->backend;
    b->ctx = c;
    b->name = "cuda";
    b->mem_get_info = cu_mem_get_info;
    b->seg_alloc = cu_seg_alloc;
    b->seg_free = cu_seg_free;
    b->event_create = cu_event_create;
    b->event_destroy = cu_event_destroy;
    b->event_record = cu_event_record;
    b->event_query = cu_event_query;
    b->event_synchronize = cu_event_synchronize;
    b->vmm_granularity = cu_vmm_granularity;
    b->va_reserve = cu_va_reserve;
    b->va_free = cu_va_free;
    b->map = cu_map;
    b->unmap = cu_unmap;
    b->stream_synchronize = cu_stream_synchronize;
    b->last_error = cu_last_error;
    *out = c;
    return GM_OK;
}

void gm_cuda_close(gm_cuda_t *c) {
    if (!c)
        return;
    retry_releases(c);
    for (int i = 0; i < c->n_devices; i++) {
        if (!c->primary[i])
            continue;
        CUdevice dev;
        if (c->p_cuDeviceGet(&dev, i) == CUDA_SUCCESS)
            c->p_cuDevicePrimaryCtxRelease_v2(dev);
    }
    gm_ptrmap_free(&c->handles);
    pthread_mutex_destroy(&c->lock);
    /* The library stays loaded: other code (the CUDA runtime) may use it. */
    free(c);
}

const gm_backend_t *gm_cuda_backend(gm_cuda_t *c) { return &c->backend; }

int gm_cuda_device_count(gm_cuda_t *c, int *count) {
    *count = c->n_devices;
    return GM_OK;
}

const char *gm_cuda_path(const gm_cuda_t *c) { return c->path; }
