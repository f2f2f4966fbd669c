"""Build the fake CUDA driver ``libcuda.so.1`` used by gpumem's tests.

    from tests.fakecuda.build import build_fakecuda
    lib = build_fakecuda(tmp_dir)                 # -> tmp_dir/libcuda.so.1

    python tests/fakecuda/build.py OUT_DIR [--no-cuda-h] [--cflags=-fsanitize=address]

The library is compiled from the C files next to this script with
``cc -shared -fPIC -O1 -g -Wall -Wextra -fvisibility=hidden``, the SONAME
``libcuda.so.1`` and the version script ``libcuda.map``. When NVIDIA's
``cuda.h`` is found, the fake is compiled against it, so the compiler checks
every definition against the real prototypes; otherwise against the
project's ``cuda_min.h``. A build is reused when nothing that went into it
(sources, flags, compiler, header) changed.

Environment: ``CC`` picks the compiler (default ``cc``).
``GPUMEM_FAKECUDA_CUDA_INCLUDE`` names the directory holding cuda.h, or is
``none`` to force the fallback header.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Union

HERE = Path(__file__).resolve().parent
SOURCES = ("fakecuda.c", "fakecuda_report.c", "fakecuda_mem.c", "fakecuda_sync.c")
HEADERS = ("fakecuda_internal.h", "cuda_min.h")
VERSION_SCRIPT = "libcuda.map"
LIB_NAME = "libcuda.so.1"
BASE_FLAGS = ("-shared", "-fPIC", "-O1", "-g", "-Wall", "-Wextra", "-fvisibility=hidden")
AUTO = "auto"

__all__ = ["build_fakecuda", "find_cuda_include", "BuildError", "LIB_NAME"]


class BuildError(RuntimeError):
    """The C compiler failed; the message holds its command line and output."""


def _has_vmm_api(header: Path) -> bool:
    try:
        return "cuMemAddressReserve" in header.read_text(errors="replace")
    except OSError:
        return False


def find_cuda_include() -> Optional[Path]:
    """The include directory of an installed CUDA toolkit (>= 10.2), or None."""
    env = os.environ.get("GPUMEM_FAKECUDA_CUDA_INCLUDE")
    if env is not None:
        if env.strip().lower() in ("", "none", "0"):
            return None
        path = Path(env)
        if not (path / "cuda.h").is_file():
            raise BuildError(f"GPUMEM_FAKECUDA_CUDA_INCLUDE={env!r} has no cuda.h")
        return path
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)]
    candidates.append(Path("/usr/include"))  # distribution packages (not linux/cuda.h)
    for inc in candidates:
        if (inc / "cuda.h").is_file() and _has_vmm_api(inc / "cuda.h"):
            return inc
    return None


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def _digest(cmd: list[str], cuda_include: Optional[Path]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(cmd).encode())
    for name in SOURCES + HEADERS + (VERSION_SCRIPT,):
        h.update(name.encode())
        h.update((HERE / name).read_bytes())
    if cuda_include is not None:
        h.update((cuda_include / "cuda.h").read_bytes())
    try:
        version = subprocess.run(cmd[:1] + ["--version"], capture_output=True, text=True).stdout
    except OSError:
        version = ""
    h.update(version.encode())
    return h.hexdigest()


def build_fakecuda(
    out_dir: Union[str, os.PathLike],
    extra_flags: Iterable[str] = (),
    *,
    cuda_include: Union[str, os.PathLike, None] = AUTO,
    force: bool = False,
) -> Path:
    """Compile ``out_dir/libcuda.so.1`` (if out of date) and return its path.

    extra_flags: added to the compiler command, e.g. ``["-fsanitize=address"]``.
    cuda_include: ``"auto"`` searches for cuda.h (see ``find_cuda_include``),
    None forces the fallback ``cuda_min.h``, a path names cuda.h's directory.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cuda_include == AUTO:
        inc = find_cuda_include()
    elif cuda_include is None:
        inc = None
    else:
        inc = Path(cuda_include)
        if not (inc / "cuda.h").is_file():
            raise BuildError(f"{inc} has no cuda.h")

    cc = _compiler()
    if shutil.which(cc[0]) is None:
        raise BuildError(f"C compiler {cc[0]!r} not found (set CC)")
    target = out / LIB_NAME
    cmd = cc + list(BASE_FLAGS) + list(extra_flags)
    if inc is not None:
        cmd += ["-DFAKECUDA_USE_CUDA_H", "-I", str(inc)]
    cmd += [
        "-I", str(HERE),
        "-pthread",
        f"-Wl,-soname,{LIB_NAME}",
        f"-Wl,--version-script={HERE / VERSION_SCRIPT}",
        "-Wl,--no-undefined",
    ]
    cmd += [str(HERE / s) for s in SOURCES]

    stamp = out / (LIB_NAME + ".buildinfo")
    digest = _digest(cmd, inc)
    if not force and target.is_file() and stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("digest") == digest:
                return target
        except (OSError, ValueError):
            pass

    # Compile next to the target, then rename: concurrent builds (pytest-xdist)
    # never see a half-written library.
    fd, tmp = tempfile.mkstemp(prefix=".libcuda.", suffix=".so", dir=out)
    os.close(fd)
    try:
        proc = subprocess.run(cmd + ["-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(
                "building the fake libcuda failed:\n  "
                + " ".join(shlex.quote(c) for c in cmd)
                + "\n"
                + proc.stdout
                + proc.stderr
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    info = {"digest": digest, "cuda_include": str(inc) if inc else None, "command": cmd,
            "warnings": proc.stderr}
    stamp_tmp = stamp.with_name(stamp.name + f".{os.getpid()}")
    stamp_tmp.write_text(json.dumps(info, indent=1))
    os.replace(stamp_tmp, stamp)
    return target


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Build the fake CUDA driver libcuda.so.1.")
    parser.add_argument("out_dir", help="directory to write libcuda.so.1 into")
    parser.add_argument("--no-cuda-h", action="store_true",
                        help="compile against cuda_min.h even if cuda.h is installed")
    parser.add_argument("--cflags", default="", help="extra compiler flags; write --cflags='-fsanitize=address -O0'")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    try:
        lib = build_fakecuda(args.out_dir, shlex.split(args.cflags),
                             cuda_include=None if args.no_cuda_h else AUTO, force=args.force)
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
