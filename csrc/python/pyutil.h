/*
 * pyutil.h - helpers shared by the files of the gpumem._C extension:
 * error translation, settings conversion and stats/segment dicts.
 * Only this layer raises Python exceptions; core/ and device/ return codes.
 */
#ifndef GM_PYTHON_PYUTIL_H
#define GM_PYTHON_PYUTIL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../core/gm_alloc.h"

/* gpumem._C.OutOfMemoryError, a MemoryError subclass (set at module init). */
extern PyObject *gm_py_oom_error;

/* Raise the exception for a gm error code; returns NULL. detail may be NULL. */
PyObject *gm_py_raise(int code, const char *detail);
/* Raise OutOfMemoryError with torch-style text and attributes; returns NULL. */
PyObject *gm_py_raise_oom(int device, const gm_oom_info_t *oom);
/* The out-of-memory text (torch's layout, gpumem's wording) into buf. */
void gm_py_format_oom(int device, const gm_oom_info_t *oom, char *buf, size_t buflen);
/* dict (or None) -> settings; 0 on success, -1 with an exception set. */
int gm_py_settings_from_obj(PyObject *obj, gm_settings_t *out);
PyObject *gm_py_settings_to_dict(const gm_settings_t *s);
/* torch.cuda.memory_stats()-style flat dict. */
PyObject *gm_py_stats_dict(const gm_stats_t *st);
/* list of torch snapshot segment dicts for one allocator. */
PyObject *gm_py_segments(gm_alloc_t *a);

int gm_py_allocator_register(PyObject *module);
/* The capsule gpumem._C._core_api (core_api.c). */
int gm_py_core_api_init(PyObject *module);
/* The process's CUDA driver handle, opened once (pyalloc.c); no GIL needed.
 * 0, or a GM_E* code with one sentence in err. */
struct gm_cuda;
int gm_py_cuda_handle(const char *path, struct gm_cuda **out, char *err, size_t errlen);
/* The core allocator of a gpumem._C.Allocator (borrowed); NULL + exception. */
gm_alloc_t *gm_py_allocator_core(PyObject *obj);

/* Memory history (hist_capture.c, hist_snapshot.c; see ../history/hist.h).
 * gm_hist_capture: call before the allocator lock; returns a traceback id
 * for an operation at context level `level` (GM_HIST_CTX_*), 0 when none. */
uint32_t gm_hist_capture(int level);
int gm_py_hist_capture_init(PyObject *module);
int gm_py_hist_snapshot_init(PyObject *module);
PyObject *gm_py_replay(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *gm_py_cuda_open(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *gm_py_cuda_last_result(PyObject *self, PyObject *unused);

#endif /* GM_PYTHON_PYUTIL_H */
