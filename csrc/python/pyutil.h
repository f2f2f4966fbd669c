/*
 * pyutil.h - what the files of gpumem._C share that has no header of its
 * own yet: the Allocator type, the CUDA driver handle and the replayer
 * (pyalloc.c), the core API capsule (core_api.c), plus the headers of the
 * concepts that have one.
 */
#ifndef GM_PYTHON_PYUTIL_H
#define GM_PYTHON_PYUTIL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../core/gm_alloc.h"
#include "errors.h"
#include "hist_capture.h"
#include "hist_snapshot.h"
#include "segments.h"
#include "settings.h"
#include "stats.h"

int gm_py_allocator_register(PyObject *module);
/* The capsule gpumem._C._core_api (core_api.c). */
int gm_py_core_api_init(PyObject *module);
/* The process's CUDA driver handle, opened once (pyalloc.c); no GIL needed.
 * 0, or a GM_E* code with one sentence in err. */
struct gm_cuda;
int gm_py_cuda_handle(const char *path, struct gm_cuda **out, char *err, size_t errlen);
/* The core allocator of a gpumem._C.Allocator (borrowed); NULL + exception. */
gm_alloc_t *gm_py_allocator_core(PyObject *obj);

PyObject *gm_py_replay(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *gm_py_cuda_open(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *gm_py_cuda_last_result(PyObject *self, PyObject *unused);

#endif /* GM_PYTHON_PYUTIL_H */
