/*
 * trace_model.h - _C.trace_model, a device trace held as TraceColumns
 * replayed into DeviceModel's columns (trace_model.c, Note [Native trace
 * replay]).
 */
#ifndef GM_PYTHON_TRACE_MODEL_H
#define GM_PYTHON_TRACE_MODEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add _C.trace_model to module. */
int gm_py_trace_model_init(PyObject *module);

#endif /* GM_PYTHON_TRACE_MODEL_H */
