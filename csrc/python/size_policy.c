/*
 * size_policy.c - the core's size policy for Python tools that must size
 * blocks as the allocator does (gpumem/snapshots/replay.py): _C.round_size,
 * _C.is_small and _C.segment_size wrap gm_size_round, gm_size_is_small and
 * gm_size_segment; plus the size constants (MIN_BLOCK_SIZE, SMALL_SIZE,
 * SMALL_BUFFER, LARGE_BUFFER, MAX_REQUEST) and _C.format_size, the byte-count text of
 * torch's out-of-memory message.
 *
 * Invariants: every value comes from the core or base (gm_alloc.h,
 * format.h); nothing here decides a size of its own, so Python and the
 * allocator cannot drift apart. Settings are read the way Allocator reads
 * them (settings.c). No allocator is involved: nothing here takes a lock.
 * Must not: re-implement any part of the policy.
 */
#include "../core/gm_alloc.h"
#include "settings.h"
#include "size_policy.h"

static PyObject *py_format_size(PyObject *self, PyObject *arg) {
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    char buf[64];
    gm_format_size((size_t)n, buf, sizeof buf);
    return PyUnicode_FromString(buf);
}

/* A non-negative int as size_t; -1 with an exception set otherwise. */
static int size_arg(PyObject *obj, const char *what, size_t *out) {
    unsigned long long n = PyLong_AsUnsignedLongLong(obj);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be an int from 0 to 2**64-1, not %R", what,
                         obj);
        }
        return -1;
    }
    *out = (size_t)n;
    return 0;
}

static PyObject *py_round_size(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"size", "settings", NULL};
    PyObject *size_obj, *settings = NULL;
    size_t size;
    gm_settings_t s;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O", kwlist, &size_obj, &settings) ||
        size_arg(size_obj, "size", &size) < 0 || gm_py_settings_from_obj(settings, &s) < 0)
        return NULL;
    return PyLong_FromSize_t(gm_size_round(&s, size));
}

static PyObject *py_is_small(PyObject *self, PyObject *arg) {
    size_t rounded;
    if (size_arg(arg, "rounded", &rounded) < 0)
        return NULL;
    return PyBool_FromLong(gm_size_is_small(rounded));
}

static PyObject *py_segment_size(PyObject *self, PyObject *arg) {
    size_t rounded;
    if (size_arg(arg, "rounded", &rounded) < 0)
        return NULL;
    return PyLong_FromSize_t(gm_size_segment(rounded));
}

static PyMethodDef methods[] = {
    {"round_size", (PyCFunction)(void (*)(void))py_round_size, METH_VARARGS | METH_KEYWORDS,
     "round_size(size, settings=None) -> the block size the allocator gives a request of "
     "size bytes under settings (a dict as for Allocator; None: the defaults)."},
    {"is_small", py_is_small, METH_O,
     "is_small(rounded) -> True if a rounded size is served by the small pool."},
    {"segment_size", py_segment_size, METH_O,
     "segment_size(rounded) -> bytes of the new segment a rounded request needs when "
     "nothing cached fits."},
    {"format_size", py_format_size, METH_O, "Format a byte count like torch's OOM message."},
    {NULL, NULL, 0, NULL}};

int gm_py_size_policy_init(PyObject *module) {
    if (PyModule_AddFunctions(module, methods) < 0 ||
        PyModule_AddIntConstant(module, "MIN_BLOCK_SIZE", (long)GM_MIN_BLOCK_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "SMALL_SIZE", (long)GM_SMALL_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "SMALL_BUFFER", (long)GM_SMALL_BUFFER) < 0 ||
        PyModule_AddIntConstant(module, "LARGE_BUFFER", (long)GM_LARGE_BUFFER) < 0 ||
        PyModule_AddIntConstant(module, "MAX_REQUEST", (long)GM_MAX_REQUEST) < 0)
        return -1;
    return 0;
}
