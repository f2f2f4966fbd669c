"""Snapshot reports behind ``gpumem summary`` and ``gpumem diff``: the live
bytes grouped by allocation site (at the peak, at the snapshot, over the whole
trace), the final segments' totals, per-step growth and the difference of two
snapshots.

Works on the device model of gpumem.snapshots.timeline (how allocations,
reserved memory and step markers are read from the trace is described
there).  Nothing here needs torch or the C extension.
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable

from gpumem import _C, _sampling
from gpumem.categories import report as category_report
from gpumem.snapshots.sites import StackTable
from gpumem.snapshots.timeline import (OPTIMIZER_ENDS, DeviceModel, block_bytes, block_frames,
                                       build_device, devices_of, end_blocks, pick_device)

__all__ = ["live_by_site", "model_by_site", "end_live", "segment_totals", "summarize", "diff"]

# ------------------------------------------------------------------ aggregation

def live_by_site(stacks: StackTable, items: Iterable[tuple[int, int]],
                 sampling: dict | None = None) -> dict[int, list]:
    """(size, stack) pairs grouped by site: site -> [count, bytes, largest,
    stack of largest, estimated].

    sampling: the snapshot's sampling parameters (gpumem._sampling), or
    None.  With them, an allocation below the threshold that has a stack
    counts 1 / p(size) times (p: its chance of having been sampled), so
    counts and bytes are unbiased estimates (floats; estimated is True),
    and one without a stack is left out: the estimates stand for it."""
    out: dict[int, list] = {}
    site_of = stacks.stack_site
    for size, stack in items:
        w, est = 1, False
        if sampling is not None and size < sampling["threshold_bytes"]:
            if not stack:
                continue
            w, est = _sampling.weight(size, sampling), True
        row = out.get(site_of[stack])
        if row is None:
            out[site_of[stack]] = [w, size * w, size, stack, est]
        else:
            row[0] += w
            row[1] += size * w
            row[4] = row[4] or est
            if size > row[2]:
                row[2], row[3] = size, stack
    return out


def model_by_site(m: DeviceModel, index: int | None,
                  sampling: dict | None = None) -> dict[int, list]:
    """live_by_site of m's allocations live just after trace entry ``index``,
    or of all those the trace made when index is None.  A columnar model
    without sampling is grouped by stack in C (_C.model_group), and the
    stacks merged into sites here: the same rows in the same order."""
    if not m.columnar or sampling is not None:
        chosen = (m.live_at(index) if index is not None
                  else (a for a, s in enumerate(m.a_start) if s >= 0))
        return live_by_site(m.stacks, ((m.a_size[a], m.a_stack[a]) for a in chosen), sampling)
    out: dict[int, list] = {}
    first_of_largest: dict[int, int] = {}
    site_of = m.stacks.stack_site
    for stack, count, nbytes, largest, at in _C.model_group(m.a_size, m.a_stack, m.a_start,
                                                            m.a_end, index):
        site = site_of[stack]
        row = out.get(site)
        if row is None:
            out[site] = [count, nbytes, largest, stack, False]
            first_of_largest[site] = at
            continue
        row[0] += count
        row[1] += nbytes
        if largest > row[2] or (largest == row[2] and at < first_of_largest[site]):
            row[2], row[3] = largest, stack
            first_of_largest[site] = at
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
                       for a in model.live_at(model.n_events - 1)}
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


def _site_row(stacks: StackTable, site_id: int, row: list, **extra: Any) -> dict:
    site = stacks.sites[site_id]
    out = {"site": site["label"], "kind": site["kind"], "count": round(row[0]),
           "bytes": round(row[1]), "largest": row[2], "stack": stacks.stack_lines(row[3], 12)}
    if row[4]:
        out["estimated"] = True
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
    smp = _sampling.snapshot_params(snap)
    row: dict[str, Any] = {"device": dev, "trace_events": m.n_events,
                           "allocations": m.trace_allocations(),
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
        row["top_live_at_peak"] = _top(stacks, model_by_site(m, peak_i, smp), top)
        row["top_total_allocated"] = _top(stacks, model_by_site(m, None, smp), top)
        row["live_before_trace"] = len(m.a_start) - m.trace_allocations()
        row["inconsistencies"] = m.inconsistencies
        span = [t for t in (m.times[0], m.times[-1]) if t is not None]
        row["duration_us"] = span[1] - span[0] if len(span) == 2 else None
    else:
        row.update(source="segments", peak_allocated=seg["allocated"], peak_index=None,
                   peak_time_us=None, peak_reserved=seg["reserved"],
                   reserved_at_peak=seg["reserved"],
                   fragmentation_at_peak=seg["reserved"] - seg["allocated"],
                   reserved_note="no trace: figures are the snapshot's own state")
        row["top_live_at_peak"] = _top(stacks, live_by_site(stacks, end_items, smp), top)
        row["top_total_allocated"] = []
    row["top_live_at_snapshot"] = _top(stacks, live_by_site(stacks, end_items, smp), top)
    row["ooms"] = [{"index": o["index"], "size": o["size"], "device_free": o["device_free"],
                    "site": stacks.site_of_stack(o["stack"])["label"]} for o in m.ooms]
    row["steps"], row["step_markers"], row["step_growth_sites"] = _steps(m, top, smp)
    if smp is not None:
        row["sampling"] = smp
    cats = category_report.device_report(snap, m)
    if cats is not None:
        row["categories"] = cats
    return row


def _rel_time(m: DeviceModel, index: int) -> int | None:
    t0 = next((t for t in m.times if t is not None), None)
    t = m.time_at(index)
    return None if t is None or t0 is None else t - t0


def _steps(m: DeviceModel, top: int,
           smp: dict | None = None) -> tuple[list[dict], str | None, list[dict]]:
    if not m.markers or not m.has_trace:
        return [], None, []
    bounds = [i for i, _ in m.markers]
    labels = [label for _, label in m.markers]
    if bounds[0] > 0:
        bounds.insert(0, 0)
        labels.insert(0, "step 1" if m.marker_source == OPTIMIZER_ENDS
                      else "(before the first marker)")
    ranges = [(k, start, bounds[k + 1] if k + 1 < len(bounds) else m.n_events)
              for k, start in enumerate(bounds)]
    ranges = [r for r in ranges if r[2] > r[1]]
    steps = []
    for (k, start, end), (count, nbytes, peak) in zip(ranges, _range_stats(m, ranges)):
        before = m.allocated_at(start - 1)
        after = m.allocated_at(end - 1)
        steps.append({"label": labels[k], "first_index": start, "last_index": end - 1,
                      "start_allocated": before, "end_allocated": after,
                      "growth": after - before, "peak": peak,
                      "allocations": count, "allocated_bytes": nbytes})
    growth: list[dict] = []
    if len(steps) >= 3:  # growth from the end of the first step to the end of the last
        first_end, last_end = steps[0]["last_index"], steps[-1]["last_index"]
        growth = _diff_groups(m.stacks, model_by_site(m, first_end, smp),
                              model_by_site(m, last_end, smp), m.stacks, top, grown_only=True)
    return steps, m.marker_source, growth


def _range_stats(m: DeviceModel, ranges: list[tuple[int, int, int]]) -> list[tuple]:
    """(allocations made, their bytes, peak allocated) in entries start .. end - 1
    of each (k, start, end)."""
    if m.columnar:
        return _C.model_ranges(m.a_start, m.a_size, m.allocated,
                               [(start, end) for _k, start, end in ranges])
    order = sorted((s, a) for a, s in enumerate(m.a_start) if s >= 0)
    starts = [s for s, _ in order]
    csum = [0]
    for _s, a in order:
        csum.append(csum[-1] + m.a_size[a])
    out = []
    for _k, start, end in ranges:
        lo, hi = bisect.bisect_left(starts, start), bisect.bisect_left(starts, end)
        out.append((hi - lo, csum[hi] - csum[lo], max(m.allocated[start:end])))
    return out


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
            if g[4]:
                row["estimated"] = True
            if side == "after":
                row["stack"] = table.stack_lines(g[3], 12)
    for row in rows.values():
        for k in ("before_count", "before_bytes", "after_count", "after_bytes"):
            row[k] = round(row[k])
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
        smp = _sampling.snapshot_params(snap)
        sides.append((stacks, live_by_site(stacks, items, smp), items, reserved, smp))
    (sb, gb, ib, rb, pb), (sa, ga, ia, ra, pa) = sides
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
        **({"sampling": {"before": pb, "after": pa}} if pb or pa else {}),
    }
