/*
 * pickle_reader.h - _C.read_snapshot_pickle, the snapshot pickle reader
 * (pickle_reader.c): plain data only, bounded, trace entries as compact
 * records (trace_columns.h).
 */
#ifndef GM_PYTHON_PICKLE_READER_H
#define GM_PYTHON_PICKLE_READER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add _C.read_snapshot_pickle to module. */
int gm_py_pickle_reader_init(PyObject *module);

#endif /* GM_PYTHON_PICKLE_READER_H */
