/*
 * hist_snapshot.c - the Python half of memory history: snapshot dicts in
 * torch's schema (events and frames here; segments and blocks through
 * segments.c, the builder Allocator.segments() uses too), plus the _C
 * functions behind gpumem.recording.history and the capsule gpumem._C._hist_api.
 *
 * A snapshot is taken in two phases. gm_hist_copy (recorder.c) copies
 * segments, blocks and rings into plain C arrays under the allocator locks,
 * with the GIL released. Then, with no allocator lock held, this file turns
 * the copy into dicts; interned ids become Python objects once per snapshot
 * (hist_frames.c), so pickle memoizes equal frames and tracebacks.
 * Must not: hold an allocator lock while touching Python objects.
 */
#include <stdint.h>

#include "../history/hist.h"
#include "../history/intern.h"
#include "../history/sample.h"
#include "errors.h"
#include "hist_capture.h"
#include "hist_frames.h"
#include "hist_snapshot.h"
#include "pycompat.h"
#include "segments.h"
#include "settings.h"

/* Interned key and value strings; created at module init, kept forever
 * (protected by: GIL). */
enum {
    K_ACTION, K_ADDR, K_DEVICE_FREE, K_SIZE, K_STREAM, K_TIME_US, K_COMPILE_CONTEXT,
    K_USER_METADATA, K_POOL_ID, K_FRAMES, V_NA, K_COUNT
};
static const char *const key_text[K_COUNT] = {
    "action", "addr", "device_free", "size", "stream", "time_us", "compile_context",
    "user_metadata", "pool_id", "frames", "N/A"};
static PyObject *keys[K_COUNT];
static PyObject *action_str[GM_ACT_COUNT];

/* d[key] = value, stealing value. -1 on error. */
static int put(PyObject *d, PyObject *key, PyObject *value) {
    if (!value)
        return -1;
    int rc = PyDict_SetItem(d, key, value);
    Py_DECREF(value);
    return rc;
}

static int put_borrowed(PyObject *d, PyObject *key, PyObject *value) {
    return PyDict_SetItem(d, key, value);
}


/* ------------------------------------------------------------ entries */

static PyObject *event_dict(gm_frames_t *b, const gm_hist_event_t *e) {
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int act = e->action < GM_ACT_COUNT ? e->action : GM_ACT_SNAPSHOT;
    PyObject *frames = e->tb ? gm_frames_list(b, e->tb) : NULL;
    PyObject *meta = gm_frames_meta(b, e->meta);
    PyObject *compile = e->compile ? gm_frames_meta(b, e->compile) : keys[V_NA];
    if (put_borrowed(d, keys[K_ACTION], action_str[act]) < 0 ||
        put(d, keys[act == GM_ACT_OOM ? K_DEVICE_FREE : K_ADDR], gm_frames_int(b, e->addr)) < 0 ||
        put(d, keys[K_SIZE], gm_frames_int(b, e->size)) < 0 ||
        put(d, keys[K_STREAM], gm_frames_int(b, e->stream)) < 0 ||
        put(d, keys[K_TIME_US], gm_frames_int(b, e->time_us)) < 0 ||
        !compile || put_borrowed(d, keys[K_COMPILE_CONTEXT], compile) < 0 || !meta ||
        put_borrowed(d, keys[K_USER_METADATA], meta) < 0 ||
        put_borrowed(d, keys[K_POOL_ID], gm_py_default_pool_id()) < 0 || (e->tb && !frames) ||
        (frames && put_borrowed(d, keys[K_FRAMES], frames) < 0)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* The snapshot's segment `s` through the dict builders of segments.c, with
 * frames from this snapshot's tracebacks (an inactive block has none). As
 * in torch's snapshots, the segment's own frames are always empty: the
 * stack that made a segment is in its segment_alloc event. */
static PyObject *segment_dict(gm_frames_t *b, const gm_hist_copy_t *c, const gm_hist_segment_t *s) {
    PyObject *blocks = PyList_New((Py_ssize_t)s->nblocks);
    if (!blocks)
        return NULL;
    for (size_t i = 0; i < s->nblocks; i++) {
        const gm_hist_block_t *hb = &c->blocks[s->first_block + i];
        gm_block_info_t info = {.address = hb->address, .size = hb->size,
                                .requested_size = hb->requested_size, .state = hb->state,
                                .ctx = hb->ctx};
        int active = info.state == GM_BLOCK_ACTIVE_ALLOCATED ||
                     info.state == GM_BLOCK_ACTIVE_PENDING_FREE;
        PyObject *frames = gm_frames_list(b, active ? hb->ctx : 0);
        PyObject *bd = frames ? gm_py_block_dict(&info, frames, b->clamp) : NULL;
        if (!bd) {
            Py_DECREF(blocks);
            return NULL;
        }
        PyList_SET_ITEM(blocks, (Py_ssize_t)i, bd);
    }
    PyObject *frames = gm_frames_list(b, 0);
    if (!frames) {
        Py_DECREF(blocks);
        return NULL;
    }
    gm_segment_info_t info = {.address = s->address, .total_size = s->total_size,
                              .allocated_size = s->allocated_size,
                              .active_size = s->active_size,
                              .requested_size = s->requested_size, .stream = s->stream,
                              .is_small = s->is_small, .is_expandable = s->is_expandable,
                              .ctx = s->ctx, .pool_id = s->pool_id,
                              .nblocks = s->nblocks};
    return gm_py_segment_dict(s->device, &info, frames, blocks, b->clamp);
}

/* (segments, device_traces, settings dict or None) */
static PyObject *build(const gm_hist_copy_t *c, gm_frames_t *b) {
    PyObject *segs = PyList_New((Py_ssize_t)c->nseg);
    PyObject *traces = PyList_New(c->ndev);
    if (!segs || !traces)
        goto fail;
    for (size_t i = 0; i < c->nseg; i++) {
        PyObject *sd = segment_dict(b, c, &c->segs[i]);
        if (!sd)
            goto fail;
        PyList_SET_ITEM(segs, (Py_ssize_t)i, sd);
    }
    for (int d = 0; d < c->ndev; d++) {
        PyObject *list = PyList_New((Py_ssize_t)c->nev[d]);
        if (!list)
            goto fail;
        PyList_SET_ITEM(traces, d, list);
        for (size_t i = 0; i < c->nev[d]; i++) {
            PyObject *e = event_dict(b, &c->ev[d][i]);
            if (!e)
                goto fail;
            PyList_SET_ITEM(list, (Py_ssize_t)i, e);
        }
    }
    PyObject *settings;
    if (c->has_settings)
        settings = gm_py_settings_to_dict(&c->settings);
    else
        settings = Py_NewRef(Py_None);
    if (!settings)
        goto fail;
    return Py_BuildValue("(NNN)", segs, traces, settings);
fail:
    Py_XDECREF(segs);
    Py_XDECREF(traces);
    return NULL;
}

/* A list of the number (gm_hist_seq's) of each device's oldest copied event. */
static PyObject *first_seqs(const gm_hist_copy_t *c) {
    PyObject *l = PyList_New(c->ndev);
    for (int d = 0; l && d < c->ndev; d++) {
        PyObject *n = PyLong_FromUnsignedLongLong(c->seq_end[d] - c->nev[d]);
        if (!n) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, d, n);
    }
    return l;
}

/* _C._hist_snapshot(clamp=False, seqs=False) -> (segments, device_traces,
 * settings) and, with seqs, a fourth item: first_seqs(). */
static PyObject *py_snapshot(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"clamp", "seqs", NULL};
    int clamp = 0, seqs = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pp", kwlist, &clamp, &seqs))
        return NULL;
    gm_hist_copy_t c;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gm_hist_copy(&c);
    Py_END_ALLOW_THREADS
    if (rc)
        return gm_py_raise(rc, "while copying allocator state for a snapshot");
    gm_frames_t b;
    PyObject *result = NULL;
    /* A snapshot is hundreds of thousands of new dicts and lists; the
     * collections their creation would trigger find no garbage among them
     * and cost most of the build (3x at 100k events). No Python code runs
     * during the build, so nothing else sees the collector paused. */
    int gc_was_on = PyGC_Disable();
    if (gm_frames_init(&b, clamp) == 0) {
        result = build(&c, &b);
        gm_frames_free(&b);
    }
    if (gc_was_on)
        PyGC_Enable();
    if (result && seqs) {
        PyObject *first = first_seqs(&c);
        PyObject *r4 = first ? Py_BuildValue("(OOON)", PyTuple_GET_ITEM(result, 0),
                                             PyTuple_GET_ITEM(result, 1),
                                             PyTuple_GET_ITEM(result, 2), first)
                             : NULL;
        Py_SETREF(result, r4);
    }
    gm_hist_copy_free(&c);
    return result;
}

/* _C._hist_traceback(id) -> frames list (a new list each call) */
static PyObject *py_traceback(PyObject *self, PyObject *arg) {
    unsigned long id = PyLong_AsUnsignedLong(arg);
    if (id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    gm_frames_t b;
    if (gm_frames_init(&b, 0) < 0)
        return NULL;
    PyObject *l = gm_frames_list(&b, (uint32_t)id);
    PyObject *r = l ? PyList_GetSlice(l, 0, PY_SSIZE_T_MAX) : NULL;
    gm_frames_free(&b);
    return r;
}

/* ------------------------------------------------- configuration & misc */

static PyObject *py_configure(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"enabled",     "context",          "stacks_all",  "max_entries",
                             "clear_history", "skip_mask",      "sample_mean", "sample_threshold",
                             "sample_seed", NULL};
    int enabled, context, stacks_all = 0, clear = 0;
    unsigned long long max_entries = 1, mean = 0, threshold = 0, seed = 0;
    unsigned int skip = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ii|pKpIKKK", kwlist, &enabled, &context,
                                     &stacks_all, &max_entries, &clear, &skip, &mean, &threshold,
                                     &seed))
        return NULL;
    gm_hist_config_t cfg = {enabled, context, stacks_all, max_entries, clear,
                            skip,    mean,    threshold,  seed};
    int rc = gm_hist_configure(&cfg);
    if (rc == GM_EINVAL)
        return gm_py_raise(rc, "enabled must be 0..2 and context 0..3");
    if (rc)
        return gm_py_raise(rc, "could not size the history ring");
    Py_RETURN_NONE;
}

static PyObject *py_config(PyObject *self, PyObject *unused) {
    gm_hist_config_t c;
    gm_hist_get_config(&c);
    return Py_BuildValue("{s:i,s:i,s:O,s:K,s:I,s:K,s:K,s:K}", "enabled", c.enabled, "context",
                         c.context, "stacks_all", c.stacks_all ? Py_True : Py_False,
                         "max_entries", (unsigned long long)c.max_entries, "skip_mask",
                         c.skip_mask, "sample_mean", (unsigned long long)c.sample_mean,
                         "sample_threshold", (unsigned long long)c.sample_threshold,
                         "sample_seed", (unsigned long long)c.sample_seed);
}

static PyObject *py_set_metadata(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg))
        return PyErr_Format(PyExc_TypeError, "metadata must be a str, not %.80s",
                            Py_TYPE(arg)->tp_name);
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &len);
    if (!s)
        return NULL;
    uint32_t id = gm_intern_string(s, (size_t)len);
    if (len && !id)
        return PyErr_NoMemory();
    gm_hist_set_thread_metadata(id);
    Py_RETURN_NONE;
}

static PyObject *py_get_metadata(PyObject *self, PyObject *unused) {
    const char *s;
    size_t len;
    if (gm_intern_string_view(gm_hist_thread_metadata(), &s, &len))
        s = "", len = 0;
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "replace");
}

static PyObject *py_overhead(PyObject *self, PyObject *unused) {
    return PyLong_FromSize_t(gm_hist_ring_bytes() + gm_intern_bytes());
}

/* _C._hist_seq(device) -> events pushed so far to that device's ring */
static PyObject *py_seq(PyObject *self, PyObject *arg) {
    long d = PyLong_AsLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    if (d < 0 || d >= GM_HIST_MAX_DEVICES)
        return PyErr_Format(PyExc_ValueError, "device must be in [0, %d), not %ld",
                            GM_HIST_MAX_DEVICES, d);
    return PyLong_FromUnsignedLongLong(gm_hist_seq((int)d));
}

static PyObject *py_counts(PyObject *self, PyObject *unused) {
    uint32_t t, f, s;
    gm_intern_counts(&t, &f, &s);
    return Py_BuildValue("{s:k,s:k,s:k,s:n,s:n}", "tracebacks", (unsigned long)t, "frames",
                         (unsigned long)f, "strings", (unsigned long)s, "ring_bytes",
                         (Py_ssize_t)gm_hist_ring_bytes(), "intern_bytes",
                         (Py_ssize_t)gm_intern_bytes());
}

static PyMethodDef snapshot_methods[] = {
    {"_hist_configure", (PyCFunction)(void (*)(void))py_configure, METH_VARARGS | METH_KEYWORDS,
     "_hist_configure(enabled, context, stacks_all=False, max_entries=1, clear_history=False, "
     "skip_mask=0, sample_mean=0, sample_threshold=0, sample_seed=0): levels as ints (see "
     "gpumem.recording.history); sample_mean > 0 turns the sampled mode on"},
    {"_hist_config", py_config, METH_NOARGS, "The recording configuration in force."},
    {"_hist_snapshot", (PyCFunction)(void (*)(void))py_snapshot, METH_VARARGS | METH_KEYWORDS,
     "_hist_snapshot(clamp=False, seqs=False) -> (segments, device_traces, settings or None"
     "[, number of each device's oldest event])"},
    {"_hist_seq", py_seq, METH_O, "_hist_seq(device) -> events recorded so far on the device"},
    {"_hist_traceback", py_traceback, METH_O, "_hist_traceback(id) -> frames, innermost first"},
    {"_hist_set_metadata", py_set_metadata, METH_O, "Set this thread's user_metadata string."},
    {"_hist_get_metadata", py_get_metadata, METH_NOARGS, "This thread's user_metadata string."},
    {"_hist_overhead_bytes", py_overhead, METH_NOARGS, "Host bytes used by rings and tables."},
    {"_hist_counts", py_counts, METH_NOARGS, "Sizes of the interning tables and rings."},
    {NULL, NULL, 0, NULL}};

static const gm_hist_api_t hist_api = {GM_HIST_API_VERSION,   gm_hist_capture,
                                       gm_hist_attach,        gm_hist_detach,
                                       gm_hist_context_level, gm_hist_set_thread_metadata,
                                       gm_hist_capture_script, gm_hist_configure,
                                       gm_hist_get_config,    gm_intern_string,
                                       gm_hist_thread_metadata, gm_intern_string_view,
                                       gm_hist_sample,
                                       gm_hist_copy,          gm_hist_copy_free,
                                       gm_hist_set_thread_compile_context};

int gm_py_hist_snapshot_init(PyObject *module) {
    if (gm_py_hist_frames_init() < 0)
        return -1;
    for (int i = 0; i < K_COUNT; i++)
        if (!(keys[i] = PyUnicode_InternFromString(key_text[i])))
            return -1;
    for (int i = 0; i < GM_ACT_COUNT; i++)
        if (!(action_str[i] = PyUnicode_InternFromString(gm_action_name(i))))
            return -1;
    if (PyModule_AddFunctions(module, snapshot_methods) < 0)
        return -1;
    PyObject *cap = PyCapsule_New((void *)&hist_api, "gpumem._C._hist_api", NULL);
    if (!cap || PyModule_AddObject(module, "_hist_api", cap) < 0) {
        Py_XDECREF(cap);
        return -1;
    }
    return 0;
}
