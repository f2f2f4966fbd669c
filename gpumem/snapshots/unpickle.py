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

Note [Hostile snapshots]
Rationale: summary, diff, view and replay run on files from anywhere; a
  tiny file must not buy unbounded work.  Pickles share objects through the
  memo, so ``device_traces = [[entry] * 100000] * 1000`` is 202 KB on disk
  and 10**8 trace entries to walk, and a store to memo index 2**29 makes the
  C unpickler allocate 8 GB.  Sharing itself is legitimate (recorders share
  frame lists), so it cannot be refused as such.
Approach, in the order the loader works:
  - only a regular file is read (a FIFO would block, /dev/zero never ends),
    opened without blocking, and at most Limits.max_bytes (2 GiB) of it;
  - the pickle is read by gpumem._C.read_snapshot_pickle, which refuses
    every global, call and persistent id where it stands, a memo store to
    an index beyond the stores made so far, and more than a few million
    values on its stack, and keeps each device trace as compact records
    (_C.TraceColumns, Note [Compact trace entries] in
    csrc/python/trace_columns.c: 56 bytes an entry where dicts cost
    about 390, docs/benchmarks.md).  The few legal opcodes it leaves
    alone (text opcodes, sets, protocol 2's globals) send the file to
    Python's unpickler, the reference, after a walk over the opcodes
    (gpumem.snapshots.pickle_scan) refuses the same memo stores and any
    argument longer than the data left (a truncated or corrupt file);
  - the records the commands walk are counted, each reference to a shared
    list counted again, from list lengths (no walk): segments, blocks,
    trace entries and external annotations.  A recorder writes each of them
    as a dict of its own, at least 8 bytes of pickle each, so a file holding
    more than one per 8 bytes (and more than 250,000) repeats objects to
    look large and is refused; Limits.max_records (--max-records) overrides
    the limit for a file that is genuine;
  - the fields gpumem reads are checked once per distinct segment, block
    list, block and trace list (an id-keyed cache: a list shared a thousand
    times is checked once); trace entries are checked where they stand, in
    one fast pass, which the records limit bounds; the integers must fit in
    64 bits as every allocator writes them.
  - Python's cyclic garbage collector is paused while the plain, acyclic
    data is built and checked (gc_paused): it would otherwise run hundreds of
    collections over a large trace, each rescanning every object made so far.
Limitations: within the limits, work is proportional to the records, as
  for a genuine file of that size (a few microseconds each).
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import pickle
import stat
import struct
from dataclasses import dataclass
from typing import Any, Iterator

from gpumem import _C
from gpumem._atomic import kind_of
from gpumem.snapshots.pickle_scan import refusal

__all__ = ["SnapshotError", "Limits", "load_snapshot", "loads_snapshot", "normalize_snapshot",
           "records_limit", "short_int", "gc_paused", "MAX_BYTES", "RECORD_BYTES", "MIN_RECORDS"]

#: Files larger than this are refused before they are read (Limits.max_bytes).
MAX_BYTES = 2 << 30
#: The fewest pickle bytes a recorder spends on one segment, block or trace entry.
RECORD_BYTES = 8
#: The records limit is never below this, however small the file.
MIN_RECORDS = 250_000
_U64 = 1 << 64


def records_limit(file_bytes: int) -> int:
    """The most records (segments, blocks, trace entries, annotations) a file
    of ``file_bytes`` may hold: what a recorder can write into it."""
    return max(MIN_RECORDS, file_bytes // RECORD_BYTES)


@dataclass(frozen=True)
class Limits:
    """How much a snapshot may make the loader do (Note [Hostile snapshots]).

    max_bytes: the largest file read.  max_records: the most segments,
    blocks, trace entries and annotations (each reference to a shared list
    counted); None means records_limit(the file's size).
    """

    max_bytes: int = MAX_BYTES
    max_records: int | None = None

    def records(self, file_bytes: int) -> int:
        return records_limit(file_bytes) if self.max_records is None else self.max_records

_PROTO = 0x80  # first byte of every pickle written with protocol 2 or later
_DUMP_HINT = "pass a file written by torch.cuda.memory._dump_snapshot"


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


class SnapshotError(ValueError):
    """A snapshot could not be read, or does not have the expected shape."""


class _RefusedGlobal(Exception):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(module, name)
        self.qualname = f"{module}.{name}"


class _RefusedPersistentId(Exception):
    pass


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
    """repr of a str, bytes or small number; the type otherwise (a shared
    nested list can have a repr of 10**9 characters)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return short_int(value)
    text = repr(value) if isinstance(value, (str, bytes, float, bool)) or value is None \
        else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short_int(value: int) -> str:
    """An integer for a message: in full up to 24 digits, else its length
    (str() of one over 4300 digits raises)."""
    if abs(value).bit_length() <= 79:
        return str(value)
    digits = int(abs(value).bit_length() * 0.30103) + 1
    return f"{'-' if value < 0 else ''}(an integer of about {digits} digits)"


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


def load_snapshot(path: str | os.PathLike[str], limits: Limits | None = None) -> dict:
    """Read the snapshot pickle at ``path`` and return the normalised dict.

    Raises SnapshotError (with one sentence naming ``path``) for a missing,
    unreadable, corrupt, unsafe or wrongly shaped file, for anything but a
    regular file, and past ``limits`` (Note [Hostile snapshots]).
    """
    limits = limits or Limits()
    name = os.fspath(path)
    return loads_snapshot(_read(name, limits.max_bytes), name=name, limits=limits)


def _refuse_kind(name: str, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise SnapshotError(
            f"{name} is a directory, not a snapshot file; pass the .pickle file itself")
    if not stat.S_ISREG(mode):
        raise SnapshotError(
            f"{name} is {kind_of(mode)}, not a regular file; gpumem reads snapshots only from "
            f"regular files (copy the data into one)")


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)


def _read(name: str, max_bytes: int) -> bytes:
    """The bytes of a regular file, at most max_bytes of them."""
    too_big = (f"{name} is larger than {max_bytes} bytes, the most gpumem reads; if it is "
               f"a genuine snapshot, raise the limit with --max-bytes")
    try:
        _refuse_kind(name, os.stat(name).st_mode)  # before open(): a FIFO would block it
        with open(name, "rb", buffering=0, opener=_open_nonblocking) as f:
            st = os.fstat(f.fileno())
            _refuse_kind(name, st.st_mode)  # it may have been replaced meanwhile
            if st.st_size > max_bytes:
                raise SnapshotError(too_big)
            data = f.read(st.st_size + 1)
            if len(data) <= st.st_size:
                return data
            chunks, total = [data], len(data)  # longer than it said (/proc, or growing)
            while total <= max_bytes:
                chunk = f.read(min(1 << 20, max_bytes + 1 - total))
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                total += len(chunk)
            raise SnapshotError(too_big)
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
    except ValueError as e:  # e.g. an embedded NUL byte
        if isinstance(e, SnapshotError):
            raise
        raise SnapshotError(f"{name!r} is not a valid file name") from None


def loads_snapshot(data: bytes | bytearray | memoryview, name: str = "snapshot data",
                   limits: Limits | None = None) -> dict:
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
    obj = _read_native(data, name)
    if obj is _UNSUPPORTED:
        obj = _read_reference(data, name)
    with gc_paused():
        return normalize_snapshot(obj, name, limits=limits or Limits(), file_bytes=len(data))


_UNSUPPORTED = object()


def _memo_bomb_error(name: str, at: int, index: int, stores: int) -> SnapshotError:
    return SnapshotError(
        f"{name} is corrupt: at byte {at} it stores to memo entry {short_int(index)} after "
        f"only {stores} stores (no pickler numbers them so; unpickling it would allocate "
        f"memory for every entry in between); re-dump the snapshot")


def _refused_global(name: str, qualname: str) -> SnapshotError:
    return SnapshotError(
        f"{name} refers to Python global '{qualname}'; gpumem refuses pickles that "
        f"reference globals because loading them would run code")


def _refused_persistent_id(name: str, pid: str) -> SnapshotError:
    return SnapshotError(
        f"{name} refers to an external object (persistent id {pid}); gpumem refuses such "
        f"pickles because a snapshot holds only plain data; {_DUMP_HINT}")


def _truncated(name: str) -> SnapshotError:
    return SnapshotError(f"{name} is truncated (pickle data ended early); re-dump the snapshot")


def _read_native(data: bytes, name: str) -> Any:
    """The object of the pickle by gpumem._C.read_snapshot_pickle (Note [Compact
    trace entries] in csrc/python/trace_columns.c), or _UNSUPPORTED for a
    legal pickle it leaves to the reference reader (text opcodes, sets,
    protocol 2's globals)."""
    try:
        with gc_paused():
            return _C.read_snapshot_pickle(data)
    except MemoryError:
        raise SnapshotError(
            f"{name} is corrupt (it asks for more memory than is available); re-dump the snapshot"
        ) from None
    except ValueError as e:
        if len(e.args) != 3:
            raise
        kind, detail, at = e.args
    if kind == "unsupported":
        return _UNSUPPORTED
    if kind == "global":
        raise _refused_global(name, detail)
    if kind == "persid":
        raise _refused_persistent_id(name, _short_repr(detail))
    if kind == "truncated":
        raise _truncated(name)
    if kind == "memo":
        raise _memo_bomb_error(name, at, *detail)
    text = detail if kind == "error" else f"UnpicklingError: {detail}"
    text = " ".join(text.split())
    raise SnapshotError(f"{name} is not a valid pickle "
                        f"({text if len(text) <= 100 else text[:97] + '...'}); re-dump the snapshot")


def _read_reference(data: bytes, name: str) -> Any:
    """The object of the pickle by Python's unpickler, every global refused:
    the reference the native reader is tested against."""
    refused = refusal(data)
    if refused is not None and refused[0] == "overlong":
        raise _truncated(name)
    if refused is not None:
        raise _memo_bomb_error(name, *refused[1:])
    try:
        with gc_paused():
            return _DataOnlyUnpickler(_Reader(data)).load()
    except _RefusedGlobal as e:
        raise _refused_global(name, e.qualname) from None
    except _RefusedPersistentId as e:
        raise _refused_persistent_id(name, str(e)) from None
    except EOFError:
        raise _truncated(name) from None
    except MemoryError:
        raise SnapshotError(
            f"{name} is corrupt (it asks for more memory than is available); re-dump the snapshot"
        ) from None
    except _CORRUPT_ERRORS as e:
        if _is_truncation(e):
            raise _truncated(name) from None
        raise SnapshotError(
            f"{name} is not a valid pickle ({_describe(e)}); re-dump the snapshot"
        ) from None


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


def normalize_snapshot(obj: Any, name: str = "snapshot", limits: Limits | None = None,
                       file_bytes: int = 0) -> dict:
    """Return ``obj`` as a snapshot dict with 'segments' and 'device_traces'.

    A bare list (``torch.cuda.memory_snapshot()``) becomes
    ``{'segments': obj, 'device_traces': []}``; the legacy key 'traces' is
    read as 'device_traces'.  Other keys are kept.  With ``limits`` (the
    loader always passes them), the records are counted against them for a
    file of ``file_bytes`` bytes; a dict built in memory has no records
    limit.  Then the parts gpumem uses are checked and a SnapshotError names
    the first thing that is wrong (Note [Hostile snapshots]).
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
    if limits is not None:
        _check_records(snap, name, limits, file_bytes)
    _check_segments(snap["segments"], name)
    _check_traces(snap["device_traces"], name)
    return snap


def _check_records(snap: dict, name: str, limits: Limits, file_bytes: int) -> None:
    limit = limits.records(file_bytes)
    if _count_records(snap, limit) <= limit:
        return
    what = (f"more than {limit:,} segments, blocks and trace entries (counting each reference "
            f"to a shared list)")
    if limits.max_records is not None:
        raise SnapshotError(f"{name} holds {what}, the limit set by --max-records")
    raise SnapshotError(
        f"{name} holds {what}, more than a recorder writes into {file_bytes:,} bytes (one per "
        f"{RECORD_BYTES} bytes, at least {MIN_RECORDS:,}): its lists repeat the same objects; "
        f"if the file is genuine, raise the limit with --max-records")


def _count_records(snap: dict, limit: int) -> int:
    """Segments, blocks, trace entries and annotations, from list lengths;
    stops counting once past ``limit``."""
    n = 0
    ann = snap.get("external_annotations")
    if isinstance(ann, list):
        n += len(ann)
    traces = snap["device_traces"]
    if isinstance(traces, list):
        for trace in traces:
            n += len(trace) if isinstance(trace, (list, _C.TraceColumns)) else 1
            if n > limit:
                return n
    segments = snap["segments"]
    if isinstance(segments, list):
        for seg in segments:
            blocks = seg.get("blocks") if isinstance(seg, dict) else None
            n += 1 + (len(blocks) if isinstance(blocks, list) else 0)
            if n > limit:
                return n
    return n


def _fail(name: str, where: str, what: str) -> None:
    raise SnapshotError(f"{name}: {where} {what}")


def _check_int_field(d: dict, key: str, name: str, where: str, required: bool = True,
                     signed: bool = False) -> None:
    """d[key] is an int that fits in 64 bits, as every allocator writes it
    (unsigned, or for a signed field from -2**63)."""
    if key not in d:
        if required:
            _fail(name, where, f"has no '{key}'")
        return
    value = d[key]
    if not _is_int(value):
        _fail(name, where, f"has '{key}' of type {_type_name(value)}, expected an int")
    if not signed and value < 0:
        _fail(name, where, f"has a negative '{key}' ({short_int(value)})")
    if not (-(1 << 63) if signed else 0) <= value < _U64:
        _fail(name, where, f"has '{key}' = {short_int(value)}, which does not fit in 64 bits; "
                           f"the file is corrupt, re-dump the snapshot")


def _unseen(items: list, seen: set[int]):
    """(index, item) of the items not checked yet, by id (a shared one is
    checked once), each marked as checked."""
    for i, item in enumerate(items):
        if id(item) not in seen:
            seen.add(id(item))
            yield i, item


def _dict_at(value: Any, name: str, where: str) -> dict:
    if not isinstance(value, dict):
        _fail(name, where, f"is a {_type_name(value)}, expected a dict")
    return value


def _check_segments(segments: Any, name: str) -> None:
    if not isinstance(segments, list):
        _fail(name, "'segments'", f"is a {_type_name(segments)}, expected a list of dicts")
    seen: set[int] = set()  # ids of the segments, block lists and blocks checked
    for i, seg in _unseen(segments, seen):
        where = f"segments[{i}]"
        _dict_at(seg, name, where)
        for key in ("device", "address", "total_size"):
            _check_int_field(seg, key, name, where)
        _check_int_field(seg, "stream", name, where, required=False, signed=True)
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            _fail(name, f"{where}['blocks']", f"is a {_type_name(blocks)}, expected a list")
        for _, blocks in _unseen([blocks], seen):
            for j, block in _unseen(blocks, seen):
                bwhere = f"{where}['blocks'][{j}]"
                _dict_at(block, name, bwhere)
                _check_int_field(block, "size", name, bwhere)
                _check_int_field(block, "requested_size", name, bwhere, required=False)
                if not isinstance(block.get("state"), str):
                    _fail(name, bwhere, "has no 'state' string")


def _check_traces(traces: Any, name: str) -> None:
    if not isinstance(traces, list):
        _fail(name, "'device_traces'", f"is a {_type_name(traces)}, expected a list of lists")
    seen: set[int] = set()  # ids of the trace lists checked
    for d, trace in enumerate(traces):
        if isinstance(trace, _C.TraceColumns):
            continue  # its entries passed these checks to become records
        if not isinstance(trace, list):
            _fail(name, f"device_traces[{d}]", f"is a {_type_name(trace)}, expected a list")
        for _, trace in _unseen([trace], seen):
            for i, entry in enumerate(trace):
                # The common case in one expression (plain ints, a str action);
                # anything else goes through _check_entry, which names what is
                # wrong. Entries are not deduplicated: the records limit bounds them.
                if type(entry) is dict:
                    get = entry.get
                    action, size, stream = get("action"), get("size"), get("stream", 0)
                    needed, other = ((get("device_free"), get("addr", 0)) if action == "oom"
                                     else (get("addr"), get("device_free", 0)))
                    if (type(action) is str and type(size) is int and type(needed) is int
                            and type(other) is int and type(stream) is int
                            and 0 <= size < _U64 and 0 <= needed < _U64 and 0 <= other < _U64
                            and -(1 << 63) <= stream < _U64):
                        continue
                _check_entry(entry, name, f"device_traces[{d}][{i}]")


def _check_entry(entry: Any, name: str, where: str) -> None:
    action = _dict_at(entry, name, where).get("action")
    if not isinstance(action, str):
        if "action" not in entry:
            _fail(name, where, "has no 'action'")
        _fail(name, where, f"has 'action' of type {_type_name(action)}, expected a str")
    _check_int_field(entry, "size", name, where)
    _check_int_field(entry, "device_free", name, where, required=action == "oom")
    _check_int_field(entry, "addr", name, where, required=action != "oom")
    _check_int_field(entry, "stream", name, where, required=False, signed=True)
