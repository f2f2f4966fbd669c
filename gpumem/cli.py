"""Command line: ``python -m gpumem <command> ...``.

Commands are registered in COMMANDS (name -> (help, add_arguments, run)); each
run(args) returns the exit status.  Errors a user can fix (a bad file, a bad
settings string) print one line, ``gpumem: error: ...``, on stderr and exit
with status 2, the same status argparse uses for usage errors; no traceback.
An unexpected exception (a gpumem bug) is also one line, with status 1,
unless GPUMEM_TRACEBACK=1 is set.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from typing import Any, Callable

from gpumem._conf import ConfError, parse_uint
from gpumem._format import format_bytes
from gpumem._sampling import describe as describe_sampling
from gpumem.pytorch import shim_build as _shim_build
from gpumem.sim import command as _simulate, fit as _fit
from gpumem.checkup.doctor import (HELP as _DOCTOR_HELP, add_arguments as _add_doctor_args,
                                   run as _run_doctor)
from gpumem.sim import SimError, parse_size
from gpumem.snapshots.unpickle import (MAX_BYTES, MIN_RECORDS, RECORD_BYTES, Limits,
                                       SnapshotError, gc_paused, load_snapshot)

__all__ = ["main", "COMMANDS", "format_bytes"]

PROG = "gpumem"
EXIT_USAGE = 2
EXIT_INTERNAL = 1


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, like gpumem's other errors."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _print_error(f"{message} (run '{self.prog} --help' for usage)")
        raise SystemExit(EXIT_USAGE)


def _print_error(message: str) -> None:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)


# ------------------------------------------------------------------ replay

def _records_arg(text: str) -> int:
    value = parse_uint(text.strip(), 1 << 62)
    if not value:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not {text[:40]!r}")
    return value


def _bytes_arg(text: str) -> int:
    try:
        return parse_size(text)
    except SimError:
        raise argparse.ArgumentTypeError(f"expected a size such as 4GiB or 1048576, not "
                                         f"{text[:40]!r}") from None


LIMITS_HELP = (
    "Input files: only regular files are read (a FIFO, a device or a socket is refused), "
    f"at most --max-bytes of them (default {MAX_BYTES >> 30} GiB). A recorder writes every "
    f"segment, block and trace entry as a dict of its own, at least {RECORD_BYTES} bytes of "
    "pickle each, so a file whose segments, blocks and trace entries (each reference to a "
    f"shared list counted) number more than one per {RECORD_BYTES} bytes (and more than "
    f"{MIN_RECORDS:,}) repeats objects to look large and is refused; --max-records N sets "
    "that limit instead. Refusals are one line and exit status 2.")


def _add_limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-bytes", type=_bytes_arg, default=MAX_BYTES, metavar="SIZE",
                   help=f"the largest snapshot file read (default {MAX_BYTES >> 30}GiB)")
    p.add_argument("--max-records", type=_records_arg, metavar="N",
                   help=f"the most segments, blocks and trace entries a snapshot may hold "
                        f"(default: one per {RECORD_BYTES} bytes of the file, at least "
                        f"{MIN_RECORDS})")


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(max_bytes=args.max_bytes, max_records=args.max_records)


def _add_replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", metavar="SNAPSHOT.pickle",
                   help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--conf", default=None, metavar="SETTINGS",
                   help="allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, for example "
                        "'expandable_segments:True,max_split_size_mb:128' (default: the "
                        "settings the snapshot was recorded with; '' for torch's defaults)")
    p.add_argument("--memory", default=None, metavar="SIZE",
                   help="the device's memory, e.g. 80GiB or 24GB (default: the recording "
                        "device's, when the trace has out-of-memory entries, else unbounded)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_limit_args(p)


def _fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.3f}"


def _ops_text(row: dict[str, Any]) -> str:
    blocks, frees = row["live_from_start_blocks"], row["live_from_start_frees"]
    if not blocks and not frees:
        return f"{row['ops']}"
    return (f"{row['ops']} (first {blocks + frees} blocks live from the start: {blocks} active "
            f"in the segments, {frees} freed by the trace)")


def _device_lines(row: dict[str, Any]) -> list[str]:
    torch_peak = row["torch_peak_reserved"]
    rows = [
        ("trace events", f"{row['events']}"),
        ("ops replayed", _ops_text(row)),
        ("peak allocated", format_bytes(row["peak_allocated"])),
        ("gpumem peak reserved", f"{format_bytes(row['gpumem_peak_reserved'])} "
                                 f"(reserved/allocated {_fmt_ratio(row['ratio'])})"),
        ("torch peak reserved", "unknown (no segment events in the trace)" if torch_peak is None
         else f"{format_bytes(torch_peak)} (gpumem/torch {_fmt_ratio(row['ratio_vs_torch'])})"),
        ("torch reserved at end", format_bytes(row["torch_reserved_end"])),
        ("device memory", _capacity_text(row)),
        ("cache releases", f"{row['releases']} (where the trace shows torch releasing)"),
        ("device allocations", f"{row['num_device_alloc']} (retries {row['num_alloc_retries']})"),
        ("OOMs trace / replay", f"{row['trace_ooms']} / {row['replay_ooms']}"),
    ]
    if row["unknown_frees"] or row.get("stray_frees") or row.get("implicit_frees"):
        rows.append(("inconsistencies", f"{row['unknown_frees']} unknown frees, "
                                        f"{row.get('stray_frees', 0)} stray frees, "
                                        f"{row.get('implicit_frees', 0)} double allocs"))
    speed = row["events_per_s"]
    rows.append(("replay speed", "-" if speed is None else f"{speed / 1e6:.2f} M ops/s"))
    width = max(len(k) for k, _ in rows)
    return [f"  {k:<{width}}  {v}" for k, v in rows]


def _capacity_text(row: dict[str, Any]) -> str:
    where = {"trace": "the recording device's, from the trace's out-of-memory entries",
             "given": "--memory", "default": "unbounded: the trace records no capacity"}
    return f"{format_bytes(row['capacity'], whole_units=True)} ({where[row['capacity_source']]})"


def _print_replay(report: dict[str, Any]) -> None:
    print(f"{report['file']}")
    source = report.get("conf_source", "given")
    print(f"settings: {report['conf'] or 'torch defaults'} "
          f"({'given with --conf' if source == 'given' else source})")
    if not report["devices"]:
        print(report.get("note", "nothing to replay"))
        return
    for row in report["devices"]:
        print(f"device {row['device']}:")
        print("\n".join(_device_lines(row)))


def _run_replay(args: argparse.Namespace) -> int:
    from gpumem.snapshots.replay import replay_file  # imported when the command runs

    capacity = None
    if args.memory is not None:
        from gpumem.snapshots.replay import MAX_CAPACITY
        try:
            capacity = parse_size(args.memory)
        except SimError as e:
            raise ConfError(f"--memory: {e}") from None
        if capacity > MAX_CAPACITY:
            raise ConfError(f"--memory: {args.memory} is more than replay simulates; give at "
                            f"most {format_bytes(MAX_CAPACITY)}")
    report = replay_file(args.snapshot, args.conf, capacity=capacity, limits=_limits(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_replay(report)
    return 0


# ------------------------------------------------- view / summary / diff

def _count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1 or value > 1_000_000:
        raise argparse.ArgumentTypeError(f"expected a number from 1 to 1000000, not {value}")
    return value


def _device_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a device index, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a device index >= 0, not {value}")
    return value


_SNAP_HELP = "a snapshot written by gpumem.dump_snapshot or torch.cuda.memory._dump_snapshot"


def _add_view_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", metavar="SNAPSHOT.pickle", help=_SNAP_HELP)
    p.add_argument("-o", "--output", metavar="OUT.html",
                   help="where to write the page (default: the snapshot's name with .html); "
                        "written atomically, replacing only a regular file: a symlink's "
                        "target is written, a directory, FIFO or device is refused")
    p.add_argument("--device", type=_device_arg, metavar="N",
                   help="the device to show (default: the one with the longest trace)")
    _add_limit_args(p)


def _run_view(args: argparse.Namespace) -> int:
    from gpumem.snapshots.view import write_view

    info = write_view(args.snapshot, args.output, device=args.device, limits=_limits(args))
    print(f"wrote {info['output']} ({format_bytes(info['html_bytes'])}): device {info['device']}, "
          f"{info['events']} trace events, {info['bands']} allocations drawn individually"
          f"{', ' + info['folded'] if info['folded'] else ''}")
    print(f"open it in a browser (it works offline): file://{os.path.abspath(info['output'])}")
    return 0


def _add_summary_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", metavar="SNAPSHOT.pickle|DIR",
                   help=_SNAP_HELP + "; or a folder of per-rank snapshots (gpumem simulate's "
                        "--out, or where ranks wrote *_rank<N>.pickle): the ranks side by side, "
                        "one row per snapshot and device; a file in it that cannot be read is "
                        "named on stderr and skipped (status 2 only when none can be read)")
    p.add_argument("--top", type=_count_arg, default=10, metavar="N",
                   help="how many allocation sites to list (default 10)")
    p.add_argument("--device", type=_device_arg, metavar="N",
                   help="only this device (a single snapshot only)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_limit_args(p)


def _short_site(label: str) -> str:
    cwd = os.getcwd() + os.sep
    return label.replace(cwd, "") if cwd != os.sep else label


def _site_table(rows: list[dict], title: str, lines: list[str]) -> None:
    if not rows:
        return
    lines.append(f"  {title}:")
    lines.append(f"    {'bytes':>11}  {'count':>7}  site")
    for r in rows:
        est = "~" if r.get("estimated") else ""   # a sampled site's estimate (gpumem._sampling)
        lines.append(f"    {est + format_bytes(r['bytes']):>11}  {est + str(r['count']):>7}  "
                     f"{_short_site(r['site'])}")


def _pct(part: int, whole: int) -> str:
    return f" ({100.0 * part / whole:.1f}% of reserved)" if whole else ""


def _summary_device(d: dict) -> list[str]:
    seg = d["at_snapshot"]
    out = [f"device {d['device']}:"]
    if d["source"] == "trace":
        dur = d.get("duration_us")
        out.append(f"  trace: {d['trace_events']} events, {d['allocations']} allocations"
                   + (f", {dur / 1e6:.3f} s" if dur is not None else "")
                   + (f"; {d['live_before_trace']} allocations were live before it began"
                      if d["live_before_trace"] else ""))
        when = f" at event {d['peak_index']}"
        if d["peak_time_us"] is not None:
            when += f" (+{d['peak_time_us'] / 1e6:.3f} s)"
        out.append(f"  peak allocated: {format_bytes(d['peak_allocated'])}{when}")
    else:
        out.append("  no allocation trace (segments only): figures are the snapshot's state")
        out.append(f"  allocated: {format_bytes(d['peak_allocated'])}")
    when = "at peak" if d["source"] == "trace" else "at the snapshot"
    out.append(f"  {'peak reserved' if d['source'] == 'trace' else 'reserved'}: "
               f"{format_bytes(d['peak_reserved'])}")
    frag = d["fragmentation_at_peak"]
    res = d["reserved_at_peak"]
    out.append(f"  reserved but unallocated {when}: "
               + ("unknown" if frag is None else f"{format_bytes(frag)}{_pct(frag, res or 0)}"))
    if d.get("reserved_note"):
        out.append(f"    ({d['reserved_note']})")
    out.append(f"  at the snapshot: {seg['segments']} segments, reserved "
               f"{format_bytes(seg['reserved'])}, allocated {format_bytes(seg['allocated'])}, "
               f"free {format_bytes(seg['free'])} (largest free block "
               f"{format_bytes(seg['largest_free_block'])})"
               + (f", pending free {format_bytes(seg['pending_free'])}"
                  if seg["pending_free"] else ""))
    for o in d["ooms"][-3:]:
        out.append(f"  OOM at event {o['index']}: asked for {format_bytes(o['size'])} with "
                   f"{format_bytes(o['device_free'])} free on the device, at "
                   f"{_short_site(o['site'])}")
    if d.get("categories"):
        _category_table(d["categories"], out)
    if d.get("sampling"):
        out.append(f"  {describe_sampling(d['sampling'])}")
    label = "live at peak" if d["source"] == "trace" else "live at the snapshot"
    _site_table(d["top_live_at_peak"], f"top sites by bytes {label}", out)
    _site_table(d["top_total_allocated"], "top sites by total bytes allocated", out)
    if d["steps"]:
        out.append(f"  per-step growth (markers: {d['step_markers']}):")
        steps = d["steps"]
        shown = steps if len(steps) <= 20 else steps[:10] + [None] + steps[-10:]
        w = max([12] + [len(s["label"]) for s in shown if s is not None])   # labels whole
        out.append(f"    {'step':<{w}} {'start':>11} {'end':>11} {'growth':>11} {'peak':>11}")
        for s in shown:
            if s is None:
                out.append(f"    ... {len(steps) - 20} more steps")
                continue
            out.append(f"    {s['label']:<{w}} {format_bytes(s['start_allocated']):>11} "
                       f"{format_bytes(s['end_allocated']):>11} {_signed(s['growth']):>11} "
                       f"{format_bytes(s['peak']):>11}")
        if d["step_growth_sites"]:
            out.append("  grew from the end of the first step to the end of the last:")
            for r in d["step_growth_sites"][:5]:
                est = "~" if r.get("estimated") else ""
                out.append(f"    {est + _signed(r['delta_bytes']):>11}  "
                           f"{est + format(r['delta_count'], '+d'):>7}  {_short_site(r['site'])}")
    return out


def _category_table(c: dict, out: list[str]) -> None:
    peak, end = c["at_peak"], c["at_end"]
    out.append(f"  memory by category (recorded with categories=True):")
    out.append(f"    {'category':<18} {'at peak':>11} {'at the end':>11}")
    for name in c["categories"]:
        if peak.get(name) or end.get(name):
            out.append(f"    {name:<18} {format_bytes(peak.get(name, 0)):>11} "
                       f"{format_bytes(end.get(name, 0)):>11}")
    out.append(f"    {'total':<18} {format_bytes(sum(peak.values())):>11} "
               f"{format_bytes(sum(end.values())):>11}")


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "") + format_bytes(abs(n))


def _run_summary(args: argparse.Namespace) -> int:
    from gpumem.snapshots.summary import summarize

    if os.path.isdir(args.snapshot):
        return _run_rank_summary(args)
    with gc_paused():   # plain acyclic data, built and walked once (see gc_paused)
        report = summarize(load_snapshot(args.snapshot, _limits(args)), args.snapshot, args.top,
                           args.device)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    lines = [report["file"]]
    if not report["devices"]:
        lines.append(report.get("note", "nothing to summarise"))
    for d in report["devices"]:
        lines.extend(_summary_device(d))
    print("\n".join(lines))
    return 0


def _run_rank_summary(args: argparse.Namespace) -> int:
    from gpumem.snapshots.rank_summary import summarize_folder, summary_lines

    if args.device is not None:
        _print_error("--device applies to a single snapshot, not to a folder of ranks")
        return EXIT_USAGE
    report = summarize_folder(args.snapshot, _limits(args))
    for s in report["skipped"]:
        print(f"{PROG}: warning: skipped {s['file']}: {s['error']}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(summary_lines(report, _short_site)))
    return 0


def _add_diff_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("before", metavar="BEFORE.pickle", help="the earlier snapshot")
    p.add_argument("after", metavar="AFTER.pickle", help="the later snapshot")
    p.add_argument("--top", type=_count_arg, default=10, metavar="N",
                   help="how many allocation sites to list (default 10)")
    p.add_argument("--device", type=_device_arg, metavar="N",
                   help="only this device (default: all devices together)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_limit_args(p)


def _diff_rows(rows: list[dict], lines: list[str]) -> None:
    lines.append(f"  {'delta':>11} {'count':>7}  {'before':>19}  {'after':>19}  site")
    for r in rows:
        est = "~" if r.get("estimated") else ""   # a sampled site's estimate
        before = f"{est}{r['before_count']} / {format_bytes(r['before_bytes'])}"
        after = f"{est}{r['after_count']} / {format_bytes(r['after_bytes'])}"
        lines.append(f"  {est + _signed(r['delta_bytes']):>11} "
                     f"{est + format(r['delta_count'], '+d'):>7}  {before:>19}  "
                     f"{after:>19}  {_short_site(r['site'])}")


def _stack_to_site(stack: list[str], site: str, kind: str | None, head: int = 8) -> list[str]:
    """The stack lines to print, innermost first, ending at the site's frame
    for a site in the user's code, so that line is the last one printed and
    never cut off: the first ``head`` lines when it is among them, else the
    first 3, a count of the frames left out, and the site's frame.  A site
    in library code only gets the first ``head`` lines."""
    if kind != "user":
        return stack[:head]
    frame = site.split(" (via ", 1)[0]
    at = next((i for i, line in enumerate(stack) if line == frame), None)
    if at is not None and at < head:
        return stack[:at + 1]
    skipped = f"{at - 3} library frames" if at is not None else "more frames"
    return stack[:3] + [f"... {skipped} ..."] + [frame]


def _run_diff(args: argparse.Namespace) -> int:
    from gpumem.snapshots.summary import diff

    with gc_paused():   # plain acyclic data, built and walked once (see gc_paused)
        before = load_snapshot(args.before, _limits(args))
        after = load_snapshot(args.after, _limits(args))
        report = diff(before, after, (args.before, args.after), args.top, args.device)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    lb, la = report["live_before"], report["live_after"]
    lines = [f"{report['before']} -> {report['after']}"
             + (f" (device {report['device']})" if report["device"] is not None else ""),
             f"live allocations: {lb['count']} ({format_bytes(lb['bytes'])}) -> {la['count']} "
             f"({format_bytes(la['bytes'])}), {_signed(la['bytes'] - lb['bytes'])}",
             f"reserved: {format_bytes(report['reserved_before'])} -> "
             f"{format_bytes(report['reserved_after'])}"]
    for side, smp in (report.get("sampling") or {}).items():
        if smp:
            lines.append(f"{side}: {describe_sampling(smp)}")
    if report["grew"]:
        n = report["grew_total"]
        lines.append(f"grew ({n} site{'s' if n != 1 else ''}; live allocations by site, "
                     f"largest growth first):")
        _diff_rows(report["grew"], lines)
        top = report["grew"][0]
        lines.append("most growth is allocated at (innermost first):")
        lines.extend(f"    {_short_site(f)}"
                     for f in _stack_to_site(top["stack"], top["site"], top.get("kind")))
    else:
        lines.append("nothing grew")
    if report["shrank"]:
        n = report["shrank_total"]
        lines.append(f"shrank ({n} site{'s' if n != 1 else ''}):")
        _diff_rows(report["shrank"], lines)
    print("\n".join(lines))
    return 0


# name -> (one-line help, add_arguments(parser), run(args) -> exit status)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {
    "replay": ("replay a snapshot's allocation trace through gpumem on the virtual device",
               _add_replay_args, _run_replay),
    "view": ("write a self-contained HTML page (timeline, segments, top allocation sites) that "
             "works offline", _add_view_args, _run_view),
    "summary": ("peak memory, fragmentation, top allocation sites and per-step growth",
                _add_summary_args, _run_summary),
    "diff": ("what grew between two snapshots, by allocation site (the leak finder)",
             _add_diff_args, _run_diff),
    "simulate": (_simulate.HELP, _simulate.add_arguments, _simulate.run),
    "fit": (_fit.HELP, _fit.add_arguments, _fit.run),
    "doctor": (_DOCTOR_HELP, _add_doctor_args, _run_doctor),
    "build-shim": _shim_build.CLI_COMMAND,
}


#: The commands that read snapshot files (and so take --max-bytes and --max-records).
READS_SNAPSHOTS = ("replay", "view", "summary", "diff")


def build_parser() -> argparse.ArgumentParser:
    from gpumem import __version__
    parser = _Parser(prog=PROG, description="gpumem: a CUDA caching allocator for PyTorch.")
    parser.add_argument("--version", action="version",
                        version=f"{PROG} {__version__} (Python {sys.version.split()[0]})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (help_text, add_args, _run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           epilog=LIMITS_HELP if name in READS_SNAPSHOTS else None)
        add_args(p)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [SnapshotError, ConfError, OSError]
    try:
        from gpumem.snapshots.replay import ReplayError
        errors.append(ReplayError)
    except ImportError:
        pass
    return tuple(errors)


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default sys.argv[1:]); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already reported)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        _print_error(f"no command given; choose one of {', '.join(COMMANDS)} "
                     f"(run '{PROG} --help' for usage)")
        return EXIT_USAGE
    try:
        return COMMANDS[args.command][2](args)
    except BrokenPipeError:  # 'gpumem summary x | head': the reader left, stop quietly
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        return 0
    except _user_errors() as e:
        _print_error(str(e) or type(e).__name__)
        return EXIT_USAGE
    except KeyboardInterrupt:
        _print_error("interrupted")
        return 130
    except Exception as e:  # a bug in gpumem: still one line, but a distinct status
        if os.environ.get("GPUMEM_TRACEBACK"):
            raise
        _print_error(f"internal error ({type(e).__name__}: {e}); this is a gpumem bug, please "
                     f"report it (set GPUMEM_TRACEBACK=1 to see the traceback)")
        return EXIT_INTERNAL
