/*
 * gm_torch_stats.cpp - what torch reads about the allocator's memory: the
 * statistics (getDeviceStats, torch.cuda.memory_stats() and
 * torch.accelerator.memory_stats() without gpumem's patches) and their
 * resets, the largest cached block (cacheInfo), and the segment a pointer
 * lies in (getBaseAllocation). Each reads the cores; none changes them
 * beyond the stats resets.
 */
#include "gm_torch.h"

#include <c10/util/Exception.h>

namespace gpumem {

namespace {

struct largest_free {
  size_t largest = 0;
};

int largest_cb(void* arg, const gm_segment_info_t* seg) {
  auto* st = static_cast<largest_free*>(arg);
  for (size_t i = 0; i < seg->nblocks; i++)
    if (seg->blocks[i].state == GM_BLOCK_INACTIVE && seg->blocks[i].size > st->largest)
      st->largest = seg->blocks[i].size;
  return 0;
}

struct base_lookup {
  uintptr_t ptr;
  uintptr_t base = 0;
  size_t size = 0;
};

int base_cb(void* arg, const gm_segment_info_t* seg) {
  auto* st = static_cast<base_lookup*>(arg);
  if (st->ptr >= seg->address && st->ptr < seg->address + seg->total_size) {
    st->base = seg->address;
    st->size = seg->total_size;
    return 1; /* stop */
  }
  return 0;
}

}  // namespace

void GpumemAllocator::cacheInfo(c10::DeviceIndex device, size_t* largestBlock) {
  gm_alloc_t* a = core(device);
  if (*largestBlock == 0) { /* torch's first guess: what the device has free */
    size_t free_b = 0, total = 0;
    char err[512] = "";
    if (g_core->mem_get_info(device, &free_b, &total, err, sizeof err) == GM_OK)
      *largestBlock = free_b;
  }
  largest_free st;
  g_core->walk(a, largest_cb, &st);
  if (st.largest > *largestBlock)
    *largestBlock = st.largest;
}

void* GpumemAllocator::getBaseAllocation(void* ptr, size_t* size) {
  base_lookup st;
  st.ptr = reinterpret_cast<uintptr_t>(ptr);
  for (int d = 0; d < kMaxDevices && !st.base; d++) {
    gm_alloc_t* a = existing_core(d);
    if (a)
      g_core->walk(a, base_cb, &st);
  }
  TORCH_CHECK(st.base != 0, "gpumem: ", ptr, " is not memory allocated by gpumem");
  if (size)
    *size = st.size;
  return reinterpret_cast<void*>(st.base);
}

c10::CachingDeviceAllocator::DeviceStats GpumemAllocator::getDeviceStats(
    c10::DeviceIndex device) {
  c10::CachingDeviceAllocator::DeviceStats out;
  gm_stats_t st{};
  gm_alloc_t* a = existing_core(device);
  if (a) {
    g_core->get_stats(a, &st);
  } else {
    size_t ms = settings().max_split_size;
    st.max_split_size = ms == SIZE_MAX ? -1 : static_cast<int64_t>(ms);
  }
  auto conv = [](auto& dst, const gm_stat_t& src) { /* c10::CachingDeviceAllocator::Stat before 2.9 */
    dst.current = src.current;
    dst.peak = src.peak;
    dst.allocated = src.allocated;
    dst.freed = src.freed;
  };
  /* gpumem's stat types are in torch's order: all, small pool, large pool. */
  for (int t = 0; t < GM_STAT_NTYPES; t++) {
    conv(out.allocation[t], st.allocation[t]);
    conv(out.segment[t], st.segment[t]);
    conv(out.active[t], st.active[t]);
    conv(out.inactive_split[t], st.inactive_split[t]);
    conv(out.allocated_bytes[t], st.allocated_bytes[t]);
    conv(out.reserved_bytes[t], st.reserved_bytes[t]);
    conv(out.active_bytes[t], st.active_bytes[t]);
    conv(out.inactive_split_bytes[t], st.inactive_split_bytes[t]);
    conv(out.requested_bytes[t], st.requested_bytes[t]);
  }
  conv(out.oversize_allocations, st.oversize_allocations);
  conv(out.oversize_segments, st.oversize_segments);
  out.num_alloc_retries = st.num_alloc_retries;
  out.num_ooms = st.num_ooms;
  out.num_sync_all_streams = st.num_sync_all_streams;
  out.num_device_alloc = st.num_device_alloc;
  out.num_device_free = st.num_device_free;
#if GM_TORCH_OOM_REJECTION
  out.num_oom_rejections = 0;
#endif
  out.max_split_size = st.max_split_size;
  return out;
}

void GpumemAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  if (gm_alloc_t* a = existing_core(device))
    g_core->reset_accumulated_stats(a);
}

void GpumemAllocator::resetPeakStats(c10::DeviceIndex device) {
  if (gm_alloc_t* a = existing_core(device))
    g_core->reset_peak_stats(a);
}

}  // namespace gpumem
