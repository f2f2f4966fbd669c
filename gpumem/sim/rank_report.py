"""The per-rank part of ``gpumem simulate``'s report: one row per rank.

Each rank of a distributed run is its own process on its own simulated GPU,
so each has its own verdict: a rank fits when it hit no out-of-memory error
and everything its simulated device held at once (the "device peak":
torch's allocator's segments, the CUDA context and the fake NCCL's buffers)
fits in the device's memory; off the simulator's driver, when its peak
reserved memory fits in the device's memory less the CUDA context.  The report also names the rank that peaks highest and, when ranks
ran out of memory, the order they did so in (the time of the failed
allocation recorded in each OOM snapshot, else the file's modification
time).  Processes without a rank (a single-process run) give no rows.
Nothing here runs the command or prints on its own.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from gpumem._format import format_bytes
from gpumem._rank import rank_of_path

__all__ = ["per_rank", "rank_lines", "row_fits"]


def _oom_time(path: str) -> float:
    """When the allocation of an OOM snapshot failed, in seconds since the epoch: its
    last "oom" trace event's time, else the file's modification time."""
    try:
        from gpumem.snapshots.unpickle import load_snapshot
        snap = load_snapshot(path)
        times = [e.get("time_us") for trace in snap.get("device_traces") or []
                 for e in trace if isinstance(e, dict) and e.get("action") == "oom"]
        times = [t for t in times if isinstance(t, (int, float)) and t > 0]
        if times:
            return max(times) / 1e6
    except Exception:  # noqa: BLE001 - an unreadable snapshot: fall back to the file's time
        pass
    try:
        return os.path.getmtime(path)
    except OSError:
        return float("inf")


def row_fits(row: dict, memory: int, usable: int) -> bool:
    """Whether one device's peak fits: all the memory the simulated device had in
    use at once (allocator, context, NCCL's buffers) within its memory when the
    driver measured it, else the allocator's peak reserved within usable (memory
    less the CUDA context)."""
    if row.get("device_peak") is not None:
        return row["device_peak"] <= memory
    return row["peak_reserved"] <= usable


def _ending(row: dict, o: Optional[dict], signalled: Optional[str]) -> None:
    """The row's finished / failed / signal / stopped_by_launcher / failure fields,
    from the process's outcome (gpumem/_outcome.py; None: it exited normally)."""
    row["finished"] = o is None
    row["failed"] = o is not None and o["kind"] != "stopped"
    row["signal"] = o.get("signal") if o else None
    row["stopped_by_launcher"] = bool(o and o["kind"] == "stopped" and not signalled)
    row["failure"] = o and {k: o.get(k) for k in ("kind", "what", "line", "time")}


def per_rank(rows: list[dict], crashed: list[dict], oom_files: list[str], memory: int,
             context: int, outcomes: Optional[dict] = None,
             signalled: Optional[str] = None) -> dict[str, Any]:
    """The per-rank rows, the highest rank, the OOM order and the rank that
    failed first (JSON-ready).

    rows: the report's per_device rows; crashed: the statistics of processes
    that did not exit normally (with their rank when they had one); outcomes:
    pid -> how that process ended when not normally; signalled: the signal
    gpumem simulate itself got."""
    outcomes = outcomes or {}
    usable = max(memory - context, 0)
    by_rank_oom: dict[int, list[str]] = {}
    for f in oom_files:
        r = rank_of_path(f)
        if r is not None:
            by_rank_oom.setdefault(r, []).append(f)
    out = []
    for row in rows:
        if row.get("rank") is None:
            continue
        files = sorted(by_rank_oom.get(row["rank"], []))
        ooms = max(row.get("num_ooms", 0), len(files))
        out.append({"rank": row["rank"], "device": row["device"], "pid": row["pid"],
                    "peak_allocated": row["peak_allocated"],
                    "peak_reserved": row["peak_reserved"], "num_ooms": ooms,
                    "oom_snapshots": files, "finished": True,
                    "device_peak": row.get("device_peak"),
                    "fits": ooms == 0 and row_fits(row, memory, usable)})
        o = outcomes.get(row["pid"])
        _ending(out[-1], o, signalled)
        if o is not None and ooms == 0:
            out[-1]["fits"] = None
    seen = {r["rank"] for r in out}
    for p in crashed:
        rank = p.get("rank")
        if rank is None or rank in seen:
            continue
        files = sorted(by_rank_oom.get(rank, []))
        held = max((p.get("fatal_peaks") or {}).values(), default=None)
        out.append({"rank": rank, "device": None, "pid": p.get("pid"), "peak_allocated": None,
                    "peak_reserved": None, "num_ooms": len(files), "oom_snapshots": files,
                    "finished": False, "fits": False if files else None, "device_peak": held})
        _ending(out[-1], outcomes.get(p.get("pid")) or {"kind": "vanished", "what": "did not "
                "exit normally", "line": None, "time": None, "signal": None}, signalled)
    out.sort(key=lambda r: (r["rank"], r["device"] if r["device"] is not None else -1))
    if not out:
        return {"per_rank": [], "highest_ranks": [], "oom_order": []}
    measured = [r for r in out if r["peak_reserved"] is not None]
    top = max((r["peak_reserved"] for r in measured), default=None)
    highest = sorted({r["rank"] for r in measured if r["peak_reserved"] == top})
    first: dict[int, float] = {}
    for rank, files in by_rank_oom.items():
        first[rank] = min(_oom_time(f) for f in files)
    order = [{"rank": rank, "time": t} for rank, t in sorted(first.items(), key=lambda kv: kv[1])]
    failed = [r for r in out if r["failed"]]
    failed.sort(key=lambda r: (r["failure"]["time"] is None, r["failure"]["time"] or 0))
    return {"per_rank": out, "highest_ranks": highest, "usable_memory": usable,
            "oom_order": order, "failed_first": failed[0]["rank"] if failed else None}


def _ranks_text(ranks: list[int]) -> str:
    words = [str(r) for r in ranks]
    if len(words) == 1:
        return f"rank {words[0]}"
    return "ranks " + ", ".join(words[:-1]) + " and " + words[-1]


def _fits_text(row: dict, failed_first: Optional[int]) -> str:
    """The fits column: yes, no (why), or unknown and how the rank ended."""
    f = row.get("failure")
    if row["num_ooms"]:
        return (f"no ({row['num_ooms']} OOM(s))" if row["finished"] or row["device"] is not None
                else "no (ran out of memory, then did not exit normally)")
    if f and f.get("kind") != "vanished":
        how = "stopped by the launcher" if row.get("stopped_by_launcher") else f["what"]
        return (f"unknown: {how}" + (f" at {f['line']}" if f.get("line") else "")
                + (" (the first to fail)" if row["rank"] == failed_first else ""))
    if not row["finished"]:
        return ("unknown (did not finish: the launcher stops every rank when one fails; or it "
                "was killed, crashed or called os._exit)")
    return "yes" if row["fits"] else "no (peak too high)"


def rank_lines(r: dict[str, Any]) -> list[str]:
    """The per-rank table and its two sentences for the printed report."""
    rows = r.get("per_rank") or []
    if not rows:
        return []
    fb = format_bytes
    lines = [f"per rank (each simulated GPU leaves {fb(r['usable_memory'])} for allocations "
             "after the CUDA context; peaks are gpumem's allocator's, the device peak adds the "
             "context and NCCL's buffers):",
             f"  {'rank':>4}  {'device':>6}  {'peak allocated':>14}  {'peak reserved':>13}  "
             f"{'device peak':>11}  fits"]
    world = r.get("world")
    if world:
        lines[1] += "  (stands for)"
        lines.insert(0, f"a job of {world['world_size']} ranks ({world['nnodes']} node(s) x "
                        f"{world['nproc_per_node']}), of which {len(world['ranks'])} started "
                        f"({'--ranks auto' if world['how'] == 'auto' else 'the ranks listed'}); "
                        "every started rank saw the full world size and its own rank")
    for row in rows:
        def cell(v: Any) -> str:
            return "-" if v is None else fb(v)
        dev = "-" if row["device"] is None else str(row["device"])
        lines.append(f"  {row['rank']:>4}  {dev:>6}  {cell(row['peak_allocated']):>14}  "
                     f"{cell(row['peak_reserved']):>13}  {cell(row.get('device_peak')):>11}  "
                     f"{_fits_text(row, r.get('failed_first'))}"
                     + (f"  (ranks {row['stands_for']['ranks']})" if row.get("stands_for")
                        else ""))
    whys = sorted({row["stands_for"]["why"] for row in rows if row.get("stands_for")})
    if whys:
        lines.append("each row stands for the ranks in brackets: " + "; ".join(whys))
    if world and world.get("advice"):
        lines.append(world["advice"])
    high = r.get("highest_ranks") or []
    measured = {row["rank"] for row in rows if row["peak_reserved"] is not None}
    if high and len(measured) > 1:
        top = max(row["peak_reserved"] for row in rows if row["peak_reserved"] is not None)
        if len(high) == len(measured):
            lines.append(f"every rank peaks at the same reserved memory ({fb(top)})")
        else:
            verb = "peaks" if len(high) == 1 else "peak"
            lines.append(f"{_ranks_text(high)} {verb} highest (reserved {fb(top)})")
    order = [o["rank"] for o in r.get("oom_order") or []]
    if order:
        lines.append(f"ran out of memory first: rank {order[0]}"
                     + (f" (then {_ranks_text(order[1:])})" if len(order) > 1 else ""))
    return lines
