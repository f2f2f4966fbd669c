/*
 * gm_torch_snapshot.cpp - torch's C++ snapshot() from gpumem's history, and
 * the C++ contexts that give its blocks and trace entries their frames.
 *
 * torch::cuda::_memory_snapshot_pickled (and any C++ caller of the
 * allocator's snapshot()) reads a cca::SnapshotInfo: segments with their
 * blocks, one trace per device and the settings, each block and trace
 * entry with the GatheredContext the allocator kept for it, which must be
 * a torch::CapturedTraceback (torch symbolizes it into frames). snapshot()
 * builds that from the locked copy of gpumem's history (gm_hist_copy), so
 * it shows what gpumem's Python snapshot shows; Note [C++ contexts] says
 * where the contexts come from.
 * Must not: hold a core lock while calling torch or Python (the copy takes
 * and drops the core locks itself; contexts are gathered before any core
 * lock is taken).
 */
#include "gm_torch.h"

#include <c10/cuda/CUDAAllocatorConfig.h>

#include <algorithm>
#include <unordered_map>

namespace gpumem {

/*
 * Note [C++ contexts]
 * Rationale: torch's C++ _record_memory_history hands the allocator a
 *   CreateContextFn (torch's gather: Python, TorchScript and, for
 *   stacks='all', C++ frames of the calling thread, as a CapturedTraceback)
 *   and expects each block and trace entry to carry its result; a
 *   CapturedTraceback can only be made by calling that function on the
 *   thread that allocates. gpumem's history keeps interned traceback ids.
 * Approach: while a C++ caller records with context, capture() gathers
 *   gpumem's id as usual (with C return addresses too, so that two stacks
 *   torch tells apart never share an id) and, the first time an id is
 *   seen, calls torch's function and keeps its context under that id.
 *   snapshot() gives each block, segment and trace entry the context kept
 *   for its id. The table grows with the distinct stacks, not with the
 *   allocations, and costs one hash lookup per allocation while a C++
 *   caller records; nothing otherwise.
 * Limitations: the table is kept for the life of the process (live blocks
 *   may still name its contexts after recording stops), and a context holds
 *   its Python code objects. Allocations recorded through gpumem's own
 *   (Python) entry points have no torch context: torch's C++ snapshot shows
 *   them without frames.
 */
namespace {

std::mutex g_ctx_mu;
cca::CreateContextFn g_ctx_fn = nullptr; /* protected by: g_ctx_mu */
std::unordered_map<uint32_t, std::shared_ptr<c10::GatheredContext>> g_ctx_of; /* g_ctx_mu */
std::atomic<bool> g_ctx_on{false}; /* g_ctx_fn is set and recording asks for context */

std::shared_ptr<c10::GatheredContext> context_of(uint32_t id) {
  if (!id)
    return nullptr;
  std::lock_guard<std::mutex> guard(g_ctx_mu);
  auto it = g_ctx_of.find(id);
  return it == g_ctx_of.end() ? nullptr : it->second;
}

}  // namespace

void set_cpp_context_fn(cca::CreateContextFn fn) {
  std::lock_guard<std::mutex> guard(g_ctx_mu);
  g_ctx_fn = fn;
  g_ctx_on.store(fn != nullptr, std::memory_order_release);
}

bool cpp_contexts_on() { return g_ctx_on.load(std::memory_order_relaxed); }

void keep_cpp_context(uint32_t id) {
  cca::CreateContextFn fn = nullptr;
  {
    std::lock_guard<std::mutex> guard(g_ctx_mu);
    if (g_ctx_of.count(id) || !g_ctx_fn)
      return;
    fn = g_ctx_fn;
  }
  /* torch's gather takes the GIL itself: called with no lock of ours held */
  std::shared_ptr<c10::GatheredContext> ctx = fn();
  std::lock_guard<std::mutex> guard(g_ctx_mu);
  g_ctx_of.emplace(id, std::move(ctx));
}

namespace {

/* A gm_action_t as torch's TraceEntry::Action; false for one this torch
 * has no action for. */
bool torch_action(int action, cca::TraceEntry::Action* out) {
  using A = cca::TraceEntry;
  static const A::Action kMap[] = {A::ALLOC,         A::FREE_REQUESTED, A::FREE_COMPLETED,
                                   A::SEGMENT_ALLOC, A::SEGMENT_FREE,   A::SEGMENT_MAP,
                                   A::SEGMENT_UNMAP, A::SNAPSHOT,       A::OOM};
  if (action >= 0 && action < static_cast<int>(sizeof kMap / sizeof kMap[0])) {
    *out = kMap[action];
    return true;
  }
#if GM_TORCH_ANNOTATE_MEMORY
  if (action == GM_ACT_ANNOTATE) {
    *out = A::ANNOTATE;
    return true;
  }
#endif
  return false;
}

std::string interned_string(uint32_t id) {
  const char* s = "";
  size_t len = 0;
  if (!id || g_hist->string_view(id, &s, &len))
    return "";
  return std::string(s, len);
}

cca::SegmentInfo segment_info(const gm_hist_copy_t& c, const gm_hist_segment_t& seg) {
  cca::SegmentInfo s;
  s.device = static_cast<c10::DeviceIndex>(seg.device);
  s.address = seg.address;
  s.total_size = seg.total_size;
  s.requested_size = seg.requested_size;
  s.allocated_size = seg.allocated_size;
  s.active_size = seg.active_size;
  s.stream = reinterpret_cast<decltype(s.stream)>(seg.stream); /* void* from 2.13 */
  s.is_large = !seg.is_small;
  s.is_expandable = seg.is_expandable != 0;
  s.owner_private_pool_id = {seg.pool_id.first, seg.pool_id.second};
  s.context_when_allocated = context_of(seg.ctx);
  for (size_t i = seg.first_block; i < seg.first_block + seg.nblocks; i++) {
    const gm_hist_block_t& b = c.blocks[i];
    cca::BlockInfo bi;
    bi.size = b.size;
    bi.requested_size = b.requested_size;
    bi.allocated = b.state == GM_BLOCK_ACTIVE_ALLOCATED;
    bi.active = b.state != GM_BLOCK_INACTIVE;
    bi.context_when_allocated = context_of(b.ctx);
    s.blocks.push_back(std::move(bi));
  }
  return s;
}

/* One device's events as torch's trace, oldest first; frames only at the
 * context levels where torch's entries carry them (alloc and above). */
std::vector<cca::TraceEntry> device_trace(const gm_hist_copy_t& c, int d, bool with_context) {
  std::vector<cca::TraceEntry> out;
  out.reserve(c.nev[d]);
  for (size_t i = 0; i < c.nev[d]; i++) {
    const gm_hist_event_t& e = c.ev[d][i];
    cca::TraceEntry::Action action;
    if (!torch_action(e.action, &action))
      continue;
    auto stream = reinterpret_cast<decltype(cca::TraceEntry::stream_)>(e.stream);
    auto ctx = with_context ? context_of(e.tb) : nullptr;
#if GM_TORCH_TRACE_MEMPOOL
    cca::TraceEntry te(action, static_cast<c10::DeviceIndex>(d), e.addr, e.size, stream, {0, 0},
                       0, std::move(ctx), e.compile ? interned_string(e.compile) : "N/A"
#if GM_TORCH_USER_METADATA
                       , interned_string(e.meta)
#endif
    );
#else
    cca::TraceEntry te(action, static_cast<c10::DeviceIndex>(d), e.addr, e.size, stream, 0,
                       std::move(ctx));
#endif
    te.time_.t_ = static_cast<decltype(te.time_.t_)>(e.time_us);
    out.push_back(std::move(te));
  }
  return out;
}

void fill_settings(cca::AllocatorConfigInfo& md) {
  using Cuda = c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig;
  gm_settings_t s = instance()->settings();
  md.garbage_collection_threshold = s.garbage_collection_threshold;
  md.max_split_size = s.max_split_size;
  md.pinned_num_register_threads = Cuda::pinned_num_register_threads();
  md.expandable_segments = s.expandable_segments != 0;
  md.release_lock_on_malloc = Cuda::release_lock_on_cudamalloc();
  md.pinned_use_host_register = Cuda::pinned_use_cuda_host_register();
#if GM_TORCH_RECORD_STREAM_REUSE
  md.graph_capture_record_stream_reuse = Cuda::graph_capture_record_stream_reuse();
#endif
#if GM_TORCH_PINNED_THRESHOLDS
  using Accel = c10::CachingAllocator::AcceleratorAllocatorConfig;
  md.max_round_threshold = Accel::pinned_max_round_threshold();
  md.max_cached_size = Accel::pinned_max_cached_size();
#endif
  md.last_allocator_settings = torch_settings_text();
  for (uint32_t d : s.roundup_power2_divisions)
    md.roundup_power2_divisions.push_back(d);
}

}  // namespace

cca::SnapshotInfo GpumemAllocator::snapshot(c10::cuda::MempoolId_t mempool, bool include_traces) {
  cca::SnapshotInfo info{}; /* every field set: torch pickles them all */
  gm_hist_copy_t c;
  int rc = g_hist->copy(&c);
  TORCH_CHECK(rc == GM_OK, "gpumem: copying memory history failed: ", g_core->strerror(rc));
  bool all = mempool.first == 0 && mempool.second == 0; /* else that pool's, as torch */
  for (size_t i = 0; i < c.nseg; i++)
    if (all || (c.segs[i].pool_id.first == mempool.first &&
                c.segs[i].pool_id.second == mempool.second))
      info.segments.push_back(segment_info(c, c.segs[i]));
  gm_hist_config_t cfg;
  g_hist->get_config(&cfg);
  info.device_traces.resize(static_cast<size_t>(std::max({device_count(), c.ndev, 1})));
  for (int d = 0; include_traces && d < c.ndev; d++)
    info.device_traces[d] = device_trace(c, d, cfg.context >= GM_HIST_CTX_ALLOC);
  g_hist->copy_free(&c);
  fill_settings(info.config_metadata);
  return info;
}

}  // namespace gpumem
