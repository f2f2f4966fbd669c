"""Memory by category from a snapshot's ``gpumem_categories`` table: the
breakdown at the peak and at the end (``gpumem summary``), per-category
curves (``gpumem view``), and the terms of the estimation equation
(``gpumem simulate``):

    peak = parameters + optimizer state
           + max(gradients + optimizer intermediates, activations)

Works on snapshots.timeline.DeviceModel's allocations (requested sizes, the same model
as the rest of summary and view), so the categories live at any trace entry
add up to the allocated bytes the model reports there.  Snapshots without the
table (torch's, or gpumem's recorded without categories) give None.
No torch, no extension.
"""

from __future__ import annotations

from typing import Any, Optional

from gpumem.categories.classify import CATEGORIES, PHASES, TABLE_KEY

# m: a snapshots.timeline.DeviceModel (not imported: snapshots.summary imports this module)
DeviceModel = Any

__all__ = ["allocation_categories", "breakdown", "category_curves", "device_report",
           "equation_terms", "has_table"]

_UNKNOWN = CATEGORIES.index("unknown")


def _table(snap: dict) -> Optional[dict]:
    t = snap.get(TABLE_KEY)
    if not isinstance(t, dict) or t.get("version") != 1:
        return None
    names = list(t.get("categories") or ())
    if not names or names != list(CATEGORIES[:len(names)]):   # older tables: a prefix
        return None
    return t


def has_table(snap: dict) -> bool:
    """Whether the snapshot was recorded with categories (a table this code reads)."""
    return _table(snap) is not None


def _ok(i: Any) -> int:
    return i if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(CATEGORIES) \
        else _UNKNOWN


def allocation_categories(snap: dict, m: DeviceModel) -> Optional[list[int]]:
    """The category index of each of m's allocations, or None without a table."""
    t = _table(snap)
    if t is None:
        return None
    traces = t.get("device_traces") or []
    row = traces[m.device] if m.device < len(traces) else []
    by_block: dict[int, int] = {}
    seg_rows = t.get("segments") or []
    segs = snap["segments"]
    for si, seg in enumerate(segs):
        if seg.get("device") != m.device or si >= len(seg_rows):
            continue
        addr = seg["address"]
        for bi, block in enumerate(seg.get("blocks", [])):
            cats = seg_rows[si]
            if bi < len(cats) and cats[bi] is not None:
                by_block[addr] = _ok(cats[bi])
            addr += block["size"]
    out = []
    n = m.n_events
    for start, end, addr in zip(m.a_start, m.a_end, m.a_addr):
        if start >= 0 and start < len(row):
            out.append(_ok(row[start]))
        elif 0 <= end < n and end < len(row):
            out.append(_ok(row[end]))
        else:
            out.append(by_block.get(addr, _UNKNOWN))
    return out


def breakdown(m: DeviceModel, cats: list[int], index: int) -> dict[str, int]:
    """Bytes per category live just after trace entry ``index`` (-1: before the first)."""
    out = dict.fromkeys(CATEGORIES, 0)
    for a, (s, e) in enumerate(zip(m.a_start, m.a_end)):
        if s <= index < e:
            out[CATEGORIES[cats[a]]] += m.a_size[a]
    return out


def category_curves(m: DeviceModel, cats: list[int], samples: list[int]) -> dict[str, list[int]]:
    """Bytes per category after each trace entry in ``samples`` (sorted indices);
    a category no allocation has is all zeros (and costs no pass over the trace)."""
    n = m.n_events
    used = sorted(set(cats))
    delta = {c: [0] * (n + 1) for c in used}
    base = dict.fromkeys(used, 0)
    for a, (s, e) in enumerate(zip(m.a_start, m.a_end)):
        c, size = cats[a], m.a_size[a]
        if s < 0:
            base[c] += size
        else:
            delta[c][s] += size
        if e < n:
            delta[c][e] -= size
    out = {name: [0] * len(samples) for name in CATEGORIES}
    for c in used:
        run, d, vals, k = base[c], delta[c], out[CATEGORIES[c]], 0
        for i in range(n):
            run += d[i]
            while k < len(samples) and samples[k] == i:
                vals[k] = run
                k += 1
        while k < len(samples):
            vals[k] = run
            k += 1
    return out


def _phases_of(snap: dict, device: int) -> list:
    t = _table(snap) or {}
    rows = t.get("trace_phases") or []
    return rows[device] if device < len(rows) else []


def equation_terms(snap: dict, m: DeviceModel, cats: list[int]) -> dict[str, Any]:
    """The estimation equation's terms, each at its own peak, and which
    branch of the max() the measured peak follows."""
    phases = _phases_of(snap, m.device)
    opt_phase = PHASES.index("optimizer")
    n = m.n_events
    samples = list(range(n))
    curves = category_curves(m, cats, samples) if n else {c: [] for c in CATEGORIES}
    # optimizer intermediates: temporaries allocated in the optimizer phase
    inter = [0] * (n + 1)
    tmp = CATEGORIES.index("temporary")
    for a, (s, e) in enumerate(zip(m.a_start, m.a_end)):
        if cats[a] == tmp and 0 <= s < len(phases) and phases[s] == opt_phase:
            inter[s] += m.a_size[a]
            if e < n:
                inter[e] -= m.a_size[a]
    run, opt_inter = 0, []
    for i in range(n):
        run += inter[i]
        opt_inter.append(run)

    def peak(vals: list[int]) -> int:
        return max(vals) if vals else 0

    grads_plus = [g + o for g, o in zip(curves["gradient"], opt_inter)] if n else []
    acts = curves["activation"]
    terms = {
        "parameters": peak(curves["parameter"]),
        "optimizer_state": peak(curves["optimizer_state"]),
        "gradients": peak(curves["gradient"]),
        "optimizer_intermediates": peak(opt_inter),
        "gradients_plus_optimizer_intermediates": peak(grads_plus),
        "activations": peak(acts),
    }
    terms["estimate"] = (terms["parameters"] + terms["optimizer_state"]
                         + max(terms["gradients_plus_optimizer_intermediates"],
                               terms["activations"]))
    terms["measured_peak"] = m.peak
    at = m.peak_index
    if 0 <= at < n:
        g_at, a_at = grads_plus[at], acts[at]
        terms["peak_branch"] = ("activations" if a_at >= g_at
                                else "gradients_plus_optimizer_intermediates")
        terms["at_peak"] = {"activations": a_at, "gradients_plus_optimizer_intermediates": g_at}
    else:
        terms["peak_branch"] = None
    return terms


def device_report(snap: dict, m: DeviceModel) -> Optional[dict]:
    """{'at_peak', 'at_end', 'peak_index'} for gpumem summary, or None without a table."""
    cats = allocation_categories(snap, m)
    if cats is None:
        return None
    end = m.n_events - 1 if m.n_events else -1
    return {"peak_index": m.peak_index, "at_peak": breakdown(m, cats, m.peak_index),
            "at_end": breakdown(m, cats, end), "categories": list(CATEGORIES)}
