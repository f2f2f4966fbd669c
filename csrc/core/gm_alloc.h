/*
 * gm_alloc.h - public interface of the caching allocator core (one device).
 *
 * The core follows PyTorch's CUDACachingAllocator policy: 512 B rounding,
 * a small pool (<= 1 MiB requests, 2 MiB segments) and a large pool
 * (20 MiB segments below 10 MiB, else rounded to 2 MiB), best fit with
 * splitting, coalescing on free, per-stream free lists, cross-stream reuse
 * deferred by events, free-cache-and-retry on OOM, and expandable segments.
 *
 * Pure C11: no CUDA or Python headers. It talks to a device only through
 * gm_backend_t. Every function is thread-safe (one allocator lock per
 * gm_alloc_t); none takes the GIL. Context ids (uint32_t) are opaque tags
 * supplied by callers (interned tracebacks); 0 means "no context".
 */
#ifndef GM_CORE_ALLOC_H
#define GM_CORE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "../base/errors.h"
#include "../base/format.h"
#include "../device/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GM_MIN_BLOCK_SIZE ((size_t)512)
#define GM_SMALL_SIZE ((size_t)1 << 20)       /* largest small request: 1 MiB */
#define GM_SMALL_BUFFER ((size_t)2 << 20)     /* small segment: 2 MiB */
#define GM_MIN_LARGE_ALLOC ((size_t)10 << 20) /* below this, 20 MiB segments */
#define GM_LARGE_BUFFER ((size_t)20 << 20)
#define GM_ROUND_LARGE ((size_t)2 << 20)
#define GM_ROUNDUP_INTERVALS 16 /* 1 MiB, 2 MiB, ... 32 GiB and above */
#define GM_MAX_REQUEST ((size_t)1 << 62)     /* larger requests are GM_EINVAL */

typedef struct gm_settings {
    int expandable_segments;             /* 0/1 */
    size_t max_split_size;               /* SIZE_MAX = unlimited (default) */
    double garbage_collection_threshold; /* 0 = off; (0, 1) otherwise */
    /* divisions per power-of-two interval starting at 1 MiB; 0/1 = off */
    uint32_t roundup_power2_divisions[GM_ROUNDUP_INTERVALS];
} gm_settings_t;

void gm_settings_default(gm_settings_t *s);

/* ---- size policy (torch's), for the allocator and for tools ---- */
/* The block size a request of `size` bytes gets under settings s: 512-byte
 * multiples, or roundup_power2_divisions where they apply. */
size_t gm_size_round(const gm_settings_t *s, size_t size);
/* 1 if a rounded size is served by the small pool, 0 for the large one. */
int gm_size_is_small(size_t rounded);
/* The size of the new segment a rounded request needs when nothing cached
 * fits (2 MiB small, 20 MiB below 10 MiB, else rounded up to 2 MiB). */
size_t gm_size_segment(size_t rounded);
/* 0 if valid, GM_EINVAL otherwise (msg says why). */
int gm_settings_validate(const gm_settings_t *s, char *msg, size_t msglen);

/* Stat types, in PyTorch's order. */
enum { GM_STAT_ALL = 0, GM_STAT_SMALL = 1, GM_STAT_LARGE = 2, GM_STAT_NTYPES = 3 };

typedef struct gm_stat {
    int64_t current, peak, allocated, freed;
} gm_stat_t;

typedef struct gm_stats {
    gm_stat_t allocation[GM_STAT_NTYPES];
    gm_stat_t segment[GM_STAT_NTYPES];
    gm_stat_t active[GM_STAT_NTYPES];
    gm_stat_t inactive_split[GM_STAT_NTYPES];
    gm_stat_t allocated_bytes[GM_STAT_NTYPES];
    gm_stat_t reserved_bytes[GM_STAT_NTYPES];
    gm_stat_t active_bytes[GM_STAT_NTYPES];
    gm_stat_t inactive_split_bytes[GM_STAT_NTYPES];
    gm_stat_t requested_bytes[GM_STAT_NTYPES];
    gm_stat_t oversize_allocations;
    gm_stat_t oversize_segments;
    int64_t num_alloc_retries;
    int64_t num_ooms;
    int64_t num_sync_all_streams;
    int64_t num_device_alloc;
    int64_t num_device_free;
    int64_t max_split_size; /* -1 when unlimited */
} gm_stats_t;

/* Filled in when gm_alloc_malloc returns GM_EOOM. */
typedef struct gm_oom_info {
    size_t requested;        /* the caller's size */
    size_t rounded;          /* after rounding */
    size_t alloc_size;       /* the segment size that was refused */
    size_t device_total;
    size_t device_free;
    size_t allocated;        /* allocated_bytes.all.current */
    size_t reserved;         /* reserved_bytes.all.current */
    size_t reserved_unallocated;
    size_t allowed;          /* the memory limit, 0 when none (see has_limit) */
    int limit_hit;           /* refused by the limit, not the device */
    int has_limit;           /* a limit is in force (it may be 0 bytes) */
    /* Bytes of the free blocks cached in private pools: what torch's message
     * calls "allocated in private pools (e.g., CUDA Graphs)". */
    size_t private_pool_cached;
} gm_oom_info_t;

/* Trace actions, in PyTorch's TraceEntry order. */
typedef enum gm_action {
    GM_ACT_ALLOC = 0,
    GM_ACT_FREE_REQUESTED,
    GM_ACT_FREE_COMPLETED,
    GM_ACT_SEGMENT_ALLOC,
    GM_ACT_SEGMENT_FREE,
    GM_ACT_SEGMENT_MAP,
    GM_ACT_SEGMENT_UNMAP,
    GM_ACT_SNAPSHOT,
    GM_ACT_OOM,
    GM_ACT_ANNOTATE, /* metadata attached to a live allocation after the fact */
    GM_ACT_COUNT
} gm_action_t;

const char *gm_action_name(int action);

/* Called with the allocator lock held, for every event. addr is the device
 * free byte count for GM_ACT_OOM. The hook must not call back into the
 * allocator or take the GIL. */
typedef void (*gm_trace_fn)(void *arg, int device, gm_action_t action, uintptr_t addr,
                            size_t size, uintptr_t stream, uint32_t ctx);

typedef struct gm_alloc gm_alloc_t;

/* A private pool's id: torch's MempoolId_t (a pair of CaptureId_t). {0, 0}
 * names the default pools; torch gives graph pools {n, 0} and user
 * MemPools {0, n}. */
typedef struct gm_mempool_id {
    uint64_t first, second;
} gm_mempool_id_t;

static inline int gm_mempool_id_is_default(gm_mempool_id_t id) {
    return id.first == 0 && id.second == 0;
}
static inline int gm_mempool_id_eq(gm_mempool_id_t x, gm_mempool_id_t y) {
    return x.first == y.first && x.second == y.second;
}

int gm_alloc_create(const gm_backend_t *backend, int device, const gm_settings_t *settings,
                    gm_alloc_t **out);
/* Returns every segment to the backend and frees the allocator. Live
 * allocations are released too (their pointers become invalid). */
void gm_alloc_destroy(gm_alloc_t *a);

int gm_alloc_device(const gm_alloc_t *a);
/* The backend's text for the last device error on this thread ("" if none). */
const char *gm_alloc_last_error(const gm_alloc_t *a);

int gm_alloc_malloc(gm_alloc_t *a, size_t size, uintptr_t stream, uint32_t ctx,
                    uintptr_t *out_ptr, gm_oom_info_t *oom /* may be NULL */);
/* The same, served from private pool `pool` (torch's routing while the pool
 * is allocating: the caller evaluated the pool's filter). A pool that no
 * longer exists (released and freed meanwhile) sends the request to the
 * default pools. */
int gm_alloc_malloc_pool(gm_alloc_t *a, size_t size, uintptr_t stream, uint32_t ctx,
                         gm_mempool_id_t pool, uintptr_t *out_ptr, gm_oom_info_t *oom);
int gm_alloc_free(gm_alloc_t *a, uintptr_t ptr, uint32_t ctx);
/* Size of the live block holding ptr (exact start address). */
int gm_alloc_block_size(gm_alloc_t *a, uintptr_t ptr, size_t *size, size_t *requested,
                        uintptr_t *stream);
int gm_alloc_record_stream(gm_alloc_t *a, uintptr_t ptr, uintptr_t stream);
/* An `annotate` event for the live block at ptr (exact start address):
 * addr ptr, size its requested size, its stream, context ctx. Changes no
 * state. GM_ENOTFOUND when nothing is allocated there. */
int gm_alloc_annotate(gm_alloc_t *a, uintptr_t ptr, uint32_t ctx);
/* Poll outstanding events (also done at the start of every malloc). */
int gm_alloc_process_events(gm_alloc_t *a, uint32_t ctx);
/* Wait for all events, then return every wholly free segment (and every
 * wholly free granule of expandable segments) to the device. */
int gm_alloc_empty_cache(gm_alloc_t *a, uint32_t ctx);

/* ---- private pools (torch's PrivatePool; privpool.c) ----
 * All return GM_EINVAL for the id {0, 0}. */
/* createOrIncrefPool: a new pool with use count 1, or one more use of a
 * live one; GM_ESTATE for a pool already released (use count 0). */
int gm_alloc_pool_create_or_incref(gm_alloc_t *a, gm_mempool_id_t id);
/* beginAllocateToPool: create_or_incref, then mark the pool allocating
 * (GM_ESTATE if it already is). While any pool is allocating, events are
 * neither polled nor recorded, and the out-of-memory path does not release
 * the default pools (torch's captures_underway). */
int gm_alloc_pool_begin(gm_alloc_t *a, gm_mempool_id_t id);
/* endAllocateToPool: GM_ENOTFOUND if the pool is not allocating. */
int gm_alloc_pool_end(gm_alloc_t *a, gm_mempool_id_t id);
/* releasePool: one use less; at 0 the pool becomes freeable: its cached
 * segments go back on the next empty_cache (of all pools, or of this one)
 * or out-of-memory retry, and the pool disappears once it holds no memory.
 * GM_ENOTFOUND for an unknown pool, GM_ESTATE if already at 0. */
int gm_alloc_pool_release(gm_alloc_t *a, gm_mempool_id_t id);
/* getPoolUseCount: GM_ENOTFOUND for an unknown pool. */
int gm_alloc_pool_use_count(gm_alloc_t *a, gm_mempool_id_t id, int *out);
/* emptyCache(mempool_id): {0, 0} is gm_alloc_empty_cache; another id frees
 * that pool's cached segments if the pool is freeable, else nothing. */
int gm_alloc_empty_cache_pool(gm_alloc_t *a, gm_mempool_id_t id, uint32_t ctx);
/* One block of a private pool's checkpoint (torch's BlockState), as the
 * pool's segment walk reported it; `first` starts a segment. */
typedef struct gm_ckpt_block {
    uintptr_t ptr;
    size_t size;
    int allocated;
    int first;
} gm_ckpt_block_t;
typedef void (*gm_ckpt_ptr_fn)(void *arg, uintptr_t ptr);
/* setCheckpointPoolState (Note [Private pool checkpoints] in checkpoint.c):
 * free every block allocated in pool `id` (freed(arg, ptr) for each, under
 * the allocator lock: it must not call into the allocator), then lay the
 * checkpointed segments out again: their allocated blocks are live
 * afterwards. GM_ENOTFOUND for an unknown pool, GM_ESTATE when a segment no
 * longer fits its checkpoint. */
int gm_alloc_pool_restore(gm_alloc_t *a, gm_mempool_id_t id, const gm_ckpt_block_t *blocks,
                          size_t n, gm_ckpt_ptr_fn freed, void *arg, uint32_t ctx);
/* 1 while some private pool is allocating (torch's captures_underway). */
int gm_alloc_pool_any_allocating(gm_alloc_t *a);

/* Limit like torch's set_per_process_memory_fraction: fraction x device
 * total bytes (0 allowed: nothing can be reserved); 1.0 removes the limit. */
int gm_alloc_set_memory_fraction(gm_alloc_t *a, double fraction);
/* Limit in bytes; 0 removes the limit. */
int gm_alloc_set_memory_limit(gm_alloc_t *a, size_t bytes);
size_t gm_alloc_memory_limit(gm_alloc_t *a); /* 0 = none (or a limit of 0 bytes) */
/* 1 and the limit in *bytes when one is in force (even of 0 bytes), else 0. */
int gm_alloc_get_memory_limit(gm_alloc_t *a, size_t *bytes);

/* Caching on (the default) or off, as torch's caching_allocator_enable:
 * while off, every request gets a device allocation of its own, outside the
 * statistics, the trace and the walk, that goes back to the device when it
 * is freed (Note [Caching off] in malloc.c). */
void gm_alloc_set_caching(gm_alloc_t *a, int enabled);
int gm_alloc_caching(gm_alloc_t *a);

int gm_alloc_set_settings(gm_alloc_t *a, const gm_settings_t *settings);
void gm_alloc_get_settings(gm_alloc_t *a, gm_settings_t *out);
/* 1 if expandable segments are in use (the backend supports VMM). */
int gm_alloc_expandable_active(gm_alloc_t *a);

void gm_alloc_get_stats(gm_alloc_t *a, gm_stats_t *out);
void gm_alloc_reset_peak_stats(gm_alloc_t *a);
void gm_alloc_reset_accumulated_stats(gm_alloc_t *a);

void gm_alloc_set_trace_hook(gm_alloc_t *a, gm_trace_fn fn, void *arg);
/* For a hook, during its call for a GM_ACT_FREE_REQUESTED: 1 when the
 * block is returned at once (no stream still uses it), so that the hook's
 * next call, under the same lock hold and with nothing between, is the
 * GM_ACT_FREE_COMPLETED of the same block, stream and context; else 0.
 * Meaningless in any other call. */
int gm_alloc_free_completes_at_once(const gm_alloc_t *a);

/* ---- walking state (for snapshots) ---- */
enum { GM_BLOCK_INACTIVE = 0, GM_BLOCK_ACTIVE_ALLOCATED = 1, GM_BLOCK_ACTIVE_PENDING_FREE = 2 };

typedef struct gm_block_info {
    uintptr_t address;
    size_t size;
    size_t requested_size;
    int state; /* GM_BLOCK_* */
    uint32_t ctx;
} gm_block_info_t;

typedef struct gm_segment_info {
    uintptr_t address;
    size_t total_size, allocated_size, active_size, requested_size;
    uintptr_t stream;
    int is_small;
    int is_expandable;
    uint32_t ctx; /* context of the malloc that created the segment */
    gm_mempool_id_t pool_id; /* {0, 0}: the default pools */
    size_t nblocks;
    const gm_block_info_t *blocks; /* valid only during the callback */
} gm_segment_info_t;

/* Calls fn once per segment (per contiguous mapped range for expandable
 * segments), in address order. Stops early if fn returns non-zero and
 * returns that value. Runs under the allocator lock: fn must not call
 * into the allocator. */
typedef int (*gm_segment_fn)(void *arg, const gm_segment_info_t *seg);
int gm_alloc_walk(gm_alloc_t *a, gm_segment_fn fn, void *arg);
/* The same for the segments of one private pool (torch's
 * snapshot(mempool_id)); {0, 0} walks everything. An unknown pool has no
 * segments. */
int gm_alloc_walk_pool(gm_alloc_t *a, gm_mempool_id_t pool, gm_segment_fn fn, void *arg);

/* ---- checking ---- */
/* Walks every structure and returns the number of violations found (0 when
 * consistent). The first violation's text goes to msg. */
int gm_alloc_check(gm_alloc_t *a, char *msg, size_t msglen);

#ifdef __cplusplus
}
#endif
#endif /* GM_CORE_ALLOC_H */
