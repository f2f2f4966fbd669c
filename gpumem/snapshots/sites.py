"""Allocation sites: a snapshot's stacks, interned, and each labelled by the
innermost frame of the user's own code (file:line:function).

StackTable interns frame lists by object identity (a snapshot shares
identical stacks, and torch and gpumem share identical frames) and gives
each stack its site: the innermost Python frame outside the library code
(gpumem/snapshots/origin.py decides what that is, by where a file lives), labelled
"(via <package frame>)" when an installed package called torch on the
user's behalf; stacks with only library frames keep their innermost frame
with "(library code only)"; C++-only stacks are named by their autograd node
and ATen op; stacks without frames share "<no stack recorded>".  Must not:
import torch or the extension (snapshots are analysed anywhere).
"""

from __future__ import annotations

import re
from typing import Any

from gpumem.snapshots.origin import is_library_file, is_package_file
from gpumem.snapshots.unpickle import short_int

__all__ = ["StackTable", "frame_fields", "is_python_frame", "is_noise_frame", "format_frame",
           "opt_int", "text_of", "U64"]

U64 = 1 << 64


def opt_int(value: Any, default: int | None = None) -> int | None:
    """An optional integer field, or default when absent, mistyped or absurd."""
    if isinstance(value, int) and not isinstance(value, bool) and -U64 < value < U64:
        return value
    return default


def text_of(value: Any, limit: int = 400) -> str:
    """A field for display: a str as it is, a number by its digits (a huge
    integer by its length), anything else by its type: never repr() of a
    container, since shared nested lists make it endless."""
    if isinstance(value, str):
        text = value
    elif value is None:
        text = ""
    elif isinstance(value, int):
        text = short_int(value)
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_NOISE_NAME = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp",
               "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_", "_PyEval", "_PyObject")
_NOISE_FILE = ("core/boxing", "/Register", "/Redispatch", "pythonrun.c", "Modules/main.c",
               "Objects/call.c", "Objects/methodobject.c", "pycore_ceval.h", "ceval.c",
               "cpython/abstract.h")
_OP_RE = re.compile(r"at::_ops::(\w+)::(?:call|redispatch)")
_NODE_RE = re.compile(r"autograd::generated::(\w+)::apply")


def frame_fields(f: Any) -> tuple[str, int, str] | None:
    """(filename, line, name) of one frame dict, or None for a malformed frame."""
    if not isinstance(f, dict):
        return None
    line = opt_int(f.get("line"), 0)
    return text_of(f.get("filename"), 300), line, text_of(f.get("name"), 300)


def is_python_frame(filename: str) -> bool:
    return filename.endswith((".py", ".pyw")) or (
        filename.startswith("<") and filename.endswith(">"))


def is_noise_frame(filename: str, name: str) -> bool:
    """C++ frames of the capture machinery and the interpreter, hidden in stacks."""
    return name in ("_start",) or any(s in name for s in _NOISE_NAME) or any(
        s in filename for s in _NOISE_FILE)


def format_frame(fields: tuple[str, int, str]) -> str:
    filename, line, name = fields
    if not filename or filename == "??":
        return name or "??"
    return f"{filename}:{line}:{name}"


_MISSING = object()


class StackTable:
    """Interns frame lists (by object identity: a snapshot shares identical
    stacks) and gives each stack an allocation site.  Stack 0 is "no frames"."""

    NO_STACK = "<no stack recorded>"

    def __init__(self) -> None:
        self._by_obj: dict[int, int] = {}
        self._frame_cache: dict[int, Any] = {}
        self._keep: list[Any] = []
        self.stacks: list[tuple[tuple[str, int, str], ...]] = [()]
        self._by_frames: dict[tuple, int] = {(): 0}
        self.stack_site: list[int] = []
        self.sites: list[dict] = []
        self._site_ids: dict[tuple, int] = {}
        self._library: dict[str, bool] = {}
        self.stack_site.append(self._site(("none",), self.NO_STACK, "none", None))

    def intern(self, frames: Any) -> int:
        if not frames or not isinstance(frames, (list, tuple)):
            return 0
        sid = self._by_obj.get(id(frames))
        if sid is not None:
            return sid
        cache = self._frame_cache
        fields = []
        for f in frames:
            x = cache.get(id(f), _MISSING)
            if x is _MISSING:
                x = cache[id(f)] = frame_fields(f)
                self._keep.append(f)
            if x is not None:
                fields.append(x)
        fields = tuple(fields)
        sid = self._by_frames.get(fields)
        if sid is None:
            sid = len(self.stacks)
            self.stacks.append(fields)
            self._by_frames[fields] = sid
            self.stack_site.append(self._site_of(fields))
        self._by_obj[id(frames)] = sid
        self._keep.append(frames)  # ids stay valid while the table lives
        return sid

    def site_of_stack(self, sid: int) -> dict:
        return self.sites[self.stack_site[sid]]

    def _site(self, key: tuple, label: str, kind: str, frame: tuple | None) -> int:
        site_id = self._site_ids.get(key)
        if site_id is None:
            site_id = len(self.sites)
            site = {"label": label, "kind": kind}
            if frame is not None:
                site.update(filename=frame[0], line=frame[1], name=frame[2])
            self.sites.append(site)
            self._site_ids[key] = site_id
        return site_id

    def _site_of(self, fields: tuple[tuple[str, int, str], ...]) -> int:
        if not fields:
            return 0
        python = [f for f in fields if is_python_frame(f[0])]
        code = [f for f in python if not self._is_library(f[0])]
        if code:
            lib = code[0]  # innermost frame outside torch/gpumem/stdlib (may be a package)
            own = next((f for f in code if not is_package_file(f[0])), None)
            if own is None or own is lib:
                return self._site(("user", lib), format_frame(lib), "user", lib)
            label = f"{format_frame(own)} (via {format_frame(lib)})"
            return self._site(("user", own, lib), label, "user", own)
        if python:
            label = format_frame(python[0]) + " (library code only)"
            return self._site(("stack",) + fields, label, "library", python[0])
        ops = [m.group(1) for f in fields for m in [_OP_RE.search(f[2])] if m]
        node = next((m.group(1) for f in fields for m in [_NODE_RE.search(f[2])] if m), None)
        parts = [p for p in (node, f"aten::{ops[-1]}" if ops else None) if p]
        if not parts:
            shown = [f for f in fields if not is_noise_frame(f[0], f[2])] or list(fields)
            parts = [text_of(shown[0][2], 80)]
        return self._site(("stack",) + fields, "[C++] " + " ".join(parts), "c++", None)

    def _is_library(self, filename: str) -> bool:
        """is_library_file, once per file name (a stack may repeat one a million times)."""
        known = self._library.get(filename)
        if known is None:
            known = self._library[filename] = is_library_file(filename)
        return known

    def stack_lines(self, sid: int, limit: int = 60) -> list[str]:
        """The stack innermost first, capture machinery hidden, repeats collapsed.

        At most ``limit`` lines are made from at most max(1000, 20 * limit)
        frames, then "... N more frames" counts the frames not looked at, so
        a stack of a million frames costs what a short one does."""
        out: list[str] = []
        frames = self.stacks[sid]
        scan = max(1000, 20 * limit)
        for k, f in enumerate(frames):
            if len(out) == limit or k == scan:
                out.append(f"... {len(frames) - k} more frames")
                break
            if is_noise_frame(f[0], f[2]):
                continue
            text = format_frame(f)
            if not out or out[-1] != text:
                out.append(text)
        return out
