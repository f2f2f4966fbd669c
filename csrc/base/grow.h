/*
 * grow.h - a growable array's capacity: doubled until it holds `need`
 * elements. Base: includes nothing of gpumem's.
 */
#ifndef GM_BASE_GROW_H
#define GM_BASE_GROW_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Make *arr (capacity *cap elements of elem bytes) hold at least need
 * elements: realloc to the first doubling of *cap (16 if 0) that does.
 * 0, or -1 when memory ran out or the size overflows (*arr and *cap are
 * then unchanged). */
int gm_grow(void **arr, size_t *cap, size_t need, size_t elem);

#ifdef __cplusplus
}
#endif
#endif /* GM_BASE_GROW_H */
