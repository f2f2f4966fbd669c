/*
 * testext_module.c - PyInit__testext: fetches gpumem._C's capsules and lets
 * each file add its functions and types.
 *
 * Invariants: the import fails with one sentence if gpumem._C's core API is
 * older than the table this module was compiled against (version or size),
 * so a stale gpumem._C is never driven through missing members.
 * Must not: include anything of gpumem._C's but the published headers.
 */
#include <stddef.h>

#include "testext.h"

const gm_core_api_t *tx_core = NULL;
const gm_hist_api_t *tx_hist = NULL;

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_testext",
    "gpumem's test-only extension: a simulated device with test controls, timing loops and "
    "history threads, reaching gpumem._C only through its capsules.",
    -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__testext(void) {
    tx_core = PyCapsule_Import(GM_CORE_API_CAPSULE, 0);
    if (!tx_core)
        return NULL;
    if (tx_core->version != GM_CORE_API_VERSION || tx_core->size < sizeof(gm_core_api_t)) {
        PyErr_Format(PyExc_ImportError,
                     "gpumem._C's core API is version %u with %u bytes; _testext needs version "
                     "%d with at least %zu bytes: rebuild gpumem._C",
                     (unsigned)tx_core->version, (unsigned)tx_core->size, GM_CORE_API_VERSION,
                     sizeof(gm_core_api_t));
        return NULL;
    }
    tx_hist = PyCapsule_Import("gpumem._C._hist_api", 0);
    if (!tx_hist)
        return NULL;
    if (tx_hist->version != GM_HIST_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "gpumem._C's history API is version %d; _testext needs %d",
                     tx_hist->version, GM_HIST_API_VERSION);
        return NULL;
    }
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (tx_virtual_device_init(m) < 0 || tx_bench_init(m) < 0 || tx_hist_threads_init(m) < 0 ||
        tx_trace_recorder_init(m) < 0 || tx_cunwind_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
