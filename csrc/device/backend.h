/*
 * backend.h - the one interface between the allocator core and a device.
 *
 * A backend is a table of function pointers plus an opaque context, in the
 * spirit of mimalloc's prim layer. The core never talks to CUDA, the
 * virtual device or the operating system in any other way.
 *
 * Rules every backend follows:
 *   - Each function returns 0 (GM_OK) or a negative GM_E* code and hands
 *     results back through out-parameters. Nothing aborts.
 *   - GM_EOOM means "the device refused for lack of memory"; the core then
 *     frees cached segments and retries. Any other error is passed up.
 *   - event_query returns GM_ENOTREADY for an event that has not completed:
 *     a normal answer, not an error.
 *   - A backend keeps its last native error text; last_error() returns it.
 *   - Backends are called with the allocator lock held. They must not call
 *     back into the allocator and must not take the GIL.
 * The core holds a backend to these rules without trusting it: every call
 * goes through core/devcall.h, where a positive or unknown code, or a
 * success that hands back no address, becomes GM_EDEVICE.
 * Addresses, streams and events are plain integers (uintptr_t): a stream is
 * the cudaStream_t value, 0 for the default stream.
 */
#ifndef GM_DEVICE_BACKEND_H
#define GM_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_backend {
    void *ctx;        /* immutable after init */
    const char *name; /* "virtual", "cuda" */

    /* Total and free bytes of the device (cuMemGetInfo). */
    int (*mem_get_info)(void *ctx, int device, size_t *free_bytes, size_t *total_bytes);

    /* A plain segment (cuMemAlloc). */
    int (*seg_alloc)(void *ctx, int device, size_t size, uintptr_t *out_ptr);
    int (*seg_free)(void *ctx, int device, uintptr_t ptr, size_t size);

    /* Events for cross-stream reuse. Created without timing. */
    int (*event_create)(void *ctx, int device, uintptr_t *out_event);
    int (*event_destroy)(void *ctx, int device, uintptr_t event);
    int (*event_record)(void *ctx, int device, uintptr_t event, uintptr_t stream);
    int (*event_query)(void *ctx, int device, uintptr_t event); /* 0 or GM_ENOTREADY */
    int (*event_synchronize)(void *ctx, int device, uintptr_t event);

    /* Virtual memory management for expandable segments. vmm_granularity
     * returns GM_ENOTSUP when the device has no VMM support; the core then
     * falls back to plain segments. map() backs [va, va+size) with physical
     * memory and grants access; unmap() undoes exactly that. size is a
     * multiple of the granularity. */
    int (*vmm_granularity)(void *ctx, int device, size_t *out_granularity);
    int (*va_reserve)(void *ctx, int device, size_t size, size_t alignment, uintptr_t *out_va);
    int (*va_free)(void *ctx, int device, uintptr_t va, size_t size);
    int (*map)(void *ctx, int device, uintptr_t va, size_t size);
    int (*unmap)(void *ctx, int device, uintptr_t va, size_t size);
    /* Wait for work on a stream before unmapping (unmap does not sync). */
    int (*stream_synchronize)(void *ctx, int device, uintptr_t stream);

    /* Text of the last native error, or "" if none. */
    const char *(*last_error)(void *ctx);

    /* Optional (NULL: not needed): exchange the calling thread's stream
     * capture mode, as cuThreadExchangeStreamCaptureMode does (*mode in,
     * the previous mode out; GM_CAPTURE_MODE_*). While a private pool is
     * allocating, a CUDA graph may be capturing, and a device allocation
     * in the default (global) mode would invalidate the capture: the core
     * switches to relaxed around seg_alloc and map then, as torch's
     * cudaMallocMaybeCapturing does. */
    int (*exchange_capture_mode)(void *ctx, int *mode);

    /* Optional (NULL: not needed): the core handed [ptr, ptr+size) out.
     * Only a simulated device wants to know: its driver gives a small
     * block a kernel output's value (Note [Blocks handed out] in
     * simgpu/driver/fakecuda_handout.c). Nothing is returned: the block
     * is the caller's whatever the device does. */
    void (*block_handed_out)(void *ctx, int device, uintptr_t ptr, size_t size);
} gm_backend_t;

/* CUstreamCaptureMode's values. */
enum { GM_CAPTURE_MODE_GLOBAL = 0, GM_CAPTURE_MODE_THREAD_LOCAL = 1, GM_CAPTURE_MODE_RELAXED = 2 };

#ifdef __cplusplus
}
#endif
#endif /* GM_DEVICE_BACKEND_H */
