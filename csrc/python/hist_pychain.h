/*
 * hist_pychain.h - a thread's raw frame chain as a capture recorded it, and
 * whether the thread stands on exactly that chain again (Note [Predicted
 * chain]): the check that lets a capture reuse a recent stack's id without
 * walking the frames.
 *
 * Built on the direct walk's view of _PyInterpreterFrame (hist_pywalk.h),
 * so it exists only where that walk does (GM_PYWALK_DIRECT). Everything is
 * static inline so that the test-only extension (tests/ext) compiles the
 * same code. Reads only the calling thread's own frames, which cannot change
 * while it is inside a C call, with or without the GIL.
 * Must not: dereference a frame address before the running chain has been
 * shown to lead to it.
 *
 * Note [Predicted chain]
 * Rationale: reusing one of a thread's last stacks (Note [Last stack] in
 *   hist_laststack.c) still walked every frame: a 33-frame capture spent
 *   about 90 of its 100 ns following ->previous, one dependent load after
 *   another (each load's address is the previous load's value), and then
 *   compared the frames with memcmp. Stopping the walk early, at the first
 *   frame that is at the same address with the same instruction pointer as
 *   last time, would not be exact: frames live in a stack of memory that is
 *   reused, so f called from g and later from h (with frames of g's size)
 *   sits at the same address, at the same instruction, under a different
 *   caller. Nothing in a frame tells one activation from another.
 * Approach: a capture records the raw chain it walked: each frame's
 *   address, code object and instruction pointer, every frame included
 *   (also those the walk skips). A later capture checks that the running
 *   chain is that chain, frame by frame and to its end: the thread's
 *   current frame is the first recorded address, and for each recorded
 *   frame its code and instruction pointer are the recorded ones and its
 *   ->previous is the next recorded address (NULL after the last). That is
 *   a full comparison of everything the stack's frames are made of, so a
 *   match is exact; the recorded addresses are only predictions of the
 *   links. They make it fast: each frame is read at the address taken from
 *   the record, after the branch that checked the link to it, so the loads
 *   of all frames are independent and the processor issues them together
 *   (a wrong prediction is a mispredicted branch, whose loads are never
 *   architecturally performed: the code dereferences a recorded address
 *   only once the running chain is known to lead to it). An opaque
 *   assignment keeps the compiler from replacing the recorded address by
 *   the equal loaded one, which would bring back the chain of loads.
 *   The stack a capture stores is a function of the raw chain: a frame is
 *   kept unless it is incomplete (_PyFrame_IsIncomplete, which depends on
 *   its owner and its instruction pointer against its code's first
 *   traceable instruction) or gpumem's own (Note [gpumem's own frames]),
 *   and its location is its instruction pointer's offset in its code. Equal
 *   code pointers are the same code object as long as the recorded one is
 *   alive: the intern table keeps every code object of a stored traceback,
 *   and the hidden-code cache every one it decided on, so the caller only
 *   keeps a chain whose kept and dropped frames' code objects are held that
 *   way. A frame that was skipped, or that is not owned by the thread (a
 *   generator's, whose completeness also depends on the owner), is marked
 *   for a re-check: its completeness is computed again on the running frame
 *   and must be what it was.
 * Limitations: chains deeper than GM_PYCHAIN_MAX frames are not recorded
 *   (those captures walk). A stack that comes back at other addresses (a new
 *   generator object each time, a different caller depth) misses here and
 *   is compared after a walk, as before. CPython 3.11 to 3.13 (GIL builds)
 *   only, where the direct walk exists.
 */
#ifndef GM_HIST_PYCHAIN_H
#define GM_HIST_PYCHAIN_H

#include "hist_pywalk.h"

typedef struct gm_pychain gm_pychain_t; /* complete only where the direct walk exists */

#if GM_PYWALK_DIRECT

#define GM_PYCHAIN_MAX 128 /* a multiple of 64 (the re-check masks' words) */
#define GM_PYCHAIN_WORDS (GM_PYCHAIN_MAX / 64)

typedef struct gm_pychain_frame {
    const void *frame, *code, *ip;
} gm_pychain_frame_t;

/* A recorded raw chain, innermost first; f[n].frame is NULL (the link out of
 * the outermost frame). n == 0: nothing recorded. */
struct gm_pychain {
    uint32_t n;
    uint64_t recheck[GM_PYCHAIN_WORDS]; /* bit i: re-check frame i's completeness */
    uint64_t skipped[GM_PYCHAIN_WORDS]; /* bit i: frame i was incomplete (left out) */
    gm_pychain_frame_t f[GM_PYCHAIN_MAX + 1];
};

/* The thread's current frame, incomplete or not. */
static inline const gm_iframe_t *gm_iframe_head(PyThreadState *ts) {
#if PY_VERSION_HEX >= 0x030D0000
    return (const gm_iframe_t *)ts->current_frame;
#else
    return ts->cframe ? (const gm_iframe_t *)ts->cframe->current_frame : NULL;
#endif
}

/* gm_pywalk_direct_ts's walk (the same frames into b), which also records
 * the raw chain into *chain (n = 0 if it is deeper than GM_PYCHAIN_MAX). */
static inline uint32_t gm_pychain_walk(PyThreadState *ts, gm_pywalk_buf_t *b,
                                       gm_pychain_t *chain) {
    uint32_t n = 0, i = 0;
    gm_pychain_frame_t *rec = chain->f;
    memset(chain->recheck, 0, sizeof chain->recheck);
    memset(chain->skipped, 0, sizeof chain->skipped);
    const gm_iframe_t *f;
    for (f = gm_iframe_head(ts); f; f = f->previous, i++) {
        int skip = gm_iframe_incomplete(f);
        if (i < GM_PYCHAIN_MAX) {
            rec[i].frame = f;
            rec[i].code = f->f_code;
            rec[i].ip = f->instr;
            if (skip || f->owner != GM_FRAME_OWNED_BY_THREAD) {
                chain->recheck[i / 64] |= UINT64_C(1) << (i % 64);
                chain->skipped[i / 64] |= (uint64_t)skip << (i % 64);
            }
        }
        if (skip)
            continue;
        if (n >= b->cap && !gm_pywalk_room(b, n))
            break; /* a cut stack is not the whole chain: n becomes 0 */
        gm_iframe_raw(f, &b->buf[n++]);
    }
    chain->n = !f && i <= GM_PYCHAIN_MAX ? i : 0;
    rec[chain->n].frame = NULL;
    return n;
}

/* Does thread state ts stand on exactly the recorded chain? (the Note) */
static inline int gm_pychain_same(PyThreadState *ts, const gm_pychain_t *c) {
    if (!c->n || gm_iframe_head(ts) != c->f[0].frame)
        return 0;
    const gm_pychain_frame_t *r = c->f, *end = c->f + c->n;
    for (; r < end; r++) {
        const gm_iframe_t *f = (const gm_iframe_t *)r->frame;
        __asm__("" : "+r"(f)); /* read at the recorded address, not the loaded link */
        uintptr_t d = ((uintptr_t)f->f_code ^ (uintptr_t)r->code) |
                      ((uintptr_t)f->instr ^ (uintptr_t)r->ip) |
                      ((uintptr_t)f->previous ^ (uintptr_t)r[1].frame);
        if (d)
            return 0;
    }
    /* Every recorded frame is now known to be on the running chain. */
    for (int w = 0; w < GM_PYCHAIN_WORDS; w++) {
        for (uint64_t m = c->recheck[w]; m; m &= m - 1) {
            int i = __builtin_ctzll(m);
            const gm_iframe_t *f = (const gm_iframe_t *)c->f[w * 64 + i].frame;
            if ((uint64_t)gm_iframe_incomplete(f) != ((c->skipped[w] >> i) & 1))
                return 0;
        }
    }
    return 1;
}

#endif /* GM_PYWALK_DIRECT */
#endif /* GM_HIST_PYCHAIN_H */
