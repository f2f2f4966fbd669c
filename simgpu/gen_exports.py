"""Regenerate the export lists of the simulator's fake CUDA libraries.

    python simgpu/gen_exports.py [--major 13] [--lib-dir DIR] [--include-dir DIR] [--out DIR]

For every library the simulator fakes (libcudart, libcublas, libcublasLt of
one CUDA major version, cuDNN 9's libcudnn.so.9 and NCCL 2's libnccl.so.2
built for it) this reads the real library's dynamic symbol table
with ``nm -D --defined-only`` and writes ``simgpu/cudaNN/<soname>.syms``:
one exported name per line, sorted, optionally followed by the policy the
fake's generated stub follows when the name is not implemented in C:

    (nothing)  log the name once, return the library's "not supported" code
    noop       check that the first argument is a live handle, do nothing,
               return success (cuBLAS routines: GEMM, GEMV, ...)

A cuBLAS name gets ``noop`` when its prototype in cublas_api.h takes a
``cublasHandle_t`` first. The header comment records where the list came
from (package, version, sha256 of the library), so tests can tell whether the
installed wheel is the one the list was made from.

The real libraries are needed only here, never to build the fakes: the
lists are committed. Default locations are the nvidia pip wheels that
PyTorch's CUDA build depends on: site-packages/nvidia/cu13/{lib,include} for
CUDA 13, site-packages/nvidia/{cuda_runtime,cublas,...}/{lib,include} for
CUDA 12 (run it with the Python of a CUDA 12 torch: --major 12).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent

# base name -> (pip distribution that ships it, for the header comment;
# its directory under site-packages/nvidia in CUDA 12's layout). CUDA 13
# wheels are named nvidia-<name> and share nvidia/cu13/{lib,include}; CUDA
# 12 wheels are named nvidia-<name>-cu12 and each has its own
# nvidia/<directory>/{lib,include}.
LIBRARIES = {
    "libcudart": ("nvidia-cuda-runtime", "cuda_runtime"),
    "libcublas": ("nvidia-cublas", "cublas"),
    "libcublasLt": ("nvidia-cublas", "cublas"),
}
# Libraries versioned apart from CUDA: base name -> (SONAME, pip distribution
# for CUDA major {major}, directory under site-packages/nvidia). Their lists
# also go to cudaNN/, since the wheel is built for that CUDA major version.
SEPARATE = {
    "libcudnn": ("libcudnn.so.9", "nvidia-cudnn-cu{major}", "cudnn"),
    "libnccl": ("libnccl.so.2", "nvidia-nccl-cu{major}", "nccl"),
}
# Libraries whose names carry no version node (NCCL's: `nm -D` shows plain
# names, and PyTorch's references to them are unversioned).
UNVERSIONED = {"libnccl"}
# Symbols the linker defines in a library built without a version script
# (NCCL 2.27's for CUDA 12); not part of the library's interface.
LINKER_SYMBOLS = {"__bss_start", "_edata", "_end"}


def nvidia_dir(major: int, base: str = "libcudart") -> Optional[Path]:
    """The wheel directory (with lib/ and include/) of the running Python
    that holds one of LIBRARIES for CUDA major: site-packages/nvidia/cuNN
    from CUDA 13 on, site-packages/nvidia/<its directory> before."""
    sub = f"cu{major}" if major >= 13 else LIBRARIES[base][1]
    for entry in sys.path:
        cand = Path(entry) / "nvidia" / sub
        if (cand / "lib" / soname(base, major)).is_file():
            return cand
    return None


def dist_name(base: str, major: int) -> str:
    """The pip distribution that ships one of LIBRARIES for CUDA major."""
    dist = LIBRARIES[base][0]
    return dist if major >= 13 else f"{dist}-cu{major}"


def soname(base: str, major: int) -> str:
    if base in SEPARATE:
        return SEPARATE[base][0]
    return f"{base}.so.{major}"


def separate_dir(base: str) -> Optional[Path]:
    """site-packages/nvidia/<dir> of a library versioned apart from CUDA."""
    for entry in sys.path:
        cand = Path(entry) / "nvidia" / SEPARATE[base][2]
        if (cand / "lib").is_dir():
            return cand
    return None


def read_exports(lib: Path, version_node: Optional[str]) -> List[str]:
    """Names the library defines, checking they all carry version_node
    (None: that none carries a version)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    names = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        kind, sym = parts[1], parts[2]
        name, _, version = sym.partition("@")
        version = version.lstrip("@")
        if kind == "A" and name == version_node:
            continue  # the version node's own symbol
        if version_node is None and name in LINKER_SYMBOLS:
            continue
        if version != (version_node or ""):
            raise SystemExit(f"{lib}: {sym} is not in version node {version_node}")
        names.append(name)
    return sorted(set(names))


def handle_first_functions(header: Path) -> set:
    """Names whose prototype in the cuBLAS header takes cublasHandle_t first."""
    text = header.read_text(errors="replace")
    return set(re.findall(r"CUBLASWINAPI\s+(\w+)\s*\(\s*cublasHandle_t\s+[A-Za-z_]", text))


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def render(so: str, names: List[str], policies: Dict[str, str], source: Path, dist: str) -> str:
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    lines = [
        f"# Exported names of NVIDIA's {so}, one per line, sorted; a second word is the",
        "# fake's policy for a name it does not implement in C (see simgpu/README.md):",
        "#   (none) log once and return the library's 'not supported' code",
        "#   noop   check the handle (first argument), do nothing, return success",
        "# Generated by simgpu/gen_exports.py from `nm -D --defined-only`; do not edit.",
        f"# package: {dist} {package_version(dist)}",
        f"# sha256: {digest}",
        f"# count: {len(names)}",
    ]
    for n in names:
        lines.append(f"{n} {policies[n]}" if policies.get(n) else n)
    return "\n".join(lines) + "\n"


def generate(major: int, lib_dir: Optional[Path], include_dir: Optional[Path],
             separate_lib_dirs: Optional[Dict[str, Path]] = None) -> Dict[str, str]:
    """{soname: file text} for every faked library.

    lib_dir, include_dir: where LIBRARIES and cublas_api.h are (None: each
    library's pip wheel, nvidia_dir). separate_lib_dirs: {base: directory}
    for the SEPARATE libraries (default: their pip wheels); one that is not
    found is left out with a warning."""
    out = {}
    todo = []
    for base in LIBRARIES:
        where = lib_dir
        if where is None:
            found = nvidia_dir(major, base)
            if found is None:
                raise SystemExit(f"no pip wheel with {soname(base, major)} found (use --lib-dir)")
            where = found / "lib"
        todo.append((base, dist_name(base, major), where))
    if include_dir is None:
        found = nvidia_dir(major, "libcublas")
        include_dir = found / "include" if found else None
    for base, (_, dist, _) in SEPARATE.items():
        where = (separate_lib_dirs or {}).get(base)
        if where is None:
            found = separate_dir(base)
            where = found / "lib" if found else None
        if where is None:
            print(f"warning: no {soname(base, major)} found; its list is left as it is",
                  file=sys.stderr)
            continue
        todo.append((base, dist.format(major=major), where))
    for base, dist, where in todo:
        so = soname(base, major)
        lib = where / so
        if not lib.is_file():
            raise SystemExit(f"{lib} not found (use --lib-dir)")
        names = read_exports(lib, None if base in UNVERSIONED else so)
        policies: Dict[str, str] = {}
        if base == "libcublas":
            if include_dir is None or not (include_dir / "cublas_api.h").is_file():
                raise SystemExit("cublas_api.h not found (use --include-dir): needed for policies")
            noop = handle_first_functions(include_dir / "cublas_api.h")
            policies = {n: "noop" for n in names if n in noop}
        out[so] = render(so, names, policies, lib, dist)
    return out


def parse_syms(text: str) -> Tuple[Dict[str, str], List[Tuple[str, str]]]:
    """(header fields, [(name, policy)]) of a .syms file."""
    header: Dict[str, str] = {}
    rows: List[Tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith("#"):
            m = re.match(r"#\s*(package|sha256|count):\s*(.*)", line)
            if m:
                header[m.group(1)] = m.group(2).strip()
            continue
        parts = line.split()
        if parts:
            rows.append((parts[0], parts[1] if len(parts) > 1 else ""))
    return header, rows


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--major", type=int, default=13)
    ap.add_argument("--lib-dir", type=Path, help="directory with the real libraries")
    ap.add_argument("--include-dir", type=Path, help="directory with cublas_api.h")
    ap.add_argument("--cudnn-lib-dir", type=Path, help="directory with libcudnn.so.9")
    ap.add_argument("--nccl-lib-dir", type=Path, help="directory with libnccl.so.2")
    ap.add_argument("--out", type=Path, help="output directory (default simgpu/cudaNN)")
    args = ap.parse_args(argv)
    if args.lib_dir is None and nvidia_dir(args.major) is None:
        print(f"no CUDA {args.major} runtime wheel found; pass --lib-dir", file=sys.stderr)
        return 1
    out_dir = args.out or HERE / f"cuda{args.major}"
    out_dir.mkdir(parents=True, exist_ok=True)
    separate = {}
    if args.cudnn_lib_dir:
        separate["libcudnn"] = args.cudnn_lib_dir
    if args.nccl_lib_dir:
        separate["libnccl"] = args.nccl_lib_dir
    for so, text in generate(args.major, args.lib_dir, args.include_dir, separate).items():
        (out_dir / f"{so}.syms").write_text(text)
        print(out_dir / f"{so}.syms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
