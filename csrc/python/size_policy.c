/*
 * size_policy.c - the core's size constants (MIN_BLOCK_SIZE, SMALL_SIZE,
 * SMALL_BUFFER, LARGE_BUFFER) and _C.format_size, the byte-count text of
 * torch's out-of-memory message.
 *
 * Invariants: every value comes from the core or base (gm_alloc.h,
 * format.h); nothing here decides a size of its own.
 * Must not: re-implement any part of the policy.
 */
#include "../core/gm_alloc.h"
#include "size_policy.h"

static PyObject *py_format_size(PyObject *self, PyObject *arg) {
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    char buf[64];
    gm_format_size((size_t)n, buf, sizeof buf);
    return PyUnicode_FromString(buf);
}

static PyMethodDef methods[] = {
    {"format_size", py_format_size, METH_O, "Format a byte count like torch's OOM message."},
    {NULL, NULL, 0, NULL}};

int gm_py_size_policy_init(PyObject *module) {
    if (PyModule_AddFunctions(module, methods) < 0 ||
        PyModule_AddIntConstant(module, "MIN_BLOCK_SIZE", (long)GM_MIN_BLOCK_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "SMALL_SIZE", (long)GM_SMALL_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "SMALL_BUFFER", (long)GM_SMALL_BUFFER) < 0 ||
        PyModule_AddIntConstant(module, "LARGE_BUFFER", (long)GM_LARGE_BUFFER) < 0)
        return -1;
    return 0;
}
