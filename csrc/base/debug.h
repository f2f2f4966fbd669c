/*
 * debug.h - debug checks, by build level (GM_DEBUG):
 *   0  none (release);
 *   1  cheap asserts on internal state, each with a message (GM_ASSERT);
 *   3  also the core's full invariant walk after every operation
 *      (core/check.c, run by GM_DEEP_CHECK in core/).
 * An assert that fires is a bug in gpumem, never a user error: user errors
 * are returned as GM_E* codes at every level.
 */
#ifndef GM_BASE_DEBUG_H
#define GM_BASE_DEBUG_H

#include <stdio.h>
#include <stdlib.h>

#ifndef GM_DEBUG
#define GM_DEBUG 0
#endif

#if GM_DEBUG >= 1
#define GM_ASSERT(cond, msg)                                                   \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "gpumem: internal error at %s:%d: %s (%s)\n",      \
                    __FILE__, __LINE__, (msg), #cond);                         \
            abort();                                                           \
        }                                                                      \
    } while (0)
#else
#define GM_ASSERT(cond, msg) ((void)0)
#endif

#endif /* GM_BASE_DEBUG_H */
