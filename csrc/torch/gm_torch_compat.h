/*
 * gm_torch_compat.h - the torch releases the shim builds against, and where
 * their allocator interfaces differ.
 *
 * gpumem supports torch 2.6 to 2.14 (gpumem/pytorch/shim_build.py refuses others
 * before compiling). The shim is compiled against the installed torch's
 * headers, so each difference is one named GM_TORCH_* switch, set here from
 * torch/version.h and tested where the interface is used; code that is the
 * same in every release has no switch. Each switch names the first release
 * that has the interface (read from that release's headers:
 * c10/cuda/CUDACachingAllocator.h, c10/core/CachingDeviceAllocator.h,
 * c10/core/AllocatorConfig.h, c10/cuda/CUDAAllocatorConfig.h).
 * The switches were read from the headers of 2.6.0, 2.7.1, 2.8.0, 2.9.1,
 * 2.10.0, 2.11.0, 2.12.1, 2.13.0 and 2.14.1, and the shim compiles against
 * each (built and loaded on each of them, conformance run on the
 * simulated GPU: docs/compatibility.md, "Measured per release").
 * Where a release lacks an interface, gpumem does what that release's own
 * allocator does (it has no such call, so nothing is routed to gpumem).
 * Must not: include anything of gpumem's.
 */
#pragma once

#include <torch/version.h>

#define GM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||     \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

/* The CUDA allocator reads its common keys from the device-generic
 * AcceleratorAllocatorConfig (c10/core/AllocatorConfig.h), with
 * c10::CachingAllocator::setAllocatorSettings / getAllocatorSettings;
 * before, CUDAAllocatorConfig parsed every key. 2.9 has that header, but
 * its CUDAAllocatorConfig still parses every key itself (2.9.1 on the
 * simulated GPU: "Unrecognized CachingAllocator option: foo" as a
 * RuntimeError, max_split_size_mb:20 refused), so the switch is 2.10. */
#define GM_TORCH_ACCEL_CONFIG GM_TORCH_AT_LEAST(2, 10)
/* How torch's CUDA parser is chained after the generic one: a public hook
 * getter (getConfigParserHook) from 2.11, before that only
 * registerDeviceConfigParserHook (which replaces the hook). */
#define GM_TORCH_CONFIG_HOOK_GETTER GM_TORCH_AT_LEAST(2, 11)
/* per_process_memory_fraction as an allocator setting. */
#define GM_TORCH_FRACTION_SETTING GM_TORCH_AT_LEAST(2, 10)
/* A fraction of 1.0 is no limit: the OOM message names none. Before, any
 * set_per_process_memory_fraction call, 1.0 included, makes it name the
 * limit from then on ("4.00 GiB allowed; ", seen with 2.6.0 on the
 * simulated GPU, and with 2.7.1, 2.8.0 and 2.9.1; 2.10.0 names none). */
#define GM_TORCH_FRACTION_ONE_NO_LIMIT GM_TORCH_FRACTION_SETTING

/* MemPool through the allocator: createOrIncrefPool, setUseOnOOM,
 * setNoSplit, emptyCache(pool), snapshot(pool); before,
 * ensureExistsAndIncrefPool and the argument-less emptyCache / snapshot. */
#define GM_TORCH_MEMPOOL_API GM_TORCH_AT_LEAST(2, 8)
/* createOrIncrefPool takes the pool's allocator as a shared_ptr and
 * setUseOnOOM takes the flag (before: a raw pointer, and no flag). */
#define GM_TORCH_POOL_SHARED_ALLOCATOR GM_TORCH_AT_LEAST(2, 11)
/* setNoSplit on a MemPool. */
#define GM_TORCH_POOL_NO_SPLIT GM_TORCH_AT_LEAST(2, 10)

/* TraceEntry's constructor takes the MemPool id. */
#define GM_TORCH_TRACE_MEMPOOL GM_TORCH_AT_LEAST(2, 8)
/* push/popCompileContext: torch.compile regions on trace entries. */
#define GM_TORCH_COMPILE_CONTEXT GM_TORCH_AT_LEAST(2, 8)
/* recordHistory's clearHistory. */
#define GM_TORCH_HISTORY_CLEAR GM_TORCH_AT_LEAST(2, 8)
/* set/getUserMetadata (torch.cuda.memory._set_memory_metadata). */
#define GM_TORCH_USER_METADATA GM_TORCH_AT_LEAST(2, 10)
/* recordHistory's skip_actions and snapshot's include_traces. */
#define GM_TORCH_HISTORY_SKIP_ACTIONS GM_TORCH_AT_LEAST(2, 11)
/* Trace entries name their MemPool (the snapshot's pool_id key): 2.12.1's
 * torch/cuda/memory.py documents it on TraceEntry, 2.11.0's does not, and
 * the snapshots of 2.10.0 and 2.11.0 have no such key. */
#define GM_TORCH_TRACE_POOL_ID GM_TORCH_AT_LEAST(2, 12)
/* History of pinned host memory: _record_memory_history's
 * record_pinned_host_memory and record_cuda, and the snapshot's host_segments
 * and host_traces (in 2.14.1's torch/cuda/memory.py, not in 2.13.0's). */
#define GM_TORCH_HOST_HISTORY GM_TORCH_AT_LEAST(2, 14)
/* supportsUserMetadata and annotateMemory. */
#define GM_TORCH_ANNOTATE_MEMORY GM_TORCH_AT_LEAST(2, 14)

/* The OOM message's hint, word for word from each release's libc10_cuda.so
 * (read in 2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.10.0, 2.11.0, 2.12.1, 2.13.0 and
 * 2.14.1): only 2.10 names
 * PYTORCH_ALLOC_CONF, every other release PYTORCH_CUDA_ALLOC_CONF; up to
 * 2.10 it links https://pytorch.org/docs/stable/notes/cuda.html#
 * environment-variables, from 2.11 the docs.pytorch.org page. */
#define GM_TORCH_OOM_HINT_GENERIC_VAR (GM_TORCH_AT_LEAST(2, 10) && !GM_TORCH_AT_LEAST(2, 11))
#define GM_TORCH_OOM_HINT_NEW_DOCS GM_TORCH_AT_LEAST(2, 11)

/* A failing NVML call leaves the OOM message's process sentences out with
 * a warning (2.14.1's libc10_cuda.so); 2.6.0 to 2.13.0 assert instead.
 * Note [Process lines from NVML] in gm_torch_nvml.cpp. */
#define GM_TORCH_OOM_NVML_WARNS GM_TORCH_AT_LEAST(2, 14)

/* attachOomRejectionObserver and DeviceStats::num_oom_rejections. */
#define GM_TORCH_OOM_REJECTION GM_TORCH_AT_LEAST(2, 12)

/* isEnabled() (torch._C._cuda_cudaCachingAllocator_is_enabled, from 2.12)
 * is false while PYTORCH_NO_CUDA_MEMORY_CACHING keeps caching off (2.13.0);
 * before, it reports the last enable() asked, true at start, while the
 * variable keeps caching off all the same (2.12.1; both seen on the
 * simulated GPU). */
#define GM_TORCH_ENABLED_READS_ENV GM_TORCH_AT_LEAST(2, 13)

/* Keys of the allocator_settings dict torch's snapshot carries. */
#define GM_TORCH_RECORD_STREAM_REUSE GM_TORCH_AT_LEAST(2, 9)
#define GM_TORCH_PINNED_THRESHOLDS GM_TORCH_AT_LEAST(2, 13)
