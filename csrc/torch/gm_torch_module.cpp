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
 * installs the Python callable behind run_oom_hook (Note [OOM hook]).
 * torch_settings() reads torch's allocator settings (Note [One parser:
 * torch's] in gm_torch_config.cpp); a bad setting raises torch's
 * ValueError.
 */
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#if GM_TORCH_PINNED_THRESHOLDS
#include <c10/core/AllocatorConfig.h>
#endif
#include <c10/cuda/CUDAAllocatorConfig.h>

#include "gm_torch.h"

namespace py = pybind11;
using gpumem::GpumemAllocator;

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

void set_oom_hook(py::object fn) {
  if (!fn.is_none() && !PyCallable_Check(fn.ptr()))
    throw py::type_error("the OOM hook must be callable or None");
  PyObject* old = g_oom_hook;
  g_oom_hook = fn.is_none() ? nullptr : fn.release().ptr();
  g_oom_hook_set.store(g_oom_hook != nullptr, std::memory_order_release);
  Py_XDECREF(old); /* a call in progress holds its own reference */
}

}  // namespace

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

#ifndef GM_TORCH_VERSION
#define GM_TORCH_VERSION "unknown"
#endif

namespace {

GpumemAllocator& need_instance() {
  GpumemAllocator* a = gpumem::instance();
  if (!a)
    throw std::runtime_error("gpumem's torch allocator has not been created; call gpumem.install()");
  return *a;
}

void check_index(int device) {
  if (device < 0 || device >= gpumem::kMaxDevices)
    throw py::value_error("device " + std::to_string(device) + " is out of range");
}

template <typename T>
const T* import_capsule(const char* name, unsigned version, const char* what) {
  void* p = PyCapsule_Import(name, 0);
  if (!p)
    throw py::error_already_set();
  const T* api = static_cast<const T*>(p);
  unsigned have = static_cast<unsigned>(api->version);
  if (have != version)
    throw py::import_error(std::string("gpumem's torch shim was built for ") + what + " version " +
                           std::to_string(version) + " but gpumem._C provides version " +
                           std::to_string(have) +
                           "; rebuild the shim with gpumem.pytorch.shim_build.build(force=True)");
  return api;
}

py::object settings_dict(const gm_settings_t& s) {
  PyObject* d = gpumem::g_core->settings_dict(&s);
  if (!d)
    throw py::error_already_set();
  return py::reinterpret_steal<py::object>(d);
}

/* torch's settings, after applying `override_conf` (GPUMEM_ALLOC_CONF) as a
 * complete replacement of the torch variables' device settings. */
py::dict torch_settings(py::object override_conf) {
  try {
    gpumem::torch_settings(); /* torch parses its variables now: their errors first */
    if (!override_conf.is_none()) {
#if GM_TORCH_FRACTION_SETTING
      gpumem::set_torch_settings_text("expandable_segments:False,per_process_memory_fraction:1.0");
#else
      gpumem::set_torch_settings_text("expandable_segments:False");
#endif
      gpumem::set_torch_settings_text(override_conf.cast<std::string>());
    }
    py::dict out;
    out["settings"] = settings_dict(gpumem::torch_settings());
    out["conf"] = gpumem::torch_settings_text();
    out["fraction"] = gpumem::torch_memory_fraction();
    out["caching"] = !gpumem::caching_forced_off();
    return out;
  } catch (const c10::ValueError& e) {
    throw py::value_error(e.what_without_backtrace());
  } catch (const c10::Error& e) {
    throw py::value_error(e.what_without_backtrace());
  }
}

/* torch's allocator_settings snapshot dict (torch/csrc/cuda/Module.cpp's keys
 * and order), for the settings gpumem runs with. */
py::dict allocator_settings() {
  using Cuda = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;
  gm_settings_t s = need_instance().settings();
  auto as_i64 = [](size_t v) { return v == SIZE_MAX ? int64_t(-1) : static_cast<int64_t>(v); };
  py::dict d;
  d["PYTORCH_CUDA_ALLOC_CONF"] = gpumem::torch_settings_text();
  d["max_split_size"] = as_i64(s.max_split_size);
  d["garbage_collection_threshold"] = s.garbage_collection_threshold;
  d["expandable_segments"] = s.expandable_segments != 0;
  d["pinned_num_register_threads"] = static_cast<int64_t>(Cuda::pinned_num_register_threads());
  d["release_lock_on_cudamalloc"] = Cuda::release_lock_on_cudamalloc();
  d["pinned_use_cuda_host_register"] = Cuda::pinned_use_cuda_host_register();
#if GM_TORCH_RECORD_STREAM_REUSE
  d["graph_capture_record_stream_reuse"] = Cuda::graph_capture_record_stream_reuse();
#endif
#if GM_TORCH_PINNED_THRESHOLDS
  using Accel = c10::CachingAllocator::AcceleratorAllocatorConfig;
  d["max_round_threshold"] = as_i64(Accel::pinned_max_round_threshold());
  d["max_cached_size"] = as_i64(Accel::pinned_max_cached_size());
#endif
  py::dict roundup;
  for (int i = 0; i < GM_ROUNDUP_INTERVALS; i++)
    roundup[py::str(std::to_string(1u << i))] = static_cast<int64_t>(s.roundup_power2_divisions[i]);
  d["roundup_power2_divisions"] = roundup;
  return d;
}

py::object stats_of(int device) {
  check_index(device);
  GpumemAllocator& alloc = need_instance();
  gm_stats_t st{};
  if (gm_alloc_t* a = alloc.existing_core(device)) {
    gpumem::g_core->get_stats(a, &st);
  } else { /* nothing allocated on this device yet: zeros, as torch reports */
    size_t ms = alloc.settings().max_split_size;
    st.max_split_size = ms == SIZE_MAX ? -1 : static_cast<int64_t>(ms);
  }
  PyObject* d = gpumem::g_core->stats_dict(&st);
  if (!d)
    throw py::error_already_set();
  return py::reinterpret_steal<py::object>(d);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gpumem's torch shim: gpumem's allocator core as torch's CUDA allocator";
  gpumem::g_core =
      import_capsule<gm_core_api_t>(GM_CORE_API_CAPSULE, GM_CORE_API_VERSION, "core API");
  if (gpumem::g_core->size < sizeof(gm_core_api_t))
    throw py::import_error(
        "gpumem._C's core API table is shorter than this torch shim expects: gpumem._C was built "
        "from older sources than the shim; rebuild gpumem (pip install -e .)");
  gpumem::g_hist =
      import_capsule<gm_hist_api_t>("gpumem._C._hist_api", GM_HIST_API_VERSION, "history API");

  m.def("build_info", []() {
    py::dict d;
    d["torch_version"] = GM_TORCH_VERSION;
    d["core_api_version"] = GM_CORE_API_VERSION;
    d["hist_api_version"] = GM_HIST_API_VERSION;
    d["max_devices"] = gpumem::kMaxDevices;
    return d;
  });

  m.def("interfaces", []() {
    /* The memory-history interfaces of the torch built against
     * (gm_torch_compat.h), for the Python side (gpumem.pytorch.release). */
    py::dict d;
    d["accel_config"] = static_cast<bool>(GM_TORCH_ACCEL_CONFIG);
    d["mempool_api"] = static_cast<bool>(GM_TORCH_MEMPOOL_API);
    d["history_clear"] = static_cast<bool>(GM_TORCH_HISTORY_CLEAR);
    d["compile_context"] = static_cast<bool>(GM_TORCH_COMPILE_CONTEXT);
    d["user_metadata"] = static_cast<bool>(GM_TORCH_USER_METADATA);
    d["skip_actions"] = static_cast<bool>(GM_TORCH_HISTORY_SKIP_ACTIONS);
    d["trace_pool_id"] = static_cast<bool>(GM_TORCH_TRACE_POOL_ID);
    d["host_history"] = static_cast<bool>(GM_TORCH_HOST_HISTORY);
    return d;
  });

  m.def(
      "create",
      [](py::object settings) {
        gm_settings_t s;
        if (gpumem::g_core->settings_from_obj(settings.ptr(), &s) < 0)
          throw py::error_already_set();
        std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> a =
            gpumem::create_instance(s);
        return a;
      },
      py::arg("settings") = py::none(),
      "Create (once) gpumem's torch allocator; returns it as torch._C._cuda_CUDAAllocator. "
      "Settings of a second call are ignored: the first allocator stays.");

  m.def("follow_torch_settings", &gpumem::follow_torch_settings,
        "Route torch's later settings strings to the allocator (once); False where this torch "
        "has no hook for it: then call settings_changed(text) after torch's setter.");
  m.def("settings_changed", &gpumem::settings_changed, py::arg("text"),
        "torch parsed a new settings string `text`: warn about its ignored keys and apply it.");
  m.def("torch_settings", &torch_settings, py::arg("override_conf") = py::none(),
        "{'settings': gpumem's settings dict, 'conf': the string torch parsed last, "
        "'fraction': per_process_memory_fraction, 'caching': False under "
        "PYTORCH_NO_CUDA_MEMORY_CACHING}; override_conf (GPUMEM_ALLOC_CONF) replaces the "
        "device settings of torch's variables first. A bad setting raises ValueError.");
  m.def("ignored_entries", &gpumem::ignored_entries, py::arg("text"), py::arg("source"),
        "One line per entry of a settings string that gpumem does not honour.");
  m.def("settings", []() { return settings_dict(need_instance().settings()); },
        "The settings dict in force (torch's settings changed at run time included).");
  m.def("allocator_settings", &allocator_settings,
        "torch's allocator_settings snapshot dict for the settings in force.");
  m.def("set_annotations", &gpumem::set_annotations, py::arg("enabled"), py::arg("global_"),
        "Record record_function ranges while memory history is recorded (Note [Annotations]).");
  m.def("set_compile_contexts", &gpumem::set_compile_contexts, py::arg("enabled"),
        "Name torch.compile regions on trace entries while recording (Note [Compile contexts]).");
  m.def("annotations", []() {
    py::list out;
    for (const auto& a : gpumem::annotations()) {
      py::dict d;
      d["stage"] = std::get<1>(a) ? "START" : "END";
      d["name"] = std::get<0>(a);
      d["device"] = std::get<2>(a);
      d["time_us"] = std::get<3>(a);
      out.append(d);
    }
    return out;
  }, "external_annotations for a snapshot: {stage, name, device, time_us} each.");
  m.def("exists", []() { return gpumem::instance() != nullptr; });
  m.def("is_current", []() {
    GpumemAllocator* a = gpumem::instance();
    return a != nullptr && c10::cuda::CUDACachingAllocator::get() == a;
  });
  m.def("initialized", []() {
    GpumemAllocator* a = gpumem::instance();
    return a != nullptr && a->initialized();
  });
  m.def("devices", []() {
    std::vector<int> out;
    GpumemAllocator* a = gpumem::instance();
    for (int d = 0; a && d < gpumem::kMaxDevices; d++)
      if (a->existing_core(d))
        out.push_back(d);
    return out;
  });
  m.def(
      "ensure_device",
      [](int device) {
        check_index(device);
        need_instance().core(static_cast<c10::DeviceIndex>(device));
      },
      py::call_guard<py::gil_scoped_release>(),
      "Create the core of `device` now (loads the driver, retains the primary context).");
  m.def("stats", &stats_of, "Flat stats dict of `device`'s core (zeros before its first use).");
  m.def("reset_peak", [](int device) {
    check_index(device);
    need_instance().resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
  m.def("reset_accumulated", [](int device) {
    check_index(device);
    need_instance().resetAccumulatedStats(static_cast<c10::DeviceIndex>(device));
  });
  m.def(
      "empty_cache", []() { need_instance().emptyCache(); },
      py::call_guard<py::gil_scoped_release>());
  m.def("set_memory_fraction", [](double fraction, int device) {
    check_index(device);
    need_instance().setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
  });
  m.def("memory_fraction", [](int device) {
    check_index(device);
    return need_instance().getMemoryFraction(static_cast<c10::DeviceIndex>(device));
  });
  m.def("memory_limit", [](int device) -> size_t {
    check_index(device);
    gm_alloc_t* a = need_instance().existing_core(device);
    return a ? gpumem::g_core->memory_limit(a) : 0;
  });
  m.def("mem_get_info", [](int device) {
    check_index(device);
    size_t free_b = 0, total = 0;
    char err[512] = "";
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = gpumem::g_core->mem_get_info(device, &free_b, &total, err, sizeof err);
    }
    if (rc != GM_OK)
      throw std::runtime_error(std::string("gpumem: mem_get_info failed: ") + err);
    return py::make_tuple(free_b, total);
  });
  m.def("set_oom_hook", &set_oom_hook, py::arg("hook"),
        "Set (or, with None, clear) the callable run when an allocation fails with out of "
        "memory: hook(device, requested, rounded, device_free, device_total, stream, message) "
        "-> str to append to the message, or None (Note [OOM hook]).");
  m.def("device_count", []() {
    GpumemAllocator* a = gpumem::instance();
    return a ? a->device_count() : 0;
  });
}
