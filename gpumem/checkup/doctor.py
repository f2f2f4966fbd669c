"""``gpumem doctor``: the check a user runs before anything else.

    gpumem doctor [--json] [--device N] [--no-selftest]
    gpumem.doctor(selftest=True, device=0) -> dict    (the same facts)

It reports, one line per finding: the CUDA driver and its CUDA version,
the GPUs with their memory and whether they support virtual memory
management (VMM, which expandable segments need), whether gpumem's own
driver backend loads, torch's version and CUDA build, whether the torch
shim is built for this torch (and where), whether a C++ compiler, ninja and
the CUDA headers are there to build it, and which of gpumem's settings are
in force.  When a GPU is present it then runs the driver backend's
self-test on one device (gpumem.checkup.selftest: allocate, free, split,
expandable growth and shrink, cross-stream free with events, out of memory
at the device's real limit, each checked against cuMemGetInfo; well under
ten seconds) and ends with a verdict.

A GPU is what the CUDA driver reports.  Under ``gpumem simulate`` (or
gpumem.sim) that is the simulated GPU: the driver is gpumem's fake one,
which doctor recognises and says so, and the self-test runs on it.

Exit status (EXIT_*):
  0  every check passed, the self-test included (or skipped by --no-selftest)
  1  a check failed: the lines marked FAIL say what and how to fix it
  2  bad command line
  3  no GPU here (no NVIDIA driver, or a driver with no device): nothing
     that could be checked failed, but the self-test could not run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import warnings
from typing import Any

from gpumem import _C, _sampling
from gpumem.recording import oom as _oom
from gpumem.pytorch import shim_build as _shim_build
from gpumem.checkup import selftest as _selftest
from gpumem._conf import ConfError, format_conf
from gpumem.checkup.cudadriver import Driver, DriverError, probe, version_text
from gpumem._format import format_bytes
from gpumem.pytorch.installer import AllocConfError, _read_settings

__all__ = ["doctor", "format_report", "add_arguments", "run", "HELP", "EXIT_OK", "EXIT_FAIL",
           "EXIT_NO_GPU"]

EXIT_OK, EXIT_FAIL, EXIT_NO_GPU = 0, 1, 3
HELP = ("check this machine for gpumem: driver, GPUs, VMM, torch, the shim and its build tools, "
        "settings, then a self-test of the driver backend on the GPU (exit 0 ok, 1 a check "
        "failed, 3 no GPU)")


def _version() -> str:
    """The installed distribution's version (gpumem/__init__.py sits above this module)."""
    try:
        from importlib.metadata import version
        return version("gpumem")
    except Exception:  # not installed as a distribution (a bare source tree)
        return "unknown"


class _Findings(list):
    """The report's findings, in order: {"status", "topic", "text"}."""

    def add(self, status: str, topic: str, text: str) -> None:
        self.append({"status": status, "topic": topic, "text": " ".join(text.split())})


def _driver_facts(found: _Findings, drv_probe: dict) -> None:
    if drv_probe["version"] is None and not drv_probe["present"]:
        status = "fail" if drv_probe["error"] else "info"
        found.add(status, "driver", drv_probe["reason"])
        return
    what = drv_probe["path"]
    if drv_probe["simulated"]:
        what += (" (gpumem's simulated GPU, started by gpumem simulate / gpumem.sim; "
                 "not real hardware)" if drv_probe["launcher"] else
                 " (gpumem's fake driver, not a GPU)")
    found.add("ok", "driver", f"CUDA {version_text(drv_probe['version'])} "
                              f"({drv_probe['version']}), {what}")
    if not drv_probe["present"]:
        if drv_probe["error"]:
            found.add("fail", "driver", drv_probe["reason"])
        else:
            found.add("info", "GPUs", drv_probe["reason"])
        return
    for g in drv_probe["gpus"]:
        sim = " (simulated)" if drv_probe["simulated"] else ""
        found.add("ok", f"GPU {g['index']}", f"{g['name']}{sim}, "
                  f"{format_bytes(g['total_memory'])} ({format_bytes(g['free_memory'])} free), "
                  f"compute capability {g['compute_capability']}")
        if g["vmm"]:
            found.add("ok", f"GPU {g['index']} VMM", "supported (expandable segments "
                      f"available), granularity {format_bytes(g['vmm_granularity'])}")
        else:
            found.add("warn", f"GPU {g['index']} VMM", "not supported: "
                      "expandable_segments:True falls back to plain segments")


def _backend_facts(found: _Findings, drv_probe: dict) -> bool:
    """gpumem's own driver backend loads the same driver; True if usable."""
    try:
        info = _C.cuda_open()
    except RuntimeError as e:
        found.add("fail", "gpumem backend", str(e))
        return False
    if info["device_count"] != len(drv_probe["gpus"]):
        found.add("fail", "gpumem backend", f"{info['path']} reports {info['device_count']} "
                  f"devices to gpumem's backend but {len(drv_probe['gpus'])} to the probe")
        return False
    found.add("ok", "gpumem backend", f"loads {info['path']}, {info['device_count']} device(s)")
    return True


def _torch_facts(found: _Findings, facts: dict, drv_probe: dict) -> Any:
    """torch's version and CUDA build; returns the module, or None."""
    if importlib.util.find_spec("torch") is None:
        found.add("warn", "torch", "not installed: gpumem.install() needs PyTorch's CUDA "
                  "build (gpumem.Allocator works without it)")
        return None
    try:
        import torch
    except Exception as e:  # a broken torch install: any error from its import
        found.add("fail", "torch", f"import torch failed: {type(e).__name__}: {e}")
        return None
    cuda = torch.version.cuda
    facts["torch"] = {"version": torch.__version__, "cuda": cuda, "path": torch.__file__}
    if not cuda:
        found.add("warn", "torch", f"{torch.__version__} is not a CUDA build: gpumem.install() "
                  "needs one")
        return None
    try:
        _shim_build.check_torch_release(torch.__version__)
    except _shim_build.ShimBuildError as e:
        found.add("fail", "torch", str(e))  # one line; the shim checks would only repeat it
        return None
    found.add("ok", "torch", f"{torch.__version__}, CUDA {cuda} build")
    drv_v = drv_probe["version"]
    if drv_v is not None and drv_v < int(cuda.split(".")[0]) * 1000:
        found.add("fail", "torch", f"the driver supports CUDA {version_text(drv_v)}, older than "
                  f"torch's CUDA {cuda} build: update the NVIDIA driver (or install the torch "
                  f"build for CUDA {version_text(drv_v)})")
    if drv_probe["present"]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            n = torch.cuda.device_count()
        facts["torch"]["device_count"] = n
        status = "ok" if n == len(drv_probe["gpus"]) else "fail"
        found.add(status, "torch", f"sees {n} GPU(s); the driver reports "
                  f"{len(drv_probe['gpus'])}")
    return torch


def _shim_facts(found: _Findings, facts: dict, torch: Any) -> None:
    if torch is None:
        return
    prereq = _shim_build.prerequisites()
    facts["build_tools"] = [{"what": w, "found": ok, "detail": d} for w, ok, d in prereq]
    try:
        where = _shim_build.cache_dir()
        built, why = _shim_build.check(where)
    except _shim_build.ShimBuildError as e:
        built, why, where = False, str(e), None
    facts["shim"] = {"built": built, "path": str(where) if where else None,
                     "detail": why or "up to date"}
    missing = [d for _, ok, d in prereq if not ok]
    never_build = os.environ.get("GPUMEM_SHIM_BUILD", "1").strip() in ("0", "false", "no")
    if built:
        found.add("ok", "torch shim", f"built for this torch in {where}")
    elif never_build:
        found.add("fail", "torch shim", f"{why}; GPUMEM_SHIM_BUILD=0 stops install() from "
                  "building it: run gpumem build-shim")
    elif missing:
        found.add("fail", "torch shim", f"{why}, and it cannot be built here (below)")
    else:
        found.add("info", "torch shim", f"{why}; install() builds it on first use (about 10 s), "
                  "or run gpumem build-shim now")
    for what, ok, detail in prereq:
        if ok:
            found.add("ok", "build", f"{what}: {detail}")
        else:
            found.add("info" if built else "fail", "build", detail
                      + (" (needed only to rebuild the shim)" if built else ""))


def _settings_facts(found: _Findings, facts: dict, drv_probe: dict) -> None:
    try:
        conf, source = _read_settings()
    except AllocConfError as e:
        found.add("fail", "settings", str(e))
        conf, source = None, None
    if conf is not None:
        text = format_conf(conf) or "defaults"
        facts["settings"] = {"allocator": conf, "source": source or None}
        found.add("ok", "settings", f"{text} ({'from ' + source if source else 'none set'})")
        no_vmm = [g["index"] for g in drv_probe["gpus"] if not g["vmm"]]
        if conf["expandable_segments"] and no_vmm:
            found.add("warn", "settings", f"expandable_segments is on but GPU(s) {no_vmm} have "
                      "no VMM: they use plain segments")
    try:
        _oom.check_env()
        snap = os.environ.get(_oom.ENV_OOM_SNAPSHOT, "").strip()
        if snap:
            found.add("ok", "settings", f"out-of-memory snapshots go to {snap}")
        smp = _sampling.from_env()
        if smp:
            found.add("ok", "settings", f"{_sampling.ENV_SAMPLE}: recording started without "
                      f"sample= is sampled ({_sampling.describe(smp)})")
    except ConfError as e:
        found.add("fail", "settings", str(e))
    env = {k: v for k, v in sorted(os.environ.items())   # not gpumem simulate's plumbing
           if k.startswith("GPUMEM_") and not k.startswith("GPUMEM_SIMULATE_")}
    facts["environment"] = env
    if env:
        found.add("info", "environment", ", ".join(f"{k}={v}" for k, v in env.items()))


def _selftest_facts(found: _Findings, facts: dict, drv_probe: dict, device: int) -> None:
    if device >= len(drv_probe["gpus"]):
        found.add("fail", "self-test", f"--device {device}: the driver reports "
                  f"{len(drv_probe['gpus'])} GPU(s)")
        return
    drv = Driver()
    try:
        drv.init()
        result = _selftest.run(device, driver=drv)
        drv.close()
    except DriverError as e:
        found.add("fail", "self-test", f"the driver failed before the steps: {e}")
        return
    facts["selftest"] = result
    for step in result["steps"]:
        found.add({"ok": "ok", "fail": "fail", "skipped": "warn"}[step["status"]],
                  f"self-test {step['name']}", step["detail"])


def doctor(selftest: bool = True, device: int = 0) -> dict[str, Any]:
    """Check this machine for gpumem; the report ``gpumem doctor --json`` prints.

    selftest: run the driver backend's self-test when a GPU is present.
    device: the GPU the self-test runs on.  Keys: exit_status (EXIT_*),
    verdict (one line), findings ({"status": "ok" | "info" | "warn" |
    "fail", "topic", "text"}, in order), simulated, and the facts behind
    them: gpumem, driver, torch, shim, build_tools, settings, environment,
    selftest (None when it did not run).
    """
    found = _Findings()
    facts: dict[str, Any] = {"gpumem": {"version": _version(), "extension": _C.__file__},
                             "torch": None, "shim": None, "build_tools": None, "settings": None,
                             "environment": {}, "selftest": None}
    found.add("info", "gpumem", f"{facts['gpumem']['version']}, extension {_C.__file__}")
    drv_probe = probe()
    facts["driver"] = drv_probe
    _driver_facts(found, drv_probe)
    backend_ok = drv_probe["present"] and _backend_facts(found, drv_probe)
    torch = _torch_facts(found, facts, drv_probe)
    _shim_facts(found, facts, torch)
    _settings_facts(found, facts, drv_probe)
    ran = False
    if backend_ok and selftest:
        ran = True
        _selftest_facts(found, facts, drv_probe, device)
    failed = [f for f in found if f["status"] == "fail"]
    where = "the simulated GPU, not real hardware" if drv_probe["simulated"] else "this GPU"
    if failed:
        status = EXIT_FAIL
        verdict = (f"PROBLEM: {len(failed)} check(s) failed, first: {failed[0]['topic']}: "
                   f"{failed[0]['text']}")
    elif not drv_probe["present"]:
        status, verdict = EXIT_NO_GPU, ("no GPU here: the self-test was not run; everything "
                                        "else that could be checked is fine (gpumem simulate "
                                        "-- gpumem doctor runs it on the simulated GPU)")
    elif not ran:
        status, verdict = EXIT_OK, f"OK on {where} (self-test skipped)"
    else:
        secs = facts["selftest"]["seconds"]
        status, verdict = EXIT_OK, (f"OK: gpumem's driver backend works on {where}: the "
                                    f"self-test passed on GPU {device} in {secs:.2f} s")
    return {"exit_status": status, "verdict": verdict, "simulated": drv_probe["simulated"],
            "findings": list(found), **facts}


def format_report(report: dict[str, Any]) -> str:
    """The text ``gpumem doctor`` prints: one line per finding, then the verdict."""
    lines = ["gpumem doctor"]
    for f in report["findings"]:
        lines.append(f"{f['status'].upper() if f['status'] == 'fail' else f['status']:<5} "
                     f"{f['topic']}: {f['text']}")
    lines.append(f"verdict: {report['verdict']} (exit {report['exit_status']})")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``gpumem doctor`` (for cli.COMMANDS)."""
    p.epilog = ("exit status: 0 every check passed (self-test included); 1 a check failed "
                "(see the FAIL lines); 2 bad command line; 3 no GPU here (nothing failed, "
                "self-test not run)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--device", type=int, default=0, metavar="N",
                   help="the GPU the self-test runs on (default 0)")
    p.add_argument("--no-selftest", action="store_true",
                   help="report the facts only; do not run the self-test")


def run(args: argparse.Namespace) -> int:
    """``gpumem doctor`` with parsed arguments; returns the exit status."""
    if args.device < 0:
        print(f"gpumem: error: --device must be 0 or more, not {args.device}", file=sys.stderr)
        return 2
    report = doctor(selftest=not args.no_selftest, device=args.device)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(format_report(report))
    sys.stdout.flush()
    return report["exit_status"]
