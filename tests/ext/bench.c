/*
 * bench.c - _testext.bench_pairs: the core's own cost of a malloc+free
 * pair, timed in C (benchmarks/core_alloc.py).
 *
 * Invariants: the loop calls the core of a gpumem._C.Allocator through the
 * core API table (the same functions the Allocator calls) with the GIL
 * released and no Python object touched; the Allocator is kept alive by the
 * caller's reference for the whole call. Contexts are 0: no history.
 * Must not: capture stacks or record anything: it measures the core alone.
 */
#include <time.h>

#include "testext.h"

/* bench_pairs(allocator, size, n, stream=0) -> nanoseconds for n pairs */
static PyObject *bench_pairs(PyObject *self, PyObject *args) {
    PyObject *obj;
    unsigned long long size, stream = 0;
    long n;
    if (!PyArg_ParseTuple(args, "OKl|K", &obj, &size, &n, &stream))
        return NULL;
    gm_alloc_t *a = tx_core->allocator_core(obj);
    if (!a)
        return NULL;
    if (n <= 0 || size == 0)
        return tx_core->raise_error(GM_EINVAL, "n and size must be positive");
    int rc = GM_OK;
    struct timespec t0, t1;
    Py_BEGIN_ALLOW_THREADS
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n && rc == GM_OK; i++) {
        uintptr_t p;
        rc = tx_core->malloc(a, (size_t)size, (uintptr_t)stream, 0, &p, NULL);
        if (rc == GM_OK)
            rc = tx_core->free(a, p, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    Py_END_ALLOW_THREADS
    if (rc)
        return tx_core->raise_error(rc, NULL);
    return PyLong_FromLongLong((long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL +
                               (t1.tv_nsec - t0.tv_nsec));
}

static PyMethodDef methods[] = {
    {"bench_pairs", bench_pairs, METH_VARARGS,
     "bench_pairs(allocator, size, n, stream=0) -> ns for n malloc+free pairs on a "
     "gpumem._C.Allocator, timed in C with the GIL released"},
    {NULL, NULL, 0, NULL}};

int tx_bench_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
