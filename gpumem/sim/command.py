"""``gpumem simulate``: run a training script on the simulated GPU and report its memory.

    gpumem simulate [--gpu MODEL] [--memory 80GiB] [--devices N] [--out DIR] -- python train.py ...
    gpumem simulate --nproc-per-node N [...] -- train.py ...   (N ranks: gpumem/sim/torchrun.py)
    python -m gpumem.sim.command ...                  (the same, without the gpumem command)

The command runs on the simulator (gpumem.sim: PyTorch's own CUDA build over
fake CUDA libraries, device memory that costs only what is touched) with
gpumem installed and recording in every Python process of the run, then
prints the peak memory per device and whether it fits, writes the snapshot
and the offline viewer page (gpumem view) into DIR, and exits with the
command's exit status.  A run that fails (a non-zero status, an uncaught
exception, a fatal signal, a rank that vanished) or is stopped never
"fits": the report says where it failed (gpumem/_outcome.py) and the peak
reached before; SIGTERM or SIGINT to gpumem simulate stops the whole job
(Note [Stopping a run]).  Settings gpumem.install() would refuse
(GPUMEM_ALLOC_CONF, or GPUMEM_OOM_RECORDING) are refused before the command
runs (status 2); if gpumem still cannot be installed in a process of the
run, the report says so and the status is 2 when the command itself
succeeded.  Out-of-memory errors write snapshots into DIR too
(GPUMEM_OOM_SNAPSHOT, unless it is already set).  Without --out, DIR is a
new folder under the user's cache (default_out), never the working
directory, and the first line printed names it.

Note [Setting up the child]
Rationale: the script must run unchanged (``python train.py``, ``python -m
  pkg``, torchrun and the workers it starts), and gpumem must be installed
  before the script's first CUDA tensor.
Approach: a sitecustomize.py in a temporary directory is put first on
  PYTHONPATH.  In every Python process it imports nothing heavy: it puts a
  finder on sys.meta_path that, once ``import torch`` has finished, calls
  gpumem.install() and starts recording (then chains to the sitecustomize it
  shadows, if any).  An atexit handler of each process that used CUDA writes
  its snapshot (snapshot.pickle for the command itself, _rank<N> or _pid<N>
  for the others) and its statistics, which the parent reads afterwards.
  Peaks survive torch.cuda.reset_peak_memory_stats(): the wrapper keeps the
  highest values seen before each reset.
Limitations: ``python -S``/``-I``/``-E`` skip sitecustomize or PYTHONPATH, so
  such a process is not recorded; a process killed by SIGKILL or a fatal
  signal, or that calls os._exit(), writes no snapshot or statistics (OOM
  snapshots are written at the error; SIGTERM and SIGINT unwind it and it
  writes both: Note [How a process of the run ends] in
  gpumem/sim/child.py);
  a script may replace the recording settings with its own
  (gpumem.record(...) clears the history when it starts), but its calls
  that stop recording are ignored (Note [The script's own recording] in
  gpumem/sim/child.py, where the child's side lives).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from gpumem.sim import torchrun as _launch, rank_report as _rank_report, outcome as _outcome
from gpumem import sim as _sim
from gpumem.sim import world as _world
from gpumem._atomic import write_atomic
from gpumem._format import format_bytes
from gpumem._sampling import ENV_SAMPLE
from gpumem.sim.child import ENV_CATEGORIES, ENV_ENTRIES, ENV_OUT, ENV_PARENT, ENV_STATS

__all__ = ["HELP", "LIMITS", "add_arguments", "run", "main"]

HELP = ("run a script on a simulated GPU with gpumem recording: peak memory, whether it fits, "
        "a snapshot and its viewer page")
LIMITS = ("limits of the simulation: kernels compute nothing, so there are no numerical results "
          "(losses, accuracies and printed values are meaningless); shapes that depend on data "
          "(nonzero, boolean masks, unique, control flow on tensor values) are unreliable; cuDNN's "
          "workspaces are the simulator's own deterministic choices (NVIDIA publishes none) and "
          "cuDNN RNNs, CTC loss and grid sampling are not simulated; the CUDA context's memory is "
          "an estimate for the model (NVIDIA publishes none); NCCL's buffers follow its documented "
          "defaults with 16 channels, and ranks exchange no data; memory libraries allocate "
          "inside the real cuBLAS and cuDNN is not modelled; peaks are gpumem's "
          "allocator's, which rounds and caches like torch's")


_SITECUSTOMIZE = '''\
# Written by `gpumem simulate` (gpumem/sim/command.py, Note [Setting up the child]).
import os as _os, sys as _sys
try:
    from gpumem.sim.child import _child_setup
    _child_setup()
except Exception as _e:
    _sys.stderr.write("gpumem simulate: cannot record in this process: %s\\n" % (_e,))
def _chain():
    import importlib.util
    here = _os.path.dirname(_os.path.abspath(__file__))
    for d in _sys.path:
        p = _os.path.join(d or _os.getcwd(), "sitecustomize.py")
        if _os.path.abspath(d or _os.getcwd()) != here and _os.path.isfile(p):
            spec = importlib.util.spec_from_file_location("_gpumem_chained_sitecustomize", p)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return
try:
    _chain()
except Exception as _e:
    _sys.stderr.write("gpumem simulate: the shadowed sitecustomize failed: %s\\n" % (_e,))
'''


# -------------------------------------------------------------- the parent

def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``gpumem simulate`` (for cli.COMMANDS)."""
    from gpumem.sim import gpus as sim_gpus
    p.add_argument("--gpu", default=sim_gpus.DEFAULT, metavar="MODEL",
                   help="the GPU model each simulated GPU is: its name, SM count, compute "
                        "capability, shared memory, L2 and memory (default "
                        f"{sim_gpus.DEFAULT}; one of {sim_gpus.names_line()})")
    p.add_argument("--memory", default=None, metavar="SIZE",
                   help="memory of each simulated GPU, e.g. 80GiB, 24GiB, 512MiB (default: "
                        "the model's)")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="number of simulated GPUs (default 1; N under --nproc-per-node N or "
                        "a torchrun command's --nproc-per-node N)")
    _launch.add_arguments(p)
    p.add_argument("--nnodes", default=None, metavar="N",
                   help="with --nproc-per-node G: the job has N x G ranks (default 1 node); "
                        "only the ranks --ranks names are started")
    p.add_argument("--ranks", default=None, metavar="LIST|auto",
                   help="start only these ranks of the job (0,8,63 or 0-3), each seeing the "
                        "full world size and its own rank; auto: rank 0 and the last rank "
                        "(data parallel ranks are alike); default: every rank")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where the snapshots, viewer pages and summary.json go (default: a "
                        "new folder under $XDG_CACHE_HOME/gpumem/simulate or "
                        "~/.cache/gpumem/simulate, never the working directory; the first "
                        "line printed names it)")
    p.add_argument("--max-entries", type=int, default=100_000, metavar="N",
                   help="allocator events kept per device, newest last (default 100000)")
    p.add_argument("--no-view", action="store_true", help="do not write the viewer pages")
    p.add_argument("--categories", action="store_true",
                   help="also record what each allocation is for (parameter, gradient, "
                        "optimizer state, activation, ...) and report the terms of the "
                        "estimation equation, measured")
    p.add_argument("--sample", nargs="?", const="on", default=None, metavar="SPEC",
                   help="record in the always-on sampled mode (GPUMEM_RECORD_SAMPLE): stacks "
                        "for every allocation of 1 MiB or more, sampled by bytes below; "
                        "--sample=SPEC sets it, e.g. --sample=256KiB or "
                        "--sample=mean:512KiB,threshold:1MiB,seed:7")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON (it is also written to DIR/summary.json)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the command to run, usually: python train.py ARGS")


def default_out() -> str:
    """Where a run writes without --out: a new folder named by the time and the
    process under the user's cache ($XDG_CACHE_HOME/gpumem/simulate, else
    ~/.cache/gpumem/simulate, else the temporary folder's gpumem-UID/simulate),
    so that a run never writes into the working tree unless asked."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):   # unset, or relative (which the XDG spec ignores)
        home = os.path.expanduser("~")
        cache = os.path.join(home, ".cache") if os.path.isabs(home) else ""
    base = (os.path.join(cache, "gpumem") if cache
            else os.path.join(tempfile.gettempdir(), f"gpumem-{os.getuid()}"))
    name = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    return os.path.join(base, "simulate", name)


def _error(msg: str) -> int:
    print(f"gpumem: error: {' '.join(msg.split())}", file=sys.stderr)
    return 2


def _exit_status(rc: int) -> int:
    return 128 - rc if rc < 0 else rc   # killed by signal N: 128 + N, as shells report it


def _read_stats(stats_dir: str) -> list[dict]:
    procs = []
    for name in sorted(os.listdir(stats_dir)) if os.path.isdir(stats_dir) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(stats_dir, name), encoding="utf-8") as f:
                    p = json.load(f)
            except (OSError, ValueError):
                continue
            if p.get("incomplete"):
                p["fault"] = _outcome.read_fault(os.path.join(stats_dir, f"{p.get('pid')}.fault"))
                p["fatal_peaks"] = _outcome.read_fatal_peaks(
                    os.path.join(stats_dir, f"{p.get('pid')}.peaks"))
            procs.append(p)
    procs.sort(key=lambda p: (p.get("snapshot") is None, p.get("rank") or 0, p.get("pid") or 0))
    return procs


def _new_oom_files(out: str, since: float) -> list[str]:
    found = []
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if name.startswith("oom_") and name.endswith(".pickle"):
            try:
                if os.path.getmtime(path) >= since - 1:
                    found.append(path)
            except OSError:
                continue
    return found


def _views(procs: list[dict], oom_files: list[str], out: str) -> dict[str, Any]:
    """The viewer page of each snapshot, in --out (gpumem view's write_view)."""
    try:
        from gpumem.snapshots.view import default_output, write_view
    except ImportError as e:
        return {"error": f"the viewer is not available ({e})"}
    pages: dict[str, Any] = {}
    for path in [p["snapshot"] for p in procs if p.get("snapshot")] + oom_files:
        page = os.path.join(out, os.path.basename(default_output(path)))
        try:
            pages[path] = write_view(path, page)["output"]
        except Exception as e:  # a page that cannot be written is reported, not fatal
            pages[path] = {"error": f"{type(e).__name__}: {e}"}
    return pages


def _equations(snapshots: list[str]) -> dict[str, Any]:
    """Per snapshot, per device: the estimation equation's terms, measured
    (gpumem.categories.report.equation_terms)."""
    from gpumem.categories import report as category_report
    from gpumem.snapshots.unpickle import load_snapshot
    from gpumem.snapshots.timeline import build_device, devices_of
    out: dict[str, Any] = {}
    for path in snapshots:
        try:
            snap = load_snapshot(path)
            if not category_report.has_table(snap):
                continue
            rows = {}
            for d in devices_of(snap):
                m = build_device(snap, d)
                cats = category_report.allocation_categories(snap, m)
                terms = category_report.equation_terms(snap, m, cats)
                terms["at_peak"] = category_report.breakdown(m, cats, m.peak_index)
                rows[str(d)] = terms
            out[path] = rows
        except Exception as e:  # reported, not fatal
            out[path] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _equation_lines(eqs: dict[str, Any]) -> list[str]:
    fb = format_bytes
    lines = []
    for path, rows in eqs.items():
        if "error" in rows:
            lines.append(f"categories of {path}: not read ({rows['error']})")
            continue
        for d, t in rows.items():
            gi = t["gradients_plus_optimizer_intermediates"]
            if not t["estimate"]:   # nothing measured: no equation, and no branch to name
                lines.append(f"estimation equation (device {d}): no allocation was noted as a "
                             f"parameter, optimizer state, gradient or activation (measured peak "
                             f"allocated {fb(t['measured_peak'])}, unknown at the peak "
                             f"{fb(t['at_peak']['unknown'])})")
                continue
            lines.append(f"estimation equation, measured (device {d}, each term at its own peak):")
            lines.append(f"  parameters {fb(t['parameters'])} + optimizer state "
                         f"{fb(t['optimizer_state'])} + max(gradients + optimizer intermediates "
                         f"{fb(gi)}, activations {fb(t['activations'])}) = {fb(t['estimate'])}")
            lines.append(f"    (gradients {fb(t['gradients'])}, optimizer intermediates "
                         f"{fb(t['optimizer_intermediates'])})")
            a = t["at_peak"]
            if t.get("peak_branch") and (a["activation"] or a["gradient"]):
                lines.append(f"  measured peak allocated {fb(t['measured_peak'])}: the "
                             f"{t['peak_branch'].replace('_', ' ')} branch sets it (at the peak: "
                             f"activations {fb(a['activation'])}, gradients "
                             f"{fb(a['gradient'])}); not in the equation: temporaries "
                             f"{fb(a['temporary'])}, autograd detail "
                             f"{fb(a['autograd_detail'])}, inputs {fb(a['input'])}, unknown "
                             f"{fb(a['unknown'])}")
    return lines


def _report(cmd: list[str], rc: int, memory: int, devices: int, out: str, procs: list[dict],
            oom_files: list[str], pages: dict, seconds: float,
            context: int = 0, signalled: Optional[str] = None) -> dict[str, Any]:
    """context: device memory the CUDA context holds, which no allocation can
    have: the script fits if its peak fits in memory - context.  signalled:
    the signal that stopped gpumem simulate itself (SIGTERM, SIGINT), if any.
    A run that failed (status not 0, an uncaught exception, a fatal signal,
    a rank that vanished) or was stopped never fits: its verdict is
    "failed" or "stopped" unless it ran out of memory ("no")."""
    missing = [p for p in procs if p.get("torch_missing")]
    outcomes = {p.get("pid"): o for p in procs if (o := _outcome.outcome(p, rc)) is not None}
    failed = [(p, outcomes[p.get("pid")]) for p in procs
              if p.get("pid") in outcomes and outcomes[p.get("pid")]["kind"] != "stopped"]
    stopped = [(p, outcomes[p.get("pid")]) for p in procs
               if p.get("pid") in outcomes and outcomes[p.get("pid")]["kind"] == "stopped"]
    unrecorded = [p for p in procs if p.get("install_error")]
    crashed = [p for p in procs if p.get("incomplete")]
    procs = [p for p in procs if not p.get("incomplete") and not p.get("install_error")
             and not p.get("torch_missing")]
    rows = []
    for p in procs:
        for d, v in sorted((p.get("devices") or {}).items(), key=lambda kv: int(kv[0])):
            rows.append({"pid": p.get("pid"), "rank": p.get("rank"), "device": int(d),
                         "peak_allocated": v.get("allocated", 0),
                         "peak_reserved": v.get("reserved", 0), "num_ooms": v.get("num_ooms", 0),
                         "allocated_at_exit": v.get("allocated_end", 0),
                         "reserved_at_exit": v.get("reserved_end", 0),
                         "device_peak": v.get("device_peak"),
                         "peak_resets": v.get("resets", 0),
                         "peak_allocated_since_reset": v.get("allocated_since_reset"),
                         "peak_reserved_since_reset": v.get("reserved_since_reset")})
    ooms = sum(r["num_ooms"] for r in rows) or len(oom_files)
    peak = max((r["peak_reserved"] for r in rows), default=None)
    verdict = None
    if ooms and rc == 0 and rows:
        fits, verdict = None, "not everything it tried"
        why = (f"the script ran out of memory {_times(ooms)}, caught the error and finished "
               f"with status 0; peak reserved {format_bytes(peak)}, "
               f"{100.0 * peak / memory:.1f}% of the device; the allocation that failed is in "
               f"the OOM snapshot")
    elif ooms:
        fits, why = False, f"{ooms} allocation(s) failed with out of memory"
    elif signalled or (rc != 0 or failed) and (rows or failed or stopped):
        fits, verdict = None, "stopped" if signalled or (stopped and not failed) else "failed"
        where = _outcome.failure_text(failed, stopped, signalled)
        if signalled:
            why = f"gpumem simulate was stopped by {signalled} after {seconds:.1f} s"
        else:
            why = f"the run failed with status {rc}"
        why += f": {where}" if where else ""
        held = max((v for p, _ in failed for v in (p.get("fatal_peaks") or {}).values()),
                   default=None)
        when = "stop" if verdict == "stopped" else "failure"
        if peak is not None:
            why += (f"; peak reserved before the {when} {format_bytes(peak)}, "
                    f"{100.0 * peak / memory:.1f}% of the device")
        if held is not None:
            why += (f"; before the {when} the simulated device held at most "
                    f"{format_bytes(held)} (with the CUDA context), in the process that died")
        elif peak is None:
            why += "; no statistics, so no peak"
    elif unrecorded:
        fits, why = None, (f"gpumem could not be installed in {len(unrecorded)} process(es) "
                           "using torch, so their memory was not measured")
    elif rc != 0 and not rows:   # failed before anything was measured: never "unknown"
        fits, verdict = None, "failed"
        why = (f"the command exited with status {rc} before any CUDA memory was measured; "
               "its error is above")
    elif not rows:
        fits, why = None, ("no CUDA memory was used" if procs else
                           "torch's CUDA build is missing, see above" if missing else
                           "the command never imported torch")
        if crashed:
            why = (f"no statistics: {len(crashed)} process(es) using torch did not exit "
                   "normally (killed, crashed or os._exit)")
    else:
        usable = max(memory - context, 0)
        fits = all(_rank_report.row_fits(r, memory, usable) for r in rows)
        why = f"peak reserved {format_bytes(peak)}, {100.0 * peak / memory:.1f}% of the device"
        if context:
            why += (f"; the CUDA context holds {format_bytes(context)}, leaving "
                    f"{format_bytes(usable)}")
        device_peak = max((r["device_peak"] or 0 for r in rows), default=0)
        if device_peak > peak + context:
            why += (f"; with memory outside the allocator (NCCL's buffers, libraries' own "
                    f"cudaMalloc) the device held at most {format_bytes(device_peak)}")
    if verdict is None:
        verdict = {True: "yes", False: "no", None: "unknown"}[fits]
    return {"command": cmd, "exit_status": rc, "seconds": round(seconds, 3), "memory": memory,
            "context_memory": context, "devices": devices, "out": out, "per_device": rows,
            "fits": fits, "fits_reason": why,
            "verdict": verdict,
            "snapshots": [p["snapshot"] for p in procs if p.get("snapshot")],
            "script_snapshots": sorted({f for p in procs for f in p.get("script_snapshots") or []}),
            "script_stops": sum(p.get("script_stops") or 0 for p in procs),
            "oom_snapshots": oom_files, "views": pages,
            "errors": [f"pid {p.get('pid')}: {p['error']}" for p in procs if p.get("error")]
            + [f"pid {p.get('pid')} ({' '.join(p.get('argv') or [])}) did not exit normally: "
               "no snapshot or statistics from it" for p in crashed]
            + [f"pid {p.get('pid')} ({' '.join(p.get('argv') or [])}): gpumem could not be "
               f"installed ({p['install_error']})" for p in unrecorded],
            "unrecorded": len(unrecorded),
            "torch_missing": _torch_missing_line(missing) if missing and not rows else None,
            "signal": signalled,
            "failures": [{"pid": p.get("pid"), "rank": p.get("rank"), **o,
                          "device_peak": max((p.get("fatal_peaks") or {}).values(), default=None)}
                         for p, o in failed],
            "stopped": [{"pid": p.get("pid"), "rank": p.get("rank"), **o} for p, o in stopped],
            **_rank_report.per_rank(rows, crashed, oom_files, memory, context,
                                    outcomes=outcomes, signalled=signalled),
            # what the simulation cannot tell matters only where it measured something
            "limits": LIMITS if rows or ooms else None}


#: torch 2.14.1's CUDA 13.0 wheels, the build gpumem is tested with (pyproject's test extra)
TORCH_INDEX = "https://download.pytorch.org/whl/cu130"


def _torch_missing_line(missing: list[dict]) -> str:
    """One line: the run's Python has no torch, or a torch without CUDA, and how to fix it."""
    p = missing[0]
    python = p.get("python") or "python"
    if p["torch_missing"] == "absent":
        what = f"torch is not installed in this environment ({python})"
        pip = f"{python} -m pip install torch --index-url {TORCH_INDEX}"
    else:
        what = (f"this environment's torch ({p['torch_missing']}, {python}) has no CUDA "
                "support, which the simulated GPU needs")
        pip = f"{python} -m pip install --force-reinstall torch --index-url {TORCH_INDEX}"
    return f"{what}: install its CUDA build, for example: {pip}"


def _context_memory(env: dict, model: dict) -> int:
    """What the simulated context holds: the override, or the model's."""
    from gpumem import sim
    for var in ("GPUMEM_FAKECUDA_CONTEXT_MEMORY", "GPUMEM_SIM_CONTEXT_MEMORY"):
        if env.get(var):
            try:
                return sim.parse_size(env[var])
            except sim.SimError:
                break
    return model["context_memory"]


def _times(n: int) -> str:
    return "once" if n == 1 else "twice" if n == 2 else f"{n} times"


def _since_reset(row: dict) -> str:
    """The peaks the script itself reads, when it reset them (the whole-run
    figures before it include what came before, a compile step's, say)."""
    if not row.get("peak_resets") or row.get("peak_allocated_since_reset") is None:
        return ""
    return (f"; since the script's last "
            f"torch.cuda.reset_peak_memory_stats(), which its own figures start from: "
            f"allocated {format_bytes(row['peak_allocated_since_reset'])}, reserved "
            f"{format_bytes(row['peak_reserved_since_reset'])}")


def _print_report(r: dict[str, Any]) -> None:
    lines = [f"gpumem simulate: {shlex.join(r['command'])} exited with status {r['exit_status']} "
             f"after {r['seconds']:.1f} s on {r['devices']} simulated GPU(s) of "
             f"{format_bytes(r['memory'], whole_units=True)}"
             + (f", {r['gpu']['model']}" if r.get("gpu") else "")]
    if r.get("torch_missing"):
        lines.append(f"gpumem simulate: {r['torch_missing']}")
    lines.extend(_rank_report.rank_lines(r))
    if r["per_device"] and not r.get("per_rank"):
        lines.append("peak memory (gpumem's allocator, over the whole run):")
        multi = len({(row["pid"]) for row in r["per_device"]}) > 1
        for row in r["per_device"]:
            who = ""
            if multi:
                who = (f"rank {row['rank']} " if row["rank"] is not None else f"pid {row['pid']} ")
            lines.append(f"  {who}device {row['device']}: allocated "
                         f"{format_bytes(row['peak_allocated'])}, "
                         f"reserved {format_bytes(row['peak_reserved'])}"
                         + (f", {row['num_ooms']} OOM(s)" if row["num_ooms"] else "")
                         + _since_reset(row))
    if r["verdict"] in ("failed", "stopped"):   # never a "yes" for a run that did not finish
        lines.append(f"the run {r['verdict']}, so whether it fits in "
                     f"{format_bytes(r['memory'], whole_units=True)} is not known "
                     f"({r['fits_reason']})")
    else:
        lines.append(f"fits in {format_bytes(r['memory'], whole_units=True)}: {r['verdict']} "
                     f"({r['fits_reason']})")
    for path in r["snapshots"]:
        lines.append(f"snapshot: {path}")
        page = r["views"].get(path) if isinstance(r["views"], dict) else None
        if isinstance(page, str):
            lines.append(f"viewer:   {page} (works offline; or run: gpumem view {path})")
        elif isinstance(page, dict):
            lines.append(f"viewer:   not written ({page['error']})")
    if r["script_stops"]:
        lines.append(f"the script turned recording off {_times(r['script_stops'])}; simulate kept "
                     "recording, so its snapshot covers the whole run")
    for path in r["script_snapshots"]:
        lines.append(f"snapshot written by the script: {path} (view it: gpumem view {path})")
    for path in r["oom_snapshots"]:
        page = r["views"].get(path) if isinstance(r["views"], dict) else None
        lines.append(f"OOM snapshot: {path}" + (f" (viewer: {page})" if isinstance(page, str)
                                                 else ""))
    if isinstance(r["views"], dict) and "error" in r["views"]:
        lines.append(f"viewer: not written ({r['views']['error']})")
    lines.extend(_equation_lines(r.get("equation") or {}))
    for e in r["errors"]:
        lines.append(f"error in the run: {e}")
    if r.get("limits"):
        lines.append(f"{r['limits']}.")
    print("\n".join(lines), flush=True)


def _world_of(args: argparse.Namespace, nproc: int, cmd: list[str]) -> dict[str, Any]:
    """The job of --nnodes x --nproc-per-node ranks and the ranks --ranks starts
    (gpumem/sim/world.py; every rank when --ranks is not given)."""
    nnodes = _world.parse_nnodes(args.nnodes) or 1
    size = nnodes * nproc
    if size > _world.MAX_WORLD:
        raise _world.WorldError(f"the job has {size} ranks; at most {_world.MAX_WORLD}")
    text = args.ranks if args.ranks is not None else f"0-{size - 1}"
    ranks = _world.parse_ranks(text, size)
    auto = text.strip().lower() == "auto"
    return {"nnodes": nnodes, "nproc_per_node": nproc, "world_size": size, "ranks": ranks,
            "how": "auto" if auto else "list",
            "stands_for": _world.stands_for(ranks, size, auto)}


def run(args: argparse.Namespace) -> int:
    """``gpumem simulate`` with parsed arguments; returns the command's exit status."""
    from gpumem import sim
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        return _error("no command given; put it after --, for example: "
                      "gpumem simulate --memory 80GiB -- python train.py")
    if args.max_entries < 1:
        return _error(f"--max-entries must be at least 1, not {args.max_entries}")
    world = None
    try:
        nproc = _launch.parse_nproc(args.nproc_per_node)
        devices = _launch.devices_for(args.devices, nproc, cmd)
        if (args.nnodes is not None or args.ranks is not None) and nproc is None:
            raise _world.WorldError("--nnodes and --ranks need --nproc-per-node (the ranks of "
                                    "one node), for example: --nnodes 8 --nproc-per-node 8 "
                                    "--ranks 0")
        if args.nnodes is not None or args.ranks is not None:
            world = _world_of(args, nproc, cmd)
            cmd = _world.launch_command(cmd, world["nnodes"], nproc, world["ranks"])
        elif nproc is not None:
            cmd = _launch.launch_command(cmd, nproc)
    except (_launch.LaunchError, _world.WorldError) as e:
        return _error(str(e))
    try:
        from gpumem.sim import gpus as sim_gpus
        try:
            model = sim_gpus.lookup(args.gpu)
        except ValueError as e:
            return _error(f"--gpu: {e}")
        memory = sim.parse_size(args.memory) if args.memory is not None else model["memory"]
        base = dict(os.environ)
        context = _context_memory(base, model)
        if memory <= context:
            return _error(f"--memory {format_bytes(memory, whole_units=True)} leaves nothing "
                          f"beside the CUDA context of the simulated {model.key} "
                          f"({format_bytes(context, whole_units=True)}), which every process "
                          "using the GPU holds; give more than that; nothing was run")
        env_probe = sim.sim_env(memory=memory, devices=devices, base=base, gpu=model.key,
                                command=cmd)
        _launch.host_memory_env(env_probe, args.host_memory, nproc)
        if args.sample is not None:
            env_probe[ENV_SAMPLE] = args.sample
    except sim.SimError as e:
        return _error(str(e))
    out = os.path.abspath(args.out if args.out is not None else default_out())
    probe = dict(env_probe)
    probe.setdefault("GPUMEM_OOM_SNAPSHOT", out)
    try:  # what install() would refuse in the child is refused here, before running anything
        from gpumem.pytorch.installer import AllocConfError, check_environment
        check_environment(probe)
    except AllocConfError as e:
        return _error(f"{e}; nothing was run")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        return _error(f"cannot create --out {out} ({e.strerror})")
    boot = tempfile.mkdtemp(prefix="gpumem-simulate-")
    signalled = 0
    try:
        with open(os.path.join(boot, "sitecustomize.py"), "w", encoding="utf-8") as f:
            f.write(_SITECUSTOMIZE)
        stats_dir = os.path.join(boot, "stats")
        os.mkdir(stats_dir)
        env = env_probe
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        paths = [boot] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [pkg_root]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env[ENV_OUT], env[ENV_STATS] = out, stats_dir
        env[ENV_PARENT], env[ENV_ENTRIES] = str(os.getpid()), str(args.max_entries)
        env[ENV_CATEGORIES] = "1" if args.categories else "0"
        env["GPUMEM_SIM_FATAL_PEAKS"] = os.path.join(stats_dir, "%p.peaks")
        env.setdefault("GPUMEM_OOM_SNAPSHOT", out)
        if not args.json:
            print(f"gpumem simulate: writing into {out}", file=sys.stderr, flush=True)
            print(f"gpumem simulate: running {shlex.join(cmd)} on {devices} simulated GPU(s) "
                  f"of {format_bytes(memory, whole_units=True)} (memory behaviour only: kernels "
                  "compute nothing)",
                  file=sys.stderr, flush=True)
        start, wall_start = time.monotonic(), time.time()
        try:
            proc = subprocess.Popen(cmd, env=env)
        except OSError as e:
            print(f"gpumem: error: cannot run {cmd[0]!r}: {e.strerror}", file=sys.stderr)
            return 127
        rc, signalled = _wait(proc)
        seconds = time.monotonic() - start
        rc = _exit_status(rc)
        procs = _read_stats(stats_dir)
        oom_files = {f for p in procs for f in p.get("oom_snapshots") or []}
        if env["GPUMEM_OOM_SNAPSHOT"] == out:   # also those of processes that died after
            oom_files.update(_new_oom_files(out, wall_start))
        oom_files = sorted(oom_files)
        pages = {} if args.no_view else _views(procs, oom_files, out)
        report = _report(cmd, rc, memory, devices, out, procs, oom_files, pages, seconds,
                         context=context,
                         signalled=signalled and signal.Signals(signalled).name)
        report["gpu"] = sim_gpus.describe(model)
        if world is not None:
            report["world"] = {k: v for k, v in world.items() if k != "stands_for"}
            if world["how"] == "auto":
                meshes = [m for p in procs for m in p.get("meshes") or []]
                report["world"]["advice"] = _world.auto_advice(meshes, world["world_size"],
                                                               world["ranks"])
            for row in report.get("per_rank") or []:
                row["stands_for"] = world["stands_for"].get(row["rank"])
        if args.categories:
            report["equation"] = _equations(report["snapshots"])
        write_report(os.path.join(out, "summary.json"), report, "gpumem simulate")
        if args.json:
            print(json.dumps(report, indent=2), flush=True)
        else:
            _print_report(report)
        if report["unrecorded"] and rc == 0:
            return _error(f"gpumem could not be installed in {report['unrecorded']} process(es) "
                          "of the run, so the report does not cover them (see above)")
        return rc
    finally:
        shutil.rmtree(boot, ignore_errors=True)
        if signalled:   # end as the signal would have ended us: the shell sees 128 + N
            signal.signal(signalled, signal.SIG_DFL)
            os.kill(os.getpid(), signalled)



def write_report(path: str, report: dict, prog: str) -> None:
    """A run's JSON report (summary.json, fit.json), written atomically; a
    write that fails is one line on stderr, never the run's end."""
    try:
        write_atomic(path, lambda f: f.write(json.dumps(report, indent=2).encode("utf-8")))
    except OSError as e:
        print(f"{prog}: cannot write {os.path.basename(path)}: {e.strerror or e}", file=sys.stderr)


STOP_GRACE = 20.0   # seconds the run has to write its snapshots after SIGTERM or SIGINT


def _descendants(pid: int) -> list[int]:
    """Every living process below pid (Linux's /proc), children first."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(0), []):
            out.append(c)
            todo.append(c)
    return out


def _wait(proc: subprocess.Popen) -> tuple[int, int]:
    """Wait for the command; (its exit status, the stop signal or 0).

    Note [Stopping a run]
    Rationale: SIGTERM to gpumem simulate ended it at once and left the
      script running; SIGINT to it alone waited 30 s, killed the script and
      wrote no snapshot.
    Approach: SIGTERM or SIGINT is passed on to the command (torchrun passes
      it on to its ranks; each Python process of the run unwinds and writes
      its snapshot: Note [How a process of the run ends] in
      gpumem/sim/child.py).  A process still there STOP_GRACE seconds
      later, or at a second signal, is killed with SIGKILL together with
      everything it started.  The report is then written from what was
      recorded, and gpumem simulate ends with the signal it got.  A signal
      ignored when gpumem simulate started stays ignored, by it and by the
      run (Note [An ignored stop signal] in gpumem/sim/__init__.py).
    Limitations: a process that ignores the signal and outlives its parent
      (a daemon that left the process tree) is not found."""
    got: list[int] = []

    def on_signal(signo: int, frame: Any) -> None:
        got.append(signo)
        try:
            if len(got) == 1:
                proc.send_signal(signo)
        except OSError:
            pass

    old = {s: signal.signal(s, on_signal) for s in _sim.stop_signals()}
    try:
        deadline = None
        while True:
            try:
                return _exit_status(proc.wait(timeout=0.2)), (got[0] if got else 0)
            except subprocess.TimeoutExpired:
                pass
            if got and deadline is None:
                deadline = time.monotonic() + STOP_GRACE
            if deadline is not None and (time.monotonic() > deadline or len(got) > 1):
                for pid in [proc.pid] + _descendants(proc.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                deadline = float("inf")
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m gpumem.sim.command ...``: the same as ``gpumem simulate ...``."""
    p = argparse.ArgumentParser(prog="gpumem simulate", description=HELP)
    add_arguments(p)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
