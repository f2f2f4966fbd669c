"""Snapshots at out of memory, on the simulated GPU: under gpumem.record(...) and
under GPUMEM_OOM_SNAPSHOT=/dir (no code change beyond gpumem.install()), for
an OOM in the forward pass on the main thread and one inside backward, on
torch's autograd device thread.  Each time the file exists before the
exception reaches Python (it holds a tensor that unwinding frees), holds the
oom event, is named in the log and in one extra line of the message, and the
script's own ``except torch.cuda.OutOfMemoryError`` still catches the error.
"""

from __future__ import annotations

import os
import pickle

import pytest

from torch_helpers import run_gm

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

GiB = 1 << 30
MiB = 1 << 20

# Two OOMs on a 4 GiB device. forward_oom(): a 512 MiB temporary lives only
# in the failing frame, so the snapshot shows it only if it was taken before
# the exception unwound. backward_oom(): w (1 GiB) and y = w * 2 (1 GiB) plus
# a 768 MiB hog leave no room for the 1 GiB gradient MulBackward allocates
# on the autograd thread (the CUDA context holds 514 MiB of the 4 GiB).
SCENARIO = '''
import logging, os, pickle, threading, time
records = []
class _Keep(logging.Handler):
    def emit(self, r):
        records.append([r.threadName, r.levelname, r.getMessage()])
logging.getLogger("gpumem").addHandler(_Keep())
logging.getLogger("gpumem").setLevel(logging.INFO)

def forward_oom():
    tmp = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    return torch.empty(4 << 30, dtype=torch.uint8, device="cuda")

def backward_oom():
    w = torch.nn.Parameter(torch.empty(256 << 20, device="cuda"))
    y = w * 2
    loss = y.sum()
    hog = torch.empty(3 << 28, dtype=torch.uint8, device="cuda")
    try:
        loss.backward()
    finally:
        # torch's autograd thread drops its graph task a moment after backward
        # returns; exiting at once can abort in torch (pytorch#190489)
        time.sleep(0.1)

def catch(fn):
    try:
        fn()
    except torch.cuda.OutOfMemoryError as e:
        return str(e).splitlines()
    return None

def oom_events(path):
    with open(path, "rb") as f:
        snap = pickle.load(f)
    blocks = [b["size"] for s in snap["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated"]
    return {"ooms": [e["size"] for t in snap["device_traces"] for e in t
                     if e["action"] == "oom"], "blocks": blocks}
'''


def _check(o, files, main_thread_log, autograd_log):
    fwd, bwd = o["fwd"], o["bwd"]
    assert fwd and bwd, o                    # the script's except caught both
    assert fwd[0].startswith("CUDA out of memory. Tried to allocate 4.00 GiB")
    assert bwd[0].startswith("CUDA out of memory. Tried to allocate 1024.00 MiB")
    assert len(fwd) == 2 and fwd[1] == f"gpumem: memory snapshot at this OOM written to {files[0]}"
    assert len(bwd) == 2 and bwd[1] == f"gpumem: memory snapshot at this OOM written to {files[1]}"
    f0, f1 = o["files"]
    assert 4 * GiB in f0["ooms"] and 512 * MiB in f0["blocks"]   # taken before unwinding
    assert 1 * GiB in f1["ooms"] and 768 * MiB in f1["blocks"]
    # the path is said once, in the message; the log has it at info, from the OOM's thread
    assert not [r for r in o["log"] if r[1] == "WARNING"], o["log"]
    said = [r for r in o["log"] if r[1] == "INFO" and "out of memory" in r[2]]
    assert [r[0] == "MainThread" for r in said] == [main_thread_log, autograd_log], said
    assert files[0] in said[0][2] and files[1] in said[1][2]


def test_oom_under_record_forward_and_backward(tmp_path):
    # install=False: record() installs gpumem itself (no CUDA tensor exists yet)
    o = run_gm(f'''
        with gpumem.record({str(tmp_path / "train.pickle")!r}) as rec:
            assert gpumem.is_installed()
            fwd = catch(forward_oom)
            bwd = catch(backward_oom)
            after = torch.empty(1 << 20, device="cuda")   # the allocator still works
        emit({{"fwd": fwd, "bwd": bwd, "oom": rec.oom_snapshots, "written": rec.written,
              "files": [oom_events(p) for p in rec.oom_snapshots], "log": records}})
    ''', prelude=SCENARIO, install=False, memory="4GiB")
    files = [str(tmp_path / "train_oom.pickle"), str(tmp_path / "train_oom2.pickle")]
    assert o["oom"] == files
    assert o["written"] == files + [str(tmp_path / "train.pickle")]
    _check(o, files, True, False)
    with open(tmp_path / "train.pickle", "rb") as f:
        trace = pickle.load(f)["device_traces"][0]
    ooms = [i for i, e in enumerate(trace) if e["action"] == "oom"]
    assert len(ooms) == 2
    # Between the failure and the unwinding that frees the 512 MiB temporary
    # there is only the snapshot's own marker: writing it allocated nothing.
    after = [(e["action"], e["size"]) for e in trace[ooms[0] + 1:ooms[0] + 3]]
    assert after[0][0] == "snapshot" and after[1] == ("free_requested", 512 * MiB), after


def test_oom_under_env_variable_forward_and_backward(tmp_path):
    d = tmp_path / "ooms"
    o = run_gm('''
        fwd = catch(forward_oom)
        bwd = catch(backward_oom)
        d = os.environ["GPUMEM_OOM_SNAPSHOT"]
        names = sorted(os.listdir(d), key=lambda n: int(n.rsplit("_", 1)[1].split(".")[0]))
        paths = [os.path.join(d, n) for n in names]
        emit({"fwd": fwd, "bwd": bwd, "paths": paths, "pid": os.getpid(),
              "files": [oom_events(p) for p in paths], "log": records,
              "recording": gpumem.recording.history.recording_config()["enabled"]})
    ''', prelude=SCENARIO, memory="4GiB", env={"GPUMEM_OOM_SNAPSHOT": str(d)})
    assert len(o["paths"]) == 2, o["paths"]
    for n, p in enumerate(o["paths"], 1):
        name = os.path.basename(p)
        assert name.startswith("oom_") and name.endswith(f"_{o['pid']}_{n}.pickle"), name
    assert o["recording"] == "all"   # the variable turned recording on, so there is a history
    _check(o, o["paths"], True, False)


def test_oom_snapshots_in_a_shared_sticky_folder_go_to_a_private_one(tmp_path):
    """Issue 34.3: OOM snapshot names are predictable, so GPUMEM_OOM_SNAPSHOT
    naming a folder like /tmp let another user plant a link or a file under
    the next name.  In a sticky, world-writable folder the snapshots go to
    gpumem-oom-<uid> inside it, mode 0700; a folder of that name that is not
    the user's own is refused with one warning and no snapshot."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    o = run_gm('''
        fwd = catch(forward_oom)
        d = os.environ["GPUMEM_OOM_SNAPSHOT"]
        own = os.path.join(d, f"gpumem-oom-{os.geteuid()}")
        emit({"fwd": fwd, "top": sorted(os.listdir(d)), "own": sorted(os.listdir(own)),
              "mode": os.stat(own).st_mode & 0o7777, "log": records})
    ''', prelude=SCENARIO, memory="4GiB", env={"GPUMEM_OOM_SNAPSHOT": str(shared)})
    assert o["fwd"] and o["top"] == [f"gpumem-oom-{os.geteuid()}"], o
    assert len(o["own"]) == 1 and o["own"][0].startswith("oom_") and o["mode"] == 0o700, o
    if os.geteuid() != 0:
        return
    taken = tmp_path / "taken"
    taken.mkdir()
    taken.chmod(0o1777)
    planted = taken / f"gpumem-oom-{os.geteuid()}"
    planted.mkdir()
    os.chown(planted, 65534, 65534)  # 'nobody' made the folder first
    o = run_gm('''
        fwd = catch(forward_oom)
        emit({"fwd": fwd, "armed": gpumem.recording.oom._env_dir,
              "left": sorted(os.listdir(os.environ["GPUMEM_OOM_SNAPSHOT"]))})
    ''', prelude=SCENARIO, memory="4GiB", env={"GPUMEM_OOM_SNAPSHOT": str(taken)})
    assert o["fwd"] and o["armed"] is None, o
    assert o["left"] == [planted.name] and os.listdir(planted) == [], o
    assert not any("snapshot" in line for line in o["fwd"]), o["fwd"]
