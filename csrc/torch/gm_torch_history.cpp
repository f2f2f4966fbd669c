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
 *     gpumem's recording (Python stacks: which gather function torch picked
 *     cannot be told from its pointer);
 *   - snapshot(): segments and blocks for C++ callers such as
 *     torch::cuda::_memory_snapshot_pickled, without frames or traces (those
 *     need gpumem's snapshot, gpumem.recording.history.snapshot);
 *   - set/getUserMetadata(): the calling thread's user_metadata;
 *   - Note [Annotations]: record_function ranges while recording.
 * Must not: hold a core lock while calling torch or Python.
 */
#include "gm_torch.h"

#include <ATen/record_function.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <chrono>

namespace gpumem {

uint32_t capture(int level) {
  if (g_hist->context_level() < level)
    return 0; /* the common case: not recording at this level */
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

uint32_t capture_alloc(size_t size) {
  /* The sampled mode may leave this allocation's stack out (Note [Sampled
   * recording] in csrc/history/sample.c); asked only while recording. */
  if (g_hist->context_level() < GM_HIST_CTX_STATE || !g_hist->sample(size))
    return 0;
  return capture(GM_HIST_CTX_STATE);
}

/* ------------------------------------------------ the C++ interface */

bool GpumemAllocator::isHistoryEnabled() { return g_core->hist_enabled() != 0; }

void GpumemAllocator::recordHistory(bool enabled, cca::CreateContextFn,
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
  cfg.stacks_all = 0;
  cfg.max_entries = alloc_trace_max_entries ? alloc_trace_max_entries : 1;
  cfg.clear_history = clearHistory ? 1 : 0;
  for (const std::string& a : skip_actions) {
    size_t i = 0;
    while (i < sizeof kActions / sizeof kActions[0] && a != kActions[i])
      i++;
    TORCH_CHECK(i < sizeof kActions / sizeof kActions[0], "Unknown TraceEntry action: ", a);
    cfg.skip_mask |= 1u << i;
  }
  int rc = g_hist->configure(&cfg);
  TORCH_CHECK(rc == GM_OK, "gpumem: configuring memory history failed: ", g_core->strerror(rc));
}

namespace {

struct segment_copy {
  int device;
  std::vector<cca::SegmentInfo>* out;
};

int copy_segment(void* arg, const gm_segment_info_t* seg) {
  auto* st = static_cast<segment_copy*>(arg);
  cca::SegmentInfo s;
  s.device = static_cast<c10::DeviceIndex>(st->device);
  s.address = seg->address;
  s.total_size = seg->total_size;
  s.requested_size = seg->requested_size;
  s.allocated_size = seg->allocated_size;
  s.active_size = seg->active_size;
  s.stream = reinterpret_cast<decltype(s.stream)>(seg->stream); /* void* from 2.13 */
  s.is_large = !seg->is_small;
  s.is_expandable = seg->is_expandable != 0;
  s.owner_private_pool_id = {seg->pool_id.first, seg->pool_id.second};
  for (size_t i = 0; i < seg->nblocks; i++) {
    const gm_block_info_t& b = seg->blocks[i];
    cca::BlockInfo bi;
    bi.size = b.size;
    bi.requested_size = b.requested_size;
    bi.allocated = b.state == GM_BLOCK_ACTIVE_ALLOCATED;
    bi.active = b.state != GM_BLOCK_INACTIVE;
    s.blocks.push_back(std::move(bi));
  }
  st->out->push_back(std::move(s));
  return 0;
}

}  // namespace

cca::SnapshotInfo GpumemAllocator::snapshot(c10::cuda::MempoolId_t mempool, bool) {
  cca::SnapshotInfo info;
  info.device_traces.resize(static_cast<size_t>(std::max(device_count(), 1)));
  for (int d = 0; d < kMaxDevices; d++) {
    if (gm_alloc_t* a = existing_core(d)) {
      segment_copy st{d, &info.segments};
      /* {0, 0}: every segment; another id: only that pool's, as torch */
      g_core->walk_pool(a, gm_mempool_id_t{mempool.first, mempool.second}, copy_segment, &st);
    }
  }
  gm_settings_t s = settings();
  info.config_metadata.garbage_collection_threshold = s.garbage_collection_threshold;
  info.config_metadata.max_split_size = s.max_split_size;
  info.config_metadata.expandable_segments = s.expandable_segments != 0;
  info.config_metadata.last_allocator_settings = torch_settings_text();
  for (uint32_t d : s.roundup_power2_divisions)
    info.config_metadata.roundup_power2_divisions.push_back(d);
  return info;
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

}  // namespace gpumem
