/*
 * cuda_driver.h - the process's one CUDA driver handle (cuda_driver.c),
 * shared by gpumem._C.Allocator(backend='cuda') and the torch shim (through
 * the core API capsule), and the module functions _C.cuda_open and
 * _C.cuda_last_result.
 */
#ifndef GM_PYTHON_CUDA_DRIVER_H
#define GM_PYTHON_CUDA_DRIVER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../device/cuda_backend.h"

/* Add _C.cuda_open and _C.cuda_last_result to module. */
int gm_py_cuda_driver_init(PyObject *module);
/* The driver, opened on first use (path NULL: $GPUMEM_LIBCUDA, else
 * libcuda.so.1); a later call naming a different library fails. No GIL
 * needed. 0, or a GM_E* code with one sentence in err. */
int gm_py_cuda_handle(const char *path, gm_cuda_t **out, char *err, size_t errlen);
/* The same with the GIL held (released while the driver loads); NULL with
 * a RuntimeError set on failure. */
gm_cuda_t *gm_py_cuda_get(const char *path);

#endif /* GM_PYTHON_CUDA_DRIVER_H */
