/*
 * trace_recorder.c - _testext.TraceRecorder(allocator): every core event of
 * a gpumem._C.Allocator kept in a plain C array until take() turns it into
 * dicts ({action, addr | device_free, size, stream, ctx}). Test-only: the
 * shipped module has no such buffer.
 *
 *     rec = _testext.TraceRecorder(a)   # a: gpumem._C.Allocator
 *     ...; rec.take()                   # the events since the last take()
 *
 * It installs itself through memory history's published entry points
 * (gm_hist_api_t): detach, then attach with this recorder as the chained
 * trace hook, so history keeps recording as before (the device's ring is
 * cleared, as a new allocator's attach clears it); when the recorder goes,
 * the allocator is attached again without it. One recorder per allocator.
 *
 * Invariants: the hook runs under the allocator lock, so it touches no
 * Python object and takes only the recorder's own lock (order: allocator
 * lock -> recorder lock). take detaches the array under the recorder lock
 * and builds the dicts after releasing it. The recorder holds at most 2^24
 * events; later ones are dropped and `overflow` is set. The recorder keeps
 * its allocator alive, so the hook never outlives the buffer.
 * Must not: take the GIL or call into the allocator from the hook.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "testext.h"

#define MAX_EVENTS ((size_t)1 << 24)

typedef struct trace_ev {
    uint8_t action;
    uintptr_t addr;
    size_t size;
    uintptr_t stream;
    uint32_t ctx;
} trace_ev_t;

typedef struct {
    PyObject_HEAD
    PyObject *allocator; /* the gpumem._C.Allocator (immutable after init) */
    gm_alloc_t *core;    /* its core, borrowed (immutable after init) */
    /* Taken inside the allocator lock (by the hook), never the other way. */
    pthread_mutex_t lock;
    trace_ev_t *ev;      /* protected by: lock */
    size_t n, cap;       /* protected by: lock */
    int overflow;        /* protected by: lock; set when an event was dropped */
} TraceRecorderObject;

/* A gm_trace_fn whose arg is the recorder. No GIL, no Python. */
static void trace_hook(void *arg, int device, gm_action_t action, uintptr_t addr, size_t size,
                       uintptr_t stream, uint32_t ctx) {
    TraceRecorderObject *t = arg;
    pthread_mutex_lock(&t->lock);
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        trace_ev_t *ev = cap > MAX_EVENTS ? NULL : realloc(t->ev, cap * sizeof *ev);
        if (!ev) {
            t->overflow = 1;
            pthread_mutex_unlock(&t->lock);
            return;
        }
        t->ev = ev;
        t->cap = cap;
    }
    t->ev[t->n++] = (trace_ev_t){(uint8_t)action, addr, size, stream, ctx};
    pthread_mutex_unlock(&t->lock);
}

static PyObject *TraceRecorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    TraceRecorderObject *self = (TraceRecorderObject *)type->tp_alloc(type, 0);
    if (self)
        pthread_mutex_init(&self->lock, NULL);
    return (PyObject *)self;
}

static int TraceRecorder_init(TraceRecorderObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"allocator", NULL};
    PyObject *allocator;
    if (self->core) {
        PyErr_SetString(PyExc_RuntimeError, "TraceRecorder is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O", kwlist, &allocator))
        return -1;
    gm_alloc_t *core = tx_core->allocator_core(allocator);
    if (!core)
        return -1;
    self->allocator = Py_NewRef(allocator);
    self->core = core;
    tx_hist->detach(core);
    tx_hist->attach(core, trace_hook, self); /* GM_EINVAL only for devices history skips */
    return 0;
}

static void TraceRecorder_dealloc(TraceRecorderObject *self) {
    if (self->core) {
        tx_hist->detach(self->core);
        tx_hist->attach(self->core, NULL, NULL);
    }
    Py_XDECREF(self->allocator);
    pthread_mutex_destroy(&self->lock);
    free(self->ev);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The events recorded since the last call, as a list of dicts, and empty
 * the buffer. GIL held, no allocator lock. */
static PyObject *TraceRecorder_take(TraceRecorderObject *self, PyObject *unused) {
    pthread_mutex_lock(&self->lock);
    trace_ev_t *ev = self->ev;
    size_t n = self->n;
    self->ev = NULL;
    self->n = self->cap = 0;
    pthread_mutex_unlock(&self->lock);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const char *key = ev[i].action == GM_ACT_OOM ? "device_free" : "addr";
        PyObject *e = Py_BuildValue("{s:s,s:K,s:n,s:K,s:I}", "action",
                                    tx_core->action_name(ev[i].action), key,
                                    (unsigned long long)ev[i].addr, "size",
                                    (Py_ssize_t)ev[i].size, "stream",
                                    (unsigned long long)ev[i].stream, "ctx", ev[i].ctx);
        if (!e) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, e);
    }
    free(ev);
    return list;
}

static PyObject *TraceRecorder_overflow(TraceRecorderObject *self, void *closure) {
    pthread_mutex_lock(&self->lock);
    int overflow = self->overflow;
    pthread_mutex_unlock(&self->lock);
    return PyBool_FromLong(overflow);
}

static PyMethodDef TraceRecorder_methods[] = {
    {"take", (PyCFunction)TraceRecorder_take, METH_NOARGS,
     "The allocator's events since the last call, as dicts."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef TraceRecorder_getset[] = {
    {"overflow", (getter)TraceRecorder_overflow, NULL, "True once an event was dropped.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TraceRecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_testext.TraceRecorder",
    .tp_basicsize = sizeof(TraceRecorderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TraceRecorder(allocator): records every core event of a gpumem._C.Allocator.",
    .tp_new = TraceRecorder_new,
    .tp_init = (initproc)TraceRecorder_init,
    .tp_dealloc = (destructor)TraceRecorder_dealloc,
    .tp_methods = TraceRecorder_methods,
    .tp_getset = TraceRecorder_getset,
};

int tx_trace_recorder_init(PyObject *module) {
    if (PyType_Ready(&TraceRecorderType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "TraceRecorder", (PyObject *)&TraceRecorderType);
}
