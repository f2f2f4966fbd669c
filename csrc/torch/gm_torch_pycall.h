/*
 * gm_torch_pycall.h - what the shim module's functions share to be called
 * from Python on the plain C API: C++ exceptions turned into torch's Python
 * exceptions (guarded), the GIL released around device
 * waits, dict building, and the gpumem._C capsules' import. Included by
 * the modules' files only (gm_torch_module.cpp, gm_torch_rf_module.cpp);
 * includes nothing of torch's.
 */
#ifndef GM_TORCH_PYCALL_H
#define GM_TORCH_PYCALL_H

#include <Python.h>

#include <exception>
#include <stdexcept>
#include <string>

/* torch's own translation of a C++ exception into a Python one (c10::Error
 * to RuntimeError, c10::ValueError to ValueError, c10::OutOfMemoryError to
 * torch.OutOfMemoryError, ...), exported by libtorch_python in every
 * supported release; declared here instead of including
 * torch/csrc/Exceptions.h, which pulls in pybind11. */
namespace torch {
__attribute__((visibility("default"))) void translate_exception_to_python(const std::exception_ptr&);
}  // namespace torch

/* A method table's entry for the function `name`; the flags of one taking
 * keywords; the module's init function and name from TORCH_EXTENSION_NAME
 * (cpp_extension defines it). */
#define GM_FN(name, flags, doc) \
  {#name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(name)), flags, doc}
#define GM_KW (METH_VARARGS | METH_KEYWORDS)
#define GM_INIT_NAME2(name) PyInit_##name
#define GM_INIT_NAME(name) GM_INIT_NAME2(name)
#define GM_STR2(name) #name
#define GM_STR(name) GM_STR2(name)

namespace {

/* Run `body` (returning a new reference, or nullptr with an exception set);
 * a C++ exception becomes torch's Python exception for it. */
template <typename F>
PyObject* guarded(F&& body) noexcept {
  try {
    return body();
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

/* Run `body` with the GIL released (it may wait on the device); its C++
 * exception is thrown again once the GIL is held. */
template <typename F>
void without_gil(F&& body) {
  std::exception_ptr failed;
  Py_BEGIN_ALLOW_THREADS
  try {
    body();
  } catch (...) {
    failed = std::current_exception();
  }
  Py_END_ALLOW_THREADS
  if (failed)
    std::rethrow_exception(failed);
}

inline PyObject* py_bool(bool v) { return PyBool_FromLong(v); }

PyObject* py_str(const std::string& s) {
  return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
}

/* d[key] = value, stealing value; false (exception set) on failure. */
bool put(PyObject* d, const char* key, PyObject* value) {
  if (!value)
    return false;
  int rc = PyDict_SetItemString(d, key, value);
  Py_DECREF(value);
  return rc == 0;
}

/* A new dict, or nullptr (exception set) when `fill` fails. */
template <typename F>
PyObject* make_dict(F&& fill) {
  PyObject* d = PyDict_New();
  if (d && !fill(d))
    Py_CLEAR(d);
  return d;
}

template <typename T>
const T* import_capsule(const char* name, unsigned version, const char* what) {
  const T* api = static_cast<const T*>(PyCapsule_Import(name, 0));
  if (!api)
    return nullptr;
  unsigned have = static_cast<unsigned>(api->version);
  if (have != version) {
    PyErr_Format(PyExc_ImportError,
                 "gpumem's torch shim was built for %s version %u but gpumem._C provides version "
                 "%u; rebuild the shim with gpumem.pytorch.shim_build.build(force=True)",
                 what, version, have);
    return nullptr;
  }
  return api;
}


}  // namespace

#endif /* GM_TORCH_PYCALL_H */
