/*
 * trace_buffer.h - the events an Allocator(record_trace=True) keeps for
 * take_trace() (trace_buffer.c): a plain C array fed by the core's trace
 * hook under the allocator lock, turned into dicts only when taken.
 */
#ifndef GM_PYTHON_TRACE_BUFFER_H
#define GM_PYTHON_TRACE_BUFFER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>

#include "../core/gm_alloc.h"

typedef struct gm_py_trace_ev {
    uint8_t action;
    uintptr_t addr;
    size_t size;
    uintptr_t stream;
    uint32_t ctx;
} gm_py_trace_ev_t;

typedef struct gm_py_trace {
    /* Taken inside the allocator lock (by the hook), never the other way. */
    pthread_mutex_t lock;
    gm_py_trace_ev_t *ev; /* protected by: lock */
    size_t n, cap;        /* protected by: lock */
    int overflow;         /* protected by: lock; set when an event was dropped */
} gm_py_trace_t;

void gm_py_trace_init(gm_py_trace_t *t);
/* Frees the events; no hook may be running. */
void gm_py_trace_destroy(gm_py_trace_t *t);
/* A gm_trace_fn whose arg is the gm_py_trace_t. No GIL, no Python. */
void gm_py_trace_hook(void *arg, int device, gm_action_t action, uintptr_t addr, size_t size,
                      uintptr_t stream, uint32_t ctx);
/* The events recorded since the last call, as a list of dicts, and empty
 * the buffer. GIL held, no allocator lock. */
PyObject *gm_py_trace_take(gm_py_trace_t *t);

#endif /* GM_PYTHON_TRACE_BUFFER_H */
