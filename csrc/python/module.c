/*
 * module.c - gpumem._C: module init, error translation, settings and the
 * dict builders (stats in torch.cuda.memory_stats layout, segments in the
 * torch snapshot layout).
 *
 * Thin bindings only: no allocator policy lives here. Calls into the core
 * are made with the GIL held unless noted; the core never takes the GIL, so
 * the lock order GIL -> allocator lock always holds.
 */
#include <stdint.h>

#include "pyutil.h"

PyObject *gm_py_oom_error = NULL;

PyObject *gm_py_raise(int code, const char *detail) {
    PyObject *type = PyExc_RuntimeError;
    switch (code) {
    case GM_EINVAL:
    case GM_ENOTFOUND:
    case GM_EDOUBLEFREE:
        type = PyExc_ValueError;
        break;
    case GM_ENOMEM:
        type = PyExc_MemoryError;
        break;
    case GM_EOOM:
        type = gm_py_oom_error;
        break;
    default:
        break;
    }
    if (detail && detail[0])
        PyErr_Format(type, "%s: %s", gm_strerror(code), detail);
    else
        PyErr_SetString(type, gm_strerror(code));
    return NULL;
}

void gm_py_format_oom(int device, const gm_oom_info_t *o, char *buf, size_t buflen) {
    char want[32], total[32], freeb[32], alloc[32], unalloc[32], allowed[48] = "";
    gm_format_size(o->alloc_size, want, sizeof want);
    gm_format_size(o->device_total, total, sizeof total);
    gm_format_size(o->device_free, freeb, sizeof freeb);
    gm_format_size(o->allocated, alloc, sizeof alloc);
    gm_format_size(o->reserved_unallocated, unalloc, sizeof unalloc);
    if (o->allowed) {
        gm_format_size(o->allowed, allowed, sizeof allowed - 10);
        strcat(allowed, " allowed; ");
    }
    snprintf(buf, buflen,
             "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which "
             "%s is free. %sOf the allocated memory %s is allocated by gpumem, and %s is reserved "
             "by gpumem but unallocated. If reserved but unallocated memory is large try setting "
             "GPUMEM_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
             want, device, total, freeb, allowed, alloc, unalloc);
}

PyObject *gm_py_raise_oom(int device, const gm_oom_info_t *o) {
    char text[512];
    gm_py_format_oom(device, o, text, sizeof text);
    PyObject *msg = PyUnicode_FromString(text);
    if (!msg)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(gm_py_oom_error, msg);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    struct {
        const char *name;
        size_t value;
    } attrs[] = {{"requested", o->requested},
                 {"rounded", o->rounded},
                 {"alloc_size", o->alloc_size},
                 {"device_total", o->device_total},
                 {"device_free", o->device_free},
                 {"allocated", o->allocated},
                 {"reserved", o->reserved},
                 {"reserved_unallocated", o->reserved_unallocated},
                 {"allowed", o->allowed}};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        PyObject *v = PyLong_FromSize_t(attrs[i].value);
        if (!v || PyObject_SetAttrString(exc, attrs[i].name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(exc);
            return NULL;
        }
        Py_DECREF(v);
    }
    PyObject *dev = PyLong_FromLong(device), *hit = PyBool_FromLong(o->limit_hit);
    if (!dev || !hit || PyObject_SetAttrString(exc, "device", dev) < 0 ||
        PyObject_SetAttrString(exc, "limit_hit", hit) < 0) {
        Py_XDECREF(dev);
        Py_XDECREF(hit);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(dev);
    Py_DECREF(hit);
    PyErr_SetObject(gm_py_oom_error, exc);
    Py_DECREF(exc);
    return NULL;
}

/* ------------------------------------------------------------ settings */

static const char *const setting_keys[] = {"expandable_segments", "max_split_size",
                                           "garbage_collection_threshold",
                                           "roundup_power2_divisions", NULL};

int gm_py_settings_from_obj(PyObject *obj, gm_settings_t *out) {
    gm_settings_default(out);
    if (!obj || obj == Py_None)
        return 0;
    if (!PyDict_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "settings must be a dict or None");
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int known = 0;
        for (int i = 0; k && setting_keys[i]; i++)
            known |= strcmp(k, setting_keys[i]) == 0;
        if (!known) {
            PyErr_Format(PyExc_ValueError,
                         "unknown allocator setting %R; expected expandable_segments, "
                         "max_split_size, garbage_collection_threshold or "
                         "roundup_power2_divisions",
                         key);
            return -1;
        }
    }
    PyObject *v;
    if ((v = PyDict_GetItemString(obj, "expandable_segments"))) {
        int t = PyObject_IsTrue(v);
        if (t < 0)
            return -1;
        out->expandable_segments = t;
    }
    if ((v = PyDict_GetItemString(obj, "max_split_size")) && v != Py_None) {
        long long m = PyLong_AsLongLong(v);
        if (m == -1 && PyErr_Occurred())
            return -1;
        out->max_split_size = m < 0 ? SIZE_MAX : (size_t)m;
    }
    if ((v = PyDict_GetItemString(obj, "garbage_collection_threshold"))) {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        out->garbage_collection_threshold = d;
    }
    if ((v = PyDict_GetItemString(obj, "roundup_power2_divisions")) && v != Py_None) {
        PyObject *seq = PySequence_Fast(v, "roundup_power2_divisions must be a list of 16 ints");
        if (!seq)
            return -1;
        if (PySequence_Fast_GET_SIZE(seq) != GM_ROUNDUP_INTERVALS) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "roundup_power2_divisions must have 16 entries");
            return -1;
        }
        for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++) {
            long d = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
            if (d == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            out->roundup_power2_divisions[i] = d < 0 ? 0 : (uint32_t)d;
        }
        Py_DECREF(seq);
    }
    char msg[128];
    if (gm_settings_validate(out, msg, sizeof msg)) {
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    return 0;
}

PyObject *gm_py_settings_to_dict(const gm_settings_t *s) {
    PyObject *divs = PyList_New(GM_ROUNDUP_INTERVALS);
    if (!divs)
        return NULL;
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++)
        PyList_SET_ITEM(divs, i, PyLong_FromUnsignedLong(s->roundup_power2_divisions[i]));
    return Py_BuildValue("{s:O,s:L,s:d,s:N}", "expandable_segments",
                         s->expandable_segments ? Py_True : Py_False, "max_split_size",
                         s->max_split_size == SIZE_MAX ? -1LL : (long long)s->max_split_size,
                         "garbage_collection_threshold", s->garbage_collection_threshold,
                         "roundup_power2_divisions", divs);
}

/* --------------------------------------------------------------- stats */

static int put_int(PyObject *d, const char *key, int64_t v) {
    PyObject *o = PyLong_FromLongLong(v);
    if (!o)
        return -1;
    int rc = PyDict_SetItemString(d, key, o);
    Py_DECREF(o);
    return rc;
}

static int put_stat(PyObject *d, const char *prefix, const gm_stat_t *s) {
    char key[96];
    const char *names[4] = {"current", "peak", "allocated", "freed"};
    int64_t vals[4] = {s->current, s->peak, s->allocated, s->freed};
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "%s.%s", prefix, names[i]);
        if (put_int(d, key, vals[i]))
            return -1;
    }
    return 0;
}

PyObject *gm_py_stats_dict(const gm_stats_t *st) {
    static const char *const types[GM_STAT_NTYPES] = {"all", "small_pool", "large_pool"};
    struct {
        const char *name;
        const gm_stat_t *arr;
    } fams[] = {{"allocation", st->allocation},
                {"segment", st->segment},
                {"active", st->active},
                {"inactive_split", st->inactive_split},
                {"allocated_bytes", st->allocated_bytes},
                {"reserved_bytes", st->reserved_bytes},
                {"active_bytes", st->active_bytes},
                {"inactive_split_bytes", st->inactive_split_bytes},
                {"requested_bytes", st->requested_bytes}};
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    char prefix[64];
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++)
        for (int t = 0; t < GM_STAT_NTYPES; t++) {
            snprintf(prefix, sizeof prefix, "%s.%s", fams[f].name, types[t]);
            if (put_stat(d, prefix, &fams[f].arr[t]))
                goto fail;
        }
    if (put_stat(d, "oversize_allocations", &st->oversize_allocations) ||
        put_stat(d, "oversize_segments", &st->oversize_segments) ||
        put_int(d, "num_alloc_retries", st->num_alloc_retries) ||
        put_int(d, "num_ooms", st->num_ooms) ||
        put_int(d, "num_sync_all_streams", st->num_sync_all_streams) ||
        put_int(d, "num_device_alloc", st->num_device_alloc) ||
        put_int(d, "num_device_free", st->num_device_free) ||
        put_int(d, "max_split_size", st->max_split_size))
        goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* ------------------------------------------------------------ segments */

static const char *const state_names[3] = {"inactive", "active_allocated", "active_pending_free"};

static int segment_cb(void *arg, const gm_segment_info_t *seg) {
    PyObject *list = arg;
    PyObject *blocks = PyList_New((Py_ssize_t)seg->nblocks);
    if (!blocks)
        return -1;
    for (size_t i = 0; i < seg->nblocks; i++) {
        const gm_block_info_t *b = &seg->blocks[i];
        int active = b->state != GM_BLOCK_INACTIVE;
        PyObject *bd = Py_BuildValue("{s:K,s:n,s:n,s:s,s:[]}", "address",
                                     (unsigned long long)b->address, "size", (Py_ssize_t)b->size,
                                     "requested_size", (Py_ssize_t)(active ? b->requested_size : 0),
                                     "state", state_names[b->state], "frames");
        if (!bd) {
            Py_DECREF(blocks);
            return -1;
        }
        PyList_SET_ITEM(blocks, (Py_ssize_t)i, bd);
    }
    PyObject *sd = Py_BuildValue(
        "{s:i,s:K,s:n,s:n,s:n,s:n,s:K,s:s,s:(ii),s:O,s:[],s:N}", "device", 0, "address",
        (unsigned long long)seg->address, "total_size", (Py_ssize_t)seg->total_size,
        "allocated_size", (Py_ssize_t)seg->allocated_size, "active_size",
        (Py_ssize_t)seg->active_size, "requested_size", (Py_ssize_t)seg->requested_size, "stream",
        (unsigned long long)seg->stream, "segment_type", seg->is_small ? "small" : "large",
        "segment_pool_id", 0, 0, "is_expandable", seg->is_expandable ? Py_True : Py_False,
        "frames", "blocks", blocks);
    if (!sd)
        return -1;
    int rc = PyList_Append(list, sd);
    Py_DECREF(sd);
    return rc;
}

PyObject *gm_py_segments(gm_alloc_t *a) {
    PyObject *list = PyList_New(0);
    if (!list)
        return NULL;
    int rc = gm_alloc_walk(a, segment_cb, list);
    if (rc) {
        Py_DECREF(list);
        if (!PyErr_Occurred())
            gm_py_raise(rc, NULL);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    PyObject *dev = PyLong_FromLong(gm_alloc_device(a));
    for (Py_ssize_t i = 0; dev && i < n; i++)
        PyDict_SetItemString(PyList_GET_ITEM(list, i), "device", dev);
    Py_XDECREF(dev);
    return list;
}

/* -------------------------------------------------------------- module */

static PyObject *py_format_size(PyObject *self, PyObject *arg) {
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    char buf[64];
    gm_format_size((size_t)n, buf, sizeof buf);
    return PyUnicode_FromString(buf);
}

static PyObject *py_default_settings(PyObject *self, PyObject *unused) {
    gm_settings_t s;
    gm_settings_default(&s);
    return gm_py_settings_to_dict(&s);
}

static PyMethodDef methods[] = {
    {"replay", (PyCFunction)(void (*)(void))gm_py_replay, METH_VARARGS | METH_KEYWORDS,
     "replay(actions, addrs, sizes, streams, *, capacity, settings=None, granularity=2MiB)\n"
     "Replay alloc (0) / free (1) ops through the core on a virtual simulated device."},
    {"cuda_open", (PyCFunction)(void (*)(void))gm_py_cuda_open, METH_VARARGS | METH_KEYWORDS,
     "cuda_open(path=None) -> {'path', 'device_count'}: load the CUDA driver (once)."},
    {"cuda_last_result", gm_py_cuda_last_result, METH_NOARGS,
     "CUresult of this thread's last failed driver call."},
    {"format_size", py_format_size, METH_O, "Format a byte count like torch's OOM message."},
    {"default_settings", py_default_settings, METH_NOARGS, "The default allocator settings."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "gpumem._C",
                                       "gpumem's C allocator core and simulated device.", -1,
                                       methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    gm_py_oom_error = PyErr_NewExceptionWithDoc(
        "gpumem._C.OutOfMemoryError",
        "The device (or the memory limit) could not satisfy an allocation.", PyExc_MemoryError,
        NULL);
    if (!gm_py_oom_error || PyModule_AddObjectRef(m, "OutOfMemoryError", gm_py_oom_error) < 0 ||
        gm_py_allocator_register(m) < 0 || gm_py_hist_capture_init(m) < 0 ||
        gm_py_hist_snapshot_init(m) < 0 || gm_py_core_api_init(m) < 0 ||
        PyModule_AddIntConstant(m, "MIN_BLOCK_SIZE", (long)GM_MIN_BLOCK_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "SMALL_SIZE", (long)GM_SMALL_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "SMALL_BUFFER", (long)GM_SMALL_BUFFER) < 0 ||
        PyModule_AddIntConstant(m, "LARGE_BUFFER", (long)GM_LARGE_BUFFER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
