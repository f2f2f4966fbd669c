/*
 * model_passes.h - _C.model_*: passes over a DeviceModel's int64 columns
 * (model_passes.c) for summary, diff and view, so that no Python object
 * is made per trace entry or per allocation.
 */
#ifndef GM_PYTHON_MODEL_PASSES_H
#define GM_PYTHON_MODEL_PASSES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add _C.model_live, model_group, model_samples, model_bands, model_ranges
 * and model_remap to module. */
int gm_py_model_passes_init(PyObject *module);

#endif /* GM_PYTHON_MODEL_PASSES_H */
