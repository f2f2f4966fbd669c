/*
 * gm_torch_pools.cpp - private memory pools through torch's allocator
 * interface: beginAllocateToPool / endAllocateToPool (CUDA graph capture,
 * torch.cuda.use_mem_pool), createOrIncrefPool / releasePool /
 * getPoolUseCount (torch.cuda.MemPool, CUDAGraph), checkPoolLiveAllocations
 * (cudagraph trees), setUseOnOOM / setNoSplit (MemPool options),
 * getCheckpointState / setCheckpointPoolState (cudagraph trees).
 *
 * Note [Routing to private pools]
 * Rationale: torch routes an allocation to a private pool when the stream
 *   filter given to beginAllocateToPool accepts it (a CUDA graph's filter
 *   asks whether the stream is capturing that graph; use_mem_pool's asks
 *   whether the calling thread is the one that entered the context). The
 *   filter is a std::function, which the C core cannot call.
 * Approach: the shim keeps, per device, the pools being allocated to with
 *   their filters in begin order (torch's captures_underway) under its own
 *   mutex, and a count of them that malloc reads without the mutex: when it
 *   is 0 (always, unless a graph or MemPool is in use) the allocation goes
 *   straight to the core's malloc. Otherwise the latest begun pool whose
 *   filter accepts the stream is looked up (torch searches in LIFO order:
 *   nested use_mem_pool blocks allocate from the innermost pool), with the mutex held and no core lock,
 *   and the core serves the request from that pool (gm_alloc_malloc_pool).
 *   The core keeps the pools themselves, their use counts and their memory
 *   under its allocator lock (Note [Private pools] in core/privpool.c).
 * Limitations: a pool ended and released on another thread between the
 *   lookup and the core's malloc sends the request to the default pools
 *   (in torch both happen under one lock; racing begin/end against
 *   allocations on the stream being routed is a usage error either way).
 *   MemPools with a custom allocator, use_on_oom or no_split are refused
 *   with a clear error. getCheckpointState / setCheckpointPoolState (the
 *   CUDA graph trees of torch.compile's reduce-overhead mode) are at the end
 *   of this file; the restore itself is the core's (Note [Private pool
 *   checkpoints] in core/checkpoint.c).
 */
#include "gm_torch.h"

#include <c10/util/Exception.h>

namespace gpumem {

namespace {

gm_mempool_id_t core_id(c10::cuda::MempoolId_t id) { return gm_mempool_id_t{id.first, id.second}; }

std::string id_text(c10::cuda::MempoolId_t id) {
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

}  // namespace

bool GpumemAllocator::route(c10::DeviceIndex device, cudaStream_t stream,
                            c10::cuda::MempoolId_t* id) {
  std::lock_guard<std::mutex> guard(routes_mu_);
  const std::vector<pool_route>& v = routes_[device];
  for (auto it = v.rbegin(); it != v.rend(); ++it) { /* the latest begun first */
    if (it->filter(stream)) {
      *id = it->id;
      return true;
    }
  }
  return false;
}

void GpumemAllocator::beginAllocateToPool(c10::DeviceIndex device,
                                          c10::cuda::MempoolId_t mempool_id,
                                          std::function<bool(cudaStream_t)> filter) {
  gm_alloc_t* a = core(device);
  std::lock_guard<std::mutex> guard(routes_mu_);
  int rc = g_core->pool_begin(a, core_id(mempool_id));
  TORCH_CHECK(rc != GM_ESTATE, "beginAllocateToPool: already recording to mempool_id");
  TORCH_CHECK(rc == GM_OK, "gpumem: beginAllocateToPool(", id_text(mempool_id), ") failed: ",
              g_core->strerror(rc));
  routes_[device].push_back(pool_route{mempool_id, std::move(filter)});
  n_routes_.fetch_add(1, std::memory_order_relaxed);
}

void GpumemAllocator::endAllocateToPool(c10::DeviceIndex device,
                                        c10::cuda::MempoolId_t mempool_id) {
  gm_alloc_t* a = core(device);
  std::lock_guard<std::mutex> guard(routes_mu_);
  std::vector<pool_route>& v = routes_[device];
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it->id == mempool_id) {
      v.erase(it);
      n_routes_.fetch_sub(1, std::memory_order_relaxed);
      break;
    }
  }
  int rc = g_core->pool_end(a, core_id(mempool_id));
  TORCH_CHECK(rc == GM_OK, "endAllocatePool: not currently recording to mempool_id");
}

void GpumemAllocator::releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) {
  gm_alloc_t* a = core(device);
  int rc = g_core->pool_release(a, core_id(mempool_id));
  TORCH_CHECK(rc == GM_OK, "gpumem: releasePool: private pool ", id_text(mempool_id),
              rc == GM_ESTATE ? " was already released" : " does not exist");
}

int GpumemAllocator::getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id) {
  gm_alloc_t* a = core(device);
  int n = 0;
  int rc = g_core->pool_use_count(a, core_id(mempool_id), &n);
  TORCH_CHECK(rc == GM_OK, "gpumem: getPoolUseCount: private pool ", id_text(mempool_id),
              " does not exist");
  return n;
}

namespace {

void create_or_incref(gm_alloc_t* a, c10::cuda::MempoolId_t mempool_id, bool own_allocator) {
  TORCH_CHECK(!own_allocator,
              "gpumem does not support a MemPool with an allocator of its own; create "
              "torch.cuda.MemPool() without one (its memory then comes from gpumem)");
  int rc = g_core->pool_create_or_incref(a, core_id(mempool_id));
  TORCH_CHECK(rc == GM_OK, "gpumem: createOrIncrefPool(", id_text(mempool_id), ") failed: ",
              rc == GM_ESTATE ? "the pool was already released" : g_core->strerror(rc));
}

const char kNoUseOnOom[] =
    "gpumem does not support MemPool(use_on_oom=True); create the pool without it";

}  // namespace

#if GM_TORCH_POOL_SHARED_ALLOCATOR
void GpumemAllocator::createOrIncrefPool(c10::DeviceIndex device,
                                         c10::cuda::MempoolId_t mempool_id,
                                         std::shared_ptr<cca::CUDAAllocator> allocator) {
  create_or_incref(core(device), mempool_id, allocator != nullptr);
}

void GpumemAllocator::setUseOnOOM(c10::DeviceIndex, c10::cuda::MempoolId_t, bool use_on_oom) {
  /* MemPool's destructor turns it off for every pool: that must not throw */
  TORCH_CHECK(!use_on_oom, kNoUseOnOom);
}
#elif GM_TORCH_MEMPOOL_API
void GpumemAllocator::createOrIncrefPool(c10::DeviceIndex device,
                                         c10::cuda::MempoolId_t mempool_id,
                                         cca::CUDAAllocator* allocator) {
  create_or_incref(core(device), mempool_id, allocator != nullptr);
}

/* Called only for MemPool(use_on_oom=True) in these releases. */
void GpumemAllocator::setUseOnOOM(c10::DeviceIndex, c10::cuda::MempoolId_t) {
  TORCH_CHECK(false, kNoUseOnOom);
}
#else
void GpumemAllocator::ensureExistsAndIncrefPool(c10::DeviceIndex device,
                                                c10::cuda::MempoolId_t mempool_id) {
  create_or_incref(core(device), mempool_id, false);
}
#endif

#if GM_TORCH_POOL_NO_SPLIT
void GpumemAllocator::setNoSplit(c10::DeviceIndex, c10::cuda::MempoolId_t) {
  TORCH_CHECK(false, "gpumem does not support MemPool(no_split=True); create the pool without it");
}
#endif

namespace {

struct live_check {
  const std::unordered_set<void*>* expected;
  size_t allocated;
  bool unexpected;
};

int count_live(void* arg, const gm_segment_info_t* seg) {
  auto* st = static_cast<live_check*>(arg);
  for (size_t i = 0; i < seg->nblocks; i++) {
    if (seg->blocks[i].state != GM_BLOCK_ACTIVE_ALLOCATED)
      continue;
    st->allocated++;
    if (!st->expected->count(reinterpret_cast<void*>(seg->blocks[i].address)))
      st->unexpected = true;
  }
  return 0;
}

}  // namespace

bool GpumemAllocator::checkPoolLiveAllocations(
    c10::DeviceIndex device, c10::cuda::MempoolId_t mempool_id,
    const std::unordered_set<void*>& expected_live_allocations) {
  gm_alloc_t* a = core(device);
  int n = 0;
  TORCH_CHECK(g_core->pool_use_count(a, core_id(mempool_id), &n) == GM_OK,
              "Could not find pool of id");
  live_check st{&expected_live_allocations, 0, false};
  int rc = g_core->walk_pool(a, core_id(mempool_id), count_live, &st);
  TORCH_CHECK(rc == GM_OK, "gpumem: checkPoolLiveAllocations failed: ", g_core->strerror(rc));
  return !st.unexpected && st.allocated == expected_live_allocations.size();
}

namespace {

/* A private pool's checkpoint (torch's PrivatePoolState): its segments'
 * blocks as the pool's walk reported them (Note [Private pool checkpoints]
 * in core/checkpoint.c). */
struct PoolCheckpoint final : cca::AllocatorState {
  c10::cuda::MempoolId_t id;
  std::vector<gm_ckpt_block_t> blocks;
};

int add_segment(void* arg, const gm_segment_info_t* seg) {
  auto* st = static_cast<PoolCheckpoint*>(arg);
  for (size_t i = 0; i < seg->nblocks; i++) {
    const gm_block_info_t& b = seg->blocks[i];
    st->blocks.push_back(gm_ckpt_block_t{b.address, b.size,
                                         b.state == GM_BLOCK_ACTIVE_ALLOCATED ? 1 : 0,
                                         i == 0 ? 1 : 0});
  }
  return 0;
}

struct freed_list {
  std::vector<void*>* ptrs;
  bool out_of_memory;
};

/* Called under the core lock, from C: must not throw. */
void add_freed(void* arg, uintptr_t ptr) noexcept {
  auto* f = static_cast<freed_list*>(arg);
  try {
    f->ptrs->push_back(reinterpret_cast<void*>(ptr));
  } catch (...) {
    f->out_of_memory = true;
  }
}

}  // namespace

std::shared_ptr<cca::AllocatorState> GpumemAllocator::getCheckpointState(
    c10::DeviceIndex device, c10::cuda::MempoolId_t id) {
  gm_alloc_t* a = core(device);
  int n = 0;
  TORCH_CHECK(g_core->pool_use_count(a, core_id(id), &n) == GM_OK, "Could not find pool of id");
  TORCH_CHECK(n > 0, "Not expected to checkpoint freeable graph");
  auto st = std::make_shared<PoolCheckpoint>();
  st->id = id;
  int rc = g_core->walk_pool(a, core_id(id), add_segment, st.get());
  TORCH_CHECK(rc == GM_OK, "gpumem: getCheckpointState failed: ", g_core->strerror(rc));
  return st;
}

cca::CheckpointDelta GpumemAllocator::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> pps) {
  auto st = std::dynamic_pointer_cast<PoolCheckpoint>(pps);
  TORCH_CHECK(st, "gpumem: setCheckpointPoolState was given a state that gpumem's "
                  "getCheckpointState did not make");
  gm_alloc_t* a = core(device);
  cca::CheckpointDelta delta;
  uint32_t ctx = capture(GM_HIST_CTX_STATE);
  freed_list freed{&delta.ptrs_freed, false};
  int rc = g_core->pool_restore(a, core_id(st->id), st->blocks.data(), st->blocks.size(),
                                add_freed, &freed, ctx);
  TORCH_CHECK(!freed.out_of_memory, "gpumem: setCheckpointPoolState: out of host memory");
  TORCH_CHECK(rc != GM_ENOTFOUND, "Could not find pool of id");
  TORCH_CHECK(rc == GM_OK, "gpumem: setCheckpointPoolState(", id_text(st->id),
              ") failed: ", rc == GM_ESTATE ? "the pool's segments no longer match the checkpoint"
                                            : g_core->strerror(rc));
  c10::Device dev(c10::DeviceType::CUDA, device);
  for (const gm_ckpt_block_t& b : st->blocks) {
    if (!b.allocated)
      continue;
    void* p = reinterpret_cast<void*>(b.ptr);
    delta.dataptrs_allocd.emplace_back(p, p, raw_deleter(), dev);
  }
  return delta;
}

}  // namespace gpumem
