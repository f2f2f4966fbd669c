"""torch.cuda's memory functions, answered by gpumem's allocator.

Each function takes the arguments of its torch.cuda namesake and returns
what torch's would return for torch's own allocator: ``memory_stats()`` has
torch's flat, sorted key set (``allocated_bytes.all.current`` ...
``num_oom_rejections``), ``memory_summary()`` prints torch's table, and so
on.  They need ``gpumem.install()`` first (RuntimeError otherwise); as in
torch, ``memory_stats()`` is empty until CUDA is initialised, and nothing
here initialises CUDA unless torch's function would (device=None means the
current device, which torch.cuda.current_device() initialises).  A device
that does not exist gets torch's error ("Invalid device argument N"), not
zeros.
"""

from __future__ import annotations

import collections
from typing import Any

from gpumem.pytorch import release as _release
from gpumem.pytorch.shim_state import shim as _shim

__all__ = ["memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
           "memory_summary", "empty_cache", "mem_get_info", "set_per_process_memory_fraction",
           "get_per_process_memory_fraction", "memory_snapshot"]


def _index(device: Any) -> int:
    """torch's device resolution: None (or 'cuda') is the current device."""
    from torch.cuda import _get_device_index
    return _get_device_index(device, optional=True)


def _existing(device: Any) -> int:
    """_index(device), refused with torch's error when no such device exists."""
    import torch
    index = _index(device)
    if not 0 <= index < torch.cuda.device_count():
        raise RuntimeError(f"Invalid device argument {index}: did you call init?")
    return index


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, int]":
    """torch.cuda.memory_stats: the allocator's statistics for a device, flat and sorted."""
    shim = _shim()
    import torch
    if not torch.cuda.is_initialized():
        return collections.OrderedDict()
    stats = shim.stats(_existing(device))
    if torch.__version__ >= (2, 12):   # torch's key from 2.12 on; gpumem never rejects early
        stats.setdefault("num_oom_rejections", 0)
    else:
        stats.pop("num_oom_rejections", None)
    return collections.OrderedDict(sorted(stats.items()))


def memory_allocated(device: Any = None) -> int:
    """Bytes held by tensors (torch.cuda.memory_allocated)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    """Peak of memory_allocated since start or the last reset_peak_memory_stats."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    """Bytes gpumem holds from the device, cached or in use (torch.cuda.memory_reserved)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    """Peak of memory_reserved since start or the last reset_peak_memory_stats."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Set every peak to its current value (torch.cuda.reset_peak_memory_stats)."""
    _shim().reset_peak(_existing(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zero the allocated/freed totals, num_alloc_retries and num_ooms."""
    _shim().reset_accumulated(_existing(device))


def empty_cache() -> None:
    """Return every wholly free cached segment to the device (torch.cuda.empty_cache)."""
    shim = _shim()
    import torch
    if torch.cuda.is_initialized():
        shim.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device, from the CUDA driver (torch.cuda.mem_get_info)."""
    import torch
    shim = _shim()
    if device is None:
        device = torch.cuda.current_device()
    return tuple(shim.mem_get_info(_index(device)))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limit gpumem on a device to fraction x its total memory (0 to 1).

    Allocations beyond the limit raise torch.OutOfMemoryError, whose message
    then says "<limit> allowed;".
    """
    import torch
    shim = _shim()
    torch.cuda._lazy_init()
    if device is None:
        device = torch.cuda.current_device()
    device = _index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    shim.set_memory_fraction(fraction, device)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set by set_per_process_memory_fraction (1.0 when none)."""
    import torch
    shim = _shim()
    torch.cuda._lazy_init()
    if device is None:
        device = torch.cuda.current_device()
    return shim.memory_fraction(_index(device))


def memory_snapshot(*args: Any, **kwargs: Any) -> list:
    """torch.cuda.memory_snapshot: the segment list of gpumem's snapshot (all
    devices), with the parameters of the torch release gpumem is installed in
    (gpumem.pytorch.release: none before 2.8, mempool_id from 2.8,
    include_traces from 2.11); the rest as _memory_snapshot."""
    _release.check_call("memory_snapshot", _release.memory_snapshot_params(), args, kwargs)
    return _memory_snapshot(*args, **kwargs)


def _memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list:
    """With a ``mempool_id`` other than (0, 0) (torch.cuda.MemPool.snapshot()),
    only the segments of that private pool, as torch returns them."""
    _shim()
    from gpumem.recording.history import snapshot
    segments = snapshot()["segments"]
    if mempool_id is None or tuple(mempool_id) == (0, 0):
        return segments
    want = tuple(mempool_id)
    return [s for s in segments if tuple(s["segment_pool_id"]) == want]


def _memory_metadata_supported() -> bool:
    """gpumem's history stamps _set_memory_metadata strings on its events."""
    return True


# ------------------------------------------------------------ summary

_SIZE_UNITS = ("B  ", "KiB", "MiB", "GiB", "TiB", "PiB")
_COUNT_UNITS = (" ", "K", "M")


def _fmt_size(value: int, scale_by: float) -> str:
    unit = 0
    while unit + 1 < len(_SIZE_UNITS) and scale_by >= 768 * 1024:
        unit += 1
        value //= 1024
        scale_by /= 1024
    return f"{value:6d} {_SIZE_UNITS[unit]}"


def _fmt_count(value: int, scale_by: float) -> str:
    unit = 0
    while unit + 1 < len(_COUNT_UNITS) and scale_by >= 750 * 1000:
        unit += 1
        value //= 1000
        scale_by /= 1000
    return f"{value:7d} {_COUNT_UNITS[unit]} "


_FAMILIES = (
    ("allocated_bytes", "Allocated memory", _fmt_size),
    ("active_bytes", "Active memory", _fmt_size),
    ("requested_bytes", "Requested memory", _fmt_size),
    ("reserved_bytes", "GPU reserved memory", _fmt_size),
    ("inactive_split_bytes", "Non-releasable memory", _fmt_size),
    ("allocation", "Allocations", _fmt_count),
    ("active", "Active allocs", _fmt_count),
    ("segment", "GPU reserved segments", _fmt_count),
    ("inactive_split", "Non-releasable allocs", _fmt_count),
)
_SINGLES = (("oversize_allocations", "Oversize allocations"),
            ("oversize_segments", "Oversize GPU segments"))
_FIELDS = ("current", "peak", "allocated", "freed")


def format_summary(stats: dict, device: int, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary's table for a memory_stats()-style dict.

    Raises KeyError, as torch's does, if a key the table needs is missing.
    """
    rule, thick = "-" * 75, "=" * 75
    title = f" {'':16} PyTorch CUDA memory summary, device ID {device:<17d} "
    counters = (f"  {'':9} CUDA OOMs: {stats['num_ooms']:<12d} | {'':6} cudaMalloc retries: "
                f"{stats['num_alloc_retries']:<8d}  ")
    lines = [thick, title, rule, counters, thick,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    pools = [("all", None)]
    if not abbreviated:
        pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
    for key, label, fmt in _FAMILIES:
        lines.append(rule)
        scale = None
        for pool, pool_label in pools:
            vals = [stats[f"{key}.{pool}.{f}"] for f in _FIELDS]
            scale = scale or vals  # every row is scaled by the 'all' row's values
            cells = " | ".join(fmt(v, s) for v, s in zip(vals, scale))
            lines.append(f" {pool_label or label:<21} | {cells} ")
    for key, label in _SINGLES:
        lines.append(rule)
        vals = [stats[f"{key}.{f}"] for f in _FIELDS]
        cells = " | ".join(_fmt_count(v, v) for v in vals)
        lines.append(f" {label:<21} | {cells} ")
    lines.append(thick)
    return "|" + "|\n|".join(lines) + "|\n"


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary: a printable table of memory_stats(device)."""
    device = _index(device)
    return format_summary(memory_stats(device), device, abbreviated)
