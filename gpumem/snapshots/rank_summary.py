"""``gpumem summary DIR``: the snapshots of a folder, one row per rank and device.

The folder is ``gpumem simulate``'s --out, or any folder where ranks wrote
their snapshots (``snapshot_rank3.pickle``, ``memory_rank3.pkl``,
``oom_<host>_<pid>_<n>_rank3.pickle``): every ``*.pickle`` and ``*.pkl`` file
directly in it is read; the rank is the N of ``_rank<N>`` or ``rank<N>``
before the extension (none: the row says "-").  Each row comes from
snapshots.summary.summarize, as ``gpumem summary FILE`` reports it, plus the largest
single allocation.  A file that cannot be read is named on stderr and
skipped; the command fails (one line) only when no file could be read.
Nothing here prints but rank_summary_lines' caller.
"""

from __future__ import annotations

import os
from typing import Any

from gpumem._format import format_bytes
from gpumem._rank import rank_of_path as _rank
from gpumem.snapshots.unpickle import Limits, SnapshotError, gc_paused, load_snapshot

__all__ = ["snapshot_files", "summarize_folder", "summary_lines"]

_EXTS = (".pickle", ".pkl")


def snapshot_files(folder: str) -> list[str]:
    """The snapshot files directly in folder, by rank (unranked last), then name."""
    try:
        names = os.listdir(folder)
    except OSError as e:
        raise SnapshotError(f"cannot read the folder {folder} ({e.strerror})") from None
    names = [n for n in names if n.endswith(_EXTS) and os.path.isfile(os.path.join(folder, n))]
    if not names:
        raise SnapshotError(f"{folder} holds no snapshots (*.pickle or *.pkl files): give the "
                            "folder the ranks wrote theirs into, or gpumem simulate's --out")
    names.sort(key=lambda n: (_rank(n) is None, _rank(n) or 0, n.startswith("oom_"), n))
    return [os.path.join(folder, n) for n in names]


def _largest(snap: dict, dev: int) -> int:
    """The largest single allocation on device dev: in the trace or live in a segment."""
    best = 0
    traces = snap.get("device_traces") or []
    if 0 <= dev < len(traces):
        for e in traces[dev] or []:
            if e.get("action") == "alloc":
                best = max(best, int(e.get("size") or 0))
    for seg in snap.get("segments") or []:
        if seg.get("device") == dev:
            for b in seg.get("blocks") or []:
                if b.get("state") == "active_allocated":
                    best = max(best, int(b.get("size") or 0))
    return best


def summarize_folder(folder: str, limits: Limits) -> dict[str, Any]:
    """Rows for every readable snapshot in folder, and the files skipped (JSON-ready)."""
    from gpumem.snapshots.summary import summarize
    rows, skipped = [], []
    for path in snapshot_files(folder):
        name = os.path.basename(path)
        try:
            with gc_paused():
                snap = load_snapshot(path, limits)
                report = summarize(snap, path, top=1)
        except SnapshotError as e:
            skipped.append({"file": name, "error": " ".join(str(e).split())})
            continue
        for d in report["devices"]:
            top = (d.get("top_live_at_peak") or [None])[0]
            rows.append({"rank": _rank(name), "file": name, "device": d["device"],
                         "oom_snapshot": name.startswith("oom_"),
                         "peak_allocated": d["peak_allocated"],
                         "peak_reserved": d["peak_reserved"],
                         "allocated_at_end": d["at_snapshot"]["allocated"],
                         "largest_allocation": _largest(snap, d["device"]),
                         "num_ooms": len(d["ooms"]),
                         "last_oom": d["ooms"][-1] if d["ooms"] else None,
                         "top_site": top and {"site": top["site"], "bytes": top["bytes"]}})
    if not rows and skipped:
        raise SnapshotError(f"no snapshot in {folder} could be read ({len(skipped)} skipped; "
                            f"the first: {skipped[0]['file']}: {skipped[0]['error']})")
    ranked = [r for r in rows if r["rank"] is not None and not r["oom_snapshot"]
              and r["peak_reserved"] is not None]
    top = max((r["peak_reserved"] for r in ranked), default=None)
    highest = sorted({r["rank"] for r in ranked if r["peak_reserved"] == top})
    return {"folder": folder, "rows": rows, "skipped": skipped, "highest_ranks": highest,
            "highest_reserved": top,
            "ranks": sorted({r["rank"] for r in rows if r["rank"] is not None})}


def summary_lines(report: dict[str, Any], short_site: Any = lambda s: s) -> list[str]:
    """The side-by-side table of summarize_folder's report."""
    fb = format_bytes
    rows = report["rows"]
    n_files = len({r["file"] for r in rows})
    lines = [f"{report['folder']}: {n_files} snapshot(s), {len(report['ranks'])} rank(s)",
             f"  {'rank':>4}  {'device':>6}  {'peak allocated':>14}  {'peak reserved':>13}  "
             f"{'allocated at end':>16}  {'largest alloc':>13}  {'OOMs':>4}  file"]
    for r in rows:
        rank = "-" if r["rank"] is None else str(r["rank"])
        res = "?" if r["peak_reserved"] is None else fb(r["peak_reserved"])
        lines.append(f"  {rank:>4}  {r['device']:>6}  {fb(r['peak_allocated']):>14}  {res:>13}  "
                     f"{fb(r['allocated_at_end']):>16}  {fb(r['largest_allocation']):>13}  "
                     f"{r['num_ooms']:>4}  {r['file']}"
                     + (" (OOM snapshot)" if r["oom_snapshot"] else ""))
    high = report["highest_ranks"]
    if high and len(report["ranks"]) > 1:
        if len(high) == len({r["rank"] for r in rows if r["rank"] is not None
                             and not r["oom_snapshot"]}):
            lines.append("every rank peaks at the same reserved memory")
        else:
            lines.append(("rank " if len(high) == 1 else "ranks ")
                         + ", ".join(map(str, high)) + (" peaks" if len(high) == 1 else " peak")
                         + f" highest (peak reserved {fb(report['highest_reserved'])})")
    for r in rows:
        o = r["last_oom"]
        if o:
            rank = "-" if r["rank"] is None else str(r["rank"])
            lines.append(f"rank {rank} ran out of memory ({r['file']}): asked for "
                         f"{fb(o['size'])} with {fb(o['device_free'])} free, at "
                         f"{short_site(o['site'])}")
    sited = [r for r in rows if r["top_site"]]
    if sited:
        lines.append("top allocation site live at the peak:")
        for r in sited:
            rank = "-" if r["rank"] is None else str(r["rank"])
            lines.append(f"  rank {rank} ({r['file']}): {fb(r['top_site']['bytes'])} at "
                         f"{short_site(r['top_site']['site'])}")
    return lines
