"""``gpumem summary`` and ``gpumem diff``: the leak finder, on gpumem snapshots
recorded from Python functions whose lines are known, and on the real
snapshots in ../shared/snapshots.

No torch: a "training loop" drives gpumem._C.Allocator directly on the
simulated device with recording on.  Two bugs from the articles are
reproduced: a loss kept alive by ``loss_history.append(loss)``, and gradients
that stay allocated because ``zero_grad`` is never called.
"""

from __future__ import annotations

import json
import os
import pickle
import sys

import pytest

from gpumem.snapshots import origin, sites
from gpumem import cli

try:
    from gpumem import _C
    from gpumem.recording import history
except ImportError:  # pragma: no cover - the extension is not built
    _C = history = None

needs_c = pytest.mark.skipif(_C is None, reason="gpumem._C is not built (pip install -e .)")

MiB = 1 << 20
HERE = os.path.abspath(__file__)


# ----------------------------------------------------------------- the "model"
# Each allocation site is one line; the tests read its number from the code.

def make_params(a, n, size):
    params = []
    for _ in range(n):
        params.append(a.malloc(size))
    return params


PARAM_LINE = make_params.__code__.co_firstlineno + 3


def forward(a, layers):
    acts = []
    for i in range(layers):
        acts.append(a.malloc((3 + i % 3) * MiB))
    return acts


ACT_LINE = forward.__code__.co_firstlineno + 3


def compute_loss(a):
    return a.malloc(64 * 1024)


LOSS_LINE = compute_loss.__code__.co_firstlineno + 1


def backward(a, params, grads, acts):
    for p in params:
        if grads.get(p) is None:
            grads[p] = a.malloc(8 * MiB)
    tmp = a.malloc(24 * MiB)  # a workspace bigger than anything that leaks
    a.free(tmp)
    for x in acts:
        a.free(x)


GRAD_LINE = backward.__code__.co_firstlineno + 3


def zero_grad(a, grads):
    for g in grads.values():
        a.free(g)
    grads.clear()


def train(a, params, grads, steps, *, loss_history=None, call_zero_grad=True, marker=None):
    for step in range(steps):
        if marker == "metadata":
            history.set_memory_metadata(f"step {step}")
        acts = forward(a, 6)
        loss = compute_loss(a)
        backward(a, params, grads, acts)
        if loss_history is not None:
            loss_history.append(loss)  # the leak: the loss stays allocated
        else:
            a.free(loss)
        if call_zero_grad:
            zero_grad(a, grads)
        if marker == "snapshot":
            history.snapshot()
    if marker == "metadata":
        history.set_memory_metadata("")


def site_label(line, func):
    return f"{HERE}:{line}:{func}"


@pytest.fixture(autouse=True)
def _reset_history():
    if history is not None:
        history.record_memory_history(None)
        history.set_memory_metadata("")
    yield
    if history is not None:
        history.record_memory_history(None)
        history.set_memory_metadata("")


def record_run(tmp_path, *, leak=False, call_zero_grad=True, warmup=2, steps=5,
               marker=None, tag="run"):
    """Run the loop with recording on; returns (before.pickle, after.pickle)."""
    a = _C.Allocator(capacity=1 << 30)
    history.record_memory_history("all", max_entries=100_000)
    params = make_params(a, 4, 16 * MiB)
    grads: dict = {}
    loss_history: list | None = [] if leak else None
    train(a, params, grads, warmup, loss_history=loss_history, call_zero_grad=call_zero_grad,
          marker=marker)
    before = tmp_path / f"{tag}_before.pickle"
    history.dump_snapshot(before)
    train(a, params, grads, steps, loss_history=loss_history, call_zero_grad=call_zero_grad,
          marker=marker)
    after = tmp_path / f"{tag}_after.pickle"
    history.dump_snapshot(after)
    history.record_memory_history(None)
    return before, after


def run_json(capsys, *argv):
    code = cli.main(list(map(str, argv)) + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    return json.loads(out)


# ----------------------------------------------------------------- diff: the leak finder

@needs_c
def test_loss_history_leak_tops_the_diff(tmp_path, capsys):
    before, after = record_run(tmp_path, leak=True, warmup=2, steps=5)
    report = run_json(capsys, "diff", before, after)
    top = report["grew"][0]
    assert (top["filename"], top["line"], top["name"]) == (HERE, LOSS_LINE, "compute_loss")
    assert top["site"] == site_label(LOSS_LINE, "compute_loss")
    assert (top["before_count"], top["after_count"], top["delta_count"]) == (2, 7, 5)
    assert top["delta_bytes"] == 5 * 64 * 1024
    # Nothing else grew: activations, the workspace and the parameters are steady.
    assert report["grew_total"] == 1, report["grew"]
    assert any(f"compute_loss" in line for line in top["stack"])
    assert any(":train" in line for line in top["stack"])


@needs_c
def test_missing_zero_grad_tops_the_diff(tmp_path, capsys):
    before, after = record_run(tmp_path, call_zero_grad=False, warmup=0, steps=3)
    report = run_json(capsys, "diff", before, after)
    top = report["grew"][0]
    assert top["site"] == site_label(GRAD_LINE, "backward")
    assert (top["before_count"], top["after_count"]) == (0, 4)
    assert top["delta_bytes"] == 4 * 8 * MiB
    assert report["grew_total"] == 1


@needs_c
def test_correct_loop_shows_no_growth(tmp_path, capsys):
    before, after = record_run(tmp_path, warmup=1, steps=4)
    report = run_json(capsys, "diff", before, after)
    assert report["grew"] == [] and report["shrank"] == []
    assert report["live_before"] == report["live_after"]
    assert report["live_after"]["count"] == 4  # the parameters
    code = cli.main(["diff", str(before), str(after)])
    out = capsys.readouterr().out
    assert code == 0 and "nothing grew" in out


@needs_c
def test_diff_text_names_the_line_first(tmp_path, capsys):
    before, after = record_run(tmp_path, leak=True, warmup=1, steps=3)
    assert cli.main(["diff", str(before), str(after), "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    grew = next(i for i, line in enumerate(out) if line.startswith("grew"))
    first = out[grew + 2]
    assert first.split()[0] == "+192.00" and f":{LOSS_LINE}:compute_loss" in first, out
    assert f"test_summary_diff.py:{LOSS_LINE}:compute_loss" in "\n".join(out)


@needs_c
def test_diff_reversed_shows_shrinkage(tmp_path, capsys):
    before, after = record_run(tmp_path, leak=True, warmup=1, steps=3)
    report = run_json(capsys, "diff", after, before)
    assert report["grew"] == []
    assert report["shrank"][0]["site"] == site_label(LOSS_LINE, "compute_loss")
    assert report["shrank"][0]["delta_count"] == -3


@needs_c
def test_diff_device_filter(tmp_path, capsys):
    before, after = record_run(tmp_path, leak=True, warmup=1, steps=2)
    report = run_json(capsys, "diff", before, after, "--device", "0")
    assert report["device"] == 0 and report["grew"][0]["delta_count"] == 2
    assert cli.main(["diff", str(before), str(after), "--device", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumem: error: ") and "no data for device 3" in err


# ----------------------------------------------------------------- summary

@needs_c
@pytest.mark.parametrize("marker,source", [("metadata", "user_metadata changes"),
                                           ("snapshot", "'snapshot' trace entries")])
def test_summary_steps_show_the_leak(tmp_path, capsys, marker, source):
    _before, after = record_run(tmp_path, leak=True, warmup=0, steps=6, marker=marker)
    report = run_json(capsys, "summary", after, "--top", "5")
    (dev,) = report["devices"]
    assert dev["source"] == "trace" and dev["step_markers"] == source
    growth = [s["growth"] for s in dev["steps"] if s["allocations"]]
    assert len(growth) >= 5
    # Every step leaves one loss behind (the first also keeps the gradients).
    assert all(g == 64 * 1024 for g in growth[1:5]), growth
    top = dev["step_growth_sites"][0]
    assert top["site"] == site_label(LOSS_LINE, "compute_loss") and top["delta_count"] >= 4


@needs_c
def test_summary_peak_and_sites(tmp_path, capsys):
    _before, after = record_run(tmp_path, call_zero_grad=False, warmup=0, steps=3)
    report = run_json(capsys, "summary", after, "--top", "5")
    (dev,) = report["devices"]
    params, grads = 4 * 16 * MiB, 4 * 8 * MiB
    acts = sum((3 + i % 3) * MiB for i in range(6))
    # The peak: parameters, gradients, the activations and the loss, plus the workspace.
    assert dev["peak_allocated"] == params + grads + acts + 64 * 1024 + 24 * MiB
    assert dev["peak_reserved"] >= dev["peak_allocated"]
    assert dev["fragmentation_at_peak"] == dev["reserved_at_peak"] - dev["peak_allocated"]
    by_peak = {r["site"]: r["bytes"] for r in dev["top_live_at_peak"]}
    assert by_peak[site_label(PARAM_LINE, "make_params")] == params
    assert by_peak[site_label(GRAD_LINE, "backward")] == grads
    totals = dev["top_total_allocated"]
    assert totals[0]["site"] == site_label(ACT_LINE, "forward")
    assert totals[0]["bytes"] == 3 * acts and totals[0]["count"] == 18
    assert dev["at_snapshot"]["allocated"] == params + grads
    assert len(dev["top_live_at_peak"]) == 5
    assert run_json(capsys, "summary", after, "--top", "2")["devices"][0]["top_live_at_peak"][
        1]["site"] == site_label(GRAD_LINE, "backward")


@needs_c
def test_summary_text(tmp_path, capsys):
    _before, after = record_run(tmp_path, leak=True, warmup=0, steps=4, marker="metadata")
    assert cli.main(["summary", str(after)]) == 0
    out = capsys.readouterr().out
    for text in ("peak allocated:", "peak reserved:", "reserved but unallocated at peak:",
                 "top sites by bytes live at peak:", "top sites by total bytes allocated:",
                 "per-step growth (markers: user_metadata changes):", "step 3",
                 f"test_summary_diff.py:{LOSS_LINE}:compute_loss"):
        assert text in out, (text, out)


def test_summary_of_a_segments_only_snapshot(tmp_path, capsys):
    snap = {"segments": [{"device": 1, "address": 1 << 30, "total_size": 4 * MiB, "stream": 0,
                          "blocks": [{"size": MiB, "requested_size": MiB - 5,
                                      "state": "active_allocated",
                                      "frames": [{"filename": "/u/train.py", "line": 7,
                                                  "name": "step"}]},
                                     {"size": MiB, "state": "active_pending_free"},
                                     {"size": 2 * MiB, "state": "inactive"}]}],
            "device_traces": []}
    path = tmp_path / "segs.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    report = run_json(capsys, "summary", path)
    (dev,) = report["devices"]
    assert dev["device"] == 1 and dev["source"] == "segments"
    assert dev["peak_allocated"] == MiB and dev["peak_reserved"] == 4 * MiB
    assert dev["fragmentation_at_peak"] == 3 * MiB
    assert dev["at_snapshot"]["pending_free"] == MiB
    assert dev["top_live_at_peak"][0]["site"] == "/u/train.py:7:step"
    assert dev["top_live_at_peak"][0]["bytes"] == MiB - 5
    assert cli.main(["summary", str(path)]) == 0   # no trace: no peak is claimed
    text = capsys.readouterr().out
    assert "reserved but unallocated at the snapshot: 3.00 MiB" in text, text
    assert "at peak" not in text and "peak reserved" not in text, text


def test_optimizer_step_regions_are_step_markers(tmp_path, capsys):
    """torch records "Optimizer.step#..." regions by itself: their ENDs split the steps."""
    trace, t, anns = [], 1000, []
    for step in range(4):
        for k in range(3):  # two allocations freed, one kept (a leak) per step
            addr = (1 << 30) + (step * 3 + k) * MiB
            trace.append({"action": "alloc", "addr": addr, "size": MiB, "stream": 0,
                          "time_us": t, "frames": [{"filename": "/u/t.py", "line": 10 + k,
                                                    "name": "f"}]})
            t += 10
        for k in range(2):
            trace.append({"action": "free_completed", "addr": (1 << 30) + (step * 3 + k) * MiB,
                          "size": MiB, "stream": 0, "time_us": t})
            t += 10
        anns += [{"name": "Optimizer.step#SGD.step", "stage": "START", "device": 0,
                  "time_us": t - 5},
                 {"name": "Optimizer.step#SGD.step", "stage": "END", "device": 0,
                  "time_us": t - 1}]
    snap = {"segments": [], "device_traces": [trace], "external_annotations": anns}
    path = tmp_path / "opt.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    (dev,) = run_json(capsys, "summary", path)["devices"]
    assert dev["step_markers"] == "ends of Optimizer.step regions"
    # numbered as the loop counts them: the k-th Optimizer.step ends step k
    assert [s["label"] for s in dev["steps"]] == ["step 1", "step 2", "step 3", "step 4"]
    assert [s["growth"] for s in dev["steps"]] == [MiB] * 4
    assert dev["step_growth_sites"][0]["site"] == "/u/t.py:12:f"
    assert dev["step_growth_sites"][0]["delta_count"] == 3
    # what runs after the last optimizer step (a validation pass) is not a fifth step
    trace.append({"action": "alloc", "addr": 1 << 31, "size": MiB, "stream": 0,
                  "time_us": t + 10, "frames": [{"filename": "/u/t.py", "line": 30,
                                                 "name": "val"}]})
    path.write_bytes(pickle.dumps(snap, protocol=4))
    (dev,) = run_json(capsys, "summary", path)["devices"]
    assert [s["label"] for s in dev["steps"]] == [
        "step 1", "step 2", "step 3", "step 4", "after step 4"]
    # gpumem.record's own markers (rec.step(), counted from 0 as a for loop counts)
    # win over torch's Optimizer.step regions, and the summary prints labels whole
    for k in range(4):
        anns.append({"name": f"step {k}", "stage": "START", "device": 0,
                     "time_us": trace[k * 5]["time_us"] - 1})
    long_name = "a user's own marker that is longer than any column"
    trace.append({"action": "alloc", "addr": (1 << 31) + MiB, "size": MiB, "stream": 0,
                  "time_us": t + 20})
    anns.append({"name": long_name, "stage": "START", "device": 0, "time_us": t + 15})
    path.write_bytes(pickle.dumps(snap, protocol=4))
    (dev,) = run_json(capsys, "summary", path)["devices"]
    assert [s["label"] for s in dev["steps"]] == ["step 0", "step 1", "step 2", "step 3"]
    assert dev["step_markers"] == "gpumem.record's steps"
    del anns[-5:-1]   # without record's markers: every START, names whole in the text
    anns[:] = [a for a in anns if not a["name"].startswith("Optimizer")]
    path.write_bytes(pickle.dumps(snap, protocol=4))
    assert cli.main(["summary", str(path)]) == 0
    assert long_name in capsys.readouterr().out


def test_sites_skip_library_frames():
    st = sites.StackTable()
    user = {"filename": "/home/u/proj/train.py", "line": 12, "name": "step"}
    frames = [{"filename": "/venv/lib/python3.11/site-packages/torch/nn/functional.py",
               "line": 5, "name": "linear"},
              {"filename": "/usr/lib/python3.11/contextlib.py", "line": 81, "name": "inner"},
              {"filename": "/venv/lib/python3.11/site-packages/einops/einops.py", "line": 3,
               "name": "rearrange"},
              user, {"filename": "/home/u/proj/main.py", "line": 1, "name": "<module>"}]
    site = st.site_of_stack(st.intern(frames))
    assert site["label"] == ("/home/u/proj/train.py:12:step (via "
                             "/venv/lib/python3.11/site-packages/einops/einops.py:3:rearrange)")
    assert (site["filename"], site["line"]) == ("/home/u/proj/train.py", 12)
    cpp = [{"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
           {"filename": "??", "line": 0, "name": "at::_ops::empty_strided::call(x)"},
           {"filename": "??", "line": 0, "name": "at::_ops::_to_copy::call(x)"},
           {"filename": "", "line": 0,
            "name": "torch::autograd::generated::ToCopyBackward0::apply(y)"}]
    assert st.site_of_stack(st.intern(cpp))["label"] == "[C++] ToCopyBackward0 aten::_to_copy"
    lib_only = [frames[0], frames[1]]
    assert st.site_of_stack(st.intern(lib_only))["kind"] == "library"
    win = [{"filename": "C:\\venv\\Lib\\site-packages\\torch\\nn\\modules\\module.py",
            "line": 1, "name": "_call_impl"},
           {"filename": "D:\\proj\\model.py", "line": 9, "name": "forward"}]
    assert st.site_of_stack(st.intern(win))["label"] == "D:\\proj\\model.py:9:forward"
    assert st.site_of_stack(st.intern([]))["label"] == "<no stack recorded>"


# ----------------------------------------------------------------- real snapshots

def real_snapshot_names() -> list[str]:
    """The files in ../shared/snapshots (the conftest fixture skips when it is absent)."""
    root = os.path.dirname(os.path.dirname(HERE))
    path = os.environ.get("GPUMEM_SNAPSHOTS") or os.path.join(os.path.dirname(root), "shared",
                                                              "snapshots")
    names = sorted(f for f in os.listdir(path) if f.endswith(".pickle")) \
        if os.path.isdir(path) else []
    return names or ["(none)"]


REAL_NAMES = real_snapshot_names()


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_NAMES)
def test_summary_and_diff_on_real_snapshots(shared_snapshots, capsys, name):
    path = os.path.join(shared_snapshots, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not in {shared_snapshots}")
    report = run_json(capsys, "summary", path, "--top", "5")
    assert report["devices"] or report["note"]
    for dev in report["devices"]:
        assert dev["peak_allocated"] >= 0
        assert dev["peak_allocated"] >= sum(r["bytes"] for r in dev["top_live_at_peak"])
        if dev["fragmentation_at_peak"] is not None:
            assert dev["fragmentation_at_peak"] >= 0
    assert cli.main(["summary", path]) == 0
    assert capsys.readouterr().err == ""
    # A snapshot against itself: nothing grows or shrinks.
    same = run_json(capsys, "diff", path, path)
    assert same["grew"] == [] and same["shrank"] == []
    assert cli.main(["diff", path, path, "--top", "2"]) == 0
    assert capsys.readouterr().err == ""


def test_diff_between_two_real_snapshots(shared_snapshots, capsys):
    a = os.path.join(shared_snapshots, "Muduard__dump_snapshot__3f83a65b.pickle")
    b = os.path.join(shared_snapshots, "Muduard__dump_snapshot__7bced596.pickle")
    if not (os.path.exists(a) and os.path.exists(b)):
        pytest.skip("the two Muduard snapshots are not there")
    report = run_json(capsys, "diff", a, b, "--top", "5")
    assert report["sites_compared"] > 0
    assert report["live_after"]["count"] > 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# A user's own code in folders named like each library package, on POSIX and
# Windows, beside the same packages installed (gpumem/snapshots/origin.py).
USER_FILES = [f"/home/u/{name}/train.py" for name in ("torch", "torchgen", "functorch",
                                                      "triton", "gpumem")] + [
    "/home/u/gpumem/examples/loss_history_leak.py", "/srv/gpumem/gpumem/train.py",
    "/work/torch/nn/my_layer.py", "/home/u/lib/python3.11/my_model.py",
    "D:\\proj\\Lib\\model.py", "C:\\Users\\u\\torch\\train.py"]
LIBRARY_FILES = [
    "/venv/lib/python3.11/site-packages/torch/nn/functional.py",
    "/usr/lib/python3/dist-packages/torch/_tensor.py",
    "/opt/conda/lib/python3.10/site-packages/triton/runtime/jit.py",
    "/opt/conda/lib/python3.10/site-packages/torchgen/model.py",
    "/opt/conda/lib/python3.10/site-packages/functorch/__init__.py",
    "/venv/lib/python3.12/site-packages/gpumem/recording/recorder.py",
    "C:\\venv\\Lib\\site-packages\\torch\\nn\\modules\\module.py",
    "/usr/lib/python3.11/contextlib.py", "/opt/py/lib/python3.13t/threading.py",
    "C:\\Python311\\Lib\\contextlib.py", "C:\\Python311\\Lib\\asyncio\\events.py",
    "/tmp/torchinductor_u/ab/cabc.py", "<frozen runpy>",
    os.path.join(os.path.dirname(origin.__file__), "summary.py"),   # this gpumem
]


@pytest.mark.parametrize("path", USER_FILES)
def test_user_code_in_folders_named_like_libraries(path):
    assert not origin.is_library_file(path)
    st = sites.StackTable()
    frames = [{"filename": LIBRARY_FILES[0], "line": 5, "name": "linear"},
              {"filename": path, "line": 12, "name": "step"}]
    site = st.site_of_stack(st.intern(frames))
    assert (site["kind"], site["label"]) == ("user", f"{path}:12:step")


@pytest.mark.parametrize("path", LIBRARY_FILES)
def test_installed_libraries_are_library_code(path):
    assert origin.is_library_file(path)


def test_a_package_beside_this_interpreters_stdlib_is_not_the_stdlib():
    import sysconfig
    stdlib = sysconfig.get_paths()["stdlib"]
    assert origin.is_library_file(os.path.join(stdlib, "contextlib.py"))
    st = sites.StackTable()
    einops = os.path.join(stdlib, "site-packages", "einops", "einops.py")
    frames = [{"filename": einops, "line": 3, "name": "rearrange"},
              {"filename": "/home/u/proj/train.py", "line": 12, "name": "step"}]
    assert st.site_of_stack(st.intern(frames))["label"] == (
        f"/home/u/proj/train.py:12:step (via {einops}:3:rearrange)")


def test_diff_stack_ends_at_the_users_line():
    """The stack under 'most growth is allocated at' was the innermost 8
    frames: with torch's module calls in between, all 8 were torch's and the
    user's line, named in the table above it, was cut off."""
    from gpumem.cli import _stack_to_site
    lib = [f"/site-packages/torch/m{i}.py:{i}:f{i}" for i in range(10)]
    user = "train.py:52:main"
    deep = lib + [user, "train.py:80:<module>"]
    assert _stack_to_site(deep, user, "user") == lib[:3] + ["... 7 library frames ...", user]
    shallow = lib[:2] + [user, "train.py:80:<module>"]
    assert _stack_to_site(shallow, user, "user") == lib[:2] + [user]
    via = f"{user} (via /site-packages/accelerate/x.py:3:g)"
    assert _stack_to_site(deep, via, "user")[-1] == user
    # beyond the lines the report keeps: the site's frame still closes the list
    assert _stack_to_site(lib, user, "user") == lib[:3] + ["... more frames ...", user]
    assert _stack_to_site(lib, lib[0] + " (library code only)", "library") == lib[:8]
