"""Several simulated GPUs, one per rank: ``gpumem simulate --nproc-per-node N``
(gpumem/sim/torchrun.py, gpumem/sim/rank_report.py) and ``gpumem summary DIR``
(gpumem/snapshots/rank_summary.py).

Fast tests check the arguments (refused before anything runs), the launcher
command built from each form of the script's command, the device count
taken from a torchrun command, the host-memory flags, and ``gpumem summary``
on folders of hand-built per-rank snapshots.  Slow tests run 2 ranks through
torch's elastic launcher under the simulator with gpumem recording: a tiny
DDP job whose ranks peak alike, a job where rank 1 runs out of memory, and a
torchrun command given as it is.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from gpumem.sim import torchrun as _launch, rank_report as _rank_report, command as simulate
from gpumem import cli
from gpumem.snapshots.unpickle import load_snapshot
from sim_helpers import needs_torch, sim_lib_dir
from torch_helpers import _env, built_shim

MiB = 1 << 20
GiB = 1 << 30


# ------------------------------------------------------------ arguments

@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "17", "", "٢"])
def test_bad_nproc_per_node_is_one_line_and_runs_nothing(tmp_path, capsys, value):
    marker = tmp_path / "ran"
    rc = simulate.main(["--out", str(tmp_path / "out"), "--nproc-per-node", value, "--",
                        sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
    err = capsys.readouterr().err
    assert rc == 2 and not marker.exists(), (rc, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumem: error: --nproc-per-node must be"), lines
    assert "nothing was run" in lines[0]
    assert not (tmp_path / "out").exists()


def test_conflicting_devices_and_a_second_launcher_are_refused(tmp_path, capsys):
    marker = tmp_path / "ran"
    script = ["-c", f"open({str(marker)!r}, 'w').close()"]
    rc = simulate.main(["--nproc-per-node", "2", "--devices", "3", "--", sys.executable, *script])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and "--devices 3 conflicts with --nproc-per-node 2" in err[0]
    rc = simulate.main(["--nproc-per-node", "2", "--", "torchrun", "--nproc-per-node", "2", "t.py"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and "already a launcher" in err[0]
    rc = simulate.main(["--nproc-per-node", "2", "--", "python", "-u", "t.py"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and "-u cannot be passed" in err[0]
    assert not marker.exists()


def test_launch_command_from_each_form():
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    assert _launch.launch_command(["t.py", "--lr", "1"], 4) == head + ["t.py", "--lr", "1"]
    assert _launch.launch_command(["python", "t.py"], 4) == head + ["t.py"]
    assert _launch.launch_command([sys.executable, "t.py"], 4) == head + ["t.py"]
    assert _launch.launch_command(["python3.11", "-m", "pkg.train", "-x"], 4) == \
        head + ["-m", "pkg.train", "-x"]
    assert _launch.launch_command(["-m", "pkg.train"], 4) == head + ["-m", "pkg.train"]
    for bad in (["python"], ["-m"], ["python", "-m"]):
        with pytest.raises(_launch.LaunchError):
            _launch.launch_command(bad, 2)


def test_devices_come_from_nproc_or_from_a_torchrun_command():
    assert _launch.devices_for(None, None, ["python", "t.py"]) == 1
    assert _launch.devices_for(3, None, ["python", "t.py"]) == 3
    assert _launch.devices_for(None, 2, ["t.py"]) == 2
    assert _launch.devices_for(2, 2, ["t.py"]) == 2
    assert _launch.devices_for(None, None, ["torchrun", "--nproc-per-node", "4", "t.py"]) == 4
    assert _launch.devices_for(None, None, ["/usr/bin/torchrun", "--standalone",
                                            "--nproc_per_node=3", "t.py"]) == 3
    assert _launch.devices_for(None, None, ["python", "-m", "torch.distributed.run",
                                            "--nproc-per-node", "2", "t.py"]) == 2
    # torchrun's own choices (gpu, auto), the script's own flag, and --devices win or stay 1
    assert _launch.devices_for(None, None, ["torchrun", "--nproc-per-node", "gpu", "t.py"]) == 1
    assert _launch.devices_for(None, None, ["torchrun", "t.py", "--nproc-per-node", "8"]) == 1
    assert _launch.devices_for(1, None, ["torchrun", "--nproc-per-node", "2", "t.py"]) == 1


@pytest.mark.parametrize("flag, nproc, expect", [
    (None, 2, "1"), (False, None, "1"), (True, 2, None), (True, None, None), (False, 2, "1")])
def test_host_memory_flags(flag, nproc, expect):
    env = {_launch.ENV_NO_HOST_MEMORY: "1"} if expect is None else {}
    _launch.host_memory_env(env, flag, nproc)
    assert env.get(_launch.ENV_NO_HOST_MEMORY) == expect


@pytest.mark.parametrize("user", [None, "1", "0"])
def test_host_memory_without_flags_keeps_the_users_value(user):
    """No flag and no --nproc-per-node: GPUMEM_FAKECUDA_NO_HOST_MEMORY as the
    user set it (it used to be dropped, so an explicit 1 was lost)."""
    env = {} if user is None else {_launch.ENV_NO_HOST_MEMORY: user}
    _launch.host_memory_env(env, None, None)
    assert env.get(_launch.ENV_NO_HOST_MEMORY) == user


def test_host_memory_flags_parse_and_exclude_each_other(capsys):
    import argparse
    p = argparse.ArgumentParser()
    simulate.add_arguments(p)
    assert p.parse_args(["--", "t.py"]).host_memory is None
    assert p.parse_args(["--no-host-memory", "--", "t.py"]).host_memory is False
    assert p.parse_args(["--host-memory", "--", "t.py"]).host_memory is True
    with pytest.raises(SystemExit):
        p.parse_args(["--host-memory", "--no-host-memory", "--", "t.py"])
    capsys.readouterr()


def test_per_rank_rows_fit_each_rank_on_its_own():
    rows = [{"pid": 10, "rank": 0, "device": 0, "peak_allocated": GiB, "peak_reserved": GiB,
             "num_ooms": 0},
            {"pid": 11, "rank": 1, "device": 1, "peak_allocated": 3 * GiB,
             "peak_reserved": 3 * GiB, "num_ooms": 0}]
    r = _rank_report.per_rank(rows, [{"pid": 12, "rank": 2, "incomplete": True}], [],
                              memory=4 * GiB, context=512 * MiB)
    assert [(x["rank"], x["fits"]) for x in r["per_rank"]] == [(0, True), (1, True), (2, None)]
    assert r["highest_ranks"] == [1] and r["oom_order"] == []
    assert "unknown (did not finish: the launcher stops every rank" in \
        "\n".join(_rank_report.rank_lines(r))
    r = _rank_report.per_rank(rows, [], [], memory=3 * GiB, context=512 * MiB)
    assert [x["fits"] for x in r["per_rank"]] == [True, False]
    lines = "\n".join(_rank_report.rank_lines(r))
    assert "rank 1 peaks highest (reserved 3.00 GiB)" in lines
    assert "no (peak too high)" in lines
    assert _rank_report.per_rank([dict(rows[0], rank=None)], [], [], GiB, 0)["per_rank"] == []
    # What the driver saw in use at once decides when it is known: rank 0's
    # allocator fits, but with NCCL's buffers beside it the device overflowed.
    over = [dict(rows[0], device_peak=4 * GiB + 1), dict(rows[1], device_peak=3 * GiB)]
    r = _rank_report.per_rank(over, [], [], memory=4 * GiB, context=512 * MiB)
    assert [x["fits"] for x in r["per_rank"]] == [False, True]


def test_rank_of_a_file_name():
    from gpumem._rank import rank_of_path, rank_path
    assert rank_of_path(rank_path("/o/snapshot.pickle", 3)) == 3
    assert rank_of_path("oom_host_12_1_rank10.pickle") == 10
    assert rank_of_path("per_rank_rank0.pkl") == 0 and rank_of_path("rank2.pkl") == 2
    for name in ("snapshot.pickle", "per_rank.pickle", "crank1.pickle", "rank.pickle",
                 "snapshot_pid12.pickle"):
        assert rank_of_path(name) is None, name


# ------------------------------------------------------------ gpumem summary DIR

def _hand_snapshot(dev, sizes, oom=None, script="/x/train.py"):
    """A snapshot in PyTorch's format: one segment holding sizes on device dev,
    allocated at lines 10, 11, ... of script, and an OOM at line 99."""
    frames = lambda line: [{"filename": script, "line": line, "name": "step"}]  # noqa: E731
    traces = [[] for _ in range(dev + 1)]
    base, t, blocks = 0x7f0000000000, 1_000_000, []
    traces[dev].append({"action": "segment_alloc", "addr": base, "size": sum(sizes), "stream": 0,
                        "time_us": t, "frames": frames(1)})
    addr = base
    for i, s in enumerate(sizes):
        t += 10
        traces[dev].append({"action": "alloc", "addr": addr, "size": s, "stream": 0,
                            "time_us": t, "frames": frames(10 + i)})
        blocks.append({"address": addr, "size": s, "requested_size": s,
                       "state": "active_allocated", "frames": frames(10 + i)})
        addr += s
    if oom:
        traces[dev].append({"action": "oom", "addr": 0, "size": oom, "stream": 0,
                            "time_us": t + 5, "device_free": MiB, "frames": frames(99)})
    total = sum(sizes)
    return {"segments": [{"device": dev, "address": base, "total_size": total,
                          "allocated_size": total, "active_size": total,
                          "requested_size": total, "stream": 0, "segment_type": "large",
                          "blocks": blocks}],
            "device_traces": traces}


def _write(path, snap):
    with open(path, "wb") as f:
        pickle.dump(snap, f)


def test_summary_of_a_folder_puts_the_ranks_side_by_side(tmp_path, capsys):
    _write(tmp_path / "snapshot_rank0.pickle", _hand_snapshot(0, [4 * MiB, 2 * MiB]))
    _write(tmp_path / "memory_rank1.pkl", _hand_snapshot(1, [4 * MiB, 8 * MiB], oom=64 * MiB))
    (tmp_path / "notes.txt").write_text("not a snapshot")
    assert cli.main(["summary", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == f"{tmp_path}: 2 snapshot(s), 2 rank(s)"
    r0 = next(line for line in lines if line.endswith("snapshot_rank0.pickle")).split()
    r1 = next(line for line in lines if line.endswith("memory_rank1.pkl")).split()
    # rank, device, peak allocated, peak reserved, allocated at end, largest, OOMs
    assert r0[:2] == ["0", "0"] and r0[2:4] == ["6.00", "MiB"] and r0[8:10] == ["4.00", "MiB"]
    assert r0[10] == "0"
    assert r1[:2] == ["1", "1"] and r1[2:4] == ["12.00", "MiB"] and r1[8:10] == ["8.00", "MiB"]
    assert r1[10] == "1"
    assert "rank 1 peaks highest (peak reserved 12.00 MiB)" in out
    assert "rank 1 ran out of memory (memory_rank1.pkl): asked for 64.00 MiB" in out
    assert "/x/train.py:99" in out and "rank 0 (snapshot_rank0.pickle): 4.00 MiB at /x/train.py:10"\
        in out
    assert cli.main(["summary", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["rank"], r["num_ooms"], r["largest_allocation"]) for r in report["rows"]] == \
        [(0, 0, 4 * MiB), (1, 1, 8 * MiB)]
    assert report["highest_ranks"] == [1] and report["skipped"] == []


def test_summary_of_a_folder_skips_a_corrupt_file_and_names_it(tmp_path, capsys):
    _write(tmp_path / "snapshot_rank0.pickle", _hand_snapshot(0, [MiB]))
    (tmp_path / "snapshot_rank1.pickle").write_bytes(b"\x80\x04truncated")
    assert cli.main(["summary", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "snapshot_rank0.pickle" in out and "snapshot_rank1.pickle" not in out
    (line,) = err.splitlines()
    assert line.startswith("gpumem: warning: skipped snapshot_rank1.pickle: ")
    (tmp_path / "snapshot_rank0.pickle").write_bytes(b"junk")
    assert cli.main(["summary", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpumem: error: no snapshot in ") and "2 skipped" in line


def test_summary_of_an_empty_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "train.log").write_text("x")
    assert cli.main(["summary", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpumem: error: ") and "holds no snapshots" in line
    assert cli.main(["summary", str(tmp_path), "--device", "0"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--device applies to a single snapshot" in line


# ------------------------------------------------------------ 2 ranks (slow)

def _simulate(tmp_path, script, *args, expect_rc=0, cmd=None):
    sim_lib_dir()
    built_shim()
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim.command",
                           "--out", str(tmp_path / "out"),
                           *args, "--", *(cmd or [str(path)])], capture_output=True, text=True,
                          cwd=tmp_path, env=_env(), timeout=400)
    assert proc.returncode == expect_rc, (proc.returncode, proc.stdout[-3000:],
                                          proc.stderr[-5000:])
    return proc, json.loads((tmp_path / "out" / "summary.json").read_text())


DDP = '''
import os, torch, torch.distributed as dist
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
print(f"NOHOST {os.environ.get('GPUMEM_FAKECUDA_NO_HOST_MEMORY')} rank {local}", flush=True)
dist.init_process_group("nccl")
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                        torch.nn.Linear(128, 16)).cuda(), device_ids=[local])
opt = torch.optim.AdamW(model.parameters())
for step in range(2):
    model(torch.randn(16, 128, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
'''


@needs_torch
@pytest.mark.slow
def test_ddp_on_two_ranks_gives_a_row_and_a_snapshot_per_rank(tmp_path, capsys):
    proc, report = _simulate(tmp_path, DDP, "--nproc-per-node", "2", "--memory", "4GiB")
    out = tmp_path / "out"
    assert report["devices"] == 2
    assert report["command"][1:6] == ["-m", "torch.distributed.run", "--standalone",
                                      "--nproc-per-node", "2"]
    assert sorted(proc.stdout.count(f"NOHOST 1 rank {r}") for r in (0, 1)) == [1, 1]
    rows = report["per_rank"]
    assert [(r["rank"], r["device"], r["fits"]) for r in rows] == [(0, 0, True), (1, 1, True)]
    # the same model on both ranks; torch's NCCL watchdog may drop DDP's one
    # gradient bucket (every parameter, 512-byte block) later on one rank
    # than on the other, at a moment of real time (tests/sim/test_nccl.py)
    bucket = -(-4 * (128 * 128 + 128 + 128 * 16 + 16) // 512) * 512
    top = max(r["peak_allocated"] for r in rows)
    assert top > bucket and all(r["peak_allocated"] in (top, top - bucket) for r in rows), \
        [r["peak_allocated"] for r in rows]
    assert rows[0]["peak_reserved"] == rows[1]["peak_reserved"]
    assert report["fits"] is True and report["oom_order"] == []
    # The device peak holds the allocator's segments, the context and the
    # communicator's buffers (simgpu/README.md, "NCCL": 294 MiB for two ranks).
    for r in rows:
        assert r["device_peak"] >= r["peak_reserved"] + report["context_memory"] + 294 * MiB
    table = proc.stdout[proc.stdout.index("per rank"):].splitlines()
    assert table[2].split()[:2] == ["0", "0"] and table[3].split()[:2] == ["1", "1"]
    assert "every rank peaks at the same reserved memory" in proc.stdout
    for r in (0, 1):
        snap = load_snapshot(out / f"snapshot_rank{r}.pickle")
        assert any(e["action"] == "alloc" for e in snap["device_traces"][r])
        assert (out / f"snapshot_rank{r}.html").exists()
    assert cli.main(["summary", str(out)]) == 0
    text = capsys.readouterr().out
    assert "snapshot_rank0.pickle" in text and "snapshot_rank1.pickle" in text
    assert "2 rank(s)" in text


OOM = '''
import os, time, torch
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
print(f"NOHOST {os.environ.get('GPUMEM_FAKECUDA_NO_HOST_MEMORY')}", flush=True)
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
if local == 0:
    open("rank0.tmp", "w").write(str(os.getpid()))
    os.replace("rank0.tmp", "rank0.pid")
else:
    # the launcher stops the other ranks when one fails: let rank 0 finish first
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            pid = int(open("rank0.pid").read())
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break   # exited, not yet reaped
        except OSError:
            break           # exited and reaped
        time.sleep(0.05)
    big = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")   # OOM_LINE
'''
OOM_LINE = next(i for i, line in enumerate(OOM.splitlines(), 1) if "OOM_LINE" in line)


@needs_torch
@pytest.mark.slow
def test_the_rank_that_runs_out_of_memory_is_named_and_leaves_its_snapshot(tmp_path, capsys):
    proc, report = _simulate(tmp_path, OOM, "--nproc-per-node", "2", "--memory", "2GiB",
                             "--host-memory", expect_rc=1)
    out = tmp_path / "out"
    assert proc.stdout.count("NOHOST None") == 2
    rows = {r["rank"]: r for r in report["per_rank"]}
    assert rows[0]["fits"] is True and rows[0]["num_ooms"] == 0
    assert rows[1]["fits"] is False and rows[1]["num_ooms"] == 1
    assert report["fits"] is False and [o["rank"] for o in report["oom_order"]] == [1]
    (oom,) = rows[1]["oom_snapshots"]
    assert os.path.dirname(oom) == str(out) and oom.endswith("_rank1.pickle")
    assert report["oom_snapshots"] == [oom] and os.path.exists(report["views"][oom])
    snap = load_snapshot(oom)
    (event,) = [e for e in snap["device_traces"][1] if e["action"] == "oom"]
    assert event["size"] == 3 * GiB
    where = {(os.path.basename(f["filename"]), f["line"]) for f in event["frames"]}
    assert ("script.py", OOM_LINE) in where, event["frames"]
    lines = proc.stdout.splitlines()
    r0 = next(line for line in lines if line.split()[:2] == ["0", "0"])
    r1 = next(line for line in lines if line.split()[:2] == ["1", "1"])
    assert r0.endswith("yes") and r1.endswith("no (1 OOM(s))")
    assert "ran out of memory first: rank 1" in proc.stdout
    assert cli.main(["summary", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"script.py:{OOM_LINE}" in text and "(OOM snapshot)" in text


TORCHRUN = '''
import os, torch
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.empty((1 + int(os.environ["RANK"])) << 20, dtype=torch.uint8, device="cuda")
'''


@needs_torch
@pytest.mark.slow
def test_a_torchrun_command_keeps_working_and_gives_the_device_count(tmp_path):
    proc, report = _simulate(tmp_path, TORCHRUN, cmd=[
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "script.py"])
    assert report["devices"] == 2
    rows = report["per_rank"]
    assert [(r["rank"], r["device"], r["peak_allocated"]) for r in rows] == \
        [(0, 0, MiB), (1, 1, 2 * MiB)]
    assert report["highest_ranks"] == [1] and "rank 1 peaks highest" in proc.stdout
