"""``gpumem simulate --nproc-per-node N``: the launcher command and the device count.

Under --nproc-per-node the command after ``--`` (``script.py ARGS``,
``python script.py ARGS``, ``-m module ARGS`` or ``python -m module ARGS``)
is run by torch's elastic launcher, as torchrun runs it: ``python -m
torch.distributed.run --standalone --nproc-per-node N``, with the same Python
as gpumem's, so that each rank is its own process on its own simulated GPU
(cuda:LOCAL_RANK) and the run exposes N devices.  A command that already
is a launcher (``torchrun ...``, ``python -m torch.distributed.run ...``) is
run as it is; its ``--nproc-per-node`` gives the device count when
``--devices`` is not given.  The host-memory flags live here too (one place
to merge with the fake driver's "no host memory" mode).
Nothing here runs anything or imports torch.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Optional

__all__ = ["LaunchError", "add_arguments", "parse_nproc", "launch_command", "script_of",
           "devices_for",
           "host_memory_env", "ENV_NO_HOST_MEMORY"]

ENV_NO_HOST_MEMORY = "GPUMEM_FAKECUDA_NO_HOST_MEMORY"
MAX_NPROC = 16   # sim.sim_env's limit on simulated devices


class LaunchError(ValueError):
    """A bad --nproc-per-node, --devices or command: one line for the user."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """--nproc-per-node and the host-memory pair (for simulate.add_arguments)."""
    p.add_argument("--nproc-per-node", default=None, metavar="N",
                   help="run the command on N ranks, one process and one simulated GPU each, "
                        "through torch's elastic launcher (what torchrun does): the command is "
                        "script.py ARGS, python script.py ARGS or -m module ARGS; implies "
                        "--devices N and --no-host-memory")
    host = p.add_mutually_exclusive_group()
    host.add_argument("--no-host-memory", dest="host_memory", action="store_false", default=None,
                      help=f"simulated device memory takes no host memory ({ENV_NO_HOST_MEMORY}=1"
                           "; the default under --nproc-per-node)")
    host.add_argument("--host-memory", dest="host_memory", action="store_true", default=None,
                      help="simulated device memory is backed by host memory (the default "
                           "without --nproc-per-node)")


def host_memory_env(env: dict, host_memory: Optional[bool], nproc: Optional[int]) -> None:
    """Set or clear GPUMEM_FAKECUDA_NO_HOST_MEMORY in the child's env: on with
    --no-host-memory or under --nproc-per-node, off with --host-memory; with
    neither flag nor --nproc-per-node, the user's own value (if any) stays."""
    if host_memory is None:
        if nproc is None:
            return
        host_memory = False
    if host_memory:
        env.pop(ENV_NO_HOST_MEMORY, None)
    else:
        env[ENV_NO_HOST_MEMORY] = "1"


def parse_nproc(text: Optional[str]) -> Optional[int]:
    """--nproc-per-node's value: a whole number from 1 to MAX_NPROC, or None."""
    if text is None:
        return None
    t = text.strip()
    if not re.fullmatch(r"[0-9]+", t) or not 1 <= int(t) <= MAX_NPROC:
        raise LaunchError(f"--nproc-per-node must be a whole number from 1 to {MAX_NPROC} "
                          f"(one rank per simulated GPU), not {text!r}; nothing was run")
    return int(t)


def _is_python(word: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", os.path.basename(word)) is not None or \
        os.path.abspath(word) == os.path.abspath(sys.executable)


def _launcher_args(cmd: list[str]) -> Optional[list[str]]:
    """The launcher's own arguments when cmd already is torchrun or
    ``python -m torch.distributed.run``; else None."""
    if cmd and os.path.basename(cmd[0]) == "torchrun":
        return cmd[1:]
    if len(cmd) >= 3 and _is_python(cmd[0]) and cmd[1] == "-m" and \
            cmd[2] in ("torch.distributed.run", "torch.distributed.launch"):
        return cmd[3:]
    return None


def _torchrun_nproc(args: list[str]) -> Optional[int]:
    """--nproc-per-node N (or --nproc_per_node, =N) among a launcher's arguments, up to
    the script; None when absent or not a number (gpu, auto, cpu: torchrun decides)."""
    for i, a in enumerate(args):
        if not a.startswith("-"):
            return None   # the script: what follows is its own
        m = re.fullmatch(r"--nproc[-_]per[-_]node(?:=(.*))?", a)
        if m:
            value = m.group(1) if m.group(1) is not None else (args[i + 1] if i + 1 < len(args)
                                                              else "")
            return int(value) if re.fullmatch(r"[0-9]+", value) else None
    return None


def devices_for(devices: Optional[int], nproc: Optional[int], cmd: list[str]) -> int:
    """The number of simulated GPUs: --devices, else --nproc-per-node, else the
    nproc of a torchrun command, else 1.  A --devices that differs from
    --nproc-per-node is refused."""
    if nproc is not None:
        if devices is not None and devices != nproc:
            raise LaunchError(f"--devices {devices} conflicts with --nproc-per-node {nproc} "
                              "(each rank has its own simulated GPU); drop --devices")
        if _launcher_args(cmd) is not None:
            raise LaunchError("the command is already a launcher (torchrun); give either "
                              "--nproc-per-node to gpumem simulate or torchrun's own, not both")
        return nproc
    if devices is not None:
        return devices
    inner = _launcher_args(cmd)
    n = _torchrun_nproc(inner) if inner is not None else None
    return n if n is not None and 1 <= n <= MAX_NPROC else 1


def script_of(cmd: list[str], example: str = "--nproc-per-node 2") -> list[str]:
    """``script.py ARGS`` or ``-m module ARGS`` from the command after --
    (``python`` dropped); example: the flags of the usage the errors show."""
    rest = list(cmd)
    if rest and _is_python(rest[0]):
        rest = rest[1:]
    if not rest:
        raise LaunchError(f"no script given; put it after --, for example: gpumem simulate "
                          f"{example} -- train.py")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise LaunchError("-m needs a module name, for example: -- -m pkg.train")
    elif rest[0].startswith("-"):
        raise LaunchError(f"under {example.split()[0]} the command is script.py ARGS or -m "
                          f"module ARGS; Python options such as {rest[0]} cannot be passed to "
                          "the ranks (set them through the environment, e.g. PYTHONUNBUFFERED=1)")
    return rest


def launch_command(cmd: list[str], nproc: int) -> list[str]:
    """The torch.distributed.run command that runs cmd on nproc ranks."""
    return ([sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", str(nproc)] + script_of(cmd))
