/*
 * gm_torch_module.cpp - the Python module of the torch shim (built by
 * gpumem/pytorch/shim_build.py with torch.utils.cpp_extension; imported only by
 * gpumem/pytorch/installer.py and gpumem/pytorch/stats.py).
 *
 * At import it fetches gpumem._C's capsules (_core_api, _hist_api) and
 * refuses to load against a core whose table layout it was not built for.
 * Functions take device indices already resolved by Python; they never
 * initialise CUDA themselves except ensure_device(). Calls that may wait on
 * the device (empty_cache, ensure_device) release the GIL. set_oom_hook()
 * (gm_torch_oom_hook.cpp) installs the Python callable behind run_oom_hook.
 * torch_settings() reads torch's allocator settings (Note [One parser:
 * torch's] in gm_torch_config.cpp); a bad setting raises torch's
 * ValueError. Written against the plain C API (no pybind11: its templates
 * were half of the shim's build time); a C++ exception leaving a function
 * becomes the Python exception torch's own bindings raise for it
 * (torch::translate_exception_to_python). make_current() swaps the allocator
 * in as torch._C._cuda_changeCurrentAllocator does.
 */
#include <Python.h>

#if GM_TORCH_PINNED_THRESHOLDS
#include <c10/core/AllocatorConfig.h>
#endif
#include <c10/cuda/CUDAAllocatorConfig.h>

#include "gm_torch.h"
#include "gm_torch_pycall.h"

using gpumem::GpumemAllocator;

#ifndef GM_TORCH_VERSION
#define GM_TORCH_VERSION "unknown"
#endif

namespace {

gpumem::GpumemAllocator& need_instance() {
  gpumem::GpumemAllocator* a = gpumem::instance();
  if (!a)
    throw std::runtime_error("gpumem's torch allocator has not been created; call gpumem.install()");
  return *a;
}

/* The device argument of `args` (one int), range-checked; false with an
 * exception set otherwise. */
bool device_arg(PyObject* args, const char* fmt, int* device) {
  if (!PyArg_ParseTuple(args, fmt, device))
    return false;
  if (*device < 0 || *device >= gpumem::kMaxDevices) {
    PyErr_Format(PyExc_ValueError, "device %d is out of range", *device);
    return false;
  }
  return true;
}

PyObject* settings_dict(const gm_settings_t& s) { return gpumem::g_core->settings_dict(&s); }

/* ---- the module's functions ---- */

PyObject* build_info(PyObject*, PyObject*) {
  return make_dict([](PyObject* d) {
    return put(d, "torch_version", PyUnicode_FromString(GM_TORCH_VERSION)) &&
           put(d, "core_api_version", PyLong_FromLong(GM_CORE_API_VERSION)) &&
           put(d, "hist_api_version", PyLong_FromLong(GM_HIST_API_VERSION)) &&
           put(d, "max_devices", PyLong_FromLong(gpumem::kMaxDevices));
  });
}

/* The memory-history interfaces of the torch built against
 * (gm_torch_compat.h), for the Python side (gpumem.pytorch.release). */
PyObject* interfaces(PyObject*, PyObject*) {
  return make_dict([](PyObject* d) {
    return put(d, "accel_config", py_bool(GM_TORCH_ACCEL_CONFIG)) &&
           put(d, "mempool_api", py_bool(GM_TORCH_MEMPOOL_API)) &&
           put(d, "history_clear", py_bool(GM_TORCH_HISTORY_CLEAR)) &&
           put(d, "compile_context", py_bool(GM_TORCH_COMPILE_CONTEXT)) &&
           put(d, "user_metadata", py_bool(GM_TORCH_USER_METADATA)) &&
           put(d, "skip_actions", py_bool(GM_TORCH_HISTORY_SKIP_ACTIONS)) &&
           put(d, "trace_pool_id", py_bool(GM_TORCH_TRACE_POOL_ID)) &&
           put(d, "host_history", py_bool(GM_TORCH_HOST_HISTORY));
  });
}

PyObject* create(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"settings", nullptr};
  PyObject* settings = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:create", const_cast<char**>(kw), &settings))
    return nullptr;
  gm_settings_t s;
  if (gpumem::g_core->settings_from_obj(settings, &s) < 0)
    return nullptr;
  return guarded([&]() -> PyObject* {
    gpumem::create_instance(s);
    Py_RETURN_NONE;
  });
}

PyObject* make_current(PyObject*, PyObject*) {
  return guarded([]() -> PyObject* {
    need_instance();
    /* create_instance returns the allocator already made (its settings unused). */
    std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> a =
        gpumem::create_instance(gm_settings_t{});
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
    Py_RETURN_NONE;
  });
}

PyObject* follow_torch_settings(PyObject*, PyObject*) {
  return guarded([]() { return py_bool(gpumem::follow_torch_settings()); });
}

PyObject* settings_changed(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"text", nullptr};
  const char* text;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s:settings_changed", const_cast<char**>(kw),
                                   &text))
    return nullptr;
  return guarded([&]() -> PyObject* {
    gpumem::settings_changed(text);
    Py_RETURN_NONE;
  });
}

/* torch's settings, after applying `override_conf` (GPUMEM_ALLOC_CONF) as a
 * complete replacement of the torch variables' device settings. */
PyObject* torch_settings(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"override_conf", nullptr};
  const char* conf = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|z:torch_settings", const_cast<char**>(kw),
                                   &conf))
    return nullptr;
  return guarded([&]() -> PyObject* {
    try {
      gpumem::torch_settings(); /* torch parses its variables now: their errors first */
      if (conf) {
#if GM_TORCH_FRACTION_SETTING
        gpumem::set_torch_settings_text("expandable_segments:False,per_process_memory_fraction:1.0");
#else
        gpumem::set_torch_settings_text("expandable_segments:False");
#endif
        gpumem::set_torch_settings_text(conf);
      }
      gm_settings_t s = gpumem::torch_settings();
      std::string text = gpumem::torch_settings_text();
      double fraction = gpumem::torch_memory_fraction();
      bool caching = !gpumem::caching_forced_off();
      return make_dict([&](PyObject* d) {
        return put(d, "settings", settings_dict(s)) && put(d, "conf", py_str(text)) &&
               put(d, "fraction", PyFloat_FromDouble(fraction)) &&
               put(d, "caching", py_bool(caching));
      });
    } catch (const c10::Error& e) { /* c10::ValueError included */
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
      return nullptr;
    } catch (const std::logic_error& e) { /* std::stoull's, on a number torch cannot read */
      PyErr_SetString(PyExc_ValueError, e.what());
      return nullptr;
    }
  });
}

PyObject* ignored_entries(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"text", "source", nullptr};
  const char *text, *source;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss:ignored_entries", const_cast<char**>(kw),
                                   &text, &source))
    return nullptr;
  return guarded([&]() -> PyObject* {
    std::vector<std::string> lines = gpumem::ignored_entries(text, source);
    PyObject* out = PyList_New(static_cast<Py_ssize_t>(lines.size()));
    for (size_t i = 0; out && i < lines.size(); i++) {
      PyObject* s = py_str(lines[i]);
      if (!s)
        Py_CLEAR(out);
      else
        PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), s);
    }
    return out;
  });
}

PyObject* settings(PyObject*, PyObject*) {
  return guarded([]() { return settings_dict(need_instance().settings()); });
}

/* torch's allocator_settings snapshot dict (torch/csrc/cuda/Module.cpp's keys
 * and order), for the settings gpumem runs with. */
PyObject* allocator_settings(PyObject*, PyObject*) {
  return guarded([]() -> PyObject* {
    using Cuda = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;
    gm_settings_t s = need_instance().settings();
    auto as_i64 = [](size_t v) {
      return PyLong_FromLongLong(v == SIZE_MAX ? -1LL : static_cast<long long>(v));
    };
    return make_dict([&](PyObject* d) {
      bool ok = put(d, "PYTORCH_CUDA_ALLOC_CONF", py_str(gpumem::torch_settings_text())) &&
                put(d, "max_split_size", as_i64(s.max_split_size)) &&
                put(d, "garbage_collection_threshold",
                    PyFloat_FromDouble(s.garbage_collection_threshold)) &&
                put(d, "expandable_segments", py_bool(s.expandable_segments != 0)) &&
                put(d, "pinned_num_register_threads",
                    PyLong_FromLongLong(static_cast<long long>(Cuda::pinned_num_register_threads()))) &&
                put(d, "release_lock_on_cudamalloc", py_bool(Cuda::release_lock_on_cudamalloc())) &&
                put(d, "pinned_use_cuda_host_register",
                    py_bool(Cuda::pinned_use_cuda_host_register()));
#if GM_TORCH_RECORD_STREAM_REUSE
      ok = ok && put(d, "graph_capture_record_stream_reuse",
                     py_bool(Cuda::graph_capture_record_stream_reuse()));
#endif
#if GM_TORCH_PINNED_THRESHOLDS
      using Accel = c10::CachingAllocator::AcceleratorAllocatorConfig;
      ok = ok && put(d, "max_round_threshold", as_i64(Accel::pinned_max_round_threshold())) &&
           put(d, "max_cached_size", as_i64(Accel::pinned_max_cached_size()));
#endif
      return ok && put(d, "roundup_power2_divisions", make_dict([&](PyObject* r) {
                         for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++)
                           if (!put(r, std::to_string(1u << i).c_str(),
                                    PyLong_FromLongLong(
                                        static_cast<long long>(s.roundup_power2_divisions[i]))))
                             return false;
                         return true;
                       }));
    });
  });
}

PyObject* exists(PyObject*, PyObject*) { return py_bool(gpumem::instance() != nullptr); }

PyObject* is_current(PyObject*, PyObject*) {
  return guarded([]() {
    GpumemAllocator* a = gpumem::instance();
    return py_bool(a != nullptr && c10::cuda::CUDACachingAllocator::get() == a);
  });
}

PyObject* initialized(PyObject*, PyObject*) {
  return guarded([]() {
    GpumemAllocator* a = gpumem::instance();
    return py_bool(a != nullptr && a->initialized());
  });
}

PyObject* devices(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  GpumemAllocator* a = gpumem::instance();
  for (int d = 0; out && a && d < gpumem::kMaxDevices; d++) {
    if (!a->existing_core(d))
      continue;
    PyObject* i = PyLong_FromLong(d);
    if (!i || PyList_Append(out, i) < 0)
      Py_CLEAR(out);
    Py_XDECREF(i);
  }
  return out;
}

/* Create the core of `device` now (loads the driver, retains the primary
 * context); may wait on the device, so without the GIL. */
PyObject* ensure_device(PyObject*, PyObject* args) {
  int device;
  if (!device_arg(args, "i:ensure_device", &device))
    return nullptr;
  return guarded([&]() -> PyObject* {
    GpumemAllocator& alloc = need_instance();
    without_gil([&] { alloc.core(static_cast<c10::DeviceIndex>(device)); });
    Py_RETURN_NONE;
  });
}

PyObject* stats(PyObject*, PyObject* args) {
  int device;
  if (!device_arg(args, "i:stats", &device))
    return nullptr;
  return guarded([&]() -> PyObject* {
    GpumemAllocator& alloc = need_instance();
    gm_stats_t st{};
    if (gm_alloc_t* a = alloc.existing_core(device)) {
      gpumem::g_core->get_stats(a, &st);
    } else { /* nothing allocated on this device yet: zeros, as torch reports */
      size_t ms = alloc.settings().max_split_size;
      st.max_split_size = ms == SIZE_MAX ? -1 : static_cast<int64_t>(ms);
    }
    return gpumem::g_core->stats_dict(&st);
  });
}

PyObject* reset_peak(PyObject*, PyObject* args) {
  int device;
  if (!device_arg(args, "i:reset_peak", &device))
    return nullptr;
  return guarded([&]() -> PyObject* {
    need_instance().resetPeakStats(static_cast<c10::DeviceIndex>(device));
    Py_RETURN_NONE;
  });
}

PyObject* reset_accumulated(PyObject*, PyObject* args) {
  int device;
  if (!device_arg(args, "i:reset_accumulated", &device))
    return nullptr;
  return guarded([&]() -> PyObject* {
    need_instance().resetAccumulatedStats(static_cast<c10::DeviceIndex>(device));
    Py_RETURN_NONE;
  });
}

PyObject* empty_cache(PyObject*, PyObject*) {
  return guarded([]() -> PyObject* {
    GpumemAllocator& alloc = need_instance();
    without_gil([&] { alloc.emptyCache(); });
    Py_RETURN_NONE;
  });
}

PyObject* set_memory_fraction(PyObject*, PyObject* args) {
  double fraction;
  int device;
  if (!PyArg_ParseTuple(args, "di:set_memory_fraction", &fraction, &device))
    return nullptr;
  if (device < 0 || device >= gpumem::kMaxDevices) {
    PyErr_Format(PyExc_ValueError, "device %d is out of range", device);
    return nullptr;
  }
  return guarded([&]() -> PyObject* {
    need_instance().setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
    Py_RETURN_NONE;
  });
}

PyObject* memory_fraction(PyObject*, PyObject* args) {
  int device;
  if (!device_arg(args, "i:memory_fraction", &device))
    return nullptr;
  return guarded([&]() {
    return PyFloat_FromDouble(
        need_instance().getMemoryFraction(static_cast<c10::DeviceIndex>(device)));
  });
}

PyObject* memory_limit(PyObject*, PyObject* args) {
  int device;
  if (!device_arg(args, "i:memory_limit", &device))
    return nullptr;
  return guarded([&]() {
    gm_alloc_t* a = need_instance().existing_core(device);
    return PyLong_FromSize_t(a ? gpumem::g_core->memory_limit(a) : 0);
  });
}

PyObject* mem_get_info(PyObject*, PyObject* args) {
  int device;
  if (!device_arg(args, "i:mem_get_info", &device))
    return nullptr;
  size_t free_b = 0, total = 0;
  char err[512] = "";
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpumem::g_core->mem_get_info(device, &free_b, &total, err, sizeof err);
  Py_END_ALLOW_THREADS
  if (rc != GM_OK) {
    PyErr_Format(PyExc_RuntimeError, "gpumem: mem_get_info failed: %s", err);
    return nullptr;
  }
  return Py_BuildValue("(nn)", static_cast<Py_ssize_t>(free_b), static_cast<Py_ssize_t>(total));
}

PyObject* device_count(PyObject*, PyObject*) {
  GpumemAllocator* a = gpumem::instance();
  return PyLong_FromLong(a ? a->device_count() : 0);
}

PyMethodDef methods[] = {
    GM_FN(build_info, METH_NOARGS, "What the shim was built for: torch_version, core/hist API versions, max_devices."),
    GM_FN(interfaces, METH_NOARGS, "The memory-history interfaces of the torch built against (gm_torch_compat.h)."),
    GM_FN(create, GM_KW,
          "create(settings=None): create (once) gpumem's torch allocator. Settings of a second "
          "call are ignored: the first allocator stays."),
    GM_FN(make_current, METH_NOARGS,
          "Make the allocator create() made torch's CUDA allocator, as "
          "torch.cuda.memory.change_current_allocator does (RuntimeError once torch's is in use)."),
    GM_FN(follow_torch_settings, METH_NOARGS,
          "Route torch's later settings strings to the allocator (once); False where this torch "
          "has no hook for it: then call settings_changed(text) after torch's setter."),
    GM_FN(settings_changed, GM_KW,
          "settings_changed(text): torch parsed a new settings string `text`: warn about its "
          "ignored keys and apply it."),
    GM_FN(torch_settings, GM_KW,
          "torch_settings(override_conf=None) -> {'settings': gpumem's settings dict, 'conf': the "
          "string torch parsed last, 'fraction': per_process_memory_fraction, 'caching': False "
          "under PYTORCH_NO_CUDA_MEMORY_CACHING}; override_conf (GPUMEM_ALLOC_CONF) replaces the "
          "device settings of torch's variables first. A bad setting raises ValueError."),
    GM_FN(ignored_entries, GM_KW,
          "ignored_entries(text, source): one line per entry of a settings string that gpumem "
          "does not honour."),
    GM_FN(settings, METH_NOARGS,
          "The settings dict in force (torch's settings changed at run time included)."),
    GM_FN(allocator_settings, METH_NOARGS,
          "torch's allocator_settings snapshot dict for the settings in force."),
    GM_FN(exists, METH_NOARGS, "The allocator has been created."),
    GM_FN(is_current, METH_NOARGS, "The allocator is torch's current CUDA allocator."),
    GM_FN(initialized, METH_NOARGS, "torch has initialised the allocator (init())."),
    GM_FN(devices, METH_NOARGS, "The devices whose core exists."),
    GM_FN(ensure_device, METH_VARARGS,
          "ensure_device(device): create the core of `device` now (loads the driver, retains the "
          "primary context)."),
    GM_FN(stats, METH_VARARGS,
          "stats(device): flat stats dict of `device`'s core (zeros before its first use)."),
    GM_FN(reset_peak, METH_VARARGS, "reset_peak(device)"),
    GM_FN(reset_accumulated, METH_VARARGS, "reset_accumulated(device)"),
    GM_FN(empty_cache, METH_NOARGS, "Release the cached blocks of every device."),
    GM_FN(set_memory_fraction, METH_VARARGS, "set_memory_fraction(fraction, device)"),
    GM_FN(memory_fraction, METH_VARARGS, "memory_fraction(device)"),
    GM_FN(memory_limit, METH_VARARGS, "memory_limit(device): the core's limit in bytes (0 before its first use)."),
    GM_FN(mem_get_info, METH_VARARGS, "mem_get_info(device) -> (free, total)"),
    {"set_oom_hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(gpumem::set_oom_hook)), METH_O,
          "set_oom_hook(hook): set (or, with None, clear) the callable run when an allocation "
          "fails with out of memory: hook(device, requested, rounded, device_free, device_total, "
          "stream, message) -> str to append to the message, or None (Note [OOM hook])."},
    GM_FN(device_count, METH_NOARGS, "How many devices torch announced through init() (0 before)."),
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, nullptr,
    "gpumem's torch shim: gpumem's allocator core as torch's CUDA allocator", -1, methods,
    nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC GM_INIT_NAME(TORCH_EXTENSION_NAME)(void) {
  gpumem::g_core =
      import_capsule<gm_core_api_t>(GM_CORE_API_CAPSULE, GM_CORE_API_VERSION, "core API");
  if (!gpumem::g_core)
    return nullptr;
  if (gpumem::g_core->size < sizeof(gm_core_api_t)) {
    PyErr_SetString(PyExc_ImportError,
                    "gpumem._C's core API table is shorter than this torch shim expects: gpumem._C "
                    "was built from older sources than the shim; rebuild gpumem (pip install -e .)");
    return nullptr;
  }
  gpumem::g_hist =
      import_capsule<gm_hist_api_t>("gpumem._C._hist_api", GM_HIST_API_VERSION, "history API");
  if (!gpumem::g_hist)
    return nullptr;
  module_def.m_name = GM_STR(TORCH_EXTENSION_NAME);
  return PyModule_Create(&module_def);
}
