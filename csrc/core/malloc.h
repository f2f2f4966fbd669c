/*
 * malloc.h - malloc.c's block operations for other core files that must
 * allocate or free a block they chose themselves (checkpoint.c). Both run
 * under the allocator lock and keep every statistic and the trace exactly
 * as malloc and free do.
 * Must not: be used on the malloc/free fast path (that stays in malloc.c).
 */
#ifndef GM_CORE_MALLOC_H
#define GM_CORE_MALLOC_H

#include "types.h"

/* Allocate the free block b (already out of its tree) as one allocation of
 * `size` bytes (a size malloc rounded once), splitting off the rest when
 * b is larger; *out is the allocated block. */
int gm_malloc_take_unlocked(gm_alloc_t *a, gm_block_t *b, size_t size, uint32_t ctx,
                            gm_block_t **out);
/* Free the live block b, as gm_alloc_free does. */
int gm_malloc_free_unlocked(gm_alloc_t *a, gm_block_t *b, uint32_t ctx);

#endif /* GM_CORE_MALLOC_H */
