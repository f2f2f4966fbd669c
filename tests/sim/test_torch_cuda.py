"""gpumem.sim chooses the fake libraries of the CUDA major version the
command's torch was built for (gpumem/sim/torch_cuda.py), without importing
that torch: the command's interpreter (itself, or its script's #! line),
where its torch package is, and the cuda line of torch/version.py there.

Another interpreter is faked by a script named python3 that runs this one
with a fake torch package (version.py only) first on its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gpumem import sim
from gpumem.sim import torch_cuda
from sim_helpers import needs_cc


def _fake_python(tmp_path, cuda):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (site / "torch" / "version.py").write_text(textwrap.dedent(f'''
        from typing import Optional
        __version__ = '2.6.0+cu124'
        cuda: Optional[str] = {cuda!r}
    '''))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    py = bin_dir / "python3"
    py.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return py


def _script(path, first_line):
    path.write_text(first_line + "\nprint('hi')\n")
    path.chmod(0o755)
    return path


def test_the_command_interpreter_is_found(tmp_path):
    py = _fake_python(tmp_path, "12.4")
    env = {"PATH": f"{py.parent}{os.pathsep}/usr/bin:/bin"}
    assert torch_cuda.command_python([str(py), "train.py"], env) == str(py)
    assert torch_cuda.command_python(["python3", "train.py"], env) == str(py)
    tool = _script(tmp_path / "torchrun", f"#!{py}")
    assert torch_cuda.command_python([str(tool), "--nproc-per-node", "2", "t.py"], env) == str(py)
    tool = _script(tmp_path / "pytest", "#!/usr/bin/env -S python3 -u")
    assert torch_cuda.command_python([str(tool)], env) == str(py)
    assert torch_cuda.command_python([str(_script(tmp_path / "run.sh", "#!/bin/sh"))], env) is None
    assert torch_cuda.command_python([str(_script(tmp_path / "plain", "echo"))], env) is None
    assert torch_cuda.command_python(["no-such-command-here"], env) is None
    assert torch_cuda.command_python([], env) is None


def test_the_cuda_version_is_read_without_importing_torch(tmp_path):
    py = _fake_python(tmp_path, "12.4")
    assert torch_cuda.torch_cuda_version(str(py)) == "12.4"  # its __init__ raises if imported
    env = {"PATH": "/usr/bin:/bin"}
    assert torch_cuda.torch_cuda_major([str(py), "train.py"], env) == 12
    assert sim.cuda_major_for([str(py), "train.py"], env) == 12


def test_unknown_cpu_only_and_forced(tmp_path):
    py = _fake_python(tmp_path, None)  # a CPU-only torch: the newest set
    assert torch_cuda.torch_cuda_major([str(py)], {}) is None
    assert sim.cuda_major_for([str(py)], {}) == sim.CUDA_MAJOR
    assert sim.cuda_major_for([str(py)], {torch_cuda.ENV: "12"}) == 12
    assert sim.cuda_major_for(["anything"], {torch_cuda.ENV: "13.0"}) == 13
    with pytest.raises(sim.SimError, match="GPUMEM_SIM_CUDA='twelve'"):
        sim.cuda_major_for([str(py)], {torch_cuda.ENV: "twelve"})
    old = _fake_python(tmp_path / "old", "11.8")
    with pytest.raises(sim.SimError, match="built for CUDA 11; the simulated GPU has the "
                                           "libraries of CUDA 12 and 13"):
        sim.cuda_major_for([str(old)], {})


@needs_cc
@pytest.mark.slow  # builds the CUDA 12 libraries once per checkout
def test_launcher_preloads_the_set_of_the_commands_torch(tmp_path):
    py = _fake_python(tmp_path, "12.8")

    def preload(*cmd):
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", torch_cuda.ENV)
               and not k.startswith("GPUMEM_SIM_")}
        proc = subprocess.run([sys.executable, "-m", "gpumem.sim", "--print-env", "--", *cmd],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        line = next(l for l in proc.stdout.splitlines() if l.startswith("export LD_PRELOAD="))
        return [os.path.basename(p) for p in line.split("=", 1)[1].strip("'").split(":")]

    assert preload(str(py), "train.py") == sim.sonames(12)
    # this interpreter's torch (2.14.1, CUDA 13), found in-process
    assert preload(sys.executable, "train.py") == sim.sonames(13)
