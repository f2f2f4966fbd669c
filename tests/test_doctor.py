"""``gpumem doctor`` (gpumem/checkup/doctor.py) and the driver backend's self-test
(gpumem/checkup/selftest.py) on this machine, which has no GPU: without any driver,
over gpumem's fake driver with failures injected, and under gpumem simulate.

Doctor runs in a subprocess (it imports torch; the pytest process does not).
The self-test failure cases run in one child each, without torch, over the
fake driver alone (GPUMEM_LIBCUDA), reconfigured between cases with
fakecuda_configure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sim_helpers import ROOT, needs_torch, sim_lib_dir

STEPS = ["allocate", "free", "split", "expandable", "cross-stream", "oom"]


def clean_env(**extra: str) -> dict:
    """This process's environment without any CUDA driver or simulator setting."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUMEM_SIM", "GPUMEM_FAKECUDA", "GPUMEM_LIBCUDA", "LD_PRELOAD",
                                "GPUMEM_ALLOC_CONF", "GPUMEM_OOM"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


def doctor(*args: str, sim: bool = False, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gpumem"]
    if sim:
        cmd += ["simulate", "--no-view", "--out", env.pop("out"), "--", sys.executable, "-m",
                "gpumem"]
    return subprocess.run(cmd + ["doctor", *args], capture_output=True, text=True, cwd=ROOT,
                          env=clean_env(**env), timeout=300)


def fake_driver() -> str:
    return str(sim_lib_dir() / "libcuda.so.1")


@needs_torch
@pytest.mark.slow  # 7.6 s; the fast tier keeps the doctor's step tests below
def test_without_a_gpu_it_says_so_and_exits_3():
    proc = doctor()
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "gpumem doctor"
    assert any(l.startswith("info  driver: no NVIDIA driver: cannot load the CUDA driver "
                            "library libcuda.so.1") for l in lines), proc.stdout
    assert lines[-1].startswith("verdict: no GPU here: the self-test was not run")
    assert lines[-1].endswith("(exit 3)")
    for line in lines[1:-1]:          # one finding per line: status, topic, text
        status, _, rest = line.partition(" ")
        assert status in ("ok", "info", "warn", "FAIL") and ": " in rest, line
    assert not [l for l in lines[:-1] if "self-test" in l] and proc.stderr == ""
    rep = json.loads(doctor("--json").stdout)
    assert rep["exit_status"] == 3 and rep["selftest"] is None and rep["simulated"] is False
    assert rep["driver"]["present"] is False and rep["torch"]["cuda"]
    assert {"gpumem", "driver", "torch", "shim", "build_tools", "settings", "environment",
            "findings", "verdict"} <= set(rep)


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_under_gpumem_simulate_the_self_test_passes(tmp_path):
    proc = doctor(sim=True, out=str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ok    GPU 0: NVIDIA H100 80GB HBM3 (simulated), 80.00 GiB" in out
    assert "(gpumem's simulated GPU, started by gpumem simulate / gpumem.sim" in out
    for step in STEPS:
        assert f"ok    self-test {step}: " in out, out
    assert "verdict: OK: gpumem's driver backend works on the simulated GPU, not real " \
           "hardware: the self-test passed on GPU 0" in out


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("env,step,text", [
    ({"GPUMEM_FAKECUDA_FAIL": "cuMemMap:1"}, "expandable", "cuMemMap failed"),
    ({"GPUMEM_FAKECUDA_FAIL_ABOVE": str(3 << 30)}, "oom",
     "did not fit after the cache was released"),
])
def test_a_failing_self_test_step_makes_doctor_exit_1(tmp_path, env, step, text):
    proc = doctor("--json", sim=True, out=str(tmp_path / "out"), GPUMEM_SIM_MEMORY="4GiB",
                  **env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])
    failed = [f for f in rep["findings"] if f["status"] == "fail"]
    assert [f["topic"] for f in failed] == [f"self-test {step}"], failed
    assert text in failed[0]["text"]
    assert rep["exit_status"] == 1 and rep["verdict"].startswith("PROBLEM: 1 check(s) failed")


def run_selftest_child(body: str, **env: str) -> list:
    code = textwrap.dedent('''
        import ctypes, json
        from gpumem import _C
        from gpumem.checkup import selftest as _selftest
        from gpumem.checkup.cudadriver import Driver
        LIB = ctypes.CDLL(__import__("os").environ["GPUMEM_LIBCUDA"])
        drv = Driver(); drv.init()
        def failed(**kw):
            r = _selftest.run(0, driver=drv, **kw)
            return {s["name"]: s["detail"] for s in r["steps"] if s["status"] != "ok"}
        results = []
    ''') + textwrap.dedent(body) + "\nprint(json.dumps(results))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=clean_env(GPUMEM_LIBCUDA=fake_driver(), **env),
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


# injected driver failure -> (steps that must fail, text each failure names)
INJECTED = [
    ("fail=cuMemAlloc_v2:1+", ["allocate", "free", "split", "cross-stream", "oom"],
     "CUDA out of memory"),
    ("fail=cuMemFree_v2:1", ["allocate"], "cuMemFree_v2 failed"),
    ("fail=cuMemcpyDtoH_v2:1", ["allocate"], "cuMemcpyDtoH_v2 failed"),
    ("fail=cuMemGetInfo_v2:2", ["allocate"], "cuMemGetInfo_v2 failed"),
    ("fail=cuMemMap:1", ["expandable"], "cuMemMap failed"),
    ("fail=cuMemUnmap:1", ["expandable"], "cuMemUnmap failed"),
    ("fail=cuEventQuery:1", ["cross-stream"], "cuEventQuery failed"),
    ("fail_above=1GiB", ["oom"], "did not fit after the cache was released"),
]


def test_each_injected_driver_failure_fails_its_step():
    results = run_selftest_child('''
        for spec in %r:
            assert LIB.fakecuda_configure(spec.encode()) == 0, spec
            results.append(failed())
            LIB.fakecuda_configure(b"fail=,fail_above=0")
            results.append(failed())          # and the next, clean run passes again
    ''' % [spec for spec, _, _ in INJECTED], GPUMEM_FAKECUDA_MEMORY="4GiB")
    for (spec, steps, text), got, clean in zip(INJECTED, results[::2], results[1::2]):
        assert sorted(got) == sorted(steps), (spec, got)
        for step in steps:
            assert text in got[step], (spec, step, got[step])
        assert clean == {}, (spec, clean)


def test_a_disagreement_with_cumemgetinfo_fails_the_step():
    """Allocators that hold device memory gpumem does not account for: the
    driver's figure, not gpumem's, gives them away."""
    results = run_selftest_child('''
        class Leaky:
            """Each malloc also takes 2 MiB from the driver behind the allocator's back."""
            def __init__(self, **kw):
                self.a, self.extra = _C.Allocator(**kw), []
            def __getattr__(self, name):
                return getattr(self.a, name)
            def malloc(self, *args):
                p = ctypes.c_uint64()
                with drv.context(0):
                    assert LIB.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(2 << 20)) == 0
                self.extra.append(p.value)
                return self.a.malloc(*args)
        class LeaksWhenDestroyed:
            """Accounts for everything, but 2 MiB stay on the device when it is destroyed."""
            def __init__(self, **kw):
                self.a = _C.Allocator(**kw)
            def __getattr__(self, name):
                return getattr(self.a, name)
            def __del__(self):
                p = ctypes.c_uint64()
                with drv.context(0):
                    LIB.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(2 << 20))
        results.append(failed(make_allocator=Leaky))
        results.append(failed(make_allocator=LeaksWhenDestroyed))
    ''', GPUMEM_FAKECUDA_MEMORY="4GiB")
    leaky, at_destroy = results
    assert leaky["allocate"] == ("after a 64 MiB allocation: cuMemGetInfo shows 66.00 MiB more "
                                 "in use than at the start, but gpumem reserved 64.00 MiB (a "
                                 "difference of 2.00 MiB)")
    assert sorted(leaky) == sorted(STEPS), leaky
    assert all("cuMemGetInfo shows" in d for d in leaky.values()), leaky
    # each step destroys its allocator at its end, where the 2 MiB left behind are seen
    assert sorted(at_destroy) == sorted(STEPS), at_destroy
    assert set(at_destroy.values()) == {"after the allocators were destroyed, cuMemGetInfo "
                                        "still shows 2.00 MiB more in use than at the start"}


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_the_fake_driver_is_not_taken_for_a_gpu():
    """GPUMEM_LIBCUDA naming gpumem's fake driver, without the simulator:
    doctor says what it is, and that torch (NVIDIA's runtime) cannot use it."""
    rep = json.loads(doctor("--json", "--no-selftest", GPUMEM_LIBCUDA=fake_driver()).stdout)
    assert rep["simulated"] is True and rep["driver"]["launcher"] is None
    text = {f["topic"]: f["text"] for f in rep["findings"] if f["topic"] == "driver"}
    assert "(gpumem's fake driver, not a GPU)" in text["driver"]
    assert rep["exit_status"] == 1
    assert [f["topic"] for f in rep["findings"] if f["status"] == "fail"] == ["torch"]
    none = doctor(GPUMEM_LIBCUDA=fake_driver(), GPUMEM_FAKECUDA_DEVICES="0")
    assert none.returncode == 3
    assert "info  GPUs: no GPU: cuInit says CUDA_ERROR_NO_DEVICE" in none.stdout


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("env,text", [
    ({"GPUMEM_ALLOC_CONF": "bogus:1"}, "GPUMEM_ALLOC_CONF='bogus:1' is invalid"),
    # issue 34: the line gpumem install(), simulate and replay give (not torch's stoull)
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:" + "9" * 40},
     "allocator setting 'max_split_size_mb' has bad value '99999"),
    ({"GPUMEM_OOM_SNAPSHOT": "/tmp/x", "GPUMEM_OOM_RECORDING": "stacks:none"},
     "GPUMEM_OOM_RECORDING: bad value 'none' for stacks"),
    ({"GPUMEM_SHIM_BUILD": "0", "GPUMEM_CACHE_DIR": "/nonexistent/gpumem"},
     "GPUMEM_SHIM_BUILD=0 stops install() from building it"),
])
def test_a_bad_setting_fails_even_without_a_gpu(env, text):
    proc = doctor(**env)
    assert proc.returncode == 1, proc.stdout
    fails = [l for l in proc.stdout.splitlines() if l.startswith("FAIL")]
    assert len(fails) == 1 and text in fails[0], proc.stdout


def test_usage_errors_are_one_line():
    proc = doctor("--device", "-1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "gpumem: error: --device must be 0 or more, not -1\n"
    proc = doctor("--bogus")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1


@pytest.mark.slow
@needs_torch
def test_the_api_returns_what_json_prints(tmp_path):
    code = ("import json, gpumem; r = gpumem.doctor(selftest=False); "
            "print(json.dumps(r, default=str))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=clean_env(), timeout=300)
    api = json.loads(proc.stdout)
    cli = json.loads(doctor("--json", "--no-selftest").stdout)
    for rep in (api, cli):
        rep.pop("gpumem")
        rep["findings"] = [f for f in rep["findings"] if f["topic"] != "gpumem"]
    assert api == cli
