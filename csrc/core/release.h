/*
 * release.h - giving cached memory back to the device: all of it
 * (empty_cache and the out-of-memory retry), oversize blocks first (when a
 * max_split_size is set), and the garbage collector
 * (garbage_collection_threshold, with a memory limit), and the cached
 * memory of released private pools (Note [Private pools] in privpool.c).
 */
#ifndef GM_CORE_RELEASE_H
#define GM_CORE_RELEASE_H

#include "types.h"

/* torch's release_available_cached_blocks: free cached oversize blocks on
 * `stream` until `size` bytes are freed. 1 if that much went back. */
int gm_release_oversize_unlocked(gm_alloc_t *a, gm_pool_t *pool, uintptr_t stream, size_t size,
                                 uint32_t ctx);
/* Release every wholly free plain segment and every wholly free granule of
 * expandable segments of one pool (torch's release_blocks). */
int gm_release_pool_unlocked(gm_alloc_t *a, gm_pool_t *pool, uint32_t ctx);
/* Wait for every event, then release every wholly free plain segment and
 * every wholly free granule of expandable segments of the default pools,
 * then the cached memory of every freeable private pool. Like every
 * release here, nothing while a capture may be underway
 * (gm_capture_underway; Note [Capture-safe paths] in release.c). */
int gm_release_all_unlocked(gm_alloc_t *a, uint32_t ctx);
/* The default pools' part (and the uncached pool's) without waiting: only
 * what is free now goes back. */
int gm_release_free_unlocked(gm_alloc_t *a, uint32_t ctx);
/* Release the cached segments of every freeable private pool (of `only`
 * if not NULL), deleting those left with no memory (torch's
 * graph_pools_freeable part of release_cached_blocks). */
int gm_release_freeable_pools_unlocked(gm_alloc_t *a, gm_private_pool_t *only, uint32_t ctx);

/* Release large unsplit cached blocks older than average until the
 * reserved memory is below the threshold of the limit. */
void gm_release_gc_unlocked(gm_alloc_t *a, uint32_t ctx);
/* A block of the uncached pool, just returned to it, goes back to the
 * device (not while a capture may be underway); for any other block
 * nothing happens (callers on the free path test the pool first, to save
 * the call). Note [Caching off] in malloc.c. */
int gm_release_uncached_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx);

#endif /* GM_CORE_RELEASE_H */
