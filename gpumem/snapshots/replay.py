"""Replay the allocation trace of a PyTorch memory snapshot through gpumem's core.

For each device with a trace, build_ops() turns the trace into a flat list of
allocs and frees, and replay_snapshot() runs that list through the allocator
core on the virtual device (``gpumem._C.replay``) to measure how much
memory gpumem would have reserved for the same program, beside what torch
reserved.

Op-list semantics (one device):
* 'alloc' allocates the unrounded request ('size') on the entry's stream.
* A block is freed at its 'free_completed', when torch could reuse it; a
  'free_requested' that is never completed frees at the request.  Blocks are
  matched by address, and an address may be allocated again once freed.
* Traces that start mid-run: a free whose address had no earlier event in
  the trace frees a block that was live from the start; so is every active
  block in the snapshot's segments whose address never appears in an alloc
  or free event of the trace (an address the trace allocates or frees cannot
  have held one block the whole time).  All live-from-start blocks are
  allocated first, in address order.
* segment_* events rebuild torch's reserved-memory timeline; a run of
  segment_free/segment_unmap events is also one release op (Note [Replaying
  releases]).  'oom' entries give the device's capacity; 'snapshot' and
  unknown actions are skipped.

Note [Replaying releases]
Rationale: torch gives cached memory back during a run: torch.cuda.empty_cache(),
  the release-and-retry when the device is full (every cached segment goes
  back, then the allocation is tried again), garbage collection.  A replay
  that keeps everything cached reserves more than torch did (1.4x on a
  10-stream trace with 654 segment frees), and a replay on an unbounded
  device never meets the pressure the trace was recorded under.
Approach: where the trace shows torch releasing (a run of segment_free or
  segment_unmap events), the replay releases too: the core's empty_cache,
  which returns every wholly free segment and unmaps every wholly free
  granule, as torch's release_cached_blocks does.  The device's capacity is
  the one the trace was recorded on when it says (an 'oom' entry carries the
  free bytes: capacity = torch's reserved bytes then + device_free, the most
  over all of them), or --memory; the core's own release-and-retry then acts
  at the same pressure.  The settings are the recorded ones
  (recorded_conf: allocator_settings, else expandable segments when the
  trace maps or its segments are expandable).
Limitations: a partial release (garbage collection, or the release of
  oversize blocks only when max_split_size is set) is replayed as a full
  one; memory outside torch's allocator on the recording device is not
  known, so a capacity from 'oom' entries counts only torch's reserved and
  free bytes.
* A request larger than any allocator serves (gpumem._C.MAX_REQUEST, 2**62
  bytes) cannot be in a trace torch wrote: the file is refused as corrupt
  (SnapshotError).  The virtual device is at most MAX_CAPACITY.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass, field
from typing import Any

from gpumem._conf import (ConfError, conf_from_snapshot_settings, default_conf, format_conf,
                          parse_conf)
from gpumem.snapshots.timeline import end_blocks
from gpumem.snapshots.unpickle import (Limits, SnapshotError, load_snapshot, normalize_snapshot,
                                       short_int)

__all__ = ["ReplayError", "DeviceOps", "build_ops", "replay_device", "replay_snapshot",
           "replay_file", "traced_devices", "round_size", "recorded_conf", "NO_TRACE_NOTE",
           "OP_ALLOC", "OP_FREE", "OP_RELEASE"]

GiB = 1 << 30
DEFAULT_CAPACITY = 80 * GiB
#: The virtual device is never larger than this (8 TiB; its address
#: window is 16 TiB, with room for expandable reservations): a trace whose
#: peak is beyond it is replayed on it, and its largest requests fail.
MAX_CAPACITY = 1 << 43
OP_ALLOC = 0
OP_FREE = 1
OP_RELEASE = 2
_U64 = (1 << 64) - 1
_ACTIVE_STATES = ("active_allocated", "active_pending_free")
_SEGMENT_GROW = ("segment_alloc", "segment_map")
_SEGMENT_SHRINK = ("segment_free", "segment_unmap")
NO_TRACE_NOTE = ("no allocation trace recorded; record with "
                 "torch.cuda.memory._record_memory_history() before dumping")


class ReplayError(RuntimeError):
    """The replay could not run (for example, gpumem._C is not built)."""


def round_size(size: int) -> int:
    """The block size the allocator gives a request of ``size`` bytes with the
    default settings (512-byte multiples): the core's own rounding,
    gpumem._C.round_size."""
    return _load_c().round_size(size)


@dataclass
class DeviceOps:
    """The op list for one device, and what was learnt while building it."""

    device: int
    events: int = 0  # trace length
    ops: list = field(default_factory=list)  # (OP_ALLOC|OP_FREE, addr, size, stream)
    live_from_start_frees: int = 0  # blocks first seen freed by the trace
    live_from_start_blocks: int = 0  # active segment blocks the trace never touches
    trace_ooms: int = 0
    stray_frees: int = 0  # frees of an address that was not live (skipped)
    implicit_frees: int = 0  # an alloc at an address still live freed the old block
    skipped_events: int = 0  # snapshot markers and unknown actions
    segment_events: int = 0
    torch_reserved_end: int = 0
    torch_reserved_start: int = 0
    torch_peak_reserved: int | None = None
    peak_allocated_trace: int = 0
    releases: int = 0  # release ops: runs of segment_free/segment_unmap
    trace_capacity: int | None = None  # torch's reserved + device_free at its OOMs, the most

    def arrays(self) -> tuple[bytes, array, array, array]:
        """The op list in the form gpumem._C.replay takes."""
        actions = bytes(op[0] for op in self.ops)
        addrs = array("Q", (op[1] & _U64 for op in self.ops))
        sizes = array("Q", (op[2] for op in self.ops))
        streams = array("Q", (op[3] & _U64 for op in self.ops))
        return actions, addrs, sizes, streams


def _request(size: int, limit: int, name: str, where: str) -> int:
    """size, if an allocator could have been asked for it; else the file is corrupt."""
    if size > limit:
        raise SnapshotError(f"{name}: {where} asks for {short_int(size)} bytes, more than any "
                            f"allocator serves (at most {limit}); the file is corrupt, re-dump "
                            f"the snapshot")
    return size


def build_ops(snapshot: dict, device: int, name: str = "snapshot") -> DeviceOps:
    """Build the replay op list for ``device`` (see the module docstring).

    ``snapshot`` must be a normalised snapshot (load_snapshot's result, or
    any dict normalize_snapshot accepts); ``name`` names it in errors.
    """
    trace = snapshot["device_traces"][device] if device < len(snapshot["device_traces"]) else []
    out = DeviceOps(device=device, events=len(trace))
    limit = _load_c().MAX_REQUEST
    ops: list = []  # entries become None when a placeholder free is superseded
    live: dict[int, tuple[int, int]] = {}  # addr -> (size, stream), not yet freed
    pending: dict[int, int] = {}  # addr -> index of its free_requested placeholder
    seen: set[int] = set()  # addresses named by any alloc or free event
    start: dict[int, tuple[int, int]] = {}  # live-from-start blocks: addr -> (size, stream)
    running = high = 0  # reserved-memory change since the trace began, and its maximum
    oom_room: list[int] = []  # running + device_free at each 'oom' entry

    for i, entry in enumerate(trace):
        action = entry["action"]
        stream = entry.get("stream", 0)
        if action == "alloc":
            addr = entry["addr"]
            _request(entry["size"], limit, name, f"device_traces[{device}][{i}]")
            seen.add(addr)
            if addr in pending:  # never completed: its placeholder stays the free
                del pending[addr]
                del live[addr]
            elif addr in live:  # allocated twice without a free in between
                ops.append((OP_FREE, addr, 0, 0))
                del live[addr]
                out.implicit_frees += 1
            ops.append((OP_ALLOC, addr, entry["size"], stream))
            live[addr] = (entry["size"], stream)
        elif action == "free_requested":
            addr = entry["addr"]
            if addr in pending:
                out.stray_frees += 1
            elif addr in live or addr not in seen:
                if addr not in live:
                    size = _request(entry["size"], limit, name, f"device_traces[{device}][{i}]")
                    start[addr] = live[addr] = (size, stream)
                    out.live_from_start_frees += 1
                pending[addr] = len(ops)
                ops.append((OP_FREE, addr, 0, 0))
            else:
                out.stray_frees += 1
            seen.add(addr)
        elif action in ("free_completed", "free"):
            addr = entry["addr"]
            if addr in pending:
                ops[pending.pop(addr)] = None
                ops.append((OP_FREE, addr, 0, 0))
                del live[addr]
            elif addr in live:
                ops.append((OP_FREE, addr, 0, 0))
                del live[addr]
            elif addr not in seen:
                start[addr] = (_request(entry["size"], limit, name,
                                        f"device_traces[{device}][{i}]"), stream)
                out.live_from_start_frees += 1
                ops.append((OP_FREE, addr, 0, 0))
            else:
                out.stray_frees += 1
            seen.add(addr)
        elif action in _SEGMENT_GROW or action in _SEGMENT_SHRINK:
            out.segment_events += 1
            running += entry["size"] if action in _SEGMENT_GROW else -entry["size"]
            high = max(high, running)
            if action in _SEGMENT_SHRINK and not (ops and ops[-1] is not None
                                                  and ops[-1][0] == OP_RELEASE):
                ops.append((OP_RELEASE, 0, 0, 0))
                out.releases += 1
        elif action == "oom":
            out.trace_ooms += 1
            free = entry.get("device_free")
            if isinstance(free, int) and not isinstance(free, bool) and free >= 0:
                oom_room.append(running + free)
        else:
            out.skipped_events += 1

    from_segments = 0
    for addr, block, seg in end_blocks(snapshot, device):
        if block["state"] in _ACTIVE_STATES and addr not in seen:
            req = block.get("requested_size", 0)
            size = _request(req if req > 0 else block["size"], limit, name,
                            f"a block at {addr:#x} of device {device}'s segments")
            start[addr] = (size, seg.get("stream", 0))
            from_segments += 1
    out.live_from_start_blocks = from_segments

    out.ops = [(OP_ALLOC, a, size, stream) for a, (size, stream) in sorted(start.items())]
    out.ops.extend(op for op in ops if op is not None)

    out.torch_reserved_end = sum(seg["total_size"] for seg in snapshot["segments"]
                                 if seg["device"] == device)
    out.torch_reserved_start = out.torch_reserved_end - running
    if out.segment_events:
        out.torch_peak_reserved = out.torch_reserved_start + high
    if oom_room:
        out.trace_capacity = out.torch_reserved_start + max(oom_room)
    out.peak_allocated_trace = _peak_allocated(out.ops)
    return out


def _peak_allocated(ops: list) -> int:
    sizes: dict[int, int] = {}
    current = peak = 0
    rnd = _load_c().round_size if ops else None  # the core's rounding, default settings
    for action, addr, size, _stream in ops:
        if action == OP_RELEASE:
            continue
        if action == OP_ALLOC:
            rounded = rnd(size)
            sizes[addr] = rounded
            current += rounded
            peak = max(peak, current)
        else:
            current -= sizes.pop(addr)
    return peak


def _import_c():
    """gpumem._C for the replay itself (tests put a stand-in here)."""
    return _load_c()


def _load_c():
    try:
        from gpumem import _C  # noqa: PLC0415 - the extension is optional until replay runs
    except ImportError as e:
        raise ReplayError(
            f"the compiled extension gpumem._C is not available ({e}); build it with "
            f"'pip install -e .' in the gpumem source tree"
        ) from None
    return _C


def _ratio(num: int | None, den: int | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


def replay_device(ops: DeviceOps, conf: dict, *, capacity: int | None = None,
                  granularity: int | None = None) -> dict[str, Any]:
    """Run one device's op list through gpumem._C.replay and return its report row.

    ``capacity`` (bytes): the device's memory; by default the one the trace
    says (its 'oom' entries), else 80 GiB or 4x the trace's peak if larger."""
    c_mod = _import_c()
    source = "given"
    if capacity is None and ops.trace_capacity is not None:
        capacity, source = min(ops.trace_capacity, MAX_CAPACITY), "trace"
    elif capacity is None:
        capacity = min(max(DEFAULT_CAPACITY, 4 * ops.peak_allocated_trace), MAX_CAPACITY)
        source = "default"
    actions, addrs, sizes, streams = ops.arrays()
    kwargs: dict[str, Any] = {"capacity": capacity, "settings": conf}
    if granularity is not None:
        kwargs["granularity"] = granularity
    r = c_mod.replay(actions, addrs, sizes, streams, **kwargs)
    elapsed_ns = r["elapsed_ns"]
    peak_reserved = r["peak_reserved"]
    return {
        "device": ops.device,
        "events": ops.events,
        "ops": r["ops"],
        "peak_allocated": r["peak_allocated"],
        "peak_allocated_trace": ops.peak_allocated_trace,
        "gpumem_peak_reserved": peak_reserved,
        "ratio": _ratio(peak_reserved, r["peak_allocated"]),
        "num_device_alloc": r["num_device_alloc"],
        "num_device_free": r["num_device_free"],
        "num_alloc_retries": r["num_alloc_retries"],
        "torch_peak_reserved": ops.torch_peak_reserved,
        "torch_reserved_end": ops.torch_reserved_end,
        "ratio_vs_torch": _ratio(peak_reserved, ops.torch_peak_reserved),
        "live_from_start_frees": ops.live_from_start_frees,
        "live_from_start_blocks": ops.live_from_start_blocks,
        "trace_ooms": ops.trace_ooms,
        "replay_ooms": r["num_ooms"],
        "unknown_frees": r["unknown_frees"],
        "stray_frees": ops.stray_frees,
        "implicit_frees": ops.implicit_frees,
        "gpumem_reserved_end": r["reserved_end"],
        "allocated_end": r["allocated_end"],
        "expandable_active": r.get("expandable"),
        "capacity": capacity,
        "capacity_source": source,
        "releases": ops.releases,
        "elapsed_ns": elapsed_ns,
        "events_per_s": r["ops"] / (elapsed_ns / 1e9) if r["ops"] and elapsed_ns > 0 else None,
    }


def _as_conf(conf: dict | str) -> dict:
    if isinstance(conf, str):
        return parse_conf(conf)
    return parse_conf(format_conf(conf))  # validates and fills in defaults


def recorded_conf(snapshot: dict) -> tuple[dict, str]:
    """(settings, where they come from) for replaying ``snapshot`` as it was
    recorded: its allocator_settings when it has them, else expandable
    segments when it shows any (an expandable segment, segment_map events),
    else torch's defaults."""
    settings = snapshot.get("allocator_settings")
    if isinstance(settings, dict):
        try:
            return conf_from_snapshot_settings(settings), "from the snapshot's allocator_settings"
        except ConfError as e:
            return default_conf(), f"the snapshot's allocator_settings cannot be used: {e}"
    conf = default_conf()
    if any(seg.get("is_expandable") is True for seg in snapshot["segments"]) or any(
            e.get("action") in ("segment_map", "segment_unmap")
            for trace in snapshot["device_traces"] for e in trace):
        conf["expandable_segments"] = True
        return conf, "the snapshot records no settings; its segments are expandable"
    return conf, "the snapshot records no settings"


def traced_devices(snapshot: dict) -> list[int]:
    """Indexes of the devices whose trace is not empty."""
    return [d for d, trace in enumerate(snapshot["device_traces"]) if trace]


def replay_snapshot(snapshot: dict, conf: dict | str | None = None, *,
                    capacity: int | None = None, granularity: int | None = None,
                    file: str | None = None) -> dict[str, Any]:
    """Replay every device trace of ``snapshot`` through gpumem and report the peaks.

    ``conf`` is a settings dict from parse_conf (or a settings string); the
    default is the settings the snapshot was recorded with (recorded_conf).
    ``capacity`` is the virtual device size in bytes (default: the trace's,
    from its 'oom' entries, else 80 GiB, or 4x the trace's peak if larger).
    """
    snap = normalize_snapshot(snapshot, file or "snapshot")
    if conf is None:
        settings, source = recorded_conf(snap)
    else:
        settings, source = _as_conf(conf), "given"
    report: dict[str, Any] = {"file": file, "conf": format_conf(settings),
                              "conf_source": source, "devices": []}
    devices = traced_devices(snap)
    if not devices:
        report["note"] = NO_TRACE_NOTE
        return report
    for d in devices:
        report["devices"].append(replay_device(build_ops(snap, d, file or "snapshot"), settings,
                                               capacity=capacity, granularity=granularity))
    return report


def replay_file(path: str | os.PathLike[str], conf_text: str | None = None, *,
                capacity: int | None = None, limits: Limits | None = None) -> dict[str, Any]:
    """load_snapshot(path, limits), then replay_snapshot with the settings string
    ``conf_text`` (None: the settings the snapshot was recorded with)."""
    settings = None if conf_text is None else parse_conf(conf_text)
    snap = load_snapshot(path, limits)
    return replay_snapshot(snap, settings, capacity=capacity, file=os.fspath(path))
