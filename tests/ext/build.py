"""Build and import _testext, gpumem's test-only extension (tests/ext/*.c).

    from build import load             # or load this file by path
    _testext = load()                  # compiled on first use, then cached

    python tests/ext/build.py [--out DIR] [--cflags='-fsanitize=address'] [--force]

_testext holds what only tests and benchmarks need: a virtual device with
failure injection, counters and event modes (VirtualDevice, handed to
gpumem._C.Allocator(device_backend=...)), the malloc+free timing loop
(bench_pairs) and the memory-history thread helpers (hist_*). setup.py never
builds it and wheels never ship it. It reaches gpumem._C only through the
capsules _core_api and _hist_api, and compiles its own copy of the
virtual device (csrc/device/vdev.c, vdev_memory.c and csrc/base/*.c).

Compiled with $CC (default cc) as
``-shared -fPIC -std=c11 -O2 -g -Wall -Wextra -Wno-unused-parameter
-fvisibility=hidden -pthread`` plus any extra flags, against this Python's
headers, into tests/ext/build/ (git-ignored) as
``_testext-<digest><EXT_SUFFIX>``, where the digest covers the command
line, every source and header that can go into it, the compiler's version
and the Python version. A build is reused while its digest holds and made
again when anything in it changes. The library and its compiler log
(``.log``, the warnings; empty when clean) are written under temporary names
and renamed into place, so two processes building at once both end up with
a complete file.
"""

from __future__ import annotations

import argparse
import functools
import glob
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSRC = ROOT / "csrc"
DEFAULT_OUT = HERE / "build"
MODULE = "_testext"
FLAGS = ("-shared", "-fPIC", "-std=c11", "-O2", "-g", "-D_GNU_SOURCE", "-Wall", "-Wextra",
         "-Wno-unused-parameter", "-fvisibility=hidden", "-pthread")
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer", "-O1")
# The virtual device's sources (csrc/device/).
VDEV_SOURCES = ("vdev.c", "vdev_call.c", "vdev_memory.c")
# The cached C unwinder (csrc/history/), compared with backtrace() here.
CUNWIND_SOURCES = ("cfi.c", "cunwind.c")
# Headers of these layers can be included by the sources (directly or not).
HEADER_LAYERS = ("base", "device", "core", "history", "python")

__all__ = ["build", "load", "import_from", "BuildError", "SANITIZE", "MODULE"]


class BuildError(RuntimeError):
    """The C compiler is missing or failed; the message says which and why."""


def _layers():
    spec = importlib.util.spec_from_file_location("gpumem_csrc_layers", CSRC / "layers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compiler() -> list:
    return shlex.split(os.environ.get("CC", "").strip() or "cc")


@functools.lru_cache(maxsize=None)
def _compiler_version(exe: str) -> str:
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise BuildError(f"the C compiler {exe!r} cannot be run ({e}); set CC") from None


def sources(ext_dir: Union[str, os.PathLike, None] = None) -> list:
    """The .c files of one build: base, the virtual device, the cached unwinder, then tests/ext."""
    ext_dir = Path(ext_dir or HERE)
    native = [Path(p) for p in _layers().sources("base", root=str(CSRC))]
    vdev = [CSRC / "device" / name for name in VDEV_SOURCES]
    cunwind = [CSRC / "history" / name for name in CUNWIND_SOURCES]
    return native + vdev + cunwind + sorted(ext_dir.glob("*.c"))


def _headers(ext_dir: Path) -> list:
    found = [Path(p) for layer in HEADER_LAYERS
             for p in sorted(glob.glob(str(CSRC / layer / "*.h")))]
    return found + sorted(ext_dir.glob("*.h"))


def _command(ext_dir: Path, extra_flags: Iterable[str], cc: Optional[Sequence[str]]) -> list:
    paths = sysconfig.get_paths()
    includes = ["-I" + str(CSRC), "-I" + str(ext_dir), "-I" + paths["include"]]
    if paths.get("platinclude") and paths["platinclude"] != paths["include"]:
        includes.append("-I" + paths["platinclude"])
    return (list(cc or _compiler()) + list(FLAGS) + list(extra_flags) + includes
            + [str(s) for s in sources(ext_dir)] + ["-lpthread"])


def _digest(cmd: list, ext_dir: Path) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(cmd).encode())
    for p in sources(ext_dir) + _headers(ext_dir):
        h.update(str(p).encode())
        h.update(p.read_bytes())
    h.update(_compiler_version(cmd[0]).encode())
    h.update(sys.version.encode())
    h.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    return h.hexdigest()


def _write_atomic(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix="." + target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(out_dir: Union[str, os.PathLike, None] = None, extra_flags: Iterable[str] = (), *,
          ext_dir: Union[str, os.PathLike, None] = None, cc: Optional[Sequence[str]] = None,
          force: bool = False) -> Path:
    """Compile _testext (unless an identical build exists) and return its path.

    out_dir: where builds go (default tests/ext/build). extra_flags: added to
    the compiler's command, e.g. SANITIZE. ext_dir: the extension's sources
    (default tests/ext). cc: the compiler as an argv prefix (default $CC, else
    cc). force: compile even if the build exists.
    """
    ext_dir = Path(ext_dir or HERE).resolve()
    out = Path(out_dir or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    cmd = _command(ext_dir, extra_flags, cc)
    digest = _digest(cmd, ext_dir)
    target = out / f"{MODULE}-{digest[:16]}{sysconfig.get_config_var('EXT_SUFFIX')}"
    log = target.with_name(target.name + ".log")
    if target.is_file() and log.is_file() and not force:
        return target
    fd, tmp = tempfile.mkstemp(prefix="." + target.name + ".", suffix=".so", dir=out)
    os.close(fd)
    try:
        try:
            proc = subprocess.run(cmd + ["-o", tmp], capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL)
        except OSError as e:
            raise BuildError(f"the C compiler {cmd[0]!r} cannot be run ({e}); set CC") from None
        if proc.returncode != 0:
            raise BuildError(f"building {MODULE} failed:\n  "
                             + " ".join(shlex.quote(c) for c in cmd) + "\n"
                             + proc.stdout + proc.stderr)
        _write_atomic(log, (proc.stdout + proc.stderr).encode())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_loaded: dict = {}


def import_from(path: Union[str, os.PathLike]):
    """Import the _testext library at path (once per process and path)."""
    path = str(path)
    if path not in _loaded:
        loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
        spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _loaded[path] = mod
    return _loaded[path]


def load(extra_flags: Iterable[str] = (), out_dir: Union[str, os.PathLike, None] = None):
    """Build _testext if needed and import it. It imports gpumem._C itself."""
    return import_from(build(out_dir, extra_flags))


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description="Build gpumem's test-only extension _testext.")
    ap.add_argument("--out", default=None, help=f"build folder (default {DEFAULT_OUT})")
    ap.add_argument("--cflags", default="", help="extra compiler flags, e.g. --cflags='-O0 -g'")
    ap.add_argument("--force", action="store_true", help="compile even if up to date")
    args = ap.parse_args(argv)
    try:
        path = build(args.out, shlex.split(args.cflags), force=args.force)
    except BuildError as e:
        print(e, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
