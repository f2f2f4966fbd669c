/*
 * hist_laststack.h - each thread's last few captured stacks and their
 * traceback ids, so that a capture of one of them again skips the hash, the
 * intern lookup and, where the direct frame walk exists, the walk itself
 * (hist_laststack.c; Note [Last stack] there, Note [Predicted chain] in
 * hist_pychain.h). Thread-local: nothing here is shared between threads,
 * and nothing here needs the GIL.
 */
#ifndef GM_PYTHON_HIST_LASTSTACK_H
#define GM_PYTHON_HIST_LASTSTACK_H

#include <stdint.h>

#include "../history/intern.h"
#include "hist_pychain.h"

/* The id of one of this thread's last stacks equal to Python frames
 * py[0..npy), C frames c[0..nc) and context ctx, or 0; *slot (if not NULL)
 * says which, for gm_laststack_set_chain. Touches nothing Python. */
uint32_t gm_laststack_find(const gm_rawframe_t *py, uint32_t npy, const uintptr_t *c,
                           uint32_t nc, uint32_t ctx, int *slot);
/* Keep that stack with its id, replacing the oldest, if it is not too deep.
 * ticket: from gm_laststack_spare, whose chain the stack's Python frames
 * were walked from, or 0. The chain is kept only if the ticket is the
 * latest, and the caller must hold every code object in it that the stack
 * shows or leaves out as gpumem's own (Note [Predicted chain]). */
void gm_laststack_keep(const gm_rawframe_t *py, uint32_t npy, const uintptr_t *c, uint32_t nc,
                       uint32_t ctx, uint32_t id, uint64_t ticket);

#if GM_PYWALK_DIRECT
/* The thread's spare chain, for gm_pychain_walk to record into, and its
 * ticket (valid until the next call). */
gm_pychain_t *gm_laststack_spare(uint64_t *ticket);
/* The id of the last stack whose recorded chain thread state ts (this
 * thread's) stands on exactly, with C frames c[0..nc), or 0. No walk. */
uint32_t gm_laststack_find_chain(PyThreadState *ts, const uintptr_t *c, uint32_t nc);
/* The spare's chain (ticket) becomes the chain of the stack in slot (from
 * gm_laststack_find), under the same conditions as gm_laststack_keep's. */
void gm_laststack_set_chain(int slot, uint64_t ticket);
#endif

#endif /* GM_PYTHON_HIST_LASTSTACK_H */
