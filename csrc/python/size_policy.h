/*
 * size_policy.h - the core's size policy for Python (size_policy.c):
 * _C.round_size, _C.is_small, _C.segment_size, the size constants and
 * _C.format_size.
 */
#ifndef GM_PYTHON_SIZE_POLICY_H
#define GM_PYTHON_SIZE_POLICY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add the functions and constants to module. */
int gm_py_size_policy_init(PyObject *module);

#endif /* GM_PYTHON_SIZE_POLICY_H */
