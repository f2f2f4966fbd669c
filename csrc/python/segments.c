/*
 * segments.c - segment and block dicts in torch's snapshot layout, written
 * once for Allocator.segments() and for history snapshots (hist_snapshot.c).
 *
 * Invariants: keys and their order are torch's; every key and the shared
 * values (state names, segment types, the default pool id (0, 0)) are the
 * same interned objects in every dict (a private pool's segment_pool_id is
 * a tuple of its own), so a pickled snapshot memoizes them. An
 * inactive block keeps the requested_size of its last allocation (0 if it
 * never had one), as torch's does; an unknown block state reads as
 * inactive.
 * Allocator.segments() walks the core in two phases: gm_alloc_walk copies
 * plain C values under the allocator lock, then the dicts are built with
 * no lock held.
 * Must not: create a Python object while an allocator lock is held.
 */
#include <stdint.h>
#include <stdlib.h>

#include "../base/grow.h"
#include "errors.h"
#include "segments.h"

#define MAX_JS_INT (((uint64_t)1 << 53) - 1)

/* Interned keys and values; created at module init, kept forever
 * (protected by: GIL, immutable after init). */
enum {
    K_DEVICE, K_ADDRESS, K_TOTAL_SIZE, K_ALLOCATED_SIZE, K_ACTIVE_SIZE, K_REQUESTED_SIZE,
    K_STREAM, K_SEGMENT_TYPE, K_SEGMENT_POOL_ID, K_IS_EXPANDABLE, K_FRAMES, K_BLOCKS, K_SIZE,
    K_STATE, V_SMALL, V_LARGE, K_COUNT
};
static const char *const key_text[K_COUNT] = {
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size",
    "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks", "size",
    "state", "small", "large"};
static PyObject *keys[K_COUNT];
static PyObject *state_str[3]; /* indexed by GM_BLOCK_* */
static PyObject *pool_id;      /* (0, 0) */

static PyObject *new_int(int clamp, uint64_t v) {
    if (clamp && v > MAX_JS_INT)
        v &= MAX_JS_INT;
    return PyLong_FromUnsignedLongLong(v);
}

/* d[keys[k]] = value, stealing value (NULL: an error is already set). */
static int put(PyObject *d, int k, PyObject *value) {
    if (!value)
        return -1;
    int rc = PyDict_SetItem(d, keys[k], value);
    Py_DECREF(value);
    return rc;
}

static int put_borrowed(PyObject *d, int k, PyObject *value) {
    return PyDict_SetItem(d, keys[k], value);
}

PyObject *gm_py_default_pool_id(void) { return pool_id; }

/* torch's segment_pool_id: (0, 0) for the default pools (the shared
 * object), the private pool's id otherwise; a new reference. */
static PyObject *segment_pool_id(const gm_mempool_id_t *id) {
    if (gm_mempool_id_is_default(*id)) {
        Py_INCREF(pool_id);
        return pool_id;
    }
    return Py_BuildValue("(KK)", (unsigned long long)id->first, (unsigned long long)id->second);
}

PyObject *gm_py_block_dict(const gm_block_info_t *b, PyObject *frames, int clamp) {
    int state = b->state >= GM_BLOCK_INACTIVE && b->state <= GM_BLOCK_ACTIVE_PENDING_FREE
                    ? b->state
                    : GM_BLOCK_INACTIVE;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (put(d, K_ADDRESS, new_int(clamp, b->address)) < 0 ||
        put(d, K_SIZE, new_int(clamp, b->size)) < 0 ||
        put(d, K_REQUESTED_SIZE, new_int(clamp, b->requested_size)) < 0 ||
        put_borrowed(d, K_STATE, state_str[state]) < 0 ||
        put_borrowed(d, K_FRAMES, frames) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

PyObject *gm_py_segment_dict(int device, const gm_segment_info_t *s, PyObject *frames,
                             PyObject *blocks, int clamp) {
    PyObject *d = PyDict_New();
    if (!d) {
        Py_DECREF(blocks);
        return NULL;
    }
    if (put(d, K_DEVICE, PyLong_FromLong(device)) < 0 ||
        put(d, K_ADDRESS, new_int(clamp, s->address)) < 0 ||
        put(d, K_TOTAL_SIZE, new_int(clamp, s->total_size)) < 0 ||
        put(d, K_ALLOCATED_SIZE, new_int(clamp, s->allocated_size)) < 0 ||
        put(d, K_ACTIVE_SIZE, new_int(clamp, s->active_size)) < 0 ||
        put(d, K_REQUESTED_SIZE, new_int(clamp, s->requested_size)) < 0 ||
        put(d, K_STREAM, new_int(clamp, s->stream)) < 0 ||
        put_borrowed(d, K_SEGMENT_TYPE, keys[s->is_small ? V_SMALL : V_LARGE]) < 0 ||
        put(d, K_SEGMENT_POOL_ID, segment_pool_id(&s->pool_id)) < 0 ||
        put_borrowed(d, K_IS_EXPANDABLE, s->is_expandable ? Py_True : Py_False) < 0 ||
        put_borrowed(d, K_FRAMES, frames) < 0) {
        Py_DECREF(blocks);
        Py_DECREF(d);
        return NULL;
    }
    if (put(d, K_BLOCKS, blocks) < 0) { /* steals blocks */
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ------------------------------------------------- Allocator.segments() */

/* One segment as copied under the allocator lock. */
typedef struct seg_copy {
    gm_segment_info_t info; /* info.blocks points into the copy's block array */
    size_t first_block;
} seg_copy_t;

typedef struct walk_copy {
    seg_copy_t *segs;
    size_t nseg, cap_seg;
    gm_block_info_t *blocks;
    size_t nblocks, cap_blocks;
} walk_copy_t;

/* Runs under the allocator lock: plain C copies only. */
static int copy_segment(void *arg, const gm_segment_info_t *seg) {
    walk_copy_t *w = arg;
    if (gm_grow((void **)&w->segs, &w->cap_seg, w->nseg + 1, sizeof *w->segs) ||
        gm_grow((void **)&w->blocks, &w->cap_blocks, w->nblocks + seg->nblocks,
             sizeof *w->blocks))
        return GM_ENOMEM;
    seg_copy_t *c = &w->segs[w->nseg++];
    c->info = *seg;
    c->info.blocks = NULL;
    c->first_block = w->nblocks;
    for (size_t i = 0; i < seg->nblocks; i++)
        w->blocks[w->nblocks++] = seg->blocks[i];
    return 0;
}

/* The dict of one copied segment. Every block and the segment get a frames
 * list of their own (empty: Allocator.segments() records no stacks). */
static PyObject *segment_from_copy(int device, const walk_copy_t *w, const seg_copy_t *c) {
    PyObject *blocks = PyList_New((Py_ssize_t)c->info.nblocks);
    if (!blocks)
        return NULL;
    for (size_t i = 0; i < c->info.nblocks; i++) {
        PyObject *frames = PyList_New(0);
        PyObject *bd = frames ? gm_py_block_dict(&w->blocks[c->first_block + i], frames, 0) : NULL;
        Py_XDECREF(frames);
        if (!bd) {
            Py_DECREF(blocks);
            return NULL;
        }
        PyList_SET_ITEM(blocks, (Py_ssize_t)i, bd);
    }
    PyObject *frames = PyList_New(0);
    if (!frames) {
        Py_DECREF(blocks);
        return NULL;
    }
    PyObject *sd = gm_py_segment_dict(device, &c->info, frames, blocks, 0);
    Py_DECREF(frames);
    return sd;
}

PyObject *gm_py_segments(gm_alloc_t *a) {
    walk_copy_t w = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gm_alloc_walk(a, copy_segment, &w);
    Py_END_ALLOW_THREADS
    PyObject *list = rc ? NULL : PyList_New((Py_ssize_t)w.nseg);
    if (rc)
        gm_py_raise(rc, NULL);
    int device = gm_alloc_device(a);
    for (size_t i = 0; list && i < w.nseg; i++) {
        PyObject *sd = segment_from_copy(device, &w, &w.segs[i]);
        if (!sd)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, sd);
    }
    free(w.segs);
    free(w.blocks);
    return list;
}

int gm_py_segments_init(PyObject *module) {
    for (int i = 0; i < K_COUNT; i++)
        if (!(keys[i] = PyUnicode_InternFromString(key_text[i])))
            return -1;
    static const char *const states[3] = {"inactive", "active_allocated", "active_pending_free"};
    for (int i = 0; i < 3; i++)
        if (!(state_str[i] = PyUnicode_InternFromString(states[i])))
            return -1;
    return (pool_id = Py_BuildValue("(ii)", 0, 0)) ? 0 : -1;
}
