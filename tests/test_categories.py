"""Memory by category (gpumem/categories/classify.py, gpumem/categories/tagger.py,
gpumem/categories/report.py): the resolution on hand-built traces, and a
Transformer + AdamW loop on the simulated GPU checked against arithmetic from
the model and against torch's _memory_viz."""

from __future__ import annotations

import pytest

from gpumem.categories.classify import CATEGORIES, block_categories, resolve_device

from torch_helpers import TRANSFORMER, run_gm

C = CATEGORIES.index


def ev(action, addr, size=512):
    return {"action": action, "addr": addr, "size": size, "stream": 0}


def test_category_follows_the_allocation_not_the_address():
    # a gradient at 0x1000 freed (zero_grad(set_to_none=True)), then an
    # activation gets the same block in the next forward
    events = [ev("alloc", 0x1000), ev("free_requested", 0x1000), ev("free_completed", 0x1000),
              ev("alloc", 0x1000), ev("alloc", 0x2000)]
    first = 100
    tags = [(101, 0x1000, "gradient"), (104, 0x1000, "activation")]
    phases = [(100, "backward"), (103, "forward")]
    cats, phs, pre = resolve_device(events, first, tags, phases)
    # 0x2000: allocated in forward and alive at the end of the trace, no backward yet
    assert cats == [C("gradient"), C("gradient"), C("gradient"), C("activation"),
                    C("activation")]
    assert [("other", "forward", "backward", "optimizer")[p] for p in phs] == [
        "backward", "backward", "backward", "forward", "forward"]
    assert pre == {}


def test_tags_made_before_an_event_name_the_allocation_live_then():
    # the tag at seq 1 is before the free at seq 1: it names the first alloc;
    # a tag made after the free finds nothing live and is dropped
    events = [ev("alloc", 0x1000), ev("free_requested", 0x1000), ev("free_completed", 0x1000)]
    cats, _, _ = resolve_device(events, 0, [(1, 0x1000, "parameter")], [])
    assert cats == [C("parameter")] * 3
    cats, _, pre = resolve_device(events, 0, [(3, 0x1000, "parameter")], [])
    assert cats == [C("unknown")] * 3 and pre == {0x1000: "parameter"}


def test_stronger_role_wins_and_blocks_before_the_window_keep_their_tags():
    events = [ev("alloc", 0x3000), ev("free_requested", 0x5000), ev("free_completed", 0x5000)]
    tags = [(1, 0x3000, "activation"), (1, 0x3000, "parameter"), (0, 0x4000, "optimizer_state"),
            (0, 0x5000, "input")]
    cats, _, pre = resolve_device(events, 0, tags, [(0, "optimizer")])
    assert cats[0] == C("parameter")
    assert cats[1] == cats[2] == C("input")      # allocated before the window, freed in it
    assert pre[0x4000] == "optimizer_state"
    segs = [{"device": 0, "address": 0x3000, "blocks": [
        {"address": 0x3000, "size": 0x1000, "state": "active_allocated"},
        {"address": 0x4000, "size": 0x1000, "state": "active_allocated"},
        {"address": 0x5000, "size": 0x1000, "state": "inactive"},
        {"address": 0x6000, "size": 0x1000, "state": "active_allocated"}]}]
    assert block_categories(segs, [events], [cats], [pre]) == [
        [C("parameter"), C("optimizer_state"), None, C("unknown")]]


def test_untagged_allocations_take_their_phase():
    events = [ev("alloc", a) for a in (1, 2, 3, 4)]
    phases = [(1, "forward"), (2, "backward"), (3, "optimizer")]
    cats, _, _ = resolve_device(events, 0, [], phases)
    # the step has not ended in the trace: its allocation is a temporary
    assert [CATEGORIES[c] for c in cats] == ["unknown", "activation", "autograd_detail",
                                             "temporary"]


def test_forward_allocations_alive_at_backward_are_activations():
    # seq 0..: forward allocates 1, 2, 3; 2 is freed before backward starts
    # (seq 5), 1 during backward, 3 never; then backward allocates 4 and a
    # step allocates 5 (freed in it) and 6 (kept: state)
    events = [ev("alloc", 1), ev("alloc", 2), ev("alloc", 3), ev("free_requested", 2),
              ev("free_completed", 2), ev("alloc", 4), ev("free_requested", 1),
              ev("free_completed", 1), ev("alloc", 5), ev("alloc", 6), ev("free_requested", 5),
              ev("free_completed", 5), ev("alloc", 7)]
    phases = [(0, "forward"), (5, "backward"), (8, "optimizer"), (12, "other")]
    cats, _, _ = resolve_device(events, 0, [], phases)
    got = {e["addr"]: CATEGORIES[c] for e, c in zip(events, cats) if e["action"] == "alloc"}
    assert got == {1: "activation", 2: "temporary", 3: "activation", 4: "autograd_detail",
                   5: "temporary", 6: "optimizer_state", 7: "unknown"}
    # the next forward's allocations are judged against the next backward
    events2 = events + [ev("alloc", 8), ev("free_requested", 8), ev("free_completed", 8),
                        ev("alloc", 9), ev("alloc", 10)]
    phases2 = phases + [(13, "forward"), (17, "backward")]
    cats, _, _ = resolve_device(events2, 0, [], phases2)
    assert [CATEGORIES[c] for c in cats[13:]] == ["temporary"] * 3 + ["activation",
                                                                      "autograd_detail"]
    # 1 was freed in the first backward; 3 is still alive when the second
    # starts: kept from step to step, not an activation of its step
    assert CATEGORIES[cats[0]] == "activation" and CATEGORIES[cats[2]] == "unknown"


def test_allocations_of_the_cublas_handle_pool_are_workspaces():
    blas = [{"name": "at::cuda::getCurrentCUDABlasHandle(bool)", "filename": "??", "line": 0}]
    events = [dict(ev("alloc", 1), frames=blas), dict(ev("alloc", 2), frames=blas),
              ev("alloc", 3), ev("free_requested", 2), ev("free_completed", 2)]
    cats, _, _ = resolve_device(events, 0, [], [(0, "forward"), (4, "backward")])
    # 2 was freed before backward (not a workspace torch keeps), 3 has no such frame
    assert [CATEGORIES[c] for c in cats[:3]] == ["workspace", "temporary", "activation"]


# On the simulated GPU: OUT holds what the bars are checked against.
LOOP = '''
import pickle, tempfile, os
import gpumem.recording.history as h
from gpumem.snapshots.timeline import build_device
from gpumem.categories import report as cr
from gpumem.categories.classify import PHASES, TABLE_KEY
model, opt = make_model()
x = torch.randn(8, 16, 64, device="cuda")
def steps(n):
    for _ in range(n):
        train_step(model, opt, x)
h.record_memory_history("all", clear_history=True)
steps(1)
plain = h.snapshot()
h.record_memory_history("all", categories=True, clear_history=True)
steps(3)
snap = h.snapshot()
h.record_memory_history(None)
m = build_device(snap, 0)
cats = cr.allocation_categories(snap, m)
phases = snap[TABLE_KEY]["trace_phases"][0]
opt_at = [i for i, p in enumerate(phases) if PHASES[p] == "optimizer"]
ends_of_backward = [i - 1 for i in opt_at if i > 0 and PHASES[phases[i - 1]] == "backward"]
from torch.cuda import _memory_viz as mv
html = mv.trace_plot(snap) + mv.segment_plot(snap)
text = mv.segsum(snap) + mv.trace(snap)
emit({"peak": m.peak, "at_peak": cr.breakdown(m, cats, m.peak_index),
      "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
      "grads_end_of_backward": [cr.breakdown(m, cats, i)["gradient"] for i in ends_of_backward],
      "state_after_steps": [cr.breakdown(m, cats, i)["optimizer_state"] for i in opt_at[-1:]],
      "state_end": cr.breakdown(m, cats, m.n_events - 1)["optimizer_state"],
      "plain_keys": sorted(plain), "cat_keys": sorted(snap),
      "trace_keys_same": sorted({k for e in snap["device_traces"][0] for k in e}) ==
                         sorted({k for e in plain["device_traces"][0] for k in e}),
      "viz_ok": len(html) > 1000 and "segment" in text,
      "unknown_at_peak": cr.breakdown(m, cats, m.peak_index)["unknown"],
      "reused": reused_gradient_blocks(snap)})
'''

# Blocks a gradient had, handed to another allocation after zero_grad(set_to_none=True),
# with the categories the later allocations got.
REUSE = '''
def reused_gradient_blocks(snap):
    from gpumem.categories.classify import CATEGORIES
    table = snap["gpumem_categories"]["device_traces"][0]
    by_addr, out = {}, {}
    for e, c in zip(snap["device_traces"][0], table):
        if e["action"] == "alloc":
            by_addr.setdefault(e["addr"], []).append(CATEGORIES[c])
    for cats in by_addr.values():
        for a, b in zip(cats, cats[1:]):
            if a == "gradient" and b != "gradient":
                out[b] = out.get(b, 0) + 1
    return out
'''


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_transformer_adamw_categories_on_the_simulated_gpu():
    r = run_gm(REUSE + LOOP, prelude=TRANSFORMER)
    pb = r["param_bytes"]
    assert sum(r["at_peak"].values()) == r["peak"]
    assert r["at_peak"]["parameter"] == pb
    assert r["at_peak"]["optimizer_state"] == 2 * pb
    assert r["state_end"] == 2 * pb
    assert len(r["grads_end_of_backward"]) == 3
    assert all(g == pb for g in r["grads_end_of_backward"]), r["grads_end_of_backward"]
    # cuBLAS's workspaces, allocated in the step recorded without categories
    assert r["unknown_at_peak"] % (1 << 20) == 0
    # snapshots without categories are unchanged; with them, one top-level key more
    assert "gpumem_categories" not in r["plain_keys"]
    assert sorted(r["plain_keys"] + ["gpumem_categories"]) == r["cat_keys"]
    assert r["trace_keys_same"]
    assert r["viz_ok"]
    # gradients' blocks are reused by the next forward, and the reuse has its own category
    assert r["reused"].get("activation", 0) > 0, r["reused"]


# ------------------------------------------------- summary on hand-built snapshots

def _snapshot(table: bool = True, bad: bool = False) -> dict:
    """A parameter from before the trace (a live block), then a step: an
    activation, a gradient, the activation freed, optimizer state."""
    t = [ev("alloc", 0x2000, 100), ev("alloc", 0x3000, 300),
         ev("free_requested", 0x2000, 100), ev("free_completed", 0x2000, 100),
         ev("alloc", 0x4000, 60)]
    blocks = [{"address": a, "size": 0x1000, "requested_size": r, "state": s, "frames": []}
              for a, r, s in ((0x1000, 50, "active_allocated"), (0x2000, 0, "inactive"),
                              (0x3000, 300, "active_allocated"),
                              (0x4000, 60, "active_allocated"))]
    snap = {"segments": [{"device": 0, "address": 0x1000, "total_size": 0x4000,
                          "allocated_size": 0x3000, "active_size": 0x3000,
                          "requested_size": 410, "stream": 0, "segment_type": "large",
                          "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                          "blocks": blocks}],
            "device_traces": [t]}
    if table:
        cats = [C("activation"), C("gradient"), C("activation"), C("activation"),
                C("optimizer_state")]
        if bad:
            cats = [99, "x", None, -1, True]
        snap["gpumem_categories"] = {
            "version": 1, "categories": list(CATEGORIES),
            "phases": ["other", "forward", "backward", "optimizer"],
            "device_traces": [cats], "trace_phases": [[1, 2, 2, 2, 3]],
            "segments": [[C("parameter"), None, C("gradient"), C("optimizer_state")]]}
    return snap


def _summary(tmp_path, capsys, snap, *extra):
    import json
    import pickle
    from gpumem import cli
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    code = cli.main(["summary", str(path), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out) if "--json" in extra else out


def test_summary_breaks_memory_down_by_category(tmp_path, capsys):
    d = _summary(tmp_path, capsys, _snapshot(), "--json")["devices"][0]
    c = d["categories"]
    # the peak: parameter 50 + activation 100 + gradient 300 (before the free)
    assert c["at_peak"]["parameter"] == 50 and c["at_peak"]["activation"] == 100
    assert c["at_peak"]["gradient"] == 300
    assert sum(c["at_peak"].values()) == d["peak_allocated"]
    assert c["at_end"] == dict(c["at_end"], activation=0, gradient=300, optimizer_state=60,
                               parameter=50)
    assert sum(c["at_end"].values()) == 410
    text = _summary(tmp_path, capsys, _snapshot())
    assert "memory by category" in text and "optimizer_state" in text


def test_summary_without_a_table_has_no_categories_and_bad_tables_are_unknown(tmp_path, capsys):
    d = _summary(tmp_path, capsys, _snapshot(table=False), "--json")["devices"][0]
    assert "categories" not in d
    assert "memory by category" not in _summary(tmp_path, capsys, _snapshot(table=False))
    d = _summary(tmp_path, capsys, _snapshot(bad=True), "--json")["devices"][0]
    at_end = d["categories"]["at_end"]
    assert at_end["unknown"] == 360 and at_end["parameter"] == 50


def test_tables_written_before_a_category_was_added_still_read():
    from gpumem.categories import report as cr
    snap = _snapshot()
    snap["gpumem_categories"]["categories"] = list(CATEGORIES[:-1])   # before 'workspace'
    assert cr.has_table(snap)
    snap["gpumem_categories"]["categories"] = ["activation"] + list(CATEGORIES[1:])
    assert not cr.has_table(snap)


# ------------------------------------------------------------ gpumem simulate

SIM_SCRIPT = "import json, torch\n" + TRANSFORMER + '''
model, opt = make_model()
x = torch.randn(64, 128, 64, device="cuda")
# the script turns recording on itself (torch's call): categories stay on
torch.cuda.memory._record_memory_history(max_entries=100000)
for _ in range(2):
    model(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
with open("pb.json", "w") as f:
    json.dump(sum(p.numel() * p.element_size() for p in model.parameters()), f)
'''


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@pytest.mark.parametrize("categories", [True, False])
def test_simulate_reports_the_estimation_equation(tmp_path, categories):
    import json
    from test_simulate import run_simulate
    from torch_helpers import built_shim
    built_shim()
    pb_file = tmp_path / "pb.json"
    proc = run_simulate(tmp_path, SIM_SCRIPT, *(["--categories"] if categories else []),
                        "--json", "--no-view")
    report = json.loads(proc.stdout)
    if not categories:
        assert "equation" not in report
        return
    pb = json.loads(pb_file.read_text())
    (rows,) = report["equation"].values()
    t = rows["0"]
    assert t["parameters"] == pb and t["optimizer_state"] == 2 * pb
    assert t["gradients"] == pb
    assert t["estimate"] == (t["parameters"] + t["optimizer_state"]
                             + max(t["gradients_plus_optimizer_intermediates"], t["activations"]))
    # activations (batch 64 x 128 tokens) outweigh the 66k-parameter model's gradients
    assert t["peak_branch"] == "activations"
    assert t["activations"] > 10 * pb
    assert sum(t["at_peak"].values()) == t["measured_peak"]


def test_a_failing_hook_does_not_stop_training(caplog):
    """The hooks run inside the user's step: an error of ours is logged once
    and the step goes on (no torch needed: a stand-in tagger)."""
    from gpumem.categories import tagger as categories

    class Broken(categories._Tagger):
        def __init__(self):
            self.failed = False
            self.phase = "forward"     # no phase change to note
            self.arm_handle = None

        def tag_all(self, tensors, role):
            raise RuntimeError("boom")

    b = Broken()
    with caplog.at_level("WARNING", logger="gpumem"):
        assert b.forward_start(object(), (object(),)) is None
        assert b.forward_start(object(), (object(),)) is None
    assert [r.message for r in caplog.records if "forward_start hook failed" in r.message] != []
    assert len(caplog.records) == 1


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_record_with_categories_writes_the_table_and_restores_the_settings(tmp_path):
    r = run_gm(f'''
import pickle
from gpumem.categories import tagger as categories
from gpumem.recording import history
model, opt = make_model()
x = torch.randn(4, 8, 64, device="cuda")
with gpumem.record({str(tmp_path / "m.pickle")!r}, categories=True) as rec:
    inside = categories.enabled()
    train_step(model, opt, x)
snap = pickle.load(open({str(tmp_path / "m.pickle")!r}, "rb"))
t = snap["gpumem_categories"]
emit({{"inside": inside, "after": categories.enabled(),
       "config": history.recording_config()["categories"],
       "lengths_match": [len(a) for a in t["device_traces"]] ==
                        [len(a) for a in snap["device_traces"]],
       "names": sorted({{t["categories"][c] for c in t["device_traces"][0] if c is not None}}),
       "block_names": sorted({{t["categories"][c] for row in t["segments"] for c in row
                               if c is not None}})}})
''', prelude=TRANSFORMER)
    assert r["inside"] is True and r["after"] is False and r["config"] is False
    assert r["lengths_match"]
    # allocated in the block: gradients, the first step's optimizer state, activations
    assert {"gradient", "optimizer_state", "activation"} <= set(r["names"])
    # live at the end, allocated before it: the parameters and the input keep their tags
    assert {"parameter", "input", "optimizer_state"} <= set(r["block_names"])


@pytest.mark.slow   # 9 s: the fast tier's bar is 120 s of CPU
def test_loop_without_optimizer_buffers_and_uninstall():
    """No optimizer: gradients are tagged when backward returns; module
    buffers (BatchNorm's statistics) count as parameters; turning categories
    off restores torch's backward entry points and leaves no global hook."""
    r = run_gm('''
import gpumem.recording.history as h
from gpumem.snapshots.timeline import build_device
from gpumem.categories import report as cr
orig = (torch.autograd.backward, torch.autograd.grad)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64),
                            torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
x = torch.randn(16, 32, device="cuda")
# C++ frames: the workspaces are told apart by torch's cuBLAS handle pool in their stacks
h.record_memory_history("all", stacks="all", categories=True, clear_history=True)
wrapped = torch.autograd.backward is not orig[0] and torch.autograd.grad is not orig[1]
for _ in range(3):
    model(x).pow(2).mean().backward()      # gradients accumulate in place
    with torch.no_grad():
        for p in model.parameters():
            p -= 1e-3 * p.grad
snap = h.snapshot()
h.record_memory_history(None)
m = build_device(snap, 0)
cats = cr.allocation_categories(snap, m)
from torch.nn.modules import module as mm
emit({"end": cr.breakdown(m, cats, m.n_events - 1), "peak": cr.breakdown(m, cats, m.peak_index),
      "pb": sum(p.numel() * p.element_size() for p in model.parameters()),
      "bb": sum(b.numel() * b.element_size() for b in model.buffers()),
      "wrapped": wrapped,
      "restored": (torch.autograd.backward, torch.autograd.grad) == orig,
      "hooks_left": len(mm._global_forward_pre_hooks)})
''')
    assert r["wrapped"] and r["restored"] and r["hooks_left"] == 0
    assert r["end"]["gradient"] == r["pb"]
    assert r["end"]["parameter"] == r["pb"] + r["bb"]
    assert r["peak"]["activation"] > 0 and r["end"]["activation"] == 0
    assert r["end"]["input"] == 16 * 32 * 4
    # cuBLAS's workspaces, made in the first forward and backward, kept by torch
    assert r["end"]["workspace"] > 0 and r["end"]["workspace"] % (1 << 20) == 0
    assert sum(r["end"].values()) - r["end"]["workspace"] == (
        r["pb"] + r["bb"] + r["pb"] + r["end"]["input"] + r["end"]["unknown"])


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_a_few_python_calls_per_step():
    """The cost design (Note [Categories at a few calls per step]): per step
    one forward-start call, one backward entry and exit, one step pre and
    post, however many modules run and tensors autograd saves; no global
    module hook stays registered through the forward."""
    r = run_gm('''
import gpumem.recording.history as h
from gpumem.categories import tagger as categories
from torch.nn.modules import module as mm
calls = {}
def counted(name):
    fn = getattr(categories._Tagger, name)
    def f(*a, **k):
        calls[name] = calls.get(name, 0) + 1
        return fn(*a, **k)
    return f
for name in ("forward_start", "backward_start", "backward_end", "step_pre", "step_post"):
    setattr(categories._Tagger, name, counted(name))
model, opt = make_model()
x = torch.randn(4, 8, 64, device="cuda")
inner = []
model[1].register_forward_pre_hook(lambda m, a: inner.append(len(mm._global_forward_pre_hooks)))
h.record_memory_history("all", categories=True, clear_history=True)
for _ in range(4):
    train_step(model, opt, x)
armed = len(mm._global_forward_pre_hooks)
h.record_memory_history(None)
emit({"calls": calls, "inner": inner, "armed": armed,
      "modules": sum(1 for _ in model.modules())})
''', prelude=TRANSFORMER)
    assert r["modules"] > 10
    assert r["calls"] == {"forward_start": 4, "backward_start": 4, "backward_end": 4,
                          "step_pre": 4, "step_post": 4}, r["calls"]
    assert r["inner"] == [0, 0, 0, 0] and r["armed"] == 1


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_torch_compile_traces_with_categories_on():
    """No saved-tensors hooks and no per-module hooks: torch.compile captures
    the model in one graph, without graph breaks, and the categories hold."""
    r = run_gm('''
import gpumem.recording.history as h
from gpumem.categories import report as cr
from gpumem.snapshots.timeline import build_device
import torch._dynamo as dyn
model, opt = make_model()
compiled = torch.compile(model, backend="aot_eager")
x = torch.randn(8, 16, 64, device="cuda")
h.record_memory_history("all", categories=True, clear_history=True)
for _ in range(3):
    train_step(compiled, opt, x)
snap = h.snapshot()
h.record_memory_history(None)
m = build_device(snap, 0)
cats = cr.allocation_categories(snap, m)
emit({"end": cr.breakdown(m, cats, m.n_events - 1),
      "pb": sum(p.numel() * p.element_size() for p in model.parameters()),
      "graphs": dyn.utils.counters["stats"]["unique_graphs"],
      "breaks": sum(dyn.utils.counters["graph_break"].values())})
''', prelude=TRANSFORMER)
    assert r["graphs"] == 1 and r["breaks"] == 0
    assert r["end"]["parameter"] == r["pb"] and r["end"]["optimizer_state"] == 2 * r["pb"]


SIM_RECORD_SCRIPT = "import json, torch, gpumem\n" + TRANSFORMER + '''
model, opt = make_model()
x = torch.randn(64, 128, 64, device="cuda")
with gpumem.record("mine.pickle"ARGS) as rec:
    for _ in range(2):
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec.step()
with open("pb.json", "w") as f:
    json.dump(sum(p.numel() * p.element_size() for p in model.parameters()), f)
'''


@pytest.mark.slow
@pytest.mark.parametrize("args", ["", ", categories=False"])
def test_simulate_categories_survive_the_scripts_own_record(tmp_path, args):
    """gpumem.record() without categories= inside `simulate --categories`
    used to turn categories off silently (every term 0 B); an explicit
    categories=False is obeyed, with one warning naming the line."""
    import json
    from test_simulate import run_simulate
    from torch_helpers import built_shim
    built_shim()
    script = SIM_RECORD_SCRIPT.replace("ARGS", args)
    proc = run_simulate(tmp_path, script, "--categories", "--no-view")
    report = json.loads((tmp_path / "out" / "summary.json").read_text())
    warned = [line for line in proc.stderr.splitlines() if "turned categories off" in line]
    if not args:
        (rows,) = report["equation"].values()
        pb = json.loads((tmp_path / "pb.json").read_text())
        assert rows["0"]["parameters"] == pb and rows["0"]["optimizer_state"] == 2 * pb, rows
        assert not warned, warned
    else:
        line = script.splitlines().index('with gpumem.record("mine.pickle", categories=False) '
                                         'as rec:') + 1
        assert len(warned) == 1 and f"script.py:{line} " in warned[0], proc.stderr
        assert "branch sets it" not in proc.stdout, proc.stdout


def test_no_branch_is_named_when_no_term_was_measured():
    from gpumem.sim import command as simulate
    zero = {"parameters": 0, "optimizer_state": 0, "gradients": 0, "optimizer_intermediates": 0,
            "gradients_plus_optimizer_intermediates": 0, "activations": 0, "estimate": 0,
            "measured_peak": 5 << 20, "peak_branch": "activations",
            "at_peak": dict.fromkeys(CATEGORIES, 0)}
    text = "\n".join(simulate._equation_lines({"s.pickle": {"0": zero}}))
    assert "branch" not in text and "= 0 B" not in text, text
    assert "no allocation" in text, text
