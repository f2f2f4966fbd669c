/*
 * gm_torch_history.cpp - memory history as torch's entry points see it:
 * stacks with TorchScript frames, the C++ history interface of the
 * allocator (recordHistory, snapshot, user metadata, compile contexts).
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
 *   - push/popCompileContext(): the thread's torch.compile region.
 * The record_function callbacks (Note [Annotations], Note [Compile
 * contexts]) are in a module of their own, gm_torch_record_function.cpp.
 * Must not: hold a core lock while calling torch or Python.
 */
#include "gm_torch.h"

#include <torch/csrc/jit/frontend/source_range.h>


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

/* push/popCompileContext: Note [Compile contexts] in gm_torch_record_function.cpp,
 * where the callback that calls them is (the record_function module). */
#if GM_TORCH_COMPILE_CONTEXT
namespace {
thread_local std::vector<uint32_t> t_compile; /* innermost last */
}  // namespace

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

}  // namespace gpumem
