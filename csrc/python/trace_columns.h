/*
 * trace_columns.h - _C.TraceColumns: one device trace of a snapshot held as
 * compact records instead of a list of dicts (trace_columns.c), built by the
 * snapshot pickle reader (pickle_reader.c), Note [Compact trace entries].
 */
#ifndef GM_PYTHON_TRACE_COLUMNS_H
#define GM_PYTHON_TRACE_COLUMNS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct gm_tcols gm_tcols_t;

/* One record: the action and the shape (indexes into the trace's distinct
 * actions and key orders), the five integer fields, up to three other
 * values as indexes into the trace's table of distinct objects. */
#define GM_TC_N_INT 5
#define GM_TC_N_OBJ 3
enum { GM_TC_ADDR, GM_TC_SIZE, GM_TC_STREAM, GM_TC_TIME, GM_TC_FREE };
typedef struct gm_trec {
    uint8_t action, shape;
    uint32_t obj[GM_TC_N_OBJ];
    uint64_t v[GM_TC_N_INT]; /* stream and time_us are signed, stored as their bits */
} gm_trec_t;

/* A new, empty TraceColumns (a new reference), or NULL with an exception. */
PyObject *gm_tcols_new(void);
/* Take an entry, given as its key/value pairs (kv[2i], kv[2i+1]) in the
 * order SETITEMS sets them or a dict holds them, as the next record: 1 if
 * taken (the caller keeps its references; the entry's dict is no longer
 * needed), 0 if it does not fit a record or a key repeats (nothing changed),
 * -1 with an exception. A NULL value is the int imm[i] (imm may be NULL
 * when no value is). */
int gm_tcols_take_pairs(PyObject *tcols, PyObject *const *kv, const int64_t *imm, int npairs);
/* The dict of record i (a new reference), equal to the entry taken. */
PyObject *gm_tcols_item(PyObject *tcols, Py_ssize_t i);
Py_ssize_t gm_tcols_len(PyObject *tcols);

/* Read access for passes over the records (trace_model.c); the GIL is held
 * and the records do not change while it is (a TraceColumns is only
 * appended to while the reader builds it). */
typedef struct gm_tcols_view {
    const gm_trec_t *recs;
    Py_ssize_t n;
    PyObject *actions; /* list of the distinct action str, borrowed */
    PyObject *objs;    /* list of the distinct other values, borrowed */
    int n_shapes;
} gm_tcols_view_t;
/* Fill v and return 1 when o is a TraceColumns, else 0. */
int gm_tcols_view(PyObject *o, gm_tcols_view_t *v);
/* The code of key in shape s: 0 the action, 1 + GM_TC_* an integer field,
 * 16 + j the object obj[j]; -1 when entries of that shape lack the key. */
int gm_tcols_key_code(PyObject *tcols, int shape, const char *key);

/* Add _C.TraceColumns to module. */
int gm_py_trace_columns_init(PyObject *module);

#endif /* GM_PYTHON_TRACE_COLUMNS_H */
