"""Run a program on a simulated GPU: PyTorch's own CUDA build, no GPU needed.

    python -m gpumem.sim [--memory 80GiB] [--devices N] [--events MODE]
                         [--log PATH|-] [--report PATH] -- CMD [ARGS...]

The simulator is a set of fake NVIDIA libraries (a CUDA driver
``libcuda.so.1``, NVML ``libnvidia-ml.so.1``, runtime ``libcudart.so.N``,
``libcublas.so.N``, ``libcublasLt.so.N``, cuDNN ``libcudnn.so.9`` and NCCL ``libnccl.so.2``; sources and design in
simgpu/README.md), one set per CUDA major version N that PyTorch is built
for: 12 (torch 2.6 to 2.10 from PyPI) and 13. The launcher preloads the set
of the torch the command will import (gpumem/sim/torch_cuda.py says how it
finds out without importing torch; GPUMEM_SIM_CUDA=12 or 13 overrides it). "Device"
memory is host memory reserved with MAP_NORESERVE, so an 80 GiB device costs
only what the program touches; kernels and GEMMs do nothing, copies and
memsets really copy. Allocation, caching, streams, events, out-of-memory and
PyTorch's memory statistics and snapshots behave as on a real device, which
is what the simulator is for: memory behaviour, not numbers.

The launcher puts the fakes in front of the real libraries with LD_PRELOAD
(PyTorch's wheels use DT_RPATH, which beats LD_LIBRARY_PATH) and execs CMD.
Nothing is faked unless the launcher or ``run_snippet`` is used: importing
gpumem or this module loads no fake library.

Options (also environment variables the fakes read, set by the launcher):
  --memory SIZE     capacity of each device (GPUMEM_SIM_MEMORY; default 80GiB)
  --devices N       number of devices (GPUMEM_SIM_DEVICES; default 1)
  --events MODE     when recorded events complete (GPUMEM_SIM_EVENTS):
                    timeline (default: kernels, copies and memsets take
                    simulated time on their stream; an event completes when
                    the simulated host clock reaches it), immediate, never
                    (until synchronized), after:N (after N polls)
  --log PATH|-      note every unimplemented CUDA call once (GPUMEM_SIM_LOG)
  --report PATH     write a JSON report at exit (GPUMEM_SIM_REPORT): calls made,
                    device capacity, peak and leaks per device; under a launcher
                    (torchrun) the first rank's, with "processes" listing every
                    process that used the simulated GPU (one entry per rank)
  --no-host-memory  device memory holds no data and costs no host memory
                    (GPUMEM_FAKECUDA_NO_HOST_MEMORY=1): copies to the device
                    store nothing, copies back yield zeros; every memory
                    figure is unchanged. For models larger than this
                    machine's memory (docs/simulation.md)

Where the libraries come from: $GPUMEM_SIM_LIB_DIR if set (one major
version's set); else, in a source checkout, build/sim/cudaN/ (built on
demand from simgpu/ with ``cc`` and kept up to date); else
gpumem/sim/_lib/cudaN/ (built by setup.py at install time).

The launcher's modules, bottom to top:
  gpus         the GPU models --gpu names (memory size, compute capability)
  torch_cuda   the CUDA major version of the torch a command will import
  config_key   gpumem fit --vary FILE:KEY: a whole-number key of a config file
  knob         gpumem fit --vary: where the knob's value enters the command
  boundary     gpumem fit's search: N fits, N + 1 does not
  __init__     this module: the environment and the launcher, run_snippet
  torchrun     --nproc-per-node: the elastic launcher's command, the device count
  world_rank   --ranks: what runs in a started rank (the stand-in store, then the script);
               recv_object_list refused in every rank of a run
  world        --nnodes/--ranks: start only some ranks of a job, which rank stands for which
  rank_report  the per-rank lines of gpumem simulate's report
  child        what runs inside each Python process of a gpumem simulate run
  outcome      how each process of a run ended: failed, stopped, or finished
  command      gpumem simulate: run a script, report its peak, write the snapshot
  fit          gpumem fit: the largest value of a knob that fits, a probe per value
  __main__     python -m gpumem.sim
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["SimError", "lib_dir", "libraries", "sim_env", "run_snippet", "main", "parse_size",
           "CUDA_MAJOR", "CUDA_MAJORS", "cuda_major_for"]

CUDA_MAJOR = 13          # the newest: used when the command's torch cannot be told
CUDA_MAJORS = (12, 13)   # one set of fake libraries each (simgpu/cudaN/)
SIM_DIR = Path(__file__).resolve().parent
PKG_DIR = SIM_DIR.parent
SOURCE_ROOT = PKG_DIR.parent
SIM_SOURCES = SOURCE_ROOT / "simgpu"


class SimError(RuntimeError):
    """The simulator cannot run: libraries missing or unbuildable, bad option."""


def sonames(cuda_major: int = CUDA_MAJOR) -> List[str]:
    """The fake libraries, in LD_PRELOAD order (driver first)."""
    return ["libcuda.so.1", "libnvidia-ml.so.1", f"libcudart.so.{cuda_major}",
            f"libcublasLt.so.{cuda_major}", f"libcublas.so.{cuda_major}", "libcudnn.so.9",
            "libnccl.so.2"]


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mib": 1 << 20,
          "mb": 10**6, "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40,
          "tb": 10**12}


def parse_size(text: Union[str, int]) -> int:
    """'80GiB', '512MiB', '2GB', '4096' -> bytes (the fake driver's grammar)."""
    if isinstance(text, int):
        if text <= 0:
            raise SimError(f"memory size must be positive, got {text}")
        return text
    m = re.fullmatch(r"\s*(\d{1,30})\s*([A-Za-z]*)\s*", str(text), re.ASCII)
    if not m or m.group(2).lower() not in _UNITS or int(m.group(1)) == 0:
        raise SimError(f"bad memory size {text!r}: use an integer with an optional unit, "
                       "such as 80GiB, 512MiB or 1048576")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _check_events(mode: str) -> str:
    if mode in ("timeline", "immediate", "never") or re.fullmatch(r"after:\d+", mode):
        return mode
    raise SimError(f"bad event mode {mode!r}: use timeline, immediate, never or after:N")


def _load_builder():
    name = "gpumem_csrc_sim_build"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, SIM_SOURCES / "build.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def _complete(d: Path, cuda_major: int) -> bool:
    return all((d / n).is_file() for n in sonames(cuda_major))


_checked: Dict[int, Path] = {}  # source-tree builds already brought up to date


def lib_dir(cuda_major: int = CUDA_MAJOR, *, build: bool = True) -> Path:
    """The directory holding the fake libraries (see the module docstring)."""
    env = os.environ.get("GPUMEM_SIM_LIB_DIR")
    if env:
        d = Path(env)
        if not _complete(d, cuda_major):
            raise SimError(f"GPUMEM_SIM_LIB_DIR={env} does not hold {', '.join(sonames(cuda_major))}")
        return d
    if (SIM_SOURCES / "build.py").is_file() and build:
        if cuda_major in _checked:
            return _checked[cuda_major]
        out = SOURCE_ROOT / "build" / "sim" / f"cuda{cuda_major}"
        builder = _load_builder()
        try:
            builder.build_sim_libs(out, cuda_major=cuda_major)
        except builder.BuildError as exc:
            raise SimError(f"building the simulator's libraries failed: {exc}") from exc
        _checked[cuda_major] = out
        return out
    installed = SIM_DIR / "_lib" / f"cuda{cuda_major}"
    if _complete(installed, cuda_major):
        return installed
    raise SimError("the simulator's libraries are not installed (gpumem/sim/_lib is missing; "
                   "reinstall gpumem with a C compiler available, or set GPUMEM_SIM_LIB_DIR)")


def cuda_major_for(command: Optional[Sequence[str]] = None,
                   env: Optional[Mapping[str, str]] = None) -> int:
    """The CUDA major version whose fake libraries command needs: that of
    the torch it will import (gpumem/sim/torch_cuda.py; None: the running
    interpreter's), CUDA_MAJOR when that cannot be told."""
    from gpumem.sim import torch_cuda
    try:
        major = torch_cuda.torch_cuda_major(command, env)
    except ValueError as e:
        raise SimError(str(e)) from None
    if major is None:
        return CUDA_MAJOR
    if major not in CUDA_MAJORS:
        raise SimError(f"the command's torch is built for CUDA {major}; the simulated GPU has "
                       f"the libraries of CUDA {' and '.join(map(str, CUDA_MAJORS))} "
                       f"(set {torch_cuda.ENV} to use one of them anyway)")
    return major


def libraries(cuda_major: int = CUDA_MAJOR) -> Dict[str, Path]:
    """{soname: path} of the fake libraries, in LD_PRELOAD order."""
    d = lib_dir(cuda_major)
    return {n: d / n for n in sonames(cuda_major)}


def sim_env(*, memory: Union[str, int, None] = None, devices: Optional[int] = None,
            events: Optional[str] = None, log: Optional[str] = None, report: Optional[str] = None,
            base: Optional[Mapping[str, str]] = None, cuda_major: Optional[int] = None,
            gpu: Optional[str] = None, no_host_memory: Optional[bool] = None,
            command: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """The environment a process needs to run on the simulator.

    cuda_major: which set of fake libraries to preload (12 or 13); None
    chooses by the torch that command (argv; None: this interpreter) will
    import (cuda_major_for).

    no_host_memory: True sets GPUMEM_FAKECUDA_NO_HOST_MEMORY=1 (device
    memory holds no data: copies to the device store nothing, copies back
    yield zeros), False sets it to 0; None leaves the environment's value.

    gpu: a GPU model of gpumem.sim.gpus (default H100-SXM-80GB, unless
    GPUMEM_SIM_GPU is already set); its memory is the default for
    ``memory``, and its context memory is charged when CUDA initialises
    (GPUMEM_SIM_CONTEXT_MEMORY overrides it).

    base: the environment to start from (default os.environ). The fakes go
    in front of any LD_PRELOAD already there; GPUMEM_LIBCUDA points gpumem's
    CUDA backend at the same fake driver, and TRITON_LIBCUDA_PATH (unless
    set) Triton, so torch.compile works with no setup.
    """
    env = dict(os.environ if base is None else base)
    if cuda_major is None:
        cuda_major = cuda_major_for(command, env)
    libs = libraries(cuda_major)
    preload = [str(p) for p in libs.values()]
    if env.get("LD_PRELOAD"):
        preload.append(env["LD_PRELOAD"])
    env["LD_PRELOAD"] = ":".join(preload)
    env["GPUMEM_SIM_LIB_DIR"] = str(next(iter(libs.values())).parent)
    env["GPUMEM_LIBCUDA"] = str(libs["libcuda.so.1"])
    # Triton links its launcher against libcuda.so.1 from this directory
    # (triton/backends/nvidia/driver.py, libcuda_dirs()); a user's own
    # setting wins.
    env.setdefault("TRITON_LIBCUDA_PATH", env["GPUMEM_SIM_LIB_DIR"])
    from gpumem.sim import gpus as sim_gpus
    if gpu is not None:
        try:
            model = sim_gpus.lookup(gpu)
        except ValueError as e:
            raise SimError(f"--gpu: {e}") from None
        env["GPUMEM_SIM_GPU"] = sim_gpus.spec(model)
        if memory is None:
            memory = model["memory"]
    elif not env.get("GPUMEM_SIM_GPU"):
        # the default model, named so that its context memory and
        # bandwidths apply (the bare driver charges no context)
        env["GPUMEM_SIM_GPU"] = sim_gpus.spec(sim_gpus.lookup(sim_gpus.DEFAULT))
    if memory is not None:
        env["GPUMEM_SIM_MEMORY"] = str(parse_size(memory))
    if devices is not None:
        if not 0 <= int(devices) <= 16:
            raise SimError(f"--devices must be from 0 to 16, got {devices}")
        env["GPUMEM_SIM_DEVICES"] = str(int(devices))
    if events is not None:
        env["GPUMEM_SIM_EVENTS"] = _check_events(events)
    if log is not None:
        env["GPUMEM_SIM_LOG"] = log
    if report is not None:
        env["GPUMEM_SIM_REPORT"] = str(Path(report).absolute())
    if no_host_memory is not None:
        env["GPUMEM_FAKECUDA_NO_HOST_MEMORY"] = "1" if no_host_memory else "0"
    # NVML-based device checks would look for real GPUs.
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    return env


def run_snippet(code: str, *, memory: Union[str, int, None] = "80GiB", devices: int = 1,
                events: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                timeout: float = 600, args: Sequence[str] = (),
                gpu: Optional[str] = None,
                no_host_memory: Optional[bool] = None) -> Tuple[int, str, str]:
    """Run ``python -c code`` on the simulator; (returncode, stdout, stderr).

    env: extra variables on top of the current environment; no_host_memory:
    as sim_env's.
    """
    base = dict(os.environ)
    if env:
        base.update(env)
    full = sim_env(memory=memory, devices=devices, events=events, base=base, gpu=gpu,
                   no_host_memory=no_host_memory, command=[sys.executable])
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=full, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def stop_signals() -> List[int]:
    """SIGTERM and SIGINT, less any this process was started with ignored:
    the ones a launcher of a run (gpumem simulate, gpumem fit, python -m
    gpumem.sim --report) catches and passes on to the run.

    Note [An ignored stop signal]
    Rationale: a shell without job control starts a background command
      (``cmd &``) with SIGINT ignored, and that disposition is inherited by
      everything the command starts; gpumem simulate caught SIGINT anyway and
      passed it on to a script that ignored it, so the script ran on until
      the grace period's SIGKILL, and its snapshot was lost (seen as a test
      that failed only when the suite was started in the background).
    Approach: a signal ignored when the launcher started stays ignored, as
      CPython itself leaves SIGINT ignored then: the launcher installs no
      handler for it and the run, which inherits the same disposition,
      ignores it too.  A signal not ignored is handled as before."""
    import signal
    return [s for s in (signal.SIGTERM, signal.SIGINT)
            if signal.getsignal(s) != signal.SIG_IGN]


def _gpu_names() -> List[str]:
    from gpumem.sim import gpus as sim_gpus
    return list(sim_gpus.MODELS)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m gpumem.sim",
        description="Run CMD with PyTorch's CUDA build on a simulated GPU.",
        epilog="Example: python -m gpumem.sim --memory 80GiB -- python train.py")
    ap.add_argument("--gpu", default=None, metavar="MODEL",
                    help="the GPU model to simulate (default H100-SXM-80GB); one of: "
                         + ", ".join(_gpu_names()))
    ap.add_argument("--memory", default=None,
                    help="capacity per device, e.g. 80GiB (default: the model's memory)")
    ap.add_argument("--devices", type=int, default=None, help="number of devices (default 1)")
    ap.add_argument("--events", default=None, help="timeline | immediate | never | after:N (default timeline)")
    ap.add_argument("--log", default=None, metavar="PATH|-",
                    help="log unimplemented CUDA calls once each ('-' for stderr)")
    ap.add_argument("--report", default=None, metavar="PATH", help="write a JSON report at exit")
    ap.add_argument("--no-host-memory", action="store_true",
                    help="device memory holds no data and costs no host memory: copies to the "
                         "device store nothing, copies back yield zeros; memory figures are "
                         "unchanged")
    ap.add_argument("--print-env", action="store_true",
                    help="print the environment variables to export instead of running CMD")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        env = sim_env(memory=args.memory, devices=args.devices, events=args.events,
                      log="stderr" if args.log == "-" else args.log, report=args.report,
                      gpu=args.gpu, no_host_memory=True if args.no_host_memory else None,
                      command=cmd or None)
    except SimError as exc:
        print(f"gpumem.sim: error: {exc}", file=sys.stderr)
        return 2
    if args.print_env:
        keys = ["LD_PRELOAD", "GPUMEM_LIBCUDA", "GPUMEM_SIM_LIB_DIR"] + sorted(
            k for k in env if k.startswith("GPUMEM_SIM_") and k != "GPUMEM_SIM_LIB_DIR"
            or k == "GPUMEM_FAKECUDA_NO_HOST_MEMORY")
        for k in keys:
            if k in env:
                print(f"export {k}={shlex.quote(env[k])}")
        return 0
    if not cmd:
        ap.print_usage(sys.stderr)
        print("gpumem.sim: error: no command given (put it after --)", file=sys.stderr)
        return 2
    if args.report is not None:
        return _run_reporting(cmd, env, env["GPUMEM_SIM_REPORT"])
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        print(f"gpumem.sim: error: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


def _run_reporting(cmd: List[str], env: Dict[str, str], report: str) -> int:
    """--report: run cmd (not exec: a launcher such as torchrun starts several
    processes), each process writing its own report (GPUMEM_SIM_REPORT with
    %p), then write one report of every process that used memory of a
    simulated GPU (a CUDA context at least): the first such process's report (rank 0's, under a
    launcher), with "processes" listing all of them, one per rank.
    SIGTERM and SIGINT are passed on to cmd; the status is cmd's."""
    import json
    import shutil
    import signal
    import tempfile
    work = tempfile.mkdtemp(prefix="gpumem-sim-report-")
    env = dict(env, GPUMEM_SIM_REPORT=os.path.join(work, "report.%p.json"))
    try:
        try:
            proc = subprocess.Popen(cmd, env=env)
        except OSError as exc:
            print(f"gpumem.sim: error: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
            return 127

        def forward(signo: int, frame: object) -> None:
            try:
                proc.send_signal(signo)
            except OSError:
                pass

        old = {s: signal.signal(s, forward) for s in stop_signals()}
        try:
            rc = proc.wait()
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
        reports = []
        for name in os.listdir(work):
            if name.startswith("report.") and name.endswith(".json"):
                try:
                    with open(os.path.join(work, name), encoding="utf-8") as f:
                        reports.append(json.load(f))
                except (OSError, ValueError):
                    continue
        used = [r for r in reports if any(
            (d or {}).get("peak_bytes_used", 0) > 0
            for d in ((r.get("driver") or {}).get("devices") or []))]
        used.sort(key=lambda r: (r.get("rank") is None, r.get("rank") or 0, r.get("pid") or 0))
        chosen = used or sorted(reports, key=lambda r: r.get("pid") or 0)[:1]
        if chosen:
            out = dict(chosen[0], processes=used)
            tmp = f"{report}.{os.getpid()}.tmp"
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump(out, f)
                    f.write("\n")
                os.replace(tmp, report)
            except OSError as exc:
                print(f"gpumem.sim: error: cannot write the report {report}: {exc.strerror}",
                      file=sys.stderr)
        return 128 - rc if rc < 0 else rc
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
