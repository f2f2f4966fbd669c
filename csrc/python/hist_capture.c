/*
 * hist_capture.c - the calling thread's stack as an interned traceback id.
 *
 * gm_hist_capture(level) is called BEFORE any allocator lock is taken. It
 * returns 0 at once unless recording is on at a context level >= `level`.
 * Python frames are read by hist_pywalk.h: CPython 3.11-3.13's frame chain
 * directly, the public C API on every other version. Only (code object, location)
 * pairs are stored; names and lines are resolved at snapshot time. An
 * identical stack costs one hash lookup (intern.c).
 *
 * Note [Capture and the GIL]
 * Rationale: allocations come from threads in every state: Python threads
 *   holding the GIL, Python threads that released it around a C call, C++
 *   threads with no Python state (autograd), and threads racing interpreter
 *   shutdown. Capture must not deadlock or kill any of them.
 * Approach: nothing Python is touched unless Py_IsInitialized() (it turns
 *   false as soon as finalization starts). A thread whose PyGILState thread
 *   state is NULL captures no Python frames and never touches the GIL. A
 *   thread that holds the GIL walks its frames directly. A thread with a
 *   thread state but without the GIL first checks, without the GIL,
 *   whether it stands at its last stack (Note [Last stack]), or on no
 *   frames at all (where the directly walked versions read its own
 *   frames, which no other thread changes: then there is nothing to walk
 *   and the GIL is not taken); if not, it takes the GIL with
 *   PyGILState_Ensure, but
 *   only until the interpreter starts exiting (an atexit hook sets our flag
 *   before CPython sets its own; 3.13+ also checks Py_IsFinalizing). No
 *   allocator lock is held here, so waiting for the GIL cannot deadlock
 *   with the allocator.
 * Limitations: a daemon thread that passes the check just before another
 *   thread starts finalizing can still be stopped by CPython inside
 *   PyGILState_Ensure (as in torch). Sub-interpreters are not supported:
 *   PyGILState_Check is unreliable once one exists.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "../history/hist.h"
#include "../history/intern.h"
#include "../history/sample.h"
#include "hist_capture.h"
#include "hist_laststack.h"
#include "hist_pywalk.h"
#include "pycompat.h"

#define PY_STACK_INLINE 128
#define C_STACK_MAX 96

static atomic_int exiting; /* set once by the atexit hook; protected by: atomic access */

static void retain_code(uintptr_t code) { Py_INCREF((PyObject *)code); }

/* May this thread wait for the GIL? Not once the interpreter is exiting:
 * CPython may then stop a thread that waits for it. */
static int may_take_gil(void) {
    if (atomic_load_explicit(&exiting, memory_order_relaxed))
        return 0;
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_IsFinalizing())
        return 0;
#endif
    return 1;
}

/* Note [gpumem's own frames]
 * Rationale: gpumem's Python wrappers sit on the stack of the allocations
 *   they lead to: torch.autograd.backward's wrapper in _torch.py stored the
 *   backward context, so 16 GiB of a nanoGPT run's gradients had
 *   `gpumem/_torch.py:358:wrapper` as their site instead of the script's
 *   `loss.backward()` line; categories' wrappers, record()'s context
 *   manager and simulate's import hook can be there too. An allocation's
 *   site must be the user's code, as torch's recorder (which has no such
 *   wrappers) shows it.
 * Approach: a frame whose code object's file lies in gpumem's package
 *   directory (the directory of this extension, from dladdr) is left out of
 *   every captured stack. The decision is made once per code object, with a
 *   string comparison, and cached in a small open-addressed table keyed by
 *   the code object's address (which keeps a reference, so the address is
 *   never reused); after that a frame costs one table probe.
 * Limitations: once the table is full (HIDE_SLOTS code objects seen),
 *   further code objects are compared by name at each capture; gpumem code
 *   copied elsewhere, or run from a zip, is not recognised. */
#define HIDE_SLOTS 8192 /* a power of two */
static struct {
    uintptr_t code;
    int hide;
} hide_cache[HIDE_SLOTS]; /* protected by: GIL */
static size_t hide_used;  /* protected by: GIL */
static PyObject *own_dir; /* "<gpumem's directory>/", or Py_None; protected by: GIL */

static PyObject *own_directory(void) {
    if (own_dir)
        return own_dir;
    Dl_info info;
    const char *slash = NULL;
    if (dladdr((void *)&gm_hist_capture, &info) && info.dli_fname)
        slash = strrchr(info.dli_fname, '/');
    own_dir = slash ? PyUnicode_FromStringAndSize(info.dli_fname, slash - info.dli_fname + 1)
                    : NULL;
    if (!own_dir) {
        PyErr_Clear();
        own_dir = Py_NewRef(Py_None);
    }
    return own_dir;
}

static int in_own_directory(PyCodeObject *co) {
    PyObject *dir = own_directory();
    if (dir == Py_None || !PyUnicode_Check(co->co_filename))
        return 0;
    Py_ssize_t r = PyUnicode_Tailmatch(co->co_filename, dir, 0, PY_SSIZE_T_MAX, -1);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    return (int)r;
}

/* Is co gpumem's own code? *held is cleared when the answer was not kept
 * in the cache (which holds a reference to co). The caller holds the GIL. */
static int hidden(PyCodeObject *co, int *held) {
    uintptr_t key = (uintptr_t)co;
    size_t i = (size_t)((key >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 40) & (HIDE_SLOTS - 1);
    for (size_t probes = 0; probes < HIDE_SLOTS; probes++, i = (i + 1) & (HIDE_SLOTS - 1)) {
        if (hide_cache[i].code == key)
            return hide_cache[i].hide;
        if (hide_cache[i].code == 0)
            break;
    }
    int hide = in_own_directory(co);
    if (hide_used < HIDE_SLOTS / 2 && hide_cache[i].code == 0) {
        Py_INCREF(co);
        hide_cache[i].code = key;
        hide_cache[i].hide = hide;
        hide_used++;
    } else {
        *held = 0;
    }
    return hide;
}

/* Leave gpumem's own frames out of py[0..n) (Note [gpumem's own frames]);
 * returns the number kept. *held is cleared if the code object of a frame
 * left out may not be held by the cache (Note [Predicted chain]). The
 * caller holds the GIL. */
static uint32_t drop_own_frames(gm_rawframe_t *py, uint32_t n, int *held) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++) {
        int h = 1;
        if (!hidden((PyCodeObject *)py[i].code, &h))
            py[kept++] = py[i];
        else if (!h)
            *held = 0;
    }
    return kept;
}

static int use_direct_walk; /* set once at init (gm_pywalk_direct_ok); immutable after */

/* Walk the current thread's frames, innermost first (hist_pywalk.h). The
 * caller holds the GIL. *buf starts as an inline buffer of *cap entries; it
 * is replaced by a heap one if the stack is deeper. Returns the number of
 * frames. */
static uint32_t walk_frames(gm_rawframe_t **buf, size_t *cap, gm_rawframe_t *inline_buf) {
    gm_pywalk_buf_t b = {*buf, *cap, inline_buf};
    uint32_t n = use_direct_walk ? gm_pywalk_direct(&b) : gm_pywalk_api(&b);
    *buf = b.buf;
    *cap = b.cap;
    return n;
}

static uint64_t hash_frames(const gm_rawframe_t *py, uint32_t n) {
    uint64_t h = GM_INTERN_HASH_SEED;
    for (uint32_t i = 0; i < n; i++)
        h = gm_intern_hash_frame(h, &py[i]);
    return h;
}

/* The id of the stack of Python frames py[0..npy) (npy > 0) and C frames
 * c[0..nc), walked from the chain of ticket `chain` (or 0). The caller holds the GIL (new code
 * objects get retained). */
static uint32_t intern_stack(const gm_rawframe_t *py, uint32_t npy, const uintptr_t *c,
                             uint32_t nc, uint64_t chain) {
    int slot;
    uint32_t id = gm_laststack_find(py, npy, c, nc, 0, &slot);
#if GM_PYWALK_DIRECT
    if (id && chain)
        gm_laststack_set_chain(slot, chain); /* the same stack at other frame addresses */
#endif
    if (id)
        return id;
    id = gm_intern_traceback_hashed(py, npy, hash_frames(py, npy), c, nc);
    gm_laststack_keep(py, npy, c, nc, 0, id, chain);
    return id;
}

/* Note [Backward context]
 * Rationale: autograd runs backward on torch's own device threads, which
 *   have no Python frames, so gradients would carry no stack at all and a
 *   leak of gradients (a missing zero_grad) could name no line.
 * Approach: while a Python call into torch.autograd.backward/grad is running
 *   (gpumem wraps them when it patches torch), its stack is stored here and
 *   a capture that finds no frames of its own uses it instead: the
 *   gradient is attributed to the user's `loss.backward()` line.
 *   With stacks='all' such a thread has C frames of its own: they are kept,
 *   innermost, and the backward caller's Python frames follow them.
 * Limitations: one process-wide slot; concurrent backward calls from several
 *   Python threads attribute to the most recent caller. */
static _Atomic uint32_t backward_ctx;

/* The id for a capture that found no Python frames of its own: its C
 * frames (nc may be 0) under the backward context, if one is set. */
static uint32_t without_python_frames(const uintptr_t *c, uint32_t nc) {
    uint32_t ctx = atomic_load(&backward_ctx);
    if (ctx && nc == 0)
        return ctx;
    uint32_t id = nc ? gm_laststack_find(NULL, 0, c, nc, ctx, NULL) : 0; /* Note [Last stack] */
    if (id)
        return id;
    gm_tb_view_t v;
    if (!ctx || gm_intern_tb_view(ctx, &v))
        id = gm_intern_traceback(NULL, 0, c, nc);
    else
        id = gm_intern_traceback(v.raw, v.npy, c, nc);
    if (nc)
        gm_laststack_keep(NULL, 0, c, nc, ctx, id, 0);
    return id;
}

/* Intern lead[0..nlead) (TorchScript frames, innermost) followed by the
 * npy Python frames py (already hashed as pyhash) and the C frames. */
static uint32_t intern_with_lead(const gm_rawframe_t *lead, uint32_t nlead,
                                 const gm_rawframe_t *py, uint32_t npy, uint64_t pyhash,
                                 const uintptr_t *c, uint32_t nc) {
    if (!nlead)
        return gm_intern_traceback_hashed(py, npy, pyhash, c, nc);
    gm_rawframe_t *all = malloc(((size_t)nlead + npy) * sizeof *all);
    if (!all)
        return gm_intern_traceback_hashed(py, npy, pyhash, c, nc);
    memcpy(all, lead, nlead * sizeof *all);
    memcpy(all + nlead, py, npy * sizeof *all);
    uint32_t id = gm_intern_traceback(all, nlead + npy, c, nc);
    free(all);
    return id;
}

static uint32_t capture(int level, const gm_rawframe_t *lead, uint32_t nlead) {
    if (level <= GM_HIST_CTX_NEVER || gm_hist_context_level() < level)
        return 0;
    uintptr_t cbuf[C_STACK_MAX];
    uint32_t nc = 0;
    if (gm_hist_stacks_all())
        nc = (uint32_t)gm_cframes_capture(cbuf, C_STACK_MAX, 0);

    int have_gil = 0, ensured = 0;
    PyGILState_STATE gs = PyGILState_UNLOCKED;
    gm_rawframe_t inline_buf[PY_STACK_INLINE];
    gm_rawframe_t *py = inline_buf;
    size_t cap = PY_STACK_INLINE;
    uint32_t npy = 0;
    int walked = 0;
    uint64_t chain = 0; /* the ticket of the chain py was walked from (hist_laststack.h) */
    /* Py_IsInitialized first: it turns false as finalization starts, and
     * the PyGILState calls are only valid while it is true. */
    PyThreadState *ts;
    if (Py_IsInitialized() && (ts = PyGILState_GetThisThreadState()) != NULL) {
#if GM_PYWALK_DIRECT
        /* One of the last stacks again needs no walk and no GIL (Note
         * [Predicted chain], Note [Last stack]). ts's frames are the ones
         * walked below in either case: a thread holds the GIL exactly when
         * its current thread state is ts (PyGILState_Check). */
        uint32_t same = use_direct_walk && !nlead ? gm_laststack_find_chain(ts, cbuf, nc) : 0;
        if (same)
            return same;
#endif
        have_gil = PyGILState_Check(); /* walking our own frames never waits */
#if GM_PYWALK_DIRECT
        if (use_direct_walk && !nlead) {
            /* Walked once, recording the chain; the frames walked stay
             * valid if the GIL is taken. */
            gm_pywalk_buf_t b = {py, cap, inline_buf};
            npy = gm_pychain_walk(ts, &b, gm_laststack_spare(&chain));
            py = b.buf;
            cap = b.cap;
            walked = 1;
            int slot;
            same = !have_gil && npy ? gm_laststack_find(py, npy, cbuf, nc, 0, &slot) : 0;
            if (same) {
                /* The same stack at other frame addresses. None of its
                 * frames is gpumem's own: each equals a kept one. */
                gm_laststack_set_chain(slot, chain);
                if (py != inline_buf)
                    free(py);
                return same;
            }
        }
#endif
        /* A thread found standing on no Python frames of its own (autograd's
         * device threads: torch gives them a thread state, never frames)
         * needs nothing the GIL guards: its capture is the same without it
         * (Note [Capture and the GIL]). */
        if (!have_gil && !(walked && npy == 0) && may_take_gil()) {
            gs = PyGILState_Ensure();
            ensured = have_gil = 1;
        }
    }
    uint32_t id;
    if (have_gil) {
        if (!walked)
            npy = walk_frames(&py, &cap, inline_buf);
        /* before interning or keeping it as a last stack */
        int held = 1;
        npy = drop_own_frames(py, npy, &held);
        if (!held)
            chain = 0;
        /* Interned with the GIL held: new code objects get retained. */
        id = npy && !nlead ? intern_stack(py, npy, cbuf, nc, chain)
             : npy ? intern_with_lead(lead, nlead, py, npy, hash_frames(py, npy), cbuf, nc)
             : nlead ? gm_intern_traceback(lead, nlead, cbuf, nc)
                     : without_python_frames(cbuf, nc);
    } else {
        id = nlead ? gm_intern_traceback(lead, nlead, cbuf, nc) : without_python_frames(cbuf, nc);
    }
    if (py != inline_buf)
        free(py);
    if (ensured)
        PyGILState_Release(gs);
    return id;
}

uint32_t gm_hist_capture(int level) { return capture(level, NULL, 0); }

uint32_t gm_hist_capture_alloc(size_t size) {
    if (gm_hist_context_level() < GM_HIST_CTX_STATE || !gm_hist_sample(size))
        return 0;
    return capture(GM_HIST_CTX_STATE, NULL, 0);
}

uint32_t gm_hist_capture_script(int level, const gm_script_frame_t *script, uint32_t nscript) {
    enum { SCRIPT_MAX = 64 };
    if (level <= GM_HIST_CTX_NEVER || gm_hist_context_level() < level)
        return 0;
    gm_rawframe_t lead[SCRIPT_MAX];
    uint32_t n = 0;
    char buf[1024];
    for (uint32_t i = 0; i < nscript && n < SCRIPT_MAX; i++) {
        /* "name\0filename", both cut to fit */
        int len = snprintf(buf, sizeof buf, "%.500s%c%.500s", script[i].name ? script[i].name : "",
                           0, script[i].filename ? script[i].filename : "");
        uint32_t sid = len > 0 ? gm_intern_string(buf, (size_t)len) : 0;
        if (!sid)
            continue;
        lead[n].code = sid;
        lead[n].loc = script[i].line;
        lead[n].kind = GM_LOC_SCRIPT;
        n++;
    }
    return capture(level, lead, n);
}

/* ------------------------------------------------------ Python helpers */

static PyObject *mark_exiting(PyObject *self, PyObject *unused) {
    atomic_store(&exiting, 1);
    Py_RETURN_NONE;
}

static PyMethodDef exit_def = {"_hist_atexit", mark_exiting, METH_NOARGS,
                               "Stop taking the GIL for stack capture (interpreter exit)."};

/* _C._hist_capture(level) -> traceback id of the caller's stack. */
static PyObject *py_capture(PyObject *self, PyObject *arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLong(gm_hist_capture((int)level));
}

static PyObject *py_backward_enter(PyObject *self, PyObject *unused) {
    uint32_t id = gm_hist_capture(GM_HIST_CTX_STATE);
    return PyLong_FromUnsignedLong(atomic_exchange(&backward_ctx, id));
}

static PyObject *py_backward_exit(PyObject *self, PyObject *arg) {
    unsigned long prev = PyLong_AsUnsignedLong(arg);
    if (prev == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    atomic_store(&backward_ctx, (uint32_t)prev);
    Py_RETURN_NONE;
}

static PyMethodDef capture_methods[] = {
    {"_hist_backward_enter", py_backward_enter, METH_NOARGS,
     "_hist_backward_enter() -> previous: the caller's stack becomes the context of "
     "allocations made on threads with no Python frames (autograd's), until "
     "_hist_backward_exit(previous). See Note [Backward context]."},
    {"_hist_backward_exit", py_backward_exit, METH_O, "_hist_backward_exit(previous)"},
    {"_hist_capture", py_capture, METH_O,
     "_hist_capture(level) -> traceback id of the caller's stack (0 when not recorded)"},
    {NULL, NULL, 0, NULL}};

int gm_py_hist_capture_init(PyObject *module) {
    use_direct_walk = gm_pywalk_direct_ok();
    gm_intern_set_retain(retain_code);
    if (PyModule_AddFunctions(module, capture_methods) < 0)
        return -1;
    PyObject *fn = PyCFunction_NewEx(&exit_def, NULL, NULL);
    if (!fn)
        return -1;
    PyObject *atexit_mod = PyImport_ImportModule("atexit");
    PyObject *r = atexit_mod ? PyObject_CallMethod(atexit_mod, "register", "O", fn) : NULL;
    Py_XDECREF(atexit_mod);
    Py_DECREF(fn);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}
