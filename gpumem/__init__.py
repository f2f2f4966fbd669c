"""gpumem: a GPU memory allocator and memory profiler for PyTorch.

The allocator core is C (gpumem._C). This package exposes it on a simulated
device today: `Allocator` runs the core without a GPU, and
`python -m gpumem replay SNAPSHOT.pickle` replays a PyTorch memory snapshot
through it.
"""

from gpumem._C import Allocator, OutOfMemoryError, format_size

__version__ = "0.1.0"

__all__ = ["Allocator", "OutOfMemoryError", "format_size", "__version__"]
