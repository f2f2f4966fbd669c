"""Hostile inputs through every command that reads snapshots (summary, diff
as BEFORE and as AFTER, view, replay; text and JSON): exit status 2 with
one error line (or 0 where the input is only odd), no traceback, under
10 s, and a peak RSS under 4x the input's bytes plus 200 MB, each command
measured in a forked child (tests/hostile_inputs.py).

Issue 16.5 to 16.8: the generator's shared-reference bombs, memo-index
bombs, special files and huge integers; and the corruptions of
tests/test_cli_fuzz.py, replay included, in the slow tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hostile_inputs as H

ROOT = Path(__file__).resolve().parent.parent
RUNNER = Path(H.__file__)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    return d, H.make(d)


def run_jobs(jobs: list[dict]) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    env.pop("GPUMEM_TRACEBACK", None)
    proc = subprocess.run([sys.executable, str(RUNNER)], input=json.dumps(jobs), cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout)


def problems(name: str, command: str, res: dict, expected: int, words: str,
             size: int) -> list[str]:
    """What is wrong with one measured command, as lines of a report."""
    where = f"{name} / {command}"
    if res.get("timeout"):
        return [f"{where}: still running after {H.HARD_TIMEOUT} s (a hang)"]
    if res.get("rc") is None:
        return [f"{where}: the child died ({res.get('crashed')}): {res.get('stderr', '')[-500:]}"]
    out, err, bad = res["stdout"], res["stderr"], []
    if res["rc"] != expected:
        bad.append(f"{where}: exit {res['rc']}, expected {expected}: {err[-400:]!r}")
    if "Traceback" in err or "Traceback" in out:
        bad.append(f"{where}: a traceback: {err[-400:]!r}")
    if expected == 2 and res["rc"] == 2:
        lines = err.splitlines()
        if len(lines) != 1 or not lines[0].startswith("gpumem: error: "):
            bad.append(f"{where}: not one error line: {err[-400:]!r}")
        elif words not in lines[0]:
            bad.append(f"{where}: {words!r} not in {lines[0]!r}")
        if out:
            bad.append(f"{where}: output besides the error: {out[:200]!r}")
    if res["seconds"] >= H.TIME_LIMIT:
        bad.append(f"{where}: {res['seconds']:.1f} s (limit {H.TIME_LIMIT} s)")
    limit = 4 * size + H.FIXED_MEMORY
    if res["max_rss"] >= limit:
        bad.append(f"{where}: peak RSS {res['max_rss'] >> 20} MiB, over 4 x {size >> 10} KiB "
                   f"+ {H.FIXED_MEMORY >> 20} MiB")
    return bad


def check_all(cases, jobs):
    results = run_jobs(jobs)
    report = []
    for (name, command, expected, words, size), res in zip(cases, results):
        report += problems(name, command, res, expected, words, size)
    slowest = max(r.get("seconds", 0) for r in results)
    biggest = max(r.get("max_rss", 0) for r in results) >> 20
    print(f"{len(jobs)} commands; slowest {slowest:.2f} s, largest peak RSS {biggest} MiB")
    assert not report, f"{len(report)} problems:\n" + "\n".join(report[:60])


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_every_hostile_input_through_every_command(inputs, tmp_path):
    d, hostile = inputs
    good = str(d / "valid.pickle")
    cases, jobs = [], []
    for h in hostile:
        size = h.size if h.size >= 0 else os.path.getsize(h.path)
        for command in H.COMMANDS:
            expected, words = h.outcome(command)
            both = size + (os.path.getsize(good) if command.startswith("diff") else 0)
            cases.append((h.name, command, expected, words, both))
            jobs.append({"argv": H.argv_for(h, command, good, str(tmp_path / "page.html")),
                         "dir": str(tmp_path / "runs" / str(len(jobs)))})
    assert len({h.name for h in hostile}) == len(hostile) >= 60
    check_all(cases, jobs)


def test_the_generator_covers_what_the_issue_names(inputs):
    names = {h.name for h in inputs[1]}
    for must in ("trace-bomb-10^8", "segment-bomb-10^7", "long-binput-2^29", "fifo-without-writer",
                 "/dev/zero", "int-5000-digits-device_traces.0.1.size", "trace-size-0x8000000000000000",
                 "symlink-to-fifo", "over-the-byte-limit"):
        assert must in names, must
    bomb = next(h for h in inputs[1] if h.name == "trace-bomb-10^8")
    assert os.path.getsize(bomb.path) < 250_000  # the issue's 202 KB file
    memo = next(h for h in inputs[1] if h.name == "long-binput-2^29")
    assert os.path.getsize(memo.path) == 9


@pytest.mark.slow
def test_every_existing_corruption_through_every_command(tmp_path):
    """tests/test_cli_fuzz.py's variants (truncations, bit flips, wrong types,
    globals, ...) measured like the hostile inputs, replay included."""
    import test_cli_fuzz as F
    good = tmp_path / "good.pickle"
    good.write_bytes(F.BLOB)
    cases, jobs = [], []
    for name in sorted(F.VARIANTS):
        vdir = tmp_path / "v" / name
        vdir.mkdir(parents=True)
        path, expected = F.materialise(vdir, name)
        size = path.stat().st_size if path.is_file() else 0
        replay_expected = F.replay_oracle(path) if expected == 0 else 2
        h = H.Hostile(name, str(path), expected, "", per_command={
            "replay": (replay_expected, ""), "replay-json": (replay_expected, "")})
        for command in H.COMMANDS:
            exp, words = h.outcome(command)
            both = size + (good.stat().st_size if command.startswith("diff") else 0)
            cases.append((name, command, exp, words, both))
            jobs.append({"argv": H.argv_for(h, command, str(good), str(tmp_path / "p.html")),
                         "dir": str(tmp_path / "runs" / str(len(jobs)))})
    check_all(cases, jobs)
