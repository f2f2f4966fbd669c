"""``gpumem fit``: the largest value of one knob that fits, each probe a simulated run.

    gpumem fit [--gpu MODEL ...|--memory SIZE] --vary KNOB=LO..HI [--json] [--out DIR] -- COMMAND

The knob is a name, a flag, an environment variable or a config file's key
(gpumem/sim/knob.py
says how each enters the command); the search is gpumem/sim/boundary.py's
bisection.  Each probe is ``gpumem simulate --no-view --out DIR/<gpu>/<value>``
(gpumem/sim/command.py, run as a child process) with the knob set, on a
simulated device of exactly that memory, its output in that folder's
output.log and its report in summary.json; its verdict decides:
- fits: the run finished and gpumem simulate says it fits;
- does not fit: an allocation failed with out of memory (the script raised
  it, or caught it and finished: either way that value needed more than the
  device), or the run failed with an error whose text says out of memory (a
  library's own cudaMalloc);
- anything else (a failed run, no CUDA memory used, gpumem not installed)
  stops the search: the probe's value and its error line are printed, and
  the status is 1.
Results are kept per (GPU, memory, value) within one invocation, so no value
is run twice.  Several --gpu models are searched one after the other and
reported in one table.

Nothing runs before the command, the knob and every GPU model have been
checked: bad input is one line and status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Optional

from gpumem import sim
from gpumem._format import format_bytes
from gpumem.sim import boundary, gpus as sim_gpus, knob as sim_knob
from gpumem.sim.command import default_out, write_report

__all__ = ["HELP", "add_arguments", "run"]

HELP = ("the largest value of one knob (a script argument, a config override, an environment "
        "variable) that fits on a GPU model or memory size: a binary search of simulated runs")


def _count(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 1 << 16:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not "
                                         f"{text[:40]!r}")
    return int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``gpumem fit`` (for cli.COMMANDS)."""
    p.add_argument("--vary", required=True, metavar="KNOB=LO..HI",
                   help="the knob and its range of whole numbers: NAME=LO..HI (the command's "
                        "{NAME} placeholders, NAME=V arguments and --NAME V flags, '-' and '_' "
                        "alike), --vary=--FLAG=LO..HI (only that flag), env:VAR=LO..HI (an "
                        "environment variable), or FILE:KEY=LO..HI (a dotted key of a .toml, "
                        ".yaml or .json file the command names; each probe gets a copy)")
    p.add_argument("--gpu", action="append", metavar="MODEL",
                   help=f"a GPU model to search on; repeat it for several (default "
                        f"{sim_gpus.DEFAULT}; one of {sim_gpus.names_line()})")
    p.add_argument("--memory", default=None, metavar="SIZE",
                   help="memory of the simulated GPU, e.g. 24GiB (default: the model's; with "
                        "one --gpu at most)")
    p.add_argument("--devices", type=_count, default=None, metavar="N",
                   help="passed to gpumem simulate: number of simulated GPUs")
    p.add_argument("--nproc-per-node", type=_count, default=None, metavar="N",
                   help="passed to gpumem simulate: run the command on N ranks (torchrun)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where each probe's run goes, DIR/<gpu>/<knob>-<value>/, and "
                        "fit.json (default: a new folder under the user's cache, as gpumem "
                        "simulate's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the command, holding the knob: python train.py --batch-size 8")


def _error(msg: str) -> int:
    print(f"gpumem: error: {' '.join(msg.split())}", file=sys.stderr)
    return 2


class _Stopped(Exception):
    """gpumem fit got SIGTERM or SIGINT."""


class _Runner:
    """Runs probes as ``python -m gpumem.sim.command`` children and classifies
    their reports; passes SIGTERM/SIGINT on to the running one."""

    def __init__(self, cmd: list[str], knob: sim_knob.Knob, out: str, sim_args: list[str],
                 quiet: bool):
        self.cmd, self.knob, self.out, self.sim_args, self.quiet = cmd, knob, out, sim_args, quiet
        self.proc: Optional[subprocess.Popen] = None
        self.signalled = 0
        self.cache: dict[tuple[str, int, int], dict[str, Any]] = {}

    def on_signal(self, signo: int, frame: Any) -> None:
        if not self.signalled:
            self.signalled = signo
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(signo)
            except OSError:
                pass

    def probe(self, model: sim_gpus.GpuModel, memory: int, value: int) -> dict[str, Any]:
        key = (model.key, memory, value)
        if key in self.cache:
            return self.cache[key]
        if self.signalled:
            raise _Stopped()
        where = os.path.join(self.out, model.key, f"{_slug(self.knob.name)}-{value}")
        os.makedirs(where, exist_ok=True)
        cmd, env = sim_knob.apply(self.knob, self.cmd, dict(os.environ), value, where)
        argv = [sys.executable, "-m", "gpumem.sim.command", "--gpu", model.key,
                "--memory", str(memory), "--out", where, "--no-view", *self.sim_args, "--", *cmd]
        start = time.monotonic()
        log_path = os.path.join(where, "output.log")
        with open(log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            rc = self.proc.wait()
            self.proc = None
        seconds = time.monotonic() - start
        if self.signalled:
            raise _Stopped()
        row = _classify(value, _read_json(os.path.join(where, "summary.json")), rc, log_path)
        row.update(seconds=round(seconds, 2), out=where, command=cmd)
        self.cache[key] = row
        if not self.quiet:
            what = {True: "fits", False: "does not fit", None: "failed"}[row["fits"]]
            print(f"gpumem fit: {self.knob.label}={value} on {model.key} "
                  f"({format_bytes(memory, whole_units=True)}): {what}"
                  + (f", peak reserved {format_bytes(row['peak_reserved'])}"
                     if row["peak_reserved"] is not None else "")
                  + f" ({seconds:.1f} s)", file=sys.stderr, flush=True)
        return row


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_." else "-" for c in name.lstrip("-")) or "knob"


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(max(0, os.path.getsize(path) - 8192))
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


_OOM_WORDS = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def _classify(value: int, report: Optional[dict], rc: int, log_path: str) -> dict[str, Any]:
    """One probe's row: fits True / False, or None with the error that stops the search."""
    row: dict[str, Any] = {"value": value, "fits": None, "exit_status": rc,
                           "peak_allocated": None, "peak_reserved": None, "device_peak": None,
                           "reason": None, "error": None}
    if report is None:
        row["error"] = (f"gpumem simulate exited with status {rc} and wrote no report: "
                        f"{_last_line(log_path) or 'no output'}")
        return row
    rows = report.get("per_device") or []
    for k in ("peak_allocated", "peak_reserved", "device_peak"):
        vals = [r[k] for r in rows if r.get(k) is not None]
        row[k] = max(vals) if vals else None
    row["reason"] = report.get("fits_reason")
    failures = report.get("failures") or []
    oom_failure = any(any(w.lower() in (f.get("what") or "").lower() for w in _OOM_WORDS)
                      for f in failures)
    if report.get("fits") is True:
        row["fits"] = True
    elif report.get("fits") is False or report.get("verdict") == "not everything it tried":
        row["fits"] = False
    elif report.get("verdict") == "failed" and oom_failure:
        row["fits"] = False
    else:
        line = row["reason"] or f"status {rc}"
        if not failures:   # the error is in the command's own output
            line += f"; last line of its output: {_last_line(log_path) or 'none'}"
        row["error"] = line
    return row


def _models(args: argparse.Namespace) -> list[tuple[sim_gpus.GpuModel, int]]:
    """(model, memory) per search; ValueError with one sentence for bad input."""
    names = args.gpu or [sim_gpus.DEFAULT]
    if args.memory is not None and len(names) > 1:
        raise ValueError("--memory sets one size for one --gpu; with several --gpu models each "
                         "is searched with its own memory")
    out = []
    for name in names:
        try:
            model = sim_gpus.lookup(name)
        except ValueError as e:
            raise ValueError(f"--gpu: {e}") from None
        try:
            memory = sim.parse_size(args.memory) if args.memory is not None else model["memory"]
        except sim.SimError as e:
            raise ValueError(f"--memory: {e}") from None
        context = model["context_memory"]
        if memory <= context:
            raise ValueError(f"--memory {format_bytes(memory, whole_units=True)} leaves nothing "
                             f"beside the CUDA context of the simulated {model.key} "
                             f"({format_bytes(context, whole_units=True)}); give more")
        if all(m.key != model.key for m, _ in out):
            out.append((model, memory))
    return out


def _sim_args(args: argparse.Namespace) -> list[str]:
    out = []
    for flag, value in (("--devices", args.devices), ("--nproc-per-node", args.nproc_per_node)):
        if value is not None:
            out += [flag, str(value)]
    return out


def _table(knob: sim_knob.Knob, searches: list[dict]) -> list[str]:
    head = ["gpu", "memory", knob.label, "peak allocated", "peak reserved", "device peak", "fits"]
    body = []
    for s in searches:
        for r in sorted(s["probes"], key=lambda r: r["value"]):
            fb = lambda n: "-" if n is None else format_bytes(n)   # noqa: E731
            fits = {True: "yes", False: "no", None: "failed"}[r["fits"]]
            body.append([s["gpu"], format_bytes(s["memory"], whole_units=True), str(r["value"]),
                         fb(r["peak_allocated"]), fb(r["peak_reserved"]), fb(r["device_peak"]),
                         fits])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt = lambda row: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)   # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths))).rstrip()
    return [fmt(head)] + [fmt(row) for row in body]


def _verdict(knob: sim_knob.Knob, s: dict) -> str:
    on = f"on {s['gpu']} ({format_bytes(s['memory'], whole_units=True)})"
    n, lo, hi = s["largest"], knob.lo, knob.hi
    if s["stopped_at"] is not None:
        known = (f"; before it, {knob.label}={n} fits" if n is not None else "")
        return (f"{on}: the search stopped: the probe at {knob.label}={s['stopped_at']} failed "
                f"(not out of memory): {s['error']} (its output: {s['stopped_out']})" + known)
    if n is None:
        return f"{on}: nothing fits: {knob.label}={lo}, the range's lowest, does not"
    if s["first_no"] is None:
        return (f"{on}: the whole range fits: {knob.label}={hi}, its highest, does; raise HI "
                "to search further")
    return (f"{on}: the largest {knob.label} that fits is {n} ({s['first_no']} does not), "
            f"{len(s['probes'])} probes in {s['seconds']:.1f} s")


def run(args: argparse.Namespace) -> int:
    """``gpumem fit`` with parsed arguments: 0 when every search ended, 1 when a
    probe failed for another reason than memory, 2 for bad input."""
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        return _error("no command given; put it after --, for example: gpumem fit --memory "
                      "24GiB --vary batch-size=1..64 -- python train.py --batch-size 8")
    try:
        knob = sim_knob.parse(args.vary)
        where = sim_knob.locate(knob, cmd)
        models = _models(args)
    except ValueError as e:
        return _error(str(e))
    out = os.path.abspath(args.out if args.out is not None else default_out())
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        return _error(f"cannot create --out {out} ({e.strerror})")
    if not args.json:
        print(f"gpumem fit: writing into {out}", file=sys.stderr, flush=True)
        print(f"gpumem fit: {knob.label} from {knob.lo} to {knob.hi} ({where}) in "
              f"{shlex.join(cmd)}", file=sys.stderr, flush=True)
    runner = _Runner(cmd, knob, out, _sim_args(args), quiet=args.json)
    old = {s: signal.signal(s, runner.on_signal) for s in sim.stop_signals()}
    start = time.monotonic()
    searches = []
    try:
        for model, memory in models:
            t0 = time.monotonic()
            rows: dict[int, dict] = {}

            def probe(value: int, model=model, memory=memory) -> tuple[bool, Optional[int]]:
                row = rows[value] = runner.probe(model, memory, value)
                if row["fits"] is None:
                    raise boundary.Stop(row["error"])
                return row["fits"], row["device_peak"]

            try:
                b = boundary.search(knob.lo, knob.hi, probe, capacity=memory)
            except _Stopped:
                break
            searches.append({"gpu": model.key, "memory": memory, "largest": b.largest,
                             "first_no": b.first_no, "stopped_at": b.stopped_at,
                             "error": b.reason,
                             "stopped_out": rows[b.stopped_at]["out"] if b.stopped_at is not
                             None else None,
                             "seconds": round(time.monotonic() - t0, 2),
                             "probes": [rows[v] for v, _ in b.probes]
                             + ([rows[b.stopped_at]] if b.stopped_at is not None else [])})
            if b.stopped_at is not None:
                break
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    report = {"knob": {"kind": knob.kind, "name": knob.name, "where": where, "lo": knob.lo,
                       "hi": knob.hi},
              "command": cmd, "out": out, "seconds": round(time.monotonic() - start, 2),
              "signal": signal.Signals(runner.signalled).name if runner.signalled else None,
              "searches": searches}
    write_report(os.path.join(out, "fit.json"), report, "gpumem fit")
    if args.json:
        print(json.dumps(report, indent=2), flush=True)
    else:
        lines = _table(knob, searches) if searches else []
        lines += [_verdict(knob, s) for s in searches]
        if runner.signalled:
            lines.append(f"gpumem fit was stopped by {report['signal']}")
        print("\n".join(lines), flush=True)
    if runner.signalled:
        return 128 + runner.signalled
    return 1 if any(s["stopped_at"] is not None for s in searches) else 0
