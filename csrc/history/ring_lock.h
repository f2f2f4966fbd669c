/*
 * ring_lock.h - the per-device ring lock (Note [History locks] in
 * recorder.c): a spin lock, an atomic exchange to take it and a release
 * store to drop it; a waiter yields the CPU between tries. The hook takes
 * it for every event, uncontended except against a reader, where a
 * pthread mutex's unlock would be a second atomic read-modify-write.
 */
#ifndef GM_HISTORY_RING_LOCK_H
#define GM_HISTORY_RING_LOCK_H

#include <sched.h>
#include <stdatomic.h>

static inline void gm_ring_lock_take(atomic_int *l) {
    while (atomic_exchange_explicit(l, 1, memory_order_acquire))
        while (atomic_load_explicit(l, memory_order_relaxed))
            sched_yield();
}

static inline void gm_ring_lock_drop(atomic_int *l) {
    atomic_store_explicit(l, 0, memory_order_release);
}

#endif /* GM_HISTORY_RING_LOCK_H */
