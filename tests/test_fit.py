"""``gpumem fit`` (gpumem/sim/fit.py, knob.py, boundary.py).

Fast: the search on fake probes (every monotone boundary, LO failing, HI
fitting, non-monotone probes, probes that stop it), the knob's parsing and
substitution, a probe's verdict from hand-built gpumem simulate reports, the
command's table and JSON over two GPU models with a fake probe, and bad input
(one line, status 2, nothing run).  Slow: the bar of issue 31, a batch-size
boundary of examples/batch_fit.py that direct gpumem simulate runs confirm on
each side, and a probe that fails for another reason than memory.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from gpumem.cli import main
from gpumem.sim import boundary, config_key, fit, knob as sim_knob
from torch_helpers import ROOT, _env, built_shim

GiB = 1 << 30


# ------------------------------------------------------------------ the search

def counting(fits):
    calls = []

    def probe(v):
        calls.append(v)
        return fits(v)
    return probe, calls


NEEDS = {"none": None, "linear": lambda v: 500 + 40 * v, "quadratic": lambda v: 500 + v * v,
         "flat": lambda v: 700, "noisy": lambda v: 500 + 40 * v + (v * 7919) % 97}


@pytest.mark.parametrize("need", sorted(NEEDS))
@pytest.mark.parametrize("lo,hi", [(1, 2), (1, 64), (3, 17), (0, 1000)])
def test_monotone_boundaries_are_found_exactly(lo, hi, need):
    """Bisection alone (no need measured), and guided by needs that grow
    linearly, faster, not at all, or unevenly (Note [Guided steps])."""
    f = NEEDS[need]
    for limit in range(lo, hi + 1):
        capacity = None if f is None else f(limit) + 1
        probe, calls = counting(lambda v: v <= limit if f is None else (v <= limit, f(v)))
        b = boundary.search(lo, hi, probe, capacity=capacity)
        assert b.complete and b.largest == limit
        assert b.first_no == (None if limit == hi else limit + 1)
        assert len(calls) == len(set(calls)), calls            # no value run twice
        per_halving = 1 if f is None else 3
        assert len(calls) <= 2 + per_halving * (hi - lo).bit_length(), calls
        if b.first_no is not None:                              # both sides were run
            assert {limit, limit + 1} <= set(calls)
        assert b.probes == [(v, v <= limit) for v in calls]


def test_guided_steps_need_fewer_probes_when_memory_grows_linearly():
    runs = {}
    for guided in (False, True):
        probe, calls = counting(lambda v: (v <= 537, 1000 + 3 * v))
        b = boundary.search(1, 1000, probe, capacity=1000 + 3 * 537 + 2 if guided else None)
        assert (b.largest, b.first_no) == (537, 538)
        runs[guided] = len(calls)
    assert runs == {False: 12, True: 5}, runs


def test_lo_already_failing_runs_one_probe():
    probe, calls = counting(lambda v: False)
    b = boundary.search(4, 64, probe)
    assert (b.largest, b.first_no, calls) == (None, 4, [4])


def test_hi_fitting_runs_two_probes():
    probe, calls = counting(lambda v: True)
    b = boundary.search(4, 64, probe)
    assert (b.largest, b.first_no, calls) == (64, None, [4, 64])


def test_non_monotone_probes_still_give_a_boundary_both_sides_run():
    rng = random.Random(31)
    for _ in range(300):
        lo, hi = rng.randint(0, 5), rng.randint(6, 80)
        table = {v: rng.random() < 0.5 for v in range(lo, hi + 1)}
        table[lo] = True
        table[hi] = False
        needs = {v: rng.randint(0, 1000) for v in table}
        probe, calls = counting(lambda v: (table[v], needs[v]))
        b = boundary.search(lo, hi, probe, capacity=rng.choice([None, 500, 1500]))
        assert table[b.largest] and not table[b.first_no] and b.first_no == b.largest + 1
        assert b.largest in calls and b.first_no in calls


@pytest.mark.parametrize("fail_at_call", [0, 1, 2, 4])
def test_a_probe_that_cannot_say_stops_the_search_and_is_named(fail_at_call):
    calls = []

    def probe(v):
        calls.append(v)
        if len(calls) - 1 == fail_at_call:
            raise boundary.Stop(f"rank 0 raised ValueError at train.py:{v}")
        return v <= 20

    b = boundary.search(1, 64, probe)
    assert not b.complete and b.stopped_at == calls[-1]
    assert b.reason == f"rank 0 raised ValueError at train.py:{calls[-1]}"
    assert [v for v, _ in b.probes] == calls[:-1]           # the answered ones only
    assert len(calls) == fail_at_call + 1


# ------------------------------------------------------------------ the knob

CMD = ["python", "train.py", "--batch-size", "8", "--lr=1e-4"]


def test_knob_parse():
    assert sim_knob.parse("batch_size=1..64") == sim_knob.Knob("name", "batch_size", 1, 64)
    assert sim_knob.parse("--batch-size=2..9") == sim_knob.Knob("flag", "--batch-size", 2, 9)
    assert sim_knob.parse("env:BS=0..3") == sim_knob.Knob("env", "BS", 0, 3)
    assert sim_knob.parse("training.local_batch_size=1..8").name == "training.local_batch_size"
    for bad, words in [("batch_size", "KNOB=LO..HI"), ("batch_size=64..1", "must go up"),
                       ("batch_size=4..4", "must go up"), ("batch_size=1..x", "not LO..HI"),
                       ("batch_size=-1..4", "not LO..HI"), ("=1..4", "KNOB=LO..HI"),
                       ("env:1X=1..4", "is not a knob"), ("a b=1..4", "is not a knob")]:
        with pytest.raises(sim_knob.KnobError, match=words):
            sim_knob.parse(bad)


def test_knob_substitution_each_kind():
    def at(spec, cmd, value=16):
        k = sim_knob.parse(spec)
        sim_knob.locate(k, cmd)
        return sim_knob.apply(k, cmd, {"A": "1"}, value)

    assert at("batch-size=1..64", CMD)[0] == ["python", "train.py", "--batch-size", "16",
                                              "--lr=1e-4"]
    assert at("batch_size=1..64", CMD)[0][3] == "16"                    # '_' finds --batch-size
    assert at("--batch-size=1..64", ["t.py", "--batch-size=8"])[0] == ["t.py", "--batch-size=16"]
    assert at("data.batch_size=1..64", ["t.py", "data.batch_size=8"])[0] == \
        ["t.py", "data.batch_size=16"]
    assert at("bs=1..64", ["t.py", "--cfg=x/{bs}/y", "{bs}"])[0] == ["t.py", "--cfg=x/16/y", "16"]
    cmd, env = at("env:BS=1..64", CMD)
    assert cmd == CMD and env == {"A": "1", "BS": "16"}


def test_knob_not_in_the_command_is_refused():
    for spec, cmd in [("batch_size=1..8", ["python", "t.py", "--lr", "3"]),
                      ("--batch-size=1..8", ["python", "t.py", "batch-size=3"]),
                      ("python=1..8", ["python=3", "t.py"])]:             # not the program
        with pytest.raises(sim_knob.KnobError, match="is not in the command"):
            sim_knob.locate(sim_knob.parse(spec), cmd)
    with pytest.raises(sim_knob.KnobError, match="has no value after it"):
        sim_knob.locate(sim_knob.parse("batch-size=1..8"), ["t.py", "--batch-size", "--x"])


TOML = """\
# torchtitan-like
[job]
dump_folder = "./out"   # a = 3

[training]
local_batch_size = 8   # per rank
seq_len = 2048
steps = 10

[training.extra]
local_batch_size = 99
"""
YAML = """\
model:
  dim: 512
training:
  # per rank
  batch_size: 8  # sequences
  nested:
    batch_size: 99
batch_size: 77
"""


@pytest.mark.parametrize("suffix,text", [(".toml", TOML), (".yaml", YAML),
                                         (".json", json.dumps({"training": {"batch_size": 8},
                                                               "batch_size": 77}))])
def test_config_keys_read_and_set_leaving_the_rest(suffix, text):
    key = "training.local_batch_size" if suffix == ".toml" else "training.batch_size"
    path = "cfg" + suffix
    assert config_key.read(text, path, key) == 8
    new = config_key.write(text, path, key, 48)
    assert config_key.read(new, path, key) == 48
    if suffix != ".json":   # one line changed, byte for byte elsewhere
        diff = [(a, b) for a, b in zip(text.splitlines(), new.splitlines()) if a != b]
        assert len(diff) == 1 and len(text.splitlines()) == len(new.splitlines()), diff
        assert diff[0][1] == diff[0][0].replace("8", "48", 1), diff
    other = "training.extra.local_batch_size" if suffix == ".toml" else "batch_size"
    if suffix == ".yaml":
        other = "training.nested.batch_size"
    if suffix != ".json":
        assert config_key.read(new, path, other) == 99
    for missing in ("training.nope", "job.dump_folder", "model"):
        with pytest.raises(config_key.ConfigKeyError):
            config_key.read(text, path, missing)


def test_config_file_knob_writes_a_copy_into_the_probe_folder(tmp_path):
    cfg = tmp_path / "train.toml"
    cfg.write_text(TOML)
    k = sim_knob.parse(f"{cfg}:training.local_batch_size=1..64")
    assert (k.kind, k.name, k.file) == ("file", "training.local_batch_size", str(cfg))
    cmd = ["python", "t.py", f"--job.config_file={cfg}"]
    assert sim_knob.locate(k, cmd) == f"training.local_batch_size = 8 in {cfg}"
    probe = tmp_path / "probe"
    probe.mkdir()
    new_cmd, _ = sim_knob.apply(k, cmd, {}, 24, str(probe))
    assert new_cmd == ["python", "t.py", f"--job.config_file={probe / 'train.toml'}"]
    assert config_key.read((probe / "train.toml").read_text(), "x.toml",
                           "training.local_batch_size") == 24
    assert cfg.read_text() == TOML                                   # the user's file is kept
    with pytest.raises(sim_knob.KnobError, match="is not in the command"):
        sim_knob.locate(k, ["python", "t.py"])
    with pytest.raises(sim_knob.KnobError, match="no line setting training.nope"):
        sim_knob.locate(sim_knob.parse(f"{cfg}:training.nope=1..4"), cmd)
    with pytest.raises(sim_knob.KnobError, match="cannot read the config file"):
        sim_knob.locate(sim_knob.parse("missing.yaml:a=1..4"), ["t.py", "missing.yaml"])


# ------------------------------------------------------------------ a probe's verdict

def _report(**kw):
    base = {"fits": True, "verdict": "yes", "fits_reason": "peak reserved 1 GiB",
            "failures": [], "per_device": [{"peak_allocated": 10, "peak_reserved": 20,
                                            "device_peak": 30},
                                           {"peak_allocated": 11, "peak_reserved": 19,
                                            "device_peak": None}]}
    base.update(kw)
    return base


def test_probe_verdicts(tmp_path):
    log = tmp_path / "output.log"
    log.write_text("Traceback ...\nValueError: bad config\n\n")
    row = fit._classify(8, _report(), 0, str(log))
    assert (row["fits"], row["peak_allocated"], row["peak_reserved"], row["device_peak"]) == \
        (True, 11, 20, 30)
    assert fit._classify(8, _report(fits=False, verdict="no"), 1, str(log))["fits"] is False
    caught = _report(fits=None, verdict="not everything it tried")
    assert fit._classify(8, caught, 0, str(log))["fits"] is False
    lib_oom = _report(fits=None, verdict="failed", failures=[
        {"what": "raised RuntimeError: NCCL error: unhandled cuda error (out of memory)"}])
    assert fit._classify(8, lib_oom, 1, str(log))["fits"] is False
    other = _report(fits=None, verdict="failed", fits_reason="the run failed with status 1: "
                    "pid 7 raised KeyError: 'x' at train.py:3",
                    failures=[{"what": "raised KeyError: 'x'"}])
    row = fit._classify(8, other, 1, str(log))
    assert row["fits"] is None and row["error"].endswith("at train.py:3")
    early = _report(fits=None, verdict="failed", per_device=[],
                    fits_reason="the command exited with status 2 before any CUDA memory was "
                                "measured; its error is above")
    row = fit._classify(8, early, 2, str(log))
    assert row["fits"] is None and row["error"].endswith("last line of its output: "
                                                         "ValueError: bad config")
    unknown = _report(fits=None, verdict="unknown", per_device=[],
                      fits_reason="the command never imported torch")
    assert fit._classify(8, unknown, 0, str(log))["fits"] is None
    row = fit._classify(8, None, 2, str(log))
    assert row["fits"] is None and "wrote no report: ValueError: bad config" in row["error"]


# ------------------------------------------------------------------ the command, fake probes

def test_table_and_json_over_two_models(tmp_path, monkeypatch, capsys):
    """Each model searched with its own memory; the probes a fake that fits
    while value GiB + the context fit in the model's memory."""
    seen = []

    def fake_probe(self, model, memory, value):
        seen.append((model.key, value))
        need = value * GiB + model["context_memory"]
        return {"value": value, "fits": need <= memory, "peak_allocated": value * GiB,
                "peak_reserved": value * GiB, "device_peak": need, "reason": "",
                "error": None, "out": str(tmp_path), "seconds": 0.0}

    monkeypatch.setattr(fit._Runner, "probe", fake_probe)
    rc = main(["fit", "--gpu", "L4", "--gpu", "A100-SXM-40GB", "--vary", "env:GB=1..64",
               "--out", str(tmp_path), "--", "python", "t.py"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "on L4 (24 GiB): the largest $GB that fits is 23 (24 does not)" in out, out
    assert "on A100-SXM-40GB (40 GiB): the largest $GB that fits is 39 (40 does not)" in out
    assert out.splitlines()[0].split() == ["gpu", "memory", "$GB", "peak", "allocated", "peak",
                                           "reserved", "device", "peak", "fits"]
    assert len(seen) == len(set(seen))
    report = json.loads((tmp_path / "fit.json").read_text())
    assert [(s["gpu"], s["largest"], s["first_no"]) for s in report["searches"]] == \
        [("L4", 23, 24), ("A100-SXM-40GB", 39, 40)]
    rc = main(["fit", "--json", "--memory", "8GiB", "--vary", "env:GB=1..64", "--out",
               str(tmp_path), "--", "python", "t.py"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["searches"][0]["largest"] == 7 and report["knob"]["kind"] == "env"


@pytest.mark.parametrize("argv,words", [
    (["--vary", "batch-size=1..8", "--", "python", "t.py", "--lr", "1"], "is not in the command"),
    (["--vary", "batch-size=8..1", "--", "python", "t.py", "--batch-size", "2"], "must go up"),
    (["--vary", "batch-size=1..z", "--", "python", "t.py", "--batch-size", "2"], "not LO..HI"),
    (["--gpu", "H999", "--vary", "env:B=1..8", "--", "python", "t.py"], "unknown GPU model"),
    (["--gpu", "L4", "--gpu", "A10G", "--memory", "4GiB", "--vary", "env:B=1..8", "--",
      "python", "t.py"], "--memory sets one size"),
    (["--memory", "100MiB", "--vary", "env:B=1..8", "--", "python", "t.py"], "leaves nothing"),
    (["--memory", "lots", "--vary", "env:B=1..8", "--", "python", "t.py"], "bad memory size"),
    (["--vary", "env:B=1..8"], "no command given"),
    (["--devices", "0", "--vary", "env:B=1..8", "--", "python", "t.py"], "at least 1"),
    (["--", "python", "t.py"], "--vary"),
])
def test_bad_input_is_one_line_and_status_2(argv, words, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["fit", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpumem: error: ") and words in err, err
    assert "Traceback" not in err and not out.exists()      # nothing was run


# ------------------------------------------------------------------ real runs

def _gpumem(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "gpumem", *args], capture_output=True,
                          text=True, cwd=ROOT, env=_env(), timeout=timeout)


@pytest.mark.slow
def test_fit_finds_a_batch_boundary_that_direct_runs_confirm(tmp_path):
    """Issue 31's bar: fits at N, does not at N + 1, each checked by a plain
    gpumem simulate run of the same command."""
    built_shim()
    script = [sys.executable, "examples/batch_fit.py", "--batch-size", "8", "--steps", "1"]
    proc = _gpumem("fit", "--memory", "2GiB", "--vary", "batch-size=20..40", "--json",
                   "--out", str(tmp_path / "fit"), "--", *script)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    [s] = json.loads(proc.stdout)["searches"]
    n = s["largest"]
    assert n is not None and s["first_no"] == n + 1 and 20 <= n < 40, s
    rows = {r["value"]: r for r in s["probes"]}
    assert rows[n]["fits"] is True and rows[n + 1]["fits"] is False
    assert rows[n]["peak_allocated"] > rows[20]["peak_allocated"]   # grows with the batch
    for value, verdict in ((n, "yes"), (n + 1, "no")):
        out = tmp_path / f"direct{value}"
        direct = _gpumem("simulate", "--memory", "2GiB", "--out", str(out), "--no-view", "--",
                         *script[:-4], "--batch-size", str(value), "--steps", "1")
        report = json.loads((out / "summary.json").read_text())
        assert report["verdict"] == verdict, (value, direct.stdout[-2000:])
        assert f"fits in 2 GiB: {verdict}" in direct.stdout
        if verdict == "yes":   # the probe was that run: the same peak allocated
            assert report["per_device"][0]["peak_allocated"] == rows[n]["peak_allocated"]


@pytest.mark.slow
def test_a_probe_failing_for_another_reason_stops_the_search(tmp_path):
    built_shim()
    script = tmp_path / "t.py"
    script.write_text("import os, torch\n"
                      "n = int(os.environ['BLOCKS'])\n"
                      "x = torch.empty(n << 20, dtype=torch.uint8, device='cuda')\n"
                      "if n > 3:\n"
                      "    raise ValueError(f'no config for {n} blocks')\n")
    proc = _gpumem("fit", "--memory", "2GiB", "--vary", "env:BLOCKS=1..8", "--out",
                   str(tmp_path / "fit"), "--", sys.executable, str(script))
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    last = proc.stdout.strip().splitlines()[-1]
    assert "the probe at $BLOCKS=8 failed (not out of memory)" in last, proc.stdout
    assert "ValueError: no config for 8 blocks" in last and f"{script}:5" in last, last
    assert "before it, $BLOCKS=1 fits" in last


@pytest.mark.slow
def test_a_config_file_key_on_two_gpu_models(tmp_path):
    """A TOML key varied, on two models of different memory, in one table."""
    built_shim()
    (tmp_path / "run.toml").write_text("[data]\ngib = 1\n")
    script = tmp_path / "t.py"
    script.write_text("import sys, tomllib, torch\n"
                      "gib = tomllib.load(open(sys.argv[2], 'rb'))['data']['gib']\n"
                      "x = torch.empty(gib << 30, dtype=torch.uint8, device='cuda')\n")
    proc = _gpumem("fit", "--gpu", "L4", "--gpu", "A100-SXM-40GB", "--vary",
                   f"{tmp_path / 'run.toml'}:data.gib=1..64", "--out", str(tmp_path / "fit"),
                   "--", sys.executable, str(script), "--config", str(tmp_path / "run.toml"))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    # 24 GiB less L4's 338 MiB context holds 23 GiB; 40 GiB less A100's 466 MiB, 39
    assert "on L4 (24 GiB): the largest data.gib that fits is 23 (24 does not)" in proc.stdout
    assert "on A100-SXM-40GB (40 GiB): the largest data.gib that fits is 39 (40 does not)" \
        in proc.stdout, proc.stdout
    assert (tmp_path / "run.toml").read_text() == "[data]\ngib = 1\n"
