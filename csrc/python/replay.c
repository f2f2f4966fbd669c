/*
 * replay.c - _C.replay: alloc/free/release op lists (from a snapshot's
 * trace, gpumem/snapshots/replay.py) run through the core on a fresh virtual simulated
 * device, for the fragmentation and speed figures of `gpumem replay`.
 * A release op is the core's empty_cache, where the trace shows torch
 * giving cached memory back (gpumem/snapshots/replay.py, Note [Replaying releases]).
 *
 * Invariants: each call owns its virtual device and core, and destroys
 * both before returning; nothing is shared between calls. The loop runs
 * with the GIL released and touches no Python object. A trace address is
 * mapped to the pointer the core returned (its free goes to that pointer);
 * an alloc that hit OOM is remembered so its free is skipped. The map's
 * key is the address + 1 (0 is its empty key), so the one address whose
 * key would be 0, 2**64 - 1, has a slot of its own. The core is
 * checked (gm_alloc_check) after every replay.
 * Must not: be used for anything but whole-trace replay (no hooks, no
 * history: the core is not attached to memory history).
 */
#include <time.h>

#include "../base/ptrmap.h"
#include "../device/vdev.h"
#include "errors.h"
#include "replay.h"
#include "settings.h"

typedef struct replay_result {
    long ops, ooms, unknown_frees, conflicts, releases;
    long long elapsed_ns;
    int rc;
} replay_result_t;

/* The trace address -> pointer map: a ptrmap keyed by address + 1, and a
 * slot of its own for the address that wraps to key 0. */
typedef struct addr_map {
    gm_ptrmap_t map;
    int top_live;      /* address 2**64 - 1 is mapped */
    uintptr_t top_ptr;
} addr_map_t;

static int map_del(addr_map_t *m, uint64_t addr, uintptr_t *ptr) {
    uintptr_t key = (uintptr_t)addr + 1;
    if (key)
        return gm_ptrmap_del(&m->map, key, ptr);
    if (!m->top_live)
        return 0;
    m->top_live = 0;
    *ptr = m->top_ptr;
    return 1;
}

static int map_put(addr_map_t *m, uint64_t addr, uintptr_t ptr) {
    uintptr_t key = (uintptr_t)addr + 1;
    if (key)
        return gm_ptrmap_put(&m->map, key, ptr);
    m->top_live = 1;
    m->top_ptr = ptr;
    return GM_OK;
}

static void run_replay(gm_alloc_t *a, const uint8_t *act, const uint64_t *addr,
                       const uint64_t *size, const uint64_t *stream, size_t n,
                       replay_result_t *r) {
    addr_map_t map = {.top_live = 0};
    if (gm_ptrmap_init(&map.map, 4096)) {
        r->rc = GM_ENOMEM;
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < n; i++) {
        uintptr_t ptr;
        if (act[i] == 2) {
            int rc = gm_alloc_empty_cache(a, 0);
            if (rc) {
                r->rc = rc;
                break;
            }
            r->releases++;
        } else if (act[i] == 0) {
            if (map_del(&map, addr[i], &ptr)) {
                r->conflicts++;
                if (ptr)
                    gm_alloc_free(a, ptr, 0);
            }
            int rc = gm_alloc_malloc(a, (size_t)size[i], (uintptr_t)stream[i], 0, &ptr, NULL);
            if (rc == GM_EOOM) {
                r->ooms++;
                ptr = 0; /* remembered as failed: its free is skipped */
                rc = GM_OK;
            }
            if (rc || map_put(&map, addr[i], ptr)) {
                r->rc = rc ? rc : GM_ENOMEM;
                break;
            }
        } else if (map_del(&map, addr[i], &ptr)) {
            int rc = ptr ? gm_alloc_free(a, ptr, 0) : GM_OK;
            if (rc) {
                r->rc = rc;
                break;
            }
        } else {
            r->unknown_frees++;
        }
        r->ops++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r->elapsed_ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    gm_ptrmap_free(&map.map);
}

static PyObject *py_replay(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"actions", "addrs", "sizes", "streams", "capacity",
                             "settings", "granularity", NULL};
    Py_buffer act = {0}, addr = {0}, size = {0}, stream = {0};
    unsigned long long capacity = (unsigned long long)80 << 30;
    unsigned long long granularity = (unsigned long long)2 << 20;
    PyObject *settings = NULL, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*y*y*|$KOK", kwlist, &act, &addr, &size,
                                     &stream, &capacity, &settings, &granularity))
        return NULL;
    size_t n = (size_t)act.len;
    gm_settings_t s;
    gm_vdev_config_t cfg;
    gm_vdev_t *vdev = NULL;
    gm_alloc_t *a = NULL;
    if ((size_t)addr.len != n * 8 || (size_t)size.len != n * 8 || (size_t)stream.len != n * 8) {
        PyErr_SetString(PyExc_ValueError,
                        "addrs, sizes and streams must hold 8-byte integers, one per action");
        goto done;
    }
    if (gm_py_settings_from_obj(settings, &s) < 0)
        goto done;
    gm_vdev_config_default(&cfg);
    cfg.capacity = (size_t)capacity;
    cfg.granularity = (size_t)granularity;
    int rc = gm_vdev_create(&cfg, &vdev);
    if (!rc)
        rc = gm_alloc_create(gm_vdev_backend(vdev), 0, &s, &a);
    if (rc) {
        gm_py_raise(rc, "bad capacity or granularity for the virtual device");
        goto done;
    }
    const uint8_t *acts = act.buf;
    for (size_t i = 0; i < n; i++)
        if (acts[i] > 2) {
            PyErr_Format(PyExc_ValueError,
                         "actions[%zu] is %d; expected 0 (alloc), 1 (free) or 2 (release)", i,
                         acts[i]);
            goto done;
        }
    replay_result_t r;
    memset(&r, 0, sizeof r);
    Py_BEGIN_ALLOW_THREADS
    run_replay(a, acts, addr.buf, size.buf, stream.buf, n, &r);
    Py_END_ALLOW_THREADS
    if (r.rc) {
        gm_py_raise(r.rc, "during replay");
        goto done;
    }
    gm_stats_t st;
    gm_alloc_get_stats(a, &st);
    char msg[256];
    int bad = gm_alloc_check(a, msg, sizeof msg);
    if (bad) {
        PyErr_Format(PyExc_RuntimeError, "allocator invariant violated after replay: %s", msg);
        goto done;
    }
    result = Py_BuildValue(
        "{s:l,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:l,s:l,s:l,s:l,s:L,s:L,s:O}", "ops", r.ops,
        "elapsed_ns", r.elapsed_ns, "peak_allocated",
        (long long)st.allocated_bytes[GM_STAT_ALL].peak, "peak_requested",
        (long long)st.requested_bytes[GM_STAT_ALL].peak,
        "peak_reserved", (long long)st.reserved_bytes[GM_STAT_ALL].peak, "peak_active",
        (long long)st.active_bytes[GM_STAT_ALL].peak, "num_device_alloc",
        (long long)st.num_device_alloc, "num_device_free", (long long)st.num_device_free,
        "num_alloc_retries", (long long)st.num_alloc_retries, "num_ooms", r.ooms, "unknown_frees",
        r.unknown_frees, "conflicts", r.conflicts, "releases", r.releases, "reserved_end",
        (long long)st.reserved_bytes[GM_STAT_ALL].current, "allocated_end",
        (long long)st.allocated_bytes[GM_STAT_ALL].current, "expandable",
        gm_alloc_expandable_active(a) ? Py_True : Py_False);
done:
    if (a)
        gm_alloc_destroy(a);
    if (vdev)
        gm_vdev_destroy(vdev);
    PyBuffer_Release(&act);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&size);
    PyBuffer_Release(&stream);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", (PyCFunction)(void (*)(void))py_replay, METH_VARARGS | METH_KEYWORDS,
     "replay(actions, addrs, sizes, streams, *, capacity, settings=None, granularity=2MiB)\n"
     "Replay alloc (0) / free (1) / release (2: empty_cache) ops through the core on a\n"
     "virtual device."},
    {NULL, NULL, 0, NULL}};

int gm_py_replay_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
