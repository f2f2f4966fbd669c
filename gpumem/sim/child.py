"""The child side of ``gpumem simulate``: what runs inside every Python process of the run.

The run's sitecustomize (gpumem/sim/command.py, Note [Setting up the child])
calls _child_setup(); once ``import torch`` has finished, _activate()
installs gpumem, starts recording, keeps each device's peaks across
torch.cuda.reset_peak_memory_stats(), and, at exit, _child_finish() writes
the process's snapshot and its statistics (JSON) for the parent to read.
Nothing here may raise into the script: failures are reported on stderr
and the script runs on.

Note [The script's own recording]
Rationale: most scripts written after PyTorch's memory-snapshot articles turn
  recording off at the end (torch.cuda.memory._record_memory_history(
  enabled=None)), which also clears the history: simulate's own snapshot,
  taken at exit, was then empty, and its page showed nothing.
Approach: in the child, the script's calls that would stop recording
  (enabled=None or False, record_cuda=False) are counted and otherwise
  ignored, so recording goes on with the settings in force; calls that start
  or change it take effect.  Every snapshot the script writes itself
  (torch.cuda.memory._dump_snapshot, gpumem.dump_snapshot, gpumem.record)
  is noted and named in the report.
Limitations: a history the script cleared by stopping is not cleared, so a
  dump after it restarts holds the earlier events too.

Note [How a process of the run ends]
Rationale: a verdict on a run that failed must not say it fits, and must say
  where it failed; a run stopped with SIGTERM or SIGINT must still leave its
  snapshot.  Python runs no atexit handler on SIGTERM, and an uncaught
  exception, sys.exit(N) or a fatal signal leave nothing behind by default.
Approach: each process that activated records how it ended in its
  statistics: the uncaught exception (sys.last_value, set by the interpreter
  before atexit runs) with the innermost line of the script's own code;
  sys.exit(N) with a non-zero N and the line that called it; a stop by
  SIGTERM or SIGINT (a SIGTERM handler raises SystemExit, so finally blocks
  and atexit run and the snapshot is written; after the last atexit handler
  the process kills itself with the same signal, so its status is the
  conventional one); and the time.  faulthandler writes the Python stack
  of a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) to
  <pid>.fault beside the statistics, for the parent to read.
Limitations: a script that installs its own SIGTERM handler, or enables
  faulthandler itself, keeps its own; a process killed by SIGKILL, or that
  calls os._exit(), leaves only the mark written when it started; a fatal
  signal leaves no statistics and no snapshot: only the most each simulated
  device held (CUDA context included), which the fake driver writes to
  <pid>.peaks as the process dies (simgpu/driver/fakecuda_fatal.c), not
  the allocator's own peaks.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from typing import Any, Optional

__all__ = ["ENV_OUT", "ENV_STATS", "ENV_PARENT", "ENV_ENTRIES", "ENV_CATEGORIES"]

ENV_OUT = "GPUMEM_SIMULATE_OUT"
ENV_STATS = "GPUMEM_SIMULATE_STATS"
ENV_PARENT = "GPUMEM_SIMULATE_PARENT"
ENV_ENTRIES = "GPUMEM_SIMULATE_MAX_ENTRIES"
ENV_CATEGORIES = "GPUMEM_SIMULATE_CATEGORIES"   # "1": record categories (--categories)


class _TorchImportHook:
    """A meta path finder that runs _activate() once ``import torch`` has finished.

    It stays on sys.meta_path until torch's module has really executed: a
    script, or a library such as transformers, may ask
    ``importlib.util.find_spec("torch")`` before importing it, and the spec
    handed out then is not the one ``import torch`` will use."""

    def __init__(self) -> None:
        self._finding = False   # finding torch's real spec: step aside

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch" or self._finding:
            return None
        import importlib.util
        self._finding = True
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self._finding = False
        if spec is None:   # the script's import will fail: say why in the report
            _note_torch_missing("absent")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            original(module)
            _activate()

        spec.loader.exec_module = exec_module
        return spec


_peaks: dict[int, dict[str, int]] = {}   # device -> highest peaks seen before resets
_resets: dict[int, int] = {}             # device -> the script's reset_peak_memory_stats calls
_active_child = False


def _child_setup() -> None:
    """Called by the run's sitecustomize in every Python process."""
    if not os.environ.get(ENV_STATS):
        return
    import atexit
    atexit.register(_reraise_stop_signal)   # registered first: runs after every other handler
    if "torch" in sys.modules:
        _activate()
    else:
        sys.meta_path.insert(0, _TorchImportHook())


def _activate() -> None:
    """gpumem.install() and recording, right after torch is imported; never raises."""
    global _active_child
    if _active_child:
        return
    _active_child = True
    import atexit
    try:
        import gpumem
        from gpumem.recording import history
        gpumem.install()
        entries = int(os.environ.get(ENV_ENTRIES) or 100_000)
        history.record_memory_history("all", "all", "python", entries,
                                      categories=_categories_on())
        _wrap_reset_peaks()
        _keep_recording(sys.modules["torch"], history)
    except Exception as e:  # the script still runs, on torch's allocator
        from gpumem.pytorch.installer import TorchMissingError
        torch = sys.modules.get("torch")
        if isinstance(e, TorchMissingError) and torch is not None:   # a CPU-only build
            _note_torch_missing(str(getattr(torch, "__version__", "unknown version")))
            return
        atexit.register(_report_unrecorded, f"{type(e).__name__}: {e}")
        return
    try:
        from gpumem.sim.world_rank import note_meshes, refuse_peer_objects
        refuse_peer_objects()   # Note [Objects from peers] (gpumem/sim/world_rank.py)
        note_meshes()           # read after a --ranks auto run (world.auto_advice)
    except Exception:   # no torch.distributed in this build: nothing to refuse
        pass
    from gpumem.recording.recorder import current_rank
    _write_stats({"pid": os.getpid(), "argv": sys.argv[:8], "rank": current_rank(),
                  "incomplete": True})
    _watch_the_end()
    atexit.register(_child_finish)


_stop_signal: Optional[int] = None  # SIGTERM or SIGINT that stopped this process
_stop_time = 0.0
_exit_call: Optional[dict] = None   # sys.exit(N) with N not 0: its code and line


def _watch_the_end() -> None:
    """Note [How a process of the run ends]: the SIGTERM and SIGINT handlers,
    faulthandler, and sys.exit's wrapper."""
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_stop_signal)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_stop_signal)
    except ValueError:   # not the main thread
        pass
    try:
        import faulthandler
        if not faulthandler.is_enabled():
            path = os.path.join(os.environ[ENV_STATS], f"{os.getpid()}.fault")
            faulthandler.enable(open(path, "w", encoding="utf-8"))  # noqa: SIM115 - kept open
    except (OSError, RuntimeError):
        pass
    real_exit = sys.exit

    def exit(status: Any = None) -> None:  # noqa: A001 - sys.exit's name
        global _exit_call
        if status not in (None, 0) and _exit_call is None:
            _exit_call = {"code": status if isinstance(status, int) else 1,
                          "message": None if isinstance(status, int) else str(status),
                          "line": _frame_line(sys._getframe(1)), "time": time.time()}
        real_exit(status)

    sys.exit = exit


def _on_stop_signal(signo: int, frame: Any) -> None:
    """SIGTERM/SIGINT: unwind the script (SystemExit or KeyboardInterrupt), so
    that atexit writes the snapshot; a repeat within a second is ignored so
    that it cannot interrupt the dump."""
    global _stop_signal, _stop_time
    now = time.monotonic()
    if _stop_signal is not None and now - _stop_time < 1.0:
        return
    _stop_signal, _stop_time = signo, now
    if signo == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signo)


def _reraise_stop_signal() -> None:
    """The last atexit handler: a process stopped by SIGTERM or SIGINT ends
    with that signal, as it would have without the handler."""
    if _stop_signal is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(_stop_signal, signal.SIG_DFL)
        os.kill(os.getpid(), _stop_signal)


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gpumem/


def _own_code(filename: str) -> bool:
    """Whether a frame's file is the script's own: not the standard library,
    not an installed package, not gpumem."""
    import sysconfig
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path:
        return False
    roots = (sysconfig.get_paths()["stdlib"], _PKG_DIR)
    return not any(path.startswith(os.path.abspath(r) + os.sep) for r in roots)


def _frame_line(frame: Any) -> Optional[str]:
    """'file:line in name' of the innermost frame of the script's own code (else the innermost)."""
    first = None
    while frame is not None:
        here = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        first = first or here
        if _own_code(frame.f_code.co_filename):
            return here
        frame = frame.f_back
    return first


def _how_it_ended() -> dict[str, Any]:
    """What ended this process other than a normal exit (Note [How a process of
    the run ends]); {} for a normal exit."""
    if _stop_signal is not None:
        return {"signal": signal.Signals(_stop_signal).name, "time": time.time()}
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if isinstance(exc, BaseException) and not isinstance(exc, SystemExit):
        frames, tb = [], exc.__traceback__
        while tb is not None:
            frames.append((tb.tb_frame.f_code, tb.tb_lineno))
            tb = tb.tb_next
        own = [f for f in frames if _own_code(f[0].co_filename)] or frames
        line = f"{own[-1][0].co_filename}:{own[-1][1]} in {own[-1][0].co_name}" if own else None
        return {"exception": type(exc).__qualname__,
                "message": " ".join(str(exc).split())[:300], "line": line, "time": time.time()}
    if _exit_call is not None:
        return {"exit_code": _exit_call["code"], "message": _exit_call["message"],
                "line": _exit_call["line"], "time": _exit_call["time"]}
    return {}


def _categories_on() -> bool:
    return os.environ.get(ENV_CATEGORIES) == "1"


_script_dumps: list[str] = []       # snapshots the script wrote itself
_script_stops = 0                   # its calls that would have stopped recording
_own_dump = False                   # True while simulate writes its own snapshot


def _keep_recording(torch: Any, history: Any) -> None:
    """Note [The script's own recording]: stop calls are ignored, the script's
    own snapshot files are noted."""
    original = history._record_memory_history

    def _record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
        global _script_stops
        if enabled is None or enabled is False or kwargs.get("record_cuda") is False:
            _script_stops += 1
            return
        original(enabled, *args, **kwargs)

    for module in (torch.cuda.memory, torch.cuda):
        if getattr(module, "_record_memory_history", None) is original:
            module._record_memory_history = _record_memory_history
    _keep_categories(history)
    write = history.write_snapshot

    def write_snapshot(snap: dict, filename: Any, **kwargs: Any) -> None:
        write(snap, filename, **kwargs)
        path = os.path.abspath(os.fspath(filename))
        if not _own_dump and path not in _script_dumps:
            _script_dumps.append(path)

    history.write_snapshot = write_snapshot


def _note_torch_missing(what: str) -> None:
    """For the parent's one line on installing torch: 'absent', or the version
    of a torch without CUDA.  Written at once: the script is about to fail."""
    global _missing_noted
    if not _missing_noted:
        _missing_noted = True
        _write_stats({"pid": os.getpid(), "argv": sys.argv[:8], "torch_missing": what,
                      "python": sys.executable})


_missing_noted = False


_categories_warned = False


def _keep_categories(history: Any) -> None:
    """Under --categories, the script's recording calls that do not mention
    categories (gpumem.record(...), torch's _record_memory_history) keep them
    on; an explicit categories=False is obeyed, and said once on stderr."""
    if not _categories_on():
        return
    import gpumem
    original = history.record_memory_history

    def record_memory_history(*args: Any, categories: Any = None, **kwargs: Any) -> None:
        global _categories_warned
        if categories is None:
            categories = True
        elif not categories and not _categories_warned:
            _categories_warned = True
            sys.stderr.write(f"gpumem simulate: the script turned categories off at "
                             f"{_script_caller()} (categories=False), overriding --categories: "
                             "the report has none from there on\n")
        original(*args, categories=categories, **kwargs)

    history.record_memory_history = record_memory_history
    if getattr(gpumem, "record_memory_history", None) is original:
        gpumem.record_memory_history = record_memory_history


def _script_caller() -> str:
    """file:line of the innermost frame outside gpumem and the standard library's contextlib."""
    import contextlib
    skip = (_PKG_DIR, os.path.abspath(contextlib.__file__))
    f = sys._getframe(1)
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        if not name.startswith(skip):
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


def _report_unrecorded(why: str) -> None:
    """atexit, when install() failed: only a process that then used the GPU
    (on torch's allocator, unmeasured) is reported; one that imported torch
    without touching CUDA (a helper checking versions, say) cost nothing."""
    torch = sys.modules.get("torch")
    try:
        used = torch is not None and torch.cuda.is_initialized()
    except Exception:  # noqa: BLE001 - a half-imported torch: report it
        used = True
    if not used:
        return
    sys.stderr.write(f"gpumem simulate: gpumem could not be installed in this process ({why}); "
                     f"it ran without recording\n")
    _write_stats({"pid": os.getpid(), "argv": sys.argv[:8], "install_error": why})


def _write_stats(out: dict) -> None:
    try:
        target = os.path.join(os.environ[ENV_STATS], f"{os.getpid()}.json")
        with open(target + ".tmp", "w", encoding="utf-8") as f:
            json.dump(out, f)
        os.replace(target + ".tmp", target)
    except OSError as e:
        sys.stderr.write(f"gpumem simulate: cannot write this process's statistics: {e}\n")


def _wrap_reset_peaks() -> None:
    """Keep each device's peaks across resets (every reset goes through shim.reset_peak)."""
    from gpumem.pytorch import shim_state as _shim_state
    shim = _shim_state.shim()
    original = shim.reset_peak

    def reset_peak(device: int) -> None:
        _note_peaks()
        _resets[device] = _resets.get(device, 0) + 1
        original(device)

    shim.reset_peak = reset_peak


def _note_peaks() -> dict[int, dict[str, int]]:
    from gpumem.pytorch import shim_state as _shim_state
    shim = _shim_state.shim()
    for d in shim.devices():
        st = shim.stats(d)
        cur = _peaks.setdefault(d, {"allocated": 0, "reserved": 0})
        cur["allocated"] = max(cur["allocated"], st.get("allocated_bytes.all.peak", 0))
        cur["reserved"] = max(cur["reserved"], st.get("reserved_bytes.all.peak", 0))
        # what the script itself sees: the peaks since its last reset
        cur["allocated_since_reset"] = st.get("allocated_bytes.all.peak", 0)
        cur["reserved_since_reset"] = st.get("reserved_bytes.all.peak", 0)
        cur["resets"] = _resets.get(d, 0)
        cur["num_ooms"] = st.get("num_ooms", 0)
        cur["allocated_end"] = st.get("allocated_bytes.all.current", 0)
        cur["reserved_end"] = st.get("reserved_bytes.all.current", 0)
        used = _device_peak_used(d)
        if used is not None:
            cur["device_peak"] = used
    return _peaks


def _device_peak_used(device: int) -> Optional[int]:
    """The most memory the simulated device ever had in use: torch's allocator's
    segments, the CUDA context, and what else asked the driver (the fake NCCL's
    buffers, cudaMalloc by libraries); None off the simulator."""
    try:
        query = ctypes.CDLL("libcuda.so.1").fakecuda_query
    except (OSError, AttributeError):
        return None
    query.argtypes, query.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_longlong
    v = query(b"peak_bytes_used", device)
    return int(v) if v >= 0 else None


def _child_name() -> str:
    from gpumem.recording.recorder import current_rank
    rank = current_rank()
    if rank is not None:
        return f"snapshot_rank{rank}.pickle"
    if str(os.getppid()) == os.environ.get(ENV_PARENT):
        return "snapshot.pickle"
    return f"snapshot_pid{os.getpid()}.pickle"


def _child_finish() -> None:
    """atexit: this process's snapshot and statistics for the parent."""
    global _own_dump
    out: dict[str, Any] = {"pid": os.getpid(), "argv": sys.argv[:8], "snapshot": None,
                           "error": None, "devices": {}, "oom_snapshots": []}
    try:
        import torch
        from gpumem.recording import history
        from gpumem.recording.recorder import current_rank, oom_snapshots_written
        out["rank"] = current_rank()
        out["oom_snapshots"] = oom_snapshots_written()
        if torch.cuda.is_initialized():
            out["devices"] = {str(d): v for d, v in _note_peaks().items()}
        # A process that used no device memory through gpumem (Inductor's
        # compile workers initialise CUDA to read the device's properties)
        # has nothing to show: no snapshot, no viewer page.
        if out["devices"]:
            path = os.path.join(os.environ[ENV_OUT], _child_name())
            _own_dump = True
            history.dump_snapshot(path)
            out["snapshot"] = path
        out["script_snapshots"] = [p for p in _script_dumps if p not in out["oom_snapshots"]]
        out["script_stops"] = _script_stops
        ws = sys.modules.get("gpumem.sim.world_rank")
        if ws is not None:
            out["meshes"] = ws.meshes_built()
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["ended"] = _how_it_ended()
    _write_stats(out)
