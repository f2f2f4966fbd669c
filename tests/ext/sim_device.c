/*
 * sim_device.c - _testext.SimDevice: a simulated device set of the test
 * module's own (its copy of csrc/device/sim*.c) with the controls tests need:
 * failure injection, call and byte counters, event completion modes.
 *
 *     dev = _testext.SimDevice(capacity=..., event_mode="never")
 *     a = gpumem._C.Allocator(device_backend=dev)
 *     dev.set_failure("seg_alloc", nth=2); dev.counters(); dev.complete_events()
 *
 * Invariants: the device lives as long as the SimDevice object, which an
 * Allocator built on it keeps alive, so the backend outlives every core
 * that uses it; dev.gm_backend (a GM_BACKEND_CAPSULE capsule) owns nothing.
 * Lock order: allocator lock -> the simulator's mutex; nothing here takes
 * the allocator lock. Must not: free the device while a core may use it.
 */
#include "device/sim.h"
#include "testext.h"

typedef struct {
    PyObject_HEAD
    gm_sim_t *sim;     /* set by __init__ (immutable after init) */
    PyObject *capsule; /* GM_BACKEND_CAPSULE of sim's backend (immutable after init) */
} SimDeviceObject;

static const char *const fn_names[GM_SIM_FN_COUNT] = {
    "seg_alloc", "seg_free", "event_create", "event_record", "event_query",
    "map",       "unmap",    "va_reserve"};

static int parse_event_mode(PyObject *obj, int *mode) {
    if (!obj || obj == Py_None) {
        *mode = GM_SIM_EVENTS_IMMEDIATE;
        return 0;
    }
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (s && !strcmp(s, "immediate"))
        *mode = GM_SIM_EVENTS_IMMEDIATE;
    else if (s && !strcmp(s, "never"))
        *mode = GM_SIM_EVENTS_NEVER;
    else if (s && !strcmp(s, "after_n"))
        *mode = GM_SIM_EVENTS_AFTER_N;
    else {
        PyErr_SetString(PyExc_ValueError,
                        "event_mode must be 'immediate', 'never' or 'after_n'");
        return -1;
    }
    return 0;
}

static int SimDevice_init(SimDeviceObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"capacity",    "granularity", "mode", "num_devices",
                             "event_mode", "event_after_n", NULL};
    gm_sim_config_t cfg;
    gm_sim_config_default(&cfg);
    unsigned long long capacity = cfg.capacity, granularity = cfg.granularity;
    const char *mode = "virtual";
    PyObject *event_mode = NULL;
    int num_devices = cfg.num_devices, after_n = 0;
    if (self->sim) {
        PyErr_SetString(PyExc_RuntimeError, "SimDevice is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|KKsiOi", kwlist, &capacity, &granularity,
                                     &mode, &num_devices, &event_mode, &after_n))
        return -1;
    cfg.capacity = (size_t)capacity;
    cfg.granularity = (size_t)granularity;
    cfg.num_devices = num_devices;
    cfg.event_after_n = after_n;
    if (!strcmp(mode, "virtual"))
        cfg.mode = GM_SIM_VIRTUAL;
    else if (!strcmp(mode, "host"))
        cfg.mode = GM_SIM_HOST;
    else {
        PyErr_SetString(PyExc_ValueError, "mode must be 'virtual' or 'host'");
        return -1;
    }
    if (parse_event_mode(event_mode, &cfg.event_mode) < 0)
        return -1;
    int rc = gm_sim_create(&cfg, &self->sim);
    if (rc) {
        tx_core->raise_error(rc, "bad simulated device configuration (capacity, granularity "
                                 "or mode)");
        return -1;
    }
    self->capsule = PyCapsule_New((void *)gm_sim_backend(self->sim), GM_BACKEND_CAPSULE, NULL);
    if (!self->capsule) {
        gm_sim_destroy(self->sim);
        self->sim = NULL;
        return -1;
    }
    return 0;
}

static void SimDevice_dealloc(SimDeviceObject *self) {
    Py_XDECREF(self->capsule);
    if (self->sim)
        gm_sim_destroy(self->sim);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define READY(self)                                                               \
    do {                                                                          \
        if (!(self)->sim) {                                                       \
            PyErr_SetString(PyExc_RuntimeError, "SimDevice is not initialised"); \
            return NULL;                                                          \
        }                                                                         \
    } while (0)

static PyObject *SimDevice_gm_backend(SimDeviceObject *self, void *closure) {
    READY(self);
    return Py_NewRef(self->capsule);
}

static PyObject *SimDevice_complete_events(SimDeviceObject *self, PyObject *unused) {
    READY(self);
    gm_sim_complete_events(self->sim);
    Py_RETURN_NONE;
}

static PyObject *SimDevice_set_event_mode(SimDeviceObject *self, PyObject *args) {
    PyObject *mode_obj;
    int n = 0, mode;
    READY(self);
    if (!PyArg_ParseTuple(args, "O|i", &mode_obj, &n) || parse_event_mode(mode_obj, &mode) < 0)
        return NULL;
    gm_sim_set_event_mode(self->sim, mode, n);
    Py_RETURN_NONE;
}

static PyObject *SimDevice_set_failure(SimDeviceObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"fn", "nth", "code", "fail_above", NULL};
    const char *fn = NULL;
    long nth = 0;
    int code = GM_EOOM;
    unsigned long long above = 0;
    READY(self);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|zliK", kwlist, &fn, &nth, &code, &above))
        return NULL;
    int idx = -1;
    for (int i = 0; fn && i < GM_SIM_FN_COUNT; i++)
        if (!strcmp(fn, fn_names[i]))
            idx = i;
    if (fn && idx < 0)
        return tx_core->raise_error(GM_EINVAL, "unknown simulated function name");
    gm_sim_set_failure(self->sim, idx, nth, code, (size_t)above);
    Py_RETURN_NONE;
}

static PyObject *SimDevice_counters(SimDeviceObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"device", NULL};
    int device = 0;
    READY(self);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|i", kwlist, &device))
        return NULL;
    gm_sim_counters_t c;
    gm_sim_get_counters(self->sim, device, &c);
    PyObject *calls = PyDict_New();
    for (int i = 0; calls && i < GM_SIM_FN_COUNT; i++) {
        PyObject *v = PyLong_FromLong(c.calls[i]);
        if (!v || PyDict_SetItemString(calls, fn_names[i], v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(calls);
            break;
        }
        Py_DECREF(v);
    }
    if (!calls)
        return NULL;
    return Py_BuildValue("{s:N,s:n,s:n,s:n,s:l,s:l,s:l,s:n}", "calls", calls, "bytes_allocated",
                         (Py_ssize_t)c.bytes_allocated, "bytes_mapped", (Py_ssize_t)c.bytes_mapped,
                         "bytes_reserved_va", (Py_ssize_t)c.bytes_reserved_va, "live_segments",
                         c.live_segments, "live_events", c.live_events, "live_reservations",
                         c.live_reservations, "peak_used", (Py_ssize_t)c.peak_used);
}

static PyMethodDef SimDevice_methods[] = {
    {"complete_events", (PyCFunction)SimDevice_complete_events, METH_NOARGS,
     "Mark every recorded event complete."},
    {"set_event_mode", (PyCFunction)SimDevice_set_event_mode, METH_VARARGS,
     "set_event_mode(mode, n=0): 'immediate', 'never' or 'after_n' (n queries not ready)."},
    {"set_failure", (PyCFunction)(void (*)(void))SimDevice_set_failure,
     METH_VARARGS | METH_KEYWORDS,
     "set_failure(fn=None, nth=0, code=GM_EOOM, fail_above=0): make call nth of fn fail "
     "(fn=None: none), and seg_alloc/map above fail_above bytes (0: off)."},
    {"counters", (PyCFunction)(void (*)(void))SimDevice_counters, METH_VARARGS | METH_KEYWORDS,
     "counters(device=0) -> calls per function, live bytes and objects, peak_used."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef SimDevice_getset[] = {
    {"gm_backend", (getter)SimDevice_gm_backend, NULL,
     "The device's gm_backend_t, as a '" GM_BACKEND_CAPSULE "' capsule "
     "(gpumem._C.Allocator(device_backend=...))",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject SimDeviceType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_testext.SimDevice",
    .tp_basicsize = sizeof(SimDeviceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SimDevice(capacity=80GiB, granularity=2MiB, mode='virtual', num_devices=1, "
              "event_mode='immediate', event_after_n=0): a simulated device set for "
              "gpumem._C.Allocator(device_backend=...), with test controls.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SimDevice_init,
    .tp_dealloc = (destructor)SimDevice_dealloc,
    .tp_methods = SimDevice_methods,
    .tp_getset = SimDevice_getset,
};

int tx_sim_device_init(PyObject *module) {
    if (PyType_Ready(&SimDeviceType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "SimDevice", (PyObject *)&SimDeviceType);
}
