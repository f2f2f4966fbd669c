/*
 * trace_objs.c - a trace's table of distinct values: a frames list equal,
 * item for item, to one already in the table is stored as that one (torch
 * writes a new list per entry of shared frame dicts), a str equal to one
 * already there likewise (Note [Compact trace entries] in trace_columns.c).
 */
#include "trace_objs.h"

int gm_tobjs_init(gm_tobjs_t *t) {
    t->objs = PyList_New(0);
    t->strs = PyDict_New();
    if (!t->objs || !t->strs || PyList_Append(t->objs, Py_None) < 0 ||
        gm_ptrmap_init(&t->by_ptr, 64) != 0 || gm_ptrmap_init(&t->by_hash, 64) != 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void gm_tobjs_free(gm_tobjs_t *t) {
    PyMem_Free(t->next);
    t->next = NULL;
    t->next_cap = 0;
    gm_ptrmap_free(&t->by_ptr);
    gm_ptrmap_free(&t->by_hash);
}

static int grow_next(gm_tobjs_t *t, Py_ssize_t need) {
    if (need <= t->next_cap)
        return 0;
    Py_ssize_t cap = t->next_cap ? t->next_cap * 2 : 64;
    while (cap < need)
        cap *= 2;
    uint32_t *p = PyMem_Realloc(t->next, (size_t)cap * sizeof *p);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    t->next = p;
    t->next_cap = cap;
    return 0;
}

/* Append obj to objs and index it by its address: its index, or -1 with an
 * exception. */
static long add_obj(gm_tobjs_t *t, PyObject *obj) {
    Py_ssize_t i = PyList_GET_SIZE(t->objs);
    if (i >= UINT32_MAX || grow_next(t, i + 1) < 0 || PyList_Append(t->objs, obj) < 0)
        return PyErr_Occurred() ? -1 : (PyErr_NoMemory(), -1);
    t->next[i] = 0;
    if (gm_ptrmap_put(&t->by_ptr, (uintptr_t)obj, (uintptr_t)i) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    return (long)i;
}

static uintptr_t list_hash(PyObject *list) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++)
        h = (h ^ (uint64_t)(uintptr_t)PyList_GET_ITEM(list, i)) * 0x100000001B3ull;
    return (uintptr_t)(h | 1);
}

static int same_items(PyObject *a, PyObject *b) {
    Py_ssize_t n = PyList_GET_SIZE(a);
    if (n != PyList_GET_SIZE(b))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyList_GET_ITEM(a, i) != PyList_GET_ITEM(b, i))
            return 0;
    return 1;
}

/* trace_objs.h */
long gm_tobjs_intern(gm_tobjs_t *t, PyObject *obj) {
    uintptr_t found;
    if (gm_ptrmap_get(&t->by_ptr, (uintptr_t)obj, &found)) /* one kept in objs */
        return (long)found;
    if (PyList_CheckExact(obj)) {
        uintptr_t h = list_hash(obj);
        if (gm_ptrmap_get(&t->by_hash, h, &found)) {
            for (uint32_t i = (uint32_t)found; i; i = t->next[i])
                if (same_items(PyList_GET_ITEM(t->objs, i), obj))
                    return (long)i;
        }
        long i = add_obj(t, obj);
        if (i < 0)
            return -1;
        if (gm_ptrmap_get(&t->by_hash, h, &found)) { /* chain behind the first */
            t->next[i] = t->next[found];
            t->next[found] = (uint32_t)i;
        } else if (gm_ptrmap_put(&t->by_hash, h, (uintptr_t)i) != 0) {
            PyErr_NoMemory();
            return -1;
        }
        return i;
    }
    if (PyUnicode_CheckExact(obj)) {
        PyObject *had = PyDict_GetItemWithError(t->strs, obj);
        if (had)
            return PyLong_AsLong(had);
        if (PyErr_Occurred())
            return -1;
    }
    long i = add_obj(t, obj);
    if (i < 0)
        return -1;
    if (PyUnicode_CheckExact(obj)) {
        PyObject *idx = PyLong_FromLong(i);
        int rc = idx ? PyDict_SetItem(t->strs, obj, idx) : -1;
        Py_XDECREF(idx);
        if (rc < 0)
            return -1;
    }
    return i;
}

