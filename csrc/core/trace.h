/*
 * trace.h - the allocator's event hook: every alloc, free, segment change
 * and out-of-memory is reported, in torch's TraceEntry order and with
 * torch's values, to one hook (memory history, or a test's recorder).
 * The hook runs under the allocator lock (gm_alloc.h: gm_trace_fn).
 */
#ifndef GM_CORE_TRACE_H
#define GM_CORE_TRACE_H

#include "types.h"

static inline void gm_trace_unlocked(gm_alloc_t *a, gm_action_t act, uintptr_t addr,
                                     size_t size, uintptr_t stream, uint32_t ctx) {
    if (a->trace_fn)
        a->trace_fn(a->trace_arg, a->device, act, addr, size, stream, ctx);
}

/* An event about a block or segment of `pool`: none for the uncached pool,
 * whose memory torch never records (Note [Caching off] in malloc.c). */
static inline void gm_trace_pool_unlocked(gm_alloc_t *a, const gm_pool_t *pool, gm_action_t act,
                                          uintptr_t addr, size_t size, uintptr_t stream,
                                          uint32_t ctx) {
    if (a->trace_fn && !pool->uncounted)
        a->trace_fn(a->trace_arg, a->device, act, addr, size, stream, ctx);
}

/* The free_requested of live block b, whose requested size, stream and
 * context it reports; `at_once`: its free_completed follows in the same
 * call (gm_alloc_free_completes_at_once). No write while no hook is. */
static inline void gm_trace_free_requested_unlocked(gm_alloc_t *a, const gm_pool_t *pool,
                                                    uintptr_t addr, size_t size, uintptr_t stream,
                                                    uint32_t ctx, int at_once) {
    if (a->trace_fn && !pool->uncounted) {
        a->trace_free_at_once = at_once;
        a->trace_fn(a->trace_arg, a->device, GM_ACT_FREE_REQUESTED, addr, size, stream, ctx);
    }
}

#endif /* GM_CORE_TRACE_H */
