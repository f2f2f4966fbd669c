/*
 * hist_threads.c - memory history driven from threads in every state, for
 * tests and benchmarks: _testext.hist_capture_without_gil,
 * hist_c_thread_alloc, hist_capture_in_c_thread, hist_walk_only,
 * hist_capture_time (a repeated capture, timed), hist_walks (both frame
 * walks of csrc/python/hist_pywalk.h, compared) and hist_chain (a recorded
 * chain of csrc/python/hist_pychain.h, checked).
 *
 * Invariants: captures go through gpumem._C's own entry point
 * (gm_hist_api_t.capture, the one the torch shim calls) and allocations
 * through the core API table, so what is tested is the shipped code.
 * Threads started here have no Python thread state, or one that does not
 * hold the GIL (as autograd's device threads have); a caller that keeps
 * the GIL while one captures learns whether the capture tried to take it
 * (`blocked`).
 * Must not: leave a thread running after its call returns.
 */
#include <pthread.h>
#include <time.h>

#include "python/hist_pychain.h"
#include "python/hist_pywalk.h"
#include "testext.h"

/* _testext.hist_capture_without_gil(level) -> id: capture from this Python
 * thread after releasing the GIL (the PyGILState_Ensure path). */
static PyObject *py_capture_without_gil(PyObject *self, PyObject *arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred())
        return NULL;
    uint32_t id;
    Py_BEGIN_ALLOW_THREADS
    id = tx_hist->capture((int)level);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLong(id);
}

typedef struct c_thread_job {
    gm_alloc_t *alloc;
    size_t size;
    uintptr_t stream;
    long n, keep;
    uintptr_t *ptrs;
    int rc;
} c_thread_job_t;

/* A thread with no Python thread state: it captures (C frames only, if
 * any) and allocates the way the torch shim will. */
static void *c_thread_main(void *arg) {
    c_thread_job_t *j = arg;
    for (long i = 0; i < j->n && j->rc == GM_OK; i++)
        j->rc = tx_core->malloc(j->alloc, j->size, j->stream,
                                tx_hist->capture(GM_HIST_CTX_STATE), &j->ptrs[i], NULL);
    for (long i = 0; i < j->n - j->keep && j->rc == GM_OK; i++)
        j->rc = tx_core->free(j->alloc, j->ptrs[i], tx_hist->capture(GM_HIST_CTX_ALL));
    return NULL;
}

/* CLOCK_REALTIME `timeout` seconds from now. */
static struct timespec deadline_in(double timeout) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += (time_t)timeout;
    deadline.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    return deadline;
}

/* Wait for th; with hold_gil the GIL stays held, and 1 is returned if the
 * thread did not finish within timeout seconds (it is then joined with the
 * GIL released). */
static int join_thread(pthread_t th, int hold_gil, double timeout) {
    int blocked = 0;
    if (hold_gil) {
        struct timespec deadline = deadline_in(timeout);
        blocked = pthread_timedjoin_np(th, NULL, &deadline) != 0;
    }
    if (blocked || !hold_gil) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(th, NULL);
        Py_END_ALLOW_THREADS
    }
    return blocked;
}

/* _testext.hist_c_thread_alloc(allocator, size, n, keep=0, stream=0, timeout_s=10,
 *                         hold_gil=True) -> (kept ptrs, blocked)
 * n mallocs then n - keep frees on a new pthread. With hold_gil this thread
 * keeps the GIL meanwhile, so `blocked` would be True if capture waited for
 * the GIL; without it, other Python threads run concurrently. */
static PyObject *py_c_thread_alloc(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"allocator", "size", "n", "keep", "stream", "timeout_s",
                             "hold_gil", NULL};
    PyObject *obj;
    unsigned long long size, stream = 0;
    long n, keep = 0;
    double timeout = 10.0;
    int hold_gil = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OKl|lKdp", kwlist, &obj, &size, &n, &keep,
                                     &stream, &timeout, &hold_gil))
        return NULL;
    gm_alloc_t *a = tx_core->allocator_core(obj);
    if (!a)
        return NULL;
    if (n <= 0 || keep < 0 || keep > n || n > 1000000)
        return tx_core->raise_error(GM_EINVAL, "need 0 < n <= 1000000 and 0 <= keep <= n");
    c_thread_job_t job = {a, (size_t)size, (uintptr_t)stream, n, keep, NULL, GM_OK};
    if (!(job.ptrs = calloc((size_t)n, sizeof *job.ptrs)))
        return PyErr_NoMemory();
    Py_INCREF(obj); /* the allocator outlives the thread */
    pthread_t th;
    if (pthread_create(&th, NULL, c_thread_main, &job)) {
        free(job.ptrs);
        Py_DECREF(obj);
        return PyErr_Format(PyExc_RuntimeError, "pthread_create failed");
    }
    int blocked = join_thread(th, hold_gil, timeout);
    Py_DECREF(obj);
    PyObject *kept = NULL;
    if (job.rc)
        tx_core->raise_error(job.rc, "in the C thread");
    else if ((kept = PyList_New(0)))
        for (long i = n - keep; i < n; i++) {
            PyObject *p = PyLong_FromUnsignedLongLong(job.ptrs[i]);
            if (!p || PyList_Append(kept, p) < 0) {
                Py_XDECREF(p);
                Py_CLEAR(kept);
                break;
            }
            Py_DECREF(p);
        }
    free(job.ptrs);
    if (!kept)
        return NULL;
    return Py_BuildValue("(NO)", kept, blocked ? Py_True : Py_False);
}

typedef struct cthread {
    int level;
    int thread_state; /* 1: the thread first gets a Python thread state, then releases the GIL */
    uint32_t id;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage; /* 1 has its thread state, 2 may capture, 3 captured; protected by: mu */
} cthread_t;

static void set_stage(cthread_t *t, int stage) {
    pthread_mutex_lock(&t->mu);
    t->stage = stage;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Wait until t reaches stage, or until deadline (NULL: no limit); 1 if it did. */
static int wait_stage(cthread_t *t, int stage, const struct timespec *deadline) {
    pthread_mutex_lock(&t->mu);
    while (t->stage < stage)
        if (!deadline)
            pthread_cond_wait(&t->cv, &t->mu);
        else if (pthread_cond_timedwait(&t->cv, &t->mu, deadline))
            break;
    int reached = t->stage >= stage;
    pthread_mutex_unlock(&t->mu);
    return reached;
}

static void *cthread_main(void *p) {
    cthread_t *t = p;
    PyGILState_STATE gs = PyGILState_UNLOCKED;
    PyThreadState *saved = NULL;
    if (t->thread_state) {
        /* As autograd's device threads start: a thread state of their own,
         * kept while the GIL is released, and no Python frames. */
        gs = PyGILState_Ensure();
        saved = PyEval_SaveThread();
        set_stage(t, 1);
        wait_stage(t, 2, NULL);
    }
    t->id = tx_hist->capture(t->level);
    set_stage(t, 3);
    if (t->thread_state) {
        PyEval_RestoreThread(saved);
        PyGILState_Release(gs);
    }
    return NULL;
}

/* _testext.hist_capture_in_c_thread(level, timeout_s=5, thread_state=False)
 * -> (id, blocked). Runs the capture on a new pthread while this thread
 * keeps holding the GIL: a capture that tried to take the GIL would not
 * finish in time (blocked is then True, and the thread is joined with the
 * GIL released). The thread has no Python thread state, or with
 * thread_state one that does not hold the GIL (autograd's threads). */
static PyObject *py_capture_in_c_thread(PyObject *self, PyObject *args) {
    int level, thread_state = 0;
    double timeout = 5.0;
    if (!PyArg_ParseTuple(args, "i|dp", &level, &timeout, &thread_state))
        return NULL;
    cthread_t t = {level, thread_state, 0, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    pthread_t th;
    if (pthread_create(&th, NULL, cthread_main, &t))
        return PyErr_Format(PyExc_RuntimeError, "pthread_create failed");
    int blocked;
    if (!thread_state) {
        blocked = join_thread(th, 1, timeout);
    } else {
        Py_BEGIN_ALLOW_THREADS /* the thread takes the GIL to get its state */
        wait_stage(&t, 1, NULL);
        Py_END_ALLOW_THREADS
        struct timespec deadline = deadline_in(timeout);
        set_stage(&t, 2);
        blocked = !wait_stage(&t, 3, &deadline); /* the GIL held meanwhile */
        Py_BEGIN_ALLOW_THREADS /* it takes the GIL again to drop its state */
        pthread_join(th, NULL);
        Py_END_ALLOW_THREADS
    }
    pthread_mutex_destroy(&t.mu);
    pthread_cond_destroy(&t.cv);
    return Py_BuildValue("(kO)", (unsigned long)t.id, blocked ? Py_True : Py_False);
}

/* _testext.hist_walk_only(n, direct=False) -> None: walk the caller's
 * frames n times with the walk a capture makes (hist_pywalk.h: the public
 * API one, or with direct=True the one capture uses on this version) and
 * nothing else (no hash, no interning): the floor a capture of this stack
 * cannot go below. For benchmarks/history_overhead.py. */
static PyObject *py_walk_only(PyObject *self, PyObject *args) {
    long n;
    int direct = 0;
    if (!PyArg_ParseTuple(args, "l|p", &n, &direct))
        return NULL;
    direct = direct && gm_pywalk_direct_ok();
    volatile uintptr_t sink = 0;
    gm_rawframe_t inline_buf[128];
    for (long i = 0; i < n; i++) {
        gm_pywalk_buf_t b = {inline_buf, 128, inline_buf};
        uint32_t k = direct ? gm_pywalk_direct(&b) : gm_pywalk_api(&b);
        sink += k ? b.buf[0].code : 0;
        if (b.buf != inline_buf)
            free(b.buf);
    }
    (void)sink;
    Py_RETURN_NONE;
}

/* _testext.hist_capture_time(n, level, release_gil=True) -> ns: the thread
 * CPU time of n captures of the caller's stack (gpumem._C's capture entry
 * point, the one the torch shim calls), made with the GIL released as torch
 * releases it around allocations, or held. Recording must be on at `level`
 * for anything to be captured. For benchmarks: the repeated-stack cost. */
static PyObject *py_capture_time(PyObject *self, PyObject *args) {
    long n;
    int level, release = 1;
    if (!PyArg_ParseTuple(args, "li|p", &n, &level, &release))
        return NULL;
    volatile uint32_t sink = 0;
    struct timespec t0, t1;
    PyThreadState *save = release ? PyEval_SaveThread() : NULL;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long i = 0; i < n; i++)
        sink += tx_hist->capture(level);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    if (save)
        PyEval_RestoreThread(save);
    (void)sink;
    return PyLong_FromLongLong((long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL +
                               (t1.tv_nsec - t0.tv_nsec));
}

#if GM_PYWALK_DIRECT
static gm_pychain_t chains[4]; /* hist_chain_*'s; protected by: GIL */
#endif

/* _testext.hist_chain(slot, record) -> bool: with record, the caller's raw
 * frame chain is recorded in slot (0..3) as a capture records it, and
 * whether one was (not too deep) is returned; without, whether the caller
 * stands on exactly that chain now (gm_pychain_same, Note [Predicted
 * chain]). None where the direct walk does not exist. */
static PyObject *py_chain(PyObject *self, PyObject *args) {
    int slot, record;
    if (!PyArg_ParseTuple(args, "ip", &slot, &record))
        return NULL;
    if (slot < 0 || slot > 3)
        return PyErr_Format(PyExc_ValueError, "slot must be in 0..3");
#if GM_PYWALK_DIRECT
    if (!gm_pywalk_direct_ok())
        Py_RETURN_NONE;
    PyThreadState *ts = PyThreadState_Get();
    if (!record)
        return PyBool_FromLong(gm_pychain_same(ts, &chains[slot]));
    gm_rawframe_t inline_buf[128];
    gm_pywalk_buf_t b = {inline_buf, 128, inline_buf};
    gm_pychain_walk(ts, &b, &chains[slot]);
    if (b.buf != inline_buf)
        free(b.buf);
    return PyBool_FromLong(chains[slot].n != 0);
#else
    Py_RETURN_NONE;
#endif
}

static PyObject *frames_list(const gm_rawframe_t *f, uint32_t n) {
    PyObject *l = PyList_New(n);
    for (uint32_t i = 0; l && i < n; i++) {
        PyObject *t = Py_BuildValue("(Oi)", (PyObject *)f[i].code, (int)f[i].loc);
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, t);
    }
    return l;
}

/* _testext.hist_walks(cap=128) -> (api, direct, direct_used): the caller's
 * frames by both walks, each a list of (code, location), innermost first;
 * cap is the walks' first buffer (a small one exercises its growth).
 * direct_used: whether capture uses the direct walk in this process. */
static PyObject *py_walks(PyObject *self, PyObject *args) {
    int cap = 128;
    if (!PyArg_ParseTuple(args, "|i", &cap))
        return NULL;
    if (cap < 1 || cap > 128)
        return PyErr_Format(PyExc_ValueError, "cap must be in 1..128");
    gm_rawframe_t ia[128] = {{0}}, id[128] = {{0}};
    gm_pywalk_buf_t a = {ia, (size_t)cap, ia}, d = {id, (size_t)cap, id};
    uint32_t na = gm_pywalk_api(&a);
    uint32_t nd = gm_pywalk_direct(&d);
    PyObject *la = frames_list(a.buf, na), *ld = frames_list(d.buf, nd);
    if (a.buf != ia)
        free(a.buf);
    if (d.buf != id)
        free(d.buf);
    if (!la || !ld) {
        Py_XDECREF(la);
        Py_XDECREF(ld);
        return NULL;
    }
    return Py_BuildValue("(NNO)", la, ld, gm_pywalk_direct_ok() ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"hist_c_thread_alloc", (PyCFunction)(void (*)(void))py_c_thread_alloc,
     METH_VARARGS | METH_KEYWORDS,
     "hist_c_thread_alloc(allocator, size, n, keep=0, stream=0, timeout_s=10, hold_gil=True)"
     " -> (kept ptrs, blocked): allocate from a thread with no Python thread state"},
    {"hist_capture_without_gil", py_capture_without_gil, METH_O,
     "hist_capture_without_gil(level) -> id, captured with the GIL released first"},
    {"hist_walk_only", py_walk_only, METH_VARARGS,
     "hist_walk_only(n, direct=False): walk the caller's frames n times (the public frame API,"
     " or the direct walk) and record nothing (the floor of a capture, for benchmarks)"},
    {"hist_capture_time", py_capture_time, METH_VARARGS,
     "hist_capture_time(n, level, release_gil=True) -> thread CPU ns of n captures of the"
     " caller's stack (a repeated stack: the cost of one capture, for benchmarks)"},
    {"hist_chain", py_chain, METH_VARARGS,
     "hist_chain(slot, record) -> bool: record the caller's frame chain in slot, or say "
     "whether the caller stands on it now (None without the direct walk)"},
    {"hist_walks", py_walks, METH_VARARGS,
     "hist_walks(cap=128) -> (api, direct, direct_used): the caller's frames by both walks"},
    {"hist_capture_in_c_thread", py_capture_in_c_thread, METH_VARARGS,
     "hist_capture_in_c_thread(level, timeout_s=5, thread_state=False) -> (id, blocked): "
     "capture on a thread with no Python thread state (or, with thread_state, one without "
     "the GIL) while the caller holds the GIL"},
    {NULL, NULL, 0, NULL}};

int tx_hist_threads_init(PyObject *module) { return PyModule_AddFunctions(module, methods); }
