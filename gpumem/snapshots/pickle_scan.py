"""A walk over a pickle's opcodes before it is unpickled: the memo indexes.

CPython's C unpickler keeps its memo in an array that it grows to twice any
index a PUT, BINPUT or LONG_BINPUT names, zero-filling it first: a 9-byte
pickle that stores to index 2**29 makes it allocate and touch 8 GB before
anything fails (issue 16.6).  Every pickler numbers its memo entries 0, 1,
2, ... as it stores them (Python's, torch's C++ pickler, pickletools.optimize),
so an index can never be larger than the number of stores before it.
The same walk finds a length-prefixed argument (BYTES8, BYTEARRAY8, ...)
longer than the data left: the unpickler would allocate the length it names
before finding the data truncated, and CPython 3.9 and 3.10 leak a buffer
export when that allocation of a BYTEARRAY8 fails ("deallocated bytearray
object has exported buffers" on stderr).
refusal() walks the opcodes exactly as the unpickler will read them and
returns the first store or argument that breaks these rules, so the loader
refuses the file before unpickling it.

The walk stops where the unpickler would stop reading (STOP, an unknown
opcode, the end of the data), so it never disagrees with the unpickler
about where an opcode starts.  It costs about 25 ms per MB of pickle.
Must not: build any object from the data.
"""

from __future__ import annotations

import pickletools

__all__ = ["refusal", "SLACK"]

#: Stores may name an index this far beyond the count (no pickler does).
SLACK = 1024

_UNKNOWN = -100
_NEWLINE = pickletools.UP_TO_NEWLINE
# Opcodes whose argument is a length prefix of n bytes, then that many bytes;
# the 4-byte prefix of LONG4 and BINSTRING is signed.
_PREFIX = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: 4,
           pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}
_SIGNED = pickletools.TAKEN_FROM_ARGUMENT4


def _table() -> list[int]:
    """Per opcode byte: argument bytes (>= 0), a pickletools length code, or _UNKNOWN."""
    table = [_UNKNOWN] * 256
    for op in pickletools.opcodes:
        table[ord(op.code)] = 0 if op.arg is None else op.arg.n
    return table


_ARG = _table()
_STOP, _MEMOIZE, _PUT, _BINPUT, _LONG_BINPUT = (ord(c) for c in ".\x94pqr")
_TWO_LINES = (ord("c"), ord("i"))  # GLOBAL and INST: module and name lines
# Per opcode byte: how far to step over an opcode that needs no look (1 +
# its fixed argument), 0 for those handled one by one below.
_SKIP = [0 if k < 0 or op in (_STOP, _MEMOIZE, _BINPUT, _LONG_BINPUT) else 1 + k
         for op, k in enumerate(_ARG)]


def refusal(data: bytes) -> tuple[str, int, int, int] | None:
    """The first reason to refuse data, or None: ("memo", offset, index,
    stores so far) for a memo store whose index exceeds the stores before it
    by more than SLACK; ("overlong", offset, length, bytes left) for an
    argument longer than the data after its length prefix."""
    arg, skip, frombytes, find = _ARG, _SKIP, int.from_bytes, data.find
    n, i, stores = len(data), 0, 0
    while i < n:
        op = data[i]
        step = skip[op]
        if step:
            i += step
            continue
        at = i
        i += 1
        k = arg[op]
        if op == _BINPUT or op == _LONG_BINPUT:
            index = frombytes(data[i:i + k], "little")
            if index > stores + SLACK:
                return "memo", at, index, stores
            stores += 1
            i += k
        elif op == _MEMOIZE:
            stores += 1
        elif op == _STOP:
            return None
        elif k == _NEWLINE:
            j = find(b"\n", i)
            if j < 0:
                return None
            if op == _PUT:  # parsed as the unpickler does (int() of the line)
                try:
                    index = int(data[i:j])
                except ValueError:
                    return None  # the unpickler refuses it
                if index < 0:
                    return None
                if index > stores + SLACK:
                    return "memo", at, index, stores
                stores += 1
            elif op in _TWO_LINES:
                j = find(b"\n", j + 1)
                if j < 0:
                    return None
            i = j + 1
        elif k in _PREFIX:
            width = _PREFIX[k]
            length = frombytes(data[i:i + width], "little", signed=(k == _SIGNED))
            if length < 0:
                return None  # the unpickler refuses a negative length
            i += width
            if length > n - i:
                return "overlong", at, length, max(n - i, 0)
            i += length
        else:
            return None  # an unknown opcode: the unpickler stops here
    return None
