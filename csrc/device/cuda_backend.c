/*
 * cuda_backend.c - the CUDA driver backend (see cuda_backend.h): loading the
 * driver, plain memory, events and the backend table. Virtual memory
 * management for expandable segments is in cuda_vmm.c; the errors and the
 * primary-context guard that both use are in cuda_call.c, below both;
 * what the three share is declared in cuda_internal.h.
 *
 * Rules it follows (CUDA driver API semantics):
 *   - The driver is dlopen'ed; every entry point is looked up by its
 *     versioned name (cuMemAlloc_v2, ...). cuGetProcAddress is not used.
 *     cuThreadExchangeStreamCaptureMode is optional: without it the backend
 *     leaves exchange_capture_mode NULL (device allocations during a CUDA
 *     graph capture then fail as the driver says).
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
 * Must not: call into the allocator, take the GIL, or abort.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* ----------------------------------------------- plain memory, events */

static int cu_mem_get_info(void *ctx, int device, size_t *free_b, size_t *total) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device,
                   gm_cuda_ok_or(c, c->p_cuMemGetInfo_v2(free_b, total), "cuMemGetInfo_v2"));
}

static int do_alloc(gm_cuda_t *c, size_t size, uintptr_t *out) {
    CUdeviceptr p = 0;
    CUresult r = c->p_cuMemAlloc_v2(&p, size);
    if (r != CUDA_SUCCESS)
        return gm_cuda_fail(c, "cuMemAlloc_v2", r);
    *out = (uintptr_t)p;
    return GM_OK;
}

static int cu_seg_alloc(void *ctx, int device, size_t size, uintptr_t *out) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, do_alloc(c, size, out));
}

/* The simulator's driver only: see Note [Blocks handed out] in
 * simgpu/driver/fakecuda_handout.c. */
static void cu_block_handed_out(void *ctx, int device, uintptr_t ptr, size_t size) {
    (void)device;
    ((gm_cuda_t *)ctx)->p_fakecuda_block_handed_out((CUdeviceptr)ptr, size);
}

/* cuThreadExchangeStreamCaptureMode: per thread, no context needed. */
static int cu_exchange_capture_mode(void *ctx, int *mode) {
    gm_cuda_t *c = ctx;
    CUstreamCaptureMode m = (CUstreamCaptureMode)*mode;
    CUresult r = c->p_cuThreadExchangeStreamCaptureMode(&m);
    if (r != CUDA_SUCCESS)
        return gm_cuda_fail(c, "cuThreadExchangeStreamCaptureMode", r);
    *mode = (int)m;
    return GM_OK;
}

static int cu_seg_free(void *ctx, int device, uintptr_t ptr, size_t size) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device,
                   gm_cuda_ok_or(c, c->p_cuMemFree_v2((CUdeviceptr)ptr), "cuMemFree_v2"));
}

static int do_event_create(gm_cuda_t *c, uintptr_t *out) {
    CUevent ev = NULL;
    CUresult r = c->p_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS)
        return gm_cuda_fail(c, "cuEventCreate", r);
    *out = (uintptr_t)ev;
    return GM_OK;
}

static int cu_event_create(void *ctx, int device, uintptr_t *out) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, do_event_create(c, out));
}

static int cu_event_destroy(void *ctx, int device, uintptr_t ev) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device,
                   gm_cuda_ok_or(c, c->p_cuEventDestroy_v2((CUevent)ev), "cuEventDestroy_v2"));
}

static int cu_event_record(void *ctx, int device, uintptr_t ev, uintptr_t stream) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, gm_cuda_ok_or(c, c->p_cuEventRecord((CUevent)ev, (CUstream)stream),
                                            "cuEventRecord"));
}

static int do_event_query(gm_cuda_t *c, uintptr_t ev) {
    CUresult r = c->p_cuEventQuery((CUevent)ev);
    if (r == CUDA_ERROR_NOT_READY)
        return GM_ENOTREADY; /* not an error: keep no error state */
    return gm_cuda_ok_or(c, r, "cuEventQuery");
}

static int cu_event_query(void *ctx, int device, uintptr_t ev) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, do_event_query(c, ev));
}

static int cu_event_synchronize(void *ctx, int device, uintptr_t ev) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, gm_cuda_ok_or(c, c->p_cuEventSynchronize((CUevent)ev),
                                            "cuEventSynchronize"));
}

static int cu_stream_synchronize(void *ctx, int device, uintptr_t stream) {
    gm_cuda_t *c = ctx;
    GM_CUDA_IN_CTX(c, device, gm_cuda_ok_or(c, c->p_cuStreamSynchronize((CUstream)stream),
                                            "cuStreamSynchronize"));
}

static const char *cu_last_error(void *ctx) { return gm_cuda_last_error(); }

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
                 "cannot load the CUDA driver library %s (%s); gpumem's virtual device is "
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
                 "NVIDIA's libcuda (gpumem's virtual device is still "         \
                 "available)",                                                 \
                 path, #name);                                                 \
        gm_ptrmap_free(&c->handles);                                           \
        free(c);                                                               \
        return GM_EDEVICE;                                                     \
    }
    DRIVER_FUNCS(X)
#undef X
#define X(name) c->p_##name = (__typeof__(name) *)dlsym(lib, #name);
    OPTIONAL_DRIVER_FUNCS(X)
#undef X
    c->p_fakecuda_block_handed_out =
        (int (*)(CUdeviceptr, size_t))dlsym(lib, "fakecuda_block_handed_out");
    CUresult r = c->p_cuInit(0);
    const char *step = "cuInit";
    int n = 0;
    if (r == CUDA_SUCCESS) {
        step = "cuDeviceGetCount";
        r = c->p_cuDeviceGetCount(&n);
    }
    if (r != CUDA_SUCCESS) {
        gm_cuda_fail(c, step, r);
        snprintf(err, errlen, "the CUDA driver (%s) did not initialise: %s", path,
                 gm_cuda_last_error());
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
    if (c->p_cuThreadExchangeStreamCaptureMode)
        b->exchange_capture_mode = cu_exchange_capture_mode;
    b->event_create = cu_event_create;
    b->event_destroy = cu_event_destroy;
    b->event_record = cu_event_record;
    b->event_query = cu_event_query;
    b->event_synchronize = cu_event_synchronize;
    b->vmm_granularity = gm_cuda_vmm_granularity;
    b->va_reserve = gm_cuda_va_reserve;
    b->va_free = gm_cuda_va_free;
    b->map = gm_cuda_map;
    b->unmap = gm_cuda_unmap;
    b->stream_synchronize = cu_stream_synchronize;
    b->last_error = cu_last_error;
    if (c->p_fakecuda_block_handed_out)
        b->block_handed_out = cu_block_handed_out;
    *out = c;
    return GM_OK;
}

void gm_cuda_close(gm_cuda_t *c) {
    if (!c)
        return;
    gm_cuda_retry_releases(c);
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
