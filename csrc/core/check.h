/*
 * check.h - the invariant walker: recomputes everything derived (stats,
 * tiling, merging, mapping, where each block is kept) from the blocks and
 * counts disagreements instead of aborting (tlsf_check, done properly).
 * Tests call it through gm_alloc_check; GM_DEBUG=3 builds run it after
 * every operation (GM_DEEP_CHECK).
 */
#ifndef GM_CORE_CHECK_H
#define GM_CORE_CHECK_H

#include "types.h"

/* Number of violations (0 when consistent); the first one's text in msg. */
int gm_check_unlocked(gm_alloc_t *a, char *msg, size_t msglen);

#if GM_DEBUG >= 3
#define GM_DEEP_CHECK(a)                                                       \
    do {                                                                       \
        char msg_[256];                                                        \
        if (gm_check_unlocked((a), msg_, sizeof msg_)) {                       \
            fprintf(stderr, "gpumem: invariant violated: %s\n", msg_);         \
            abort();                                                           \
        }                                                                      \
    } while (0)
#else
#define GM_DEEP_CHECK(a) ((void)0)
#endif

#endif /* GM_CORE_CHECK_H */
