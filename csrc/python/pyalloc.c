/*
 * pyalloc.c - gpumem._C.Allocator (the core on a simulated device) and
 * gpumem._C.replay (the fast trace replayer).
 *
 * Allocator owns one simulated device set and one core allocator. It is the
 * Python surface for tests, benchmarks and the replay CLI; the torch shim
 * uses the core directly. Trace events are kept in a plain C array guarded
 * by trace_lock (taken inside the allocator lock, never the other way), and
 * converted to Python objects only in take_trace(), with no allocator lock
 * held. The replay loop runs with the GIL released.
 */
#include <pthread.h>
#include <time.h>

#include "../base/ptrmap.h"
#include "../device/cuda_backend.h"
#include "../device/sim.h"
#include "../history/hist.h"
#include "pyutil.h"

typedef struct trace_ev {
    uint8_t action;
    uintptr_t addr;
    size_t size;
    uintptr_t stream;
    uint32_t ctx;
} trace_ev_t;

/* The process's CUDA driver, opened on first use, by gpumem._C.Allocator
 * or by the torch shim through the core API capsule (which may call without
 * the GIL). g_cuda is set once and never changes after
 * (protected by: g_cuda_lock until set, immutable after). */
static gm_cuda_t *g_cuda = NULL;
static pthread_mutex_t g_cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_vmm_warned = 0; /* protected by: GIL */

/* Open the driver once (path NULL: $GPUMEM_LIBCUDA, else libcuda.so.1).
 * A later call naming a different library fails. No GIL needed. */
int gm_py_cuda_handle(const char *path, gm_cuda_t **out, char *err, size_t errlen) {
    pthread_mutex_lock(&g_cuda_lock);
    int rc = GM_OK;
    if (g_cuda) {
        if (path && path[0] && strcmp(path, gm_cuda_path(g_cuda))) {
            snprintf(err, errlen, "the CUDA driver is already loaded from %s; cannot load %s as well",
                     gm_cuda_path(g_cuda), path);
            rc = GM_ESTATE;
        }
    } else {
        gm_cuda_t *c = NULL;
        rc = gm_cuda_open(path, &c, err, errlen);
        if (rc == GM_OK)
            g_cuda = c;
    }
    *out = rc == GM_OK ? g_cuda : NULL;
    pthread_mutex_unlock(&g_cuda_lock);
    return rc;
}

static gm_cuda_t *cuda_get(const char *path) {
    char err[768];
    gm_cuda_t *c = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gm_py_cuda_handle(path, &c, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_SetString(PyExc_RuntimeError, err);
        return NULL;
    }
    return c;
}

typedef struct {
    PyObject_HEAD
    gm_sim_t *sim; /* NULL on the CUDA backend */
    gm_alloc_t *alloc;
    int device;
    pthread_mutex_t trace_lock;
    trace_ev_t *trace;
    size_t n_trace, cap_trace;
    int trace_overflow;
} AllocatorObject;

static void trace_hook(void *arg, int device, gm_action_t action, uintptr_t addr, size_t size,
                       uintptr_t stream, uint32_t ctx) {
    AllocatorObject *self = arg;
    pthread_mutex_lock(&self->trace_lock);
    if (self->n_trace == self->cap_trace) {
        size_t cap = self->cap_trace ? self->cap_trace * 2 : 256;
        trace_ev_t *t = cap > ((size_t)1 << 24) ? NULL : realloc(self->trace, cap * sizeof *t);
        if (!t) {
            self->trace_overflow = 1;
            pthread_mutex_unlock(&self->trace_lock);
            return;
        }
        self->trace = t;
        self->cap_trace = cap;
    }
    self->trace[self->n_trace++] = (trace_ev_t){(uint8_t)action, addr, size, stream, ctx};
    pthread_mutex_unlock(&self->trace_lock);
}

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

static void trace_hook(void *arg, int device, gm_action_t action, uintptr_t addr, size_t size,
                       uintptr_t stream, uint32_t ctx);

static int init_cuda(AllocatorObject *self, PyObject *settings, int device, const char *libcuda,
                     int record_trace) {
    gm_settings_t s;
    if (gm_py_settings_from_obj(settings, &s) < 0)
        return -1;
    gm_cuda_t *c = cuda_get(libcuda);
    if (!c)
        return -1;
    int n = 0;
    gm_cuda_device_count(c, &n);
    if (device < 0 || device >= n) {
        PyErr_Format(PyExc_ValueError, "device %d does not exist; the driver reports %d device(s)",
                     device, n);
        return -1;
    }
    int rc = gm_alloc_create(gm_cuda_backend(c), device, &s, &self->alloc);
    if (rc) {
        gm_py_raise(rc, gm_cuda_backend(c)->last_error(c));
        return -1;
    }
    self->device = device;
    pthread_mutex_init(&self->trace_lock, NULL);
    /* Registered for memory history; record_trace chains behind it. */
    gm_hist_attach(self->alloc, record_trace ? trace_hook : NULL, self);
    if (s.expandable_segments && !gm_alloc_expandable_active(self->alloc) && !g_vmm_warned) {
        g_vmm_warned = 1;
        if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                             "device %d does not support virtual memory management; "
                             "expandable_segments falls back to plain segments",
                             device) < 0)
            return -1;
    }
    return 0;
}

static int Allocator_init(AllocatorObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"capacity",      "granularity",  "mode",    "settings",
                             "device",        "num_devices",  "event_mode", "event_after_n",
                             "record_trace",  "backend",      "libcuda", NULL};
    unsigned long long capacity = (unsigned long long)80 << 30;
    unsigned long long granularity = (unsigned long long)2 << 20;
    const char *mode = "virtual";
    PyObject *settings = NULL, *event_mode = NULL;
    int device = 0, num_devices = 1, after_n = 0, record_trace = 0;
    const char *backend = "sim", *libcuda = NULL;
    if (self->alloc) {
        PyErr_SetString(PyExc_RuntimeError, "Allocator is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|KKsOiiOipsz", kwlist, &capacity,
                                     &granularity, &mode, &settings, &device, &num_devices,
                                     &event_mode, &after_n, &record_trace, &backend, &libcuda))
        return -1;
    if (strcmp(backend, "sim") && strcmp(backend, "cuda")) {
        PyErr_SetString(PyExc_ValueError, "backend must be 'sim' or 'cuda'");
        return -1;
    }
    if (!strcmp(backend, "cuda"))
        return init_cuda(self, settings, device, libcuda, record_trace);
    gm_sim_config_t cfg;
    gm_sim_config_default(&cfg);
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
    if (device < 0 || device >= num_devices) {
        PyErr_SetString(PyExc_ValueError, "device must be in [0, num_devices)");
        return -1;
    }
    gm_settings_t s;
    if (gm_py_settings_from_obj(settings, &s) < 0)
        return -1;
    int rc = gm_sim_create(&cfg, &self->sim);
    if (rc) {
        gm_py_raise(rc, "bad simulated device configuration (capacity, granularity or mode)");
        return -1;
    }
    rc = gm_alloc_create(gm_sim_backend(self->sim), device, &s, &self->alloc);
    if (rc) {
        gm_sim_destroy(self->sim);
        self->sim = NULL;
        gm_py_raise(rc, NULL);
        return -1;
    }
    self->device = device;
    pthread_mutex_init(&self->trace_lock, NULL);
    /* Registered for memory history; record_trace chains behind it. */
    gm_hist_attach(self->alloc, record_trace ? trace_hook : NULL, self);
    return 0;
}

static void Allocator_dealloc(AllocatorObject *self) {
    if (self->alloc) {
        gm_hist_detach(self->alloc);
        gm_alloc_destroy(self->alloc);
        if (self->sim)
            gm_sim_destroy(self->sim);
        pthread_mutex_destroy(&self->trace_lock);
    }
    free(self->trace);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define READY(self)                                                            \
    do {                                                                       \
        if (!(self)->alloc) {                                                  \
            PyErr_SetString(PyExc_RuntimeError, "Allocator is not initialised"); \
            return NULL;                                                       \
        }                                                                      \
    } while (0)

#define SIM_ONLY(self)                                                         \
    do {                                                                       \
        READY(self);                                                           \
        if (!(self)->sim) {                                                    \
            PyErr_SetString(PyExc_RuntimeError,                                \
                            "this method exists only on the simulated device"); \
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
    /* Stack captured before the allocator lock (torch: level STATE). */
    if (!ctx)
        ctx = gm_hist_capture(GM_HIST_CTX_STATE);
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
    return PyUnicode_FromString(self->sim ? "sim" : "cuda");
}

static PyObject *Allocator_expandable_active(AllocatorObject *self, PyObject *unused) {
    READY(self);
    return PyBool_FromLong(gm_alloc_expandable_active(self->alloc));
}

static PyObject *Allocator_complete_events(AllocatorObject *self, PyObject *unused) {
    SIM_ONLY(self);
    gm_sim_complete_events(self->sim);
    Py_RETURN_NONE;
}

static PyObject *Allocator_set_event_mode(AllocatorObject *self, PyObject *args) {
    PyObject *mode_obj;
    int n = 0, mode;
    SIM_ONLY(self);
    if (!PyArg_ParseTuple(args, "O|i", &mode_obj, &n) || parse_event_mode(mode_obj, &mode) < 0)
        return NULL;
    gm_sim_set_event_mode(self->sim, mode, n);
    Py_RETURN_NONE;
}

static const char *const sim_fn_names[GM_SIM_FN_COUNT] = {
    "seg_alloc", "seg_free", "event_create", "event_record", "event_query",
    "map",       "unmap",    "va_reserve"};

static PyObject *Allocator_set_failure(AllocatorObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"fn", "nth", "code", "fail_above", NULL};
    const char *fn = NULL;
    long nth = 0;
    int code = GM_EOOM;
    unsigned long long above = 0;
    SIM_ONLY(self);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|zliK", kwlist, &fn, &nth, &code, &above))
        return NULL;
    int idx = -1;
    for (int i = 0; fn && i < GM_SIM_FN_COUNT; i++)
        if (!strcmp(fn, sim_fn_names[i]))
            idx = i;
    if (fn && idx < 0)
        return gm_py_raise(GM_EINVAL, "unknown simulated function name");
    gm_sim_set_failure(self->sim, idx, nth, code, (size_t)above);
    Py_RETURN_NONE;
}

static PyObject *Allocator_sim_counters(AllocatorObject *self, PyObject *unused) {
    SIM_ONLY(self);
    gm_sim_counters_t c;
    gm_sim_get_counters(self->sim, self->device, &c);
    PyObject *calls = PyDict_New();
    for (int i = 0; calls && i < GM_SIM_FN_COUNT; i++) {
        PyObject *v = PyLong_FromLong(c.calls[i]);
        if (!v || PyDict_SetItemString(calls, sim_fn_names[i], v) < 0) {
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

/* Time n malloc+free pairs of one size in C with the GIL released: the
 * core's own cost, without Python call overhead. Returns nanoseconds. */
static PyObject *Allocator_bench_pairs(AllocatorObject *self, PyObject *args) {
    unsigned long long size, stream = 0;
    long n;
    READY(self);
    if (!PyArg_ParseTuple(args, "Kl|K", &size, &n, &stream))
        return NULL;
    if (n <= 0 || size == 0)
        return gm_py_raise(GM_EINVAL, "n and size must be positive");
    int rc = GM_OK;
    struct timespec t0, t1;
    Py_BEGIN_ALLOW_THREADS
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n && rc == GM_OK; i++) {
        uintptr_t p;
        rc = gm_alloc_malloc(self->alloc, (size_t)size, (uintptr_t)stream, 0, &p, NULL);
        if (rc == GM_OK)
            rc = gm_alloc_free(self->alloc, p, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    Py_END_ALLOW_THREADS
    if (rc)
        return gm_py_raise(rc, NULL);
    return PyLong_FromLongLong((long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL +
                               (t1.tv_nsec - t0.tv_nsec));
}

static PyObject *Allocator_take_trace(AllocatorObject *self, PyObject *unused) {
    READY(self);
    pthread_mutex_lock(&self->trace_lock);
    trace_ev_t *t = self->trace;
    size_t n = self->n_trace;
    self->trace = NULL;
    self->n_trace = self->cap_trace = 0;
    pthread_mutex_unlock(&self->trace_lock);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const char *key = t[i].action == GM_ACT_OOM ? "device_free" : "addr";
        PyObject *e = Py_BuildValue("{s:s,s:K,s:n,s:K,s:I}", "action",
                                    gm_action_name(t[i].action), key,
                                    (unsigned long long)t[i].addr, "size", (Py_ssize_t)t[i].size,
                                    "stream", (unsigned long long)t[i].stream, "ctx", t[i].ctx);
        if (!e) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, e);
    }
    free(t);
    return list;
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
    {"backend", (PyCFunction)Allocator_backend, METH_NOARGS, "'sim' or 'cuda'"},
    {"complete_events", (PyCFunction)Allocator_complete_events, METH_NOARGS, ""},
    {"set_event_mode", (PyCFunction)Allocator_set_event_mode, METH_VARARGS, ""},
    {"set_failure", (PyCFunction)(void (*)(void))Allocator_set_failure,
     METH_VARARGS | METH_KEYWORDS, "set_failure(fn=None, nth=0, code=-1, fail_above=0)"},
    {"sim_counters", (PyCFunction)Allocator_sim_counters, METH_NOARGS, ""},
    {"bench_pairs", (PyCFunction)Allocator_bench_pairs, METH_VARARGS,
     "bench_pairs(size, n, stream=0) -> ns for n malloc+free pairs, timed in C"},
    {"take_trace", (PyCFunction)Allocator_take_trace, METH_NOARGS,
     "Events recorded since the last call (record_trace=True)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject AllocatorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpumem._C.Allocator",
    .tp_basicsize = sizeof(AllocatorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The gpumem allocator core on a simulated device.",
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

PyObject *gm_py_cuda_open(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", NULL};
    const char *path = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|z", kwlist, &path))
        return NULL;
    gm_cuda_t *c = cuda_get(path);
    if (!c)
        return NULL;
    int n = 0;
    gm_cuda_device_count(c, &n);
    return Py_BuildValue("{s:s,s:i}", "path", gm_cuda_path(c), "device_count", n);
}

PyObject *gm_py_cuda_last_result(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(gm_cuda_last_result());
}

int gm_py_allocator_register(PyObject *module) {
    if (PyType_Ready(&AllocatorType) < 0)
        return -1;
    Py_INCREF(&AllocatorType);
    if (PyModule_AddObject(module, "Allocator", (PyObject *)&AllocatorType) < 0) {
        Py_DECREF(&AllocatorType);
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------------- replay */

typedef struct replay_result {
    long ops, ooms, unknown_frees, conflicts;
    long long elapsed_ns;
    int rc;
} replay_result_t;

static void run_replay(gm_alloc_t *a, const uint8_t *act, const uint64_t *addr,
                       const uint64_t *size, const uint64_t *stream, size_t n,
                       replay_result_t *r) {
    gm_ptrmap_t map;
    if (gm_ptrmap_init(&map, 4096)) {
        r->rc = GM_ENOMEM;
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < n; i++) {
        uintptr_t key = (uintptr_t)addr[i] + 1; /* 0 is the map's empty key */
        uintptr_t ptr;
        if (act[i] == 0) {
            if (gm_ptrmap_del(&map, key, &ptr)) {
                r->conflicts++;
                if (ptr)
                    gm_alloc_free(a, ptr, 0);
            }
            int rc = gm_alloc_malloc(a, (size_t)size[i], (uintptr_t)stream[i], 0, &ptr, NULL);
            if (rc == GM_EOOM) {
                r->ooms++;
                ptr = 0; /* remembered as failed: its free is skipped */
                rc = GM_OK;
            }
            if (rc || gm_ptrmap_put(&map, key, ptr)) {
                r->rc = rc ? rc : GM_ENOMEM;
                break;
            }
        } else if (gm_ptrmap_del(&map, key, &ptr)) {
            int rc = ptr ? gm_alloc_free(a, ptr, 0) : GM_OK;
            if (rc) {
                r->rc = rc;
                break;
            }
        } else {
            r->unknown_frees++;
        }
        r->ops++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r->elapsed_ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    gm_ptrmap_free(&map);
}

PyObject *gm_py_replay(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"actions", "addrs", "sizes", "streams", "capacity",
                             "settings", "granularity", NULL};
    Py_buffer act = {0}, addr = {0}, size = {0}, stream = {0};
    unsigned long long capacity = (unsigned long long)80 << 30;
    unsigned long long granularity = (unsigned long long)2 << 20;
    PyObject *settings = NULL, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*y*y*|$KOK", kwlist, &act, &addr, &size,
                                     &stream, &capacity, &settings, &granularity))
        return NULL;
    size_t n = (size_t)act.len;
    gm_settings_t s;
    gm_sim_config_t cfg;
    gm_sim_t *sim = NULL;
    gm_alloc_t *a = NULL;
    if ((size_t)addr.len != n * 8 || (size_t)size.len != n * 8 || (size_t)stream.len != n * 8) {
        PyErr_SetString(PyExc_ValueError,
                        "addrs, sizes and streams must hold 8-byte integers, one per action");
        goto done;
    }
    if (gm_py_settings_from_obj(settings, &s) < 0)
        goto done;
    gm_sim_config_default(&cfg);
    cfg.capacity = (size_t)capacity;
    cfg.granularity = (size_t)granularity;
    int rc = gm_sim_create(&cfg, &sim);
    if (!rc)
        rc = gm_alloc_create(gm_sim_backend(sim), 0, &s, &a);
    if (rc) {
        gm_py_raise(rc, "bad capacity or granularity for the simulated device");
        goto done;
    }
    const uint8_t *acts = act.buf;
    for (size_t i = 0; i < n; i++)
        if (acts[i] > 1) {
            PyErr_Format(PyExc_ValueError, "actions[%zu] is %d; expected 0 (alloc) or 1 (free)", i,
                         acts[i]);
            goto done;
        }
    replay_result_t r;
    memset(&r, 0, sizeof r);
    Py_BEGIN_ALLOW_THREADS
    run_replay(a, acts, addr.buf, size.buf, stream.buf, n, &r);
    Py_END_ALLOW_THREADS
    if (r.rc) {
        gm_py_raise(r.rc, "during replay");
        goto done;
    }
    gm_stats_t st;
    gm_alloc_get_stats(a, &st);
    char msg[256];
    int bad = gm_alloc_check(a, msg, sizeof msg);
    if (bad) {
        PyErr_Format(PyExc_RuntimeError, "allocator invariant violated after replay: %s", msg);
        goto done;
    }
    result = Py_BuildValue(
        "{s:l,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:l,s:l,s:l,s:L,s:L,s:O}", "ops", r.ops,
        "elapsed_ns", r.elapsed_ns, "peak_allocated",
        (long long)st.allocated_bytes[GM_STAT_ALL].peak, "peak_requested",
        (long long)st.requested_bytes[GM_STAT_ALL].peak,
        "peak_reserved", (long long)st.reserved_bytes[GM_STAT_ALL].peak, "peak_active",
        (long long)st.active_bytes[GM_STAT_ALL].peak, "num_device_alloc",
        (long long)st.num_device_alloc, "num_device_free", (long long)st.num_device_free,
        "num_alloc_retries", (long long)st.num_alloc_retries, "num_ooms", r.ooms, "unknown_frees",
        r.unknown_frees, "conflicts", r.conflicts, "reserved_end",
        (long long)st.reserved_bytes[GM_STAT_ALL].current, "allocated_end",
        (long long)st.allocated_bytes[GM_STAT_ALL].current, "expandable",
        gm_alloc_expandable_active(a) ? Py_True : Py_False);
done:
    if (a)
        gm_alloc_destroy(a);
    if (sim)
        gm_sim_destroy(sim);
    PyBuffer_Release(&act);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&size);
    PyBuffer_Release(&stream);
    return result;
}
