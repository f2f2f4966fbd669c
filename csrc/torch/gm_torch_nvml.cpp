/*
 * gm_torch_nvml.cpp - the processes using a device, as the sentences torch's
 * out-of-memory message carries after "is free. ": "Including non-PyTorch
 * memory, this process has X memory in use. " for this process and
 * "Process PID has X memory in use. " for each other one NVML lists.
 *
 * NVML (libnvidia-ml.so.1) is loaded at run time, on the first
 * out-of-memory error and never before: the allocation path does not touch
 * it, and gpumem needs no NVML to build or load. See Note [Process lines
 * from NVML].
 * Must not: be called with a core lock held (NVML takes its own locks and
 * may be slow); throw.
 */
#include "gm_torch.h"

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <vector>

/* Note [Process lines from NVML]
 *
 * Rationale: torch's allocator adds these sentences (reportProcessMemoryInfo
 * in c10/cuda/CUDACachingAllocator.cpp, every release from 2.6 to 2.14), and
 * they are the only part of its message that counts memory outside the
 * allocator: the CUDA context, cuBLAS workspaces, NCCL buffers, and other
 * processes on the same GPU. A message without them says less than torch's.
 *
 * Approach: as torch does, once per process: dlopen libnvidia-ml.so.1 (the
 * library torch's DriverAPI opens; when torch has opened it already this is
 * the same copy), nvmlInit_v2 once and never shut down; then at each error
 * the device's handle by its PCI bus id ("%08X:%02X:%02X.0" from the
 * runtime's PCI domain, bus and device ids), and the plain
 * nvmlDeviceGetComputeRunningProcesses with v1 entries (pid, used bytes),
 * starting with room for 8 and growing to the count NVML asks for while it
 * answers NVML_ERROR_INSUFFICIENT_SIZE. Each entry, in NVML's order, is one
 * sentence; sizes in torch's format.
 *
 * Limitations: when NVML is missing the sentences are absent, as in torch.
 * When an NVML call fails, torch 2.6 to 2.13 (read in 2.6.0, 2.7.1, 2.8.0,
 * 2.9.1, 2.10.0, 2.11.0, 2.12.1, 2.13.0) raise an INTERNAL ASSERT
 * RuntimeError instead of the out-of-memory error; 2.14.1 warns once with
 * the failing call's name and leaves the sentences out. gpumem always
 * leaves them out and raises the out-of-memory error; from 2.14 on it warns
 * as torch does.
 */

namespace gpumem {

namespace {

/* The few NVML types used here, with nvml.h's values and layouts. */
using nvml_return = int;
using nvml_device = void*;
constexpr nvml_return kNvmlSuccess = 0;
constexpr nvml_return kNvmlInsufficientSize = 7;
struct nvml_process_v1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};

struct nvml_api {
  bool ok = false; /* loaded, resolved and initialised */
  nvml_return (*init)() = nullptr;
  nvml_return (*by_pci)(const char*, nvml_device*) = nullptr;
  nvml_return (*processes)(nvml_device, unsigned int*, nvml_process_v1*) = nullptr;
};

#if GM_TORCH_OOM_NVML_WARNS
#define NVML_WARN_ONCE(what)                                                 \
  TORCH_WARN_ONCE(what " failed; omitting per-process memory info from CUDA " \
                  "out-of-memory messages.")
#else
#define NVML_WARN_ONCE(what) \
  do {                       \
  } while (0)
#endif

/* Loaded once, on the first call (immutable after that). */
const nvml_api& nvml() {
  static nvml_api api = [] {
    nvml_api a;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY);
    if (!lib)
      return a;
    a.init = reinterpret_cast<decltype(a.init)>(dlsym(lib, "nvmlInit_v2"));
    a.by_pci = reinterpret_cast<decltype(a.by_pci)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    a.processes = reinterpret_cast<decltype(a.processes)>(
        dlsym(lib, "nvmlDeviceGetComputeRunningProcesses"));
    if (!a.init || !a.by_pci || !a.processes)
      return a;
    if (a.init() != kNvmlSuccess) {
      NVML_WARN_ONCE("nvmlInit_v2");
      return a;
    }
    a.ok = true;
    return a;
  }();
  return api;
}

}  // namespace

std::string process_memory_report(int device) {
  const nvml_api& api = nvml();
  if (!api.ok)
    return "";
  int domain = 0, bus = 0, dev = 0;
  if (cudaDeviceGetAttribute(&domain, cudaDevAttrPciDomainId, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&dev, cudaDevAttrPciDeviceId, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  char pci_id[80];
  std::snprintf(pci_id, sizeof pci_id, "%08X:%02X:%02X.0", static_cast<unsigned>(domain),
                static_cast<unsigned>(bus), static_cast<unsigned>(dev));
  nvml_device handle = nullptr;
  if (api.by_pci(pci_id, &handle) != kNvmlSuccess) {
    NVML_WARN_ONCE("nvmlDeviceGetHandleByPciBusId");
    return "";
  }
  std::vector<nvml_process_v1> procs(8);
  unsigned int count = static_cast<unsigned int>(procs.size());
  nvml_return r;
  while ((r = api.processes(handle, &count, procs.data())) == kNvmlInsufficientSize)
    procs.resize(count);
  if (r != kNvmlSuccess) {
#if GM_TORCH_OOM_NVML_WARNS
    TORCH_WARN_ONCE(
        "nvmlDeviceGetComputeRunningProcesses failed; omitting per-process memory info from CUDA "
        "out-of-memory messages. This is expected on platforms with partial NVML support such as "
        "Tegra/Jetson.");
#endif
    return "";
  }
  const unsigned int self = static_cast<unsigned int>(getpid());
  std::string out;
  for (unsigned int i = 0; i < count && i < procs.size(); i++) {
    if (procs[i].pid == self)
      out += "Including non-PyTorch memory, this process";
    else
      out += "Process " + std::to_string(procs[i].pid);
    char used[48];
    g_core->format_size(procs[i].used_gpu_memory, used, sizeof used);
    out += std::string(" has ") + used + " memory in use. ";
  }
  return out;
}

#undef NVML_WARN_ONCE

}  // namespace gpumem
