/*
 * virtual_device.c - _testext.VirtualDevice: a virtual device set of the test
 * module's own (its copy of csrc/device/vdev*.c) with the controls tests need:
 * failure injection, call and byte counters, event completion modes.
 *
 *     dev = _testext.VirtualDevice(capacity=..., event_mode="never")
 *     a = gpumem._C.Allocator(device_backend=dev)
 *     dev.set_failure("seg_alloc", nth=2); dev.counters(); dev.complete_events()
 *
 * Invariants: the device lives as long as the VirtualDevice object, which an
 * Allocator built on it keeps alive, so the backend outlives every core
 * that uses it; dev.gm_backend (a GM_BACKEND_CAPSULE capsule) owns nothing.
 * Lock order: allocator lock -> the simulator's mutex; nothing here takes
 * the allocator lock. Must not: free the device while a core may use it.
 */
#include "device/vdev.h"
#include "testext.h"

typedef struct {
    PyObject_HEAD
    gm_vdev_t *vdev;     /* set by __init__ (immutable after init) */
    PyObject *capsule; /* GM_BACKEND_CAPSULE of vdev's backend (immutable after init) */
} VirtualDeviceObject;

static const char *const fn_names[GM_VDEV_FN_COUNT] = {
    "seg_alloc", "seg_free", "event_create", "event_record", "event_query",
    "map",       "unmap",    "va_reserve"};

static int parse_event_mode(PyObject *obj, int *mode) {
    if (!obj || obj == Py_None) {
        *mode = GM_VDEV_EVENTS_IMMEDIATE;
        return 0;
    }
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (s && !strcmp(s, "immediate"))
        *mode = GM_VDEV_EVENTS_IMMEDIATE;
    else if (s && !strcmp(s, "never"))
        *mode = GM_VDEV_EVENTS_NEVER;
    else if (s && !strcmp(s, "after_n"))
        *mode = GM_VDEV_EVENTS_AFTER_N;
    else {
        PyErr_SetString(PyExc_ValueError,
                        "event_mode must be 'immediate', 'never' or 'after_n'");
        return -1;
    }
    return 0;
}

static int VirtualDevice_init(VirtualDeviceObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"capacity",    "granularity", "mode", "num_devices",
                             "event_mode", "event_after_n", NULL};
    gm_vdev_config_t cfg;
    gm_vdev_config_default(&cfg);
    unsigned long long capacity = cfg.capacity, granularity = cfg.granularity;
    const char *mode = "virtual";
    PyObject *event_mode = NULL;
    int num_devices = cfg.num_devices, after_n = 0;
    if (self->vdev) {
        PyErr_SetString(PyExc_RuntimeError, "VirtualDevice is already initialised");
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
        cfg.mode = GM_VDEV_VIRTUAL;
    else if (!strcmp(mode, "host"))
        cfg.mode = GM_VDEV_HOST;
    else {
        PyErr_SetString(PyExc_ValueError, "mode must be 'virtual' or 'host'");
        return -1;
    }
    if (parse_event_mode(event_mode, &cfg.event_mode) < 0)
        return -1;
    int rc = gm_vdev_create(&cfg, &self->vdev);
    if (rc) {
        tx_core->raise_error(rc, "bad virtual device configuration (capacity, granularity "
                                 "or mode)");
        return -1;
    }
    self->capsule = PyCapsule_New((void *)gm_vdev_backend(self->vdev), GM_BACKEND_CAPSULE, NULL);
    if (!self->capsule) {
        gm_vdev_destroy(self->vdev);
        self->vdev = NULL;
        return -1;
    }
    return 0;
}

static void VirtualDevice_dealloc(VirtualDeviceObject *self) {
    Py_XDECREF(self->capsule);
    if (self->vdev)
        gm_vdev_destroy(self->vdev);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define READY(self)                                                               \
    do {                                                                          \
        if (!(self)->vdev) {                                                       \
            PyErr_SetString(PyExc_RuntimeError, "VirtualDevice is not initialised"); \
            return NULL;                                                          \
        }                                                                         \
    } while (0)

static PyObject *VirtualDevice_gm_backend(VirtualDeviceObject *self, void *closure) {
    READY(self);
    return Py_NewRef(self->capsule);
}

static PyObject *VirtualDevice_complete_events(VirtualDeviceObject *self, PyObject *unused) {
    READY(self);
    gm_vdev_complete_events(self->vdev);
    Py_RETURN_NONE;
}

static PyObject *VirtualDevice_set_event_mode(VirtualDeviceObject *self, PyObject *args) {
    PyObject *mode_obj;
    int n = 0, mode;
    READY(self);
    if (!PyArg_ParseTuple(args, "O|i", &mode_obj, &n) || parse_event_mode(mode_obj, &mode) < 0)
        return NULL;
    gm_vdev_set_event_mode(self->vdev, mode, n);
    Py_RETURN_NONE;
}

static PyObject *VirtualDevice_set_failure(VirtualDeviceObject *self, PyObject *args,
                                           PyObject *kwargs) {
    static char *kwlist[] = {"fn", "nth", "code", "fail_above", NULL};
    const char *fn = NULL;
    long nth = 0;
    int code = GM_EOOM;
    unsigned long long above = 0;
    READY(self);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|zliK", kwlist, &fn, &nth, &code, &above))
        return NULL;
    int idx = -1;
    for (int i = 0; fn && i < GM_VDEV_FN_COUNT; i++)
        if (!strcmp(fn, fn_names[i]))
            idx = i;
    if (fn && idx < 0)
        return tx_core->raise_error(GM_EINVAL, "unknown simulated function name");
    gm_vdev_set_failure(self->vdev, idx, nth, code, (size_t)above);
    Py_RETURN_NONE;
}

static PyObject *VirtualDevice_counters(VirtualDeviceObject *self, PyObject *args,
                                        PyObject *kwargs) {
    static char *kwlist[] = {"device", NULL};
    int device = 0;
    READY(self);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|i", kwlist, &device))
        return NULL;
    gm_vdev_counters_t c;
    gm_vdev_get_counters(self->vdev, device, &c);
    PyObject *calls = PyDict_New();
    for (int i = 0; calls && i < GM_VDEV_FN_COUNT; i++) {
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

static PyMethodDef VirtualDevice_methods[] = {
    {"complete_events", (PyCFunction)VirtualDevice_complete_events, METH_NOARGS,
     "Mark every recorded event complete."},
    {"set_event_mode", (PyCFunction)VirtualDevice_set_event_mode, METH_VARARGS,
     "set_event_mode(mode, n=0): 'immediate', 'never' or 'after_n' (n queries not ready)."},
    {"set_failure", (PyCFunction)(void (*)(void))VirtualDevice_set_failure,
     METH_VARARGS | METH_KEYWORDS,
     "set_failure(fn=None, nth=0, code=GM_EOOM, fail_above=0): make call nth of fn fail "
     "(fn=None: none), and seg_alloc/map above fail_above bytes (0: off)."},
    {"counters", (PyCFunction)(void (*)(void))VirtualDevice_counters, METH_VARARGS | METH_KEYWORDS,
     "counters(device=0) -> calls per function, live bytes and objects, peak_used."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef VirtualDevice_getset[] = {
    {"gm_backend", (getter)VirtualDevice_gm_backend, NULL,
     "The device's gm_backend_t, as a '" GM_BACKEND_CAPSULE "' capsule "
     "(gpumem._C.Allocator(device_backend=...))",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject VirtualDeviceType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_testext.VirtualDevice",
    .tp_basicsize = sizeof(VirtualDeviceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "VirtualDevice(capacity=80GiB, granularity=2MiB, mode='virtual', num_devices=1, "
              "event_mode='immediate', event_after_n=0): a virtual device set for "
              "gpumem._C.Allocator(device_backend=...), with test controls.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)VirtualDevice_init,
    .tp_dealloc = (destructor)VirtualDevice_dealloc,
    .tp_methods = VirtualDevice_methods,
    .tp_getset = VirtualDevice_getset,
};

int tx_virtual_device_init(PyObject *module) {
    if (PyType_Ready(&VirtualDeviceType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "VirtualDevice", (PyObject *)&VirtualDeviceType);
}
