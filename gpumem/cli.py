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
import json
import os
import sys
from typing import Any, Callable

from ._conf import ConfError
from ._unpickle import SnapshotError

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


def format_bytes(n: int | None) -> str:
    """A byte count in B, KiB, MiB or GiB, whichever keeps it below 1024 (GiB at most)."""
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "GiB":
            break
    return f"{value:.2f} {unit}"


# ------------------------------------------------------------------ replay

def _add_replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot", metavar="SNAPSHOT.pickle",
                   help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--conf", default="", metavar="SETTINGS",
                   help="allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, for example "
                        "'expandable_segments:True,max_split_size_mb:128'")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


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


def _print_replay(report: dict[str, Any]) -> None:
    print(f"{report['file']}")
    print(f"settings: {report['conf'] or '(defaults)'}")
    if not report["devices"]:
        print(report.get("note", "nothing to replay"))
        return
    for row in report["devices"]:
        print(f"device {row['device']}:")
        print("\n".join(_device_lines(row)))


def _run_replay(args: argparse.Namespace) -> int:
    from .replay import replay_file  # imported here so 'gpumem --help' needs no extension

    report = replay_file(args.snapshot, args.conf)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_replay(report)
    return 0


# name -> (one-line help, add_arguments(parser), run(args) -> exit status)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {
    "replay": ("replay a snapshot's allocation trace through gpumem on the simulated device",
               _add_replay_args, _run_replay),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="gpumem: a CUDA caching allocator for PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (help_text, add_args, _run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_args(p)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [SnapshotError, ConfError, OSError]
    try:
        from .replay import ReplayError
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
