"""How each process of a ``gpumem simulate`` run ended, and whether the run failed.

The child side (Note [How a process of the run ends] in
gpumem/sim/child.py) records in each process's statistics an
"ended" object: {} for a normal exit, else the uncaught exception, the
sys.exit(N) call or the stop signal, with the script's line and the time;
a process killed by a fatal signal leaves faulthandler's stack in
<pid>.fault instead.  outcome() turns one process's record into one
outcome (or None for a normal exit); failure_text() says where a run
failed, naming the first failure.  Nothing here runs or prints anything.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

__all__ = ["read_fault", "read_fatal_peaks", "outcome", "failure_text", "describe"]

_FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
          "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')


def read_fault(path: str) -> Optional[dict[str, Any]]:
    """faulthandler's report in path: the signal, the innermost line of the
    script's own code (else the innermost line) and the file's time; None when
    the file is missing or empty."""
    from gpumem.sim.child import _own_code
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
        when = os.path.getmtime(path)
    except OSError:
        return None
    m = re.search(r"Fatal Python error: ([^\n]+)", text)
    if not m:
        return None
    name = m.group(1).strip()
    signal = next((v for k, v in _FATAL.items() if name.startswith(k)), name)
    frames = [(f.group(1), f.group(2), f.group(3)) for f in map(_FRAME.match, text.splitlines())
              if f]
    own = [f for f in frames if _own_code(f[0])] or frames
    line = f"{own[0][0]}:{own[0][1]} in {own[0][2]}" if own else None
    return {"fatal_signal": signal, "line": line, "time": when}


def read_fatal_peaks(path: str) -> Optional[dict[int, int]]:
    """{device: the most memory it held} written by the fake driver as the
    process died of a fatal signal (simgpu/driver/fakecuda_fatal.c); None
    when there is no such file."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(1 << 14)
    except OSError:
        return None
    peaks = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(x.isdigit() for x in parts) and int(parts[1]) > 0:
            peaks[int(parts[0])] = int(parts[1])
    return peaks


def outcome(p: dict[str, Any], rc: int) -> Optional[dict[str, Any]]:
    """How process p ended, when not normally: {"kind": "exception" | "exit" |
    "fatal" | "vanished" | "stopped", "what": a phrase, "line", "time", "signal"};
    None for a normal exit.  A process without statistics that died of no
    fatal signal counts only when it is a rank or the run's status is not 0
    (helpers such as compile workers are stopped that way)."""
    ended = p.get("ended") or {}
    if p.get("incomplete"):
        fault = p.get("fault")
        if fault:
            return {"kind": "fatal", "what": f"died of {fault['fatal_signal']}",
                    "line": fault["line"], "time": fault["time"],
                    "signal": fault["fatal_signal"]}
        if p.get("rank") is None and rc == 0:
            return None
        return {"kind": "vanished", "what": "did not exit normally (killed, crashed or "
                "os._exit), so it left no statistics", "line": None, "time": None,
                "signal": None}
    if ended.get("signal"):
        return {"kind": "stopped", "what": f"was stopped by {ended['signal']}", "line": None,
                "time": ended.get("time"), "signal": ended["signal"]}
    if ended.get("exception") == "KeyboardInterrupt":
        return {"kind": "stopped", "what": "was stopped by SIGINT", "line": ended.get("line"),
                "time": ended.get("time"), "signal": "SIGINT"}
    if ended.get("exception") == "ChildFailedError":
        return None   # torchrun's launcher summing up its ranks' failures, reported each
    if ended.get("exception") == "SignalException":   # torchrun's launcher, stopped by a signal
        m = re.search(r"got signal: (\d+)", ended.get("message") or "")
        name = _signal_name(int(m.group(1))) if m else None
        return {"kind": "stopped", "what": f"was stopped by {name or 'a signal'}", "line": None,
                "time": ended.get("time"), "signal": name}
    if ended.get("exception"):
        msg = f": {ended['message']}" if ended.get("message") else ""
        return {"kind": "exception", "what": f"raised {ended['exception']}{msg}",
                "line": ended.get("line"), "time": ended.get("time"), "signal": None}
    if ended.get("exit_code") is not None:
        msg = f" ({ended['message']})" if ended.get("message") else ""
        return {"kind": "exit", "what": f"called sys.exit({ended['exit_code']}){msg}",
                "line": ended.get("line"), "time": ended.get("time"), "signal": None}
    return None


def _signal_name(signo: int) -> str:
    import signal
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"


def describe(p: dict[str, Any], o: dict[str, Any]) -> str:
    """'rank 1 raised RuntimeError: boom at train.py:7 in <module>'."""
    who = (f"rank {p['rank']}" if p.get("rank") is not None
           else f"pid {p.get('pid')} ({' '.join(p.get('argv') or [])})")
    return f"{who} {o['what']}" + (f" at {o['line']}" if o.get("line") else "")


def failure_text(failed: list[tuple[dict, dict]], stopped: list[tuple[dict, dict]],
                 signalled: Optional[str]) -> str:
    """The reason of a failed or stopped run: the failures, the first first, and
    the processes stopped meanwhile (by the launcher, or by the signal
    gpumem simulate got)."""
    order = sorted(failed, key=lambda po: (po[1]["time"] is None, po[1]["time"] or 0))
    parts = []
    if order:
        parts.append(describe(*order[0]) + (" (the first to fail)" if len(order) > 1 else ""))
        parts.extend(describe(p, o) for p, o in order[1:])
    if stopped:
        ranks = [p for p, _ in stopped]
        by = (f"by {signalled} to gpumem simulate" if signalled else "by the launcher "
              "after the failure")
        names = ", ".join(f"rank {p['rank']}" if p.get("rank") is not None else f"pid {p['pid']}"
                          for p in ranks)
        sig = [] if signalled else sorted({o["signal"] for _, o in stopped if o.get("signal")})
        parts.append(f"{names} stopped {by}" + (f" ({', '.join(sig)})" if sig else ""))
    return "; ".join(parts)
