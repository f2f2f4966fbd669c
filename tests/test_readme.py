"""Every command in README.md, run exactly as written, from a clone folder named ``gpumem``.

A command is a line of a fenced block that is neither Python nor ``text``
(sample output; its ``# comment`` tail dropped).  Each one is either run here, in order, in a copy of this
checkout placed in a folder named ``gpumem`` (the default name of a clone:
nothing may depend on the folder's name), or is one of the two commands CI
runs (``.ci/run``: the set-up command and the full test command).  A README
command that neither list names fails test_every_readme_command_is_covered.

The inputs the quick-start commands name (train.py, memory.pickle,
before.pickle, after.pickle) are made by running the README's own Python
block, unchanged, inside a train.py that defines ``train_step``; the main job
runs the example script as its section says.  ``gpumem`` and ``python`` on
PATH are this interpreter and the copy's package.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_helpers import ROOT, _env, built_shim

README = ROOT / "README.md"

# Run by CI as .ci/run (./setup.sh would reinstall this environment; the full
# suite is the suite this test belongs to).
BY_CI = ("./setup.sh", "python -m pytest -q -n 2 --dist loadfile tests")


def readme_blocks() -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block of README.md."""
    blocks, lang, lines = [], None, []
    for line in README.read_text(encoding="utf-8").splitlines():
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and lang is None:
            lang, lines = fence.group(1), []
        elif fence or (line.startswith("```") and lang is not None):
            blocks.append((lang, lines))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def readme_commands() -> list[str]:
    out = []
    for lang, lines in readme_blocks():
        if lang in ("python", "text"):
            continue
        for line in lines:
            command = re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                out.append(command)
    return out


def readme_python() -> str:
    [block] = [lines for lang, lines in readme_blocks() if lang == "python"]
    return "\n".join(block) + "\n"


# The commands run here, in this order (the quick start needs train.py's files).
QUICK_START = [
    "gpumem simulate --memory 80GiB -- python train.py",
    "gpumem summary memory.pickle",
    "gpumem diff before.pickle after.pickle",
    "gpumem view memory.pickle -o memory.html",
    "gpumem replay memory.pickle --conf expandable_segments:True",
]
MAIN_JOB = [
    "gpumem simulate --out /tmp/gpumem_demo -- python examples/loss_history_leak.py "
    "--prefix /tmp/gpumem_demo/loss_leak",
    "gpumem diff /tmp/gpumem_demo/loss_leak_before.pickle /tmp/gpumem_demo/loss_leak_after.pickle",
]
COMPILED = ["gpumem simulate --gpu L4 -- python examples/compiled_fit.py --mode reduce-overhead"]
RANKS = ["gpumem simulate --nproc-per-node 2 --out /tmp/gpumem_ranks -- examples/per_rank.py "
         "--backend nccl --out /tmp/gpumem_ranks/per_rank.pickle",
         "gpumem summary /tmp/gpumem_ranks"]
FIT = ["gpumem fit --memory 2GiB --vary batch-size=1..64 -- python examples/batch_fit.py "
       "--batch-size 8"]
WORLD = ["gpumem simulate --nnodes 8 --nproc-per-node 8 --ranks 0,63 --out /tmp/gpumem_world -- "
         "examples/per_rank.py --backend nccl --out /tmp/gpumem_world/per_rank.pickle"]
FAST_TIER = ['python -m pytest -q -m "not slow" tests']
DOCTOR = ["gpumem doctor"]
GPU_SUITE = [
    "python -m pytest -q tests/gpu",
    "GPUMEM_GPU_RESULTS=gpu.json python -m pytest -q tests/gpu",
    "gpumem simulate --out /tmp/gpumem_simulate -- python -m pytest -q tests/gpu",
]
BENCHMARKS_PREFIX = "python benchmarks/"


def test_every_readme_command_is_covered():
    commands = readme_commands()
    covered = set(BY_CI) | set(QUICK_START) | set(MAIN_JOB) | set(FAST_TIER) | set(DOCTOR)
    covered |= set(GPU_SUITE) | set(COMPILED) | set(RANKS) | set(FIT) | set(WORLD)
    stray = [c for c in commands if c not in covered and not c.startswith(BENCHMARKS_PREFIX)]
    assert stray == [], f"README commands no test runs: {stray}"
    assert [c for c in commands if c in BY_CI] == list(BY_CI)   # one set-up, one test command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert all(c in ci for c in BY_CI), ci
    assert set(QUICK_START) | set(MAIN_JOB) | set(FAST_TIER) | set(DOCTOR) | set(GPU_SUITE) \
        | set(COMPILED) | set(RANKS) | set(FIT) | set(WORLD) <= set(commands)


def test_setup_installs_what_a_simulated_run_needs():
    """torch warns "Failed to initialize NumPy" on every import without numpy, so
    every gpumem simulate run would print it: the set-up installs numpy."""
    extra = re.search(r"^test = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S)
    names = {re.split(r"[=<>\[ ]", n.strip().strip('"'))[0] for n in extra.group(1).split(",")}
    assert {"torch", "numpy", "ninja", "pytest"} <= names, names
    assert "pip install -e '.[test]'" in (ROOT / "setup.sh").read_text()


TRAIN = '''\
# train.py: the README's quick start, with a train_step to run it.
import torch

_model = torch.nn.Linear(256, 256)
_steps = []


def train_step():
    global _model
    if not _steps:
        _model = _model.cuda()
    _steps.append(_model(torch.randn(64, 256, device="cuda")).sum())   # a leak: kept graphs
    if len(_steps) == 2:
        gpumem.dump_snapshot("before.pickle")
    if len(_steps) == 5:
        gpumem.dump_snapshot("after.pickle")


'''


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> tuple[Path, dict]:
    """A copy of this checkout (tracked and untracked-not-ignored files, and the
    built extension and simulated GPU) in a folder named gpumem."""
    built_shim()
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files of a clone are not known")
    base = tmp_path_factory.mktemp("readme")
    dst = base / "gpumem"
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    for built in list((ROOT / "gpumem").glob("_C*.so")):
        shutil.copy2(built, dst / "gpumem" / built.name)
    lib = Path("gpumem", "sim", "_lib")
    shutil.copytree(ROOT / lib, dst / lib, dirs_exist_ok=True)
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (base / "shared").symlink_to(shared)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "gpumem").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpumem "$@"\n')
    (bin_dir / "gpumem").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    (dst / "train.py").write_text(TRAIN + readme_python())
    (base / "tmp").mkdir()     # the README's /tmp/ folders, one per run of this module
    env = _env({"PYTHONPATH": str(dst), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                "XDG_CACHE_HOME": str(base / "cache")})
    env.pop("GPUMEM_SIM_MEMORY", None)
    return dst, env


def tmp_of(clone) -> Path:
    """Where the README's /tmp/ paths point in this test's runs (so that two
    runs of the suite never share a folder)."""
    return clone[0].parent / "tmp"


def run(clone, command: str, timeout: float = 600) -> subprocess.CompletedProcess:
    dst, env = clone
    command = command.replace(" /tmp/", f" {tmp_of(clone)}/")
    proc = subprocess.run(["bash", "-c", command], cwd=dst, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, (command, proc.stdout[-3000:], proc.stderr[-5000:])
    return proc


@pytest.mark.slow
def test_quick_start(clone):
    dst = clone[0]
    out = run(clone, QUICK_START[0])
    assert "fits in 80 GiB: yes" in out.stdout, out.stdout
    assert "numpy" not in out.stderr.lower(), out.stderr   # no stray warning from torch
    summary = run(clone, QUICK_START[1]).stdout
    assert "peak allocated" in summary and "per-step growth" in summary, summary
    diff = run(clone, QUICK_START[2]).stdout
    assert "train.py:" in diff.split("most growth is allocated at")[0], diff
    assert "(library code only)" not in diff, diff
    run(clone, QUICK_START[3])
    assert (dst / "memory.html").stat().st_size > 10_000
    replay = run(clone, QUICK_START[4]).stdout
    assert "settings: expandable_segments:True (given with --conf)" in replay, replay


@pytest.mark.slow
def test_main_job_names_the_leaking_line(clone):
    dst = clone[0]
    before = sorted(p.name for p in dst.iterdir())
    out = run(clone, MAIN_JOB[0])
    demo = tmp_of(clone) / "gpumem_demo"
    assert (demo / "snapshot.pickle").exists() and (demo / "snapshot.html").exists()
    diff = run(clone, MAIN_JOB[1]).stdout
    # nothing lands in the clone (but build/, git-ignored, where a source
    # checkout builds the simulated GPU's libraries on first use)
    assert sorted({p.name for p in dst.iterdir()} - set(before) - {"build"}) == []
    top = diff.split("grew (", 1)[1].splitlines()[2]   # the first row under the header
    line = re.search(r"`(examples/loss_history_leak\.py:\d+)`", README.read_text()).group(1)
    assert f"{line}:main" in top and "(library code only)" not in top, diff
    # the stack under the table ends at that line: torch's frames are not the
    # last thing printed, and the user's line is not cut off below them
    assert diff.rstrip().splitlines()[-1].strip() == f"{line}:main", diff
    assert "fits in 80 GiB: yes" in out.stdout


@pytest.mark.slow
def test_compiled_fit_as_written(clone, compile_caches):
    """The README's compiled question, as written: reduce-overhead (Inductor,
    Triton and CUDA graphs) with gpumem recording, on a simulated L4."""
    dst, env = clone
    env = {**env, **compile_caches}
    proc = subprocess.run(["bash", "-c", COMPILED[0]], cwd=dst, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    out = proc.stdout
    assert "mode=reduce-overhead" in out and "L4" in out, out
    assert re.search(r"^fits in [\d.]+ GiB: yes", out, re.M), out
    first = proc.stderr.splitlines()[0]
    assert first.startswith("gpumem simulate: writing into "), proc.stderr[-3000:]
    folder = Path(first[len("gpumem simulate: writing into "):])
    assert folder.parent == dst.parent / "cache" / "gpumem" / "simulate", folder
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["gpu"]["model"] == "L4" and summary["exit_status"] == 0
    assert len(summary["snapshots"]) == 1, summary["snapshots"]   # compile workers write none


@pytest.mark.slow
def test_ranks_as_written(clone):
    """The README's several-GPUs commands: 2 ranks, one simulated GPU each."""
    out = run(clone, RANKS[0]).stdout
    table = out[out.index("per rank"):].splitlines()
    assert [line.split()[:2] for line in table[2:4]] == [["0", "0"], ["1", "1"]], out
    assert table[2].endswith("yes") and table[3].endswith("yes"), out
    ranks = tmp_of(clone) / "gpumem_ranks"
    for r in (0, 1):
        assert (ranks / f"snapshot_rank{r}.pickle").exists()
        assert (ranks / f"snapshot_rank{r}.html").exists()
        assert (ranks / f"per_rank_rank{r}.pickle").exists()
    summary = run(clone, RANKS[1]).stdout
    assert "snapshot_rank0.pickle" in summary and "snapshot_rank1.pickle" in summary, summary
    assert "examples/per_rank.py:" in summary, summary


@pytest.mark.slow
def test_fit_as_written(clone):
    """The README's largest batch: the boundary and the probe count it states."""
    out = run(clone, FIT[0]).stdout
    m = re.search(r"the largest batch-size that fits is (\d+) \((\d+) does not\), (\d+) probes",
                  out)
    assert m, out
    said = re.search(r"largest batch-size that fits is (\d+) \((\d+) does not\), (\d+) probes",
                     README.read_text())
    assert said and said.groups() == m.groups(), (said and said.groups(), out)


@pytest.mark.slow
def test_world_as_written(clone):
    """The README's cluster-sized command: ranks 0 and 63 of 64, each on its own GPU."""
    out = run(clone, WORLD[0]).stdout
    assert "a job of 64 ranks (8 node(s) x 8), of which 2 started" in out, out
    table = out[out.index("per rank"):].splitlines()
    assert [line.split()[:2] for line in table[2:4]] == [["0", "0"], ["63", "7"]], out
    assert table[2].endswith("yes  (ranks 0)") and table[3].endswith("yes  (ranks 63)"), out
    world = tmp_of(clone) / "gpumem_world"
    assert (world / "per_rank_rank0.pickle").exists() and (world / "per_rank_rank63.pickle").exists()


# Appended to the README's benchmark commands here: fewer repeats and smaller
# workloads, the same code paths. This test checks that each command runs and
# prints what it says (JSON where --json); the figures are the benchmarks' own
# business (docs/benchmarks.md), and full-size runs cost CI 7.6 minutes.
FEWER = {"torch_traces.py": "--only streams10_empty_cache --only stream1_pressure",
         "torch_side_by_side.py": "--repeats 1 --iters 4000",
         "history_overhead.py": "--repeats 1 --iters 4000 --events 20000 --train-blocks 10",
         "viewer_render.py": "--rounds 1",
         "sim_fidelity.py": "--only seed001_linear --only reduce_staging"}


@pytest.mark.slow
def test_benchmarks_run_as_written(clone):
    for command in [c for c in readme_commands() if c.startswith(BENCHMARKS_PREFIX)]:
        script = command[len(BENCHMARKS_PREFIX):].split()[0]
        command = f"{command} {FEWER.get(script, '')}".strip()
        if "viewer_render" in command and shutil.which("chromium") is None:
            proc = subprocess.run(["bash", "-c", command], cwd=clone[0], env=clone[1],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 2 and "chromium is not installed" in proc.stderr
            continue
        if "../shared/snapshots" in command and not (clone[0].parent / "shared").is_dir():
            continue   # the real snapshots live beside the checkout, when they do
        proc = run(clone, command, timeout=900)
        if "--json" in command:
            json.loads(proc.stdout)


@pytest.mark.slow
def test_fast_tier_in_a_clone_named_gpumem(clone):
    dst, env = clone
    env = dict(env, GPUMEM_TEST_SHIM_CACHE=str(Path(env["GPUMEM_CACHE_DIR"])))
    proc = subprocess.run(["bash", "-c", FAST_TIER[0]], cwd=dst, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, textwrap.shorten(proc.stdout[-4000:], 4000)


@pytest.mark.slow
def test_doctor_as_written(clone):
    """Exit 0 on a machine with a GPU, 3 (documented: no GPU here) without one."""
    dst, env = clone
    proc = subprocess.run(["bash", "-c", DOCTOR[0]], cwd=dst, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode in (0, 3), (proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.stdout.splitlines()[-1].startswith("verdict: "), proc.stdout


@pytest.mark.slow
def test_gpu_suite_as_written(clone):
    """tests/gpu as the README runs it: skipped with reasons here, passing on the
    simulated GPU."""
    dst = clone[0]
    for command in GPU_SUITE:
        run(clone, command, timeout=900)
    assert (dst / "gpu.json").exists() or "skipped" in run(clone, GPU_SUITE[0]).stdout
