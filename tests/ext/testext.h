/*
 * testext.h - what the files of the test-only extension _testext share
 * (tests/ext; built by tests/ext/build.py, never by setup.py, never
 * shipped).
 *
 * _testext reaches gpumem._C only through its published capsules: the core
 * API (csrc/python/core_api.h) and memory history's entry points
 * (csrc/history/hist.h, gm_hist_api_t). Its virtual device is its own
 * copy of csrc/device/vdev*.c, handed to gpumem._C.Allocator
 * through device_backend= (GM_BACKEND_CAPSULE).
 */
#ifndef GM_TESTEXT_H
#define GM_TESTEXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "history/hist.h"
#include "python/core_api.h"
#include "python/pycompat.h"

/* The capsules' tables, fetched once at import (immutable after init). */
extern const gm_core_api_t *tx_core;
extern const gm_hist_api_t *tx_hist;

/* Each file adds what it owns to the module. */
int tx_virtual_device_init(PyObject *module);
int tx_bench_init(PyObject *module);
int tx_hist_threads_init(PyObject *module);
int tx_cunwind_init(PyObject *module);
int tx_trace_recorder_init(PyObject *module);

#endif /* GM_TESTEXT_H */
