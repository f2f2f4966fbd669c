"""gpumem: a GPU memory allocator and memory profiler for PyTorch.

The allocator core is C (gpumem._C). This package exposes it on a simulated
device today: `Allocator` runs the core without a GPU, and
`python -m gpumem replay SNAPSHOT.pickle` replays a PyTorch memory snapshot
through it. `record_memory_history()` / `snapshot()` / `dump_snapshot()`
record allocator events with their Python stacks and write snapshots that
PyTorch's memory_viz opens (gpumem.history).
"""

from gpumem._C import Allocator, OutOfMemoryError, format_size
from gpumem.history import (_dump_snapshot, _record_memory_history, _snapshot, dump_snapshot,
                            get_memory_metadata, history_overhead_bytes, record_memory_history,
                            set_memory_metadata, snapshot)

__version__ = "0.1.0"

__all__ = ["Allocator", "OutOfMemoryError", "format_size", "__version__",
           "record_memory_history", "snapshot", "dump_snapshot", "set_memory_metadata",
           "get_memory_metadata", "history_overhead_bytes", "_record_memory_history",
           "_snapshot", "_dump_snapshot"]
