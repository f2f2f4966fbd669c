/*
 * gm_torch_oom.cpp - out of memory as torch reports it: torch's message,
 * word for word, gpumem's OOM hook, torch's OOM observers, then
 * c10::OutOfMemoryError (torch.OutOfMemoryError in Python). See Note [Out
 * of memory through the pluggable allocator] in gm_torch_alloc.cpp.
 *
 * The message is torch's, including "allocated by PyTorch" and the
 * PYTORCH_CUDA_ALLOC_CONF hint (in the imported release's words): gpumem takes its settings from that
 * variable, and scripts and tools parse this text. "<limit> allowed; " is
 * there exactly when a memory fraction below 1 is in force (even one of 0
 * bytes), or before 2.10 once any fraction has been set. Free blocks cached in private pools count as "allocated in
 * private pools", as torch counts them. The process sentences after "is
 * free. " come from NVML, as torch's do (gm_torch_nvml.cpp).
 * Must not: be called with a core lock held.
 */
#include "gm_torch.h"

#include <c10/util/Exception.h>

/* The hint's wording follows the release built against (gm_torch_compat.h). */
#if GM_TORCH_OOM_HINT_GENERIC_VAR
#define OOM_HINT_VAR "PYTORCH_ALLOC_CONF"
#else
#define OOM_HINT_VAR "PYTORCH_CUDA_ALLOC_CONF"
#endif
#if GM_TORCH_OOM_HINT_NEW_DOCS
#define OOM_HINT_DOCS                                                               \
  "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-" \
  "pytorch-cuda-alloc-conf)"
#else
#define OOM_HINT_DOCS "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
#endif

namespace gpumem {

namespace {

std::string size_text(size_t bytes) {
  char buf[48];
  g_core->format_size(bytes, buf, sizeof buf);
  return buf;
}

}  // namespace

std::string oom_message(int device, const gm_oom_info_t& oom) {
  std::string msg = "CUDA out of memory. Tried to allocate " + size_text(oom.alloc_size) +
                    ". GPU " + std::to_string(device) + " has a total capacity of " +
                    size_text(oom.device_total) + " of which " + size_text(oom.device_free) +
                    " is free. " + process_memory_report(device);
  if (oom.has_limit)
    msg += size_text(oom.allowed) + " allowed; ";
  /* torch counts the free blocks cached in private pools as allocated */
  size_t in_pools = oom.private_pool_cached;
  msg += "Of the allocated memory " + size_text(oom.allocated + in_pools) +
         " is allocated by PyTorch, ";
  if (in_pools)
    msg += "with " + size_text(in_pools) + " allocated in private pools (e.g., CUDA Graphs), ";
  msg += "and " + size_text(oom.reserved_unallocated - in_pools) +
         " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
         "try setting " OOM_HINT_VAR "=expandable_segments:True to avoid "
         "fragmentation.  See documentation for Memory Management  " OOM_HINT_DOCS;
  return msg;
}

void throw_oom(GpumemAllocator& alloc, int device, const gm_oom_info_t& core_oom,
               cudaStream_t stream) {
  gm_oom_info_t oom = core_oom;
#if !GM_TORCH_FRACTION_ONE_NO_LIMIT
  /* A fraction of 1.0 set is a limit of the whole device here (gm_torch_compat.h). */
  if (!oom.has_limit && alloc.fraction_was_set(device)) {
    oom.has_limit = 1;
    oom.allowed = oom.device_total;
  }
#endif
  std::string msg = oom_message(device, oom);
  /* Before the observers: the snapshot shows the state at the failure. */
  std::string extra = run_oom_hook(device, oom, reinterpret_cast<uintptr_t>(stream), msg.c_str());
  if (!extra.empty()) {
    msg += "\n";
    msg += extra;
  }
  size_t allowed = oom.has_limit ? oom.allowed : oom.device_total;
  for (const auto& obs : alloc.oom_observers())
    obs(device, oom.alloc_size, allowed, oom.device_free);
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
}

}  // namespace gpumem
