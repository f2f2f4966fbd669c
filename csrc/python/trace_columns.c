/*
 * trace_columns.c - _C.TraceColumns: a device trace as fixed-size records.
 *
 * Note [Compact trace entries]
 * Rationale: a trace of 5,000,000 entries as Python dicts costs about 2.5 GB
 *   (a dict, its ints and its frames list per entry); the same entries as
 *   56-byte records cost 280 MB, so big snapshots load within a small
 *   multiple of their size (issue 34).
 * Approach: a record holds the action (an index into the distinct action
 *   strings), the entry's shape (its keys in order, an index into the
 *   distinct shapes), the five integer fields torch writes (addr, size,
 *   stream, time_us, device_free) as 64-bit values, and up to three other
 *   values (frames, user_metadata, ...) as indexes into a table of distinct
 *   objects: a frames list equal, item for item, to one already in the table
 *   is stored as that one (torch writes a new list per entry of shared frame
 *   dicts), a str equal to one already there likewise.  Only a dict that
 *   passes the loader's checks for a trace entry is taken (an 'action' str,
 *   a 'size', an 'addr' or for 'oom' a 'device_free', integers in range):
 *   anything else stays a dict, and its whole list stays a list.  Item i is
 *   the dict again, keys in their order, equal to the one taken.
 * Limitations: identity is not kept (equal frames lists come back as one
 *   list object); at most 255 actions and 255 shapes per trace, 8 keys per
 *   entry, three values that are not one of the five integers.
 * Must not: hold a borrowed reference (everything in the tables is owned).
 */
#include "trace_columns.h"

#include <string.h>

#include "trace_objs.h"

#define MAX_KEYS 8
#define N_INT GM_TC_N_INT
#define N_OBJ GM_TC_N_OBJ
#define MAX_KINDS 255

static const char *const INT_KEYS[N_INT] = {"addr", "size", "stream", "time_us", "device_free"};
static const int INT_SIGNED[N_INT] = {0, 0, 1, 1, 0};
enum { K_ADDR = GM_TC_ADDR, K_SIZE = GM_TC_SIZE, K_STREAM = GM_TC_STREAM, K_TIME = GM_TC_TIME,
       K_FREE = GM_TC_FREE };

typedef gm_trec_t rec_t;

/* code per key: 0 the action, 1 + slot an integer, 16 + slot an object */
typedef struct shape {
    int n;
    uint8_t code[MAX_KEYS];
} shape_t;

struct gm_tcols {
    PyObject_HEAD
    rec_t *recs;
    Py_ssize_t n, cap;
    PyObject *actions;   /* list of str */
    PyObject *shapes;    /* list of tuples of key str */
    shape_t shape[MAX_KINDS];
    gm_tobjs_t o;        /* the distinct values other than the five integers */
    int last_shape;
};

static PyTypeObject TraceColumnsType;
static PyObject *int_key_str[N_INT];

PyObject *gm_tcols_new(void) {
    gm_tcols_t *t = PyObject_GC_New(gm_tcols_t, &TraceColumnsType);
    if (!t)
        return NULL;
    t->recs = NULL;
    t->n = t->cap = 0;
    t->last_shape = 0;
    t->actions = PyList_New(0);
    t->shapes = PyList_New(0);
    memset(&t->o, 0, sizeof t->o);
    PyObject_GC_Track(t);
    if (!t->actions || !t->shapes || gm_tobjs_init(&t->o) < 0) {
        Py_DECREF(t);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    return (PyObject *)t;
}

/* v as a 64-bit field: unsigned in [0, 2**64), signed in [-2**63, 2**63). */
static int int_field(PyObject *v, int is_signed, uint64_t *out) {
    if (!PyLong_CheckExact(v))
        return 0;
    if (is_signed) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        *out = (uint64_t)x;
        return 1;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or too large */
        return 0;
    }
    *out = x;
    return 1;
}

/* Index of the str s in list (appended if new, at most MAX_KINDS), -2 if full, -1 error. */
static int kind_index(PyObject *list, PyObject *s) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(list, i);
        if (x == s)
            return (int)i;
        int eq = PyObject_RichCompareBool(x, s, Py_EQ);
        if (eq < 0)
            return -1;
        if (eq)
            return (int)i;
    }
    if (n >= MAX_KINDS)
        return -2;
    return PyList_Append(list, s) < 0 ? -1 : (int)n;
}

static int shape_index(gm_tcols_t *t, PyObject *keys[], const shape_t *want) {
    Py_ssize_t n = PyList_GET_SIZE(t->shapes);
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = (t->last_shape + j) % n;
        const shape_t *s = &t->shape[i];
        if (s->n != want->n || memcmp(s->code, want->code, (size_t)s->n))
            continue;
        PyObject *tup = PyList_GET_ITEM(t->shapes, i);
        int same = 1;
        for (int k = 0; k < s->n && same; k++) {
            PyObject *a = PyTuple_GET_ITEM(tup, k);
            if (a != keys[k]) {
                int eq = PyObject_RichCompareBool(a, keys[k], Py_EQ);
                if (eq < 0)
                    return -1;
                same = eq;
            }
        }
        if (same)
            return t->last_shape = (int)i;
    }
    if (n >= MAX_KINDS)
        return -2;
    PyObject *tup = PyTuple_New(want->n);
    if (!tup)
        return -1;
    for (int k = 0; k < want->n; k++) {
        Py_INCREF(keys[k]);
        PyTuple_SET_ITEM(tup, k, keys[k]);
    }
    int rc = PyList_Append(t->shapes, tup);
    Py_DECREF(tup);
    if (rc < 0)
        return -1;
    t->shape[n] = *want;
    return t->last_shape = (int)n;
}

static int int_slot(PyObject *key) {
    for (int i = 0; i < N_INT; i++)
        if (key == int_key_str[i] || PyUnicode_Compare(key, int_key_str[i]) == 0)
            return i;
    return -1;
}

/* An int given as int64 (a staged value, pickle_stage.c) as a field. */
static int imm_field(int64_t x, int is_signed, uint64_t *out) {
    if (!is_signed && x < 0)
        return 0;
    *out = (uint64_t)x;
    return 1;
}

int gm_tcols_take_pairs(PyObject *self, PyObject *const *kv, const int64_t *imm, int npairs) {
    gm_tcols_t *t = (gm_tcols_t *)self;
    if (npairs > MAX_KEYS)
        return 0;
    rec_t r;
    memset(&r, 0, sizeof r);
    shape_t want = {0, {0}};
    PyObject *keys[MAX_KEYS], *objs[N_OBJ], *okeys[N_OBJ], *action = NULL;
    int64_t oimm[N_OBJ];
    unsigned have = 0;
    int nobj = 0;
    /* the common case: the keys of the last shape, the same str objects in the
     * same order (codes known, no str compares, no repeats); checked key by key */
    int same = t->last_shape < PyList_GET_SIZE(t->shapes) && t->shape[t->last_shape].n == npairs;
    const shape_t *last = &t->shape[t->last_shape];
    PyObject *last_keys = same ? PyList_GET_ITEM(t->shapes, t->last_shape) : NULL;
    for (int k = 0; k < npairs; k++) {
        PyObject *key = kv[2 * k], *value = kv[2 * k + 1];
        int code;
        if (same && key == PyTuple_GET_ITEM(last_keys, k)) {
            code = last->code[k];
        } else if ((same = 0), !PyUnicode_CheckExact(key)) {
            return 0;
        } else if (PyUnicode_CompareWithASCIIString(key, "action") == 0) {
            code = 0;
        } else {
            int slot = int_slot(key);
            code = slot >= 0 ? 1 + slot : 16 + nobj;
        }
        keys[want.n] = key;
        if (code == 0) {
            if (!value || !PyUnicode_CheckExact(value) || action)
                return 0; /* not a str, or a second 'action': a dict's job */
            action = value;
        } else if (code < 16) {
            if ((have & (1u << (code - 1))) ||
                !(value ? int_field(value, INT_SIGNED[code - 1], &r.v[code - 1])
                        : imm_field(imm[k], INT_SIGNED[code - 1], &r.v[code - 1])))
                return 0;
            have |= 1u << (code - 1);
        } else {
            if (nobj == N_OBJ)
                return 0;
            for (int j = 0; !same && j < nobj; j++)
                if (okeys[j] == key || PyUnicode_Compare(okeys[j], key) == 0)
                    return 0; /* a repeated key: SETITEMS' last value wins, a dict's job */
            okeys[nobj] = key;
            oimm[nobj] = value ? 0 : imm[k];
            objs[nobj++] = value;
        }
        want.code[want.n++] = (uint8_t)code;
    }
    if (!action || !(have & (1u << K_SIZE)))
        return 0;
    int oom = PyUnicode_CompareWithASCIIString(action, "oom") == 0;
    if (!(have & (1u << (oom ? K_FREE : K_ADDR))))
        return 0;
    int a = kind_index(t->actions, action);
    if (a < -1)
        return 0;
    int s = a < 0 ? -1 : same ? t->last_shape : shape_index(t, keys, &want);
    if (s < -1)
        return 0;
    if (s < 0)
        return -1;
    r.action = (uint8_t)a;
    r.shape = (uint8_t)s;
    for (int k = 0; k < nobj; k++) {
        PyObject *made = objs[k] ? NULL : PyLong_FromLongLong(oimm[k]); /* kept by objs */
        long i = objs[k] || made ? gm_tobjs_intern(&t->o, objs[k] ? objs[k] : made) : -1;
        Py_XDECREF(made);
        if (i < 0)
            return -1;
        r.obj[k] = (uint32_t)i;
    }
    if (t->n == t->cap) {
        Py_ssize_t cap = t->cap < 1024 ? 1024 : t->cap + t->cap / 2;
        rec_t *p = PyMem_RawRealloc(t->recs, (size_t)cap * sizeof *p);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        t->recs = p;
        t->cap = cap;
    }
    t->recs[t->n++] = r;
    return 1;
}

Py_ssize_t gm_tcols_len(PyObject *self) { return ((gm_tcols_t *)self)->n; }

int gm_tcols_view(PyObject *o, gm_tcols_view_t *v) {
    if (!Py_IS_TYPE(o, &TraceColumnsType))
        return 0;
    gm_tcols_t *t = (gm_tcols_t *)o;
    *v = (gm_tcols_view_t){t->recs, t->n, t->actions, t->o.objs, (int)PyList_GET_SIZE(t->shapes)};
    return 1;
}

int gm_tcols_key_code(PyObject *self, int shape, const char *key) {
    gm_tcols_t *t = (gm_tcols_t *)self;
    PyObject *tup = PyList_GET_ITEM(t->shapes, shape);
    for (int k = 0; k < t->shape[shape].n; k++)
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(tup, k), key) == 0)
            return t->shape[shape].code[k];
    return -1;
}

PyObject *gm_tcols_item(PyObject *self, Py_ssize_t i) {
    gm_tcols_t *t = (gm_tcols_t *)self;
    if (i < 0 || i >= t->n) {
        PyErr_SetString(PyExc_IndexError, "trace index out of range");
        return NULL;
    }
    const rec_t *r = &t->recs[i];
    const shape_t *s = &t->shape[r->shape];
    PyObject *keys = PyList_GET_ITEM(t->shapes, r->shape);
    PyObject *d = _PyDict_NewPresized(s->n);
    if (!d)
        return NULL;
    for (int k = 0; k < s->n; k++) {
        int c = s->code[k];
        PyObject *v;
        if (c == 0) {
            v = PyList_GET_ITEM(t->actions, r->action);
            Py_INCREF(v);
        } else if (c < 16) {
            uint64_t x = r->v[c - 1];
            v = INT_SIGNED[c - 1] ? PyLong_FromLongLong((long long)x)
                                  : PyLong_FromUnsignedLongLong(x);
        } else {
            v = PyList_GET_ITEM(t->o.objs, r->obj[c - 16]);
            Py_INCREF(v);
        }
        if (!v || PyDict_SetItem(d, PyTuple_GET_ITEM(keys, k), v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static Py_ssize_t tc_len(PyObject *self) { return gm_tcols_len(self); }

/* == and != with a list or a TraceColumns: item by item, as list's. */
static PyObject *tc_richcompare(PyObject *self, PyObject *other, int op) {
    int is_tc = Py_IS_TYPE(other, &TraceColumnsType);
    if ((op != Py_EQ && op != Py_NE) || (!is_tc && !PyList_Check(other)))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = gm_tcols_len(self);
    int same = n == (is_tc ? gm_tcols_len(other) : PyList_GET_SIZE(other));
    for (Py_ssize_t i = 0; same && i < n; i++) {
        PyObject *a = gm_tcols_item(self, i);
        PyObject *b = !a ? NULL : is_tc ? gm_tcols_item(other, i) : PyList_GET_ITEM(other, i);
        if (b && !is_tc)
            Py_INCREF(b);
        int eq = b ? PyObject_RichCompareBool(a, b, Py_EQ) : -1;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (eq < 0)
            return NULL;
        same = eq;
    }
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static int tc_traverse(PyObject *self, visitproc visit, void *arg) {
    gm_tcols_t *t = (gm_tcols_t *)self;
    Py_VISIT(t->actions);
    Py_VISIT(t->shapes);
    Py_VISIT(t->o.objs);
    Py_VISIT(t->o.strs);
    return 0;
}

static int tc_clear(PyObject *self) {
    gm_tcols_t *t = (gm_tcols_t *)self;
    Py_CLEAR(t->actions);
    Py_CLEAR(t->shapes);
    Py_CLEAR(t->o.objs);
    Py_CLEAR(t->o.strs);
    t->n = 0;
    return 0;
}

static void tc_dealloc(PyObject *self) {
    gm_tcols_t *t = (gm_tcols_t *)self;
    PyObject_GC_UnTrack(self);
    tc_clear(self);
    PyMem_RawFree(t->recs);
    gm_tobjs_free(&t->o);
    PyObject_GC_Del(self);
}

static PySequenceMethods tc_as_sequence = {
    .sq_length = tc_len,
    .sq_item = gm_tcols_item,
};

static PyTypeObject TraceColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpumem._C.TraceColumns",
    .tp_basicsize = sizeof(gm_tcols_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A device trace of a snapshot as compact records; item i is entry i as a dict.",
    .tp_dealloc = tc_dealloc,
    .tp_traverse = tc_traverse,
    .tp_clear = tc_clear,
    .tp_as_sequence = &tc_as_sequence,
    .tp_richcompare = tc_richcompare,
};

int gm_py_trace_columns_init(PyObject *module) {
    for (int i = 0; i < N_INT; i++)
        if (!int_key_str[i] && !(int_key_str[i] = PyUnicode_InternFromString(INT_KEYS[i])))
            return -1;
    if (PyType_Ready(&TraceColumnsType) < 0)
        return -1;
    Py_INCREF(&TraceColumnsType);
    if (PyModule_AddObject(module, "TraceColumns", (PyObject *)&TraceColumnsType) < 0) {
        Py_DECREF(&TraceColumnsType);
        return -1;
    }
    return 0;
}
