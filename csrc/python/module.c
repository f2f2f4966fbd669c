/*
 * module.c - PyInit__C: creates gpumem._C and lets each file of this layer
 * add what it owns (types, functions, constants, capsules).
 *
 * Invariants: this file defines nothing but PyInit__C, so no other file
 * depends on it; each concept lives in its own file, declared by its own
 * header. Errors go first: later inits and everything they add may raise
 * gpumem's exceptions.
 * Must not: hold bindings, helpers or state of its own.
 */
#include "allocator.h"
#include "core_api.h"
#include "cuda_driver.h"
#include "errors.h"
#include "hist_capture.h"
#include "hist_snapshot.h"
#include "model_passes.h"
#include "pickle_reader.h"
#include "replay.h"
#include "segments.h"
#include "settings.h"
#include "size_policy.h"
#include "trace_model.h"

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "gpumem._C",
                                       "gpumem's C allocator core and virtual device.", -1,
                                       NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (gm_py_errors_init(m) < 0 || gm_py_settings_init(m) < 0 ||
        gm_py_size_policy_init(m) < 0 || gm_py_segments_init(m) < 0 ||
        gm_py_cuda_driver_init(m) < 0 || gm_py_replay_init(m) < 0 ||
        gm_py_allocator_init(m) < 0 || gm_py_hist_capture_init(m) < 0 ||
        gm_py_hist_snapshot_init(m) < 0 || gm_py_core_api_init(m) < 0 ||
        gm_py_pickle_reader_init(m) < 0 || gm_py_trace_model_init(m) < 0 ||
        gm_py_model_passes_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
