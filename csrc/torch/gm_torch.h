/*
 * gm_torch.h - gpumem's allocator as torch's CUDA allocator.
 *
 * GpumemAllocator derives from torch's C++ CUDAPluggableAllocator (so torch
 * accepts it through change_current_allocator) and overrides what the
 * pluggable allocator leaves out or gets wrong:
 *   - allocate(): an exhausted device throws c10::OutOfMemoryError (Python
 *     sees torch.OutOfMemoryError) instead of handing torch a NULL pointer;
 *   - recordStream, emptyCache, set/getMemoryFraction, enable/isEnabled,
 *     init, cacheInfo, getBaseAllocation go to the core;
 *   - getDeviceStats/resetPeakStats/resetAccumulatedStats report the core's
 *     stats, so torch.cuda.memory_stats() works even without patching, and
 *     init() registers the allocator as c10's CUDA device allocator, so the
 *     device-generic torch.accelerator memory API reaches it too;
 *   - settings are torch's own (gm_torch_config.cpp), followed at run time;
 *   - the profiler is told of every allocation and free, as torch's
 *     allocator tells it, while it records memory;
 *   - OOM observers (torch._C._cuda_attach_out_of_memory_observer) fire,
 *     after gpumem's own OOM hook (Note [OOM hook] in gm_torch_module.cpp),
 *     which may write a snapshot and add a line naming it to the message.
 * The pointer -> (size, device, stream) map of the pluggable base class is
 * not used: each DataPtr carries the deleter raw_deleter() returns (Note
 * [One deleter] in gm_torch_alloc.cpp), and the core finds the block by its
 * own pointer map.
 *
 * The core is reached only through gpumem._C's capsules (core_api.h,
 * hist.h); this file set links against torch and nothing of gpumem's.
 * Must not: hold a core lock while calling torch or Python; throw from a
 * deleter; destroy a core (tensors may be freed during interpreter exit).
 */
#pragma once

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "gm_torch_compat.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <unordered_set>
#include <string>
#include <tuple>
#include <vector>

typedef struct _object PyObject;  // Python.h's declaration, without including Python.h

#include "../history/hist.h"
#include "../python/core_api.h"

namespace gpumem {

namespace cca = c10::cuda::CUDACachingAllocator;

constexpr int kMaxDevices = GM_HIST_MAX_DEVICES;

/* The capsule tables, set once when the module is imported. */
extern const gm_core_api_t *g_core;
extern const gm_hist_api_t *g_hist;

class GpumemAllocator final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  explicit GpumemAllocator(const gm_settings_t& settings);
  /* Never destroys the cores: see the file comment. */
  ~GpumemAllocator() override = default;

  /* The core of `device`, created on first use; throws c10::Error. */
  gm_alloc_t* core(c10::DeviceIndex device);
  /* The core of `device` if it exists, else nullptr. Never throws. */
  gm_alloc_t* existing_core(int device) const;
  /* How many cores exist (they are never destroyed). */
  int core_count() const { return n_cores_.load(std::memory_order_acquire); }
  void* malloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream);
  /* The settings in force, and new ones for every core now and later
   * (torch's allocator settings changed at run time). */
  gm_settings_t settings() const;
  void apply_settings(const gm_settings_t& settings);

  /* ---- c10::Allocator / CUDAAllocator ---- */
  c10::DataPtr allocate(size_t size) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  bool initialized() override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
#if GM_TORCH_MEMPOOL_API
  void emptyCache(c10::cuda::MempoolId_t mempool_id = {0, 0}) override;
#else
  void emptyCache() override { emptyCache(c10::cuda::MempoolId_t{0, 0}); }
  void emptyCache(c10::cuda::MempoolId_t mempool_id);
#endif
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  /* snapshot's and recordHistory's arguments grew over the releases; the
   * versions with fewer arguments call the full ones. */
#if GM_TORCH_HISTORY_SKIP_ACTIONS
  cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t mempool, bool include_traces) override;
#elif GM_TORCH_MEMPOOL_API
  cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t mempool) override { return snapshot(mempool, true); }
#else
  cca::SnapshotInfo snapshot() override { return snapshot({0, 0}, true); }
#endif
#if !GM_TORCH_HISTORY_SKIP_ACTIONS
  cca::SnapshotInfo snapshot(c10::cuda::MempoolId_t mempool, bool include_traces);
#endif
  bool isHistoryEnabled() override;
#if GM_TORCH_HISTORY_SKIP_ACTIONS
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override;
#else
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions);
#if GM_TORCH_HISTORY_CLEAR
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when,
                     bool clearHistory) override {
    recordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory, {});
  }
#else
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cca::RecordContext when) override {
    recordHistory(enabled, context_recorder, alloc_trace_max_entries, when, false, {});
  }
#endif
#endif
#if GM_TORCH_COMPILE_CONTEXT
  void pushCompileContext(std::string& md) override;
  void popCompileContext() override;
#endif
#if GM_TORCH_ANNOTATE_MEMORY
  bool supportsUserMetadata() override { return true; }
  void annotateMemory(const void* ptr, const std::string& metadata) override;
#endif
#if GM_TORCH_USER_METADATA
  void setUserMetadata(const std::string& metadata) override;
  std::string getUserMetadata() override;
#endif
  void beginAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override;
#if GM_TORCH_POOL_SHARED_ALLOCATOR
  void createOrIncrefPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
                   bool use_on_oom) override;
#elif GM_TORCH_MEMPOOL_API
  void createOrIncrefPool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
                          cca::CUDAAllocator* allocator) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override;
#else
  void ensureExistsAndIncrefPool(c10::DeviceIndex device,
                                 c10::cuda::MempoolId_t mempool_id) override;
#endif
#if GM_TORCH_POOL_NO_SPLIT
  void setNoSplit(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) override;
#endif
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::cuda::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override;
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
#if GM_TORCH_OOM_REJECTION
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override;
#endif
  std::string name() override;

  /* How many devices torch announced through init() (0 before). */
  int device_count() const { return device_count_.load(); }
  /* The OOM observers torch attached (copied; gm_torch_oom.cpp calls them). */
  std::vector<cca::OutOfMemoryObserver> oom_observers();
  /* Whether setMemoryFraction was called for device (any fraction; before
   * 2.10 the OOM message then names the limit, gm_torch_oom.cpp). */
  bool fraction_was_set(int device) const { return fraction_set_[device].load(); }

 private:
  mutable std::mutex settings_mu_;
  gm_settings_t settings_; /* protected by: settings_mu_ */
  /* One core per device: null until first use, then set once (under
   * create_mu_) and never changed; read lock-free (acquire). */
  std::atomic<gm_alloc_t*> cores_[kMaxDevices];
  std::mutex create_mu_; /* serialises core creation */
  std::atomic<int> n_cores_{0}; /* cores created so far (only grows) */
  std::atomic<int> device_count_{0};     /* set by init() */
  std::atomic<bool> initialized_{false}; /* set by init() */
  /* caching_allocator_enable; PYTORCH_NO_CUDA_MEMORY_CACHING keeps it off */
  std::atomic<bool> caching_{true};
  std::atomic<bool> enable_asked_{true}; /* the last enable(value) (gm_torch_compat.h) */
  std::atomic<bool> fraction_set_[kMaxDevices]; /* setMemoryFraction seen */
  std::mutex observers_mu_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_; /* protected by: observers_mu_ */

  /* ---- private pools (gm_torch_pools.cpp, Note [Routing to private pools]) ---- */
  struct pool_route {
    c10::cuda::MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
  };
  std::mutex routes_mu_;
  std::vector<pool_route> routes_[kMaxDevices]; /* protected by: routes_mu_; begin order */
  /* Routes on every device; read without the mutex on the malloc fast path. */
  std::atomic<int> n_routes_{0};
  /* The pool of the latest begun route whose filter accepts an allocation
   * on `stream` (torch's LIFO search); false when none does. */
  bool route(c10::DeviceIndex device, cudaStream_t stream, c10::cuda::MempoolId_t* id);
 public:
  /* 1 while some pool is being allocated to (the fast path's one test). */
  bool routing() const { return n_routes_.load(std::memory_order_relaxed) != 0; }
};

/* ---- torch's allocator settings (gm_torch_config.cpp) ---- */
/* torch's parsed allocator settings as gpumem's core settings. Reading them
 * makes torch parse PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF if it has
 * not yet (a bad string throws torch's c10::ValueError). */
gm_settings_t torch_settings();
/* torch's per_process_memory_fraction setting (1.0 when not set). */
double torch_memory_fraction();
/* PYTORCH_NO_CUDA_MEMORY_CACHING is set. */
bool caching_forced_off();
/* One line per entry of a settings string whose key gpumem does not honour
 * (`source` names where the string came from). */
std::vector<std::string> ignored_entries(const std::string& text, const std::string& source);
/* The settings string torch parsed last, and a new one for torch to parse
 * (c10's setAllocatorSettings of the release). */
std::string torch_settings_text();
void set_torch_settings_text(const std::string& text);
/* Route torch's later settings changes (_set_allocator_settings, the
 * accelerator setter) to the allocator too; once. False where torch has no
 * hook for it (before 2.10, GM_TORCH_ACCEL_CONFIG): then the caller of torch's setter calls
 * settings_changed() after it. */
bool follow_torch_settings();
void settings_changed(const std::string& text);

/* ---- out of memory (gm_torch_oom.cpp, gm_torch_nvml.cpp) ---- */
/* The sentences NVML gives for the processes on `device` (Note [Process
 * lines from NVML]), "" without NVML. No core lock held; never throws. */
std::string process_memory_report(int device);
/* torch's out-of-memory text for what the core reported. */
std::string oom_message(int device, const gm_oom_info_t& oom);
/* The hook, the observers, then c10::OutOfMemoryError. No core lock held. */
[[noreturn]] void throw_oom(GpumemAllocator& alloc, int device, const gm_oom_info_t& oom,
                            cudaStream_t stream);

/* Run the Python OOM hook, if one is set (gm_torch_oom_hook.cpp, Note [OOM
 * hook]): returns the line it asks to append to the OOM message, or "" when
 * there is no hook, it returned None or failed, the interpreter is exiting,
 * or this thread is already inside the hook. Takes the GIL; call with no
 * core lock held. Never throws. */
std::string run_oom_hook(int device, const gm_oom_info_t& oom, uintptr_t stream,
                         const char* message) noexcept;
/* The shim module's set_oom_hook(hook): set, or with None clear, the hook
 * (a callable; TypeError otherwise). Call with the GIL held. */
PyObject* set_oom_hook(PyObject* self, PyObject* hook);  // PyObject: Python.h's, declared above

/* The thread's TorchScript frames, if it is running TorchScript, and the
 * traceback id for a capture at `level` (gm_torch_history.cpp). */
uint32_t capture(int level);
/* The same for an allocation of `size` bytes (level STATE), 0 when the
 * sampled mode leaves it out (gm_torch_history.cpp). */
uint32_t capture_alloc(size_t size);

/* Note [C++ contexts] (gm_torch_snapshot.cpp): torch's context function
 * while a C++ caller records with context (nullptr: none); whether one is
 * set (lock-free); keep torch's context for a new traceback id (call with
 * no lock held: it may take the GIL). */
void set_cpp_context_fn(cca::CreateContextFn fn);
bool cpp_contexts_on();
void keep_cpp_context(uint32_t id);

/* The process's allocator once created (never freed), else nullptr. */
GpumemAllocator* instance();
std::shared_ptr<GpumemAllocator> create_instance(const gm_settings_t& settings);

}  // namespace gpumem
