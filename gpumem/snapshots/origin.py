"""Library or user code: where a source file of a recorded stack really lives.

An allocation site is the innermost frame of the user's own code, so every
frame's file is classified as one of:
- "library": torch and its companions (torchgen, functorch, triton) and
  gpumem, the standard library, and generated code (inductor's, <frozen>);
- "package": any other installed package (site-packages, dist-packages);
- "user": everything else.

Note [Where a file lives]
Rationale: a folder's name says nothing about what is in it.  A user's
  ~/torch/train.py, or a checkout of gpumem cloned as ``gpumem``, is the
  user's code; judging by a folder named torch/ or gpumem/ hid the leaking
  line behind "(library code only)".
Approach: a file is library code when it lives where an installed package or
  the interpreter puts it: under site-packages/ or dist-packages/ in the
  folder of one of the library packages; in the standard library of some
  Python (``<...>/lib/pythonX.Y/<module>`` on POSIX, ``<drive>:/.../Lib/<module>``
  on Windows, where <module> is a standard-library module's name); in this
  interpreter's own stdlib folders; or, on this machine, in the folder the
  library packages are really imported from (a source checkout of torch, this
  gpumem).  Paths are compared as text, so snapshots from other machines are
  judged by the same rules.
Limitations: a library package run from a source checkout on another machine
  (not under site-packages) reads as user code there; a user module named
  like a standard-library module inside a folder ``lib/pythonX.Y/`` reads as
  the standard library.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import sysconfig

__all__ = ["LIBRARY_PACKAGES", "norm_path", "is_library_file", "is_package_file"]

LIBRARY_PACKAGES = ("torch", "torchgen", "functorch", "triton", "gpumem")

_INSTALLED_LIB_RE = re.compile(
    r"/(?:site|dist)-packages/(?:" + "|".join(LIBRARY_PACKAGES) + r")/")
_PKG_RE = re.compile(r"/(?:site|dist)-packages/")
_GENERATED_RE = re.compile(r"/torchinductor_[^/]*/|^<frozen ")
_POSIX_STDLIB_RE = re.compile(r"/lib/python\d+(?:\.\d+)?t?/([^/]+)")
_WIN_STDLIB_RE = re.compile(r"^[a-z]:/(?:.*/)?lib/([^/]+)", re.I)


def _stdlib_names() -> frozenset:
    """The standard library's top-level module names: sys.stdlib_module_names
    (3.10+); on 3.9, which lacks it, the names in this interpreter's
    standard library folder and its built-in modules."""
    names = getattr(sys, "stdlib_module_names", None)
    if names:
        return frozenset(names)
    try:
        entries = os.listdir(sysconfig.get_paths()["stdlib"])
    except (OSError, KeyError):
        return frozenset()
    return frozenset(e[:-3] if e.endswith(".py") else e for e in entries
                     if e != "site-packages") | frozenset(sys.builtin_module_names)


_STDLIB_NAMES = _stdlib_names()


def norm_path(path: str) -> str:
    return path.replace("\\", "/")


def _folder(path: str) -> str:
    return norm_path(path).rstrip("/") + "/"


_local: tuple[tuple[str, ...], tuple[str, ...]] | None = None


def _local_places() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(folders the library packages are imported from here, this interpreter's
    stdlib folders), found once and without importing the packages."""
    global _local
    if _local is not None:
        return _local
    packages = {_folder(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}  # gpumem/
    for name in LIBRARY_PACKAGES:
        module = sys.modules.get(name)
        places = list(getattr(module, "__path__", None) or [])
        if not places:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.origin not in (None, "namespace"):
                places = list(spec.submodule_search_locations or [])
        packages.update(_folder(p) for p in places)
    stdlib = {_folder(p) for key in ("stdlib", "platstdlib")
              for p in [sysconfig.get_paths().get(key)] if p}
    _local = (tuple(sorted(packages)), tuple(sorted(stdlib)))
    return _local


def _stdlib_name(match: re.Match | None) -> bool:
    if match is None:
        return False
    if not _STDLIB_NAMES:   # no list of names (the stdlib folder unreadable): trust the folder
        return True
    top = match.group(1)
    top = top[:-3] if top.endswith(".py") else top
    return top in _STDLIB_NAMES


def is_library_file(filename: str) -> bool:
    """True for torch, its companions, gpumem, the standard library and
    generated code, judged by where the file lives (Note [Where a file lives])."""
    p = norm_path(filename)
    if _INSTALLED_LIB_RE.search(p) or _GENERATED_RE.search(p):
        return True
    packages, stdlib = _local_places()
    if p.startswith(packages):
        return True
    if _PKG_RE.search(p):
        return False
    if p.startswith(stdlib):
        return True
    return _stdlib_name(_POSIX_STDLIB_RE.search(p)) or _stdlib_name(_WIN_STDLIB_RE.search(p))


def is_package_file(filename: str) -> bool:
    """True for a file of an installed package (site-packages or dist-packages)."""
    return bool(_PKG_RE.search(norm_path(filename)))
