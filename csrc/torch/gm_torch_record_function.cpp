/*
 * gm_torch_record_function.cpp - the record_function callbacks of memory
 * history: record_function ranges as the snapshot's external_annotations
 * (Note [Annotations]) and torch.compile regions on trace entries (Note
 * [Compile contexts]).
 *
 * Built into a module of its own (gpumem_torch_record_function, with
 * gm_torch_rf_module.cpp), apart from the torch shim: ATen/record_function.h
 * (through ATen/core/ivalue.h) was about 40 % of the shim's compile time,
 * and these callbacks are needed only once memory history is recorded
 * (gpumem/pytorch/shim_build.py builds the module then). It needs nothing
 * of the shim's: the annotations are kept here, and compile contexts go
 * through torch's allocator interface. Includes no gm_torch.h (which pulls
 * in CUDAPluggableAllocator.h).
 * Must not: hold g_ann_mu while calling torch or Python.
 */
#include "gm_torch_record_function.h"

#include <ATen/record_function.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>

namespace gpumem {

/*
 * Note [Annotations]
 * Rationale: while torch records memory history it also keeps the
 *   record_function ranges (torch.profiler.record_function, user scopes) of
 *   the recording thread, or of every thread, as the snapshot's
 *   external_annotations: {name, stage START|END, device, time_us}.
 * Approach: gpumem.recording.history turns the same callbacks on and off with
 *   recording (set_annotations); they append to one list under a mutex,
 *   read by annotations() when a snapshot is taken and cleared when
 *   recording stops.
 * Limitations: the list is unbounded while recording, as torch's is.
 */
namespace {

struct annotation {
  std::string name;
  bool start;
  int device;
  int64_t time_us;
};

std::mutex g_ann_mu;
std::vector<annotation> g_annotations;      /* protected by: g_ann_mu */
at::CallbackHandle g_ann_handle = 0;        /* protected by: the GIL */

void add_annotation(const at::RecordFunction& fn, bool start) {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  annotation a{fn.name(), start, static_cast<int>(c10::cuda::current_device()),
               std::chrono::duration_cast<std::chrono::microseconds>(now).count()};
  std::lock_guard<std::mutex> guard(g_ann_mu);
  g_annotations.push_back(std::move(a));
}

std::unique_ptr<at::ObserverContext> ann_start(const at::RecordFunction& fn) {
  add_annotation(fn, true);
  return nullptr;
}

void ann_end(const at::RecordFunction& fn, at::ObserverContext*) { add_annotation(fn, false); }

}  // namespace

void set_annotations(bool enabled, bool global) {
  if (g_ann_handle) {
    at::removeCallback(g_ann_handle);
    g_ann_handle = 0;
  }
  if (!enabled) {
    std::lock_guard<std::mutex> guard(g_ann_mu);
    g_annotations.clear();
    return;
  }
  at::RecordFunctionCallback cb(&ann_start, &ann_end);
  cb.scopes({at::RecordScope::USER_SCOPE});
  g_ann_handle = global ? at::addGlobalCallback(cb) : at::addThreadLocalCallback(cb);
}

std::vector<std::tuple<std::string, bool, int, int64_t>> annotations() {
  std::lock_guard<std::mutex> guard(g_ann_mu);
  std::vector<std::tuple<std::string, bool, int, int64_t>> out;
  out.reserve(g_annotations.size());
  for (const annotation& a : g_annotations)
    out.emplace_back(a.name, a.start, a.device, a.time_us);
  return out;
}

/*
 * Note [Compile contexts]
 * Rationale: with _record_memory_history(compile_context=True) torch's
 *   trace entries name the torch.compile region that made them
 *   ("Torch-Compiled Region: 0/0", else "N/A"): a record_function callback
 *   calls the allocator's push/popCompileContext around each region, and the
 *   allocator keeps a per-thread stack whose top goes on every entry.
 * Approach: push/popCompileContext (gm_torch_history.cpp, in the shim)
 *   keep the thread's stack of interned names and tell gpumem's history
 *   the innermost (a thread-local read by the trace hook, like
 *   user_metadata). Torch registers its callback only when its own C++
 *   _record_memory_history is called; gpumem.recording.history turns the
 *   same callback on here (set_compile_contexts) when the Python entry
 *   point asks for compile_context. The callback reaches the shim through
 *   torch's own c10::cuda::CUDACachingAllocator::push/popCompileContext,
 *   which call the allocator in force (gpumem's).
 * Limitations: before torch 2.8 the allocator has no compile contexts, and
 *   neither has gpumem's shim built against it. The callback runs on every
 *   record_function of every thread while it is on, as torch's does.
 */
namespace {

#if GM_TORCH_COMPILE_CONTEXT
at::CallbackHandle g_cc_handle = 0;            /* protected by: the GIL */
constexpr char kRegion[] = "Torch-Compiled Region";

bool is_region(const at::RecordFunction& fn) {
  return std::strncmp(fn.name(), kRegion, sizeof kRegion - 1) == 0;
}

std::unique_ptr<at::ObserverContext> cc_start(const at::RecordFunction& fn) {
  if (is_region(fn)) {
    std::string name = fn.name();
    c10::cuda::CUDACachingAllocator::pushCompileContext(name);
  }
  return nullptr;
}

void cc_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (is_region(fn))
    c10::cuda::CUDACachingAllocator::popCompileContext();
}
#endif

}  // namespace

void set_compile_contexts(bool enabled) {
#if GM_TORCH_COMPILE_CONTEXT
  if (g_cc_handle) {
    at::removeCallback(g_cc_handle);
    g_cc_handle = 0;
  }
  if (enabled)
    g_cc_handle = at::addGlobalCallback(at::RecordFunctionCallback(&cc_start, &cc_end));
#else
  (void)enabled;
#endif
}

}  // namespace gpumem
