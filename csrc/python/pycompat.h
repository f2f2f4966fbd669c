/*
 * pycompat.h - the few public C API functions gpumem._C uses that CPython
 * 3.9 lacks, defined for 3.9 from older public API.
 *
 * gpumem supports CPython 3.9 to 3.13 (pyproject.toml's requires-python).
 * The extension is written against 3.10+'s public API; each function here
 * is a documented 3.10 addition, given its documented behaviour in terms of
 * what 3.9 has. Nothing here is compiled on 3.10 or later, and nothing here
 * reads CPython's internal structures.
 * Must not: define anything a newer CPython declares (each block is guarded
 * by the version that added it).
 */
#ifndef GM_PYCOMPAT_H
#define GM_PYCOMPAT_H

#include <Python.h>

#if PY_VERSION_HEX < 0x030A0000
/* Py_NewRef, Py_XNewRef (3.10): a new reference to o, returned. */
static inline PyObject *gm_compat_newref(PyObject *o) {
    Py_INCREF(o);
    return o;
}
static inline PyObject *gm_compat_xnewref(PyObject *o) {
    Py_XINCREF(o);
    return o;
}
#define Py_NewRef(o) gm_compat_newref((PyObject *)(o))
#define Py_XNewRef(o) gm_compat_xnewref((PyObject *)(o))

/* PyModule_AddObjectRef (3.10): like PyModule_AddObject, but value's
 * reference is never stolen, on success or failure. */
static inline int gm_compat_add_object_ref(PyObject *mod, const char *name, PyObject *value) {
    if (!value) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "PyModule_AddObjectRef: NULL value");
        return -1;
    }
    Py_INCREF(value);
    if (PyModule_AddObject(mod, name, value) < 0) {
        Py_DECREF(value);
        return -1;
    }
    return 0;
}
#define PyModule_AddObjectRef gm_compat_add_object_ref

/* PyGC_Disable, PyGC_Enable (3.10): switch the cyclic collector off or on;
 * each returns whether it was on before. 3.9 has no C function for it, so
 * the gc module's isenabled/disable/enable are called (C functions, no
 * Python code runs). An error (none is expected) is cleared and the
 * collector reported off, so the caller leaves it as it found it. */
static inline int gm_compat_gc_set(const char *action) {
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *was = gc ? PyObject_CallMethod(gc, "isenabled", NULL) : NULL;
    int on = was ? PyObject_IsTrue(was) : -1;
    PyObject *r = on >= 0 ? PyObject_CallMethod(gc, action, NULL) : NULL;
    Py_XDECREF(r);
    Py_XDECREF(was);
    Py_XDECREF(gc);
    if (!r) {
        PyErr_Clear();
        return 0;
    }
    return on;
}
#define PyGC_Disable() gm_compat_gc_set("disable")
#define PyGC_Enable() gm_compat_gc_set("enable")
#endif

#endif /* GM_PYCOMPAT_H */
