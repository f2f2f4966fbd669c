"""The memory-history interface of the torch release gpumem is installed in.

torch's releases differ in what its memory history takes and gives back:
the arguments of ``torch.cuda.memory._record_memory_history`` and of the
C entry points under it, the keys of the snapshot and of its trace entries.
gpumem does what the imported release's own allocator does, so its
replacements follow the release: a keyword the release lacks is refused
with the TypeError torch's function raises, and a key the release's
snapshot lacks is not there.

Where the releases differ is written once, in csrc/torch/gm_torch_compat.h
(one GM_TORCH_* switch per interface, set from torch's version when the
shim is built); the loaded shim reports those switches (``interfaces()``)
and this module turns them into shapes.  Without a loaded shim (gpumem's
own Allocator, no torch) the shapes are the newest release's.

Imports only gpumem.pytorch.shim_state; nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

from gpumem.pytorch import shim_state as _shim_state

__all__ = ["interfaces", "record_history_params", "c_record_history_arity",
           "memory_snapshot_params", "check_call", "check_c_record_history_call",
           "check_c_snapshot_call", "shape_snapshot"]

# torch.cuda.memory._record_memory_history's parameters in order; each
# release has a prefix of them (the switch that adds a group, or None).
_PARAMS = ((None, ("enabled", "context", "stacks", "max_entries", "device")),
           ("history_clear", ("clear_history", "compile_context", "global_record_annotations")),
           ("skip_actions", ("skip_actions",)),
           ("host_history", ("record_pinned_host_memory", "record_cuda")))
# The trace entry keys, and the snapshot's top-level keys, that come with a switch.
_TRACE_KEYS = (("compile_context", "compile_context"), ("user_metadata", "user_metadata"),
               ("trace_pool_id", "pool_id"))
_TOP_KEYS = (("host_history", "host_segments"), ("host_history", "host_traces"))


def interfaces(shim: Any = None) -> dict[str, bool]:
    """The switches of ``shim`` (default: the loaded one) ({'skip_actions':
    True, ...}); without a shim, every interface."""
    shim = shim if shim is not None else _shim_state.loaded()
    report = getattr(shim, "interfaces", None) if shim is not None else None
    if report is None:
        names = {n for n, _ in _PARAMS + _TRACE_KEYS + _TOP_KEYS if n}
        names |= {"mempool_api", "accel_config"}
        return {n: True for n in names}
    return dict(report())


def record_history_params() -> tuple[str, ...]:
    """The parameters of this release's torch.cuda.memory._record_memory_history."""
    have = interfaces()
    out: list[str] = []
    for switch, names in _PARAMS:
        if switch is not None and not have[switch]:
            break
        out.extend(names)
    return tuple(out)


def c_record_history_arity() -> int:
    """How many arguments this release's torch._C._cuda_record_memory_history
    takes: the same order, without ``device`` (4, 7, 8 or 10)."""
    return len(record_history_params()) - 1


def memory_snapshot_params() -> tuple[str, ...]:
    """The parameters of this release's torch.cuda.memory_snapshot."""
    have = interfaces()
    return tuple(name for name, switch in (("mempool_id", "mempool_api"),
                                           ("include_traces", "skip_actions"))
                 if have[switch])


def check_call(fn_name: str, params: tuple[str, ...], args: tuple, kwargs: dict,
               extra: tuple[str, ...] = ()) -> None:
    """Raise the TypeError Python raises for a call of torch's ``fn_name``
    (whose parameters on this release are ``params``, each with a default)
    with arguments it does not take; ``extra``: gpumem's own keywords, taken
    on every release."""
    n = len(args)
    if n > len(params):
        takes = f"from 0 to {len(params)}" if params else "0"
        raise TypeError(f"{fn_name}() takes {takes} positional arguments but {n} "
                        f"{'was' if n == 1 else 'were'} given")
    for name in kwargs:
        if name not in params and name not in extra:
            raise TypeError(f"{fn_name}() got an unexpected keyword argument '{name}'")


def check_c_record_history_call(args: tuple) -> None:
    """Raise the TypeError of this release's pybind11 entry point
    _cuda_record_memory_history for a call with another number of arguments."""
    n = c_record_history_arity()
    if len(args) != n:
        names = [p for p in record_history_params() if p != "device"]
        raise TypeError("_cuda_record_memory_history(): incompatible function arguments. The "
                        "following argument types are supported:\n    1. ("
                        + ", ".join(names) + ") -> None\n\nInvoked with: "
                        + ", ".join(repr(a) for a in args))


def check_c_snapshot_call(args: tuple) -> None:
    """Raise the TypeError of this release's torch._C._cuda_memorySnapshot for
    a call with another number of arguments (none before MemPools, one
    after), and its RuntimeError for a pool id with include_traces before
    the release that has it."""
    have = interfaces()
    if not have["mempool_api"]:
        if args:
            raise TypeError(f"torch._C._cuda_memorySnapshot() takes no arguments "
                            f"({len(args)} given)")
        return
    if len(args) != 1:
        raise TypeError(f"torch._C._cuda_memorySnapshot() takes exactly one argument "
                        f"({len(args)} given)")
    arg = args[0]
    if arg is not None and not have["skip_actions"] and len(arg) != 2:
        raise RuntimeError("mempool_id must be a tuple of 2 integers")


def shape_snapshot(snap: dict) -> dict:
    """Drop from snap (in place) the keys this release's snapshot lacks:
    top-level keys and trace entry keys; returns snap."""
    have = interfaces()
    for switch, key in _TOP_KEYS:
        if not have[switch]:
            snap.pop(key, None)
    drop = [key for switch, key in _TRACE_KEYS if not have[switch]]
    if drop:
        for entries in snap.get("device_traces", ()):
            for e in entries:
                for key in drop:
                    e.pop(key, None)
    return snap
