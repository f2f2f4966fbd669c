/*
 * devcall.h - every call the core makes to its device, with the backend
 * contract (device/backend.h) enforced where the answer enters the core.
 *
 * A backend may come from another extension (Allocator(device_backend=...))
 * and may break the contract: return a positive or unknown code, report
 * success without an address, leave a function pointer NULL. The core
 * trusts only what these wrappers hand back:
 *   - the result is 0 or a known negative GM_E* code; anything else becomes
 *     GM_EDEVICE (the backend's last_error() still says what happened);
 *   - a success that hands back no address (seg_alloc, va_reserve) or a
 *     granularity that is not a power of two is GM_EDEVICE;
 *   - a NULL function is GM_ENOTSUP (last_error: "").
 * Must not: take a lock or touch allocator state; they are called with the
 * allocator lock held (a->be and a->device never change after creation).
 */
#ifndef GM_CORE_DEVCALL_H
#define GM_CORE_DEVCALL_H

#include "types.h"

/* 0 or a known GM_E* code; anything else a backend returns is a device error. */
static inline int gm_dev_rc(int rc) { return gm_is_code(rc) ? rc : GM_EDEVICE; }

#define GM_DEV_CALL(a, fn, ...) \
    ((a)->be->fn ? gm_dev_rc((a)->be->fn((a)->be->ctx, (a)->device, __VA_ARGS__)) : GM_ENOTSUP)

static inline int gm_dev_mem_get_info(gm_alloc_t *a, size_t *free_bytes, size_t *total) {
    *free_bytes = *total = 0;
    return GM_DEV_CALL(a, mem_get_info, free_bytes, total);
}

/* While a private pool is allocating (a capture may be underway), device
 * allocations run in relaxed capture mode (backend.h); 1 if the mode was
 * switched and *saved holds the thread's previous one. */
static inline int gm_dev_capture_relax(gm_alloc_t *a, int *saved) {
    if (!a->n_allocating || !a->be->exchange_capture_mode)
        return 0;
    *saved = GM_CAPTURE_MODE_RELAXED;
    return a->be->exchange_capture_mode(a->be->ctx, saved) == GM_OK;
}

static inline void gm_dev_capture_restore(gm_alloc_t *a, int relaxed, int saved) {
    if (relaxed)
        a->be->exchange_capture_mode(a->be->ctx, &saved);
}

/* Optional: only a simulated device's backend has it (backend.h). */
static inline void gm_dev_block_handed_out(gm_alloc_t *a, uintptr_t ptr, size_t size) {
    if (a->be->block_handed_out)
        a->be->block_handed_out(a->be->ctx, a->device, ptr, size);
}

static inline int gm_dev_seg_alloc(gm_alloc_t *a, size_t size, uintptr_t *ptr) {
    *ptr = 0;
    int saved = 0, relaxed = gm_dev_capture_relax(a, &saved);
    int rc = GM_DEV_CALL(a, seg_alloc, size, ptr);
    gm_dev_capture_restore(a, relaxed, saved);
    return rc == GM_OK && !*ptr ? GM_EDEVICE : rc;
}

static inline int gm_dev_seg_free(gm_alloc_t *a, uintptr_t ptr, size_t size) {
    return GM_DEV_CALL(a, seg_free, ptr, size);
}

static inline int gm_dev_event_create(gm_alloc_t *a, uintptr_t *event) {
    *event = 0;
    return GM_DEV_CALL(a, event_create, event);
}

static inline int gm_dev_event_destroy(gm_alloc_t *a, uintptr_t event) {
    return GM_DEV_CALL(a, event_destroy, event);
}

/* The calls below marked "not while capturing" are made only when
 * gm_capture_underway() is false (Note [Capture-safe paths] in release.c);
 * debug builds check it. */
#define GM_NOT_CAPTURING(a) GM_ASSERT(!gm_capture_underway(a), "a call a CUDA graph capture forbids")

/* Not while capturing. */
static inline int gm_dev_event_record(gm_alloc_t *a, uintptr_t event, uintptr_t stream) {
    GM_NOT_CAPTURING(a);
    return GM_DEV_CALL(a, event_record, event, stream);
}

/* 0 (complete), GM_ENOTREADY, or an error. Not while capturing. */
static inline int gm_dev_event_query(gm_alloc_t *a, uintptr_t event) {
    GM_NOT_CAPTURING(a);
    return GM_DEV_CALL(a, event_query, event);
}

/* Not while capturing. */
static inline int gm_dev_event_synchronize(gm_alloc_t *a, uintptr_t event) {
    GM_NOT_CAPTURING(a);
    return GM_DEV_CALL(a, event_synchronize, event);
}

static inline int gm_dev_va_reserve(gm_alloc_t *a, size_t size, size_t align, uintptr_t *va) {
    *va = 0;
    int rc = GM_DEV_CALL(a, va_reserve, size, align, va);
    return rc == GM_OK && !*va ? GM_EDEVICE : rc;
}

static inline int gm_dev_va_free(gm_alloc_t *a, uintptr_t va, size_t size) {
    return GM_DEV_CALL(a, va_free, va, size);
}

static inline int gm_dev_map(gm_alloc_t *a, uintptr_t va, size_t size) {
    int saved = 0, relaxed = gm_dev_capture_relax(a, &saved);
    int rc = GM_DEV_CALL(a, map, va, size);
    gm_dev_capture_restore(a, relaxed, saved);
    return rc;
}

static inline int gm_dev_unmap(gm_alloc_t *a, uintptr_t va, size_t size) {
    return GM_DEV_CALL(a, unmap, va, size);
}

/* Not while capturing. */
static inline int gm_dev_stream_synchronize(gm_alloc_t *a, uintptr_t stream) {
    GM_NOT_CAPTURING(a);
    return GM_DEV_CALL(a, stream_synchronize, stream);
}

/* Before the allocator exists (gm_alloc_create): the VMM granularity, or
 * GM_ENOTSUP when the device has none. */
static inline int gm_dev_granularity(const gm_backend_t *be, int device, size_t *g) {
    *g = 0;
    if (!be->vmm_granularity || !be->va_reserve || !be->va_free || !be->map || !be->unmap)
        return GM_ENOTSUP;
    int rc = be->vmm_granularity(be->ctx, device, g);
    if (!gm_is_code(rc) || (rc == GM_OK && (!*g || (*g & (*g - 1)))))
        return GM_EDEVICE;
    return rc;
}

/* The backend's text for its last error, never NULL. */
static inline const char *gm_dev_last_error(const gm_backend_t *be) {
    const char *e = be->last_error ? be->last_error(be->ctx) : NULL;
    return e ? e : "";
}

#undef GM_DEV_CALL
#undef GM_NOT_CAPTURING
#endif /* GM_CORE_DEVCALL_H */
