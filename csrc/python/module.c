/*
 * module.c - gpumem._C: module init and the module functions that have no
 * file of their own yet (replay, the CUDA driver, format_size).
 *
 * Thin bindings only: no allocator policy lives here. Calls into the core
 * are made with the GIL held unless noted; the core never takes the GIL, so
 * the lock order GIL -> allocator lock always holds.
 */
#include <stdint.h>

#include "pyutil.h"

/* -------------------------------------------------------------- module */

static PyObject *py_format_size(PyObject *self, PyObject *arg) {
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    char buf[64];
    gm_format_size((size_t)n, buf, sizeof buf);
    return PyUnicode_FromString(buf);
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
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "gpumem._C",
                                       "gpumem's C allocator core and simulated device.", -1,
                                       methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (gm_py_errors_init(m) < 0 || gm_py_settings_init(m) < 0 || gm_py_segments_init(m) < 0 ||
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
