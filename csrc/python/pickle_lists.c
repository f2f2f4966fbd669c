/*
 * pickle_lists.c - the containers of a snapshot pickle read: APPEND(S), with
 * the trace entries taken as records (Note [Compact trace entries] in
 * trace_columns.c), SETITEM(S), and the swap of compacted lists for their
 * TraceColumns at the end.
 *
 * Invariants: a list has records only while every item appended to it was
 * taken as one, it was empty when the first was, and it holds nothing else
 * (builder_of maps it to its TraceColumns); the first item that cannot be a
 * record gives the list its dicts back ("spill") before it is appended. A
 * dict is taken only when the stack and at most one memo slot are all that
 * refer to it; the slot then holds the record's tag (pickle_vm.c).
 * Must not: keep a list in a TraceColumns that anything but the snapshot's
 * device_traces (or legacy traces) list refers to.
 */
#include "pickle_lists.h"

#include "pickle_stage.h"
#include "trace_columns.h"

static int builder_of(gm_pk_t *r, PyObject *list, Py_ssize_t *b) {
    uintptr_t v;
    if (!gm_ptrmap_get(&r->builder_of, (uintptr_t)list, &v))
        return 0;
    *b = (Py_ssize_t)v - 1;
    return 1;
}

/* The builder's records back into its list as dicts; the list forgets it. */
static int spill(gm_pk_t *r, PyObject *list, Py_ssize_t b) {
    PyObject *tc = PyList_GET_ITEM(r->builders, b);
    { uintptr_t gone; gm_ptrmap_del(&r->builder_of, (uintptr_t)list, &gone); }
    for (Py_ssize_t i = 0, n = gm_tcols_len(tc); i < n; i++) {
        PyObject *d = gm_tcols_item(tc, i);
        if (!d || PyList_Append(list, d) < 0) {
            Py_XDECREF(d);
            return -1;
        }
        Py_DECREF(d);
    }
    return 0;
}

static PyObject *action_key;

/* A dict with an 'action' str: worth trying as the first record of a list. */
static int looks_like_entry(PyObject *item) {
    PyObject *a = PyDict_GetItemWithError(item, action_key);
    if (!a)
        PyErr_Clear(); /* an unhashable key in the dict cannot make it fail; be sure */
    return a && PyUnicode_CheckExact(a);
}

/* Take the dict entry as the next record of tc (gm_tcols_take_pairs). */
static int take_dict(PyObject *tc, PyObject *entry) {
    PyObject *kv[2 * GM_PK_STAGE_KEYS];
    Py_ssize_t pos = 0;
    int n = 0;
    if (PyDict_GET_SIZE(entry) > GM_PK_STAGE_KEYS)
        return 0;
    while (PyDict_Next(entry, &pos, &kv[2 * n], &kv[2 * n + 1]))
        n++;
    return gm_tcols_take_pairs(tc, kv, NULL, n);
}

/* Append item (a reference the caller keeps) to list, as a record when it
 * can; a staged entry (Note [Staged trace entries]) from its pairs. */
static int append_item(gm_pk_t *r, PyObject *list, PyObject *item) {
    Py_ssize_t b = -1;
    int has = builder_of(r, list, &b);
    Py_ssize_t slots[1] = {0};
    int k = -1, npairs = 0;
    const int64_t *imm = NULL;
    PyObject *const *pairs = r->nstaged && PyDict_CheckExact(item) && !PyDict_GET_SIZE(item)
                                 ? gm_pk_staged(r, item, &npairs, &imm)
                                 : NULL;
    if (r->compact && PyDict_CheckExact(item) &&
        (has || (PyList_GET_SIZE(list) == 0 && (pairs || looks_like_entry(item)))))
        k = gm_pk_own_slots(r, item, slots);
    if (k >= 0) {
        PyObject *tc = NULL;
        if (!has) {
            Py_ssize_t nb = PyList_GET_SIZE(r->builders);
            if (nb >= (1 << 22))
                k = -1; /* too many lists: leave it a list */
            else if (!(tc = gm_tcols_new()))
                return -1;
        } else {
            tc = PyList_GET_ITEM(r->builders, b);
        }
        if (k >= 0 && gm_tcols_len(tc) >= ((Py_ssize_t)1 << 40))
            k = -1;
        int took = k < 0 ? 0 : pairs ? gm_tcols_take_pairs(tc, pairs, imm, npairs)
                                     : take_dict(tc, item);
        if (took < 0) {
            if (!has)
                Py_DECREF(tc);
            return -1;
        }
        if (took) {
            if (!has) {
                b = PyList_GET_SIZE(r->builders);
                int rc = PyList_Append(r->builders, tc);
                Py_DECREF(tc);
                if (rc < 0)
                    return -1;
                if (gm_ptrmap_put(&r->builder_of, (uintptr_t)list, (uintptr_t)b + 1) != 0) {
                    PyErr_NoMemory();
                    return -1;
                }
            }
            if (pairs)
                gm_pk_stage_drop(r, item);
            uint64_t rec = (uint64_t)gm_tcols_len(tc) - 1;
            uintptr_t tag = (uintptr_t)((((uint64_t)b << 40) | rec) << 1 | 1);
            for (int i = 0; i < k; i++) {
                uintptr_t gone;
                gm_ptrmap_del(&r->memo_dict, (uintptr_t)item, &gone);
                r->memo[slots[i]] = (PyObject *)tag;
                Py_DECREF(item);
            }
            return 0;
        }
        if (!has)
            Py_DECREF(tc);
    }
    if (pairs && gm_pk_unstage(r, item) < 0)
        return -1;
    if (has && spill(r, list, b) < 0)
        return -1;
    return PyList_Append(list, item);
}

int gm_pk_appends(gm_pk_t *r, Py_ssize_t mark) {
    if (mark < 1) {
        gm_pk_corrupt(r, "APPENDS without a list below its MARK");
        return -1;
    }
    PyObject *list = r->stack[mark - 1];
    if (!PyList_CheckExact(list)) {
        gm_pk_corrupt(r, "APPEND to something that is not a list");
        return -1;
    }
    for (Py_ssize_t i = mark; i < r->sp; i++)
        if (append_item(r, list, r->stack[i]) < 0)
            return -1;
    while (r->sp > mark)
        Py_DECREF(r->stack[--r->sp]);
    return 0;
}

/* An empty dict about to get n > 5 items (a trace entry has 6 to 8) that only
 * the stack and at most one memo slot refer to is swapped for one made for
 * n items: it is filled without growing its table on the way. */
static void presize(gm_pk_t *r, Py_ssize_t at, Py_ssize_t n) {
    PyObject *d = r->stack[at];
    Py_ssize_t slots[1];
    int k;
    if (n <= 5 || !PyDict_CheckExact(d) || PyDict_GET_SIZE(d) || (k = gm_pk_own_slots(r, d, slots)) < 0)
        return;
    PyObject *nd = _PyDict_NewPresized(n);
    if (!nd) {
        PyErr_Clear(); /* the dict as it is will do */
        return;
    }
    if (k) {
        uintptr_t gone;
        gm_ptrmap_del(&r->memo_dict, (uintptr_t)d, &gone);
        if (gm_ptrmap_put(&r->memo_dict, (uintptr_t)nd, (uintptr_t)slots[0] + 1) != 0) {
            gm_ptrmap_put(&r->memo_dict, (uintptr_t)d, gone); /* a smaller table is kept */
            Py_DECREF(nd);
            return;
        }
        Py_INCREF(nd);
        r->memo[slots[0]] = nd;
        Py_DECREF(d);
    }
    r->stack[at] = nd;
    Py_DECREF(d);
}

int gm_pk_setitems(gm_pk_t *r, Py_ssize_t mark, int stage) {
    if (mark < 1) {
        gm_pk_corrupt(r, "SETITEMS without a dict below its MARK");
        return -1;
    }
    if (stage && gm_pk_stage(r, mark))
        return 0;
    if (gm_pk_unstage_range(r, mark - 1, r->sp) < 0)
        return -1;
    presize(r, mark - 1, (r->sp - mark) / 2);
    PyObject *d = r->stack[mark - 1];
    if (!PyDict_CheckExact(d) || (r->sp - mark) % 2) {
        gm_pk_corrupt(r, PyDict_CheckExact(d) ? "odd number of items for SETITEMS"
                                        : "SETITEM to something that is not a dict");
        return -1;
    }
    for (Py_ssize_t i = mark; i < r->sp; i += 2)
        if (PyDict_SetItem(d, r->stack[i], r->stack[i + 1]) < 0) {
            gm_pk_error(r);
            return -1;
        }
    while (r->sp > mark)
        Py_DECREF(r->stack[--r->sp]);
    return 0;
}

int gm_pk_finish(gm_pk_t *r, PyObject *top) {
    for (Py_ssize_t i = 0; i < r->mtop; i++) { /* the memo first: refcounts below */
        PyObject *v = r->memo[i];
        r->memo[i] = NULL;
        if (v && !((uintptr_t)v & 1))
            Py_DECREF(v);
    }
    r->mtop = 0;
    if (!r->builder_of.count)
        return 0;
    PyObject *traces = NULL;
    if (PyDict_CheckExact(top)) {
        traces = PyDict_GetItemString(top, "device_traces");
        if (!traces)
            traces = PyDict_GetItemString(top, "traces");
    }
    if (traces && PyList_CheckExact(traces)) {
        Py_ssize_t n = PyList_GET_SIZE(traces);
        for (Py_ssize_t d = 0; d < n; d++) {
            PyObject *list = PyList_GET_ITEM(traces, d);
            Py_ssize_t b, uses = 0;
            if (!builder_of(r, list, &b))
                continue;
            for (Py_ssize_t e = 0; e < n; e++)
                uses += PyList_GET_ITEM(traces, e) == list;
            if (Py_REFCNT(list) != uses || PyList_GET_SIZE(list) != 0)
                continue;
            { uintptr_t gone; gm_ptrmap_del(&r->builder_of, (uintptr_t)list, &gone); }
            PyObject *tc = PyList_GET_ITEM(r->builders, b);
            for (Py_ssize_t e = d; e < n; e++) {
                if (PyList_GET_ITEM(traces, e) == list) {
                    Py_INCREF(tc);
                    PyList_SetItem(traces, e, tc); /* drops the list */
                }
            }
        }
    }
    /* the rest: lists that are not device traces (or are also named elsewhere) */
    for (size_t i = 0; i <= r->builder_of.mask && r->builder_of.count; i++) {
        gm_ptrmap_slot_t s = r->builder_of.slots[i];
        if (s.key) {
            if (spill(r, (PyObject *)s.key, (Py_ssize_t)s.value - 1) < 0)
                return -1;
            i = (size_t)-1; /* deletion shifts slots: start over */
        }
    }
    return 0;
}

int gm_pk_lists_init(void) {
    if (!action_key && !(action_key = PyUnicode_InternFromString("action")))
        return -1;
    return 0;
}
