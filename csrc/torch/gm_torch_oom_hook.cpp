/*
 * gm_torch_oom_hook.cpp - the Python callable run when an allocation fails
 * with out of memory (Note [OOM hook]); set_oom_hook() is the shim module's
 * function that sets it, run_oom_hook() is called by throw_oom
 * (gm_torch_oom.cpp).
 */
#include <Python.h>

#include <atomic>

#include "gm_torch.h"

/*
 * Note [OOM hook]
 * Rationale: a snapshot written when an allocation fails must show the state
 *   at the failure (before the exception unwinds and frees the frames'
 *   tensors) and the exception message should name the file. torch's OOM
 *   observers cannot change the message, so gpumem.record registers its own
 *   hook here (gpumem/recording/oom.py, _on_oom).
 * Approach: throw_oom calls run_oom_hook after the core has returned GM_EOOM
 *   (its lock released, the `oom` event already in the device's ring) and
 *   before the observers and the throw. The hook is a strong reference
 *   protected by the GIL; an atomic flag lets threads skip the GIL when none
 *   is set. run_oom_hook takes the GIL with PyGILState_Ensure, which works on
 *   any thread: Python threads that hold it or released it around a torch
 *   call, and torch's autograd device threads (backward runs there while the
 *   calling thread waits with the GIL released). Lock order stays GIL ->
 *   core lock: nothing of gpumem's is held while waiting for the GIL. The
 *   hook is called as hook(device, requested, rounded, device_free,
 *   device_total, stream, message) and returns a str (one line to append to
 *   the message) or None; its exceptions are reported as unraisable and
 *   dropped, and any Python error already pending on the thread is kept.
 * Limitations: a thread that holds the GIL while waiting for the thread that
 *   hit the OOM would deadlock, as with torch's own Python OOM observers
 *   (torch never does that; backward releases the GIL). An OOM inside the
 *   hook (the hook never allocates device memory) is not hooked again on the
 *   same thread. Once the interpreter is finalizing the hook is skipped
 *   (gpumem also unsets it at exit); an OOM on another thread in the instant
 *   finalization starts can still be stopped by CPython inside
 *   PyGILState_Ensure, as torch's own observers can (pytorch#190489).
 */
namespace {

PyObject* g_oom_hook = nullptr;           /* protected by: the GIL (strong reference) */
std::atomic<bool> g_oom_hook_set{false};  /* a hint read without the GIL */
thread_local bool t_in_oom_hook = false;

bool interpreter_exiting() {
  if (!Py_IsInitialized())
    return true;
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

}  // namespace

PyObject* gpumem::set_oom_hook(PyObject*, PyObject* fn) {
  if (fn != Py_None && !PyCallable_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, "the OOM hook must be callable or None");
    return nullptr;
  }
  PyObject* old = g_oom_hook;
  if (fn == Py_None) {
    g_oom_hook = nullptr;
  } else {
    Py_INCREF(fn);
    g_oom_hook = fn;
  }
  g_oom_hook_set.store(g_oom_hook != nullptr, std::memory_order_release);
  Py_XDECREF(old); /* a call in progress holds its own reference */
  Py_RETURN_NONE;
}

std::string gpumem::run_oom_hook(int device, const gm_oom_info_t& oom, uintptr_t stream,
                                 const char* message) noexcept {
  if (!g_oom_hook_set.load(std::memory_order_acquire) || t_in_oom_hook || interpreter_exiting())
    return {};
  t_in_oom_hook = true;
  std::string out;
  PyGILState_STATE gs = PyGILState_Ensure();
  PyObject *et, *ev, *etb;
  PyErr_Fetch(&et, &ev, &etb);
  PyObject* hook = g_oom_hook;
  Py_XINCREF(hook);
  if (hook) {
    PyObject* r = PyObject_CallFunction(
        hook, "iKKKKKs", device, static_cast<unsigned long long>(oom.requested),
        static_cast<unsigned long long>(oom.rounded),
        static_cast<unsigned long long>(oom.device_free),
        static_cast<unsigned long long>(oom.allowed ? oom.allowed : oom.device_total),
        static_cast<unsigned long long>(stream), message);
    if (!r) {
      PyErr_WriteUnraisable(hook);
    } else {
      if (PyUnicode_Check(r)) {
        Py_ssize_t n = 0;
        const char* s = PyUnicode_AsUTF8AndSize(r, &n);
        if (s) {
          try {
            out.assign(s, static_cast<size_t>(n));
          } catch (...) {
            out.clear();
          }
        } else {
          PyErr_Clear();
        }
      }
      Py_DECREF(r);
    }
    Py_DECREF(hook);
  }
  PyErr_Restore(et, ev, etb);
  PyGILState_Release(gs);
  t_in_oom_hook = false;
  return out;
}

