"""Snapshots at out of memory: the shim's OOM hook and GPUMEM_OOM_SNAPSHOT.

gpumem.install() (gpumem.pytorch.installer) calls down here: ``check_env()`` refuses a
bad GPUMEM_OOM_RECORDING before anything is swapped in, and
``install_hook(shim)`` sets the shim's OOM hook (Note [OOM hook] in
csrc/torch/gm_torch_oom_hook.cpp) and arms GPUMEM_OOM_SNAPSHOT.  An
allocation that fails then writes one snapshot, to every target that
applies: the active gpumem.record() recorder with ``dump_on_oom`` (next to
its file) and the GPUMEM_OOM_SNAPSHOT directory; the rules are in
gpumem.recording.recorder's docstring, which is where users read them.

This module sits below gpumem.recording.recorder, so it does not import it: the recorder
registers the function that returns its active recorder
(``set_recorder_lookup``) when it is imported.  What is used of a recorder:
``dump_on_oom``, ``_oom_path()``, the lists ``written`` and
``oom_snapshots``, and, for a recorder on torch's own allocator,
``_backend`` (``name == "torch"``, ``snapshot()``).
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import socket
import stat
import sys
import threading
import time
import traceback
from typing import Any, Callable, Mapping, Optional

from gpumem import _sampling
from gpumem.recording import history
from gpumem._conf import ConfError, parse_uint
from gpumem._rank import rank_path

__all__ = ["MAX_OOM_SNAPSHOTS", "ENV_OOM_SNAPSHOT", "ENV_RECORDING", "ENV_OOM_RECORDING",
           "parse_oom_recording", "check_env", "install_hook", "oom_snapshots_written",
           "set_recorder_lookup", "attach_torch_observer", "private_folder"]

log = logging.getLogger("gpumem")

#: OOM snapshots written per process at most.
MAX_OOM_SNAPSHOTS = 10
#: The variable naming the directory for process-wide OOM snapshots.
ENV_OOM_SNAPSHOT = "GPUMEM_OOM_SNAPSHOT"
#: What GPUMEM_OOM_SNAPSHOT records when recording is off at install().
ENV_RECORDING = {"context": "all", "stacks": "python", "max_entries": 100_000}
#: The variable that changes ENV_RECORDING: "context:alloc,stacks:all,max_entries:20000".
ENV_OOM_RECORDING = "GPUMEM_OOM_RECORDING"

_env_dir: Optional[str] = None            # GPUMEM_OOM_SNAPSHOT, once armed by install()
_env_fallback_only = False                # gpumem simulate's --out: not when a recorder writes
_oom_lock = threading.Lock()              # serialises OOM snapshots
_oom_written: list[str] = []              # protected by: _oom_lock
_oom_count = 0                            # protected by: _oom_lock
_hooked: set[int] = set()                 # id() of shims whose hook is set
_torch_observer_attached = False


def _no_recorder() -> Any:
    return None


_active_recorder: Callable[[], Any] = _no_recorder   # the recorder module's active_recorder


def set_recorder_lookup(active_recorder: Callable[[], Any]) -> None:
    """Called by gpumem.recording.recorder: the function that returns its active
    recorder or None."""
    global _active_recorder
    _active_recorder = active_recorder


def oom_snapshots_written() -> list[str]:
    """Every OOM snapshot file this process wrote, oldest first."""
    with _oom_lock:
        return list(_oom_written)


def _env_path(n: int) -> str:
    host = socket.gethostname().split(".")[0] or "host"
    return rank_path(os.path.join(_env_dir or ".", f"oom_{host}_{os.getpid()}_{n}.pickle"))


def _has_oom_target() -> bool:
    rec = _active_recorder()
    return _env_dir is not None or (rec is not None and rec.dump_on_oom)


def _python_frames() -> list[dict]:
    """The calling thread's Python stack, innermost first, as snapshot frames,
    without gpumem's own frames (Note [gpumem's own frames] in
    csrc/python/hist_capture.c)."""
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # gpumem/
    stack = traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)
    return [{"filename": fs.filename, "line": fs.lineno or 0, "name": fs.name}
            for fs in stack if not os.path.abspath(fs.filename).startswith(own)]


def _ensure_oom_event(snap: dict, device: int, sizes: tuple[int, ...], device_free: int,
                      stream: int) -> None:
    """Add an 'oom' trace entry unless the recorded trace already ends with this one."""
    traces = snap.setdefault("device_traces", [])
    if not isinstance(traces, list):
        return
    while len(traces) <= device:
        traces.append([])
    trace = traces[device]
    for e in trace[-256:]:
        if isinstance(e, dict) and e.get("action") == "oom" and e.get("size") in sizes:
            return
    trace.append({"action": "oom", "device_free": device_free,
                  "size": sizes[-1], "stream": stream, "time_us": time.time_ns() // 1000,
                  "frames": _python_frames(), "compile_context": "N/A", "user_metadata": ""})


def _oom_snapshot(take_snapshot: Callable[[], dict], device: int, sizes: tuple[int, ...],
                  device_free: int, stream: int) -> list[str]:
    """Write the OOM snapshot to every target; the files written."""
    global _oom_count
    with _oom_lock:
        rec = _active_recorder()
        targets = []
        if rec is not None and rec.dump_on_oom:
            targets.append(("record", rec))
        if _env_dir is not None and not (targets and _env_fallback_only):
            targets.append(("env", None))
        if not targets:
            return []
        _oom_count += 1
        if _oom_count > MAX_OOM_SNAPSHOTS:
            if _oom_count == MAX_OOM_SNAPSHOTS + 1:
                log.warning("gpumem: %d OOM snapshots written in this process; no more are "
                            "written", MAX_OOM_SNAPSHOTS)
            return []
        snap = take_snapshot()
        _ensure_oom_event(snap, device, sizes, device_free, stream)
        written = []
        for kind, r in targets:
            path = r._oom_path() if kind == "record" else _env_path(_oom_count)
            try:
                history.write_snapshot(snap, path, make_dirs=True)
            except Exception as e:
                log.error("gpumem: could not write the OOM snapshot %s: %s", path, e)
                continue
            written.append(path)
            if r is not None:
                r.written.append(path)
                r.oom_snapshots.append(path)
        _oom_written.extend(written)
        return written


def _on_oom(device: int, requested: int, rounded: int, device_free: int, device_total: int,
            stream: int, message: str) -> Optional[str]:
    """The shim's OOM hook (Note [OOM hook]): the line to add to the message, or None."""
    try:
        if not _has_oom_target():
            return None
        written = _oom_snapshot(history.snapshot, device, (requested, rounded), device_free,
                                stream)
        if not written:
            return None
        # The path is said once, in the exception's message (which the script
        # prints, or the traceback shows); the log line is for debug logs only.
        what = ". ".join(message.split(". ")[:2])
        log.info("gpumem: %s on device %d; memory snapshot written to %s", what, device,
                 " and ".join(written))
        also = "".join(f" (also {p})" for p in written[1:])
        return f"gpumem: memory snapshot at this OOM written to {written[0]}{also}"
    except Exception:  # never let the hook turn an OOM into another error
        log.exception("gpumem: writing the OOM snapshot failed")
        return None


def _torch_observer(device: int, alloc: int, device_total: int, device_free: int) -> None:
    """torch's OOM observer, for recorders that fell back to torch's allocator."""
    try:
        rec = _active_recorder()
        backend = getattr(rec, "_backend", None)
        if rec is None or getattr(backend, "name", None) != "torch":
            return
        written = _oom_snapshot(backend.snapshot, device, (alloc,), device_free, 0)
        if written:
            log.warning("gpumem: out of memory on device %d; memory snapshot written to %s",
                        device, " and ".join(written))
    except Exception:
        log.exception("gpumem: writing the OOM snapshot failed")


def attach_torch_observer(torch: Any) -> None:
    """Attach the OOM observer to torch's own allocator (once; it cannot be detached)."""
    global _torch_observer_attached
    if not _torch_observer_attached:
        torch._C._cuda_attach_out_of_memory_observer(_torch_observer)
        _torch_observer_attached = True


def install_hook(shim: Any) -> None:
    """Called by gpumem.install(): set the shim's OOM hook, honour GPUMEM_OOM_SNAPSHOT."""
    if id(shim) not in _hooked and hasattr(shim, "set_oom_hook"):
        shim.set_oom_hook(_on_oom)
        atexit.register(shim.set_oom_hook, None)
        _hooked.add(id(shim))
    _arm_env()


def parse_oom_recording(text: Optional[str]) -> dict:
    """GPUMEM_OOM_RECORDING's value -> ENV_RECORDING with the keys it names.

    Entries are key:value, separated by ','; spaces are ignored. Keys:
    context (none, state, alloc or all), stacks (python or all) and
    max_entries (a positive integer in ASCII digits). Raises ConfError naming
    what is wrong.
    """
    out = dict(ENV_RECORDING)
    example = "for example context:all,stacks:python,max_entries:100000"
    for entry in "".join((text or "").split()).split(","):
        if not entry:
            continue
        key, sep, value = entry.partition(":")
        context = None if value.lower() == "none" else value.lower()
        if key == "context" and context in history.CONTEXTS:
            out["context"] = context
        elif key == "stacks" and value in history.STACKS:
            out["stacks"] = value
        elif key == "max_entries" and (parse_uint(value, sys.maxsize) or 0) > 0:
            out["max_entries"] = parse_uint(value, sys.maxsize)
        elif key in ("context", "stacks", "max_entries"):
            accepted = {"context": "none, state, alloc or all", "stacks": "python or all",
                        "max_entries": "a positive integer"}[key]
            raise ConfError(f"{ENV_OOM_RECORDING}: bad value {_short(value)!r} for {key} "
                            f"(accepted: {accepted}); {example}")
        else:
            raise ConfError(f"{ENV_OOM_RECORDING}: unknown entry {_short(entry)!r} (keys: context, "
                            f"stacks, max_entries); {example}")
    return out


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def check_env(environ: Optional[Mapping[str, str]] = None) -> None:
    """Raise ConfError if GPUMEM_RECORD_SAMPLE is invalid, or, with
    GPUMEM_OOM_SNAPSHOT set, GPUMEM_OOM_RECORDING is (in ``environ``,
    default os.environ)."""
    environ = os.environ if environ is None else environ
    try:
        _sampling.from_env(environ)
    except _sampling.SampleError as e:
        raise ConfError(f"{e}; for example {_sampling.ENV_SAMPLE}=on or "
                        f"{_sampling.ENV_SAMPLE}=mean:512KiB,threshold:1MiB") from None
    if environ.get(ENV_OOM_SNAPSHOT, "").strip():
        parse_oom_recording(environ.get(ENV_OOM_RECORDING))


def private_folder(directory: str) -> str:
    """Where OOM snapshots for GPUMEM_OOM_SNAPSHOT=``directory`` go: the
    directory itself, or, when it is sticky and world-writable (/tmp), a
    folder of this user's own in it, ``gpumem-oom-<euid>``, made with mode
    0700: OOM snapshot names are predictable, and in a shared folder another
    user could plant links or files under them.  Raises PermissionError
    when that name holds anything but a folder of this user's that no one
    else can write (a link, another user's folder)."""
    try:
        st = os.stat(directory)
    except OSError:
        return directory
    if not (st.st_mode & stat.S_ISVTX and st.st_mode & stat.S_IWOTH):
        return directory
    own = os.path.join(directory, f"gpumem-oom-{os.geteuid()}")
    try:
        os.mkdir(own, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(own)
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise PermissionError(errno.EACCES, "the per-user folder for OOM snapshots in this "
                              "shared folder is taken by something that is not a folder of "
                              "yours only you can write; remove it or set another folder", own)
    return own


def _arm_env() -> None:
    global _env_dir, _env_fallback_only
    text = os.environ.get(ENV_OOM_SNAPSHOT, "").strip()
    if not text or _env_dir is not None:
        return
    recording = parse_oom_recording(os.environ.get(ENV_OOM_RECORDING))
    directory = os.path.abspath(os.path.expanduser(text))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        log.warning("gpumem: %s=%s: cannot create the directory (%s); OOM snapshots will fail",
                    ENV_OOM_SNAPSHOT, text, e.strerror)
    try:
        directory = private_folder(directory)
    except OSError as e:
        log.warning("gpumem: %s=%s: %s (%s); no OOM snapshots are written", ENV_OOM_SNAPSHOT,
                    text, e.strerror, e.filename)
        return
    _env_dir = directory
    _env_fallback_only = os.environ.get("GPUMEM_SIMULATE_OUT") == text
    if history.recording_config()["enabled"] is None:
        history.record_memory_history("all", recording["context"], recording["stacks"],
                                      recording["max_entries"])
    log.info("gpumem: out-of-memory snapshots go to %s", directory)
