/*
 * settings.c - allocator settings between gm_settings_t and the dict gpumem
 * passes around (Allocator(settings=...), history snapshots, the torch shim
 * through core_api.h), and _C.default_settings().
 *
 * Invariants: an unknown key or an invalid value raises with one sentence
 * saying which, a number that does not fit its field included (never
 * truncated); what passes is valid by gm_settings_validate, so the core
 * never sees a setting it would reject. Keys missing from the dict keep
 * their defaults. Must not: hold an allocator lock (it touches Python
 * objects).
 */
#include <stdint.h>

#include "settings.h"

static const char *const setting_keys[] = {"expandable_segments", "max_split_size",
                                           "garbage_collection_threshold",
                                           "roundup_power2_divisions", NULL};

/* A value that does not fit its field is a ValueError saying which field,
 * whatever PyLong_As* raised (OverflowError) or did not raise (a negative
 * count). A TypeError (not an int at all) is kept. */
static int out_of_range(PyObject *overflow, const char *text) {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(overflow))
        return -1;
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, text);
    return -1;
}

int gm_py_settings_from_obj(PyObject *obj, gm_settings_t *out) {
    gm_settings_default(out);
    if (!obj || obj == Py_None)
        return 0;
    if (!PyDict_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "settings must be a dict or None");
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int known = 0;
        for (int i = 0; k && setting_keys[i]; i++)
            known |= strcmp(k, setting_keys[i]) == 0;
        if (!known) {
            PyErr_Format(PyExc_ValueError,
                         "unknown allocator setting %R; expected expandable_segments, "
                         "max_split_size, garbage_collection_threshold or "
                         "roundup_power2_divisions",
                         key);
            return -1;
        }
    }
    PyObject *v;
    if ((v = PyDict_GetItemString(obj, "expandable_segments"))) {
        int t = PyObject_IsTrue(v);
        if (t < 0)
            return -1;
        out->expandable_segments = t;
    }
    if ((v = PyDict_GetItemString(obj, "max_split_size")) && v != Py_None) {
        long long m = PyLong_AsLongLong(v);
        if (m == -1 && PyErr_Occurred())
            return out_of_range(PyExc_OverflowError, "max_split_size must be -1 (unlimited) or a "
                                                     "byte count below 2**63");
        out->max_split_size = m < 0 ? SIZE_MAX : (size_t)m;
    }
    if ((v = PyDict_GetItemString(obj, "garbage_collection_threshold"))) {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        out->garbage_collection_threshold = d;
    }
    if ((v = PyDict_GetItemString(obj, "roundup_power2_divisions")) && v != Py_None) {
        PyObject *seq = PySequence_Fast(v, "roundup_power2_divisions must be a list of 16 ints");
        if (!seq)
            return -1;
        if (PySequence_Fast_GET_SIZE(seq) != GM_ROUNDUP_INTERVALS) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "roundup_power2_divisions must have 16 entries");
            return -1;
        }
        for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++) {
            long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if ((d == -1 && PyErr_Occurred()) || d < 0 || d > ((long long)1 << 31)) {
                Py_DECREF(seq);
                return out_of_range(PyExc_OverflowError,
                                    "roundup_power2_divisions entries must be 0 or powers of two "
                                    "up to 2**31");
            }
            out->roundup_power2_divisions[i] = (uint32_t)d;
        }
        Py_DECREF(seq);
    }
    char msg[128];
    if (gm_settings_validate(out, msg, sizeof msg)) {
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    return 0;
}

PyObject *gm_py_settings_to_dict(const gm_settings_t *s) {
    PyObject *divs = PyList_New(GM_ROUNDUP_INTERVALS);
    if (!divs)
        return NULL;
    for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++)
        PyList_SET_ITEM(divs, i, PyLong_FromUnsignedLong(s->roundup_power2_divisions[i]));
    return Py_BuildValue("{s:O,s:L,s:d,s:N}", "expandable_segments",
                         s->expandable_segments ? Py_True : Py_False, "max_split_size",
                         s->max_split_size == SIZE_MAX ? -1LL : (long long)s->max_split_size,
                         "garbage_collection_threshold", s->garbage_collection_threshold,
                         "roundup_power2_divisions", divs);
}

static PyObject *py_default_settings(PyObject *self, PyObject *unused) {
    gm_settings_t s;
    gm_settings_default(&s);
    return gm_py_settings_to_dict(&s);
}

static PyMethodDef methods[] = {
    {"default_settings", py_default_settings, METH_NOARGS, "The default allocator settings."},
    {NULL, NULL, 0, NULL}};

int gm_py_settings_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
