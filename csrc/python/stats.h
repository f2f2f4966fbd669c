/*
 * stats.h - allocator statistics as the flat dict of
 * torch.cuda.memory_stats() (stats.c), shared by Allocator.stats() and the
 * torch shim (through core_api.h). Needs the GIL; the caller copies the
 * stats out of the core first.
 */
#ifndef GM_PYTHON_STATS_H
#define GM_PYTHON_STATS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../core/gm_alloc.h"

/* "allocation.all.current", ..., "num_device_free": a new dict, or NULL. */
PyObject *gm_py_stats_dict(const gm_stats_t *st);

#endif /* GM_PYTHON_STATS_H */
