/*
 * trace_buffer.c - Allocator(record_trace=True): every core event kept in
 * a plain C array until take_trace() turns it into dicts
 * ({action, addr | device_free, size, stream, ctx}).
 *
 * Invariants: the hook runs under the allocator lock, so it touches no
 * Python object and takes only the buffer's own lock (order: allocator
 * lock -> buffer lock). take detaches the array under the buffer lock and
 * builds the dicts after releasing it. The buffer holds at most 2^24
 * events; later ones are dropped and `overflow` is set.
 * Must not: take the GIL or call into the allocator from the hook.
 */
#include <stdlib.h>

#include "trace_buffer.h"

#define MAX_EVENTS ((size_t)1 << 24)

void gm_py_trace_init(gm_py_trace_t *t) {
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
}

void gm_py_trace_destroy(gm_py_trace_t *t) {
    pthread_mutex_destroy(&t->lock);
    free(t->ev);
    t->ev = NULL;
    t->n = t->cap = 0;
}

void gm_py_trace_hook(void *arg, int device, gm_action_t action, uintptr_t addr, size_t size,
                      uintptr_t stream, uint32_t ctx) {
    gm_py_trace_t *t = arg;
    pthread_mutex_lock(&t->lock);
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        gm_py_trace_ev_t *ev = cap > MAX_EVENTS ? NULL : realloc(t->ev, cap * sizeof *ev);
        if (!ev) {
            t->overflow = 1;
            pthread_mutex_unlock(&t->lock);
            return;
        }
        t->ev = ev;
        t->cap = cap;
    }
    t->ev[t->n++] = (gm_py_trace_ev_t){(uint8_t)action, addr, size, stream, ctx};
    pthread_mutex_unlock(&t->lock);
}

PyObject *gm_py_trace_take(gm_py_trace_t *t) {
    pthread_mutex_lock(&t->lock);
    gm_py_trace_ev_t *ev = t->ev;
    size_t n = t->n;
    t->ev = NULL;
    t->n = t->cap = 0;
    pthread_mutex_unlock(&t->lock);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const char *key = ev[i].action == GM_ACT_OOM ? "device_free" : "addr";
        PyObject *e = Py_BuildValue("{s:s,s:K,s:n,s:K,s:I}", "action",
                                    gm_action_name(ev[i].action), key,
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
