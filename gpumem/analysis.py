"""Snapshot analysis behind ``gpumem summary``, ``gpumem diff`` and ``gpumem view``.

Input is a snapshot dict as gpumem._unpickle.load_snapshot returns it (torch's
schema, see ../shared/notes/torch-snapshot-format.md).  Nothing here needs torch
or the C extension.

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
  (file:line:function; gpumem/_sites.py, and gpumem/_origin.py for what is
  library code, judged by where each file lives).

Step markers (summary's per-step growth), first source found wins:
user_metadata changes along the trace (torch's _set_memory_metadata, gpumem's
set_memory_metadata), then annotations ('user_defined' trace entries, or
external_annotations placed on the trace by time_us: the ENDs of torch's
automatic "Optimizer.step#..." regions when there are any, else every START),
then 'snapshot' trace entries (one is written each time a snapshot is taken
while recording).  'annotate' entries name one allocation, not a step, and are
not markers.

The loader (gpumem._unpickle) checks what is read here without a guard:
the required fields, integers that fit in 64 bits, and the size limits of
Note [Hostile snapshots].  Every other oddity (missing, wrongly typed or
absurd optional fields) is tolerated, so any snapshot the loader accepts can
be analysed; a value shown in a report that is not a string or a number is
shown by its type (a shared nested list has an enormous repr).
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable

from . import category_report
from ._origin import is_library_file  # noqa: F401 - part of this module's interface
from ._sites import StackTable, U64, opt_int as _opt_int, text_of as _text
from ._unpickle import SnapshotError

__all__ = [
    "AnalysisError", "StackTable", "DeviceModel", "devices_of", "pick_device", "build_device",
    "end_blocks", "live_by_site", "summarize", "diff",
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

    @property
    def has_trace(self) -> bool:
        return self.n_events > 0

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

    def live_at(self, index: int) -> list[int]:
        """Allocations live just after trace entry ``index`` (-1: before the first)."""
        return [a for a, (s, e) in enumerate(zip(self.a_start, self.a_end)) if s <= index < e]

    def time_at(self, index: int) -> int | None:
        if 0 <= index < len(self.times):
            return self.times[index]
        return None


def build_device(snap: dict, device: int, stacks: StackTable | None = None) -> DeviceModel:
    """Replay ``device``'s trace (see the module docstring)."""
    stacks = stacks or StackTable()
    m = DeviceModel(device, stacks)
    traces = snap["device_traces"]
    trace = traces[device] if device < len(traces) else []
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


def _pick_markers(m: DeviceModel, snap: dict, meta_runs: list, annots: list, snaps: list) -> None:
    if len(meta_runs) > 1 or (meta_runs and meta_runs[0][1]):
        m.markers = [(i, label or "(no metadata)") for i, label in meta_runs]
        m.marker_source = "user_metadata changes"
        return
    ext = snap.get("external_annotations")
    source = "annotations"
    if not annots and isinstance(ext, list) and any(t is not None for t in m.times):
        annots, source = _annotation_markers(m, ext)
    if annots:
        m.markers = annots
        m.marker_source = source
    elif snaps:
        m.markers = snaps
        m.marker_source = "'snapshot' trace entries"


_OPTIMIZER_ENDS = "ends of Optimizer.step regions"


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
    known = [(t, i) for i, t in enumerate(m.times) if t is not None]
    ts = [t for t, _ in known]
    regions = []
    for a in ext:
        if not isinstance(a, dict) or _opt_int(a.get("device"), m.device) != m.device:
            continue
        t = _opt_int(a.get("time_us"))
        if t is not None:
            regions.append((t, _text(a.get("stage"), 10), _text(a.get("name"), 120)))
    own = [r for r in regions if r[1] == "START" and _record_step(r[2])]
    steps = [r for r in regions if r[2].startswith("Optimizer.step") and r[1] == "END"]
    out = []
    if steps and not own:
        for k, (t, _stage, _name) in enumerate(sorted(steps)):
            j = bisect.bisect_right(ts, t)
            if j < len(known):
                out.append((known[j][1], f"step {k + 2}" if k + 1 < len(steps)
                            else f"after step {k + 1}"))
        return out, _OPTIMIZER_ENDS
    for t, stage, name in sorted(own or regions):
        j = bisect.bisect_left(ts, t)
        if stage in ("START", "") and j < len(known):
            out.append((known[j][1], name))
    return out, "gpumem.record's steps" if own else "annotations"


# ------------------------------------------------------------------ aggregation

def live_by_site(stacks: StackTable, items: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    """(size, stack) pairs grouped by site: site -> [count, bytes, largest, stack of largest]."""
    out: dict[int, list[int]] = {}
    site_of = stacks.stack_site
    for size, stack in items:
        row = out.get(site_of[stack])
        if row is None:
            out[site_of[stack]] = [1, size, size, stack]
        else:
            row[0] += 1
            row[1] += size
            if size > row[2]:
                row[2], row[3] = size, stack
    return out


def end_live(snap: dict, device: int | None, stacks: StackTable,
             models: dict[int, DeviceModel] | None = None) -> list[tuple[int, int]]:
    """(bytes, stack) of every allocated block in the final segments.

    Blocks without frames take the stack of the trace's still-live alloc at
    the same address when there is one.
    """
    out = []
    for seg_dev in sorted({s["device"] for s in snap["segments"]}):
        if device is not None and seg_dev != device:
            continue
        by_addr = {}
        model = (models or {}).get(seg_dev)
        if model is not None:
            by_addr = {model.a_addr[a]: model.a_stack[a]
                       for a, end in enumerate(model.a_end) if end >= model.n_events}
        for addr, block, _seg in end_blocks(snap, seg_dev):
            if block["state"] != "active_allocated":
                continue
            stack = stacks.intern(block_frames(block)) or by_addr.get(addr, 0)
            out.append((block_bytes(block), stack))
    return out


def segment_totals(snap: dict, device: int) -> dict:
    """Reserved, allocated, pending-free and free bytes of the final segments."""
    tot = {"segments": 0, "reserved": 0, "allocated": 0, "pending_free": 0, "free": 0,
           "largest_free_block": 0, "free_in_used_segments": 0}
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        tot["segments"] += 1
        tot["reserved"] += seg["total_size"]
        seg_free, used = 0, False
        for block in seg.get("blocks", []):
            size, state = block["size"], block["state"]
            if state == "active_allocated":
                tot["allocated"] += size
                used = True
            elif state == "active_pending_free":
                tot["pending_free"] += size
                used = True
            else:
                seg_free += size
                tot["largest_free_block"] = max(tot["largest_free_block"], size)
        tot["free"] += seg_free
        if used:
            tot["free_in_used_segments"] += seg_free
    return tot


def _site_row(stacks: StackTable, site_id: int, row: list[int], **extra: Any) -> dict:
    site = stacks.sites[site_id]
    out = {"site": site["label"], "kind": site["kind"], "count": row[0], "bytes": row[1],
           "largest": row[2], "stack": stacks.stack_lines(row[3], 12)}
    for k in ("filename", "line", "name"):
        if k in site:
            out[k] = site[k]
    out.update(extra)
    return out


def _top(stacks: StackTable, groups: dict[int, list[int]], top: int) -> list[dict]:
    order = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
    return [_site_row(stacks, sid, row) for sid, row in order[:top]]


# ------------------------------------------------------------------ summary

def summarize(snap: dict, name: str, top: int = 10, device: int | None = None) -> dict:
    """The report behind ``gpumem summary`` (JSON-ready)."""
    devs = devices_of(snap) if device is None else [pick_device(snap, device, name)]
    stacks = StackTable()
    report = {"file": name, "devices": []}
    for dev in devs:
        report["devices"].append(_summarize_device(snap, dev, stacks, top))
    if not devs:
        report["note"] = "the snapshot holds no segments and no trace events"
    return report


def _summarize_device(snap: dict, dev: int, stacks: StackTable, top: int) -> dict:
    m = build_device(snap, dev, stacks)
    seg = segment_totals(snap, dev)
    row: dict[str, Any] = {"device": dev, "trace_events": m.n_events,
                           "allocations": sum(1 for s in m.a_start if s >= 0),
                           "at_snapshot": seg}
    end_items = end_live(snap, dev, stacks, {dev: m})
    if m.has_trace:
        peak_i = m.peak_index
        if m.reserved is not None:
            peak_reserved, res_at_peak, note = max(m.reserved), m.reserved_at(peak_i), None
        elif seg["reserved"] >= m.peak:
            peak_reserved = res_at_peak = seg["reserved"]
            note = ("no segment events in the trace: reserved memory is taken as constant, "
                    "at the snapshot's value")
        else:
            peak_reserved = res_at_peak = None
            note = ("no segment events in the trace and the snapshot reserves less than the "
                    "peak (memory was released): reserved memory at the peak is unknown")
        row.update(source="trace", peak_allocated=m.peak, peak_index=peak_i,
                   peak_time_us=_rel_time(m, peak_i), peak_reserved=peak_reserved,
                   reserved_at_peak=res_at_peak, reserved_note=note)
        row["fragmentation_at_peak"] = (res_at_peak - m.peak if res_at_peak is not None
                                        and res_at_peak >= m.peak else None)
        peak_live = [(m.a_size[a], m.a_stack[a]) for a in m.live_at(peak_i)]
        row["top_live_at_peak"] = _top(stacks, live_by_site(stacks, peak_live), top)
        total = live_by_site(stacks, ((m.a_size[a], m.a_stack[a])
                                      for a, s in enumerate(m.a_start) if s >= 0))
        row["top_total_allocated"] = _top(stacks, total, top)
        row["live_before_trace"] = sum(1 for s in m.a_start if s < 0)
        row["inconsistencies"] = m.inconsistencies
        span = [t for t in (m.times[0], m.times[-1]) if t is not None]
        row["duration_us"] = span[1] - span[0] if len(span) == 2 else None
    else:
        row.update(source="segments", peak_allocated=seg["allocated"], peak_index=None,
                   peak_time_us=None, peak_reserved=seg["reserved"],
                   reserved_at_peak=seg["reserved"],
                   fragmentation_at_peak=seg["reserved"] - seg["allocated"],
                   reserved_note="no trace: figures are the snapshot's own state")
        row["top_live_at_peak"] = _top(stacks, live_by_site(stacks, end_items), top)
        row["top_total_allocated"] = []
    row["top_live_at_snapshot"] = _top(stacks, live_by_site(stacks, end_items), top)
    row["ooms"] = [{"index": o["index"], "size": o["size"], "device_free": o["device_free"],
                    "site": stacks.site_of_stack(o["stack"])["label"]} for o in m.ooms]
    row["steps"], row["step_markers"], row["step_growth_sites"] = _steps(m, top)
    cats = category_report.device_report(snap, m)
    if cats is not None:
        row["categories"] = cats
    return row


def _rel_time(m: DeviceModel, index: int) -> int | None:
    t0 = next((t for t in m.times if t is not None), None)
    t = m.time_at(index)
    return None if t is None or t0 is None else t - t0


def _steps(m: DeviceModel, top: int) -> tuple[list[dict], str | None, list[dict]]:
    if not m.markers or not m.has_trace:
        return [], None, []
    bounds = [i for i, _ in m.markers]
    labels = [label for _, label in m.markers]
    if bounds[0] > 0:
        bounds.insert(0, 0)
        labels.insert(0, "step 1" if m.marker_source == _OPTIMIZER_ENDS
                      else "(before the first marker)")
    order = sorted((s, a) for a, s in enumerate(m.a_start) if s >= 0)
    starts = [s for s, _ in order]
    csum = [0]
    for _s, a in order:
        csum.append(csum[-1] + m.a_size[a])
    steps = []
    for k, start in enumerate(bounds):
        end = bounds[k + 1] if k + 1 < len(bounds) else m.n_events
        if end <= start:
            continue
        before = m.allocated_at(start - 1)
        after = m.allocated_at(end - 1)
        lo, hi = bisect.bisect_left(starts, start), bisect.bisect_left(starts, end)
        steps.append({"label": labels[k], "first_index": start, "last_index": end - 1,
                      "start_allocated": before, "end_allocated": after,
                      "growth": after - before, "peak": max(m.allocated[start:end]),
                      "allocations": hi - lo, "allocated_bytes": csum[hi] - csum[lo]})
    growth: list[dict] = []
    if len(steps) >= 3:  # growth from the end of the first step to the end of the last
        first_end, last_end = steps[0]["last_index"], steps[-1]["last_index"]
        growth = _diff_groups(m.stacks,
                              live_by_site(m.stacks, ((m.a_size[a], m.a_stack[a])
                                                      for a in m.live_at(first_end))),
                              live_by_site(m.stacks, ((m.a_size[a], m.a_stack[a])
                                                      for a in m.live_at(last_end))),
                              m.stacks, top, grown_only=True)
    return steps, m.marker_source, growth


# ------------------------------------------------------------------ diff

def _diff_groups(sb: StackTable, before: dict[int, list[int]], after: dict[int, list[int]],
                 sa: StackTable, top: int, grown_only: bool = False) -> list[dict]:
    """Rows keyed by site label (the two snapshots have separate stack tables)."""
    rows: dict[str, dict] = {}
    for table, groups, side in ((sb, before, "before"), (sa, after, "after")):
        for site_id, g in groups.items():
            site = table.sites[site_id]
            key = site["label"]
            row = rows.get(key)
            if row is None:
                row = rows[key] = {"site": key, "kind": site["kind"], "before_count": 0,
                                   "before_bytes": 0, "after_count": 0, "after_bytes": 0,
                                   "stack": table.stack_lines(g[3], 12)}
                for k in ("filename", "line", "name"):
                    if k in site:
                        row[k] = site[k]
            row[f"{side}_count"] += g[0]
            row[f"{side}_bytes"] += g[1]
            if side == "after":
                row["stack"] = table.stack_lines(g[3], 12)
    for row in rows.values():
        row["delta_count"] = row["after_count"] - row["before_count"]
        row["delta_bytes"] = row["after_bytes"] - row["before_bytes"]
    out = sorted(rows.values(), key=lambda r: (-r["delta_bytes"], -r["delta_count"], r["site"]))
    if grown_only:
        out = [r for r in out if r["delta_bytes"] > 0 or r["delta_count"] > 0]
    return out[:top] if top else out


def diff(before: dict, after: dict, names: tuple[str, str], top: int = 10,
         device: int | None = None) -> dict:
    """The report behind ``gpumem diff``: live allocations at each snapshot by site."""
    if device is not None:
        for snap, name in zip((before, after), names):
            if device not in devices_of(snap):
                pick_device(snap, device, name)  # raises with the devices it has
    sides = []
    for snap in (before, after):
        stacks = StackTable()
        models = {d: build_device(snap, d, stacks) for d in devices_of(snap)
                  if d < len(snap["device_traces"]) and snap["device_traces"][d]}
        items = end_live(snap, device, stacks, models)
        reserved = sum(s["total_size"] for s in snap["segments"]
                       if device is None or s["device"] == device)
        sides.append((stacks, live_by_site(stacks, items), items, reserved))
    (sb, gb, ib, rb), (sa, ga, ia, ra) = sides
    rows = _diff_groups(sb, gb, ga, sa, 0)
    grown = [r for r in rows if r["delta_bytes"] > 0 or (r["delta_bytes"] == 0
                                                        and r["delta_count"] > 0)]
    shrunk = [r for r in rows if r["delta_bytes"] < 0 or (r["delta_bytes"] == 0
                                                         and r["delta_count"] < 0)]
    shrunk.sort(key=lambda r: (r["delta_bytes"], r["delta_count"], r["site"]))
    return {
        "before": names[0], "after": names[1], "device": device,
        "live_before": {"count": len(ib), "bytes": sum(s for s, _ in ib)},
        "live_after": {"count": len(ia), "bytes": sum(s for s, _ in ia)},
        "reserved_before": rb, "reserved_after": ra,
        "sites_compared": len(rows),
        "grew": grown[:top], "grew_total": len(grown),
        "shrank": shrunk[:top], "shrank_total": len(shrunk),
        "unchanged": len(rows) - len(grown) - len(shrunk),
    }
