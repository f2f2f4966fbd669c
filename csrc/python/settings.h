/*
 * settings.h - allocator settings (gm_settings_t) to and from the Python
 * dict gpumem uses (settings.c), and _C.default_settings().
 *
 * The dict's keys are expandable_segments, max_split_size (-1: unlimited),
 * garbage_collection_threshold and roundup_power2_divisions (16 ints).
 * Everything here needs the GIL.
 */
#ifndef GM_PYTHON_SETTINGS_H
#define GM_PYTHON_SETTINGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../core/gm_alloc.h"

/* Add _C.default_settings to module. */
int gm_py_settings_init(PyObject *module);
/* dict (or None) -> settings; 0 on success, -1 with an exception set. */
int gm_py_settings_from_obj(PyObject *obj, gm_settings_t *out);
PyObject *gm_py_settings_to_dict(const gm_settings_t *s);

#endif /* GM_PYTHON_SETTINGS_H */
