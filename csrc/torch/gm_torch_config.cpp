/*
 * gm_torch_config.cpp - torch's allocator settings, honoured by gpumem.
 *
 * Note [One parser: torch's]
 * Rationale: a user who sets PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF)
 *   or calls torch.cuda.memory._set_allocator_settings expects what torch
 *   does: the same keys, the same errors, the same reset of the keys a new
 *   string does not name, the same per_process_memory_fraction.
 * Approach: torch parses every string (c10's AcceleratorAllocatorConfig and
 *   CUDAAllocatorConfig); gpumem reads the parsed values (torch_settings)
 *   when it creates its allocator, and again after every later string:
 *   follow_torch_settings() wraps c10's device-config parser hook, which
 *   every setter ends in (torch.cuda.memory._set_allocator_settings,
 *   torch._C._accelerator_setAllocatorSettings, C++ callers), and hands the
 *   new values to every core (GpumemAllocator::apply_settings). torch 2.9
 *   and 2.10 have no getter for that hook: gpumem's replaces it and calls
 *   CUDAAllocatorConfig's parser itself, as the hook it replaces did.
 *   Before 2.9 there is no hook: gpumem.install() wraps torch's Python
 *   setter, which then calls settings_changed().
 *   GPUMEM_ALLOC_CONF, when set, is given to the same parser at install
 *   (gm_torch_module.cpp, configure): it overrides the torch variables.
 *   Keys gpumem does not honour are named, one line each
 *   (ignored_entries): as Python warnings at install and when a Python
 *   call changes the settings, through TORCH_WARN for a C++ caller.
 *   gpumem checks every string first (Note [One settings check] in
 *   gpumem/_conf.py: install() and the Python setter it patches), so that
 *   torch's parser never answers with IndexError or an internal assert.
 * Limitations: `backend:` entries given at run time are dropped before
 *   torch's CUDA parser sees them (it insists the backend be the one it
 *   loaded, and gpumem is neither). per_process_memory_fraction applies to
 *   a device when its core is created, as torch applies it when its
 *   per-device allocator is created.
 */
#include <Python.h>

#include "gm_torch.h"

#if GM_TORCH_ACCEL_CONFIG
#include <c10/core/AllocatorConfig.h>
#endif
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <utility>

namespace gpumem {

using CudaConfig = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;
#if GM_TORCH_ACCEL_CONFIG
namespace ac = c10::CachingAllocator;
using Config = ac::AcceleratorAllocatorConfig; /* the generic keys */
#else
using Config = CudaConfig; /* every key */
#endif

gm_settings_t torch_settings() {
  /* CUDAAllocatorConfig first: its first use parses the CUDA-only keys of
   * the environment (and checks them); the generic ones parse on their own. */
  (void)CudaConfig::instance();
  gm_settings_t s;
#if GM_TORCH_ACCEL_CONFIG
  s.expandable_segments = Config::use_expandable_segments() ? 1 : 0;
#else
  s.expandable_segments = Config::expandable_segments() ? 1 : 0;
#endif
  /* torch clamps max_split_size_mb to SIZE_MAX / 1 MiB; gpumem's settings
   * dict (and gpumem._conf's parser) hold at most (2**43 - 1) MiB, whose bytes
   * fit in 63 bits. Every larger value is "no limit" for any device, so it is
   * stored as that one value (Note [One settings check] in gpumem/_conf.py). */
  const size_t max_split = Config::max_split_size();
  const size_t max_split_top = ((size_t{1} << 43) - 1) << 20;
  s.max_split_size = max_split == SIZE_MAX ? SIZE_MAX : std::min(max_split, max_split_top);
  s.garbage_collection_threshold = Config::garbage_collection_threshold();
  const std::vector<size_t>& divs = Config::roundup_power2_divisions();
  /* torch takes any power of two; the core stores 32 bits. gpumem's settings
   * check refuses a count above 2**31 before torch parses it; one that comes
   * around the check (a C++ caller of c10's setter) rounds every request
   * under 1 TiB as 2**31 does (to 512 bytes), so it is clamped rather than
   * truncated (2**40 would read as 0: no rounding division at all). */
  const size_t max_div = size_t{1} << 31;
  for (size_t i = 0; i < GM_ROUNDUP_INTERVALS; i++)
    s.roundup_power2_divisions[i] =
        i < divs.size() ? static_cast<uint32_t>(std::min(divs[i], max_div)) : 0;
  return s;
}

double torch_memory_fraction() {
#if GM_TORCH_FRACTION_SETTING
  return CudaConfig::per_process_memory_fraction();
#else
  return 1.0; /* not a setting yet: only set_per_process_memory_fraction sets it */
#endif
}

std::string torch_settings_text() {
#if GM_TORCH_ACCEL_CONFIG
  return ac::getAllocatorSettings();
#else
  return CudaConfig::last_allocator_settings();
#endif
}

void set_torch_settings_text(const std::string& text) {
#if GM_TORCH_ACCEL_CONFIG
  ac::setAllocatorSettings(text);
#else
  c10::cuda::CUDACachingAllocator::setAllocatorSettings(text);
#endif
}

bool caching_forced_off() { return std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING") != nullptr; }

namespace {

/* The (key, value) entries of a settings string, split like torch's
 * tokenizer: ',' between entries outside brackets, spaces dropped. */
std::vector<std::pair<std::string, std::string>> entries(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string cur;
  int depth = 0;
  auto flush = [&]() {
    size_t colon = cur.find(':');
    if (!cur.empty())
      out.emplace_back(cur.substr(0, colon),
                       colon == std::string::npos ? std::string() : cur.substr(colon + 1));
    cur.clear();
  };
  for (char ch : text) {
    if (ch == '[')
      depth++;
    else if (ch == ']')
      depth--;
    if (ch == ',' && depth <= 0)
      flush();
    else if (ch != ' ' && ch != '\t' && ch != '\n')
      cur += ch;
  }
  flush();
  return out;
}

/* Why gpumem does not honour `key` set to `value`, or "" when it does (or
 * when the value is torch's default, which changes nothing). */
std::string why_ignored(const std::string& key, const std::string& value) {
  if (key == "backend")
    return value == "native" ? ""
                             : "gpumem replaces torch's CUDA allocator, whichever backend this "
                               "names";
  if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc")
    return value == "True" ? "gpumem keeps its lock while the driver allocates" : "";
  if (key == "graph_capture_record_stream_reuse")
    return value == "True" ? "gpumem defers the reuse of memory freed with stream uses during a "
                             "CUDA graph capture until the capture ends, as torch does without it"
                           : "";
  if (key == "throw_on_cudamalloc_oom")
    return value == "True" ? "gpumem always asks the device before reporting out of memory" : "";
  if (key == "max_non_split_rounding_mb")
    return "gpumem's limit for serving a request from an oversize block is fixed at 20 MiB";
  if (key == "large_segment_size_mb")
    return value == "20" ? "" : "gpumem's segments for requests under 10 MiB are 20 MiB";
  return "";
}

/* A Python UserWarning when the caller holds the GIL (a Python call of the
 * setter), else torch's own warning line. */
void warn(const std::string& line) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    if (PyErr_WarnEx(PyExc_UserWarning, line.c_str(), 1) == 0)
      return;
    PyErr_Clear(); /* warnings are errors here: say it the other way */
  }
  TORCH_WARN(line);
}

void on_settings_string(const std::string& env) {
  for (const std::string& line : ignored_entries(env, "allocator settings"))
    warn(line);
  if (GpumemAllocator* a = instance())
    a->apply_settings(torch_settings());
}

std::string without_backend(const std::string& env, bool* dropped) {
  std::string out;
  *dropped = false;
  for (const auto& kv : entries(env)) {
    if (kv.first == "backend") {
      *dropped = true;
      continue;
    }
    if (!out.empty())
      out += ',';
    out += kv.first + (kv.second.empty() ? "" : ":" + kv.second);
  }
  return out;
}

}  // namespace

std::vector<std::string> ignored_entries(const std::string& text, const std::string& source) {
  std::vector<std::string> lines;
  for (const auto& kv : entries(text)) {
    std::string why = why_ignored(kv.first, kv.second);
    if (!why.empty())
      lines.push_back("gpumem ignores " + kv.first + ":" + kv.second + " in " + source + ": " +
                      why);
  }
  return lines;
}

bool follow_torch_settings() {
#if GM_TORCH_ACCEL_CONFIG
  static std::once_flag once;
  std::call_once(once, []() {
#if GM_TORCH_CONFIG_HOOK_GETTER
    std::function<void(const std::string&)>& hook =
        ac::AcceleratorAllocatorConfig::getConfigParserHook();
    std::function<void(const std::string&)> previous = hook;
#else
    /* The hook cannot be read: torch's is CUDAAllocatorConfig's parseArgs
     * (REGISTER_ALLOCATOR_CONFIG_PARSE_HOOK), which this one calls itself. */
    std::function<void(const std::string&)> previous = [](const std::string& env) {
      CudaConfig::instance().parseArgs(env);
    };
#endif
    std::function<void(const std::string&)> ours = [previous](const std::string& env) {
      bool dropped = false;
      std::string rest = without_backend(env, &dropped);
      if (previous)
        previous(dropped ? rest : env);
      on_settings_string(env);
    };
#if GM_TORCH_CONFIG_HOOK_GETTER
    hook = std::move(ours);
#else
    ac::AcceleratorAllocatorConfig::registerDeviceConfigParserHook(std::move(ours), {});
#endif
  });
  return true;
#else
  return false; /* no hook: gpumem.install() wraps torch's setter (settings_changed) */
#endif
}

void settings_changed(const std::string& text) { on_settings_string(text); }

}  // namespace gpumem
