"""Memory history: every allocator event with the Python stack that caused it.

``record_memory_history()`` turns recording on, ``snapshot()`` returns the
state of every recorded allocator in PyTorch's memory-snapshot schema (the
dict ``torch.cuda.memory._snapshot()`` returns), and ``dump_snapshot(path)``
writes it as a pickle that ``torch.cuda._memory_viz`` and
pytorch.org/memory_viz open unchanged.  PyTorch's names
``_record_memory_history``, ``_snapshot``, ``_dump_snapshot``,
``_set_memory_metadata`` and ``_get_memory_metadata`` are provided too, with
torch's signatures and defaults.

Every ``gpumem.Allocator`` registers itself for its device when it is
created (the newest one on a device is the recorded one).  Stacks are
captured in C before the allocator lock is taken, stored as interned ids and
turned into frame dicts only when a snapshot is taken: identical frames and
identical tracebacks are the same Python objects, so pickle stores each once.
"""

from __future__ import annotations

import inspect
import os
import pickle
import sys
from typing import Any

from gpumem import _C, _sampling
from gpumem.pytorch import release as _release
from gpumem.pytorch import shim_build as _shim_build
from gpumem.pytorch import shim_state as _shim_state
from gpumem.categories import tagger as _categories
from gpumem._atomic import write_atomic
from gpumem._conf import ConfError, settings_for_snapshot, snapshot_settings_of

__all__ = [
    "ACTIONS",
    "CONTEXTS",
    "STACKS",
    "HistoryConfigError",
    "recording_config",
    "write_snapshot",
    "record_memory_history",
    "snapshot",
    "dump_snapshot",
    "set_memory_metadata",
    "get_memory_metadata",
    "history_overhead_bytes",
    "_record_memory_history",
    "_snapshot",
    "_dump_snapshot",
    "_set_memory_metadata",
    "_get_memory_metadata",
    "_allocation_traceback",
    "_cuda_record_memory_history",
    "_cuda_record_memory_history_legacy",
    "_cuda_memory_snapshot",
]

#: Pickle protocol of dump_snapshot: MemoryViz reads protocols 2 to 4 only.
PICKLE_PROTOCOL = 4

_ENABLED = {None: 0, "state": 1, "all": 2}
_CONTEXT = {None: 0, "state": 1, "alloc": 2, "all": 3}
_STACKS = {"python": False, "all": True}
#: The values record_memory_history accepts for context, and for stacks.
CONTEXTS = tuple(_CONTEXT)
STACKS = tuple(_STACKS)
# torch's TraceEntry::Action order (the bit index of skip_actions).
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom", "annotate")

# torch's wording (torch/csrc/cuda/memory_snapshot.cpp).
_ENABLED_MSG = "expected state to be 'state', 'all', or None"
_CONTEXT_MSG = "expected context to be 'state', 'alloc', 'all', or None"
_STACKS_MSG = "expected stacks to be 'python', or 'all'"


class HistoryConfigError(ValueError, RuntimeError):
    """A bad argument to record_memory_history.

    A ValueError, and also a RuntimeError: the type torch raises for the
    same mistakes, so code written against torch keeps working.
    """


def _choice(table: dict, value: Any, message: str) -> int:
    if value is None or isinstance(value, str):
        level = table.get(value)
        if level is not None:
            return level
    raise HistoryConfigError(f"{message}, not {value!r}")


def _skip_mask(skip_actions: Any) -> int:
    if skip_actions is None:
        return 0
    if isinstance(skip_actions, str):
        raise HistoryConfigError("skip_actions must be a list of action names, not a str; "
                                 f"for example ['{skip_actions}']")
    mask = 0
    for name in skip_actions:
        if name not in ACTIONS:
            raise HistoryConfigError(f"Unknown TraceEntry action: {name}")
        mask |= 1 << ACTIONS.index(name)
    return mask


def _max_entries(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HistoryConfigError(f"max_entries must be a non-negative int, not {value!r}")
    return min(value, (1 << 64) - 1)


def record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "python",
    max_entries: int = 100_000,
    clear_history: bool = False,
    *,
    device: Any = None,
    skip_actions: list[str] | None = None,
    categories: bool | None = None,
    sample: Any = None,
) -> None:
    """Start, change or stop recording allocator history, on every device.

    enabled: None stops recording and clears the history; 'state' keeps
        stacks for live memory and only the last event; 'all' also keeps a
        history of up to ``max_entries`` events (oldest dropped first).
    context: None records no stacks; 'state' records the stack of each live
        allocation; 'alloc' also attaches it to the alloc and free events;
        'all' also records the stack of each free.
    stacks: 'python' records Python frames; 'all' adds C return addresses,
        symbolized when a snapshot is taken.
    clear_history: drop the events recorded so far.
    device: accepted for torch compatibility; recording covers all devices.
    skip_actions: action names (see ACTIONS) that are not recorded.
    categories: also note what each allocation is for (parameter, gradient,
        optimizer state, activation, ...) through a few global torch hooks and
        wrappers of torch.autograd.backward and .grad, and add
        the ``gpumem_categories`` table to snapshots (gpumem.categories.tagger);
        each call sets it anew, so a call without it turns categories off
        (under ``gpumem simulate --categories`` only an explicit False does).

    Invalid values raise HistoryConfigError (a ValueError) with torch's text.
    """
    if isinstance(enabled, bool):
        _record_memory_history_legacy(enabled, clear_history=clear_history)
        return
    e = _choice(_ENABLED, enabled, _ENABLED_MSG)
    c = _choice(_CONTEXT, context, _CONTEXT_MSG)
    s = _choice(_STACKS, stacks, _STACKS_MSG)
    n = _max_entries(max_entries)
    mask = _skip_mask(skip_actions)
    try:
        smp = _sampling.resolve(sample) if e != 0 else None
    except _sampling.SampleError as err:
        raise HistoryConfigError(str(err)) from None
    _record_function(e != 0)  # before anything changes: it may fail to build
    if categories and e != 0:
        _categories.enable(clear=bool(clear_history))
    else:
        _categories.disable()
    if smp is None:
        _C._hist_configure(e, c, s, n, bool(clear_history), mask)
    else:
        _C._hist_configure(e, c, s, n, bool(clear_history), mask, smp["mean_bytes"],
                           smp["threshold_bytes"], smp["seed"])
    _follow_annotations(e != 0, False)
    if e == 0:
        _follow_compile_contexts(False)


def _record_function(needed: bool) -> Any:
    """Under torch, the record_function module (gm_torch_rf_module.cpp): when
    ``needed``, loaded (built first, once per torch, unless
    GPUMEM_SHIM_BUILD=0, which raises ShimBuildError instead); else the one
    already loaded, or None."""
    shim = _shim_state.loaded()
    if shim is None or not shim.exists():
        return None
    if needed:
        return _shim_build.load(module=_shim_build.RECORD_FUNCTION)
    return _shim_build.loaded(_shim_build.RECORD_FUNCTION)


def _follow_annotations(enabled: bool, global_: bool) -> None:
    """Under torch, record record_function ranges while recording, as torch
    does (external_annotations; Note [Annotations] in gm_torch_record_function.cpp)."""
    rf = _record_function(enabled)
    if rf is not None:
        rf.set_annotations(enabled, bool(global_))


def _follow_compile_contexts(enabled: bool) -> None:
    """Under torch, name torch.compile regions on trace entries, as torch
    does with compile_context=True (Note [Compile contexts], the same file)."""
    rf = _record_function(enabled)
    if rf is not None:
        rf.set_compile_contexts(bool(enabled))


def _record_memory_history(*args: Any, **kwargs: Any) -> None:
    """torch.cuda.memory._record_memory_history, with the signature of the
    torch release gpumem is installed in (torch 2.14's without torch): an
    argument that release does not take raises the TypeError torch's
    function raises (gpumem.pytorch.release); categories and sample are
    gpumem's, taken on every release. The rest as _record_memory_history_impl.
    """
    enabled = args[0] if args else kwargs.get("enabled", "all")
    if not isinstance(enabled, bool):  # torch's legacy form has its own arguments
        _release.check_call("_record_memory_history_impl", _release.record_history_params(),
                            args, kwargs, ("categories", "sample"))
    _record_memory_history_impl(*args, **kwargs)


def _record_memory_history_impl(
    enabled: Any = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
    record_pinned_host_memory: bool = False,
    record_cuda: bool = True,
    categories: bool | None = None,
    sample: Any = None,
    **legacy: Any,
) -> None:
    """torch.cuda.memory._record_memory_history, with torch's signature and defaults.

    A bool ``enabled`` selects torch's legacy form (``trace_alloc_max_entries``,
    ``trace_alloc_record_context``, ``record_context``, ``record_context_cpp``).
    compile_context names the torch.compile region of each trace entry, as
    torch does; pinned host memory is not managed by gpumem.
    categories and sample (gpumem's, not torch's): as for record_memory_history.
    """
    if isinstance(enabled, bool):
        _record_memory_history_legacy(enabled, clear_history=clear_history, **legacy)
        return
    if legacy:
        raise TypeError(f"unexpected keyword argument {next(iter(legacy))!r}")
    if record_pinned_host_memory:
        raise NotImplementedError("gpumem does not manage pinned host memory, so "
                                  "record_pinned_host_memory=True has nothing to record")
    if not record_cuda:
        enabled = None
    record_memory_history(enabled, context, stacks, max_entries, clear_history,
                          device=device, skip_actions=skip_actions, categories=categories,
                          sample=sample)
    if global_record_annotations and enabled is not None:
        _follow_annotations(True, True)
    _follow_compile_contexts(enabled is not None and compile_context)


_record_memory_history.__signature__ = (  # type: ignore[attr-defined]
    inspect.signature(_record_memory_history_impl))


def _record_memory_history_legacy(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    device: Any = None,
    record_context_cpp: bool = False,
    clear_history: bool = False,
    **ignored: Any,
) -> None:
    """torch's pre-2.1 form: _record_memory_history(True, trace_alloc_max_entries=N, ...)."""
    if not enabled:
        _categories.disable()
        _C._hist_configure(0, 0, False, 1, False, 0)
        _follow_annotations(False, False)
        _follow_compile_contexts(False)
        return
    if trace_alloc_record_context:
        context = 2
    elif record_context:
        context = 1
    else:
        context = 0
    n = _max_entries(trace_alloc_max_entries)
    _record_function(True)  # before anything changes: it may fail to build
    _C._hist_configure(2, context, bool(record_context_cpp), n, bool(clear_history), 0)
    _follow_annotations(True, False)


def recording_config() -> dict:
    """The configuration in force, with the argument names of record_memory_history."""
    c = _C._hist_config()
    enabled = {v: k for k, v in _ENABLED.items()}[c["enabled"]]
    return {
        "enabled": enabled,
        "context": {v: k for k, v in _CONTEXT.items()}[c["context"]] if enabled else None,
        "stacks": "all" if c["stacks_all"] else "python",
        "max_entries": c["max_entries"],
        "skip_actions": [a for i, a in enumerate(ACTIONS) if c["skip_mask"] >> i & 1],
        "categories": _categories.enabled(),
        "sample": _sample_in_force(c),
    }


def _sample_in_force(c: dict) -> dict | bool:
    """The sampling parameters in force (as sample= takes them), or False."""
    if not c["enabled"] or not c["sample_mean"]:
        return False
    return {"mean_bytes": c["sample_mean"], "threshold_bytes": c["sample_threshold"],
            "seed": c["sample_seed"]}


def _allocator_settings(settings: dict | None) -> dict:
    shim = _shim_state.loaded()
    if shim is not None and shim.exists():
        return shim.allocator_settings()  # torch's settings, which gpumem runs with
    conf = settings if settings is not None else _C.default_settings()
    try:
        return settings_for_snapshot(conf)
    except ConfError:
        # Settings given to an Allocator directly need not follow the
        # PYTORCH_CUDA_ALLOC_CONF rules; report them as they are.
        return snapshot_settings_of(conf, "")


def _annotations() -> list:
    rf = _record_function(False)
    return rf.annotations() if rf is not None else []


def _take(clamp: bool, augment_with_fx_traces: bool) -> dict:
    with_categories = _categories.enabled()
    segments, traces, settings, *first = _C._hist_snapshot(clamp=clamp, seqs=with_categories)
    snap = {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": _allocator_settings(settings),
        "external_annotations": _annotations(),
        "host_segments": [],  # gpumem does not manage pinned host memory
        "host_traces": [],
    }
    _release.shape_snapshot(snap)  # the keys of the torch release's snapshot
    sampled = _sample_in_force(_C._hist_config())
    if sampled:
        snap[_sampling.SNAPSHOT_KEY] = sampled
    if with_categories:
        snap[_categories.TABLE_KEY] = _categories.table(segments, traces, first[0])
    if augment_with_fx_traces:
        try:
            from torch._utils import _augment_memory_snapshot_stack_traces
        except ImportError as e:
            raise RuntimeError(f"augment_with_fx_traces=True needs torch ({e})") from None
        snap = _augment_memory_snapshot_stack_traces(snap)
    return snap


def snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict:
    """The state of every registered allocator, in torch's snapshot schema.

    Returns {'segments', 'device_traces', 'allocator_settings',
    'external_annotations', 'host_segments', 'host_traces'} (the last two
    always empty); device_traces has one list per device index,
    oldest event first.  While recording, a 'snapshot' marker is recorded
    after the trace is copied (so it shows up in the next snapshot, as in
    torch).  ``device`` is accepted for torch compatibility and ignored:
    every device is included.
    """
    return _take(False, augment_with_fx_traces)


def write_snapshot(snap: dict, filename: str | os.PathLike[str], *,
                   make_dirs: bool = False) -> str:
    """Pickle ``snap`` to ``filename`` atomically; return the path written.

    Note [Atomic writes] in gpumem/_atomic.py: a crash mid-dump leaves either
    no file or the previous complete one, never a truncated pickle; only a
    regular file is replaced (a symlink is followed and its target written;
    a directory, FIFO, socket or device is refused with an OSError and left
    as it is); temporaries of killed dumps are removed by later ones.
    make_dirs: create the directory (and its parents) first if it does not
    exist.
    """
    return write_atomic(filename, lambda f: pickle.dump(snap, f, protocol=PICKLE_PROTOCOL),
                        make_dirs=make_dirs)


def dump_snapshot(filename: str | os.PathLike[str] = "dump_snapshot.pickle",
                  augment_with_fx_traces: bool = False) -> None:
    """Write snapshot() to ``filename`` for torch.cuda._memory_viz / memory_viz.

    Pickle protocol 4 (the viewers read 2 to 4), written atomically and only
    over a regular file (see write_snapshot).  Every address, size, stream and
    time is an integer in [0, 2**53), so JavaScript reads it exactly; the only
    negative value is torch's own ``allocator_settings['max_split_size'] == -1``
    (unlimited).
    """
    write_snapshot(_take(True, augment_with_fx_traces), filename)


def set_memory_metadata(metadata: str) -> None:
    """Stamp ``metadata`` on every event this thread causes from now on.

    It shows up as ``user_metadata`` on trace entries (torch's
    _set_memory_metadata). Thread-local; '' clears it.
    """
    _C._hist_set_metadata(metadata)


def get_memory_metadata() -> str:
    """This thread's metadata string (see set_memory_metadata)."""
    return _C._hist_get_metadata()


def history_overhead_bytes() -> int:
    """Host memory gpumem's history uses: event rings plus interning tables."""
    return _C._hist_overhead_bytes()


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict:
    """torch.cuda.memory._snapshot."""
    return snapshot(device, augment_with_fx_traces)


def _dump_snapshot(filename: str | os.PathLike[str] = "dump_snapshot.pickle",
                   augment_with_fx_traces: bool = False) -> None:
    """torch.cuda.memory._dump_snapshot (atomic, protocol 4)."""
    dump_snapshot(filename, augment_with_fx_traces)


def _set_memory_metadata(metadata: str) -> None:
    """torch.cuda.memory._set_memory_metadata."""
    set_memory_metadata(metadata)


def _get_memory_metadata() -> str:
    """torch.cuda.memory._get_memory_metadata."""
    return get_memory_metadata()


def _allocation_traceback(data_ptr: int) -> list | None:
    """torch.cuda.memory._allocation_traceback: the stack that allocated the
    live allocation starting at data_ptr, or None (not found, or recorded
    without a stack)."""
    segments, _traces, _settings = _C._hist_snapshot(clamp=False)
    for seg in segments:
        for b in seg["blocks"]:
            if b["address"] == data_ptr and b["state"] == "active_allocated":
                return list(b["frames"]) or None
    return None


# torch._C's entry points, with their positional arguments (torch/cuda/memory.py
# calls them so; some code calls them directly).

def _cuda_record_memory_history(*args: Any) -> None:
    """torch._C._cuda_record_memory_history: as many positional arguments as
    the torch release's takes (gpumem.pytorch.release), in its order."""
    _release.check_c_record_history_call(args)
    names = [n for n in _release.record_history_params() if n != "device"]
    kw = dict(zip(names, args))
    kw["skip_actions"] = kw.get("skip_actions") or None
    _record_memory_history_impl(**kw)


def _cuda_record_memory_history_legacy(enabled: bool, record_context: bool = True,
                                       trace_alloc_max_entries: int = 1,
                                       trace_alloc_record_context: bool = False,
                                       record_context_cpp: bool = False,
                                       clear_history: bool = False, *ignored: Any) -> None:
    """torch._C._cuda_record_memory_history_legacy."""
    _record_memory_history_legacy(bool(enabled), record_context, trace_alloc_max_entries,
                                  trace_alloc_record_context, None, record_context_cpp,
                                  clear_history)


def _cuda_memory_snapshot(*args: Any) -> dict:
    """torch._C._cuda_memorySnapshot: no argument before torch 2.8; from then
    on one, None | (pool id) | (pool id, include_traces) (2.11 on)."""
    _release.check_c_snapshot_call(args)
    snap = snapshot()
    arg = args[0] if args else None
    if arg is None:
        return snap
    pool = tuple(arg[:2])
    if pool != (0, 0):  # only that private pool's segments, as torch
        snap["segments"] = [s for s in snap["segments"] if tuple(s["segment_pool_id"]) == pool]
    if len(arg) > 2 and not arg[2]:
        snap["device_traces"] = [[] for _ in snap["device_traces"]]
    return snap
