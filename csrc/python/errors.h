/*
 * errors.h - how gpumem._C turns GM_E* codes into Python exceptions, and
 * the out-of-memory exception and its text (errors.c).
 *
 * Only the Python layer raises: core/ and device/ return codes. Every
 * function here needs the GIL except gm_py_format_oom, which only writes
 * text and is also published to the torch shim (core_api.h).
 */
#ifndef GM_PYTHON_ERRORS_H
#define GM_PYTHON_ERRORS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../core/gm_alloc.h"

/* Create gpumem._C.OutOfMemoryError (a MemoryError) and add it to module. */
int gm_py_errors_init(PyObject *module);
/* Raise the exception for a gm error code; returns NULL. detail may be NULL. */
PyObject *gm_py_raise(int code, const char *detail);
/* Raise OutOfMemoryError with torch-style text and attributes; returns NULL. */
PyObject *gm_py_raise_oom(int device, const gm_oom_info_t *oom);
/* The out-of-memory text (torch's layout, gpumem's wording) into buf. No GIL needed. */
void gm_py_format_oom(int device, const gm_oom_info_t *oom, char *buf, size_t buflen);

#endif /* GM_PYTHON_ERRORS_H */
