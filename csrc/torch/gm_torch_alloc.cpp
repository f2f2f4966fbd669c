/*
 * gm_torch_alloc.cpp - GpumemAllocator: torch's CUDA allocator interface
 * served by gpumem's core (see gm_torch.h for what is overridden and why).
 *
 * Hot path: allocate() = current device + current stream + one core malloc
 * (history capture first, outside the core lock); every DataPtr carries
 * the one deleter raw_deleter() returns (Note [One deleter]), so a free is
 * one core free with no lookup table of our own. Cores are created per
 * device on first use (torch creates its
 * per-device allocators lazily too, and a core retains the device's primary
 * context), attached to memory history once, and never destroyed. A new
 * core gets the settings in force, torch's per_process_memory_fraction and
 * the caching switch. While the profiler records memory, every allocation
 * and free is reported to it with the device's allocated and reserved
 * totals, as torch's allocator reports them.
 *
 * Note [One deleter]
 * Rationale: torch tells its allocator's memory from other memory by the
 *   DataPtr's deleter: _has_Standard_Deleter and _free_And_Remove_DeleterFn
 *   (the CUDA graph trees of torch.compile's reduce-overhead mode) and
 *   torch.cuda.caching_allocator_delete compare it with raw_deleter(), and
 *   refuse ("Expected standard deleter") any other. A deleter per device,
 *   which needed no lookup to find the core, failed that comparison.
 * Approach: allocate() and raw_deleter() use the same function, delete_any.
 *   With one core (one GPU in use, the common case) it frees at once, as
 *   fast as the per-device deleter did (docs/benchmarks.md). With several,
 *   it asks each core's pointer map (one lookup under that core's lock)
 *   before freeing, so no core searches its free blocks for a pointer it
 *   never had. recordStream takes the device from the DataPtr itself.
 * Limitations: with several devices in use, a free costs up to one lookup
 *   per other core created earlier.
 *
 * Note [Out of memory through the pluggable allocator]
 * Rationale: torch's CUDAPluggableAllocator does not check a NULL from the
 *   custom alloc function, so the usual way of plugging in an allocator turns
 *   an OOM into a tensor with a NULL data pointer and a crash later.
 * Approach: allocate() is overridden; on GM_EOOM the core has already freed
 *   its cache and retried, so we format torch's message (core_api
 *   format_oom), call the OOM observers with torch's arguments, and throw
 *   c10::OutOfMemoryError, which torch's Python bindings turn into
 *   torch.OutOfMemoryError (gm_torch_oom.cpp). Before the observers,
 *   gpumem's OOM hook runs (Note [OOM hook] in gm_torch_module.cpp). No
 *   core lock is held while the hook, the observers or the throw run. A
 *   request of an exabyte or more is refused before the core sees it, with
 *   torch's message and without counting an OOM, as torch does.
 * Limitations: the OOM rejection observers are accepted but never called
 *   (gpumem never rejects an allocation before trying it).
 */
#include "gm_torch.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <utility>

namespace gpumem {

const gm_core_api_t* g_core = nullptr;
const gm_hist_api_t* g_hist = nullptr;

namespace {

/* Set once by create_instance; the holder is leaked so that tensors freed
 * during interpreter exit still find their allocator. */
std::atomic<GpumemAllocator*> g_instance{nullptr};
std::shared_ptr<GpumemAllocator>* g_holder = nullptr; /* protected by: g_create_mu */
std::mutex g_create_mu;

std::string core_error(gm_alloc_t* a, int rc) {
  std::string s = g_core->strerror(rc);
  const char* why = a ? g_core->last_error(a) : "";
  if (why && *why && (rc == GM_EDEVICE || rc == GM_ENOTSUP || rc == GM_ESTATE)) {
    s += ": ";
    s += why;
  }
  return s;
}

/* Tell the profiler (when it records memory) that `bytes` came (> 0) or
 * went (< 0) at p, with the device's totals after the change. */
void report_to_profiler(gm_alloc_t* a, int device, void* p, int64_t bytes) {
  gm_stats_t st;
  g_core->get_stats(a, &st);
  c10::reportMemoryUsageToProfiler(p, bytes,
                                   static_cast<size_t>(st.allocated_bytes[GM_STAT_ALL].current),
                                   static_cast<size_t>(st.reserved_bytes[GM_STAT_ALL].current),
                                   c10::Device(c10::DeviceType::CUDA,
                                               static_cast<c10::DeviceIndex>(device)));
}

/* A core free, reported to the profiler when it records memory. */
int core_free(gm_alloc_t* a, int device, void* p) {
  /* Free sites are captured only at context level ALL (capture returns 0
   * at once otherwise); taken before the core lock. */
  uint32_t ctx = capture(GM_HIST_CTX_ALL);
  if (C10_LIKELY(!c10::memoryProfilingEnabled()))
    return g_core->free(a, reinterpret_cast<uintptr_t>(p), ctx);
  size_t size = 0;
  if (g_core->block_size(a, reinterpret_cast<uintptr_t>(p), &size, nullptr, nullptr) != GM_OK)
    return g_core->free(a, reinterpret_cast<uintptr_t>(p), ctx);
  int rc = g_core->free(a, reinterpret_cast<uintptr_t>(p), ctx);
  if (rc == GM_OK)
    report_to_profiler(a, device, p, -static_cast<int64_t>(size));
  return rc;
}

void free_on(int device, void* p) noexcept {
  if (!p)
    return;
  GpumemAllocator* alloc = g_instance.load(std::memory_order_acquire);
  gm_alloc_t* a = alloc ? alloc->existing_core(device) : nullptr;
  int rc = GM_ENOTFOUND;
  if (a) {
    try {
      rc = core_free(a, device, p);
    } catch (...) { /* the profiler threw: the free itself is done or reported below */
    }
  }
  if (rc != GM_OK) {
    try {
      TORCH_WARN("gpumem: could not free ", p, " on device ", device, ": ", core_error(a, rc));
    } catch (...) {
      /* a deleter must not throw, even with warnings turned into errors */
    }
  }
}

/* The one deleter of every DataPtr gpumem hands out, and raw_deleter()
 * (Note [One deleter]): with one core, one free; with several, the core
 * whose pointer map holds p frees it. */
void delete_any(void* p) {
  if (!p)
    return;
  GpumemAllocator* alloc = g_instance.load(std::memory_order_acquire);
  int n = alloc ? alloc->core_count() : 0;
  for (int d = 0; d < kMaxDevices && n > 0; d++) {
    gm_alloc_t* a = alloc->existing_core(d);
    if (!a)
      continue;
    /* With several cores, ask before freeing: a core's free of a pointer
     * it does not own searches its free blocks to say why. */
    if (--n > 0 && g_core->block_size(a, reinterpret_cast<uintptr_t>(p), nullptr, nullptr,
                                       nullptr) != GM_OK)
      continue;
    free_on(d, p);
    return;
  }
  try {
    TORCH_WARN("gpumem: could not free ", p, ": no gpumem allocator owns this pointer");
  } catch (...) {
  }
}

void check_device(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "gpumem: device ", static_cast<int>(device),
              " is out of range; gpumem supports devices 0 to ", kMaxDevices - 1);
}

}  // namespace

GpumemAllocator::GpumemAllocator(const gm_settings_t& settings)
    : torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator(
          /* Only reached if torch calls the base class's malloc path; every
           * entry point that would is overridden below. */
          [](size_t size, int device, cudaStream_t stream) -> void* {
            return g_instance.load()->malloc_on(size, static_cast<c10::DeviceIndex>(device),
                                                stream);
          },
          [](void* ptr, size_t, int device, cudaStream_t) { free_on(device, ptr); }),
      settings_(settings) {
  for (auto& c : cores_)
    c.store(nullptr, std::memory_order_relaxed);
  for (auto& f : fraction_set_)
    f.store(false, std::memory_order_relaxed);
  if (caching_forced_off())
    caching_.store(false);
}

gm_settings_t GpumemAllocator::settings() const {
  std::lock_guard<std::mutex> guard(settings_mu_);
  return settings_;
}

void GpumemAllocator::apply_settings(const gm_settings_t& s) {
  std::lock_guard<std::mutex> guard(settings_mu_); /* no core is created meanwhile */
  settings_ = s;
  for (int d = 0; d < kMaxDevices; d++) {
    if (gm_alloc_t* a = existing_core(d)) {
      int rc = g_core->set_settings(a, &s);
      TORCH_CHECK(rc == GM_OK, "gpumem: the allocator settings were refused: ",
                  g_core->strerror(rc));
    }
  }
}

gm_alloc_t* GpumemAllocator::existing_core(int device) const {
  if (device < 0 || device >= kMaxDevices)
    return nullptr;
  return cores_[device].load(std::memory_order_acquire);
}

gm_alloc_t* GpumemAllocator::core(c10::DeviceIndex device) {
  check_device(device);
  gm_alloc_t* a = cores_[device].load(std::memory_order_acquire);
  if (C10_LIKELY(a != nullptr))
    return a;
  std::lock_guard<std::mutex> guard(create_mu_);
  a = cores_[device].load(std::memory_order_relaxed);
  if (a)
    return a;
  char err[768] = "";
  std::lock_guard<std::mutex> settings_guard(settings_mu_);
  int rc = g_core->cuda_create(device, &settings_, &a, err, sizeof err);
  TORCH_CHECK(rc == GM_OK, "gpumem: ", err);
  g_hist->attach(a, nullptr, nullptr); /* once per core: it is never replaced */
  g_core->set_caching(a, caching_.load() ? 1 : 0);
  double fraction = torch_memory_fraction(); /* torch applies it to each new device too */
  if (fraction < 1.0)
    g_core->set_memory_fraction(a, fraction);
  if (settings_.expandable_segments && !g_core->expandable_active(a)) {
    TORCH_WARN_ONCE("gpumem: device ", static_cast<int>(device),
                    " does not support virtual memory management; expandable_segments falls "
                    "back to plain segments");
  }
  cores_[device].store(a, std::memory_order_release);
  n_cores_.fetch_add(1, std::memory_order_release);
  return a;
}

void* GpumemAllocator::malloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
  constexpr size_t kOneExaByte = size_t(1) << 60;
  TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExaByte,
                   "CUDA out of memory. Tried to allocate more than 1EB memory.");
  gm_alloc_t* a = core(device);
  /* Captured before the core takes its lock (torch: context level STATE),
   * unless the sampled mode leaves it out. */
  uint32_t ctx = capture_alloc(size);
  uintptr_t p = 0;
  gm_oom_info_t oom;
  c10::cuda::MempoolId_t pool{0, 0};
  /* Note [Routing to private pools]: one relaxed load when no pool is in use */
  int rc = C10_UNLIKELY(routing()) && route(device, stream, &pool)
               ? g_core->malloc_pool(a, size, reinterpret_cast<uintptr_t>(stream), ctx,
                                     gm_mempool_id_t{pool.first, pool.second}, &p, &oom)
               : g_core->malloc(a, size, reinterpret_cast<uintptr_t>(stream), ctx, &p, &oom);
  if (C10_LIKELY(rc == GM_OK)) {
    if (C10_UNLIKELY(c10::memoryProfilingEnabled()) && p) {
      size_t block = 0;
      if (g_core->block_size(a, p, &block, nullptr, nullptr) == GM_OK)
        report_to_profiler(a, device, reinterpret_cast<void*>(p), static_cast<int64_t>(block));
    }
    return reinterpret_cast<void*>(p);
  }
  if (rc == GM_EOOM)
    throw_oom(*this, device, oom, stream);
  TORCH_CHECK(false, "gpumem: allocating ", size, " bytes on device ", static_cast<int>(device),
              " failed: ", core_error(a, rc));
}

c10::DataPtr GpumemAllocator::allocate(size_t size) {
  c10::DeviceIndex device = c10::cuda::current_device();
  check_device(device);
  void* p = nullptr;
  if (size != 0)
    p = malloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
  return {p, p, &delete_any, c10::Device(c10::DeviceType::CUDA, device)};
}

c10::DeleterFnPtr GpumemAllocator::raw_deleter() const { return &delete_any; }

void* GpumemAllocator::raw_alloc(size_t nbytes) {
  if (nbytes == 0)
    return nullptr;
  c10::DeviceIndex device = c10::cuda::current_device();
  return malloc_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* GpumemAllocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0)
    return nullptr;
  return malloc_on(nbytes, c10::cuda::current_device(), stream);
}

void GpumemAllocator::raw_delete(void* ptr) { delete_any(ptr); }

void GpumemAllocator::init(int device_count) {
  device_count_.store(device_count);
  initialized_.store(true);
  /* c10's CUDA device allocator is what torch.accelerator's memory API and
   * other device-generic code ask; torch registers its own at load time
   * (priority 0) and change_current_allocator does not replace it. */
  c10::SetAllocator(c10::DeviceType::CUDA, this, 1);
}

bool GpumemAllocator::initialized() { return initialized_.load(); }

double GpumemAllocator::getMemoryFraction(c10::DeviceIndex device) {
  gm_alloc_t* a = core(device);
  size_t limit = 0;
  if (!g_core->get_memory_limit(a, &limit))
    return 1.0;
  size_t free_b = 0, total = 0;
  char err[512] = "";
  int rc = g_core->mem_get_info(device, &free_b, &total, err, sizeof err);
  TORCH_CHECK(rc == GM_OK, "gpumem: ", err);
  return total ? static_cast<double>(limit) / static_cast<double>(total) : 1.0;
}

void GpumemAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "gpumem: invalid fraction ", fraction,
              "; it must be between 0 and 1");
  gm_alloc_t* a = core(device);
  int rc = g_core->set_memory_fraction(a, fraction);
  TORCH_CHECK(rc == GM_OK, "gpumem: set_per_process_memory_fraction failed: ",
              core_error(a, rc));
  fraction_set_[device].store(true);
}

void GpumemAllocator::enable(bool value) {
  bool on = value && !caching_forced_off(); /* the variable keeps caching off for good */
  std::lock_guard<std::mutex> guard(create_mu_); /* a core made meanwhile sees `on` */
  enable_asked_.store(value);
  caching_.store(on);
  for (int d = 0; d < kMaxDevices; d++)
    if (gm_alloc_t* a = existing_core(d))
      g_core->set_caching(a, on ? 1 : 0);
}

bool GpumemAllocator::isEnabled() const {
#if GM_TORCH_ENABLED_READS_ENV
  return caching_.load();
#else
  return enable_asked_.load();
#endif
}

void GpumemAllocator::emptyCache(c10::cuda::MempoolId_t mempool_id) {
  /* torch synchronises (and counts a sync for) every device's allocator,
   * including one that has allocated nothing yet: the current device gets
   * its core now, so its first empty_cache is counted as torch counts it.
   * Other devices without a core are left alone (creating one would take
   * their CUDA context). */
  if (initialized())
    core(c10::cuda::current_device());
  uint32_t ctx = capture(GM_HIST_CTX_ALL);
  for (int d = 0; d < kMaxDevices; d++) {
    gm_alloc_t* a = existing_core(d);
    if (!a)
      continue;
    /* {0, 0}: the default pools and every freeable private pool; another
     * id: that pool's cached memory if it is freeable (torch's
     * release_cached_blocks) */
    int rc = g_core->empty_cache_pool(a, gm_mempool_id_t{mempool_id.first, mempool_id.second}, ctx);
    TORCH_CHECK(rc == GM_OK, "gpumem: empty_cache on device ", d, " failed: ", core_error(a, rc));
  }
}

void GpumemAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  void* p = ptr.get();
  if (!p)
    return;
  if (ptr.get_deleter() != &delete_any)
    return; /* not our memory (from_blob, another allocator): nothing to track */
  int device = ptr.device().index();
  gm_alloc_t* a = existing_core(device);
  if (!a)
    return;
  int rc = g_core->record_stream(a, reinterpret_cast<uintptr_t>(p),
                                 reinterpret_cast<uintptr_t>(stream.stream()));
  TORCH_CHECK(rc == GM_OK, "gpumem: record_stream(", p, ") failed: ", core_error(a, rc));
}

void GpumemAllocator::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> guard(observers_mu_);
  oom_observers_.emplace_back(std::move(observer));
}

std::vector<cca::OutOfMemoryObserver> GpumemAllocator::oom_observers() {
  std::lock_guard<std::mutex> guard(observers_mu_);
  return oom_observers_;
}

#if GM_TORCH_OOM_REJECTION
void GpumemAllocator::attachOomRejectionObserver(cca::OomRejectionObserver) {}
#endif

std::string GpumemAllocator::name() { return "gpumem"; }

GpumemAllocator* instance() { return g_instance.load(std::memory_order_acquire); }

std::shared_ptr<GpumemAllocator> create_instance(const gm_settings_t& settings) {
  std::lock_guard<std::mutex> guard(g_create_mu);
  if (!g_holder) {
    auto sp = std::make_shared<GpumemAllocator>(settings);
    g_holder = new std::shared_ptr<GpumemAllocator>(sp); /* leaked on purpose */
    g_instance.store(sp.get(), std::memory_order_release);
  }
  return *g_holder;
}

}  // namespace gpumem
