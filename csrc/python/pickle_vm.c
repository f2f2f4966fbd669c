/*
 * pickle_vm.c - the machinery under the snapshot pickle reader: the value
 * stack (at most MAX_STACK values), the marks (at most MAX_MARKS), the memo
 * and the errors, as CPython's unpickler keeps them.
 *
 * Invariants: memo slots hold an owned reference, NULL, or (odd) the tag of
 * a record in a TraceColumns (builder index << 40 | record) << 1 | 1; a GET
 * of a tag makes the record's dict once and keeps it in the slot. A store to
 * an index more than MEMO_SLACK past the stores made so far is refused
 * before any memory is reserved for it (gpumem/snapshots/pickle_scan.py's
 * rule). memo_dict maps each dict in the memo to its slot, so a trace entry
 * can be taken out of the memo when it becomes a record.
 * Must not: read opcodes (pickle_reader.c does).
 */
#include "pickle_vm.h"

#include <string.h>

#include "trace_columns.h"

PyObject *gm_pk_fail(gm_pk_t *r, const char *kind, PyObject *detail) {
    PyObject *args = Py_BuildValue("(sOn)", kind, detail ? detail : Py_None,
                                   (Py_ssize_t)(r->op_at - r->start));
    Py_XDECREF(detail);
    if (args) {
        PyErr_SetObject(PyExc_ValueError, args);
        Py_DECREF(args);
    }
    return NULL;
}

PyObject *gm_pk_corrupt(gm_pk_t *r, const char *text) {
    return gm_pk_fail(r, "corrupt", PyUnicode_FromString(text));
}

/* The pending Python exception as a "corrupt" error (MemoryError kept). */
PyObject *gm_pk_error(gm_pk_t *r) {
    if (PyErr_ExceptionMatches(PyExc_MemoryError))
        return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    PyObject *detail = text ? PyUnicode_FromFormat("%s: %U", ((PyTypeObject *)type)->tp_name,
                                                   text)
                            : NULL;
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (!detail)
        return NULL;
    return gm_pk_fail(r, "error", detail);
}

int gm_pk_need(gm_pk_t *r, Py_ssize_t n) {
    if (n < 0 || r->end - r->p < n) {
        gm_pk_fail(r, "truncated", NULL);
        return -1;
    }
    return 0;
}


int gm_pk_push(gm_pk_t *r, PyObject *v) { /* steals v */
    if (!v)
        return -1;
    if (r->sp == r->scap) {
        if (r->scap >= MAX_STACK) {
            Py_DECREF(v);
            gm_pk_corrupt(r, "more values on the unpickling stack than any snapshot holds");
            return -1;
        }
        Py_ssize_t cap = r->scap ? r->scap * 2 : 256;
        PyObject **s = PyMem_Realloc(r->stack, (size_t)cap * sizeof *s);
        if (!s) {
            Py_DECREF(v);
            PyErr_NoMemory();
            return -1;
        }
        r->stack = s;
        r->scap = cap;
    }
    r->stack[r->sp++] = v;
    return 0;
}


PyObject *gm_pk_pop(gm_pk_t *r) { /* a new reference (the stack's) */
    if (r->sp <= gm_pk_fence(r)) {
        gm_pk_corrupt(r, "unpickling stack underflow");
        return NULL;
    }
    return r->stack[--r->sp];
}

Py_ssize_t gm_pk_pop_mark(gm_pk_t *r) {
    if (!r->nmarks) {
        gm_pk_corrupt(r, "could not find MARK");
        return -1;
    }
    return r->marks[--r->nmarks];
}

int gm_pk_memo_put(gm_pk_t *r, uint64_t index) {
    if (r->sp <= 0) {
        gm_pk_corrupt(r, "empty stack for a memo store");
        return -1;
    }
    if (index > (uint64_t)r->stores + MEMO_SLACK) {
        gm_pk_fail(r, "memo", Py_BuildValue("(KK)", (unsigned long long)index,
                                      (unsigned long long)r->stores));
        return -1;
    }
    r->stores++;
    if ((Py_ssize_t)index >= r->mcap_memo) {
        Py_ssize_t cap = r->mcap_memo ? r->mcap_memo : 1024;
        while (cap <= (Py_ssize_t)index)
            cap *= 2;
        PyObject **m = PyMem_Realloc(r->memo, (size_t)cap * sizeof *m);
        if (!m) {
            PyErr_NoMemory();
            return -1;
        }
        memset(m + r->mcap_memo, 0, (size_t)(cap - r->mcap_memo) * sizeof *m);
        r->memo = m;
        r->mcap_memo = cap;
    }
    PyObject *old = r->memo[index];
    PyObject *v = r->stack[r->sp - 1];
    uintptr_t at;
    if (old && !((uintptr_t)old & 1) && PyDict_CheckExact(old) &&
        gm_ptrmap_get(&r->memo_dict, (uintptr_t)old, &at) && at == index + 1)
        gm_ptrmap_del(&r->memo_dict, (uintptr_t)old, &at);
    if (PyDict_CheckExact(v) && gm_ptrmap_put(&r->memo_dict, (uintptr_t)v, index + 1) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(v);
    r->memo[index] = v;
    if (!old)
        r->mcount++;
    else if (!((uintptr_t)old & 1))
        Py_DECREF(old);
    if ((Py_ssize_t)index >= r->mtop)
        r->mtop = (Py_ssize_t)index + 1;
    return 0;
}

int gm_pk_own_slots(gm_pk_t *r, PyObject *item, Py_ssize_t slots[1]) {
    int k = 0;
    uintptr_t at;
    if (gm_ptrmap_get(&r->memo_dict, (uintptr_t)item, &at) && r->memo[at - 1] == item)
        slots[k++] = (Py_ssize_t)at - 1;
    return Py_REFCNT(item) == 1 + k ? k : -1;
}

int gm_pk_memo_get(gm_pk_t *r, uint64_t index) {
    PyObject *v = (Py_ssize_t)index < r->mcap_memo ? r->memo[index] : NULL;
    if (!v) {
        gm_pk_corrupt(r, "Memo value not found");
        return -1;
    }
    if ((uintptr_t)v & 1) { /* a compacted entry: its dict, made once */
        uint64_t tag = (uint64_t)(uintptr_t)v >> 1;
        PyObject *b = PyList_GET_ITEM(r->builders, (Py_ssize_t)(tag >> 40));
        v = gm_tcols_item(b, (Py_ssize_t)(tag & ((1ull << 40) - 1)));
        if (!v)
            return -1;
        r->memo[index] = v; /* the memo's reference */
    }
    Py_INCREF(v);
    return gm_pk_push(r, v);
}
