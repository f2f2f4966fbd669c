/*
 * cuda_driver.c - the process's CUDA driver handle: opened once, on first
 * use, by gpumem._C.Allocator(backend='cuda'), _C.cuda_open() or the torch
 * shim through the core API capsule (core_api.c), whichever comes first.
 *
 * Invariants: there is at most one gm_cuda_t per process and, once set, it
 * never changes or goes away (the driver cannot be unloaded safely while
 * allocations may live), so callers keep the pointer without a reference.
 * gm_py_cuda_handle needs no GIL (the shim calls it from torch's threads).
 * Must not: take the GIL or an allocator lock while holding g_cuda_lock.
 */
#include <pthread.h>

#include "cuda_driver.h"

/* g_cuda is set once and never changes after
 * (protected by: g_cuda_lock until set, immutable after). */
static gm_cuda_t *g_cuda = NULL;
static pthread_mutex_t g_cuda_lock = PTHREAD_MUTEX_INITIALIZER;

int gm_py_cuda_handle(const char *path, gm_cuda_t **out, char *err, size_t errlen) {
    pthread_mutex_lock(&g_cuda_lock);
    int rc = GM_OK;
    if (g_cuda) {
        if (path && path[0] && strcmp(path, gm_cuda_path(g_cuda))) {
            snprintf(err, errlen, "the CUDA driver is already loaded from %s; cannot load %s as well",
                     gm_cuda_path(g_cuda), path);
            rc = GM_ESTATE;
        }
    } else {
        gm_cuda_t *c = NULL;
        rc = gm_cuda_open(path, &c, err, errlen);
        if (rc == GM_OK)
            g_cuda = c;
    }
    *out = rc == GM_OK ? g_cuda : NULL;
    pthread_mutex_unlock(&g_cuda_lock);
    return rc;
}

gm_cuda_t *gm_py_cuda_get(const char *path) {
    char err[768];
    gm_cuda_t *c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gm_py_cuda_handle(path, &c, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_SetString(PyExc_RuntimeError, err);
        return NULL;
    }
    return c;
}

static PyObject *py_cuda_open(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", NULL};
    const char *path = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|z", kwlist, &path))
        return NULL;
    gm_cuda_t *c = gm_py_cuda_get(path);
    if (!c)
        return NULL;
    int n = 0;
    gm_cuda_device_count(c, &n);
    return Py_BuildValue("{s:s,s:i}", "path", gm_cuda_path(c), "device_count", n);
}

static PyObject *py_cuda_last_result(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(gm_cuda_last_result());
}

static PyMethodDef methods[] = {
    {"cuda_open", (PyCFunction)(void (*)(void))py_cuda_open, METH_VARARGS | METH_KEYWORDS,
     "cuda_open(path=None) -> {'path', 'device_count'}: load the CUDA driver (once)."},
    {"cuda_last_result", py_cuda_last_result, METH_NOARGS,
     "CUresult of this thread's last failed driver call."},
    {NULL, NULL, 0, NULL}};

int gm_py_cuda_driver_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
