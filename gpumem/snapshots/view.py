"""``gpumem view``: one self-contained HTML page for a memory snapshot.

The page works offline: its script and style (gpumem/viewer_static, written
for gpumem) and the data are inlined, and it loads nothing.  It shows one
device: a header with the peaks, the allocated-memory timeline with each
allocation's stack on hover, the segments with their blocks (allocated,
pending free, free), and a sortable table of allocation sites; for a snapshot
recorded with categories, also the allocated memory stacked by category
(gpumem.categories.report, drawn by viewer_static/viewer_categories.js).

Scale: the data is reduced here, in Python, before it is embedded, so a
1,000,000-event trace gives a page of under 1 MB that headless Chromium
draws in about a third of a second (docs/benchmarks.md, issue 34's fourth
part; the page paints its dense curves a pixel column at a time, Note
[Pixel columns] in viewer_static/viewer.js).  Note [Timeline aggregation]:
- Rationale: a browser cannot draw one polygon per allocation for hundreds of
  thousands of allocations (torch's MemoryViz caps itself at 15,000).
- Approach: the timeline is sampled at most MAX_SAMPLES points.  With more
  trace entries than that, the trace is cut into MAX_SAMPLES/2 equal ranges
  and each contributes its highest and its lowest point, so every peak
  (the global one included) is exact.  The MAX_BANDS largest allocations that
  are live at some sample are drawn as their own bands, stacked in allocation
  order; all the others are folded into one grey "small allocations" band on
  top of them.  The page states both numbers.
- Limitations: an allocation that lives only between two samples is not
  drawn (the totals at the samples are still exact); zooming magnifies the
  samples, it does not fetch more.
The segment view merges runs of small blocks when a device has more than
MAX_BLOCKS blocks, and stacks beyond MAX_STACKS are left out; when the data
still exceeds MAX_JSON bytes every cap is halved and the page rebuilt.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from typing import Any

from gpumem import _C, _sampling
from gpumem._atomic import write_atomic
from gpumem.categories import report as category_report
from gpumem.snapshots.sites import text_of
from gpumem.snapshots.summary import end_live, live_by_site, model_by_site, segment_totals
from gpumem.snapshots.timeline import (AnalysisError, DeviceModel, StackTable, block_bytes,
                                       block_frames, build_device, devices_of, pick_device)
from gpumem.snapshots.unpickle import Limits, gc_paused, load_snapshot

__all__ = ["build_payload", "render_html", "write_view", "default_output"]

MAX_SAMPLES = 10000
MAX_BANDS = 5000
BAND_SAMPLE_BUDGET = 30_000_000  # sum of the bands' lifetimes, in samples (page CPU)
MAX_BLOCKS = 20000
MAX_STACKS = 6000
MAX_TABLE_ROWS = 400
MAX_MARKERS = 500
MAX_JSON = 12 << 20
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # gpumem/
STATIC = os.path.join(_PKG, "viewer_static")
STATES = {"active_allocated": 0, "active_pending_free": 1}   # anything else: 2 (free)


def _num(v: Any) -> Any:
    """An int for JSON that JavaScript reads without surprises (|v| < 2**63)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return max(-(1 << 63), min(v, (1 << 63) - 1))
    return v


class _Out:
    """Stacks, frames and sites referenced by the page, numbered densely."""

    def __init__(self, stacks: StackTable, max_stacks: int) -> None:
        self.st = stacks
        self.max_stacks = max_stacks
        self.frames: list[str] = []
        self._frame_ids: dict[str, int] = {}
        self.stacks: list[list[int]] = []
        self.stack_site: list[int] = []
        self._stack_ids: dict[int, int] = {}
        self.sites: list[list[Any]] = []
        self._site_ids: dict[int, int] = {}

    def site(self, site_id: int) -> int:
        out = self._site_ids.get(site_id)
        if out is None:
            s = self.st.sites[site_id]
            out = self._site_ids[site_id] = len(self.sites)
            self.sites.append([s["label"], s["kind"]])
        return out

    def stack(self, sid: int) -> int:
        """The page's id for stack ``sid``; -1 once MAX_STACKS are in (site kept)."""
        out = self._stack_ids.get(sid)
        if out is not None:
            return out
        if len(self.stacks) >= self.max_stacks:
            return -2 - self.site(self.st.stack_site[sid])  # only the site: -2 - site
        ids = []
        for line in self.st.stack_lines(sid, 40):
            fid = self._frame_ids.get(line)
            if fid is None:
                fid = self._frame_ids[line] = len(self.frames)
                self.frames.append(line[:400])
            ids.append(fid)
        out = self._stack_ids[sid] = len(self.stacks)
        self.stacks.append(ids)
        self.stack_site.append(self.site(self.st.stack_site[sid]))
        return out


def _samples(m: DeviceModel, max_samples: int) -> list[int]:
    n = m.n_events
    if n <= max_samples:
        return list(range(n))
    if m.columnar:
        return _C.model_samples(m.allocated, max_samples, m.peak_index)
    a = m.allocated
    buckets = max_samples // 2
    picks = set()
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        part = a[lo:hi]
        picks.add(lo + part.index(max(part)))
        picks.add(lo + part.index(min(part)))
    picks.add(m.peak_index)
    return sorted(picks)


def _thin(items: list, limit: int) -> list:
    """At most ``limit`` items, evenly spaced, the first and the last kept."""
    if len(items) <= limit:
        return list(items)
    return [items[k * (len(items) - 1) // (limit - 1)] for k in range(limit)]


def _timeline(m: DeviceModel, out: _Out, caps: dict,
              cats: list[int] | None = None) -> dict | None:
    """cats: each allocation's category (category_report), given to its band so
    that it has the colour the category chart gives it (-1: none)."""
    if not m.has_trace:
        return None
    samples = _samples(m, caps["samples"])
    S = len(samples)
    visible, chosen = _bands(m, samples, caps["bands"], caps["band_budget"])
    diff = [0] * (S + 1)
    for a, s0, s1 in chosen:
        diff[s0] += m.a_size[a]
        diff[s1 + 1] -= m.a_size[a]
    big, run = [], 0
    for j in range(S):
        run += diff[j]
        big.append(run)
    total = [m.allocated[x] for x in samples]
    chosen.sort(key=lambda c: (m.a_start[c[0]], c[0]))
    bands = [[s0, s1, m.a_size[a], out.stack(m.a_stack[a]), m.a_start[a],
              m.a_end[a] if m.a_end[a] < m.n_events else -1, f"0x{m.a_addr[a]:x}",
              cats[a] if cats else -1]
             for a, s0, s1 in chosen]
    t0 = next((t for t in m.times if t is not None), None)
    times = None
    if t0 is not None:
        times = [None if m.times[x] is None else round((m.times[x] - t0) / 1000.0, 3)
                 for x in samples]
    return {
        "n_events": m.n_events, "ev": samples, "t": times, "total": total,
        "small": [max(0, t - b) for t, b in zip(total, big)],
        "reserved": [m.reserved[x] for x in samples] if m.reserved is not None else None,
        "bands": bands, "visible": visible, "allocations": len(m.a_size),
        "peak": [m.peak_index, m.peak],
        "markers": [[i, label] for i, label in _thin(m.markers, MAX_MARKERS)],
        "markers_total": len(m.markers), "marker_source": m.marker_source,
        "ooms": [[o["index"], o["size"], o["device_free"], out.stack(o["stack"])]
                 for o in m.ooms[:100]],
    }


def _bands(m: DeviceModel, samples: list[int], max_bands: int,
           budget: int) -> tuple[int, list[tuple[int, int, int]]]:
    """(allocations live at some sample, [(a, first sample, last sample)] of
    those drawn as bands): largest first, then longest, then first made,
    while fewer than max_bands are taken and their lifetimes fit budget."""
    if m.columnar:
        return _C.model_bands(m.a_start, m.a_end, m.a_size, samples, max_bands, budget)
    cands = []
    for a, (s, e) in enumerate(zip(m.a_start, m.a_end)):
        s0 = bisect.bisect_left(samples, s)
        s1 = bisect.bisect_left(samples, e) - 1
        if s0 <= s1:
            cands.append((m.a_size[a], s1 - s0, a, s0, s1))
    cands.sort(key=lambda c: (-c[0], -c[1], c[2]))
    chosen = []
    for _size, life, a, s0, s1 in cands:
        if len(chosen) >= max_bands:
            break
        if life + 1 > budget:
            continue
        budget -= life + 1
        chosen.append((a, s0, s1))
    return len(cands), chosen


def _categories(m: DeviceModel, cats: list[int] | None,
                timeline: dict | None) -> dict | None:
    """Bytes per category at the timeline's samples (snapshots recorded with
    categories only): the stacked-by-category view.  all_names: the names
    the bands' and blocks' category indices refer to."""
    if cats is None or not timeline:
        return None
    curves = category_report.category_curves(m, cats, timeline["ev"])
    names = [n for n in curves if any(curves[n])]
    return {"names": names, "series": [curves[n] for n in names],
            "all_names": list(category_report.CATEGORIES),
            "at_peak": category_report.breakdown(m, cats, m.peak_index),
            "at_end": category_report.breakdown(m, cats, m.n_events - 1)}


def _segments(snap: dict, dev: int, m: DeviceModel, out: _Out, caps: dict,
              cats: list[int] | None = None) -> dict:
    at_end = m.live_at(m.n_events - 1)
    live_stack = {m.a_addr[a]: m.a_stack[a] for a in at_end}
    live_cat = {m.a_addr[a]: cats[a] for a in at_end} if cats else {}
    segs = [s for s in snap["segments"] if s["device"] == dev]
    sizes = sorted((b["size"] for s in segs for b in s.get("blocks", [])), reverse=True)
    cap = caps["blocks"]
    threshold = sizes[cap // 2] if len(sizes) > cap else -1
    rows, bs, bst, breq, bstack, bcount, bcat = [], [], [], [], [], [], []
    merged = 0

    def put(size: int, state: int, req: int, stack: int, count: int, cat: int = -1) -> None:
        bcat.append(cat)
        bs.append(size)
        bst.append(state)
        breq.append(req)
        bstack.append(stack)
        bcount.append(count)
    for seg in segs:
        first = len(bs)
        run = None  # [size, allocated bytes, count] of merged small blocks
        addr = seg["address"]
        for block in seg.get("blocks", []):
            size, state = block["size"], STATES.get(block["state"], 2)
            if size <= threshold:
                run = run or [0, 0, 0]
                run[0] += size
                run[1] += size if state < 2 else 0
                run[2] += 1
                addr += size
                continue
            if run:
                put(run[0], 3, run[1], -1, run[2])
                merged += run[2]
                run = None
            if state < 2:
                sid = out.st.intern(block_frames(block)) or live_stack.get(addr, 0)
                put(size, state, block_bytes(block), out.stack(sid), 1,
                    live_cat.get(addr, -1))
            else:
                put(size, state, 0, -1, 1)
            addr += size
        if run:
            put(run[0], 3, run[1], -1, run[2])
            merged += run[2]
        rows.append([f"0x{seg['address']:x}", seg["total_size"], _num(seg.get("stream", 0)),
                     text_of(seg.get("segment_type", ""), 20),
                     bool(seg.get("is_expandable", False)), first, len(bs) - first])
    return {"stats": segment_totals(snap, dev), "segs": rows,
            "blocks": {"size": bs, "state": bst, "req": breq, "stack": bstack,
                       "count": bcount, "cat": bcat},
            "merged": merged, "merge_threshold": threshold}


def _table(snap: dict, dev: int, m: DeviceModel, out: _Out) -> dict:
    st = m.stacks
    groups: dict[int, list[int]] = {}

    smp = _sampling.snapshot_params(snap)
    estimated: set[int] = set()

    def add(col: int, by_site: dict) -> None:
        for site, (count, nbytes, largest, stack, est) in by_site.items():
            row = groups.setdefault(site, [0] * 6 + [0, stack])
            row[col], row[col + 1] = round(count), round(nbytes)
            if est:
                estimated.add(site)
            if largest > row[6]:
                row[6], row[7] = largest, stack
    if m.has_trace:
        add(0, model_by_site(m, m.peak_index, smp))
        add(4, model_by_site(m, None, smp))
    add(2, live_by_site(st, end_live(snap, dev, st, {dev: m}), smp))
    keep = set()
    for col in (1, 3, 5):
        keep.update(sorted(groups, key=lambda s: -groups[s][col])[:MAX_TABLE_ROWS // 3])
    rows = [[out.site(site)] + groups[site][:7] + [out.stack(groups[site][7])]
            for site in sorted(keep, key=lambda s: (-groups[s][1], -groups[s][3], s))]
    for site in estimated & keep:  # the page names these sites "~ ...": estimates
        label = out.sites[out.site(site)]
        if not label[0].startswith("~ "):
            label[0] = "~ " + label[0]
    return {"rows": rows, "sites_total": len(groups), "has_trace": m.has_trace}


def _header(snap: dict, dev: int, m: DeviceModel) -> dict:
    seg = segment_totals(snap, dev)
    traced = m.trace_allocations()   # a pass over every allocation: once
    h: dict[str, Any] = {"events": m.n_events, "segments": seg["segments"],
                         "reserved_end": seg["reserved"], "allocated_end": seg["allocated"],
                         "allocations": traced, "live_before": len(m.a_start) - traced,
                         "ooms": len(m.ooms), "markers": m.marker_source}
    if m.has_trace:
        res = m.reserved_at(m.peak_index)
        if res is None and seg["reserved"] >= m.peak:
            res = seg["reserved"]
        h.update(peak_allocated=m.peak, peak_index=m.peak_index,
                 peak_reserved=max(m.reserved) if m.reserved else res,
                 reserved_at_peak=res,
                 frag_at_peak=res - m.peak if res is not None and res >= m.peak else None,
                 reserved_known=m.reserved is not None)
    else:
        h.update(peak_allocated=seg["allocated"], peak_index=None,
                 peak_reserved=seg["reserved"], reserved_at_peak=seg["reserved"],
                 frag_at_peak=seg["reserved"] - seg["allocated"], reserved_known=False)
    return h


def build_payload(snap: dict, name: str, device: int | None = None,
                  caps: dict | None = None) -> dict:
    """The data the page embeds (JSON-ready); see the module docstring."""
    caps = caps or {"samples": MAX_SAMPLES, "bands": MAX_BANDS, "blocks": MAX_BLOCKS,
                    "band_budget": BAND_SAMPLE_BUDGET, "stacks": MAX_STACKS}
    dev = pick_device(snap, device, name)
    stacks = StackTable()
    m = build_device(snap, dev, stacks)
    out = _Out(stacks, caps["stacks"])
    cats = category_report.allocation_categories(snap, m)
    timeline = _timeline(m, out, caps, cats)
    table = _table(snap, dev, m, out)
    segments = _segments(snap, dev, m, out, caps, cats)
    devices = []
    for d in devices_of(snap):
        traces = snap["device_traces"]
        devices.append({"device": d, "events": len(traces[d]) if d < len(traces) else 0,
                        "reserved": sum(s["total_size"] for s in snap["segments"]
                                        if s["device"] == d)})
    notes = _empty_notes(snap, dev, m)
    smp = _sampling.snapshot_params(snap)
    if smp is not None:
        notes.append(_sampling.describe(smp) + ".")
    if timeline:
        if len(timeline["ev"]) < m.n_events:
            notes.append(f"The timeline is sampled at {len(timeline['ev'])} of {m.n_events} "
                         f"trace events: the highest and lowest point of each of "
                         f"{caps['samples'] // 2} equal ranges, so peaks are exact; "
                         f"allocations that live only between samples are not drawn.")
        folded = timeline["visible"] - len(timeline["bands"])
        if folded > 0:
            notes.append(f"The {len(timeline['bands'])} largest allocations are drawn as their "
                         f"own bands; {folded} smaller ones are folded into the grey 'small "
                         f"allocations' band on top.")
    if timeline and timeline["markers_total"]:
        shown = len(timeline["markers"])
        notes.append(f"Step markers ({m.marker_source}): {timeline['markers_total']}"
                     + (f", {shown} of them drawn" if shown < timeline["markers_total"] else "")
                     + ".")
    if segments["merged"]:
        notes.append(f"The segment view merges {segments['merged']} blocks of "
                     f"{segments['merge_threshold']} bytes or less into runs.")
    if len(out.stacks) >= caps["stacks"]:
        notes.append(f"Only {caps['stacks']} distinct stacks are embedded; other allocations "
                     f"show their source line without the full stack.")
    if m.inconsistencies:
        notes.append(f"{m.inconsistencies} trace entries did not match (a free of an address "
                     f"that was not allocated, or an address allocated twice).")
    return {"version": 1, "file": name, "device": dev, "devices": devices,
            "header": _header(snap, dev, m), "notes": notes, "timeline": timeline,
            "categories": _categories(m, cats, timeline),
            "segments": segments, "table": table, "frames": out.frames,
            "stacks": out.stacks, "stack_site": out.stack_site, "sites": out.sites}


def _empty_notes(snap: dict, dev: int, m: DeviceModel) -> list[str]:
    """Why a page has no timeline (or nothing at all), in the page itself."""
    if m.has_trace:
        return []
    if not any(s["device"] == dev for s in snap["segments"]):
        return ["This snapshot is empty: it holds no allocation events and no memory. It was "
                "taken while recording was off (torch.cuda.memory._record_memory_history("
                "enabled=None) stops recording and clears the history), or before anything was "
                "allocated on this device. Take the snapshot before recording is turned off."]
    return ["No allocation trace: this snapshot holds only the memory state when it was taken "
            "(recording was off, or on with enabled='state'), so the figures above are that "
            "state, not peaks, and there is no timeline. Record with "
            "torch.cuda.memory._record_memory_history() and dump before turning it off."]


def _dumps(payload: dict) -> str:
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # Inside <script> only '<' can end the element; \u2028/9 are fine in JSON.parse.
    return text.replace("<", "\\u003c")


def _static(name: str) -> str:
    try:
        with open(os.path.join(STATIC, name), encoding="utf-8") as f:
            return f.read()
    except OSError:
        raise AnalysisError(
            f"gpumem's viewer file {name} is missing from {STATIC}; reinstall gpumem "
            f"(the wheel must include gpumem/viewer_static)") from None


def render_html(payload_json: str, title: str) -> str:
    """The page: viewer.html with the style, script and data put in (one pass)."""
    from html import escape
    parts = {"TITLE": escape(title), "STYLE": _static("viewer.css"),
             "SCRIPT": _static("viewer.js").replace("</", "<\\/"),
             "CATEGORIES": _static("viewer_categories.js").replace("</", "<\\/"),
             "DATA": payload_json}
    return re.sub(r"\{\{(TITLE|STYLE|SCRIPT|CATEGORIES|DATA)\}\}",
                  lambda mo: parts[mo.group(1)], _static("viewer.html"))


def default_output(snapshot: str) -> str:
    root, ext = os.path.splitext(snapshot)
    return (root if ext.lower() in (".pickle", ".pkl", ".pck", ".p") else snapshot) + ".html"


def write_view(snapshot: str, output: str | None = None, device: int | None = None,
               limits: Limits | None = None) -> dict:
    """Load ``snapshot`` (within ``limits``), write the page to ``output``; return what
    was written."""
    with gc_paused():
        return _write_view(snapshot, output, device, limits)


def _write_view(snapshot: str, output: str | None, device: int | None,
                limits: Limits | None) -> dict:
    snap = load_snapshot(snapshot, limits)
    caps = {"samples": MAX_SAMPLES, "bands": MAX_BANDS, "blocks": MAX_BLOCKS,
            "band_budget": BAND_SAMPLE_BUDGET, "stacks": MAX_STACKS}
    while True:
        payload = build_payload(snap, os.path.basename(snapshot), device, caps)
        data = _dumps(payload)
        if len(data) <= MAX_JSON or caps["bands"] <= 50:
            break
        caps = {k: max(50, v // 2) for k, v in caps.items()}
    output = output or default_output(snapshot)
    html = render_html(data, f"gpumem: {os.path.basename(snapshot)}")
    try:
        write_atomic(output, lambda f: f.write(html.encode("utf-8")))
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise AnalysisError(f"cannot write {output} ({reason}); choose another "
                                     f"place with -o") from None
    tl = payload["timeline"]
    folded = ""
    if tl and tl["visible"] > len(tl["bands"]):
        folded = f"{tl['visible'] - len(tl['bands'])} folded into 'small allocations'"
    return {"output": output, "html_bytes": len(html.encode("utf-8")),
            "device": payload["device"], "events": tl["n_events"] if tl else 0,
            "bands": len(tl["bands"]) if tl else 0, "folded": folded,
            "samples": len(tl["ev"]) if tl else 0}
