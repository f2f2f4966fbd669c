/*
 * hist_pywalk.h - the calling thread's Python frames, innermost first, as
 * (code object, location) pairs: the walk a stack capture makes.
 *
 * Two walks yield the same frames:
 *   - gm_pywalk_api: the public C API (PyEval_GetFrame, PyFrame_GetBack,
 *     PyFrame_GetCode, PyFrame_GetLasti or, before 3.11, which lacks it,
 *     the frame's public f_lasti field). Every CPython version (3.9-3.13).
 *   - gm_pywalk_direct: CPython 3.11, 3.12 and 3.13 (GIL builds). Reads the
 *     thread's _PyInterpreterFrame chain directly, as profilers (py-spy,
 *     austin, memray) do: no frame object is created, no reference taken,
 *     no call made per frame. See Note [Direct frame walk].
 * The caller holds the GIL. Both are static inline so that the test-only
 * extension (tests/ext) compiles the same code and compares them.
 *
 * Note [Direct frame walk]
 * Rationale: the public walk costs about 50 ns a frame (a frame object is
 *   materialised for every frame, with a reference taken and dropped on it
 *   and its code); a 33-frame capture spent most of its time there. And
 *   without the direct walk a capture on a thread that released the GIL
 *   (torch releases it around every operator) must take the GIL back
 *   (Note [Last stack]). On Python 3.12.1 the public walk made gpumem's
 *   overhead per allocation (context 'all', 33 Python frames) 0.57 x
 *   torch's; the direct walk brought it to 0.27 x (docs/benchmarks.md,
 *   issue 32).
 * Approach: from 3.11 on, a thread's frames are a linked list, from the
 *   thread state's current frame (3.11, 3.12: tstate->cframe->current_frame;
 *   3.13: tstate->current_frame) through ->previous, each holding its code
 *   object (a strong reference the frame keeps while it runs) and an
 *   instruction pointer. gm_iframe_t mirrors the head of the running
 *   version's _PyInterpreterFrame (Include/internal/pycore_frame.h of
 *   3.11, 3.12 and 3.13: the fields up to `owner`; 3.11 orders them
 *   differently, 3.13 renames f_code to f_executable and prev_instr to
 *   instr_ptr). Frames that PyFrame_GetBack would skip
 *   (_PyFrame_IsIncomplete: created but not yet past their first traceable
 *   instruction and not a generator's, and from 3.13 on the C stack's entry
 *   frames) are skipped, and the location is PyFrame_GetLasti's: the byte
 *   offset of the instruction pointer, -1 if before the code.
 *   PyCodeObject, PyThreadState and (3.11, 3.12) _PyCFrame are public
 *   structs in these versions.
 * Limitations: used only when the headers compiled against and the running
 *   interpreter (Py_Version) are the same minor version, 3.11 to 3.13, and
 *   not a free-threaded build; anything else takes the public walk. The
 *   layouts were checked against 3.11.7, 3.12.1 and 3.13.0 here;
 *   tests/test_history_pywalk.py checks on each version that both walks
 *   agree (plain calls, generators, coroutines, class bodies, C re-entry).
 */
#ifndef GM_HIST_PYWALK_H
#define GM_HIST_PYWALK_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../history/intern.h"
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h> /* PyFrame_GetBack and PyFrameObject's fields before 3.11 */
#endif

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define GM_PYWALK_DIRECT 1
#else
#define GM_PYWALK_DIRECT 0
#endif

/* Where a walk writes: *buf starts as inline (cap entries) and is replaced
 * by a heap buffer (malloc; the caller frees it when != inline) if the
 * stack is deeper. */
typedef struct gm_pywalk_buf {
    gm_rawframe_t *buf;
    size_t cap;
    gm_rawframe_t *inline_buf;
} gm_pywalk_buf_t;

/* Room for entry n; 0 when there is none (keep the frames we have). */
static inline int gm_pywalk_room(gm_pywalk_buf_t *b, uint32_t n) {
    if (n < b->cap)
        return 1;
    size_t ncap = b->cap * 2;
    gm_rawframe_t *nb = n >= UINT32_MAX / 2 ? NULL : malloc(ncap * sizeof *nb);
    if (!nb)
        return 0;
    memcpy(nb, b->buf, n * sizeof *nb);
    if (b->buf != b->inline_buf)
        free(b->buf);
    b->buf = nb;
    b->cap = ncap;
    return 1;
}

/* The public-API walk; returns the number of frames written. */
static inline uint32_t gm_pywalk_api(gm_pywalk_buf_t *b) {
    uint32_t n = 0;
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    while (f) {
        if (!gm_pywalk_room(b, n)) {
            Py_DECREF(f);
            break;
        }
        PyCodeObject *co = PyFrame_GetCode(f); /* new reference */
        gm_rawframe_t *r = &b->buf[n++];
        r->code = (uintptr_t)co;
        /* The byte offset of the last instruction, as every version's
         * frame.f_lasti gives it in Python (-1 before the first). */
#if PY_VERSION_HEX >= 0x030B0000
        r->loc = PyFrame_GetLasti(f);
#elif PY_VERSION_HEX >= 0x030A0000
        r->loc = f->f_lasti < 0 ? -1 : f->f_lasti * (int)sizeof(_Py_CODEUNIT); /* code units */
#else
        r->loc = f->f_lasti; /* already bytes */
#endif
        r->kind = GM_LOC_LASTI;
        /* The executing frame keeps its code alive for the whole walk. */
        Py_DECREF(co);
        PyFrameObject *back = PyFrame_GetBack(f); /* new reference or NULL */
        Py_DECREF(f);
        f = back;
    }
    return n;
}

#if GM_PYWALK_DIRECT
/* A code unit (opcode and argument): _Py_CODEUNIT, which 3.13 no longer
 * declares publicly. */
typedef uint16_t gm_codeunit_t;

/* The head of the running CPython's _PyInterpreterFrame (see the Note):
 * the code object (f_code; 3.13: f_executable, a code object in every
 * frame not owned by the C stack), the previous frame, the instruction
 * pointer (prev_instr; 3.13: instr_ptr) and the owner. */
typedef struct gm_iframe {
#if PY_VERSION_HEX < 0x030C0000 /* 3.11 */
    PyObject *f_func;
    PyObject *f_globals;
    PyObject *f_builtins;
    PyObject *f_locals;
    PyCodeObject *f_code;
    PyObject *frame_obj;
    struct gm_iframe *previous;
    gm_codeunit_t *instr;
    int stacktop;
    char is_entry; /* bool in CPython: one byte either way */
    char owner;
#else /* 3.12, 3.13 */
    PyCodeObject *f_code; /* 3.13: f_executable */
    struct gm_iframe *previous;
    PyObject *f_funcobj;
    PyObject *f_globals;
    PyObject *f_builtins;
    PyObject *f_locals;
    PyObject *frame_obj;
    gm_codeunit_t *instr; /* 3.12: prev_instr; 3.13: instr_ptr */
    int stacktop;
    uint16_t return_offset;
    char owner;
#endif
} gm_iframe_t;

enum { GM_FRAME_OWNED_BY_THREAD = 0, GM_FRAME_OWNED_BY_GENERATOR = 1, GM_FRAME_OWNED_BY_CSTACK = 3 };

/* _PyFrame_IsIncomplete of the running version. */
static inline int gm_iframe_incomplete(const gm_iframe_t *f) {
#if PY_VERSION_HEX >= 0x030D0000
    if (f->owner == GM_FRAME_OWNED_BY_CSTACK)
        return 1;
#endif
    return f->owner != GM_FRAME_OWNED_BY_GENERATOR &&
           f->instr < (gm_codeunit_t *)f->f_code->co_code_adaptive + f->f_code->_co_firsttraceable;
}

/* Is the direct walk usable in this process? (the running interpreter is
 * the minor version it was compiled for) */
static inline int gm_pywalk_direct_ok(void) {
    return (Py_Version >> 16) == (PY_VERSION_HEX >> 16);
}

/* The first frame that PyFrame_GetBack would yield from f on: NULL at the
 * end. */
static inline const gm_iframe_t *gm_iframe_next(const gm_iframe_t *f) {
    while (f && gm_iframe_incomplete(f))
        f = f->previous;
    return f;
}

static inline const gm_iframe_t *gm_iframe_first(PyThreadState *ts) {
#if PY_VERSION_HEX >= 0x030D0000
    return gm_iframe_next((const gm_iframe_t *)ts->current_frame);
#else
    return gm_iframe_next(ts->cframe ? (const gm_iframe_t *)ts->cframe->current_frame : NULL);
#endif
}

/* Frame f as a raw frame: its code and PyFrame_GetLasti's location. */
static inline void gm_iframe_raw(const gm_iframe_t *f, gm_rawframe_t *r) {
    r->code = (uintptr_t)f->f_code;
    long lasti = (long)(f->instr - (gm_codeunit_t *)f->f_code->co_code_adaptive);
    r->loc = lasti < 0 ? -1 : (int32_t)(lasti * (long)sizeof(gm_codeunit_t));
    r->kind = GM_LOC_LASTI;
}

/* The frames of thread state ts. ts is this thread's, and either it holds
 * the GIL or it released it and is inside a C call: its frames cannot
 * change while they are read (no other thread runs this thread's frames),
 * and each keeps its code object alive. */
static inline uint32_t gm_pywalk_direct_ts(PyThreadState *ts, gm_pywalk_buf_t *b) {
    uint32_t n = 0;
    for (const gm_iframe_t *f = gm_iframe_first(ts); f; f = gm_iframe_next(f->previous)) {
        if (!gm_pywalk_room(b, n))
            break;
        gm_iframe_raw(f, &b->buf[n++]);
    }
    return n;
}

static inline uint32_t gm_pywalk_direct(gm_pywalk_buf_t *b) {
    return gm_pywalk_direct_ts(PyThreadState_Get(), b);
}
#else
static inline int gm_pywalk_direct_ok(void) { return 0; }
static inline uint32_t gm_pywalk_direct(gm_pywalk_buf_t *b) { return gm_pywalk_api(b); }
#endif

#endif /* GM_HIST_PYWALK_H */
