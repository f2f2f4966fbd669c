"""The model of one device built from a snapshot's trace (DeviceModel), behind
``gpumem summary``, ``diff``, ``view`` and ``simulate``.

Input is a snapshot dict as gpumem.snapshots.unpickle.load_snapshot returns it
(torch's schema, see ../shared/notes/torch-snapshot-format.md).  Nothing here
needs torch.  What is computed from the model (summaries, diffs, per-site
tables) is in gpumem.snapshots.summary, above this module.

Two forms of the same model: a trace the loader read as _C.TraceColumns is
replayed by _C.trace_model into int64 arrays (Note [Native trace replay] in
csrc/python/trace_model.c: no Python object per entry or allocation, and
the passes over them are _C.model_*); any other trace (a plain list of dicts,
or values past 64 bits) by the Python loop below into lists.  Both follow the
rules below and give equal models (tests/test_native_model.py).

Model of one device (DeviceModel):
- Allocations come from the trace.  An ``alloc`` starts one; it ends at the
  ``free_completed`` (or legacy ``free``) of the same address, so a block
  whose free is still pending on another stream counts as live, like torch's
  Active Memory Timeline.  A free whose alloc is not in the trace (the ring
  buffer dropped it) and an active block of the final segments that the trace
  never names were live before the trace began: they become allocations with
  start -1.  Sizes are the requested sizes (the trace's ``size``).
- ``allocated[i]`` is the live total after trace entry i; reserved memory
  follows segment_alloc/map and segment_free/unmap, anchored at the final
  segments' total.  Without segment events it is that constant.
- An allocation site is the innermost Python frame of the user's own code
  (file:line:function; gpumem/snapshots/sites.py, and gpumem/snapshots/origin.py for what is
  library code, judged by where each file lives).

Step markers (summary's per-step growth), first source found wins:
user_metadata changes along the trace (torch's _set_memory_metadata, gpumem's
set_memory_metadata), then annotations ('user_defined' trace entries, or
external_annotations placed on the trace by time_us: the ENDs of torch's
automatic "Optimizer.step#..." regions when there are any, else every START),
then 'snapshot' trace entries (one is written each time a snapshot is taken
while recording).  'annotate' entries name one allocation, not a step, and are
not markers.

The loader (gpumem.snapshots.unpickle) checks what is read here without a guard:
the required fields, integers that fit in 64 bits, and the size limits of
Note [Hostile snapshots].  Every other oddity (missing, wrongly typed or
absurd optional fields) is tolerated, so any snapshot the loader accepts can
be analysed; a value shown in a report that is not a string or a number is
shown by its type (a shared nested list has an enormous repr).
"""

from __future__ import annotations

import bisect
from array import array
from typing import Any, Iterable

from gpumem import _C
from gpumem.snapshots.sites import StackTable, U64, opt_int as _opt_int, text_of as _text
from gpumem.snapshots.unpickle import SnapshotError

__all__ = [
    "AnalysisError", "StackTable", "DeviceModel", "ACTIVE_STATES", "devices_of", "pick_device",
    "build_device", "end_blocks", "block_frames", "block_bytes",
]

ACTIVE_STATES = ("active_allocated", "active_pending_free")
_GROW = ("segment_alloc", "segment_map")
_SHRINK = ("segment_free", "segment_unmap")
_FREE_DONE = ("free_completed", "free")
_ANNOTATIONS = ("user_defined",)   # torch 2.4's record_function regions in the trace


class AnalysisError(SnapshotError):
    """A request the snapshot cannot answer (for example a device it does not have)."""


# ------------------------------------------------------------------ devices

def devices_of(snap: dict) -> list[int]:
    """Devices with a non-empty trace or with segments."""
    devs = {d for d, t in enumerate(snap["device_traces"]) if t}
    devs.update(seg["device"] for seg in snap["segments"])
    return sorted(devs)


def pick_device(snap: dict, device: int | None, name: str) -> int:
    devs = devices_of(snap)
    if device is not None:
        if device not in devs:
            have = ", ".join(map(str, devs)) if devs else "none"
            raise AnalysisError(f"{name} has no data for device {device} (devices with data: "
                                f"{have})")
        return device
    if not devs:
        return 0
    traces = snap["device_traces"]

    def weight(d: int) -> tuple[int, int]:
        n = len(traces[d]) if d < len(traces) else 0
        return n, sum(s["total_size"] for s in snap["segments"] if s["device"] == d)
    return max(devs, key=weight)


def end_blocks(snap: dict, device: int) -> Iterable[tuple[int, dict, dict]]:
    """(address, block, segment) of every block of the device's final segments."""
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        addr = seg["address"]
        for block in seg.get("blocks", []):
            yield addr, block, seg
            addr += block["size"]


def block_frames(block: dict) -> Any:
    frames = block.get("frames")
    if frames:
        return frames
    hist = block.get("history")  # torch 2.0
    if isinstance(hist, list) and hist and isinstance(hist[-1], dict):
        return hist[-1].get("frames")
    return None


def block_bytes(block: dict) -> int:
    req = block.get("requested_size")
    if isinstance(req, int) and not isinstance(req, bool) and req > 0:
        return req
    return block["size"]


class DeviceModel:
    """One device's trace replayed into allocations and memory curves."""

    def __init__(self, device: int, stacks: StackTable) -> None:
        self.device = device
        self.stacks = stacks
        self.n_events = 0
        self.a_start: list[int] = []   # trace index of the alloc, -1: live before the trace
        self.a_end: list[int] = []     # trace index of the completed free, n_events: still live
        self.a_size: list[int] = []
        self.a_addr: list[int] = []
        self.a_stack: list[int] = []
        self.allocated: list[int] = []  # live bytes after each trace entry
        self.reserved: list[int] | None = None
        self.reserved_end = 0
        self.baseline = 0               # bytes live before the first entry
        self.times: list[int | None] = []
        self.ooms: list[dict] = []
        self.markers: list[tuple[int, str]] = []
        self.marker_source = ""
        self.peak_index = -1
        self.peak = 0
        self.inconsistencies = 0

        self.columnar = False           # arrays from _C.trace_model, not lists

    @property
    def has_trace(self) -> bool:
        return self.n_events > 0

    def trace_allocations(self) -> int:
        """Allocations the trace made (the others have start -1: live before it)."""
        return len(self.a_start) - self.a_start.count(-1)

    def _new(self, start: int, end: int, size: int, addr: int, stack: int) -> int:
        self.a_start.append(start)
        self.a_end.append(end)
        self.a_size.append(size)
        self.a_addr.append(addr)
        self.a_stack.append(stack)
        return len(self.a_size) - 1

    def allocated_at(self, index: int) -> int:
        if index < 0 or not self.allocated:
            return self.baseline
        return self.allocated[min(index, len(self.allocated) - 1)]

    def reserved_at(self, index: int) -> int | None:
        if self.reserved is None:
            return None
        return self.reserved[max(0, min(index, len(self.reserved) - 1))]

    def live_at(self, index: int) -> list[int] | array:
        """Allocations live just after trace entry ``index`` (-1: before the first);
        live_at(n_events - 1) are those still live at the end (start <= the last
        entry always)."""
        if self.columnar:
            return _int_array("q", _C.model_live(self.a_start, self.a_end, index))
        return [a for a, (s, e) in enumerate(zip(self.a_start, self.a_end)) if s <= index < e]

    def known_times(self) -> tuple[Any, Any]:
        """(times, their entry indexes) of the entries that have a time."""
        if self.columnar and self.times.mask is None:
            return self.times.values, range(self.n_events)
        known = [(t, i) for i, t in enumerate(self.times) if t is not None]
        return [t for t, _ in known], [i for _, i in known]

    def time_at(self, index: int) -> int | None:
        if 0 <= index < len(self.times):
            return self.times[index]
        return None


class _Times:
    """A columnar model's per-entry times: item i is an int, or None where
    entry i has no time (mask[i] == 0; no mask: every entry has one)."""

    __slots__ = ("values", "mask")

    def __init__(self, values: array, mask: bytearray | None) -> None:
        self.values, self.mask = values, mask

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> int | None:
        if self.mask is not None and not self.mask[i]:
            return None
        return self.values[i]

    def __iter__(self):
        if self.mask is None:
            return iter(self.values)
        return (v if k else None for v, k in zip(self.values, self.mask))


def _int_array(code: str, data: bytearray) -> array:
    out = array(code)
    out.frombytes(data)
    return out


def build_device(snap: dict, device: int, stacks: StackTable | None = None) -> DeviceModel:
    """Replay ``device``'s trace (see the module docstring)."""
    stacks = stacks or StackTable()
    m = DeviceModel(device, stacks)
    traces = snap["device_traces"]
    trace = traces[device] if device < len(traces) else []
    if isinstance(trace, _C.TraceColumns) and _build_native(snap, m, trace):
        return m
    n = m.n_events = len(trace)
    live: dict[int, int] = {}      # addr -> allocation index
    seen: set[int] = set()
    cur = 0                        # bytes since the start, without the baseline
    allocated = [0] * n
    times: list[int | None] = [None] * n
    seg_delta = [0] * n
    seg_events = 0
    intern = stacks.intern
    meta_runs: list[tuple[int, str]] = []
    last_meta: str | None = None
    annots: list[tuple[int, str]] = []
    snaps: list[tuple[int, str]] = []
    a_start, a_end, a_size, a_addr, a_stack = m.a_start, m.a_end, m.a_size, m.a_addr, m.a_stack
    seen_add = seen.add
    for i, e in enumerate(trace):   # the hot loop: one pass, locals only
        action = e["action"]
        get = e.get
        t = get("time_us")
        if t.__class__ is int and -U64 < t < U64:
            times[i] = t
        meta = get("user_metadata")
        if meta is not None:
            if meta.__class__ is not str:
                meta = _text(meta, 120)
            if meta != last_meta:
                meta_runs.append((i, meta))
                last_meta = meta
        if action == "free_requested" or action in _FREE_DONE:
            addr = e["addr"]
            a = live.get(addr)
            if a is None and addr not in seen:  # allocated before the trace began
                a = m._new(-1, n, e["size"], addr, intern(get("frames")))
                m.baseline += e["size"]
                live[addr] = a
                seen_add(addr)
            if action != "free_requested":
                if a is None:
                    m.inconsistencies += 1
                else:
                    del live[addr]
                    a_end[a] = i
                    cur -= a_size[a]
        elif action == "alloc":
            addr = e["addr"]
            old = live.pop(addr, None)
            if old is not None:  # allocated twice without a free: end the first
                a_end[old] = i
                cur -= a_size[old]
                m.inconsistencies += 1
            size = e["size"]
            live[addr] = len(a_size)
            a_start.append(i)
            a_end.append(n)
            a_size.append(size)
            a_addr.append(addr)
            a_stack.append(intern(get("frames")))
            seen_add(addr)
            cur += size
        elif action in _GROW:
            seg_delta[i] = e["size"]
            seg_events += 1
        elif action in _SHRINK:
            seg_delta[i] = -e["size"]
            seg_events += 1
        elif action == "oom":
            m.ooms.append({"index": i, "size": e["size"], "device_free": e["device_free"],
                           "stack": intern(get("frames")), "time_us": times[i]})
        elif action == "snapshot":
            snaps.append((i, f"after snapshot {len(snaps) + 1}"))
        elif action in _ANNOTATIONS:
            label = get("user_metadata") or get("name") or action
            annots.append((i, _text(label, 120)))
        allocated[i] = cur
    for addr, block, _seg in end_blocks(snap, device):
        if block["state"] in ACTIVE_STATES and addr not in seen:
            size = block_bytes(block)
            m._new(-1, n, size, addr, intern(block_frames(block)))
            m.baseline += size
    base = m.baseline
    m.allocated = [v + base for v in allocated]
    m.times = times
    m.reserved_end = sum(s["total_size"] for s in snap["segments"] if s["device"] == device)
    if seg_events:
        run, out = 0, []
        for d in seg_delta:
            run += d
            out.append(run)
        start = m.reserved_end - run
        m.reserved = [start + v for v in out]
    if n:
        m.peak = max(m.allocated)
        m.peak_index = m.allocated.index(m.peak)
    else:
        m.peak = base
    _pick_markers(m, snap, meta_runs, annots, snaps)
    return m


def _build_native(snap: dict, m: DeviceModel, trace: Any) -> bool:
    """build_device by _C.trace_model; False (m untouched) when it declines."""
    ends = [(addr, block) for addr, block, _seg in end_blocks(snap, m.device)
            if block["state"] in ACTIVE_STATES]
    addrs = [(addr, block_bytes(block)) for addr, block in ends]
    reserved_end = sum(s["total_size"] for s in snap["segments"] if s["device"] == m.device)
    r = _C.trace_model(trace, addrs, reserved_end)
    if r is None:
        return False
    intern = m.stacks.intern
    sids = [intern(frames) for frames in r.pop("stack_objs")]
    sids += [intern(block_frames(ends[j][1])) for j in r["ends_added"]]
    m.columnar = True
    m.n_events = r["n"]
    for name, code in (("a_start", "q"), ("a_end", "q"), ("a_size", "Q"), ("a_addr", "Q"),
                       ("a_stack", "q"), ("allocated", "q")):
        setattr(m, name, _int_array(code, r.pop(name)))
    _C.model_remap(m.a_stack, sids)
    m.times = _Times(_int_array("q", r.pop("times")), r["times_mask"])
    reserved, m.baseline, m.peak, m.peak_index = r["tail"]
    m.reserved = None if reserved is None else _int_array("q", reserved)
    m.reserved_end = reserved_end
    m.inconsistencies = r["inconsistencies"]
    for i in r["ooms"]:
        e = trace[i]
        m.ooms.append({"index": i, "size": e["size"], "device_free": e["device_free"],
                       "stack": intern(e.get("frames")), "time_us": m.times[i]})
    meta_runs: list[tuple[int, str]] = []
    last = None
    for i, meta in r["meta_runs"]:   # where the value changes; equal texts are one run
        if meta.__class__ is not str:
            meta = _text(meta, 120)
        if meta != last:
            meta_runs.append((i, meta))
            last = meta
    annots = []
    for i in r["annotations"]:
        e = trace[i]
        annots.append((i, _text(e.get("user_metadata") or e.get("name") or e["action"], 120)))
    snaps = [(i, f"after snapshot {k + 1}") for k, i in enumerate(r["snapshots"])]
    _pick_markers(m, snap, meta_runs, annots, snaps)
    return True


def _pick_markers(m: DeviceModel, snap: dict, meta_runs: list, annots: list, snaps: list) -> None:
    if len(meta_runs) > 1 or (meta_runs and meta_runs[0][1]):
        m.markers = [(i, label or "(no metadata)") for i, label in meta_runs]
        m.marker_source = "user_metadata changes"
        return
    ext = snap.get("external_annotations")
    source = "annotations"
    if not annots and isinstance(ext, list) and ext and any(t is not None for t in m.times):
        annots, source = _annotation_markers(m, ext)
    if annots:
        m.markers = annots
        m.marker_source = source
    elif snaps:
        m.markers = snaps
        m.marker_source = "'snapshot' trace entries"


OPTIMIZER_ENDS = "ends of Optimizer.step regions"


def _record_step(name: str) -> bool:
    """gpumem.record's own marker, 'step N' (rec.step(), counted from 0)."""
    return name.startswith("step ") and name[5:].isdigit()


def _annotation_markers(m: DeviceModel, ext: list) -> tuple[list[tuple[int, str]], str]:
    """external_annotations placed on the trace by time_us, and where they came from.

    gpumem.record's 'step N' STARTs are the user's own count, so they win.
    Else the END of torch's automatic "Optimizer.step#..." region ends a
    training step: the k-th END closes step k (the step after it is k + 1,
    and what follows the last one is "after step N", not a step of its own);
    otherwise every region's START is a boundary.
    """
    regions = []
    for a in ext:
        if not isinstance(a, dict) or _opt_int(a.get("device"), m.device) != m.device:
            continue
        t = _opt_int(a.get("time_us"))
        if t is not None:
            regions.append((t, _text(a.get("stage"), 10), _text(a.get("name"), 120)))
    if not regions:
        return [], "annotations"
    ts, at = m.known_times()
    own = [r for r in regions if r[1] == "START" and _record_step(r[2])]
    steps = [r for r in regions if r[2].startswith("Optimizer.step") and r[1] == "END"]
    out = []
    if steps and not own:
        for k, (t, _stage, _name) in enumerate(sorted(steps)):
            j = bisect.bisect_right(ts, t)
            if j < len(at):
                out.append((at[j], f"step {k + 2}" if k + 1 < len(steps)
                            else f"after step {k + 1}"))
        return out, OPTIMIZER_ENDS
    for t, stage, name in sorted(own or regions):
        j = bisect.bisect_left(ts, t)
        if stage in ("START", "") and j < len(at):
            out.append((at[j], name))
    return out, "gpumem.record's steps" if own else "annotations"
