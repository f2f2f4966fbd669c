"""The torch releases gpumem supports (2.6 to 2.14): any other gets one line
saying which torch was found, which releases are supported and what to do,
from install(), gpumem doctor and gpumem build-shim; a build that fails
never dumps the compiler's output: the line names the log that holds it.

The unsupported release is faked (torch.__version__ set before gpumem looks
at it): the check reads nothing else, so no second torch is installed."""

from __future__ import annotations

import os
import stat

import pytest

from gpumem.pytorch import shim_build as _shim_build
from torch_helpers import last_json, run_py


@pytest.mark.parametrize("version", ["2.6.0", "2.6.0+cu124", "2.7.1", "2.10.0+cu128",
                                     "2.13.0+cpu", "2.14.1+cu130", "2.12.0a0+git1234abc"])
def test_supported_releases_pass(version):
    _shim_build.check_torch_release(version)


@pytest.mark.parametrize("version,newer", [("2.5.1+cu124", False), ("1.13.1", False),
                                           ("2.15.0", True), ("3.0.0", True),
                                           ("not-a-version", False)])
def test_other_releases_get_one_line(version, newer):
    with pytest.raises(_shim_build.ShimBuildError) as e:
        _shim_build.check_torch_release(version)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"this is torch {version}" in msg and "supports torch 2.6 to 2.14" in msg, msg
    assert "pip install 'torch>=2.6,<2.15'" in msg, msg
    assert ("a gpumem that supports this one" in msg) == newer, msg


FAKE_TORCH = '''
    import contextlib, io, json, sys
    import torch
    torch.__version__ = "2.5.1+cu124"
    import gpumem
    from gpumem import cli
    out = {}
    try:
        gpumem.install()
    except gpumem.InstallError as e:
        out["install"] = str(e)
    for cmd in (["doctor", "--no-selftest"], ["build-shim"]):
        o, e = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            rc = cli.main(cmd)
        out[cmd[0]] = {"rc": rc, "stdout": o.getvalue(), "stderr": e.getvalue()}
    print(json.dumps(out))
'''


@pytest.mark.slow
def test_unsupported_torch_is_named_in_one_line(tmp_path):
    proc = run_py(FAKE_TORCH, env={"GPUMEM_CACHE_DIR": str(tmp_path), "GPUMEM_SHIM_BUILD": "1"})
    o = last_json(proc.stdout)
    want = "gpumem supports torch 2.6 to 2.14, and this is torch 2.5.1+cu124"
    assert o["install"].startswith("gpumem.install(): " + want) and "\n" not in o["install"], o
    doctor = o["doctor"]
    assert doctor["rc"] == 1, doctor
    lines = [line for line in doctor["stdout"].splitlines() if line.startswith("FAIL")]
    assert len(lines) == 1 and lines[0].startswith("FAIL  torch") and want in lines[0], doctor
    assert doctor["stdout"].splitlines()[-1].startswith("verdict: PROBLEM"), doctor  # names it too
    assert "torch shim" not in doctor["stdout"], doctor  # nothing repeated about the shim
    shim = o["build-shim"]
    assert shim["rc"] == 2 and shim["stderr"].count("\n") == 1 and want in shim["stderr"], shim
    assert not list(tmp_path.iterdir())  # nothing built, nothing left behind


@pytest.mark.slow
def test_failed_build_names_its_log(tmp_path):
    """A compiler that fails: one line with its first error and the log's name."""
    cxx = tmp_path / "fake-c++"
    cxx.write_text("#!/bin/sh\n"  # compiles fail; version and ABI probes ask the real one
                   "case \" $* \" in *\" -c \"*) ;; *) exec c++ \"$@\";; esac\n"
                   "for i in $(seq 500); do echo \"note: noise line $i of the dump\"; done\n"
                   "echo 'gm_torch_alloc.cpp:1:1: error: the first error'\n"
                   "echo 'gm_torch_alloc.cpp:2:1: error: the second error'\n"
                   "exit 1\n")
    cxx.chmod(cxx.stat().st_mode | stat.S_IEXEC)
    proc = run_py('''
        import json
        from gpumem import cli
        import contextlib, io
        e = io.StringIO()
        with contextlib.redirect_stderr(e):
            rc = cli.main(["build-shim"])
        print(json.dumps({"rc": rc, "stderr": e.getvalue()}))
    ''', env={"GPUMEM_CACHE_DIR": str(tmp_path / "cache"), "GPUMEM_SHIM_BUILD": "1",
              "CXX": str(cxx)}, timeout=600)
    o = last_json(proc.stdout)
    lines = [line for line in o["stderr"].splitlines() if not line.startswith("gpumem: building")]
    assert o["rc"] == 2 and len(lines) == 1, o
    assert "error: the first error" in lines[0] and "second" not in lines[0], lines
    assert "noise" not in o["stderr"] and "noise" not in proc.stdout
    log = lines[0].rsplit("the full log is in ", 1)[1]
    assert os.path.isfile(log) and "noise line 500" in open(log).read()


# Other torch releases, each in a venv of its own (not this one's torch):
# GPUMEM_TEST_TORCH_PYTHONS=/venvs/t26/bin/python:/venvs/t210/bin/python, each
# with gpumem installed (pip install --no-deps -e .). Without a GPU for them
# (the simulated one carries CUDA 13's libraries), this checks what runs
# without one: the shim builds, loads, and install() puts it under torch.
OTHER_PYTHONS = [p for p in os.environ.get("GPUMEM_TEST_TORCH_PYTHONS", "").split(os.pathsep) if p]

INSTALL_WITHOUT_GPU = '''
    import json, warnings
    import torch, gpumem
    from gpumem.pytorch import shim_state as _shim_state
    gpumem.install()
    shim = _shim_state.shim()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.memory._set_allocator_settings(
            "expandable_segments:True,max_split_size_mb:64,release_lock_on_cudamalloc:True")
    s = shim.settings()
    print(json.dumps({"torch": torch.__version__, "installed": gpumem.is_installed(),
                      "shim_torch": shim.build_info()["torch_version"],
                      "followed": [s["expandable_segments"], s["max_split_size"]],
                      "warned": [str(w.message) for w in caught],
                      "conf": shim.allocator_settings()["PYTORCH_CUDA_ALLOC_CONF"]}))
'''


@pytest.mark.slow
@pytest.mark.skipif(not OTHER_PYTHONS, reason="GPUMEM_TEST_TORCH_PYTHONS names no other torch")
@pytest.mark.parametrize("python", OTHER_PYTHONS)
def test_install_on_another_torch_without_a_gpu(python, tmp_path):
    import subprocess
    import textwrap
    env = dict(os.environ, GPUMEM_CACHE_DIR=os.environ.get("GPUMEM_TEST_TORCH_CACHE",
                                                             str(tmp_path)))
    proc = subprocess.run([python, "-m", "gpumem", "build-shim"], capture_output=True, text=True,
                          env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([python, "-c", textwrap.dedent(INSTALL_WITHOUT_GPU)],
                          capture_output=True, text=True, env=dict(env, GPUMEM_SHIM_BUILD="0"),
                          timeout=600)
    o = last_json(proc.stdout)
    assert o["installed"] and o["shim_torch"] == o["torch"], o
    assert o["followed"] == [True, 64 << 20], o  # torch's setter reaches gpumem
    assert any("release_lock_on_cudamalloc" in w for w in o["warned"]), o
    assert "max_split_size_mb:64" in o["conf"], o
