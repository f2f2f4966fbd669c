"""The command line, ``python -m gpumem``, run in a subprocess as users run it."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpumem.cli import COMMANDS, format_bytes, main

REPO = Path(__file__).resolve().parent.parent
SNAPSHOTS = Path(__file__).parent.parent.parent / "shared" / "snapshots"
REAL = sorted(SNAPSHOTS.glob("*.pickle")) if SNAPSHOTS.is_dir() else []
NOTE = ("no allocation trace recorded; record with "
        "torch.cuda.memory._record_memory_history() before dumping")


def _has_c() -> bool:
    try:
        from gpumem import _C  # noqa: F401
    except ImportError:
        return False
    return True


needs_c = pytest.mark.skipif(not _has_c(), reason="gpumem._C cannot be imported; build it "
                                                   "with 'pip install -e .'")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "gpumem", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_user_error(proc: subprocess.CompletedProcess, fragment: str = "") -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpumem: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    return lines[0]


def _segments():
    return [{"device": 0, "address": 1 << 20, "total_size": 2 << 20, "stream": 0,
             "blocks": [{"size": 1024, "requested_size": 1000, "state": "active_allocated"},
                        {"size": (2 << 20) - 1024, "requested_size": 0, "state": "inactive"}]}]


def _traced_snapshot():
    trace = [{"action": "segment_alloc", "addr": 1 << 30, "size": 20 << 20, "stream": 0},
             {"action": "alloc", "addr": 1 << 30, "size": 5 << 20, "stream": 0},
             {"action": "alloc", "addr": (1 << 30) + (5 << 20), "size": 3000, "stream": 0},
             {"action": "free_requested", "addr": 1 << 30, "size": 5 << 20, "stream": 0},
             {"action": "free_completed", "addr": 1 << 30, "size": 5 << 20, "stream": 0}]
    segs = _segments() + [{"device": 0, "address": 1 << 30, "total_size": 20 << 20,
                           "stream": 0, "blocks": [{"size": 20 << 20, "state": "inactive"}]}]
    return {"segments": segs, "device_traces": [trace]}


@pytest.fixture
def no_trace_file(tmp_path):
    path = tmp_path / "segments_only.pickle"
    path.write_bytes(pickle.dumps({"segments": _segments(), "device_traces": [[]]}, protocol=4))
    return path


def test_no_trace_snapshot_is_not_an_error(no_trace_file):
    proc = run_cli("replay", no_trace_file)
    assert proc.returncode == 0, proc.stderr
    assert NOTE in proc.stdout
    assert proc.stderr == ""


def test_no_trace_snapshot_json(no_trace_file):
    proc = run_cli("replay", no_trace_file, "--json", "--conf", "expandable_segments:True")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report == {"file": str(no_trace_file), "conf": "expandable_segments:True",
                      "conf_source": "given", "devices": [], "note": NOTE}


@needs_c
def test_replay_json(tmp_path):
    path = tmp_path / "traced.pickle"
    path.write_bytes(pickle.dumps(_traced_snapshot(), protocol=4))
    proc = run_cli("replay", path, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    [row] = report["devices"]
    assert row["device"] == 0 and row["events"] == 5 and row["ops"] == 4
    assert row["live_from_start_blocks"] == 1
    assert row["peak_allocated"] == 1024 + (5 << 20) + 3072
    assert row["torch_peak_reserved"] == 22 << 20
    assert row["unknown_frees"] == 0


@needs_c
def test_replay_table(tmp_path):
    path = tmp_path / "traced.pickle"
    path.write_bytes(pickle.dumps(_traced_snapshot(), protocol=4))
    proc = run_cli("replay", path, "--conf", "expandable_segments:True")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "settings: expandable_segments:True" in out
    assert "device 0:" in out
    peak = re.escape(format_bytes(1024 + (5 << 20) + 3072))
    assert re.search(rf"peak allocated +{peak}\n", out)
    assert re.search(r"torch peak reserved +22\.00 MiB \(gpumem/torch \d", out)


@needs_c
@pytest.mark.skipif(not REAL, reason=f"real snapshots not found at {SNAPSHOTS}")
def test_replay_real_snapshot_json():
    path = max(REAL, key=lambda p: p.stat().st_size)
    proc = run_cli("replay", path, "--json", "--conf", "expandable_segments:True")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["devices"] and all(r["unknown_frees"] == 0 for r in report["devices"])


def test_missing_file(tmp_path):
    path = tmp_path / "snapshot.pickle"
    line = assert_user_error(run_cli("replay", path))
    assert line == f"gpumem: error: {path}: file not found"


def test_directory(tmp_path):
    assert_user_error(run_cli("replay", tmp_path), "is a directory")


def test_text_file(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("hello\n")
    assert_user_error(run_cli("replay", path), "is not a pickle file")


def test_truncated_file(tmp_path):
    data = pickle.dumps(_traced_snapshot(), protocol=4)
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[: len(data) // 2])
    assert_user_error(run_cli("replay", path), "is truncated")


class _Marker:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def test_pickle_with_code_is_refused_and_not_run(tmp_path):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [_Marker(str(target))]}, protocol=4))
    assert_user_error(run_cli("replay", path), "refers to Python global")
    assert not target.exists()


def test_wrong_shape(tmp_path):
    snap = _traced_snapshot()
    del snap["device_traces"][0][2]["addr"]
    path = tmp_path / "shape.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    line = assert_user_error(run_cli("replay", path))
    assert line == f"gpumem: error: {path}: device_traces[0][2] has no 'addr'"


def test_bad_conf(no_trace_file):
    assert_user_error(run_cli("replay", no_trace_file, "--conf", "foo:1"),
                      "unknown allocator setting 'foo'")
    assert_user_error(run_cli("replay", no_trace_file, "--conf", "max_split_size_mb:2"),
                      "'max_split_size_mb'")


@pytest.mark.parametrize("args", [(), ("frobnicate",), ("replay",),
                                  ("replay", "a.pickle", "--bogus"), ("--conf",)])
def test_usage_errors(args):
    assert_user_error(run_cli(*args))


def test_help_exits_zero():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "replay" in proc.stdout
    proc = run_cli("replay", "--help")
    assert proc.returncode == 0 and "--conf" in proc.stdout


def test_main_in_process(no_trace_file, capsys):
    assert "replay" in COMMANDS
    assert main(["replay", str(no_trace_file)]) == 0
    assert NOTE in capsys.readouterr().out
    assert main(["replay", str(no_trace_file) + ".missing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumem: error: ") and err.count("\n") == 1


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 5 << 20, 3 << 30, None)] == \
        ["0 B", "1023 B", "1.00 KiB", "5.00 MiB", "3.00 GiB", "-"]


def test_internal_errors_are_one_line(no_trace_file, capsys, monkeypatch):
    def broken(args):
        raise RuntimeError("allocator invariant violated")

    monkeypatch.setitem(COMMANDS, "replay", (COMMANDS["replay"][0], COMMANDS["replay"][1], broken))
    assert main(["replay", str(no_trace_file)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("gpumem: error: internal error (RuntimeError: allocator invariant")
    monkeypatch.setenv("GPUMEM_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        main(["replay", str(no_trace_file)])


def test_version():
    import gpumem
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith(f"gpumem {gpumem.__version__} (Python ")


def test_sizes_in_decimal_units_read_as_such():
    from gpumem._format import format_bytes
    assert format_bytes(80 * 10**9, whole_units=True) == "80 GB (74.51 GiB)"
    assert format_bytes(80 << 30, whole_units=True) == "80 GiB"
    assert format_bytes(512 << 20, whole_units=True) == "512 MiB"
    assert format_bytes(24 * 10**9 + 1, whole_units=True) == "22.35 GiB"


def test_replay_memory_option(tmp_path):
    snap = {"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 3 << 20, "stream": 0},
        {"action": "free_completed", "addr": 4096, "size": 3 << 20, "stream": 0}]]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    proc = run_cli("replay", str(path), "--memory", "24GB")
    assert proc.returncode == 0, proc.stderr
    assert "device memory          24 GB (22.35 GiB) (--memory)" in proc.stdout
    assert "settings: torch defaults (the snapshot records no settings)" in proc.stdout
    proc = run_cli("replay", str(path), "--memory", "lots")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("gpumem: error: --memory: bad memory size 'lots'")
