"""Every supported torch release, one row each: what gpumem does on it.

    python benchmarks/torch_matrix.py PYTHON... [-k EXPR] [--write]
        [--no-conformance] [--no-step]

Each PYTHON is the interpreter of a venv holding one torch release from
PyPI (its CUDA build) with pytest and ninja; gpumem is taken from this
checkout (PYTHONPATH), as the tests take it.  Per release, in that venv:

  shim         `python -m gpumem build-shim` into an empty cache folder:
               "prebuilt" when the shim it names lies outside that folder,
               else "built" with the command's wall and CPU time in seconds
  conformance  tests/conformance on the simulated GPU (-k EXPR selects
               groups or checks, as pytest's -k), counted per allocator:
               passed / skipped / failed
  step         tests/test_train_step_peaks.py: two AdamW steps of a small
               Transformer, peak allocated / reserved under `python -m
               gpumem.sim` (torch's allocator) and under `gpumem simulate`

--write puts the rows into docs/compatibility.md between the
"torch-matrix" markers, replacing the rows of the releases measured and
keeping the others.  Not in CI: one release takes tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "compatibility.md"
BEGIN, END = "<!-- torch-matrix:begin -->", "<!-- torch-matrix:end -->"
HEADER = ("| torch | CUDA build | shim | conformance under torch: passed / skipped / failed "
          "| under gpumem | checks run | step peak allocated / reserved, torch | gpumem | measured |\n"
          "|---|---|---|---|---|---|---|---|---|")
MODES = ("torch", "gpumem")


def _env(python: str, cache: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH", "")] if p])
    env["GPUMEM_CACHE_DIR"] = cache
    env["GPUMEM_TEST_SHIM_CACHE"] = cache  # the tests then use the shim timed here
    for k in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
              "GPUMEM_SIM_CUDA"):
        env.pop(k, None)
    return env


def _release(python: str, env: dict) -> tuple[str, str]:
    out = subprocess.run([python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                         capture_output=True, text=True, env=env, check=True).stdout.split()
    return out[0], out[1]


def _shim(python: str, env: dict, cache: str) -> str:
    t0, cpu0 = time.monotonic(), _children_cpu()
    proc = subprocess.run([python, "-m", "gpumem", "build-shim"], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    secs, cpu = time.monotonic() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        line = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{python}: gpumem build-shim failed (exit {proc.returncode}): {line}")
    path = proc.stdout.split()[0] if proc.stdout.split() else ""
    return "prebuilt" if not path.startswith(cache) else f"built, {secs:.0f} s ({cpu:.0f} s CPU)"


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _pytest(python: str, env: dict, args: list[str], junit: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={junit}", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT)


def _conformance(python: str, env: dict, expr: str | None, tmp: Path) -> dict:
    """{mode: [passed, skipped, failed]} from pytest's JUnit XML."""
    junit = tmp / "conformance.xml"
    args = ["tests/conformance/test_conformance.py::test_conformance"] + (["-k", expr] if expr else [])
    _pytest(python, env, args, junit)
    counts = {m: [0, 0, 0] for m in MODES}
    for case in ET.parse(junit).getroot().iter("testcase"):
        mode = next((m for m in MODES if f"-{m}-" in case.get("name", "")), None)
        if mode is None:
            continue
        kinds = {child.tag for child in case}
        slot = 1 if "skipped" in kinds else 2 if kinds & {"failure", "error"} else 0
        counts[mode][slot] += 1
        if slot == 2:
            print(f"  failed: {case.get('name')}", file=sys.stderr)
    return counts


def _step(python: str, env: dict, tmp: Path) -> dict | None:
    proc = _pytest(python, env, ["-s", "tests/test_train_step_peaks.py"], tmp / "step.xml")
    for line in reversed(proc.stdout.splitlines()):
        start = line.find('{"torch"')
        if start >= 0 and "peaks_torch" in line:
            return json.loads(line[start:])
    print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def measure(python: str, expr: str | None, conformance: bool, step: bool) -> tuple[str, str]:
    """(release, table row) for the torch of ``python``."""
    with tempfile.TemporaryDirectory(prefix="gpumem-matrix-") as cache:
        env = _env(python, cache)
        version, cuda = _release(python, env)
        print(f"{version}: building the shim", file=sys.stderr)
        shim = _shim(python, env, cache)
        tmp = Path(cache)
        conf = None
        if conformance:
            print(f"{version}: tests/conformance {'-k ' + expr if expr else '(all)'}", file=sys.stderr)
            conf = _conformance(python, env, expr, tmp)
        peaks = None
        if step:
            print(f"{version}: training step", file=sys.stderr)
            peaks = _step(python, env, tmp)
    cells = [version, cuda, shim]
    cells += [" / ".join(map(str, conf[m])) for m in MODES] if conf else ["not run", "not run"]
    cells.append(f"`-k {expr}`" if conf and expr else "all" if conf else "")
    if peaks:
        cells += [" / ".join(_mib(n) for n in peaks["peaks_torch"]),
                  " / ".join(_mib(n) for n in peaks["peaks_gpumem"])]
    else:
        cells += ["not run" if not step else "failed", ""]
    cells.append(time.strftime("%Y-%m-%d"))
    return version, "| " + " | ".join(cells) + " |"


def _key(version: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0]))


def write(rows: dict[str, str]) -> None:
    """Merge rows ({release: row}) into docs/compatibility.md's table."""
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} markers to write between")
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    old = {}
    for line in body.splitlines():
        m = re.match(r"\| (\d[^ |]*) \|", line)
        if m:
            old[m.group(1)] = line
    old.update(rows)
    table = "\n".join([HEADER] + [old[v] for v in sorted(old, key=_key)])
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/torch_matrix.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("pythons", nargs="+", metavar="PYTHON", help="a venv's interpreter, one per release")
    p.add_argument("-k", dest="expr", help="pytest -k expression selecting conformance checks")
    p.add_argument("--write", action="store_true", help="merge the rows into docs/compatibility.md")
    p.add_argument("--no-conformance", action="store_true")
    p.add_argument("--no-step", action="store_true")
    args = p.parse_args(argv)
    for py in args.pythons:
        if not os.access(py, os.X_OK):
            p.error(f"{py}: not an executable interpreter")
    rows = {}
    for py in args.pythons:
        version, row = measure(py, args.expr, not args.no_conformance, not args.no_step)
        rows[version] = row
        print(row, flush=True)
    if args.write:
        write(rows)
        print(f"written to {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
