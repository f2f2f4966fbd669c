/*
 * errors.c - GM_E* codes as Python exceptions, and gpumem._C.OutOfMemoryError
 * with the text and attributes of torch's out-of-memory error.
 *
 * Invariants: a code maps to one exception type everywhere (ValueError for
 * bad input or pointers, MemoryError for host memory, OutOfMemoryError for
 * the device, RuntimeError otherwise). The OOM text and its attributes come
 * from the same gm_oom_info_t, so they never disagree.
 * Must not: be called with an allocator lock held (it allocates objects).
 */
#include "errors.h"
#include "pycompat.h"

/* gpumem._C.OutOfMemoryError; set once at module init (protected by: GIL,
 * immutable after init). */
static PyObject *oom_error = NULL;

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
        type = oom_error;
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
    if (o->has_limit) {
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
    PyObject *exc = PyObject_CallOneArg(oom_error, msg);
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
    PyErr_SetObject(oom_error, exc);
    Py_DECREF(exc);
    return NULL;
}

int gm_py_errors_init(PyObject *module) {
    oom_error = PyErr_NewExceptionWithDoc(
        "gpumem._C.OutOfMemoryError",
        "The device (or the memory limit) could not satisfy an allocation.", PyExc_MemoryError,
        NULL);
    if (!oom_error)
        return -1;
    return PyModule_AddObjectRef(module, "OutOfMemoryError", oom_error);
}
