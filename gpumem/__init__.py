"""gpumem: a GPU memory allocator and memory profiler for PyTorch.

With PyTorch, `gpumem.install()` (before the first CUDA tensor) makes
gpumem's C allocator torch's CUDA allocator; `gpumem.memory_stats()`,
`memory_summary()` and the other torch.cuda-style functions (gpumem.pytorch.stats)
report it, and torch's own names are routed to them (gpumem.pytorch.installer).

`record_memory_history()` / `snapshot()` / `dump_snapshot()` record
allocator events with their Python stacks and write snapshots that PyTorch's
memory_viz opens (gpumem.recording.history); ``with gpumem.record(path):`` wraps a
block of a training script and writes a snapshot when it ends or when an
allocation fails with out of memory (gpumem.recording.recorder).

`Allocator` runs the core on a virtual device (`backend="virtual"`, an address
space without memory; or `backend="cuda"`, the CUDA driver) without
torch; the `gpumem` command views, summarises, diffs and replays snapshots
and runs scripts on a simulated GPU (gpumem.cli).  `doctor()` (``gpumem
doctor``) checks a machine: driver, GPUs, torch, the shim, settings, and a
self-test of the driver backend on the GPU.  Importing gpumem never imports
torch.

Layers import only downward.  Below, from the bottom layer up, a module
imports only modules on earlier lines; an import deferred into a function
counts too.  tests/test_py_layers.py checks this list against the import
graph (and docs/architecture.md's copy of it).  Where each concept lives is
in the subpackages' docstrings: snapshots (read, analyse, view, replay),
recording, pytorch (gpumem inside torch), categories, sim (the simulated
GPU's launcher), checkup (gpumem doctor); the rest are shared leaves.
  _C (the extension), _format, _conf (allocator settings), _atomic (file writes)
  _rank (per-rank file names), _sampling (the sampled mode's parameters and estimates)
  categories.classify, snapshots.pickle_scan, snapshots.origin, pytorch.shim_state,
      pytorch.shim_build, checkup.cudadriver, sim.gpus, sim.torchrun, sim.torch_cuda,
      sim.config_key, sim.boundary, sim.world_rank
  categories.report, categories.tagger, snapshots.unpickle, checkup.selftest, sim,
      sim.knob, pytorch.release
  snapshots.sites, recording.history, sim.rank_report, sim.__main__,
      sim.world
  snapshots.timeline, recording.oom, pytorch.stats
  snapshots.summary, snapshots.replay, pytorch.installer
  snapshots.view, snapshots.rank_summary, recording.recorder, checkup.doctor
  __init__ (the public names of gpumem)
  sim.child
  sim.outcome
  sim.command
  sim.fit
  cli
  __main__
"""

from gpumem._C import Allocator, OutOfMemoryError, format_size
from gpumem.checkup.doctor import doctor
from gpumem.pytorch.installer import (InstallError, TorchMissingError, install, is_installed,
                                      uninstall_patches)
from gpumem.recording.history import (_dump_snapshot, _record_memory_history, _snapshot,
                                      dump_snapshot, get_memory_metadata,
                                      history_overhead_bytes, record_memory_history,
                                      set_memory_metadata, snapshot)
from gpumem.recording.recorder import Recorder, RecordError, record
from gpumem.pytorch.stats import (empty_cache, get_per_process_memory_fraction,
                                  max_memory_allocated, max_memory_reserved, mem_get_info,
                                  memory_allocated, memory_reserved, memory_snapshot,
                                  memory_stats, memory_summary, reset_accumulated_memory_stats,
                                  reset_peak_memory_stats, set_per_process_memory_fraction)

__version__ = "0.1.0"

__all__ = ["Allocator", "OutOfMemoryError", "format_size", "__version__",
           "record_memory_history", "snapshot", "dump_snapshot", "set_memory_metadata",
           "get_memory_metadata", "history_overhead_bytes", "_record_memory_history",
           "_snapshot", "_dump_snapshot",
           "install", "is_installed", "uninstall_patches", "InstallError", "TorchMissingError",
           "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
           "memory_summary", "empty_cache", "mem_get_info", "set_per_process_memory_fraction",
           "get_per_process_memory_fraction", "memory_snapshot", "record", "Recorder",
           "RecordError", "doctor"]
