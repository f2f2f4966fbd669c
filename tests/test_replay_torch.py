"""Replay against torch's own allocator under pressure.

benchmarks/torch_traces.py records traces with torch 2.14.1's caching
allocator on the simulated GPU: ten streams with cross-stream frees and
empty_cache, devices small enough that torch releases its cache and retries,
with and without expandable segments.  Replayed under the settings they were
recorded with, gpumem's peak reserved must be within 1% of torch's, and at or
below it with expandable segments (gpumem/snapshots/replay.py, Note [Replaying
releases]).  Without the releases the first trace replays at 1.41x torch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpumem.snapshots.unpickle import load_snapshot
from gpumem.snapshots.replay import build_ops, recorded_conf, replay_device

from sim_helpers import sim_lib_dir
from torch_helpers import ROOT, _env

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

WORKLOADS = ["streams10_empty_cache", "streams10_pressure", "streams4_pressure_expandable"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    sim_lib_dir()
    out = tmp_path_factory.mktemp("torch_traces")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "torch_traces.py"), str(out)]
    for name in WORKLOADS:
        cmd += ["--only", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", WORKLOADS)
def test_replay_matches_torch_under_pressure(traces, name):
    snap = load_snapshot(traces / f"{name}.pickle")
    ops = build_ops(snap, 0)
    assert ops.torch_peak_reserved is not None and ops.releases > 0
    conf, source = recorded_conf(snap)
    assert source == "from the snapshot's allocator_settings"
    assert conf["expandable_segments"] == name.endswith("expandable")
    row = replay_device(ops, conf)
    assert row["unknown_frees"] == 0
    ratio = row["ratio_vs_torch"]
    if conf["expandable_segments"]:
        assert ratio <= 1.0, row
    else:
        assert abs(ratio - 1.0) <= 0.01, row
    if ops.trace_ooms:   # the capacity is the recording device's, from its OOM entries
        assert row["capacity_source"] == "trace" and row["replay_ooms"] == 0
    assert ops.trace_ooms or name != "streams10_pressure"
