/*
 * allocator.c - gpumem._C.Allocator: one core allocator, registered with
 * memory history, on a virtual device of its own, on the process's CUDA
 * driver, or on a device another extension owns (device_backend=, see
 * GM_BACKEND_CAPSULE in core_api.h). The torch shim uses the core through
 * the capsule instead (core_api.c).
 * Invariants: alloc is set once by __init__ and lives until dealloc; every
 * method checks it first (READY). Stacks are captured before the core's
 * lock is taken (lock order GIL -> allocator lock); the core never takes
 * the GIL. A device_backend owner outlives the core that uses it.
 * Must not: hold the allocator lock while creating Python objects, or grow
 * test-only controls (failure injection, counters, timing loops): those
 * live in the test extension (tests/ext).
 */
#include "../device/vdev.h"
#include "../history/hist.h"
#include "allocator.h"
#include "core_api.h"
#include "cuda_driver.h"
#include "errors.h"
#include "hist_capture.h"
#include "pycompat.h"
#include "segments.h"
#include "settings.h"
#include "stats.h"

static int g_vmm_warned = 0; /* protected by: GIL */

typedef struct {
    PyObject_HEAD
    /* All set once by __init__ (protected by: GIL until set, immutable after). */
    gm_alloc_t *alloc;
    const gm_backend_t *backend; /* the device alloc runs on */
    gm_vdev_t *vdev;               /* the Allocator's own virtual device, or NULL */
    PyObject *backend_owner;     /* device_backend=, kept alive while alloc may use it */
    int device;
} AllocatorObject;

/* The core on `be`; on failure an exception carrying the backend's text. */
static int create_core(AllocatorObject *self, const gm_backend_t *be, int device,
                       const gm_settings_t *s) {
    int rc = gm_alloc_create(be, device, s, &self->alloc);
    if (rc) {
        const char *why = be->last_error ? be->last_error(be->ctx) : NULL;
        gm_py_raise(rc, why && why[0] ? why : NULL);
        return -1;
    }
    self->backend = be;
    self->device = device;
    return 0;
}

static int init_cuda(AllocatorObject *self, const gm_settings_t *s, int device,
                     const char *libcuda) {
    gm_cuda_t *c = gm_py_cuda_get(libcuda);
    if (!c)
        return -1;
    int n = 0;
    gm_cuda_device_count(c, &n);
    if (device < 0 || device >= n) {
        PyErr_Format(PyExc_ValueError, "device %d does not exist; the driver reports %d device(s)",
                     device, n);
        return -1;
    }
    return create_core(self, gm_cuda_backend(c), device, s);
}

/* Allocator(device_backend=obj): obj.gm_backend is a GM_BACKEND_CAPSULE
 * capsule (core_api.h); obj owns the backend and is kept alive. */
static int init_external(AllocatorObject *self, PyObject *obj, const gm_settings_t *s,
                         int device) {
    PyObject *cap = PyObject_GetAttrString(obj, "gm_backend");
    const gm_backend_t *be =
        cap && PyCapsule_IsValid(cap, GM_BACKEND_CAPSULE) ? PyCapsule_GetPointer(cap, GM_BACKEND_CAPSULE)
                                                          : NULL;
    Py_XDECREF(cap);
    if (!be) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "device_backend must have a gm_backend attribute holding a '%s' capsule, "
                     "which %.80s has not",
                     GM_BACKEND_CAPSULE, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (device < 0) {
        PyErr_Format(PyExc_ValueError, "device must be >= 0, not %d", device);
        return -1;
    }
    if (create_core(self, be, device, s) < 0)
        return -1;
    self->backend_owner = Py_NewRef(obj);
    return 0;
}

static int init_vdev(AllocatorObject *self, const gm_vdev_config_t *cfg, const gm_settings_t *s,
                     int device) {
    if (device < 0 || device >= cfg->num_devices) {
        PyErr_SetString(PyExc_ValueError, "device must be in [0, num_devices)");
        return -1;
    }
    int rc = gm_vdev_create(cfg, &self->vdev);
    if (rc) {
        gm_py_raise(rc, "bad virtual device configuration (capacity, granularity or mode)");
        return -1;
    }
    if (create_core(self, gm_vdev_backend(self->vdev), device, s) < 0) {
        gm_vdev_destroy(self->vdev);
        self->vdev = NULL;
        return -1;
    }
    return 0;
}

/* The arguments that describe a device of the Allocator's own: none of
 * them applies with device_backend=. */
static const char *const own_device_args[] = {"capacity", "granularity", "mode", "num_devices",
                                              "backend",  "libcuda",     NULL};

static int Allocator_init(AllocatorObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"capacity", "granularity", "mode",    "settings",       "device",
                             "num_devices", "backend",   "libcuda", "device_backend", NULL};
    unsigned long long capacity = (unsigned long long)80 << 30;
    unsigned long long granularity = (unsigned long long)2 << 20;
    const char *mode = "virtual";
    PyObject *settings = NULL, *device_backend = NULL;
    int device = 0, num_devices = 1;
    const char *backend = "virtual", *libcuda = NULL;
    if (self->alloc) {
        PyErr_SetString(PyExc_RuntimeError, "Allocator is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|KKsOiisz$O", kwlist, &capacity,
                                     &granularity, &mode, &settings, &device, &num_devices,
                                     &backend, &libcuda, &device_backend))
        return -1;
    if (device_backend == Py_None)
        device_backend = NULL;
    for (int i = 0; device_backend && kwargs && own_device_args[i]; i++)
        if (PyDict_GetItemString(kwargs, own_device_args[i])) {
            PyErr_Format(PyExc_TypeError,
                         "%s= does not apply with device_backend=, which brings its own device",
                         own_device_args[i]);
            return -1;
        }
    if (!strcmp(backend, "sim")) /* the name before "sim" came to mean the simulated GPU */
        backend = "virtual";
    if (strcmp(backend, "virtual") && strcmp(backend, "cuda")) {
        PyErr_SetString(PyExc_ValueError, "backend must be 'virtual' or 'cuda'");
        return -1;
    }
    gm_vdev_config_t cfg;
    gm_vdev_config_default(&cfg);
    cfg.capacity = (size_t)capacity;
    cfg.granularity = (size_t)granularity;
    cfg.num_devices = num_devices;
    if (!strcmp(mode, "virtual"))
        cfg.mode = GM_VDEV_VIRTUAL;
    else if (!strcmp(mode, "host"))
        cfg.mode = GM_VDEV_HOST;
    else {
        PyErr_SetString(PyExc_ValueError, "mode must be 'virtual' or 'host'");
        return -1;
    }
    gm_settings_t s;
    if (gm_py_settings_from_obj(settings, &s) < 0)
        return -1;
    int rc;
    if (device_backend)
        rc = init_external(self, device_backend, &s, device);
    else if (!strcmp(backend, "cuda"))
        rc = init_cuda(self, &s, device, libcuda);
    else
        rc = init_vdev(self, &cfg, &s, device);
    if (rc < 0)
        return -1;
    /* Registered for memory history (the tests' TraceRecorder chains
     * behind it through the history capsule, tests/ext/trace_recorder.c). */
    gm_hist_attach(self->alloc, NULL, NULL);
    if (!strcmp(backend, "cuda") && s.expandable_segments &&
        !gm_alloc_expandable_active(self->alloc) && !g_vmm_warned) {
        g_vmm_warned = 1;
        if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                             "device %d does not support virtual memory management; "
                             "expandable_segments falls back to plain segments",
                             device) < 0)
            return -1;
    }
    return 0;
}

static void Allocator_dealloc(AllocatorObject *self) {
    if (self->alloc) {
        gm_hist_detach(self->alloc);
        gm_alloc_destroy(self->alloc);
        if (self->vdev)
            gm_vdev_destroy(self->vdev);
    }
    /* Only now: the core no longer uses the backend. */
    Py_XDECREF(self->backend_owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define READY(self)                                                            \
    do {                                                                       \
        if (!(self)->alloc) {                                                  \
            PyErr_SetString(PyExc_RuntimeError, "Allocator is not initialised"); \
            return NULL;                                                       \
        }                                                                      \
    } while (0)

/* Raise for rc; device errors carry the backend's text (the driver call,
 * its CUresult name and string). */
static PyObject *alloc_error(AllocatorObject *self, int rc, const char *what) {
    char detail[512];
    const char *dev = (rc == GM_EDEVICE || rc == GM_ENOTSUP || rc == GM_ESTATE)
                          ? gm_alloc_last_error(self->alloc)
                          : "";
    if (what && dev[0])
        snprintf(detail, sizeof detail, "%s (%s)", dev, what);
    else
        snprintf(detail, sizeof detail, "%s", dev[0] ? dev : (what ? what : ""));
    return gm_py_raise(rc, detail);
}

static PyObject *ptr_error(AllocatorObject *self, int rc, unsigned long long ptr) {
    char what[64];
    snprintf(what, sizeof what, "pointer 0x%llx", ptr);
    return alloc_error(self, rc, what);
}

static PyObject *Allocator_malloc(AllocatorObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"size", "stream", "ctx", NULL};
    long long size;
    unsigned long long stream = 0;
    unsigned int ctx = 0;
    READY(self);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|KI", kwlist, &size, &stream, &ctx))
        return NULL;
    if (size < 0)
        return gm_py_raise(GM_EINVAL, "size must be >= 0");
    /* Stack captured before the allocator lock (torch: level STATE), unless
     * the sampled mode leaves this allocation out. */
    if (!ctx)
        ctx = gm_hist_capture_alloc((size_t)size);
    uintptr_t ptr = 0;
    gm_oom_info_t oom;
    int rc = gm_alloc_malloc(self->alloc, (size_t)size, (uintptr_t)stream, ctx, &ptr, &oom);
    if (rc == GM_EOOM)
        return gm_py_raise_oom(self->device, &oom);
    if (rc)
        return alloc_error(self, rc, NULL);
    return PyLong_FromUnsignedLongLong(ptr);
}

static PyObject *Allocator_free(AllocatorObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"ptr", "ctx", NULL};
    unsigned long long ptr;
    unsigned int ctx = 0;
    READY(self);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "K|I", kwlist, &ptr, &ctx))
        return NULL;
    /* Free sites are captured only at context level ALL; 0 makes the core
     * fall back to the allocation's own context. */
    if (!ctx)
        ctx = gm_hist_capture(GM_HIST_CTX_ALL);
    int rc = gm_alloc_free(self->alloc, (uintptr_t)ptr, ctx);
    if (rc)
        return ptr_error(self, rc, ptr);
    Py_RETURN_NONE;
}

static PyObject *Allocator_record_stream(AllocatorObject *self, PyObject *args) {
    unsigned long long ptr, stream;
    READY(self);
    if (!PyArg_ParseTuple(args, "KK", &ptr, &stream))
        return NULL;
    int rc = gm_alloc_record_stream(self->alloc, (uintptr_t)ptr, (uintptr_t)stream);
    if (rc)
        return ptr_error(self, rc, ptr);
    Py_RETURN_NONE;
}

static PyObject *Allocator_block_size(AllocatorObject *self, PyObject *arg) {
    READY(self);
    unsigned long long ptr = PyLong_AsUnsignedLongLong(arg);
    if (ptr == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    size_t size = 0, req = 0;
    uintptr_t stream = 0;
    int rc = gm_alloc_block_size(self->alloc, (uintptr_t)ptr, &size, &req, &stream);
    if (rc)
        return ptr_error(self, rc, ptr);
    return Py_BuildValue("(nnK)", (Py_ssize_t)size, (Py_ssize_t)req, (unsigned long long)stream);
}

static PyObject *Allocator_empty_cache(AllocatorObject *self, PyObject *unused) {
    READY(self);
    int rc = gm_alloc_empty_cache(self->alloc, gm_hist_capture(GM_HIST_CTX_ALL));
    if (rc)
        return alloc_error(self, rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *Allocator_process_events(AllocatorObject *self, PyObject *unused) {
    READY(self);
    int rc = gm_alloc_process_events(self->alloc, gm_hist_capture(GM_HIST_CTX_ALL));
    if (rc)
        return alloc_error(self, rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *Allocator_set_memory_fraction(AllocatorObject *self, PyObject *arg) {
    READY(self);
    double f = PyFloat_AsDouble(arg);
    if (f == -1.0 && PyErr_Occurred())
        return NULL;
    int rc = gm_alloc_set_memory_fraction(self->alloc, f);
    if (rc)
        return alloc_error(self, rc, rc == GM_EINVAL ? "fraction must be between 0 and 1" : NULL);
    Py_RETURN_NONE;
}

static PyObject *Allocator_set_memory_limit(AllocatorObject *self, PyObject *arg) {
    READY(self);
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    gm_alloc_set_memory_limit(self->alloc, (size_t)n);
    Py_RETURN_NONE;
}

static PyObject *Allocator_memory_limit(AllocatorObject *self, PyObject *unused) {
    READY(self);
    return PyLong_FromSize_t(gm_alloc_memory_limit(self->alloc));
}

static PyObject *Allocator_stats(AllocatorObject *self, PyObject *unused) {
    READY(self);
    gm_stats_t st;
    gm_alloc_get_stats(self->alloc, &st);
    return gm_py_stats_dict(&st);
}

static PyObject *Allocator_reset_peak_stats(AllocatorObject *self, PyObject *unused) {
    READY(self);
    gm_alloc_reset_peak_stats(self->alloc);
    Py_RETURN_NONE;
}

static PyObject *Allocator_reset_accumulated_stats(AllocatorObject *self, PyObject *unused) {
    READY(self);
    gm_alloc_reset_accumulated_stats(self->alloc);
    Py_RETURN_NONE;
}

static PyObject *Allocator_segments(AllocatorObject *self, PyObject *unused) {
    READY(self);
    return gm_py_segments(self->alloc);
}

static PyObject *Allocator_check(AllocatorObject *self, PyObject *unused) {
    READY(self);
    char msg[256];
    int bad = gm_alloc_check(self->alloc, msg, sizeof msg);
    return Py_BuildValue("(is)", bad, bad ? msg : "");
}

static PyObject *Allocator_settings(AllocatorObject *self, PyObject *unused) {
    READY(self);
    gm_settings_t s;
    gm_alloc_get_settings(self->alloc, &s);
    return gm_py_settings_to_dict(&s);
}

static PyObject *Allocator_set_settings(AllocatorObject *self, PyObject *arg) {
    READY(self);
    gm_settings_t s;
    if (gm_py_settings_from_obj(arg, &s) < 0)
        return NULL;
    int rc = gm_alloc_set_settings(self->alloc, &s);
    if (rc)
        return gm_py_raise(rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *Allocator_backend(AllocatorObject *self, PyObject *unused) {
    READY(self);
    return PyUnicode_FromString(self->backend->name);
}

static PyObject *Allocator_expandable_active(AllocatorObject *self, PyObject *unused) {
    READY(self);
    return PyBool_FromLong(gm_alloc_expandable_active(self->alloc));
}

static PyMethodDef Allocator_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))Allocator_malloc, METH_VARARGS | METH_KEYWORDS,
     "malloc(size, stream=0, ctx=0) -> address; raises OutOfMemoryError"},
    {"free", (PyCFunction)(void (*)(void))Allocator_free, METH_VARARGS | METH_KEYWORDS,
     "free(ptr, ctx=0)"},
    {"record_stream", (PyCFunction)Allocator_record_stream, METH_VARARGS,
     "record_stream(ptr, stream): the block is also used on stream"},
    {"block_size", (PyCFunction)Allocator_block_size, METH_O,
     "block_size(ptr) -> (size, requested_size, stream)"},
    {"empty_cache", (PyCFunction)Allocator_empty_cache, METH_NOARGS, "Release cached memory."},
    {"process_events", (PyCFunction)Allocator_process_events, METH_NOARGS, "Poll events."},
    {"set_memory_fraction", (PyCFunction)Allocator_set_memory_fraction, METH_O, ""},
    {"set_memory_limit", (PyCFunction)Allocator_set_memory_limit, METH_O, "bytes; 0 = none"},
    {"memory_limit", (PyCFunction)Allocator_memory_limit, METH_NOARGS, ""},
    {"stats", (PyCFunction)Allocator_stats, METH_NOARGS, "torch.cuda.memory_stats() layout"},
    {"reset_peak_stats", (PyCFunction)Allocator_reset_peak_stats, METH_NOARGS, ""},
    {"reset_accumulated_stats", (PyCFunction)Allocator_reset_accumulated_stats, METH_NOARGS, ""},
    {"segments", (PyCFunction)Allocator_segments, METH_NOARGS, "snapshot segment dicts"},
    {"check", (PyCFunction)Allocator_check, METH_NOARGS, "-> (violations, first message)"},
    {"settings", (PyCFunction)Allocator_settings, METH_NOARGS, ""},
    {"set_settings", (PyCFunction)Allocator_set_settings, METH_O, ""},
    {"expandable_active", (PyCFunction)Allocator_expandable_active, METH_NOARGS, ""},
    {"backend", (PyCFunction)Allocator_backend, METH_NOARGS, "'virtual' or 'cuda'"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject AllocatorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpumem._C.Allocator",
    .tp_basicsize = sizeof(AllocatorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The gpumem allocator core on a virtual device, on the CUDA driver "
              "(backend='cuda') or on a device_backend.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Allocator_init,
    .tp_dealloc = (destructor)Allocator_dealloc,
    .tp_methods = Allocator_methods,
};

/* The core allocator behind a gpumem._C.Allocator (borrowed), or NULL with
 * an exception set. */
gm_alloc_t *gm_py_allocator_core(PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &AllocatorType)) {
        PyErr_Format(PyExc_TypeError, "expected a gpumem._C.Allocator, not %.80s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    AllocatorObject *self = (AllocatorObject *)obj;
    if (!self->alloc)
        PyErr_SetString(PyExc_RuntimeError, "Allocator is not initialised");
    return self->alloc;
}

int gm_py_allocator_init(PyObject *module) {
    if (PyType_Ready(&AllocatorType) < 0)
        return -1;
    Py_INCREF(&AllocatorType);
    if (PyModule_AddObject(module, "Allocator", (PyObject *)&AllocatorType) < 0) {
        Py_DECREF(&AllocatorType);
        return -1;
    }
    return 0;
}
