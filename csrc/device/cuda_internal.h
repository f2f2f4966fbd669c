/*
 * cuda_internal.h - what the files of the CUDA driver backend share
 * (cuda_backend.c: loading, plain memory, events, the backend table;
 * cuda_vmm.c: virtual memory management for expandable segments; below
 * both, cuda_call.c: errors and the primary-context guard). Private to
 * csrc/device/cuda_*.c: nothing else includes it.
 *
 * It holds the backend's state (struct gm_cuda) and the driver function
 * table, the per-thread error state (the last CUresult and its text, see
 * gm_cuda_fail) and the guard that runs a call in the device's primary
 * context (GM_CUDA_IN_CTX).
 * Invariants: the driver table is complete and immutable once gm_cuda_open
 * returns; every field of struct gm_cuda that changes after that is
 * protected by its lock, and no other gpumem lock is taken under it.
 * Must not: be included by anything but the CUDA backend's own files.
 */
#ifndef GM_DEVICE_CUDA_INTERNAL_H
#define GM_DEVICE_CUDA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef GM_HAVE_CUDA_H
#include <cuda.h>
#else
#include "cuda_decls.h"
#endif

#include "../base/ptrmap.h"
#include "cuda_backend.h"

#define GM_CUDA_MAX_DEVICES 64
#define GM_CUDA_ERROR_LEN 256 /* the longest error text kept, with its NUL */

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

/* Looked up too, but a driver without them still works (NULL then). */
#define OPTIONAL_DRIVER_FUNCS(X) X(cuThreadExchangeStreamCaptureMode)

struct gm_cuda {
    gm_backend_t backend; /* immutable after open */
    void *lib;            /* immutable after open */
    char path[512];       /* immutable after open */
#define X(name) __typeof__(name) *p_##name;
    DRIVER_FUNCS(X) /* immutable after open */
    OPTIONAL_DRIVER_FUNCS(X) /* immutable after open; may be NULL */
#undef X
    /* the simulator's driver only (Note [Blocks handed out]); may be NULL.
     * Not in OPTIONAL_DRIVER_FUNCS: NVIDIA's cuda.h, used when installed,
     * does not declare it for __typeof__. */
    int (*p_fakecuda_block_handed_out)(CUdeviceptr ptr, size_t n); /* immutable after open */
    pthread_mutex_t lock;
    int n_devices;                            /* immutable after open */
    CUcontext primary[GM_CUDA_MAX_DEVICES];   /* protected by: lock */
    int vmm[GM_CUDA_MAX_DEVICES];             /* protected by: lock; -1 unknown */
    gm_ptrmap_t handles;                      /* granule va -> handle; protected by: lock */
    CUmemGenericAllocationHandle unreleased[64]; /* releases to retry; protected by: lock */
    int n_unreleased;                         /* protected by: lock */
};

/* ---------------------------------------------------- errors (cuda_call.c) */

/* Record the failed call's CUresult and text for the calling thread and
 * return its GM_E* code (GM_EOOM, GM_ENOTREADY, GM_ENOTSUP or GM_EDEVICE). */
int gm_cuda_fail(gm_cuda_t *c, const char *fn, CUresult r);
/* GM_OK for CUDA_SUCCESS, else gm_cuda_fail(c, fn, r). */
int gm_cuda_ok_or(gm_cuda_t *c, CUresult r, const char *fn);
/* Return gm_cuda_fail(c, fn, r) from the calling function if `call` fails. */
#define GM_CUDA_CHECK(c, call, fn)                                             \
    do {                                                                       \
        CUresult r_ = (call);                                                  \
        if (r_ != CUDA_SUCCESS)                                                \
            return gm_cuda_fail((c), (fn), r_);                                \
    } while (0)
/* Record an error found by the backend itself (no failed driver call):
 * `result` as the CUresult, the formatted text; returns `code`. */
int gm_cuda_set_error(int code, int result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The calling thread's error state, kept across a rollback so that the
 * error reported is the one that caused it. */
typedef struct gm_cuda_error_state {
    int result;
    char text[GM_CUDA_ERROR_LEN];
} gm_cuda_error_state_t;
void gm_cuda_error_save(gm_cuda_error_state_t *out);
void gm_cuda_error_restore(const gm_cuda_error_state_t *saved);
/* The calling thread's last error text (the backend table's last_error). */
const char *gm_cuda_last_error(void);

/* -------------------------------------------------- contexts (cuda_call.c) */

typedef struct gm_cuda_guard {
    int pushed;
} gm_cuda_guard_t;

/* Make the device's primary context current for one call (see
 * cuda_backend.c's header), and undo that; gm_cuda_leave returns rc
 * unless popping the context failed while rc was GM_OK. */
int gm_cuda_enter(gm_cuda_t *c, int device, gm_cuda_guard_t *g);
int gm_cuda_leave(gm_cuda_t *c, gm_cuda_guard_t *g, int rc);

/* Returns `body` (an expression yielding a GM code) run inside the device's
 * primary context. */
#define GM_CUDA_IN_CTX(c, device, body)                                        \
    do {                                                                       \
        gm_cuda_guard_t g_;                                                    \
        int rc_ = gm_cuda_enter((c), (device), &g_);                           \
        if (rc_)                                                               \
            return rc_;                                                        \
        rc_ = (body);                                                          \
        return gm_cuda_leave((c), &g_, rc_);                                   \
    } while (0)

/* --------------------------------- virtual memory management (cuda_vmm.c) */

/* The backend table's VMM entries (backend.h). */
int gm_cuda_vmm_granularity(void *ctx, int device, size_t *out);
int gm_cuda_va_reserve(void *ctx, int device, size_t size, size_t align, uintptr_t *out);
int gm_cuda_va_free(void *ctx, int device, uintptr_t va, size_t size);
int gm_cuda_map(void *ctx, int device, uintptr_t va, size_t size);
int gm_cuda_unmap(void *ctx, int device, uintptr_t va, size_t size);
/* Retry releasing the physical handles the driver refused to release. */
void gm_cuda_retry_releases(gm_cuda_t *c);

#endif /* GM_DEVICE_CUDA_INTERNAL_H */
