/*
 * privpool.c - private memory pools (privpool.h, gm_alloc.h's pool API).
 *
 * Note [Private pools]
 * Rationale: torch serves CUDA graph captures and torch.cuda.MemPool from
 *   private pools: memory that only allocations routed to the pool reuse,
 *   kept alive while any graph or MemPool holds the pool, so that a graph's
 *   replay finds its addresses untouched by eager code.
 * Approach: a gm_private_pool_t owns a small and a large gm_pool_t whose
 *   `owner` points back at it. Every block records its gm_pool_t when it is
 *   made and never changes it, so a freed block returns to its own pool and
 *   the best-fit search of one pool never sees another's blocks; stats and
 *   the walker need nothing else to tell pools apart. Routing is the
 *   caller's: while a pool is "allocating" (begin..end) the shim evaluates
 *   torch's stream filters and calls gm_alloc_malloc_pool with the id of the
 *   first pool whose filter accepts (torch's captures_underway order). The
 *   core only counts allocating pools (a->n_allocating): when it is 0,
 *   malloc polls events as before, which is the one extra branch of the
 *   fast path; when not, events are neither polled nor recorded (a freed
 *   block with stream uses waits in events.c's deferred list) and the
 *   out-of-memory path does not release the default pools, as torch does
 *   during a capture. A pool's use count follows createOrIncref / release;
 *   at 0 it is "freeable": empty_cache (of everything or of this id) and
 *   the out-of-memory retry release its cached segments, and it is deleted
 *   once it holds no memory (torch's graph_pools_freeable).
 * Limitations: pools are a list searched linearly (torch has a handful);
 *   MemPool's custom allocators, use_on_oom and no_split are not supported
 *   (the shim refuses them).
 *
 * Everything here runs under the allocator lock.
 */
#include "privpool.h"

#include <stdlib.h>

#include "pool.h"

gm_private_pool_t *gm_privpool_find_unlocked(gm_alloc_t *a, gm_mempool_id_t id) {
    for (gm_private_pool_t *p = a->private_pools; p; p = p->next)
        if (gm_mempool_id_eq(p->id, id))
            return p;
    return NULL;
}

static int holds_memory(const gm_private_pool_t *p) {
    return p->reserved != 0 || p->small.blocks.count || p->large.blocks.count ||
           p->small.unmapped.count || p->large.unmapped.count;
}

int gm_privpool_delete_if_done_unlocked(gm_alloc_t *a, gm_private_pool_t *p) {
    if (p->use_count != 0 || p->allocating || holds_memory(p))
        return 0;
    for (gm_private_pool_t **pp = &a->private_pools; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p);
    return 1;
}

void gm_privpool_destroy_unlocked(gm_alloc_t *a) {
    while (a->private_pools) {
        gm_private_pool_t *p = a->private_pools;
        a->private_pools = p->next;
        free(p);
    }
}

static int create_or_incref(gm_alloc_t *a, gm_mempool_id_t id, gm_private_pool_t **out) {
    gm_private_pool_t *p = gm_privpool_find_unlocked(a, id);
    if (p) {
        if (p->use_count <= 0)
            return GM_ESTATE; /* released: torch asserts a shared pool is live */
        p->use_count++;
        *out = p;
        return GM_OK;
    }
    if (!(p = calloc(1, sizeof *p)))
        return GM_ENOMEM;
    p->id = id;
    p->use_count = 1;
    gm_pool_init(&p->small, 1);
    gm_pool_init(&p->large, 0);
    p->small.owner = p->large.owner = p;
    p->next = a->private_pools;
    a->private_pools = p;
    *out = p;
    return GM_OK;
}

int gm_alloc_pool_create_or_incref(gm_alloc_t *a, gm_mempool_id_t id) {
    if (gm_mempool_id_is_default(id))
        return GM_EINVAL;
    gm_private_pool_t *p;
    gm_lock(a);
    int rc = create_or_incref(a, id, &p);
    gm_unlock(a);
    return rc;
}

int gm_alloc_pool_begin(gm_alloc_t *a, gm_mempool_id_t id) {
    if (gm_mempool_id_is_default(id))
        return GM_EINVAL;
    gm_lock(a);
    gm_private_pool_t *p = gm_privpool_find_unlocked(a, id);
    int rc = GM_OK;
    if (p && p->allocating) /* refused before the incref, so no use leaks */
        rc = GM_ESTATE;
    else if ((rc = create_or_incref(a, id, &p)) == GM_OK) {
        p->allocating = 1;
        a->n_allocating++;
    }
    gm_unlock(a);
    return rc;
}

int gm_alloc_pool_end(gm_alloc_t *a, gm_mempool_id_t id) {
    gm_lock(a);
    gm_private_pool_t *p = gm_privpool_find_unlocked(a, id);
    int rc = GM_ENOTFOUND;
    if (p && p->allocating) {
        p->allocating = 0;
        a->n_allocating--;
        rc = GM_OK;
    }
    gm_unlock(a);
    return rc;
}

int gm_alloc_pool_release(gm_alloc_t *a, gm_mempool_id_t id) {
    gm_lock(a);
    gm_private_pool_t *p = gm_privpool_find_unlocked(a, id);
    int rc = !p ? GM_ENOTFOUND : p->use_count <= 0 ? GM_ESTATE : GM_OK;
    if (rc == GM_OK)
        p->use_count--;
    gm_unlock(a);
    return rc;
}

int gm_alloc_pool_use_count(gm_alloc_t *a, gm_mempool_id_t id, int *out) {
    gm_lock(a);
    gm_private_pool_t *p = gm_privpool_find_unlocked(a, id);
    if (p && out)
        *out = p->use_count;
    gm_unlock(a);
    return p ? GM_OK : GM_ENOTFOUND;
}

int gm_alloc_pool_any_allocating(gm_alloc_t *a) {
    gm_lock(a);
    int r = a->n_allocating != 0;
    gm_unlock(a);
    return r;
}
