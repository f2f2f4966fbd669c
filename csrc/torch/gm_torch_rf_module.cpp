/*
 * gm_torch_rf_module.cpp - the Python module gpumem_torch_record_function:
 * the record_function callbacks of memory history
 * (gm_torch_record_function.cpp) for gpumem.recording.history. Built and
 * imported by gpumem/pytorch/shim_build.py only when recording first needs
 * it (or by gpumem build-shim), so that the torch shim's first build does
 * not compile ATen/record_function.h. Talks to no other part of gpumem: it
 * fetches no capsule, and the shim is reached through torch's allocator
 * interface only (Note [Compile contexts]).
 */
#include <Python.h>

#include "gm_torch_pycall.h"
#include "gm_torch_record_function.h"

#ifndef GM_TORCH_VERSION
#define GM_TORCH_VERSION "unknown"
#endif

namespace {

PyObject* build_info(PyObject*, PyObject*) {
  return make_dict([](PyObject* d) {
    return put(d, "torch_version", PyUnicode_FromString(GM_TORCH_VERSION));
  });
}

PyObject* set_annotations(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"enabled", "global_", nullptr};
  int enabled, global;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "pp:set_annotations", const_cast<char**>(kw),
                                   &enabled, &global))
    return nullptr;
  return guarded([&]() -> PyObject* {
    gpumem::set_annotations(enabled != 0, global != 0);
    Py_RETURN_NONE;
  });
}

PyObject* set_compile_contexts(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"enabled", nullptr};
  int enabled;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "p:set_compile_contexts", const_cast<char**>(kw),
                                   &enabled))
    return nullptr;
  return guarded([&]() -> PyObject* {
    gpumem::set_compile_contexts(enabled != 0);
    Py_RETURN_NONE;
  });
}

PyObject* annotations(PyObject*, PyObject*) {
  return guarded([]() -> PyObject* {
    PyObject* out = PyList_New(0);
    for (const auto& a : gpumem::annotations()) {
      if (!out)
        break;
      PyObject* d = make_dict([&](PyObject* e) {
        return put(e, "stage", PyUnicode_FromString(std::get<1>(a) ? "START" : "END")) &&
               put(e, "name", py_str(std::get<0>(a))) &&
               put(e, "device", PyLong_FromLong(std::get<2>(a))) &&
               put(e, "time_us", PyLong_FromLongLong(static_cast<long long>(std::get<3>(a))));
      });
      if (!d || PyList_Append(out, d) < 0)
        Py_CLEAR(out);
      Py_XDECREF(d);
    }
    return out;
  });
}

PyMethodDef methods[] = {
    GM_FN(build_info, METH_NOARGS, "What the module was built for: torch_version."),
    GM_FN(set_annotations, GM_KW,
          "set_annotations(enabled, global_): record record_function ranges while memory history "
          "is recorded (Note [Annotations])."),
    GM_FN(set_compile_contexts, GM_KW,
          "set_compile_contexts(enabled): name torch.compile regions on trace entries while "
          "recording (Note [Compile contexts])."),
    GM_FN(annotations, METH_NOARGS,
          "external_annotations for a snapshot: {stage, name, device, time_us} each."),    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, nullptr,
    "gpumem's record_function callbacks of memory history (annotations, torch.compile regions)",
    -1, methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC GM_INIT_NAME(TORCH_EXTENSION_NAME)(void) {
  module_def.m_name = GM_STR(TORCH_EXTENSION_NAME);
  return PyModule_Create(&module_def);
}
