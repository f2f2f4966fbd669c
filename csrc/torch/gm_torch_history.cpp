/*
 * gm_torch_history.cpp - memory history as torch's entry points see it:
 * stacks with TorchScript frames, the C++ history interface of the
 * allocator (recordHistory, snapshot, user metadata), and the
 * record_function annotations torch keeps beside the trace.
 *
 * gpumem records history itself (csrc/history); gpumem.recording.history routes
 * torch's Python functions to it. This file serves what reaches the
 * allocator from C++ instead:
 *   - capture_alloc(): an allocation's stack, unless the sampled mode
 *     leaves it out;
 *   - capture(): the thread's TorchScript frames, if it is inside the
 *     TorchScript interpreter, go before its Python frames (torch records
 *     them at stacks='python' too);
 *   - recordHistory(): torch's C++ _record_memory_history configures
 *     gpumem's recording and hands over torch's context function (Note
 *     [C++ contexts] in gm_torch_snapshot.cpp, where snapshot() is);
 *   - set/getUserMetadata(): the calling thread's user_metadata;
 *   - Note [Annotations]: record_function ranges while recording.
 * Must not: hold a core lock while calling torch or Python.
 */
#include "gm_torch.h"

#include <ATen/record_function.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/jit/frontend/source_range.h>

#include <chrono>
#include <cstring>

/* The TorchScript interpreter's call stack of this thread (outermost first),
 * exported by libtorch_cpu in every supported release. Declared as in
 * torch/csrc/jit/runtime/interpreter.h instead of including it: StackEntry
 * is defined in source_range.h, and interpreter.h's other headers were a
 * tenth of the shim's build time. */
namespace torch::jit {
TORCH_API std::vector<StackEntry> currentCallstack();
}  // namespace torch::jit

namespace gpumem {

namespace {

uint32_t capture_ids(int level) {
  std::vector<torch::jit::StackEntry> script = torch::jit::currentCallstack();
  if (script.empty())
    return g_hist->capture(level);
  /* currentCallstack() is outermost first; frames go innermost first. Its
   * `filename` is the function's name; the file and line come from the
   * source range. */
  std::vector<std::string> files(script.size());
  std::vector<gm_script_frame_t> frames(script.size());
  for (size_t i = 0; i < script.size(); i++) {
    const torch::jit::StackEntry& e = script[script.size() - 1 - i];
    int32_t line = 0;
    if (auto flc = e.range.file_line_col()) {
      files[i] = std::get<0>(*flc);
      line = static_cast<int32_t>(std::get<1>(*flc));
    }
    frames[i] = {e.filename.c_str(), files[i].c_str(), line};
  }
  return g_hist->capture_script(level, frames.data(), static_cast<uint32_t>(frames.size()));
}

}  // namespace

uint32_t capture(int level) {
  if (g_hist->context_level() < level)
    return 0; /* the common case: not recording at this level */
  uint32_t id = capture_ids(level);
  if (C10_UNLIKELY(cpp_contexts_on()) && id)
    keep_cpp_context(id); /* Note [C++ contexts] in gm_torch_snapshot.cpp */
  return id;
}

uint32_t capture_alloc(size_t size) {
  /* The sampled mode may leave this allocation's stack out (Note [Sampled
   * recording] in csrc/history/sample.c); asked only while recording. */
  if (g_hist->context_level() < GM_HIST_CTX_STATE || !g_hist->sample(size))
    return 0;
  return capture(GM_HIST_CTX_STATE);
}

/* ------------------------------------------------ the C++ interface */

bool GpumemAllocator::isHistoryEnabled() { return g_core->hist_enabled() != 0; }

void GpumemAllocator::recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                                    size_t alloc_trace_max_entries, cca::RecordContext when,
                                    bool clearHistory,
                                    const std::vector<std::string>& skip_actions) {
  static const char* const kActions[] = {"alloc",         "free_requested", "free_completed",
                                         "segment_alloc", "segment_free",   "segment_map",
                                         "segment_unmap", "snapshot",       "oom",
                                         "annotate"};
  gm_hist_config_t cfg{};
  cfg.enabled = enabled ? GM_HIST_ALL : GM_HIST_OFF;
  cfg.context = static_cast<int>(when); /* NEVER, STATE, ALLOC, ALL: the same levels */
  /* torch's contexts are kept per gpumem stack, which then includes the C
   * return addresses (Note [C++ contexts] in gm_torch_snapshot.cpp) */
  bool contexts = enabled && context_recorder && when != cca::RecordContext::NEVER;
  cfg.stacks_all = contexts ? 1 : 0;
  cfg.max_entries = alloc_trace_max_entries ? alloc_trace_max_entries : 1;
  cfg.clear_history = clearHistory ? 1 : 0;
  for (const std::string& a : skip_actions) {
    size_t i = 0;
    while (i < sizeof kActions / sizeof kActions[0] && a != kActions[i])
      i++;
    TORCH_CHECK(i < sizeof kActions / sizeof kActions[0], "Unknown TraceEntry action: ", a);
    cfg.skip_mask |= 1u << i;
  }
  set_cpp_context_fn(nullptr); /* no stale contexts while reconfiguring */
  int rc = g_hist->configure(&cfg);
  TORCH_CHECK(rc == GM_OK, "gpumem: configuring memory history failed: ", g_core->strerror(rc));
  if (contexts)
    set_cpp_context_fn(context_recorder);
}

#if GM_TORCH_USER_METADATA
void GpumemAllocator::setUserMetadata(const std::string& metadata) {
  g_hist->set_thread_metadata(g_hist->intern_string(metadata.data(), metadata.size()));
}

std::string GpumemAllocator::getUserMetadata() {
  const char* s = "";
  size_t len = 0;
  if (g_hist->string_view(g_hist->thread_metadata(), &s, &len))
    return "";
  return std::string(s, len);
}
#endif

#if GM_TORCH_ANNOTATE_MEMORY
void GpumemAllocator::annotateMemory(const void* ptr, const std::string& metadata) {
  /* The event carries the annotation as its user_metadata: the thread's
   * metadata is swapped for it around the event (it is thread-local). */
  uint32_t previous = g_hist->thread_metadata();
  g_hist->set_thread_metadata(g_hist->intern_string(metadata.data(), metadata.size()));
  uint32_t ctx = capture(GM_HIST_CTX_ALLOC);
  for (int d = 0; d < kMaxDevices; d++) {
    gm_alloc_t* a = existing_core(d);
    if (a && g_core->annotate(a, reinterpret_cast<uintptr_t>(ptr), ctx) == GM_OK)
      break;
  }
  g_hist->set_thread_metadata(previous);
}
#endif

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
 * Approach: push/popCompileContext keep the thread's stack of interned
 *   names and tell gpumem's history the innermost (a thread-local read by
 *   the trace hook, like user_metadata). Torch registers its callback only
 *   when its own C++ _record_memory_history is called; gpumem.recording.history
 *   turns the same callback on here (set_compile_contexts) when the Python
 *   entry point asks for compile_context.
 * Limitations: before torch 2.8 the allocator has no compile contexts, and
 *   neither has gpumem's shim built against it. The callback runs on every
 *   record_function of every thread while it is on, as torch's does.
 */
namespace {

#if GM_TORCH_COMPILE_CONTEXT
thread_local std::vector<uint32_t> t_compile; /* innermost last */
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

#if GM_TORCH_COMPILE_CONTEXT
void GpumemAllocator::pushCompileContext(std::string& md) {
  t_compile.push_back(g_hist->intern_string(md.data(), md.size()));
  g_hist->set_thread_compile_context(t_compile.back());
}

void GpumemAllocator::popCompileContext() {
  if (!t_compile.empty())
    t_compile.pop_back();
  g_hist->set_thread_compile_context(t_compile.empty() ? 0 : t_compile.back());
}
#endif

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
