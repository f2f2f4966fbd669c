/*
 * alloc_internal.h - the allocator's private structures, shared by the
 * core's .c files (alloc.c, expandable.c, events.c, walk.c).
 *
 * Every field below is protected by the allocator lock (gm_alloc_t.lock)
 * unless marked otherwise. Functions ending in _unlocked expect that lock to
 * be held. Blocks are in exactly one place: a pool's `blocks` tree (free and
 * mapped), a pool's `unmapped` tree (expandable address space without
 * physical memory), or the `active` map (allocated, or waiting on events).
 * See Note [Block states] in alloc.c.
 */
#ifndef GM_CORE_ALLOC_INTERNAL_H
#define GM_CORE_ALLOC_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "gm_alloc.h"
#include "../base/debug.h"
#include "../base/ptrmap.h"
#include "tree.h"

struct gm_pool;
struct gm_expseg;

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
    uint32_t seg_ctx;         /* head block only: context of segment creation */
    int event_count;          /* outstanding events */
    uint8_t allocated;
    uint8_t mapped;           /* always 1 for plain segments */
    uint8_t in_tree;          /* 1 if in pool->blocks, 2 if in pool->unmapped */
    uint32_t n_uses, cap_uses; /* streams recorded with record_stream */
    uintptr_t *uses;
    uintptr_t uses_inline[2];
    int64_t gc_count_base;
} gm_block_t;

typedef struct gm_pool {
    gm_tree_t blocks;   /* free, mapped: ordered by (stream, size, ptr) */
    gm_tree_t unmapped; /* unmapped expandable ranges: (stream, ptr) */
    int is_small;
    int64_t get_free_blocks_call_count;
} gm_pool_t;

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

struct gm_alloc {
    pthread_mutex_t lock;
    const gm_backend_t *be; /* immutable after init */
    int device;             /* immutable after init */
    gm_settings_t settings;
    size_t granularity;     /* VMM granule; 0 when the device has no VMM */
    int vmm_warned;

    gm_stats_t stats;
    gm_pool_t small_pool, large_pool;
    gm_ptrmap_t active;     /* ptr -> active block */

    size_t total_allocated_memory; /* bytes obtained from the device */
    size_t allowed_memory_maximum;
    int set_fraction;

    gm_expseg_t *expsegs;

    gm_event_queue_t *queues;
    size_t n_queues, cap_queues;
    long n_stuck_events;    /* uses that could be neither recorded nor waited for */
    uintptr_t *event_pool;  /* created events ready for reuse */
    size_t n_event_pool, cap_event_pool;

    gm_block_t *free_structs; /* recycled gm_block_t */

    gm_trace_fn trace_fn;
    void *trace_arg;
};

/* alloc.c */
gm_block_t *gm_block_new_unlocked(gm_alloc_t *a, uintptr_t ptr, size_t size, uintptr_t stream,
                                  gm_pool_t *pool);
void gm_block_delete_unlocked(gm_alloc_t *a, gm_block_t *b);
void gm_pool_insert_unlocked(gm_pool_t *pool, gm_block_t *b);
void gm_pool_erase_unlocked(gm_pool_t *pool, gm_block_t *b);
void gm_unmapped_insert_unlocked(gm_pool_t *pool, gm_block_t *b);
void gm_unmapped_erase_unlocked(gm_pool_t *pool, gm_block_t *b);
size_t gm_try_merge_unlocked(gm_alloc_t *a, gm_block_t *dst, gm_block_t *src);
void gm_free_block_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx);
void gm_trace_unlocked(gm_alloc_t *a, gm_action_t act, uintptr_t addr, size_t size,
                       uintptr_t stream, uint32_t ctx);
void gm_stat_inc(gm_stat_t *s, int64_t amount);
void gm_stat_dec(gm_stat_t *s, int64_t amount);

static inline int gm_block_is_free(const gm_block_t *b) {
    return !b->allocated && b->event_count == 0 && b->n_uses == 0;
}
static inline int gm_pool_type(const gm_pool_t *p) {
    return p->is_small ? GM_STAT_SMALL : GM_STAT_LARGE;
}

/* events.c */
int gm_record_use_unlocked(gm_alloc_t *a, gm_block_t *b, uintptr_t stream);
int gm_insert_events_unlocked(gm_alloc_t *a, gm_block_t *b);
int gm_process_events_unlocked(gm_alloc_t *a, uint32_t ctx);
int gm_sync_all_events_unlocked(gm_alloc_t *a, uint32_t ctx);
void gm_events_destroy_unlocked(gm_alloc_t *a);

/* expandable.c */
/* 1 if a block of `size` was mapped into *out (removed from the free tree),
 * 0 if the device is out of memory, <0 on other errors. */
int gm_expandable_alloc_unlocked(gm_alloc_t *a, uintptr_t stream, gm_pool_t *pool, size_t size,
                                 uint32_t ctx, gm_block_t **out);
int gm_unmap_block_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx);
int gm_release_expseg_unlocked(gm_alloc_t *a, gm_block_t *b);
void gm_expandable_destroy_unlocked(gm_alloc_t *a);

#endif /* GM_CORE_ALLOC_INTERNAL_H */
