"""Building the simulator's fake libraries (simgpu/build.py) and checking
them against NVIDIA's: exported names and version nodes, the project's own
declarations against the real headers, the export lists against the
installed wheels. Needs only a C compiler; the checks against NVIDIA's files
skip, with the reason, where those files are not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sim_helpers import CC, ROOT, needs_cc, sim_lib_dir

pytestmark = [needs_cc, pytest.mark.slow]  # slow: left out of the fast tier (see pyproject.toml)

SIM = ROOT / "simgpu"
MAJOR = 13
MAJORS = (12, 13)  # every simgpu/cudaNN/; the checks against NVIDIA's files
                   # need that major version's wheels (a CUDA 12 torch's venv)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


simbuild = _load("gpumem_csrc_sim_build", SIM / "build.py")
genexp = _load("gpumem_csrc_sim_gen_exports", SIM / "gen_exports.py")

EXTRA_EXPORTS = {
    "libnvidia-ml": {"gpumem_sim_nvml_report_json"},
    "libcudart": {"gpumem_sim_cudart_report_json"},
    "libcublasLt": {"gpumem_sim_cublaslt_report_json"},
    "libcublas": {"gpumem_sim_cublas_report_json", "gpumem_sim_cublas_is_handle"},
    "libcudnn": {"gpumem_sim_cudnn_report_json"},
    "libnccl": {"gpumem_sim_nccl_report_json"},
}


def _nm(path: Path, *flags: str) -> list:
    if shutil.which("nm") is None:
        pytest.skip("nm not installed")
    out = subprocess.run(["nm", *flags, str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines() if line.strip()]


def _wheel_dir(major: int = MAJOR, base: str = "libcudart"):
    return genexp.nvidia_dir(major, base)


def test_build_sim_libs_builds_all_and_caches(tmp_path):
    libs = simbuild.build_sim_libs(tmp_path / "sim")
    assert list(libs) == ["libcuda.so.1", "libnvidia-ml.so.1", "libcudart.so.13", "libcublasLt.so.13",
                          "libcublas.so.13", "libcudnn.so.9", "libnccl.so.2"]
    assert list(libs) == simbuild.sim_sonames(MAJOR)
    from gpumem import sim
    assert sim.sonames(MAJOR) == list(libs)  # the launcher's preload order
    for path in libs.values():
        info = json.loads(path.with_name(path.name + ".buildinfo").read_text())
        assert info["warnings"].strip() == "", (path.name, info["warnings"])
    mtimes = {n: p.stat().st_mtime_ns for n, p in libs.items()}
    again = simbuild.build_sim_libs(tmp_path / "sim")
    assert {n: p.stat().st_mtime_ns for n, p in again.items()} == mtimes
    # What setup.py does: the package directory gets the libraries only.
    pkg = simbuild.build_sim_libs(tmp_path / "pkg" / "_sim", work_dir=tmp_path / "temp")
    assert sorted(p.name for p in (tmp_path / "pkg" / "_sim").iterdir()) == sorted(
        list(pkg) + [simbuild.DRIVER_LINK_NAME])
    assert os.readlink(tmp_path / "pkg" / "_sim" / "libcuda.so") == "libcuda.so.1"  # -lcuda finds it
    assert (tmp_path / "temp" / "gen" / "libcudart.so.13.stubs.c").is_file()
    # extra flags rebuild, and the CLI works
    proc = subprocess.run([sys.executable, str(SIM / "build.py"), str(tmp_path / "cli"),
                           "--cflags=-O0", "--work-dir", str(tmp_path / "cli-temp")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [Path(p).name for p in proc.stdout.split()] == list(libs)


def test_build_sim_tree_builds_every_major_version_sharing_the_driver(tmp_path):
    tree = simbuild.build_sim_tree(tmp_path / "_lib", work_dir=tmp_path / "temp")
    assert sorted(tree) == list(MAJORS) == list(simbuild.SUPPORTED_MAJORS)
    from gpumem import sim
    assert tuple(sorted(tree)) == sim.CUDA_MAJORS
    for major, libs in tree.items():
        assert list(libs) == sim.sonames(major) == simbuild.sim_sonames(major)
        assert sorted(p.name for p in (tmp_path / "_lib" / f"cuda{major}").iterdir()) == sorted(
            list(libs) + [simbuild.DRIVER_LINK_NAME])
    # the driver and NVML are compiled once (one stamp) and copied
    for name in simbuild.MAJOR_INDEPENDENT:
        assert tree[12][name].read_bytes() == tree[13][name].read_bytes()
        assert (tmp_path / "temp" / "cuda12" / f"{name}.buildinfo").is_file()
        assert not (tmp_path / "temp" / "cuda13" / f"{name}.buildinfo").exists()
    mtimes = {p: p.stat().st_mtime_ns for libs in tree.values() for p in libs.values()}
    again = simbuild.build_sim_tree(tmp_path / "_lib", work_dir=tmp_path / "temp")
    assert {p: p.stat().st_mtime_ns for libs in again.values() for p in libs.values()} == mtimes


@pytest.mark.parametrize("major", MAJORS)
@pytest.mark.parametrize("base", ["libcudart", "libcublasLt", "libcublas", "libnvidia-ml",
                                  "libcudnn", "libnccl"])
def test_exports_every_name_of_the_real_library_in_its_version_node(base, major):
    soname = simbuild.LIBS[base]["soname"].format(major=major)
    lib = sim_lib_dir(major) / soname
    rows = simbuild.read_syms(simbuild.syms_path(base, major))
    versioned = simbuild.LIBS[base]["version"]
    names = {n for n, _ in rows}
    defined = {}
    for parts in _nm(lib, "-D", "--defined-only"):
        kind, sym = parts[1], parts[2]
        name, _, version = sym.partition("@@")
        if kind == "A":
            assert versioned and name == soname  # the version node itself
            continue
        assert version == (soname if versioned else ""), sym
        defined[name] = kind
    assert set(defined) == names | EXTRA_EXPORTS[base]
    # implemented names are strong (T), the rest are the generated weak stubs (W)
    implemented = {n for n, k in defined.items() if k == "T"}
    assert implemented >= EXTRA_EXPORTS[base]
    assert {k for n, k in defined.items() if n not in implemented} <= {"W"}
    if base == "libnvidia-ml":
        assert implemented == set(defined)  # NVML: everything listed is implemented
    # Every function the sources define with an API name is exported: a
    # misspelt name would silently stay a stub. cuDNN and NCCL functions of
    # a later release than the major version's wheel (in another major
    # version's list) are compiled but hidden.
    prefix = {"libcudart": ("cuda", "__cuda"), "libcublasLt": ("cublasLt",),
              "libcublas": ("cublas",), "libnvidia-ml": ("nvml",),
              "libcudnn": ("cudnn",), "libnccl": ("nccl", "pnccl")}[base]
    hidden = {p[-1] for p in _nm(lib) if len(p) == 3 and p[1] in "tT" and p[2].startswith(prefix)
              and not p[2].endswith("_impl") and "." not in p[2]}
    elsewhere = set()
    if base in ("libcudnn", "libnccl"):
        for other in MAJORS:
            elsewhere |= {n for n, _ in simbuild.read_syms(simbuild.syms_path(base, other))}
    assert hidden - set(defined) - elsewhere == set()
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert f"Library soname: [{soname}]" in dyn
    on_driver = "Shared library: [libcuda.so.1]" in dyn and "Library runpath: [$ORIGIN]" in dyn
    assert on_driver == simbuild.LIBS[base]["driver"]


@pytest.mark.parametrize("major", MAJORS)
def test_runtime_implements_what_pytorch_needs_most(major):
    lib = sim_lib_dir(major) / f"libcudart.so.{major}"
    strong = {p[2].split("@")[0] for p in _nm(lib, "-D", "--defined-only") if p[1] == "T"}
    must = {"__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd", "__cudaUnregisterFatBinary",
            "__cudaRegisterFunction", "__cudaRegisterVar", "__cudaPushCallConfiguration",
            "__cudaPopCallConfiguration", "__cudaGetKernel", "__cudaLaunchKernel", "__cudaInitModule",
            "cudaLaunchKernel", "cudaMalloc", "cudaFree", "cudaMemGetInfo", "cudaMemcpyAsync",
            "cudaMemsetAsync", "cudaStreamCreateWithPriority", "cudaStreamIsCapturing",
            "cudaStreamGetCaptureInfo", "cudaEventQuery", "cudaEventRecord", "cudaGetLastError",
            "cudaGetDriverEntryPointByVersion", "cudaHostAlloc",
            "cudaPointerGetAttributes", "cudaThreadExchangeStreamCaptureMode"}
    # what CUDA 12's header maps cudaGetDeviceProperties and
    # cudaStreamGetCaptureInfo onto (torch 2.6 to 2.10 import these)
    must |= ({"cudaGetDeviceProperties"} if major >= 13 else
             {"cudaGetDeviceProperties_v2", "cudaStreamGetCaptureInfo_v2",
              "cudaStreamGetCaptureInfo_v2_ptsz", "cudaStreamGetCaptureInfo_v3"})
    assert must <= strong, must - strong
    if major == 12:  # CUDA 11's layout: a stub, never this layout
        assert "cudaGetDeviceProperties" not in strong


@pytest.mark.parametrize("major", MAJORS)
def test_noop_policy_only_for_handle_taking_cublas_routines(major):
    rows = simbuild.read_syms(SIM / f"cuda{major}" / f"libcublas.so.{major}.syms")
    noop = {n for n, p in rows if p == "noop"}
    assert {"cublasSgemm_v2", "cublasGemmEx", "cublasGemmStridedBatchedEx"} <= noop
    assert not noop & {"cublasCreate_v2", "cublasXtCreate", "cublasInit", "cublasGetStatusString"}
    for base in ("libcudart", "libcublasLt", "libnvidia-ml", "libcudnn"):
        assert {p for _, p in simbuild.read_syms(simbuild.syms_path(base, major))} == {""}


@pytest.mark.parametrize("major", MAJORS)
def test_export_lists_match_the_installed_wheels(major, tmp_path):
    if _wheel_dir(major) is None:
        pytest.skip(f"no CUDA {major} runtime wheel installed")
    for soname, text in genexp.generate(major, None, None).items():
        committed = (SIM / f"cuda{major}" / f"{soname}.syms").read_text()
        head_now, _ = genexp.parse_syms(text)
        head_then, _ = genexp.parse_syms(committed)
        if head_now["package"] != head_then["package"]:
            pytest.skip(f"{soname}: installed {head_now['package']}, list made from {head_then['package']}")
        assert text == committed, f"{soname}: run python simgpu/gen_exports.py"


# --------------------------------------------------------------------------
# the project's declarations against NVIDIA's headers

def _header_flags(probe: str, tmp_path: Path, major: int = MAJOR):
    """Compiler flags under which probe (C source) compiles against CUDA
    major's headers, or skip.

    NVIDIA's headers are spread over several places: the toolkit (if any;
    it has the runtime and <nv/target>, not cuBLAS), the nvidia wheels (the
    runtime and cuBLAS, not crt/ or <nv/target>; CUDA 12's in one folder
    per wheel), triton's copy (crt/). For CUDA 12 the wheels' headers come
    first and the others (whatever their version) only fill in crt/ and
    <nv/target>.
    """
    dirs = []
    inc = simbuild.find_cuda_include()
    if inc is not None:
        dirs.append(inc)
    wheels = [d / "include" for d in (_wheel_dir(major), _wheel_dir(major, "libcublas")) if d]
    if major < 13:
        if len(wheels) < 2:
            pytest.skip(f"NVIDIA's CUDA {major} runtime and cuBLAS wheels are not installed")
        dirs = []
    dirs += [d for d in wheels if d not in dirs]
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        dirs.append(Path(spec.origin).parent / "backends" / "nvidia" / "include")
    if inc is not None and major < 13:
        dirs.append(inc)
    dirs = [d for d in dirs if d.is_dir()]
    src = tmp_path / "probe.c"
    src.write_text(probe)
    firsts = range(len(dirs)) if major >= 13 else [0]
    for first in firsts:
        order = [dirs[first]] + dirs[:first] + dirs[first + 1:]
        if major >= 13:
            flags = ["-I", str(order[0])] + [x for d in order[1:] for x in ("-idirafter", str(d))]
        else:
            flags = [x for d in wheels for x in ("-I", str(d))]
            flags += [x for d in order if d not in wheels for x in ("-idirafter", str(d))]
        if subprocess.run(CC + ["-c", *flags, str(src), "-o", str(tmp_path / "probe.o")],
                          capture_output=True).returncode == 0:
            return flags
    pytest.skip("NVIDIA's cuda_runtime_api.h and cublasLt.h are not installed together")


def _for_major(text: str, major: int) -> str:
    """text with its `#if SIM_CUDA_MAJOR >= N` ... `#else` ... `#endif`
    blocks resolved for major (other preprocessor lines kept)."""
    out, stack = [], []  # per open #if: True/False (ours, taken or not), None (another)
    for line in text.splitlines():
        m = re.match(r"\s*#\s*if\s+SIM_CUDA_MAJOR\s*>=\s*(\d+)", line)
        if m:
            stack.append(major >= int(m.group(1)))
            continue
        if re.match(r"\s*#\s*if", line):
            stack.append(None)
        elif re.match(r"\s*#\s*else", line) and stack and stack[-1] is not None:
            stack[-1] = not stack[-1]
            continue
        elif re.match(r"\s*#\s*endif", line) and stack:
            if stack.pop() is not None:
                continue
        if all(x is not False for x in stack):
            out.append(line)
    return "\n".join(out) + "\n"


def test_for_major_resolves_version_blocks():
    text = "a\n#if SIM_CUDA_MAJOR >= 13\nb\n#ifdef X\nc\n#endif\n#else /* 12 */\nd\n#endif\ne\n"
    assert _for_major(text, 13) == "a\nb\n#ifdef X\nc\n#endif\ne\n"
    assert _for_major(text, 12) == "a\nd\ne\n"


# cuBLAS 12's cublas_api.h wants CUBLASAPI defined (cublas_v2.h does so);
# cuBLAS 13's defines it itself.
REAL_HEADERS = ("#define CUBLASAPI\n"
                "#include <cuda_runtime_api.h>\n#include <cublas_api.h>\n#include <cublasLt.h>\n")
OWN_HEADERS = '#include "rt_api.h"\n#include "blas_api.h"\n'
def _own_flags(major: int) -> list:
    return ["-I", str(SIM / f"cuda{major}"), "-I", str(SIM / "cudart"), "-I", str(SIM / "cublas"),
            "-I", str(SIM / "driver")]


def _struct_fields(text: str, struct: str) -> list:
    body = re.search(r"struct %s \{(.*?)\n\};" % struct, text, re.S).group(1)
    return re.findall(r"(\w+)(?:\[\w+\])*;", body)


@pytest.mark.parametrize("major", MAJORS)
def test_layouts_and_enumerators_match_nvidia_headers(major, tmp_path):
    flags = _header_flags(REAL_HEADERS + "int main(void){return 0;}\n", tmp_path, major)
    # versions and error codes follow the release the lists were made from
    made_from = genexp.parse_syms((SIM / f"cuda{major}" / f"libcudart.so.{major}.syms")
                                  .read_text())[0]["package"]
    dist = genexp.dist_name("libcudart", major)
    installed = f"{dist} {genexp.package_version(dist)}"
    if major < 13 and installed != made_from:
        pytest.skip(f"the headers are {installed}'s; sim_abi.h follows {made_from}'s")
    abi = ((SIM / f"cuda{major}" / "sim_abi.h").read_text()
           + (SIM / "cudart" / "rt_api.h").read_text())
    api = _for_major((SIM / "cudart" / "rt_api.h").read_text()
                     + (SIM / "cublas" / "blas_api.h").read_text(), major)
    errors = re.findall(r"X\((cuda\w+), ", (SIM / "cudart" / "rt_errors.h").read_text())
    enums = [n for n in re.findall(r"^\s+((?:cuda|CUBLAS|CUDA_R|MAJOR|MINOR|PATCH)\w*)\s*(?:=|,|$)",
                                   api, re.M) if not n.startswith("cudaHost")]
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#ifdef REAL", REAL_HEADERS, "#else",
             OWN_HEADERS,
             "#define CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES SIM_CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES",
             "#define CUDART_VERSION SIM_CUDART_VERSION",
             "#define CUBLAS_VERSION SIM_CUBLAS_VERSION", "#endif",
             '#define O(t, f) printf("offsetof %s.%s %zu\\n", #t, #f, offsetof(t, f));',
             '#define S(t) printf("sizeof %s %zu\\n", #t, sizeof(t));',
             '#define V(x) printf("%s %lld\\n", #x, (long long)(x));', "int main(void) {"]
    for struct in ("cudaDeviceProp", "cudaPointerAttributes", "cudaFuncAttributes"):
        lines.append(f"S(struct {struct})")
        lines += [f"O(struct {struct}, {f})" for f in _struct_fields(abi, struct)]
    for f in ("gridDim", "blockDim", "dynamicSmemBytes", "stream", "attrs", "numAttrs"):
        lines.append(f"O(cudaLaunchConfig_t, {f})")
    lines += ["S(cudaLaunchConfig_t)", "S(dim3)", "S(struct cudaChannelFormatDesc)",
              "S(cublasLtMatmulAlgo_t)", "S(cublasLtMatmulHeuristicResult_t)",
              "O(cublasLtMatmulHeuristicResult_t, workspaceSize)",
              "O(cublasLtMatmulHeuristicResult_t, state)",
              "O(cublasLtMatmulHeuristicResult_t, wavesCount)",
              "V((long)cudaStreamLegacy)", "V((long)cudaStreamPerThread)",
              "V(cudaHostAllocMapped)", "V(cudaEventDisableTiming)", "V(cudaStreamNonBlocking)",
              "V(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)", "V(CUDART_VERSION)", "V(CUBLAS_VERSION)"]
    lines += [f"V({e})" for e in errors + enums]
    lines += ["return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    outputs = []
    for variant in (["-DREAL", *flags], _own_flags(major)):
        exe = tmp_path / f"layout{len(outputs)}"
        proc = subprocess.run(CC + ["-Wall", *variant, str(src), "-o", str(exe)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    real, own = outputs
    assert len(own.splitlines()) > 250
    assert own == real
    # the error table covers every cudaError of the header
    hdr_dirs = [Path(f) for f in flags if not f.startswith("-")]
    driver_types = next((d / "driver_types.h") for d in hdr_dirs if (d / "driver_types.h").is_file()).read_text()
    in_header = set(re.findall(r"^\s+(cudaError\w+)\s*=", driver_types, re.M)) - {"cudaErrorApiFailureBase"}
    assert in_header <= set(errors), in_header - set(errors)


@pytest.mark.parametrize("major", MAJORS)
def test_prototypes_match_nvidia_headers(major, tmp_path):
    flags = _header_flags(REAL_HEADERS + "int main(void){return 0;}\n", tmp_path, major)
    protos = []
    for path, macro in ((SIM / "cudart" / "rt_api.h", "CUDARTAPI"), (SIM / "cublas" / "blas_api.h", "CUBLASWINAPI")):
        text = _for_major(path.read_text(), major)
        for m in re.finditer(r"^[\w ]+\**\s*%s\s*\**\s*(\w+)\(.*?\);" % macro, text, re.M | re.S):
            if not m.group(1).startswith(("__cuda", "gpumem_sim", "sim_")):
                protos.append(m.group(0))
    assert len(protos) > 120
    src = tmp_path / "protos.c"
    # Redeclaring a function with a different type is an error. CUDA 12's
    # header maps names onto their newest generation (cudaStreamGetCaptureInfo
    # onto _v2); what the runtime itself compiles with declares every one.
    internal = ["-D__CUDA_API_VERSION_INTERNAL"] if major < 13 else []
    src.write_text(REAL_HEADERS + "\n".join(protos) + "\n")
    proc = subprocess.run(CC + ["-c", "-Werror", *internal, *flags, str(src),
                                "-o", str(tmp_path / "p.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("major", MAJORS)
def test_binary_linked_against_the_real_runtime_runs_on_the_fake_silently(major, tmp_path):
    """A program built against NVIDIA's libcudart.so.N (versioned references
    to libcudart.so.N) runs on the preloaded fake without glibc warnings."""
    base = _wheel_dir(major)
    if base is None:
        pytest.skip(f"NVIDIA's libcudart.so.{major} is not installed")
    src = tmp_path / "prog.c"
    src.write_text(textwrap.dedent('''
        #include <stdio.h>
        int cudaGetDeviceCount(int *);
        int cudaMalloc(void **, unsigned long);
        int main(void) {
            int n = -1; void *p = 0;
            int e = cudaGetDeviceCount(&n);
            int m = cudaMalloc(&p, 1 << 20);
            printf("%d %d %d %d\\n", e, n, m, p != 0);
            return 0;
        }
    '''))
    exe = tmp_path / "prog"
    proc = subprocess.run(CC + [str(src), "-o", str(exe), "-L", str(base / "lib"),
                                f"-l:libcudart.so.{major}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert any(f"@libcudart.so.{major}" in p[-1] for p in _nm(exe, "-D", "--undefined-only"))
    from gpumem import sim
    env = sim.sim_env(devices=3, cuda_major=major)
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert (run.returncode, run.stdout, run.stderr) == (0, "0 3 0 1\n", "")
