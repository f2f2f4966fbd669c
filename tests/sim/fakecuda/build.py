"""Build the fake CUDA driver ``libcuda.so.1`` for gpumem's tests.

    from tests.fakecuda.build import build_fakecuda
    lib = build_fakecuda(tmp_dir)                 # -> tmp_dir/libcuda.so.1

    python tests/sim/fakecuda/build.py OUT_DIR [--no-cuda-h] [--cflags=-fsanitize=address]

The driver's sources live in simgpu/driver (it ships with gpumem as part
of the simulated GPU, see simgpu/README.md); this file is the test-facing
wrapper around simgpu/build.py's ``build_libcuda``. It is compiled with
``cc -shared -fPIC -O1 -g -Wall -Wextra -fvisibility=hidden``, the SONAME
``libcuda.so.1`` and the version script ``libcuda.map``. When NVIDIA's
``cuda.h`` is found (toolkit or nvidia pip wheel), the fake is compiled
against it, so the compiler checks every definition against the real
prototypes; otherwise against the project's ``cuda_min.h``. A build is reused
when nothing that went into it (sources, flags, compiler, header) changed.

Environment: ``CC`` picks the compiler (default ``cc``).
``GPUMEM_FAKECUDA_CUDA_INCLUDE`` names the directory holding cuda.h, or is
``none`` to force the fallback header.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from pathlib import Path
from typing import Iterable, Optional, Union

HERE = Path(__file__).resolve().parent
SIM_BUILD = HERE.parents[2] / "simgpu" / "build.py"
DRIVER_DIR = SIM_BUILD.parent / "driver"


def _load_sim_build():
    name = "gpumem_csrc_sim_build"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, SIM_BUILD)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


_sim = _load_sim_build()
BuildError = _sim.BuildError
find_cuda_include = _sim.find_cuda_include
LIB_NAME = _sim.DRIVER_SONAME
AUTO = _sim.AUTO

__all__ = ["build_fakecuda", "find_cuda_include", "BuildError", "LIB_NAME", "DRIVER_DIR"]


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
    return _sim.build_libcuda(out_dir, extra_flags, cuda_include=cuda_include, force=force)


def main(argv: Optional[list] = None) -> int:
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
