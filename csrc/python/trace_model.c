/*
 * trace_model.c - _C.trace_model: one device's trace, held as _C.TraceColumns
 * records, replayed into the columns of gpumem.snapshots.timeline's
 * DeviceModel in one pass, without a Python object per entry.
 *
 * Note [Native trace replay]
 * Rationale: the replay in Python (timeline.build_device) builds a list
 *   element per trace entry and per allocation: about 1 GB and 15 s for
 *   5,000,000 entries, where issue 34 asks for 4 x the file + 200 MB and
 *   10 s for summary, view and diff.
 * Approach: the same rules as build_device's loop, step by step (its module
 *   docstring states them), over the records: live addresses and addresses
 *   seen in one hash map, allocations and per-entry curves in int64
 *   columns handed back as bytearrays (the caller makes them arrays).
 *   Stacks are handed back as dense ids in the order build_device would
 *   have interned them (the trace's frames objects in first use, then the
 *   end blocks added), so the caller's StackTable numbers stacks and sites
 *   exactly as before.  Entries that only a few snapshots have (ooms,
 *   'snapshot', annotations, user_metadata changes) come back as indexes
 *   for the caller to read from the records.
 * Limitations: returns None, and the caller replays in Python, when a value
 *   leaves the 64-bit columns (an address of 2**64 - 1, sums past 2**63):
 *   only hostile snapshots do that.
 * Must not: keep a reference to the records after returning.
 */
#include "trace_model.h"

#include <string.h>

#include "pycompat.h"

#include "../base/ptrmap.h"
#include "trace_columns.h"

enum { A_OTHER, A_FREE_REQ, A_FREE_DONE, A_ALLOC, A_GROW, A_SHRINK, A_OOM, A_SNAP, A_ANNOT };

/* Each action of the trace by what the replay does with it (timeline.py's tuples). */
static int classify(PyObject *action) {
    static const struct {
        const char *name;
        int kind;
    } known[] = {{"free_requested", A_FREE_REQ}, {"free_completed", A_FREE_DONE},
                 {"free", A_FREE_DONE},          {"alloc", A_ALLOC},
                 {"segment_alloc", A_GROW},      {"segment_map", A_GROW},
                 {"segment_free", A_SHRINK},     {"segment_unmap", A_SHRINK},
                 {"oom", A_OOM},                 {"snapshot", A_SNAP},
                 {"user_defined", A_ANNOT}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (PyUnicode_CompareWithASCIIString(action, known[i].name) == 0)
            return known[i].kind;
    return A_OTHER;
}

typedef struct col {
    int64_t *v;
    Py_ssize_t n, cap;
} col_t;

static int col_push(col_t *c, int64_t x) {
    if (c->n == c->cap) {
        Py_ssize_t cap = c->cap < 1024 ? 1024 : c->cap + c->cap / 2;
        int64_t *p = PyMem_RawRealloc(c->v, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        c->v = p;
        c->cap = cap;
    }
    c->v[c->n++] = x;
    return 0;
}

enum { C_START, C_END, C_SIZE, C_ADDR, C_STACK, N_COLS };

typedef struct replay {
    PyObject *tc;
    gm_tcols_view_t v;
    Py_ssize_t n;
    col_t a[N_COLS];       /* per allocation: start, end, size, addr, dense stack id */
    gm_ptrmap_t addrs;     /* addr + 1 -> allocation index + 1, or DEAD once freed */
    gm_ptrmap_t stack_ids; /* objs index + 1 -> dense stack id */
    PyObject *stack_objs;  /* list: the frames objects by dense id */
    __int128 baseline;
    int overflow;
} replay_t;

#define DEAD UINTPTR_MAX

static int64_t stack_of(replay_t *r, uint32_t obj) {
    uintptr_t id;
    if (gm_ptrmap_get(&r->stack_ids, (uintptr_t)obj + 1, &id))
        return (int64_t)id;
    id = (uintptr_t)PyList_GET_SIZE(r->stack_objs);
    if (PyList_Append(r->stack_objs, PyList_GET_ITEM(r->v.objs, obj)) < 0)
        return -1;
    if (gm_ptrmap_put(&r->stack_ids, (uintptr_t)obj + 1, id) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    return (int64_t)id;
}

/* A new allocation: its index, or -1 with an exception. */
static Py_ssize_t new_alloc(replay_t *r, int64_t start, uint64_t size, uint64_t addr,
                            int64_t stack) {
    int64_t row[N_COLS] = {start, (int64_t)r->n, (int64_t)size, (int64_t)addr, stack};
    for (int c = 0; c < N_COLS; c++)
        if (col_push(&r->a[c], row[c]) < 0) {
            PyErr_NoMemory();
            return -1;
        }
    return r->a[0].n - 1;
}

static PyObject *take_col(int64_t *v, Py_ssize_t n) {
    return PyByteArray_FromStringAndSize((const char *)v, n * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *index_list(const col_t *c) {
    PyObject *l = PyList_New(c->n);
    for (Py_ssize_t i = 0; l && i < c->n; i++) {
        PyObject *x = PyLong_FromLongLong(c->v[i]);
        if (!x) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, x);
    }
    return l;
}

static int fits64(__int128 x) { return x >= INT64_MIN && x <= INT64_MAX; }

/* Per shape: the code of a key (gm_tcols_key_code), -1 when absent. */
typedef struct shape_keys {
    int frames, meta, time;
} shape_keys_t;

/* The replay proper; per-entry outputs go to allocated / times / known / seg. */
static int run(replay_t *r, const int *kind, const shape_keys_t *sk, int64_t *allocated,
               int64_t *times, uint8_t *known, int64_t *seg, col_t *special, PyObject *meta_runs,
               Py_ssize_t *inconsistencies, Py_ssize_t *seg_events) {
    const gm_trec_t *recs = r->v.recs;
    __int128 cur = 0;
    uint32_t last_meta = 0;
    int have_meta = 0;
    for (Py_ssize_t i = 0; i < r->n; i++) {
        const gm_trec_t *e = &recs[i];
        const shape_keys_t *k = &sk[e->shape];
        int what = kind[e->action];
        if (k->time >= 0) {
            times[i] = (int64_t)e->v[GM_TC_TIME];
            known[i] = 1;
        }
        if (k->meta >= 16) {
            uint32_t m = e->obj[k->meta - 16];
            PyObject *meta = PyList_GET_ITEM(r->v.objs, m);
            if (meta != Py_None && (!have_meta || m != last_meta)) {
                PyObject *pair = Py_BuildValue("(nO)", i, meta);
                if (!pair || PyList_Append(meta_runs, pair) < 0) {
                    Py_XDECREF(pair);
                    return -1;
                }
                Py_DECREF(pair);
                last_meta = m;
                have_meta = 1;
            }
        }
        uint32_t frames = k->frames >= 16 ? e->obj[k->frames - 16] : 0;
        uint64_t addr = e->v[GM_TC_ADDR], size = e->v[GM_TC_SIZE];
        if (what == A_FREE_REQ || what == A_FREE_DONE) {
            if (addr == UINT64_MAX)
                return r->overflow = 1, 0;
            uintptr_t a;
            int found = gm_ptrmap_get(&r->addrs, (uintptr_t)addr + 1, &a);
            if (!found) { /* allocated before the trace began */
                int64_t st = stack_of(r, frames);
                Py_ssize_t idx = st < 0 ? -1 : new_alloc(r, -1, size, addr, st);
                if (idx < 0)
                    return -1;
                r->baseline += size;
                a = (uintptr_t)idx + 1;
                if (gm_ptrmap_put(&r->addrs, (uintptr_t)addr + 1, a) != 0)
                    return PyErr_NoMemory(), -1;
            }
            if (what == A_FREE_DONE) {
                if (a == DEAD) {
                    (*inconsistencies)++;
                } else {
                    gm_ptrmap_put(&r->addrs, (uintptr_t)addr + 1, DEAD); /* overwrite */
                    r->a[C_END].v[a - 1] = (int64_t)i;
                    cur -= (uint64_t)r->a[C_SIZE].v[a - 1];
                }
            }
        } else if (what == A_ALLOC) {
            if (addr == UINT64_MAX)
                return r->overflow = 1, 0;
            uintptr_t old;
            if (gm_ptrmap_get(&r->addrs, (uintptr_t)addr + 1, &old) && old != DEAD) {
                r->a[C_END].v[old - 1] = (int64_t)i; /* allocated twice without a free */
                cur -= (uint64_t)r->a[C_SIZE].v[old - 1];
                (*inconsistencies)++;
            }
            int64_t st = stack_of(r, frames);
            Py_ssize_t idx = st < 0 ? -1 : new_alloc(r, (int64_t)i, size, addr, st);
            if (idx < 0)
                return -1;
            if (gm_ptrmap_put(&r->addrs, (uintptr_t)addr + 1, (uintptr_t)idx + 1) != 0)
                return PyErr_NoMemory(), -1;
            cur += size;
        } else if (what == A_GROW || what == A_SHRINK) {
            if (size > INT64_MAX)
                return r->overflow = 1, 0;
            seg[i] = what == A_GROW ? (int64_t)size : -(int64_t)size;
            (*seg_events)++;
        } else if (what == A_OOM || what == A_SNAP || what == A_ANNOT) {
            if (what == A_OOM && stack_of(r, frames) < 0) /* interned in trace order */
                return -1;
            if (col_push(&special[what - A_OOM], (int64_t)i) < 0)
                return PyErr_NoMemory(), -1;
        }
        if (!fits64(cur))
            return r->overflow = 1, 0;
        allocated[i] = (int64_t)cur;
    }
    return 0;
}

/* The active end blocks, [(addr, size), ...] in end_blocks order, that the
 * trace never names become allocations live before it; returns their
 * positions in ends (a new list), or NULL with an exception. */
static PyObject *add_end_blocks(replay_t *r, PyObject *ends) {
    PyObject *added = PyList_New(0);
    Py_ssize_t n_ends = PyList_GET_SIZE(ends);
    for (Py_ssize_t j = 0; added && j < n_ends && !r->overflow; j++) {
        PyObject *pair = PyList_GET_ITEM(ends, j);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyLong_Check(PyTuple_GET_ITEM(pair, 0)) || !PyLong_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "trace_model: end blocks are (addr, size) ints");
            Py_CLEAR(added);
            break;
        }
        unsigned long long addr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 0));
        unsigned long long size = addr == (unsigned long long)-1 && PyErr_Occurred()
                                      ? 0
                                      : PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 1));
        if (PyErr_Occurred() || addr == UINT64_MAX) { /* outside the columns */
            PyErr_Clear();
            r->overflow = 1;
            break;
        }
        uintptr_t a;
        if (gm_ptrmap_get(&r->addrs, (uintptr_t)addr + 1, &a))
            continue;
        int64_t dense = PyList_GET_SIZE(r->stack_objs) + PyList_GET_SIZE(added);
        PyObject *jo = PyLong_FromSsize_t(j);
        if (!jo || PyList_Append(added, jo) < 0 || new_alloc(r, -1, size, addr, dense) < 0) {
            Py_XDECREF(jo);
            Py_CLEAR(added);
            break;
        }
        Py_DECREF(jo);
        r->baseline += size;
    }
    return added;
}

static PyObject *finish(replay_t *r, int64_t *allocated, int64_t *seg, Py_ssize_t seg_events,
                        PyObject *reserved_end) {
    int overflow = 0;
    long long res_end = PyLong_AsLongLongAndOverflow(reserved_end, &overflow);
    if (res_end == -1 && PyErr_Occurred())
        return NULL;
    if (overflow || !fits64(r->baseline))
        return r->overflow = 1, Py_NewRef(Py_None);
    int64_t base = (int64_t)r->baseline, peak = base;
    Py_ssize_t peak_i = -1;
    for (Py_ssize_t i = 0; i < r->n; i++) {
        __int128 v = (__int128)allocated[i] + base;
        if (!fits64(v))
            return r->overflow = 1, Py_NewRef(Py_None);
        allocated[i] = (int64_t)v;
        if (peak_i < 0 || v > peak) {
            peak = (int64_t)v;
            peak_i = i;
        }
    }
    PyObject *reserved = Py_None;
    if (seg_events) {
        __int128 run = 0;
        for (Py_ssize_t i = 0; i < r->n; i++)
            run += seg[i];
        __int128 start = (__int128)res_end - run;
        run = 0;
        for (Py_ssize_t i = 0; i < r->n; i++) {
            run += seg[i];
            if (!fits64(start + run))
                return r->overflow = 1, Py_NewRef(Py_None);
            seg[i] = (int64_t)(start + run);
        }
        reserved = take_col(seg, r->n);
        if (!reserved)
            return NULL;
    } else {
        Py_INCREF(reserved);
    }
    return Py_BuildValue("(NLLn)", reserved, (long long)base, (long long)peak, peak_i);
}

static void replay_free(replay_t *r) {
    for (int c = 0; c < N_COLS; c++)
        PyMem_RawFree(r->a[c].v);
    gm_ptrmap_free(&r->addrs);
    gm_ptrmap_free(&r->stack_ids);
    Py_XDECREF(r->stack_objs);
}

static PyObject *trace_model(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *tc, *ends, *reserved_end;
    if (!PyArg_ParseTuple(args, "OO!O!:trace_model", &tc, &PyList_Type, &ends, &PyLong_Type,
                          &reserved_end))
        return NULL;
    replay_t r;
    memset(&r, 0, sizeof r);
    if (!gm_tcols_view(tc, &r.v)) {
        PyErr_SetString(PyExc_TypeError, "trace_model: expected a TraceColumns");
        return NULL;
    }
    r.tc = tc;
    r.n = r.v.n;
    int kind[256];
    shape_keys_t sk[256];
    for (Py_ssize_t a = 0; a < PyList_GET_SIZE(r.v.actions) && a < 256; a++)
        kind[a] = classify(PyList_GET_ITEM(r.v.actions, a));
    for (int s = 0; s < r.v.n_shapes && s < 256; s++)
        sk[s] = (shape_keys_t){gm_tcols_key_code(tc, s, "frames"),
                               gm_tcols_key_code(tc, s, "user_metadata"),
                               gm_tcols_key_code(tc, s, "time_us")};
    size_t n = (size_t)r.n;
    int64_t *allocated = PyMem_RawCalloc(n + 1, sizeof(int64_t));
    int64_t *times = PyMem_RawCalloc(n + 1, sizeof(int64_t));
    int64_t *seg = PyMem_RawCalloc(n + 1, sizeof(int64_t));
    uint8_t *known = PyMem_RawCalloc(n + 1, 1);
    col_t special[3];
    memset(special, 0, sizeof special);
    PyObject *meta_runs = PyList_New(0), *out = NULL, *added = NULL, *tail = NULL;
    r.stack_objs = PyList_New(0);
    Py_ssize_t inconsistencies = 0, seg_events = 0;
    if (!allocated || !times || !seg || !known || gm_ptrmap_init(&r.addrs, 1024) != 0 ||
        gm_ptrmap_init(&r.stack_ids, 64) != 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (!meta_runs || !r.stack_objs ||
        run(&r, kind, sk, allocated, times, known, seg, special, meta_runs, &inconsistencies,
            &seg_events) < 0)
        goto done;
    if (!r.overflow && !(added = add_end_blocks(&r, ends)))
        goto done;
    if (!r.overflow && !(tail = finish(&r, allocated, seg, seg_events, reserved_end)))
        goto done;
    if (r.overflow) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    Py_ssize_t n_known = 0;
    for (Py_ssize_t i = 0; i < r.n; i++)
        n_known += known[i];
    PyObject *mask = n_known == r.n ? (Py_INCREF(Py_None), Py_None)
                                    : PyByteArray_FromStringAndSize((const char *)known, r.n);
    Py_ssize_t na = r.a[0].n;
    out = Py_BuildValue("{s:n,s:N,s:N,s:n,s:N,s:N,s:N,s:N,s:N,s:N,s:O,s:O,s:N,s:N,s:N,s:O,s:n,"
                        "s:n,s:O}",
                        "n", r.n, "allocated", take_col(allocated, r.n), "times",
                        take_col(times, r.n), "times_known", n_known, "times_mask", mask,
                        "a_start", take_col(r.a[C_START].v, na), "a_end",
                        take_col(r.a[C_END].v, na), "a_size", take_col(r.a[C_SIZE].v, na),
                        "a_addr", take_col(r.a[C_ADDR].v, na), "a_stack",
                        take_col(r.a[C_STACK].v, na), "stack_objs", r.stack_objs, "ends_added",
                        added, "ooms", index_list(&special[0]), "snapshots",
                        index_list(&special[1]), "annotations", index_list(&special[2]),
                        "meta_runs", meta_runs, "inconsistencies", inconsistencies,
                        "seg_events", seg_events, "tail", tail);
done:
    PyMem_RawFree(allocated);
    PyMem_RawFree(times);
    PyMem_RawFree(seg);
    PyMem_RawFree(known);
    for (int k = 0; k < 3; k++)
        PyMem_RawFree(special[k].v);
    Py_XDECREF(meta_runs);
    Py_XDECREF(added);
    Py_XDECREF(tail);
    replay_free(&r);
    return out;
}

static PyMethodDef methods[] = {
    {"trace_model", trace_model, METH_VARARGS,
     "trace_model(trace_columns, end_blocks, reserved_end): one device's trace replayed into "
     "DeviceModel columns (Note [Native trace replay]), or None when a value leaves 64 bits."},
    {NULL, NULL, 0, NULL},
};

int gm_py_trace_model_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
