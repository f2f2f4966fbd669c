"""``gpumem simulate`` (gpumem/sim/command.py, run as ``python -m gpumem.sim.command``):
the script runs unchanged on the simulated GPU with gpumem recording, the
report gives the peaks (kept across reset_peak_memory_stats) and whether the
run fits, the snapshot, its viewer page and summary.json are written, an
uncaught OOM leaves its snapshot in --out, and the exit status is the
script's."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from gpumem.sim import command as simulate
from torch_helpers import _env, built_shim


GiB = 1 << 30


def run_simulate(tmp_path, script, *args, expect_rc=0):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim.command",
                           "--out", str(tmp_path / "out"),
                           *args, "--", sys.executable, str(path)], capture_output=True,
                          text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert proc.returncode == expect_rc, (proc.returncode, proc.stdout[-3000:],
                                          proc.stderr[-5000:])
    return proc


@pytest.mark.slow
def test_uncaught_oom_does_not_fit_and_leaves_its_snapshot(tmp_path):
    built_shim()
    proc = run_simulate(tmp_path, '''
        import torch
        a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.reset_peak_memory_stats()     # the report keeps the peak anyway
        del a
        print("peak after reset", torch.cuda.max_memory_allocated())
        b = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")   # 3 GiB on a 2 GiB GPU
    ''', "--memory", "2GiB", expect_rc=1)
    out = tmp_path / "out"
    assert "torch.OutOfMemoryError" in proc.stderr
    assert f"gpumem: memory snapshot at this OOM written to {out}" in proc.stderr
    assert "fits in 2 GiB: no (1 allocation(s) failed with out of memory)" in proc.stdout
    assert "device 0: allocated 1.00 GiB, reserved 1.00 GiB, 1 OOM(s)" in proc.stdout
    assert "no numerical results" in proc.stdout and "cuDNN RNNs" in proc.stdout
    assert "the CUDA context's memory is an estimate" in proc.stdout
    report = json.loads((out / "summary.json").read_text())
    assert report["exit_status"] == 1 and report["fits"] is False
    assert report["snapshots"] == [str(out / "snapshot.pickle")]
    (oom,) = report["oom_snapshots"]
    assert os.path.dirname(oom) == str(out) and os.path.basename(oom).startswith("oom_")
    for snap in (oom, str(out / "snapshot.pickle")):
        with open(snap, "rb") as f:
            s = pickle.load(f)
        assert any(e["action"] == "oom" and e["size"] == 3 * GiB for e in s["device_traces"][0])
        assert report["views"][snap].endswith(".html") and os.path.exists(report["views"][snap])
    row = report["per_device"][0]
    assert row["peak_allocated"] == GiB and row["num_ooms"] == 1


@pytest.mark.slow
def test_exit_status_is_the_scripts_and_json_report(tmp_path):
    built_shim()
    proc = run_simulate(tmp_path, '''
        import os, sys, torch
        x = torch.ones(10, device="cuda")
        print("leaving without atexit", flush=True)
        os._exit(3)
    ''', "--json", "--memory", "24GiB", expect_rc=3)
    assert proc.stdout.startswith("leaving without atexit\n")
    report = json.loads(proc.stdout.split("\n", 1)[1])
    assert report["exit_status"] == 3 and report["memory"] == 24 * GiB
    assert report["fits"] is None and "did not exit normally" in report["fits_reason"]
    assert report["snapshots"] == [] and "did not exit normally" in report["errors"][0]
    no_torch = run_simulate(tmp_path, "import sys; sys.exit(4)", "--json", expect_rc=4)
    # a command that failed before measuring anything is a failed run, never "unknown"
    failed = json.loads(no_torch.stdout)
    assert failed["verdict"] == "failed" and failed["fits"] is None, failed
    assert failed["fits_reason"].startswith("the command exited with status 4 before any CUDA "
                                            "memory was measured"), failed
    ok = run_simulate(tmp_path, "pass", "--json")
    assert json.loads(ok.stdout)["fits_reason"] == "the command never imported torch"


@pytest.mark.parametrize("var, value, words", [
    ("GPUMEM_ALLOC_CONF", "expandable_segments:Maybe", "GPUMEM_ALLOC_CONF='expandable_segments"),
    ("GPUMEM_ALLOC_CONF", "max_split_size_mb:99999999999999999999", "at least 20"),
    ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:10", "PYTORCH_CUDA_ALLOC_CONF="),
    ("GPUMEM_OOM_RECORDING", "max_entries:²", "GPUMEM_OOM_RECORDING: bad value"),
])
def test_settings_install_would_refuse_are_refused_before_running(tmp_path, monkeypatch, capsys,
                                                                   var, value, words):
    """Issue 16.11: with a bad GPUMEM_ALLOC_CONF the script ran on torch's
    allocator, simulate exited 0 and said "the command never imported torch"."""
    for k in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
              "GPUMEM_OOM_RECORDING", "GPUMEM_OOM_SNAPSHOT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(var, value)
    marker = tmp_path / "ran"
    rc = simulate.main(["--out", str(tmp_path / "out"), "--", sys.executable, "-c",
                        f"open({str(marker)!r}, 'w').close()"])
    err = capsys.readouterr().err
    assert rc == 2 and not marker.exists(), (rc, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumem: error: "), lines
    assert words in lines[0] and "nothing was run" in lines[0], lines[0]


@pytest.mark.slow
def test_a_process_gpumem_cannot_be_installed_in_fails_the_run(tmp_path):
    """When install() fails in the child anyway (here: no shim, and building
    it is forbidden), the report names the process and the run fails."""
    built_shim()
    path = tmp_path / "script.py"
    path.write_text("import torch\nx = torch.ones(4, device='cuda')\nprint('ran')\n")
    env = _env({"GPUMEM_CACHE_DIR": str(tmp_path / "empty-cache"), "GPUMEM_SHIM_BUILD": "0"})
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim.command",
                           "--out", str(tmp_path / "out"),
                           "--json", "--", sys.executable, str(path)], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout.split("ran\n", 1)[1])
    assert report["unrecorded"] == 1 and report["fits"] is None
    assert "could not be installed" in report["fits_reason"]
    assert "gpumem could not be installed" in report["errors"][0]
    assert proc.stderr.splitlines()[-1].startswith("gpumem: error: gpumem could not be installed")


@pytest.mark.slow
def test_a_process_that_never_uses_cuda_is_not_counted_unrecorded(tmp_path):
    """A helper process that imports torch without touching CUDA (checking a
    version, say) cost no device memory: gpumem failing to install there does
    not fail the run, and it says nothing."""
    built_shim()
    helper = tmp_path / "helper.py"
    helper.write_text("import torch\nprint(torch.__version__)\n")
    path = tmp_path / "script.py"
    path.write_text(f"import subprocess, sys\n"
                    f"subprocess.run([sys.executable, {str(helper)!r}], check=True,\n"
                    f"               env=dict(__import__('os').environ, GPUMEM_SHIM_BUILD='0',\n"
                    f"                        GPUMEM_CACHE_DIR={str(tmp_path / 'empty')!r}))\n"
                    f"import torch\nx = torch.ones(4, device='cuda')\n")
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim.command",
                           "--out", str(tmp_path / "out"),
                           "--json", "--", sys.executable, str(path)], capture_output=True,
                          text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert report["unrecorded"] == 0 and report["fits"] is True, report
    assert "could not be installed" not in proc.stderr


def test_without_out_nothing_is_written_into_the_working_directory(tmp_path):
    """Issue 28: the default output went to ./gpumem_simulate, dirtying a
    checkout.  It goes under the user's cache, and the first line says where."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    env = dict(_env(), XDG_CACHE_HOME=str(cache))
    proc = subprocess.run([sys.executable, "-m", "gpumem", "simulate", "--no-view", "--",
                           sys.executable, "-c", "print('hello')"], capture_output=True,
                          text=True, cwd=work, env=env, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert list(work.iterdir()) == []
    first = proc.stderr.splitlines()[0]
    assert first.startswith("gpumem simulate: writing into "), proc.stderr
    out = first[len("gpumem simulate: writing into "):]
    assert os.path.dirname(out) == str(cache / "gpumem" / "simulate"), out
    assert json.loads((cache / "gpumem" / "simulate" / os.path.basename(out)
                       / "summary.json").read_text())["out"] == out


def test_usage_errors(capsys):
    assert simulate.main([]) == 2
    assert "no command given" in capsys.readouterr().err
    assert simulate.main(["--memory", "lots", "--", "python", "x.py"]) == 2
    assert "bad memory size 'lots'" in capsys.readouterr().err
    assert simulate.main(["--max-entries", "0", "--", "python", "x.py"]) == 2
    for size in ("9" * 5000 + "GiB", "٣GiB"):  # int() would raise, or take Arabic digits
        assert simulate.main(["--memory", size, "--", "python", "x.py"]) == 2
        assert "bad memory size" in capsys.readouterr().err


def test_module_has_what_cli_needs():
    import argparse
    p = argparse.ArgumentParser()
    simulate.add_arguments(p)
    args = p.parse_args(["--memory", "8GiB", "--devices", "2", "--", "python", "t.py", "--lr", "1"])
    assert (args.memory, args.devices) == ("8GiB", 2)
    assert [a for a in args.cmd if a != "--"] == ["python", "t.py", "--lr", "1"]
    assert callable(simulate.run) and simulate.HELP


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_a_script_that_turns_recording_off_still_gets_a_full_snapshot(tmp_path):
    """Five of the six seed articles end with _record_memory_history(enabled=None)."""
    built_shim()
    proc = run_simulate(tmp_path, '''
        import torch
        torch.cuda.memory._record_memory_history(max_entries=100000)
        keep = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 8, 64)]
        torch.cuda.memory._dump_snapshot("my_snapshot.pickle")
        torch.cuda.memory._record_memory_history(enabled=None)
    ''')
    out = tmp_path / "out"
    report = json.loads((out / "summary.json").read_text())
    with open(out / "snapshot.pickle", "rb") as f:
        snap = pickle.load(f)
    allocs = [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert sorted(allocs)[-3:] == [1 << 20, 8 << 20, 64 << 20]
    mine = str(tmp_path / "my_snapshot.pickle")
    assert report["script_snapshots"] == [mine] and report["script_stops"] == 1
    assert f"snapshot written by the script: {mine}" in proc.stdout
    assert "turned recording off once; simulate kept recording" in proc.stdout
    page = (out / "snapshot.html").read_text()
    assert '"n_events":' in page and "This snapshot is empty" not in page


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_a_recovered_oom_is_not_a_plain_no_and_its_snapshot_is_named_once(tmp_path):
    built_shim()
    proc = run_simulate(tmp_path, '''
        import torch
        a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        try:
            b = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")   # 3 GiB on a 2 GiB GPU
        except torch.OutOfMemoryError as e:
            print("recovered:", e)
    ''', "--memory", "2GiB")
    report = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert report["fits"] is None and report["verdict"] == "not everything it tried"
    assert ("fits in 2 GiB: not everything it tried (the script ran out of memory once, caught "
            "the error and finished with status 0") in proc.stdout
    (oom,) = report["oom_snapshots"]
    said = (proc.stdout + proc.stderr).count(f"written to {oom}")
    assert said == 1, proc.stdout + proc.stderr


@pytest.mark.slow  # a torch run; the fast tier keeps the other simulate runs
def test_memory_in_decimal_units_reads_as_such(tmp_path):
    built_shim()
    proc = run_simulate(tmp_path, "import torch; x = torch.ones(4, device='cuda')\n",
                        "--memory", "80GB")
    assert "on 1 simulated GPU(s) of 80 GB (74.51 GiB)" in proc.stdout
    assert "KiB" not in proc.stdout.split("peak memory")[0]


@pytest.mark.slow
def test_a_script_that_looks_torch_up_before_importing_it_is_recorded(tmp_path):
    """Libraries (transformers, for one) call importlib.util.find_spec("torch")
    before import torch; the run must still record the script."""
    built_shim()
    proc = run_simulate(tmp_path, '''
        import importlib.util
        assert importlib.util.find_spec("torch") is not None
        assert importlib.util.find_spec("torch") is not None
        import torch
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    ''', "--json")
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert report["fits"] is True, report
    assert report["per_device"] and report["per_device"][0]["peak_allocated"] >= 64 << 20, report
    assert (tmp_path / "out" / "snapshot.pickle").exists()


def test_fits_verdict_leaves_room_for_the_cuda_context():
    # 3 GiB reserved on a 4 GiB GPU fits beside a 512 MiB context, not beside 1.5 GiB
    procs = [{"pid": 1, "devices": {"0": {"allocated": 0, "reserved": 3 * GiB}}}]
    roomy = simulate._report(["x"], 0, 4 * GiB, 1, "out", procs, [], {}, 1.0, context=GiB // 2)
    tight = simulate._report(["x"], 0, 4 * GiB, 1, "out", procs, [], {}, 1.0,
                             context=3 * GiB // 2)
    assert roomy["fits"] is True and tight["fits"] is False, (roomy, tight)
    assert "the CUDA context holds 1.50 GiB" in tight["fits_reason"]
    assert tight["context_memory"] == 3 * GiB // 2


# ------------------------------------------------- what a new user meets (issue 33)

def test_memory_below_the_cuda_context_is_refused_before_running(tmp_path, capsys):
    """--memory under the model's CUDA context (514 MiB on the H100 model)
    would end in torch's 'invalid device ordinal' after a long run."""
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    rc = simulate.main(["--out", str(tmp_path / "out"), "--memory", "200MiB", "--", *cmd])
    err = capsys.readouterr().err
    assert rc == 2 and not marker.exists(), err
    (line,) = err.strip().splitlines()
    assert "200 MiB" in line and "514 MiB" in line and "CUDA context" in line, line
    assert simulate.main(["--out", str(tmp_path / "out"), "--gpu", "L4", "--memory", "100MiB",
                          "--", *cmd]) == 2
    assert "context" in capsys.readouterr().err and not marker.exists()


def _report_text(capsys, report):
    simulate._print_report(report)
    return capsys.readouterr().out


def test_limits_paragraph_only_when_memory_was_measured(capsys):
    never = simulate._report(["python", "t.py"], 1, 80 * GiB, 1, "out", [], [], {}, 0.1)
    no_cuda = simulate._report(["gpumem", "doctor"], 0, 80 * GiB, 1, "out",
                               [{"pid": 1, "devices": {}}], [], {}, 0.1)
    ran = simulate._report(["python", "t.py"], 0, 80 * GiB, 1, "out",
                           [{"pid": 1, "devices": {"0": {"allocated": 1 << 20,
                                                         "reserved": 2 << 20}}}], [], {}, 0.1)
    assert "limits of the simulation" not in _report_text(capsys, never)
    assert "limits of the simulation" not in _report_text(capsys, no_cuda)
    assert "limits of the simulation" in _report_text(capsys, ran)


FAKE_CPU_TORCH = '''
__version__ = "2.14.1+cpu"
class version:
    cuda = None
    hip = None
def zeros(*a, device=None):
    raise AssertionError("Torch not compiled with CUDA enabled")
'''


@pytest.mark.parametrize("which", ["missing", "cpu"])
def test_a_missing_or_cpu_only_torch_is_named_with_how_to_install_it(tmp_path, which):
    script = "import sys\n"
    if which == "missing":   # this environment without its site-packages: no torch at all
        script += "sys.path[:] = [p for p in sys.path if 'packages' not in p]\n"
    else:                    # a CPU-only build of torch shadows the real one
        (tmp_path / "torch").mkdir()
        (tmp_path / "torch" / "__init__.py").write_text(FAKE_CPU_TORCH)
    script += "import torch\ntorch.zeros(1, device='cuda')\n"
    proc = run_simulate(tmp_path, script, expect_rc=1)
    said = [line for line in (proc.stdout + proc.stderr).splitlines()
            if "CUDA build" in line and "pip install" in line]
    assert len(said) == 1, proc.stdout + proc.stderr
    assert ("not installed" if which == "missing" else "2.14.1+cpu") in said[0], said
    assert sys.executable in said[0] or "this environment" in said[0], said
    assert "limits of the simulation" not in proc.stdout


@pytest.mark.slow
def test_peaks_say_what_they_cover_when_the_script_resets_them(tmp_path):
    """examples/compiled_fit.py resets the peaks after its compile step and
    prints its own peak_allocated: simulate's whole-run figure is larger, and
    the report gives both, each named."""
    built_shim()
    proc = run_simulate(tmp_path, '''
        import torch
        warm = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        del warm
        torch.cuda.reset_peak_memory_stats()
        x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        print("script peak", torch.cuda.memory_stats()["allocated_bytes.all.peak"])
    ''', "--no-view")
    script_peak = int(proc.stdout.split("script peak ")[1].split()[0])
    report = json.loads((tmp_path / "out" / "summary.json").read_text())
    (row,) = report["per_device"]
    assert row["peak_allocated"] >= 64 << 20 > script_peak
    assert row["peak_allocated_since_reset"] == script_peak and row["peak_resets"] == 1, row
    line = next(x for x in proc.stdout.splitlines() if x.startswith("  device 0: allocated"))
    assert "peak memory (gpumem's allocator, over the whole run):" in proc.stdout
    assert "reset_peak_memory_stats" in line, line
    assert "8.00 MiB" in line, line
