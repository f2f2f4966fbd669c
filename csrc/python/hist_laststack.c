/*
 * hist_laststack.c - each thread's last LAST_STACKS captured stacks with
 * their traceback ids (Note [Last stack]), and, where the direct frame walk
 * exists, the raw frame chain each was walked from (Note [Predicted chain]
 * in hist_pychain.h).
 *
 * Invariants: an entry's id is the interned traceback of exactly its frames
 * and context; an entry's chain, when recorded, yields exactly its Python
 * frames (its code objects are held by the intern table or the hidden-code
 * cache, so equal pointers are the same objects).
 * Must not: touch anything Python, take a lock, or share state between
 * threads (everything is thread-local).
 *
 * Note [Last stack]
 * Rationale: consecutive allocations of a thread mostly come from a few
 *   frames at the same instructions (a loop's allocation and its free, a
 *   layer's forward), and interning such a stack again costs a hash over
 *   every frame and a lookup under the intern lock that compares every
 *   frame; and torch releases the GIL around allocations and frees, so a
 *   capture that needs the GIL pays a PyGILState_Ensure/Release round trip.
 * Approach: each thread keeps its last LAST_STACKS captures without
 *   TorchScript frames: their Python frames, their C frames (stacks='all')
 *   and, for a thread without Python frames, the backward context they
 *   were attributed to (Note [Backward context] in hist_capture.c), with
 *   their traceback ids; a capture that yields exactly the same (code,
 *   location) pairs, C addresses and context as one of them reuses its id.
 *   Ids are never reused (the intern table is never cleared) and the table
 *   keeps a reference to every code object of a stored traceback, so equal
 *   pointers are the same code objects. Where the direct walk exists (Note
 *   [Direct frame walk]) an entry also keeps the raw chain its frames were
 *   walked from, and a capture first checks, without walking, whether the
 *   thread stands on one of those chains again (Note [Predicted chain]);
 *   if not, it walks and compares the frames. A thread that released the
 *   GIL does both without taking the GIL back: nothing it reads can change
 *   meanwhile, and on a match nothing needs the GIL; on a miss it takes the
 *   GIL and interns the frames it walked. C frames are walked without the
 *   GIL in any case (cunwind.c).
 * Limitations: stacks deeper than LAST_STACK_MAX Python frames or
 *   LAST_STACK_CMAX C frames are not kept, nor chains deeper than
 *   GM_PYCHAIN_MAX frames. Four entries, not one: a loop's allocation and
 *   its free are two stacks.
 */
#include <string.h>

#include "hist_laststack.h"

#define LAST_STACK_MAX 128
#define LAST_STACK_CMAX 96 /* hist_capture.c's C_STACK_MAX */
#define LAST_STACKS 4

typedef struct last_stack {
    uint32_t n, nc, ctx, id;
#if GM_PYWALK_DIRECT
    uint32_t chain; /* index of its chain in last_stacks_t.chains */
    const void *head, *head_code, *head_ip; /* that chain's first frame; head NULL: none */
#endif
    gm_rawframe_t frames[LAST_STACK_MAX];
    uintptr_t c[LAST_STACK_CMAX];
} last_stack_t;

typedef struct last_stacks {
    uint32_t next; /* the entry replaced next (round robin) */
    last_stack_t e[LAST_STACKS];
#if GM_PYWALK_DIRECT
    /* Note [Predicted chain]: one chain per entry and a spare that the next
     * walk records into; keeping it swaps it with the entry's (no copy). */
    int ready;
    uint32_t spare;
    uint64_t walks; /* the spare's uses, so a stale ticket is refused */
    gm_pychain_t chains[LAST_STACKS + 1];
#endif
} last_stacks_t;

static _Thread_local last_stacks_t tls_last; /* this thread's; protected by: thread-local */

uint32_t gm_laststack_find(const gm_rawframe_t *py, uint32_t npy, const uintptr_t *c,
                           uint32_t nc, uint32_t ctx, int *slot) {
    const last_stacks_t *l = &tls_last;
    for (int i = 0; i < LAST_STACKS; i++) {
        const last_stack_t *e = &l->e[i];
        if (e->id && e->n == npy && e->nc == nc && e->ctx == ctx &&
            memcmp(e->c, c, (size_t)nc * sizeof *c) == 0 &&
            memcmp(e->frames, py, (size_t)npy * sizeof *py) == 0) {
            if (slot)
                *slot = i;
            return e->id;
        }
    }
    return 0;
}

void gm_laststack_keep(const gm_rawframe_t *py, uint32_t npy, const uintptr_t *c, uint32_t nc,
                       uint32_t ctx, uint32_t id, uint64_t ticket) {
    if (!id || npy > LAST_STACK_MAX || nc > LAST_STACK_CMAX)
        return;
    last_stacks_t *l = &tls_last;
    int slot = (int)l->next;
    last_stack_t *e = &l->e[slot];
    l->next = (l->next + 1) % LAST_STACKS;
    if (npy)
        memcpy(e->frames, py, (size_t)npy * sizeof *py);
    if (nc)
        memcpy(e->c, c, (size_t)nc * sizeof *c);
    e->n = npy;
    e->nc = nc;
    e->ctx = ctx;
    e->id = id;
#if GM_PYWALK_DIRECT
    e->head = NULL;
    gm_laststack_set_chain(slot, ticket);
#else
    (void)ticket;
#endif
}

#if GM_PYWALK_DIRECT
gm_pychain_t *gm_laststack_spare(uint64_t *ticket) {
    last_stacks_t *l = &tls_last;
    if (!l->ready) {
        for (uint32_t i = 0; i < LAST_STACKS; i++)
            l->e[i].chain = i;
        l->spare = LAST_STACKS;
        l->ready = 1;
    }
    *ticket = ++l->walks;
    return &l->chains[l->spare];
}

uint32_t gm_laststack_find_chain(PyThreadState *ts, const uintptr_t *c, uint32_t nc) {
    const gm_iframe_t *head = gm_iframe_head(ts);
    if (!head)
        return 0;
    const void *code = head->f_code, *ip = head->instr; /* the running frame: live */
    const last_stacks_t *l = &tls_last;
    for (int i = 0; i < LAST_STACKS; i++) {
        const last_stack_t *e = &l->e[i];
        if (e->head == (const void *)head && e->head_code == code && e->head_ip == ip &&
            e->nc == nc && e->ctx == 0 && (!nc || memcmp(e->c, c, (size_t)nc * sizeof *c) == 0) &&
            gm_pychain_same(ts, &l->chains[e->chain]))
            return e->id;
    }
    return 0;
}

void gm_laststack_set_chain(int slot, uint64_t ticket) {
    last_stacks_t *l = &tls_last;
    last_stack_t *e = &l->e[slot];
    const gm_pychain_t *chain = &l->chains[l->spare];
    e->head = NULL;
    if (!ticket || ticket != l->walks || !l->ready || !chain->n)
        return; /* no chain, or the spare was walked into again since */
    uint32_t mine = e->chain;
    e->chain = l->spare;
    l->spare = mine;
    l->walks++; /* the ticket is used up */
    e->head = chain->f[0].frame;
    e->head_code = chain->f[0].code;
    e->head_ip = chain->f[0].ip;
}
#endif
