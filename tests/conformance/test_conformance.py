"""PyTorch's allocator and memory-history behaviour, checked under torch's
own allocator and under gpumem, on the simulated GPU.

Each cf_*.py module is a group of checks (see harness.py for how a check is
written).  A group runs in one subprocess per variant and allocator
(runner.py): torch's CUDA build imports once and runs every check of the
group, so the suite starts a few dozen processes, not hundreds.  Every check
then becomes one pytest test per allocator, named
``test_conformance[<group>-<variant>-<torch|gpumem>-<check>]``.  The tests
of one subprocess share an xdist_group, so that ``-n 2 --dist loadgroup``
(.ci/torch26) spreads the subprocesses over both workers and runs each once;
under the full suite's ``--dist loadfile`` the file stays on one worker.

The bar: a check that passes under torch's allocator passes under gpumem.
Where gpumem differs on purpose the check is marked @differs(anchor) and
asserts gpumem's own behaviour under gpumem; docs/compatibility.md lists
each such difference under that anchor with the reason
(test_every_difference_is_documented keeps the two in step). A check that
the simulated GPU cannot pass under either allocator is marked
@sim_limit(reason) and expected to fail, strictly: once the simulator can
show the behaviour, the mark must go.

Group modules set, optionally: VARIANTS ({name: extra environment}, default
one variant ""), MEMORY (the simulated device's size, default 80GiB),
EVENTS (the simulator's event mode, default timeline), FAST (the variants
in the fast tier; the others are marked slow), INSTALL_MAY_FAIL,
VARIANT_SINCE ({variant: (release, what)}: the variant's settings need that
torch release; on an older one its checks skip).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import harness  # noqa: E402  (tests/conformance)
import runner  # noqa: E402  (tests/conformance)
from torch_helpers import ROOT, _env, built_shim  # noqa: E402  (tests/)

MODES = ("torch", "gpumem")
COMPAT = ROOT / "docs" / "compatibility.md"


def _group_names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("cf_*.py"))


@functools.lru_cache(maxsize=None)
def _group(name: str):
    return importlib.import_module(name)


def _variants(name: str) -> dict:
    return getattr(_group(name), "VARIANTS", {"": {}})


def _params() -> list:
    out = []
    for g in _group_names():
        mod = _group(g)
        fast = getattr(mod, "FAST", ())
        for variant in _variants(g):
            marks = [] if variant in fast else [pytest.mark.slow]
            for fn in runner.checks_of(mod):
                why = getattr(fn, "sim_limit", None)
                extra = [pytest.mark.xfail(reason=f"simulator: {why}", strict=True)] if why else []
                for mode in MODES:
                    run = f"{g[3:]}-{variant or 'default'}-{mode}"
                    group_mark = pytest.mark.xdist_group(f"conformance-{run}")
                    out.append(pytest.param(g, variant, mode, fn.__name__,
                                            marks=marks + extra + [group_mark],
                                            id=f"{run}-{fn.__name__[6:]}"))
    return out


@functools.lru_cache(maxsize=None)
def _run(group: str, variant: str, mode: str) -> dict:
    """Run one group under one allocator (once per session); {check: result}."""
    mod = _group(group)
    # A variant whose settings this torch lacks skips every check: known
    # from the installed release, without starting a process (runner.py
    # makes the same decision after importing torch).
    gate = getattr(mod, "VARIANT_SINCE", {}).get(variant)
    lacking = gate and harness.older_than(*gate, version=importlib.metadata.version("torch"))
    if lacking:
        return {fn.__name__: {"status": "skip", "detail": lacking} for fn in runner.checks_of(mod)}
    built_shim()
    from gpumem import sim
    env = _env(_variants(group)[variant])
    env = sim.sim_env(memory=getattr(mod, "MEMORY", "80GiB"), events=getattr(mod, "EVENTS", None),
                      base=env)
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    proc = subprocess.run([sys.executable, str(HERE / "runner.py"), group, mode, variant],
                          capture_output=True, text=True, cwd=str(HERE), env=env, timeout=900)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(runner.RESULTS_MARKER):
            return json.loads(line[len(runner.RESULTS_MARKER):])
    return {"__run__": {"status": "fail", "detail": (
        f"exit status {proc.returncode}, no results\n--- stdout\n{proc.stdout[-3000:]}\n"
        f"--- stderr\n{proc.stderr[-6000:]}")}}


@pytest.mark.parametrize("group,variant,mode,check", _params())
def test_conformance(group, variant, mode, check):
    results = _run(group, variant, mode)
    if "__run__" in results:
        pytest.fail(results["__run__"]["detail"], pytrace=False)
    res = results.get(check)
    assert res is not None, f"{check} did not run; results: {sorted(results)}"
    if res["status"] == "skip":
        pytest.skip(res["detail"])
    if res["status"] != "pass":
        pytest.fail(res["detail"], pytrace=False)


def _anchors() -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"></a>', COMPAT.read_text(encoding="utf-8")))


def test_every_difference_is_documented():
    """Each @differs(anchor) names an entry of docs/compatibility.md, and
    each entry there is pinned by a check."""
    used = {}
    for g in _group_names():
        for fn in runner.checks_of(_group(g)):
            if getattr(fn, "differs", None):
                used.setdefault(fn.differs, []).append(f"{g}.{fn.__name__}")
    documented = _anchors()
    assert set(used) <= documented, f"undocumented differences: {set(used) - documented}"
    assert documented <= set(used), f"entries no check pins: {documented - set(used)}"


def test_one_xdist_group_per_subprocess():
    """The checks of one subprocess (group, variant, allocator) share one
    xdist_group and no other subprocess's checks share it: under --dist
    loadgroup each subprocess then runs once, on one worker."""
    runs: dict[str, set] = {}
    for p in _params():
        [mark] = [m for m in p.marks if m.name == "xdist_group"]
        runs.setdefault(mark.args[0], set()).add(p.values[:3])
    assert all(len(r) == 1 for r in runs.values()), {k: r for k, r in runs.items() if len(r) > 1}
    assert len(runs) == sum(len(_variants(g)) * len(MODES) for g in _group_names())
