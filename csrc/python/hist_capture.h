/*
 * hist_capture.h - the calling thread's stack as an interned traceback id
 * (hist_capture.c; see Note [Capture and the GIL] there), and the _C
 * functions for the backward context.
 */
#ifndef GM_PYTHON_HIST_CAPTURE_H
#define GM_PYTHON_HIST_CAPTURE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "../history/hist.h"

/* Call before the allocator lock, with or without the GIL; returns a
 * traceback id for an operation at context level `level` (GM_HIST_CTX_*),
 * 0 when none. */
uint32_t gm_hist_capture(int level);
/* The stack of an allocation of `size` bytes (level STATE), or 0 when
 * not recorded or left out by the sampled mode (history/sample.h). */
uint32_t gm_hist_capture_alloc(size_t size);
/* The same with TorchScript frames before the Python ones (hist.h). */
uint32_t gm_hist_capture_script(int level, const gm_script_frame_t *script, uint32_t nscript);
/* Add _C._hist_capture and the backward-context functions to module and
 * register the interpreter-exit hook. */
int gm_py_hist_capture_init(PyObject *module);

#endif /* GM_PYTHON_HIST_CAPTURE_H */
