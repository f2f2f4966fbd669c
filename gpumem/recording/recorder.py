"""gpumem.record(): memory history around a block, and snapshots at out of memory.

    with gpumem.record("memory.pickle") as rec:    # one line to add
        for batch in loader:
            train_step(batch)
            rec.step()                             # optional: step markers, step ranges

On entry recording starts (gpumem.install() is done first when no CUDA tensor
exists yet); on exit the snapshot is written, also when the block raises.
With ``start_step``/``stop_step`` only steps [start, stop) are recorded: each
``rec.step()`` ends a step, recording starts when step ``start_step`` begins,
and when step ``stop_step`` would begin the snapshot is written and recording
stops on its own.  Steps count from 0 at entry.  Each recorded step start is
written as an ``external_annotations`` entry ({'name': 'step N', 'stage':
'START', 'device', 'time_us'}), which ``gpumem summary`` turns into per-step
growth.

Out of memory: while a recorder with ``dump_on_oom=True`` is active, or in
the whole process when ``GPUMEM_OOM_SNAPSHOT=/dir`` is set when
gpumem.install() runs (recording, if it is off then, starts with
ENV_RECORDING, which ``GPUMEM_OOM_RECORDING=context:alloc,max_entries:20000``
changes), an allocation that fails writes a snapshot before the
exception reaches Python (Note [OOM hook] in csrc/torch/gm_torch_oom_hook.cpp:
the hook runs on the failing thread, autograd threads included, with no
allocator lock held).  The snapshot holds the ``oom`` event and the segments
at the failure; it is taken from host-side copies and pickled to a file, so
it allocates no GPU memory.  The path is logged (logging.getLogger("gpumem"))
and added as one line to the torch.OutOfMemoryError message.

File names: under torch.distributed (initialised) or with RANK / LOCAL_RANK
set, ``_rank<N>`` goes before the extension (memory_rank3.pickle), so ranks
never overwrite each other's files.  OOM snapshots of a recorder go next to
its file (memory_oom.pickle, memory_oom2.pickle, ...); those of
GPUMEM_OOM_SNAPSHOT are <dir>/oom_<host>_<pid>_<n>[_rank<N>].pickle (both
are written when both apply, except under ``gpumem simulate``, whose own
directory only gets the OOMs no recorder writes).  A <dir> that is sticky
and world-writable, such as /tmp, gets <dir>/gpumem-oom-<uid>/ instead, a
folder of the user's own (mode 0700), since those names are predictable
(gpumem.recording.oom.private_folder).  At most
MAX_OOM_SNAPSHOTS are written per process (a script that retries smaller
batches after each OOM would otherwise write one per try).  The hook, the
GPUMEM_OOM_SNAPSHOT directory and the cap are gpumem.recording.oom's, which
gpumem.install() sets up; rank numbers are gpumem._rank's.

Decisions (Note [Recorder rules]):
- Memory history is process-wide, so one recorder at a time: entering a
  second one while another is active (nested, or from another thread) raises
  RecordError naming where the first was entered.  ``rec.dump(path)`` writes
  extra snapshots from the active one.
- On entry the history is cleared (the file holds this block only); on exit
  the recording configuration found at entry is put back (recording stays on
  if it was on, for example under GPUMEM_OOM_SNAPSHOT).
- When torch's own caching allocator is already in use (a CUDA tensor was
  created before), gpumem cannot be installed: the recorder then uses torch's
  recorder (torch.cuda.memory._record_memory_history / _snapshot, OOM dumps
  through torch's OOM observer) and logs a warning once.  torch's message
  cannot gain the line naming the file there; the log still names it.  torch
  cannot report its recording settings, so if its recording was on at entry
  it stays on at exit with the recorder's settings.
- Without a CUDA build of torch the recorder records gpumem.Allocator objects.
- dump_on_oom covers the whole block; outside the recorded step range the
  OOM snapshot holds the segments and the oom event but no history.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Optional

from gpumem import _sampling
from gpumem.recording import oom as _oom, history
from gpumem.pytorch import installer as _torch
from gpumem.recording.oom import (ENV_OOM_RECORDING, ENV_OOM_SNAPSHOT, MAX_OOM_SNAPSHOTS,
                                  oom_snapshots_written, parse_oom_recording)
from gpumem._rank import current_rank, rank_path

__all__ = ["record", "Recorder", "RecordError", "current_rank", "rank_path", "active_recorder",
           "oom_snapshots_written", "MAX_OOM_SNAPSHOTS", "ENV_OOM_SNAPSHOT",
           "ENV_OOM_RECORDING", "parse_oom_recording"]

log = logging.getLogger("gpumem")


class RecordError(RuntimeError):
    """gpumem.record() used in a way it does not support (see Note [Recorder rules])."""


def _now_us() -> int:
    return time.time_ns() // 1000


def _caller() -> str:
    """file:line of the first frame outside this module (for messages)."""
    here = os.path.abspath(__file__)
    for fs in traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False):
        if os.path.abspath(fs.filename) != here:
            return f"{fs.filename}:{fs.lineno}"
    return "<unknown>"


# ---------------------------------------------------------------- backends

class _GpumemBackend:
    """gpumem's own history (gpumem.recording.history)."""

    name = "gpumem"

    def saved(self) -> Any:
        return history.recording_config()

    def start(self, rec: "Recorder") -> None:
        history.record_memory_history("all", rec.context, rec.stacks, rec.max_entries,
                                      clear_history=True, categories=rec.categories,
                                      sample=rec.sample)

    def restore(self, cfg: Any) -> None:
        if cfg["enabled"] is None:
            history.record_memory_history(None)
        else:
            history.record_memory_history(cfg["enabled"], cfg["context"], cfg["stacks"],
                                          cfg["max_entries"], skip_actions=cfg["skip_actions"],
                                          categories=cfg.get("categories", False),
                                          sample=cfg.get("sample", False))

    def snapshot(self) -> dict:
        return history.snapshot()


class _TorchBackend:
    """torch's own recorder, for a process whose CUDA allocator is torch's."""

    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def saved(self) -> Any:
        return bool(self.torch._C._cuda_isHistoryEnabled())

    def start(self, rec: "Recorder") -> None:
        if rec.categories:
            log.warning("gpumem.record(categories=True): torch's own recorder is in use (see "
                        "above), so the snapshot has no categories")
        if rec.sample:
            log.warning("gpumem.record(sample=...): torch's own recorder is in use (see above), "
                        "which records every stack")
        self.torch.cuda.memory._record_memory_history(
            "all", context=rec.context, stacks=rec.stacks, max_entries=rec.max_entries,
            clear_history=True)

    def restore(self, was_enabled: Any) -> None:
        if not was_enabled:
            self.torch.cuda.memory._record_memory_history(None)

    def snapshot(self) -> dict:
        return self.torch.cuda.memory._snapshot()


_GPUMEM = _GpumemBackend()
_warned_torch = False


def _choose_backend() -> Any:
    """gpumem's history, installing gpumem first; torch's when torch's allocator is in use."""
    global _warned_torch
    if _torch.is_installed():
        return _GPUMEM
    try:
        _torch.install()
        return _GPUMEM
    except _torch.AllocConfError:
        raise
    except _torch.TorchMissingError:
        return _GPUMEM  # no CUDA torch: record gpumem.Allocator objects
    except _torch.InstallError as e:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            raise RecordError(f"gpumem.record() could not install gpumem: {e}") from e
        if not _warned_torch:
            _warned_torch = True
            log.warning("gpumem.record(): torch's CUDA allocator is already in use (a CUDA tensor "
                        "was created before), so torch's own memory recorder is used; call "
                        "gpumem.install() right after `import torch` to record with gpumem")
        _oom.attach_torch_observer(torch)
        return _TorchBackend(torch)


# ---------------------------------------------------------------- recorder

_lock = threading.Lock()
_active: Optional["Recorder"] = None  # protected by: _lock


def active_recorder() -> Optional["Recorder"]:
    """The recorder currently between start() and stop(), or None."""
    return _active


_oom.set_recorder_lookup(active_recorder)   # where the OOM hook finds dump_on_oom recorders


class Recorder:
    """What gpumem.record() returns; see the module docstring.

    Attributes: ``path`` (absolute, before the rank suffix), ``step_index``
    (steps ended so far), ``recording`` (history on for this recorder now),
    ``written`` (snapshot files written, in order) and ``oom_snapshots``
    (the OOM snapshots among them).
    """

    def __init__(self, path: str | os.PathLike[str] = "memory.pickle", *,
                 max_entries: int = 100_000, context: Optional[str] = "all",
                 stacks: str = "python", start_step: Optional[int] = None,
                 stop_step: Optional[int] = None, dump_on_oom: bool = True,
                 categories: Optional[bool] = None, sample: Any = None) -> None:
        try:
            path = os.fspath(path)
        except TypeError:
            raise TypeError(f"path must be a str or os.PathLike, not {path!r}") from None
        if not path:
            raise ValueError("path must not be empty")
        if os.path.isdir(path):
            path = os.path.join(path, "memory.pickle")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, not {max_entries!r}")
        if context not in history.CONTEXTS:
            raise ValueError(f"context must be one of {history.CONTEXTS}, not {context!r}")
        if stacks not in history.STACKS:
            raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
        for name, v in (("start_step", start_step), ("stop_step", stop_step)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{name} must be None or an int >= 0, not {v!r}")
        if start_step is not None and stop_step is not None and stop_step <= start_step:
            raise ValueError(f"stop_step ({stop_step}) must be greater than start_step "
                             f"({start_step}): steps [start_step, stop_step) are recorded")
        try:  # checked now; GPUMEM_RECORD_SAMPLE (for None) and the seed at each start
            _sampling.parse_sample(sample)
        except _sampling.SampleError as e:
            raise ValueError(str(e)) from None
        self.path = os.path.abspath(path)
        self.sample = sample
        self.max_entries = max_entries
        self.context = context
        self.stacks = stacks
        self.start_step = start_step
        self.stop_step = stop_step
        self.dump_on_oom = bool(dump_on_oom)
        # None: not asked for (off, except under gpumem simulate --categories)
        self.categories = None if categories is None else bool(categories)
        self.step_index = 0
        self.written: list[str] = []
        self.oom_snapshots: list[str] = []
        self._state = "new"          # new -> waiting -> recording -> done -> closed
        self._mutex = threading.RLock()
        self._backend: Any = None
        self._saved: Any = None
        self._where = ""
        self._markers: list[tuple[int, str]] = []
        self._oom_count = 0

    def __repr__(self) -> str:
        rng = ""
        if self.start_step is not None or self.stop_step is not None:
            stop = "" if self.stop_step is None else self.stop_step
            rng = f", steps [{self.start_step or 0}, {stop})"
        return f"<gpumem.Recorder {self.path!r}{rng}, {self._state}, step {self.step_index}>"

    @property
    def recording(self) -> bool:
        return self._state == "recording"

    # -- context manager
    def __enter__(self) -> "Recorder":
        self.start()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        try:
            self.stop()
        except Exception:
            if et is None:
                raise
            log.exception("gpumem.record(): writing the snapshot at exit failed")
        return False

    # -- explicit control
    def start(self) -> "Recorder":
        """Start (what entering the with block does); RecordError if a recorder is active."""
        global _active
        where = _caller()
        with _lock:
            if self._state not in ("new", "closed"):
                raise RecordError(f"this recorder is already active (entered at {self._where})")
            if _active is not None:
                raise RecordError(
                    f"gpumem.record() is already recording to {_active.path} (entered at "
                    f"{_active._where}); memory history is process-wide, so recorders cannot be "
                    "nested or run at the same time in several threads. Use the active "
                    "recorder's dump(path) for an extra snapshot")
            backend = _choose_backend()
            self._saved = backend.saved()
            _active = self
        self._backend, self._where = backend, where
        self.step_index = 0
        self._markers = []
        self._state = "waiting"
        try:
            if not self.start_step:
                self._begin()
        except BaseException:
            self._close()
            raise
        return self

    def step(self) -> None:
        """End the current step (start or stop recording at the range's bounds)."""
        with self._mutex:
            if self._state in ("new", "closed"):
                raise RecordError("Recorder.step() called outside its with block")
            self.step_index += 1
            if self._state == "waiting":
                if self.start_step is not None and self.step_index >= self.start_step:
                    self._begin()
            elif self._state == "recording":
                if self.stop_step is not None and self.step_index >= self.stop_step:
                    self._finish()
                else:
                    self._markers.append((_now_us(), f"step {self.step_index}"))

    def dump(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write a snapshot now (recording goes on); returns the file written."""
        with self._mutex:
            if self._state in ("new", "closed"):
                raise RecordError("Recorder.dump() called outside its with block")
            target = os.path.abspath(os.fspath(path)) if path is not None else self.path
            return self._write(target)

    def stop(self) -> None:
        """Write the snapshot (unless the step range already did) and stop."""
        with self._mutex:
            if self._state in ("new", "closed"):
                return
            try:
                if self._state == "recording":
                    self._finish()
                elif self._state == "waiting":
                    log.warning("gpumem.record(): the block ended at step %d, before start_step="
                                "%s: nothing was recorded; %s holds the memory state at the end",
                                self.step_index, self.start_step, rank_path(self.path))
                    self._write(self.path)
            finally:
                self._close()

    # -- internals
    def _begin(self) -> None:
        self._backend.start(self)
        self._state = "recording"
        self._markers.append((_now_us(), f"step {self.step_index}"))

    def _finish(self) -> None:
        try:
            self._write(self.path)
        finally:
            self._state = "done"
            self._backend.restore(self._saved)

    def _write(self, target: str) -> str:
        snap = self._backend.snapshot()
        if self.step_index or self.start_step or self.stop_step:
            _add_markers(snap, self._markers)
        out = rank_path(target)
        history.write_snapshot(snap, out, make_dirs=True)
        self.written.append(out)
        log.info("gpumem: memory snapshot written to %s", out)
        return out

    def _close(self) -> None:
        global _active
        if self._state in ("waiting", "recording"):
            try:
                self._backend.restore(self._saved)
            except Exception:
                log.exception("gpumem.record(): restoring the recording configuration failed")
        self._state = "closed"
        with _lock:
            if _active is self:
                _active = None

    def _oom_path(self) -> str:
        self._oom_count += 1
        stem, ext = os.path.splitext(self.path)
        n = "" if self._oom_count == 1 else str(self._oom_count)
        return rank_path(f"{stem}_oom{n}{ext or '.pickle'}")


def record(path: str | os.PathLike[str] = "memory.pickle", *, max_entries: int = 100_000,
           context: Optional[str] = "all", stacks: str = "python",
           start_step: Optional[int] = None, stop_step: Optional[int] = None,
           dump_on_oom: bool = True, categories: Optional[bool] = None,
           sample: Any = None) -> Recorder:
    """Record memory history for a with block and write a snapshot at its end.

    path: the snapshot file (``_rank<N>`` is added under torch.distributed or
        RANK/LOCAL_RANK; a directory means <dir>/memory.pickle).
    max_entries, context, stacks: as for record_memory_history.
    start_step, stop_step: record only steps [start_step, stop_step), the
        steps being ended by ``rec.step()``; at stop_step the snapshot is
        written and recording stops.
    dump_on_oom: write <path stem>_oom.pickle when an allocation fails with
        out of memory inside the block (before the exception reaches Python).
    categories: note what each allocation is for (gpumem.categories.tagger); under
        torch's own recorder (see below) there are none.  Not given, it is
        off, except under ``gpumem simulate --categories``, which keeps it on.
    sample: the always-on sampled mode, cheap enough to leave on in every run
        (record_memory_history's sample=: True, a mean interval such as
        '512KiB', or 'mean:512KiB,threshold:1MiB,seed:7'); None follows
        GPUMEM_RECORD_SAMPLE, False records every stack.

    Returns a Recorder (use it in a with statement, or call start()/stop()).
    See the module docstring for nesting, torch's allocator and rank rules.
    """
    return Recorder(path, max_entries=max_entries, context=context, stacks=stacks,
                    start_step=start_step, stop_step=stop_step, dump_on_oom=dump_on_oom,
                    categories=categories, sample=sample)


def _add_markers(snap: dict, markers: list[tuple[int, str]]) -> None:
    """Step boundaries as external_annotations (gpumem summary's per-step growth)."""
    traces = snap.get("device_traces") or []
    devices = [d for d, t in enumerate(traces) if t] or [0]
    ann = snap.setdefault("external_annotations", [])
    if not isinstance(ann, list):
        return
    for t, label in markers:
        for d in devices:
            ann.append({"device": d, "time_us": t, "stage": "START", "name": label})
