/*
 * trace_objs.h - a trace's table of distinct values (trace_objs.c): the
 * frames lists, strs and other values of TraceColumns records that are not
 * one of the five integer fields, each stored once (Note [Compact trace
 * entries] in trace_columns.c). The GIL is held for every call.
 */
#ifndef GM_PYTHON_TRACE_OBJS_H
#define GM_PYTHON_TRACE_OBJS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../base/ptrmap.h"

typedef struct gm_tobjs {
    PyObject *objs;      /* list: the distinct objects; index 0 is None */
    PyObject *strs;      /* dict: str -> index into objs */
    gm_ptrmap_t by_ptr;  /* an object kept in objs -> its index */
    gm_ptrmap_t by_hash; /* content hash of a list | 1 -> first index with it */
    uint32_t *next;      /* per objs index: the next index with the same hash */
    Py_ssize_t next_cap;
} gm_tobjs_t;

/* Set up a zeroed table (objs holds None at index 0): 0, or -1 with an
 * exception (what was made is released by gm_tobjs_free and the owner's
 * clearing of objs and strs). */
int gm_tobjs_init(gm_tobjs_t *t);
/* The objs index of a value equal to obj (added if new: a list equal item
 * for item, a str equal, else the same object), or -1 with an exception. */
long gm_tobjs_intern(gm_tobjs_t *t, PyObject *obj);
/* Free the maps and the chains; objs and strs are the owner's to clear
 * (its tp_clear, so that the garbage collector sees them). */
void gm_tobjs_free(gm_tobjs_t *t);

#endif /* GM_PYTHON_TRACE_OBJS_H */
