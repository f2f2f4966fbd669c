/*
 * cunwind_check.c - the cached C unwinder (csrc/history/cunwind.c, compiled
 * into this extension) against glibc's backtrace(), from one place.
 *
 * cunwind_walks() takes both walks in one function, so every address after
 * the first (each walk's own return address into it) must be the same;
 * cunwind_time() times each walk from the caller's stack.
 * Must not: be linked into gpumem._C (test-only).
 */
#include <execinfo.h>
#include <time.h>

#include "history/cunwind.h"
#include "testext.h"

enum { MAXF = 256 };

static PyObject *addr_list(const uintptr_t *a, int n) {
    PyObject *l = PyList_New(n < 0 ? 0 : n);
    for (int i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(a[i]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

/* cunwind_walks(max=256) -> (cached or None when it falls back, backtrace):
 * the caller's return addresses by both walks, innermost first. */
static __attribute__((noinline)) PyObject *py_walks(PyObject *self, PyObject *args) {
    int max = MAXF;
    if (!PyArg_ParseTuple(args, "|i", &max))
        return NULL;
    if (max < 1 || max > MAXF)
        return PyErr_Format(PyExc_ValueError, "max must be in 1..%d", MAXF);
    uintptr_t a[MAXF];
    void *b[MAXF];
    int na = gm_cunwind(a, max, 0);
    int nb = backtrace(b, max);
    uintptr_t bu[MAXF];
    for (int i = 0; i < nb; i++)
        bu[i] = (uintptr_t)b[i];
    PyObject *la = na < 0 ? Py_NewRef(Py_None) : addr_list(a, na);
    PyObject *lb = addr_list(bu, nb);
    if (!la || !lb) {
        Py_XDECREF(la);
        Py_XDECREF(lb);
        return NULL;
    }
    return Py_BuildValue("(NN)", la, lb);
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* cunwind_time(n) -> (frames, cached ns per walk, backtrace ns per walk). */
static PyObject *py_time(PyObject *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n <= 0)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "n must be > 0");
    uintptr_t a[MAXF];
    void *b[MAXF];
    int frames = gm_cunwind(a, MAXF, 0);
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        gm_cunwind(a, MAXF, 0);
    double t1 = now_ns();
    for (long i = 0; i < n; i++)
        backtrace(b, MAXF);
    double t2 = now_ns();
    return Py_BuildValue("(idd)", frames, (t1 - t0) / n, (t2 - t1) / n);
}

static PyMethodDef methods[] = {
    {"cunwind_walks", py_walks, METH_VARARGS,
     "cunwind_walks(max=256) -> (cached or None, backtrace): the caller's C return addresses"},
    {"cunwind_time", py_time, METH_O,
     "cunwind_time(n) -> (frames, cached_ns, backtrace_ns): each walk's time from here"},
    {NULL, NULL, 0, NULL}};

int tx_cunwind_init(PyObject *m) { return PyModule_AddFunctions(m, methods); }
