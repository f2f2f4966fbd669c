"""Build the simulated GPU's fake CUDA libraries with a plain C compiler.

    from simgpu.build import build_sim_libs        # or load this file by path
    libs = build_sim_libs("out")                        # {soname: Path}, in preload order
    every = build_sim_tree("gpumem/sim/_lib")           # {12: {...}, 13: {...}}: _lib/cuda12/, _lib/cuda13/

    python simgpu/build.py OUT_DIR [--cflags=...] [--force] [--cuda-major 13]
    python simgpu/build.py OUT_DIR --all-majors         (OUT_DIR/cuda12/, OUT_DIR/cuda13/)

Libraries (simgpu/README.md explains each):

    libcuda.so.1       the fake driver (simgpu/driver), also used alone by
                       gpumem's CUDA-backend tests
    libnvidia-ml.so.1  fake NVML (simgpu/nvml), describing the fake devices
    libcudart.so.N     the fake runtime (simgpu/cudart), linked against the
                       fake driver with RUNPATH $ORIGIN
    libcublasLt.so.N   fake cuBLASLt (simgpu/cublas)
    libcublas.so.N     fake cuBLAS (simgpu/cublas)
    libcudnn.so.9      fake cuDNN 9 (simgpu/cudnn), its list in cudaN/ too
    libnccl.so.2       fake NCCL 2 (simgpu/nccl), its list in cudaN/ too

N is the CUDA major version; everything version-specific comes from
simgpu/cudaN/ (export lists <soname>.syms and sim_abi.h). build_sim_tree
builds every supported major version (SUPPORTED_MAJORS: PyTorch's CUDA 12
builds, torch 2.6 to 2.10, and its CUDA 13 ones) into one folder each; the
driver and NVML do not depend on the CUDA version, so they are compiled
once and copied. For every
exported name the build generates a weak stub (OUT_DIR/gen/<soname>.stubs.c)
and the version script (OUT_DIR/gen/<soname>.map: one version node named
like the SONAME, as NVIDIA's libraries have, so glibc finds the versions
PyTorch's binaries ask for and prints no warnings).

No CUDA headers are needed: the fakes compile against the project's own
declarations. Each library is rebuilt only when something that went into it
changed (OUT_DIR/<soname>.buildinfo holds a digest); writes are atomic, so
concurrent builds into one directory are safe.

Environment: CC picks the compiler (default cc).
"""

from __future__ import annotations

import argparse
import functools
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
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

SIM_DIR = Path(__file__).resolve().parent
DEFAULT_CUDA_MAJOR = 13
SUPPORTED_MAJORS = (12, 13)
BASE_FLAGS = ("-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-fvisibility=hidden",
              "-std=gnu11")
AUTO = "auto"

# The fake driver (kept compatible with tests/sim/fakecuda/build.py).
DRIVER_SOURCES = ("fakecuda.c", "fakecuda_config.c", "fakecuda_ctx.c", "fakecuda_vec.c",
                  "fakecuda_report.c", "fakecuda_mem.c", "fakecuda_vmm.c", "fakecuda_sync.c",
                  "fakecuda_copy.c", "fakecuda_stubs.c", "fakecuda_gpu.c", "fakecuda_timeline.c",
                  "fakecuda_va.c", "fakecuda_event.c", "fakecuda_image.c", "fakecuda_ptx.c",
                  "fakecuda_module.c", "fakecuda_func.c", "fakecuda_limit.c", "fakecuda_launch.c",
                  "fakecuda_tensormap.c", "fakecuda_capture.c",
                  "fakecuda_capture_rules.c", "fakecuda_graph.c", "fakecuda_nohost.c",
                  "fakecuda_spin.c", "fakecuda_handout.c", "fakecuda_fatal.c")
DRIVER_HEADERS = ("fakecuda_internal.h", "fakecuda_image.h", "cuda_min.h")
DRIVER_MAP = "libcuda.map"
DRIVER_SONAME = "libcuda.so.1"
DRIVER_LINK_NAME = "libcuda.so"

# The fakes built on the driver, in LD_PRELOAD order. soname: "{major}" is the
# CUDA major version. syms: the export list, in the version directory
# (version=True, one version node named like the SONAME, as NVIDIA's CUDA
# libraries have) or at a fixed path (NVML's ABI follows the driver, not
# the CUDA version; NVML has no version nodes). driver: links the fake
# libcuda.so.1 (the cuBLAS fakes do not need it).
LIBS = {
    "libnvidia-ml": dict(soname="libnvidia-ml.so.1", src="nvml", sources=("nvml.c",),
                         exports=("gpumem_sim_nvml_report_json",), unsupported=3,
                         syms="nvml/libnvidia-ml.so.1.syms", version=False, driver=True),
    "libcudart": dict(soname="libcudart.so.{major}", src="cudart",
                      sources=("rt_device.c", "rt_version.c", "rt_memory.c", "rt_host.c",
                               "rt_stream.c", "rt_launch.c", "rt_symbol.c", "rt_report.c",
                               "rt_graph.c"),
                      exports=("gpumem_sim_cudart_report_json",), unsupported=801, version=True,
                      driver=True),
    "libcublasLt": dict(soname="libcublasLt.so.{major}", src="cublas",
                        sources=("blaslt.c", "blas_common.c"),
                        exports=("gpumem_sim_cublaslt_report_json",), unsupported=15, version=True,
                        driver=False),
    "libcublas": dict(soname="libcublas.so.{major}", src="cublas",
                      sources=("blas.c", "blas_common.c"),
                      exports=("gpumem_sim_cublas_report_json", "gpumem_sim_cublas_is_handle"),
                      unsupported=15, version=True, driver=False),
    "libcudnn": dict(soname="libcudnn.so.9", src="cudnn",
                     sources=("cudnn_handle.c", "cudnn_legacy_desc.c", "cudnn_legacy_conv.c",
                              "cudnn_conv_shape.c", "cudnn_bn.c", "cudnn_backend_desc.c",
                              "cudnn_backend_finalize.c", "cudnn_backend_graph.c",
                              "cudnn_backend_engine.c"),
                     exports=("gpumem_sim_cudnn_report_json",), unsupported=3000, version=True,
                     driver=False),
    # NVIDIA's libnccl.so.2 has no version node (PyTorch's references are
    # unversioned); its list is in cudaN/ all the same, since the wheel is
    # built for one CUDA major version. Stubs answer ncclInvalidUsage (5).
    "libnccl": dict(soname="libnccl.so.2", src="nccl",
                    sources=("nccl_comm.c", "nccl_mem.c", "nccl_coll.c"),
                    exports=("gpumem_sim_nccl_report_json",), unsupported=5, version=False,
                    driver=True),
}
COMMON_SOURCES = ("common/simcommon.c", "common/simjson.c")
# The driver shares only the JSON builder with them.
DRIVER_COMMON = ("common/simjson.c", "common/simjson.h")

__all__ = ["build_sim_libs", "build_sim_tree", "build_libcuda", "find_cuda_include", "BuildError", "DRIVER_SONAME", "DRIVER_LINK_NAME",
           "sim_sonames"]


class BuildError(RuntimeError):
    """The C compiler failed; the message holds its command line and output."""


# --------------------------------------------------------------------------
# helpers

def _compiler() -> List[str]:
    return shlex.split(os.environ.get("CC", "cc"))


@functools.lru_cache(maxsize=None)
def _compiler_version_cached(exe: str) -> str:
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return ""


def _compiler_version(cc: List[str]) -> str:
    return _compiler_version_cached(cc[0])


def _digest(cmd: Sequence[str], inputs: Iterable[Path], extra: Iterable[str] = ()) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(list(cmd)).encode())
    for p in inputs:
        h.update(str(p.name).encode())
        h.update(p.read_bytes())
    for e in extra:
        h.update(e.encode())
    h.update(_compiler_version(list(cmd[:1])).encode())
    return h.hexdigest()


def _link(target: Path, cmd: List[str], inputs: List[Path], force: bool,
          extra_digest: Iterable[str] = (), stamp_dir: Optional[Path] = None) -> Path:
    """Run cmd (which lacks -o) into target unless its digest is unchanged.

    The digest goes to <stamp_dir or target's dir>/<name>.buildinfo."""
    stamp = (stamp_dir or target.parent) / (target.name + ".buildinfo")
    digest = _digest(cmd, inputs, extra_digest)
    if not force and target.is_file() and stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("digest") == digest:
                return target
        except (OSError, ValueError):
            pass
    fd, tmp = tempfile.mkstemp(prefix="." + target.name + ".", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run(cmd + ["-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"building {target.name} failed:\n  "
                             + " ".join(shlex.quote(c) for c in cmd) + "\n" + proc.stdout + proc.stderr)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    info = {"digest": digest, "command": cmd, "warnings": proc.stderr}
    stamp_tmp = stamp.with_name(stamp.name + f".{os.getpid()}")
    stamp_tmp.write_text(json.dumps(info, indent=1))
    os.replace(stamp_tmp, stamp)
    return target


def _write_if_changed(path: Path, text: str) -> Path:
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------
# the fake driver

def _wheel_include_dirs() -> List[Path]:
    out = []
    for entry in sys.path:
        out += [Path(p) for p in sorted(glob.glob(os.path.join(entry, "nvidia", "cu*", "include")),
                                        reverse=True)]
    return out


def _has_vmm_api(header: Path) -> bool:
    try:
        return "cuMemAddressReserve" in header.read_text(errors="replace")
    except OSError:
        return False


def find_cuda_include() -> Optional[Path]:
    """A directory with NVIDIA's cuda.h (CUDA >= 10.2), or None.

    $GPUMEM_FAKECUDA_CUDA_INCLUDE (``none`` forces None), $CUDA_HOME etc.,
    /usr/local/cuda*, the nvidia pip wheels' include dirs, /usr/include.
    """
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
    candidates += _wheel_include_dirs()
    candidates.append(Path("/usr/include"))  # distribution packages (not linux/cuda.h)
    for inc in candidates:
        if (inc / "cuda.h").is_file() and _has_vmm_api(inc / "cuda.h"):
            return inc
    return None


def build_libcuda(out_dir: Union[str, os.PathLike], extra_flags: Iterable[str] = (), *,
                  cuda_include: Union[str, os.PathLike, None] = AUTO, force: bool = False,
                  src_dir: Union[str, os.PathLike, None] = None,
                  work_dir: Union[str, os.PathLike, None] = None) -> Path:
    """Compile out_dir/libcuda.so.1 (if out of date) and return its path.

    cuda_include: "auto" searches for NVIDIA's cuda.h (the compiler then
    checks every definition against the real prototypes), None uses the
    project's cuda_min.h, a path names cuda.h's directory. src_dir: the
    driver sources (default simgpu/driver; tests build copies). work_dir:
    where the .buildinfo stamp goes (default out_dir).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(src_dir) if src_dir is not None else SIM_DIR / "driver"
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
    cmd = cc + [f for f in BASE_FLAGS if f != "-O2"] + ["-O1"] + list(extra_flags)
    if inc is not None:
        cmd += ["-DFAKECUDA_USE_CUDA_H", "-I", str(inc)]
    cmd += ["-I", str(src), "-I", str(SIM_DIR / "common"), "-pthread",
            f"-Wl,-soname,{DRIVER_SONAME}", f"-Wl,--version-script={src / DRIVER_MAP}",
            "-Wl,--no-undefined"]
    cmd += [str(src / s) for s in DRIVER_SOURCES] + [str(SIM_DIR / DRIVER_COMMON[0])]
    inputs = [src / n for n in DRIVER_SOURCES + DRIVER_HEADERS + (DRIVER_MAP,)]
    inputs += [SIM_DIR / n for n in DRIVER_COMMON]
    if inc is not None:
        inputs.append(inc / "cuda.h")
    work = Path(work_dir) if work_dir is not None else out
    work.mkdir(parents=True, exist_ok=True)
    target = _link(out / DRIVER_SONAME, cmd, inputs, force, stamp_dir=work)
    # Record which header was used (tests read it).
    stamp = work / (target.name + ".buildinfo")
    info = json.loads(stamp.read_text())
    if info.get("cuda_include", "?") != (str(inc) if inc else None):
        info["cuda_include"] = str(inc) if inc else None
        _write_if_changed(stamp, json.dumps(info, indent=1))   # atomic: readers in other processes
    return target


# --------------------------------------------------------------------------
# the runtime and cuBLAS fakes

def version_dir(cuda_major: int) -> Path:
    d = SIM_DIR / f"cuda{cuda_major}"
    if not d.is_dir():
        raise BuildError(f"no CUDA {cuda_major} support: {d} does not exist")
    return d


def read_syms(path: Path) -> List[Tuple[str, str]]:
    """[(name, policy)] of a .syms file (policy '' or 'noop')."""
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        policy = parts[1] if len(parts) > 1 else ""
        if policy not in ("", "noop"):
            raise BuildError(f"{path}: unknown policy {policy!r} for {parts[0]}")
        rows.append((parts[0], policy))
    names = [n for n, _ in rows]
    if names != sorted(names) or len(set(names)) != len(names):
        raise BuildError(f"{path}: names must be sorted and unique")
    return rows


def sim_sonames(cuda_major: int = DEFAULT_CUDA_MAJOR) -> List[str]:
    """Every library build_sim_libs builds, in LD_PRELOAD order."""
    return [DRIVER_SONAME] + [spec["soname"].format(major=cuda_major) for spec in LIBS.values()]


def syms_path(base: str, cuda_major: int = DEFAULT_CUDA_MAJOR) -> Path:
    """The export list of a fake library."""
    spec = LIBS[base]
    soname = spec["soname"].format(major=cuda_major)
    return SIM_DIR / spec["syms"] if "syms" in spec else version_dir(cuda_major) / f"{soname}.syms"


def _stubs_source(soname: str, rows: List[Tuple[str, str]], unsupported_code: int) -> str:
    lines = [
        f"/* Generated by simgpu/build.py from simgpu/cudaN/{soname}.syms: do not edit.",
        " * One weak stub per exported name; the library's own sources override",
        " * the names they implement. */",
        '#include "simcommon.h"',
        "",
        f"static const char *const names[{len(rows)}] = {{",
    ]
    lines += [f'    "{n}",' for n, _ in rows]
    lines += ["};", f"static const unsigned char policy[{len(rows)}] = {{"]
    lines += ["    " + ", ".join("1" if p == "noop" else "0" for _, p in rows[i:i + 32]) + ","
              for i in range(0, len(rows), 32)]
    lines += [
        "};",
        f"static uint64_t calls[{len(rows)}];",
        f"static unsigned char stub_hit[{len(rows)}];",
        f'const sim_table_t sim_table = {{"{soname}", {len(rows)}, names, policy, calls, stub_hit, '
        f"{unsupported_code}}};",
        "",
    ]
    for i, (n, p) in enumerate(rows):
        if p == "noop":
            lines.append(f"SIM_WEAK int {n}(void *handle) {{ return sim_stub_noop({i}, handle); }}")
        else:
            lines.append(f"SIM_WEAK int {n}(void) {{ return sim_stub({i}); }}")
    return "\n".join(lines) + "\n"


def _version_script(soname: str, rows: List[Tuple[str, str]], extra: Sequence[str],
                    node: bool) -> str:
    body = "".join(f"    {n};\n" for n, _ in rows) + "".join(f"    {n};\n" for n in extra)
    where = "in its version node" if node else "without a version node"
    return (f"/* Generated by simgpu/build.py: every name of {soname}, {where}. */\n"
            f"{soname if node else ''} {{\n  global:\n{body}  local:\n    *;\n}};\n")


def _build_fake(out: Path, base: str, cuda_major: int, extra_flags: Sequence[str], force: bool,
                libcuda: Path, work: Path) -> Path:
    spec = LIBS[base]
    soname = spec["soname"].format(major=cuda_major)
    vdir = version_dir(cuda_major)
    syms = syms_path(base, cuda_major)
    if not syms.is_file():
        raise BuildError(f"{syms} is missing (run simgpu/gen_exports.py)")
    rows = read_syms(syms)
    gen = work / "gen"
    gen.mkdir(parents=True, exist_ok=True)
    stubs = _write_if_changed(gen / f"{soname}.stubs.c", _stubs_source(soname, rows, spec["unsupported"]))
    vmap = _write_if_changed(gen / f"{soname}.map",
                             _version_script(soname, rows, spec["exports"], spec["version"]))
    src = SIM_DIR / spec["src"]
    cc = _compiler()
    cmd = cc + list(BASE_FLAGS) + list(extra_flags)
    cmd += ["-I", str(vdir), "-I", str(SIM_DIR / "common"), "-I", str(src),
            "-I", str(SIM_DIR / "driver"), "-pthread", f"-Wl,-soname,{soname}",
            f"-Wl,--version-script={vmap}", "-Wl,--no-undefined"]
    cmd += [str(src / s) for s in spec["sources"]] + [str(SIM_DIR / s) for s in COMMON_SOURCES]
    cmd += [str(stubs)]
    if spec["driver"]:
        # The runtime and NVML run on the fake driver only; RUNPATH finds the
        # one next to them when they are loaded without the driver preloaded.
        cmd += [str(libcuda), "-Wl,-rpath,$ORIGIN"]
    cmd += ["-ldl"]
    inputs = sorted(set(list(src.glob("*.c")) + list(src.glob("*.h")) + list(vdir.glob("*.h"))
                        + list((SIM_DIR / "common").glob("*")) + [syms]
                        + [SIM_DIR / "driver" / "cuda_min.h"]))
    return _link(out / soname, cmd, inputs, force, extra_digest=[base], stamp_dir=work)


def _copy_if_changed(src: Path, dst: Path) -> Path:
    if not dst.is_file() or dst.read_bytes() != src.read_bytes():
        fd, tmp = tempfile.mkstemp(prefix="." + dst.name + ".", dir=dst.parent)
        os.close(fd)
        try:
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return dst


def _driver_link_name(out: Path) -> None:
    """out/libcuda.so -> libcuda.so.1, the link-time name NVIDIA's driver
    installs beside it: Triton before 3.6 (torch 2.8, 2.9) links its
    launcher with -lcuda from the folder that holds libcuda.so.1."""
    link = out / DRIVER_LINK_NAME
    if not link.is_symlink() and not link.exists():
        try:
            link.symlink_to(DRIVER_SONAME)
        except FileExistsError:   # a concurrent build made it
            pass


# The libraries whose build does not depend on the CUDA major version.
MAJOR_INDEPENDENT = (DRIVER_SONAME, LIBS["libnvidia-ml"]["soname"])


def build_sim_libs(out_dir: Union[str, os.PathLike], extra_flags: Iterable[str] = (), *,
                   cuda_major: int = DEFAULT_CUDA_MAJOR, force: bool = False,
                   work_dir: Union[str, os.PathLike, None] = None,
                   shared: Optional[Dict[str, Path]] = None) -> Dict[str, Path]:
    """Build every fake library into out_dir; {soname: path} in LD_PRELOAD order.

    out_dir receives the seven .so files of one CUDA major version and
    the driver's link-time name (libcuda.so, a symlink) and nothing else, while the generated stubs, version scripts and .buildinfo
    stamps (which make rebuilds incremental) go to work_dir (default:
    out_dir itself). The fake driver is compiled against the project's own
    declarations, so the result does not depend on which CUDA headers the
    build machine has. shared: {soname: path} of the MAJOR_INDEPENDENT
    libraries already built with the same flags (for another major
    version): copied instead of compiled again.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir is not None else out
    work.mkdir(parents=True, exist_ok=True)
    cc = _compiler()
    if shutil.which(cc[0]) is None:
        raise BuildError(f"C compiler {cc[0]!r} not found (set CC)")
    flags = list(extra_flags)
    shared = shared or {}
    if DRIVER_SONAME in shared:
        driver = _copy_if_changed(shared[DRIVER_SONAME], out / DRIVER_SONAME)
    else:
        driver = build_libcuda(out, flags, cuda_include=None, force=force, work_dir=work)
    _driver_link_name(out)
    libs = {DRIVER_SONAME: driver}
    for base, spec in LIBS.items():
        if spec["soname"] in shared:
            path = _copy_if_changed(shared[spec["soname"]], out / spec["soname"])
        else:
            path = _build_fake(out, base, cuda_major, flags, force, driver, work)
        libs[path.name] = path
    return libs


def build_sim_tree(out_root: Union[str, os.PathLike], extra_flags: Iterable[str] = (), *,
                   majors: Sequence[int] = SUPPORTED_MAJORS, force: bool = False,
                   work_dir: Union[str, os.PathLike, None] = None) -> Dict[int, Dict[str, Path]]:
    """Every supported CUDA major version's libraries, each in its own
    folder out_root/cudaNN/ (work files in work_dir/cudaNN/); {major:
    {soname: path}}. This is what setup.py calls, with out_root = the
    package's gpumem/sim/_lib (in build_lib for a wheel, in the source tree
    for an editable install); gpumem.sim preloads the folder of the CUDA
    major version the command's torch was built for."""
    root = Path(out_root)
    work = Path(work_dir) if work_dir is not None else root
    out: Dict[int, Dict[str, Path]] = {}
    shared: Dict[str, Path] = {}
    for major in majors:
        libs = build_sim_libs(root / f"cuda{major}", extra_flags, cuda_major=major, force=force,
                              work_dir=work / f"cuda{major}", shared=shared)
        shared = {n: libs[n] for n in MAJOR_INDEPENDENT}
        out[major] = libs
    return out


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description="Build the simulated GPU's fake CUDA libraries.")
    ap.add_argument("out_dir", help="where the libraries go")
    ap.add_argument("--cflags", default="", help="extra compiler flags, e.g. --cflags='-O0 -g'")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--cuda-major", type=int, default=DEFAULT_CUDA_MAJOR)
    ap.add_argument("--all-majors", action="store_true",
                    help="every supported CUDA major version, into OUT_DIR/cudaNN/")
    ap.add_argument("--work-dir", default=None, help="intermediate files (default OUT_DIR)")
    args = ap.parse_args(argv)
    try:
        if args.all_majors:
            tree = build_sim_tree(args.out_dir, shlex.split(args.cflags), force=args.force,
                                  work_dir=args.work_dir)
            paths = [p for libs in tree.values() for p in libs.values()]
        else:
            paths = list(build_sim_libs(args.out_dir, shlex.split(args.cflags),
                                        cuda_major=args.cuda_major, force=args.force,
                                        work_dir=args.work_dir).values())
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
