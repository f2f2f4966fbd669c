/*
 * replay.h - _C.replay, the fast trace replayer (replay.c): op lists from
 * a snapshot's trace through a fresh core on a virtual device,
 * with the GIL released while it runs.
 */
#ifndef GM_PYTHON_REPLAY_H
#define GM_PYTHON_REPLAY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Add _C.replay to module. */
int gm_py_replay_init(PyObject *module);

#endif /* GM_PYTHON_REPLAY_H */
