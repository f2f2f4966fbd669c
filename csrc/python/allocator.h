/*
 * allocator.h - the type gpumem._C.Allocator (allocator.c), and the core
 * behind one for the code that must reach it (core_api.c publishes
 * gm_py_allocator_core to other extensions). Both need the GIL.
 */
#ifndef GM_PYTHON_ALLOCATOR_H
#define GM_PYTHON_ALLOCATOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../core/gm_alloc.h"

/* Add the type to module. */
int gm_py_allocator_init(PyObject *module);
/* The core allocator of a gpumem._C.Allocator (borrowed: valid while the
 * object lives), or NULL with an exception set. GIL held. */
gm_alloc_t *gm_py_allocator_core(PyObject *obj);

#endif /* GM_PYTHON_ALLOCATOR_H */
