/*
 * types.h - the allocator's state, in one place: blocks, pools, expandable
 * ranges, event queues and the allocator itself. Types only: each concept's
 * functions are declared in its own header (block.h, pool.h, stats.h, ...).
 *
 * Every field is protected by the allocator lock (gm_alloc_t.lock) unless it
 * says otherwise. Functions whose name ends in _unlocked expect that lock to
 * be held.
 *
 * Invariants (checked by check.c, Note [Block states] in pool.c):
 *   - a block is in exactly one place: a pool's free tree (free and mapped),
 *     a pool's unmapped tree (expandable address space with no memory), or
 *     the active map (allocated, or freed but waiting on events);
 *   - the blocks of a segment tile it, linked by prev/next; the first block
 *     of a segment (prev == NULL) carries the segment's own facts (`seg`);
 *   - a setting that classifies a block is captured on the block when the
 *     block is allocated (`oversize`) or its segment created (`seg`), so a
 *     later change of the setting never makes the stats disagree.
 * Must not: include anything above core/ (no CUDA, no Python).
 */
#ifndef GM_CORE_TYPES_H
#define GM_CORE_TYPES_H

#include <pthread.h>
#include <stdint.h>

#include "../base/debug.h"
#include "../base/ptrmap.h"
#include "gm_alloc.h"
#include "tree.h"

struct gm_pool;
struct gm_expseg;
struct gm_private_pool;

/* What a segment knows about itself; held by its first block and handed on
 * when another block becomes first (gm_block_link_before, gm_block_unlink in
 * block.h). */
typedef struct gm_seg_facts {
    uint32_t ctx;     /* context of the malloc that created the segment */
    uint8_t oversize; /* plain segment of max_split_size or more when created */
} gm_seg_facts_t;

typedef struct gm_block {
    gm_tree_node_t node;      /* in pool->blocks or pool->unmapped */
    uintptr_t ptr;
    size_t size;
    size_t requested_size;    /* stale once inactive, like torch */
    uintptr_t stream;         /* allocation stream */
    struct gm_pool *pool;
    struct gm_block *prev, *next; /* neighbours within the segment */
    struct gm_expseg *expseg; /* NULL for plain segments */
    uint32_t ctx;             /* context of the live allocation */
    gm_seg_facts_t seg;       /* first block of a segment only; zero elsewhere */
    int event_count;          /* outstanding events */
    uint8_t allocated;
    uint8_t oversize;         /* allocated while size >= max_split_size */
    uint8_t mapped;           /* always 1 for plain segments */
    uint8_t in_tree;          /* GM_IN_* */
    uint32_t n_uses, cap_uses; /* streams recorded with record_stream */
    uintptr_t *uses;
    uintptr_t uses_inline[2];
    int64_t gc_count_base;    /* pool's search count when last cached */
} gm_block_t;

/* Where a block is kept (gm_block_t.in_tree). */
enum { GM_IN_NONE = 0, GM_IN_FREE = 1, GM_IN_UNMAPPED = 2 };

typedef struct gm_pool {
    gm_tree_t blocks;   /* free, mapped: ordered by (stream, size, ptr) */
    gm_tree_t unmapped; /* unmapped expandable ranges: (stream, ptr) */
    int is_small;       /* immutable after init */
    /* The uncached pool (gm_alloc_t.uncached_pool): its blocks are outside
     * the statistics, the trace and the snapshots, as torch's uncached
     * path is outside its allocator; immutable after init. */
    int uncounted;
    int64_t get_free_blocks_call_count; /* the garbage collector's clock */
    /* The private pool this pool belongs to, NULL for the default pools;
     * immutable after init. A block's pool is set when the block is made
     * and never changes, so it classifies the block (and its segment) for
     * good: Note [Private pools] in privpool.c. */
    struct gm_private_pool *owner;
} gm_pool_t;

/* A private memory pool (torch's PrivatePool: CUDA graphs, MemPool). */
typedef struct gm_private_pool {
    gm_mempool_id_t id;      /* immutable after creation; never {0, 0} */
    int use_count;           /* createOrIncref / release; 0: freeable */
    int allocating;          /* between begin and end (captures_underway) */
    int64_t reserved;        /* mapped bytes of its segments; changed only by stats.c */
    gm_pool_t small, large;
    struct gm_private_pool *next;
} gm_private_pool_t;

/* One reserved virtual range of an expandable segment. */
typedef struct gm_expseg {
    uintptr_t va;
    size_t va_size;
    size_t granule;
    size_t n_granules;
    uint8_t *mapped;    /* one byte per granule */
    uintptr_t stream;
    gm_pool_t *pool;
    struct gm_expseg *next_seg; /* list of live expandable segments */
} gm_expseg_t;

typedef struct gm_event_item {
    uintptr_t event;
    gm_block_t *block;
} gm_event_item_t;

/* FIFO of events recorded on one stream. */
typedef struct gm_event_queue {
    uintptr_t stream;
    gm_event_item_t *items;
    size_t head, len, cap; /* ring buffer */
} gm_event_queue_t;

/* Cross-stream reuse (events.c). */
typedef struct gm_events {
    gm_event_queue_t *queues;
    size_t n_queues, cap_queues;
    long n_stuck;          /* uses that could be neither recorded nor waited for */
    uintptr_t *pool;       /* created events ready for reuse */
    size_t n_pool, cap_pool;
    /* Freed blocks whose stream uses wait for the end of all captures
     * (torch's insert_events_deferred_until_no_capture). */
    gm_block_t **deferred;
    size_t n_deferred, cap_deferred;
} gm_events_t;

struct gm_alloc {
    pthread_mutex_t lock;
    const gm_backend_t *be; /* immutable after init */
    int device;             /* immutable after init */
    size_t granularity;     /* VMM granule, 0 without VMM; immutable after init */
    gm_settings_t settings;

    gm_stats_t stats;       /* changed only by stats.c */
    gm_pool_t small_pool, large_pool;
    gm_ptrmap_t active;     /* ptr -> active block */

    size_t allowed_memory_maximum;
    int set_fraction;       /* a memory limit is in force */
    int uncached;           /* caching is off (gm_alloc_set_caching) */
    /* Where requests go while caching is off: each gets a plain segment of
     * its own, given back when freed (Note [Caching off] in malloc.c). */
    gm_pool_t uncached_pool;

    gm_expseg_t *expsegs;
    gm_events_t events;
    gm_block_t *free_structs; /* recycled gm_block_t (gm_block_new_unlocked, block.h) */

    gm_trace_fn trace_fn;
    void *trace_arg;
    /* 1 while the hook is called for a free_requested whose free_completed
     * follows in the same call (gm_alloc_free_completes_at_once); written
     * only while a hook is installed. protected by: allocator lock */
    int trace_free_at_once;

    /* Last, so that the fields of the fast path keep their places. */
    gm_private_pool_t *private_pools; /* list, newest first (privpool.c) */
    /* Private pools between begin and end; 0 on the fast path, where it is
     * the one extra branch (Note [Private pools]). */
    int n_allocating;
};

static inline void gm_lock(gm_alloc_t *a) { pthread_mutex_lock(&a->lock); }
static inline void gm_unlock(gm_alloc_t *a) { pthread_mutex_unlock(&a->lock); }

/* A CUDA graph capture may be underway: some private pool is allocating
 * (torch's captures_underway). While it is, the core makes no call that a
 * capture forbids: no synchronize, no event record or query, no unmap or
 * free of device memory (Note [Capture-safe paths] in release.c). */
static inline int gm_capture_underway(const gm_alloc_t *a) { return a->n_allocating != 0; }

/* Bytes the allocator holds from the device: one source, the stats. */
static inline size_t gm_reserved_bytes(const gm_alloc_t *a) {
    return (size_t)a->stats.reserved_bytes[GM_STAT_ALL].current;
}

#endif /* GM_CORE_TYPES_H */
