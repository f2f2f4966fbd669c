/*
 * privpool.h - private memory pools (torch's PrivatePool): the pools of
 * CUDA graph captures and of torch.cuda.MemPool, each with its own small
 * and large pool, reference counted, found by id (Note [Private pools] in
 * privpool.c).
 */
#ifndef GM_CORE_PRIVPOOL_H
#define GM_CORE_PRIVPOOL_H

#include "types.h"

/* The pool with this id, or NULL. */
gm_private_pool_t *gm_privpool_find_unlocked(gm_alloc_t *a, gm_mempool_id_t id);
/* The id of the private pool a pool belongs to ({0, 0} for the default). */
static inline gm_mempool_id_t gm_privpool_id_of(const gm_pool_t *p) {
    gm_mempool_id_t none = {0, 0};
    return p->owner ? p->owner->id : none;
}
/* Delete p if it is released (use count 0), not allocating and holds no
 * memory (torch erases such a pool from graph_pools); 1 if deleted. */
int gm_privpool_delete_if_done_unlocked(gm_alloc_t *a, gm_private_pool_t *p);
/* Delete every pool struct (destroy only: blocks are gone already). */
void gm_privpool_destroy_unlocked(gm_alloc_t *a);

#endif /* GM_CORE_PRIVPOOL_H */
