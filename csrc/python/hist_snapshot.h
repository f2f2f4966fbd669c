/*
 * hist_snapshot.h - the _C functions behind gpumem.recording.history (configuration,
 * snapshots, metadata) and the capsule gpumem._C._hist_api
 * (hist_snapshot.c).
 */
#ifndef GM_PYTHON_HIST_SNAPSHOT_H
#define GM_PYTHON_HIST_SNAPSHOT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

int gm_py_hist_snapshot_init(PyObject *module);

#endif /* GM_PYTHON_HIST_SNAPSHOT_H */
