"""Safe loading of PyTorch CUDA memory snapshots.

A snapshot written by ``torch.cuda.memory._dump_snapshot`` is a pickle of
plain data: dicts, lists, tuples, strings, numbers, booleans and None.  An
arbitrary pickle can run code while it is loaded (through GLOBAL/REDUCE), so
gpumem reads snapshots with an unpickler whose ``find_class`` always refuses:
a file that names any Python global is rejected before anything is called.

Every failure is reported as a ``SnapshotError`` (a ``ValueError``) carrying
one sentence that names the file, says what was wrong and how to fix it.
The loader also normalises the legacy shapes (a bare list of segments, the
``traces`` key) and checks the parts of the schema that gpumem relies on.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import pickle
import struct
from typing import Any, Iterator

__all__ = ["SnapshotError", "load_snapshot", "loads_snapshot", "normalize_snapshot", "gc_paused"]

_PROTO = 0x80  # first byte of every pickle written with protocol 2 or later
_U64 = 1 << 64
_I64_MIN = -(1 << 63)
_DUMP_HINT = "pass a file written by torch.cuda.memory._dump_snapshot"


class SnapshotError(ValueError):
    """A snapshot could not be read, or does not have the expected shape."""


class _RefusedGlobal(Exception):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(module, name)
        self.qualname = f"{module}.{name}"


class _RefusedPersistentId(Exception):
    pass


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a snapshot's plain (acyclic)
    dicts and lists are built or walked: each of the hundreds of collections
    it would run scans every object made so far, which for a 1,000,000-entry
    trace costs more than the unpickling itself."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Reader:
    """read/readline only. Given a file with readinto, CPython's unpickler
    reads BYTEARRAY8 payloads in place, and an over-long one in a corrupt
    file leaks an exported buffer ("deallocated bytearray object has
    exported buffers" on stderr, sometimes only at exit)."""

    def __init__(self, data):
        bio = io.BytesIO(data)
        self.read = bio.read
        self.readline = bio.readline


class _DataOnlyUnpickler(pickle.Unpickler):
    """Builds only plain data: every reference to a global is refused."""

    def find_class(self, module: str, name: str) -> Any:  # noqa: D401
        raise _RefusedGlobal(str(module), str(name))

    def persistent_load(self, pid: Any) -> Any:
        raise _RefusedPersistentId(_short_repr(pid))


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Everything the pickle machinery may raise on corrupt or hostile input.
_CORRUPT_ERRORS = (
    pickle.UnpicklingError,
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    AttributeError,
    ImportError,
    LookupError,
    UnicodeError,
    OverflowError,
    RecursionError,
    MemoryError,
    struct.error,
    SystemError,
)


def load_snapshot(path: str | os.PathLike[str]) -> dict:
    """Read the snapshot pickle at ``path`` and return the normalised dict.

    Raises SnapshotError (with one sentence naming ``path``) for a missing,
    unreadable, corrupt, unsafe or wrongly shaped file.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SnapshotError(f"{name}: file not found") from None
    except IsADirectoryError:
        raise SnapshotError(
            f"{name} is a directory, not a snapshot file; pass the .pickle file itself"
        ) from None
    except PermissionError:
        raise SnapshotError(
            f"{name}: permission denied; make the file readable or copy it somewhere readable"
        ) from None
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise SnapshotError(f"{name} could not be read ({reason})") from None
    except ValueError:  # e.g. an embedded NUL byte
        raise SnapshotError(f"{name!r} is not a valid file name") from None
    return loads_snapshot(data, name=name)


def loads_snapshot(data: bytes | bytearray | memoryview, name: str = "snapshot data") -> dict:
    """Like load_snapshot, for the bytes of a snapshot pickle.

    ``name`` is used in error messages in place of a file name.
    """
    data = bytes(data)
    if not data:
        raise SnapshotError(f"{name} is empty; {_DUMP_HINT}")
    if data[0] != _PROTO:
        raise SnapshotError(
            f"{name} is not a pickle file (it does not start with a pickle protocol "
            f"header); {_DUMP_HINT}"
        )
    if len(data) < 2:
        raise SnapshotError(f"{name} is truncated (pickle data ended early); re-dump the snapshot")
    if not 2 <= data[1] <= pickle.HIGHEST_PROTOCOL:
        raise SnapshotError(
            f"{name} uses pickle protocol {data[1]}, which this Python cannot read "
            f"(it reads protocols 2 to {pickle.HIGHEST_PROTOCOL}); {_DUMP_HINT}"
        )
    try:
        with gc_paused():
            obj = _DataOnlyUnpickler(_Reader(data)).load()
    except _RefusedGlobal as e:
        raise SnapshotError(
            f"{name} refers to Python global '{e.qualname}'; gpumem refuses pickles that "
            f"reference globals because loading them would run code"
        ) from None
    except _RefusedPersistentId as e:
        raise SnapshotError(
            f"{name} refers to an external object (persistent id {e}); gpumem refuses such "
            f"pickles because a snapshot holds only plain data; {_DUMP_HINT}"
        ) from None
    except EOFError:
        raise SnapshotError(
            f"{name} is truncated (pickle data ended early); re-dump the snapshot"
        ) from None
    except MemoryError:
        raise SnapshotError(
            f"{name} is corrupt (it asks for more memory than is available); re-dump the snapshot"
        ) from None
    except _CORRUPT_ERRORS as e:
        if _is_truncation(e):
            raise SnapshotError(
                f"{name} is truncated (pickle data ended early); re-dump the snapshot"
            ) from None
        raise SnapshotError(
            f"{name} is not a valid pickle ({_describe(e)}); re-dump the snapshot"
        ) from None
    with gc_paused():
        return normalize_snapshot(obj, name)


def _is_truncation(e: BaseException) -> bool:
    text = str(e).lower()
    return "truncated" in text or "ran out of input" in text or "ended early" in text


def _describe(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if not text:
        return type(e).__name__
    if len(text) > 100:
        text = text[:97] + "..."
    return f"{type(e).__name__}: {text}"


# ---------------------------------------------------------------- validation

def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def normalize_snapshot(obj: Any, name: str = "snapshot") -> dict:
    """Return ``obj`` as a snapshot dict with 'segments' and 'device_traces'.

    A bare list (``torch.cuda.memory_snapshot()``) becomes
    ``{'segments': obj, 'device_traces': []}``; the legacy key 'traces' is
    read as 'device_traces'.  Other keys are kept.  The parts gpumem uses are
    checked and a SnapshotError names the first thing that is wrong.
    """
    if isinstance(obj, list):
        snap: dict = {"segments": obj, "device_traces": []}
    elif isinstance(obj, dict):
        snap = dict(obj)
        if "device_traces" not in snap and "traces" in snap:
            snap["device_traces"] = snap["traces"]
        if "segments" not in snap and "device_traces" not in snap:
            raise SnapshotError(
                f"{name} holds a dict without 'segments' or 'device_traces', so it is not a "
                f"memory snapshot; {_DUMP_HINT}"
            )
        snap.setdefault("segments", [])
        snap.setdefault("device_traces", [])
    else:
        raise SnapshotError(
            f"{name} holds a {_type_name(obj)}, not a snapshot dict or list of segments; "
            f"{_DUMP_HINT}"
        )
    _check_segments(snap["segments"], name)
    _check_traces(snap["device_traces"], name)
    return snap


def _fail(name: str, where: str, what: str) -> None:
    raise SnapshotError(f"{name}: {where} {what}")


def _check_int_field(d: dict, key: str, name: str, where: str, required: bool = True,
                     signed: bool = False) -> None:
    if key not in d:
        if required:
            _fail(name, where, f"has no '{key}'")
        return
    value = d[key]
    if not _is_int(value):
        _fail(name, where, f"has '{key}' of type {_type_name(value)}, expected an int")
    if not signed and value < 0:
        _fail(name, where, f"has a negative '{key}' ({_short_int(value)})")
    _check_64_bits(value, key, name, where)


def _check_64_bits(value: int, key: str, name: str, where: str, signed: bool = True) -> None:
    """Every allocator writes these fields as 64-bit integers; anything wider is corrupt."""
    if not (_I64_MIN if signed else 0) <= value < _U64:
        _fail(name, where, f"has '{key}' = {_short_int(value)}, which does not fit in 64 bits; "
                           f"the file is corrupt, re-dump the snapshot")


def _short_int(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def _check_segments(segments: Any, name: str) -> None:
    if not isinstance(segments, list):
        _fail(name, "'segments'", f"is a {_type_name(segments)}, expected a list of dicts")
    for i, seg in enumerate(segments):
        where = f"segments[{i}]"
        if not isinstance(seg, dict):
            _fail(name, where, f"is a {_type_name(seg)}, expected a dict")
        for key in ("device", "address", "total_size"):
            _check_int_field(seg, key, name, where)
        _check_int_field(seg, "stream", name, where, required=False, signed=True)
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            _fail(name, f"{where}['blocks']", f"is a {_type_name(blocks)}, expected a list")
        for j, block in enumerate(blocks):
            bwhere = f"{where}['blocks'][{j}]"
            if not isinstance(block, dict):
                _fail(name, bwhere, f"is a {_type_name(block)}, expected a dict")
            _check_int_field(block, "size", name, bwhere)
            _check_int_field(block, "requested_size", name, bwhere, required=False)
            state = block.get("state")
            if not isinstance(state, str):
                _fail(name, bwhere, "has no 'state' string")


def _check_traces(traces: Any, name: str) -> None:
    if not isinstance(traces, list):
        _fail(name, "'device_traces'", f"is a {_type_name(traces)}, expected a list of lists")
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            _fail(name, f"device_traces[{d}]", f"is a {_type_name(trace)}, expected a list")
        for i, entry in enumerate(trace):
            # The common case in one expression (plain ints, a str action); anything
            # else goes through _check_entry, which names what is wrong.
            if type(entry) is dict:
                get = entry.get
                action, size, stream = get("action"), get("size"), get("stream", 0)
                oom = action == "oom"
                needed, other = (get("device_free"), get("addr", 0)) if oom else (
                    get("addr"), get("device_free", 0))
                if (type(action) is str and type(size) is int and type(needed) is int
                        and type(other) is int and type(stream) is int
                        and 0 <= size < _U64 and 0 <= needed < _U64 and 0 <= other < _U64
                        and _I64_MIN <= stream < _U64):
                    continue
            _check_entry(entry, name, f"device_traces[{d}][{i}]")


def _check_entry(entry: Any, name: str, where: str) -> None:
    if not isinstance(entry, dict):
        _fail(name, where, f"is a {_type_name(entry)}, expected a dict")
    action = entry.get("action")
    if not isinstance(action, str):
        if "action" not in entry:
            _fail(name, where, "has no 'action'")
        _fail(name, where, f"has 'action' of type {_type_name(action)}, expected a str")
    _check_int_field(entry, "size", name, where)
    if action == "oom":
        _check_int_field(entry, "device_free", name, where)
    else:
        _check_int_field(entry, "addr", name, where)
    _check_int_field(entry, "stream", name, where, required=False, signed=True)
    for key in ("addr", "device_free"):   # when present though not required: 64 bits too
        value = entry.get(key)
        if _is_int(value):
            _check_64_bits(value, key, name, where, signed=False)
