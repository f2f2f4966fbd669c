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

/* A new, empty TraceColumns (a new reference), or NULL with an exception. */
PyObject *gm_tcols_new(void);
/* Take entry (a dict) as the next record: 1 if taken (the caller keeps its
 * reference to the dict, which is no longer needed), 0 if the dict does not
 * fit a record (nothing changed), -1 with an exception. */
int gm_tcols_take(PyObject *tcols, PyObject *entry);
/* The dict of record i (a new reference), equal to the dict taken. */
PyObject *gm_tcols_item(PyObject *tcols, Py_ssize_t i);
Py_ssize_t gm_tcols_len(PyObject *tcols);

/* Add _C.TraceColumns to module. */
int gm_py_trace_columns_init(PyObject *module);

#endif /* GM_PYTHON_TRACE_COLUMNS_H */
