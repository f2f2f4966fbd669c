/*
 * checkpoint.c - restoring a private pool to a checkpoint (torch's
 * setCheckpointPoolState; gm_alloc_pool_restore in gm_alloc.h).
 *
 * Note [Private pool checkpoints]
 * Rationale: the CUDA graph trees of torch.compile(mode="reduce-overhead")
 *   replay graphs whose outputs the allocator never saw being allocated
 *   (a replay allocates nothing). Before recording a new graph on another
 *   branch of the tree, the private pool must again hold exactly the blocks
 *   that are live on the path so far, or the new recording would hand out
 *   memory that replayed outputs still use. torch checkpoints the pool
 *   after each recording (getCheckpointState) and restores it later.
 * Approach: the checkpoint is the pool's segment walk (taken by the shim
 *   with gm_alloc_walk_pool): each segment's blocks, their addresses, sizes
 *   and whether they were allocated. Restoring, under the allocator lock:
 *   free every block allocated in the pool now (their pointers go to the
 *   caller, torch's ptrs_freed); then, per checkpointed segment, find its
 *   first block among the pool's free blocks, allocate every block of the
 *   segment in address order at exactly its checkpointed size (splitting
 *   the free block, whatever max_split_size says, as torch does), and free
 *   again those the checkpoint had free. Every step goes through malloc.c's
 *   own allocate and free (malloc.h), so statistics and the trace change
 *   as they do for any allocation and free, as torch's reuse of
 *   alloc_found_block and free_block makes them change.
 * Limitations: a block freed here that is still waiting on stream-use
 *   events does not become free, and a segment whose layout no longer fits
 *   the checkpoint (returned to the device since, or grown), is refused with
 *   GM_ESTATE after the frees, as torch's checks refuse it; pool segments
 *   the checkpoint does not know are left with their blocks free. A free
 *   tail beyond the checkpoint's last block (an expandable segment mapped
 *   further since) stays free.
 */
#include <stdlib.h>

#include "check.h"
#include "malloc.h"
#include "pool.h"
#include "privpool.h"

static int in_pool(const gm_block_t *b, const gm_private_pool_t *p) {
    return b->pool == &p->small || b->pool == &p->large;
}

/* Free every block allocated in p, reporting each pointer. */
static int free_all_unlocked(gm_alloc_t *a, gm_private_pool_t *p, gm_ckpt_ptr_fn freed, void *arg,
                             uint32_t ctx) {
    size_t n = 0;
    gm_block_t **v = malloc((a->active.count + 1) * sizeof *v);
    if (!v)
        return GM_ENOMEM;
    for (size_t i = 0; i <= a->active.mask; i++) {
        gm_block_t *b = (gm_block_t *)a->active.slots[i].value;
        if (a->active.slots[i].key && b->allocated && in_pool(b, p))
            v[n++] = b;
    }
    int rc = GM_OK;
    for (size_t i = 0; i < n && rc == GM_OK; i++) {
        if (freed)
            freed(arg, v[i]->ptr);
        rc = gm_malloc_free_unlocked(a, v[i], ctx);
    }
    free(v);
    return rc;
}

/* The free block of p that starts at ptr, or NULL. */
static gm_block_t *free_block_at(gm_private_pool_t *p, uintptr_t ptr) {
    gm_pool_t *pools[2] = {&p->small, &p->large};
    for (int k = 0; k < 2; k++)
        for (gm_tree_node_t *n = gm_tree_first(&pools[k]->blocks); n; n = gm_tree_next(n))
            if (gm_block_of(n)->ptr == ptr)
                return gm_block_of(n);
    return NULL;
}

/* The live block at ptr, or NULL. */
static gm_block_t *live_at(gm_alloc_t *a, uintptr_t ptr) {
    uintptr_t v;
    return gm_ptrmap_get(&a->active, ptr, &v) && ((gm_block_t *)v)->allocated ? (gm_block_t *)v
                                                                              : NULL;
}

/* Lay out one checkpointed segment (blocks[0..n)) again. */
static int restore_segment(gm_alloc_t *a, gm_private_pool_t *p, const gm_ckpt_block_t *blocks,
                           size_t n, uint32_t ctx) {
    gm_block_t *cur = free_block_at(p, blocks[0].ptr);
    for (size_t i = 0; i < n; i++) {
        if (!cur || cur->ptr != blocks[i].ptr || !gm_block_is_free(cur) ||
            cur->in_tree != GM_IN_FREE || cur->size < blocks[i].size)
            return GM_ESTATE;
        gm_pool_remove_unlocked(cur);
        gm_block_t *b = NULL;
        int rc = gm_malloc_take_unlocked(a, cur, blocks[i].size, ctx, &b);
        if (rc)
            return rc;
        cur = b->next;
    }
    for (size_t i = 0; i < n; i++) {
        if (blocks[i].allocated)
            continue;
        gm_block_t *b = live_at(a, blocks[i].ptr); /* looked up: frees merge blocks */
        if (!b)
            return GM_ESTATE;
        int rc = gm_malloc_free_unlocked(a, b, ctx);
        if (rc)
            return rc;
    }
    return GM_OK;
}

int gm_alloc_pool_restore(gm_alloc_t *a, gm_mempool_id_t id, const gm_ckpt_block_t *blocks,
                          size_t n, gm_ckpt_ptr_fn freed, void *arg, uint32_t ctx) {
    if (n && !blocks)
        return GM_EINVAL;
    gm_lock(a);
    gm_private_pool_t *p = gm_privpool_find_unlocked(a, id);
    int rc = p ? free_all_unlocked(a, p, freed, arg, ctx) : GM_ENOTFOUND;
    for (size_t s = 0; s < n && rc == GM_OK;) {
        size_t e = s + 1;
        while (e < n && !blocks[e].first)
            e++;
        rc = restore_segment(a, p, blocks + s, e - s, ctx);
        s = e;
    }
    GM_DEEP_CHECK(a);
    gm_unlock(a);
    return rc;
}
