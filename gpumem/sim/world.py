"""``gpumem simulate --nnodes N --nproc-per-node G --ranks LIST|auto``: a job of
N x G ranks of which only the ranks asked for are started.

    python -m gpumem.sim.world --nnodes N --nproc-per-node G --ranks 0,7 -- script.py ARGS

Each started rank is its own process, started as torchrun starts a worker:
RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_WORLD_SIZE and the rest of torchrun's variables say where it is in
the full job, and it sees G simulated GPUs (cuda:LOCAL_RANK is its own).
It runs gpumem/sim/world_rank.py, which gives torch.distributed a store that
answers for the absent ranks (Note [The stand-in store]) and then runs the
script.  This launcher waits for every started rank; when one fails it
stops the others (as torchrun does) and exits with the first failure's
status.  Nothing here imports torch.

Note [Which ranks stand for which]
Rationale: the report has a row per started rank and must say which ranks
  of the job each row stands for, and why.
Approach: with a user's list each started rank stands for itself ("user
  list"); nothing is claimed about the others.  With ``auto``: rank 0 and
  the last rank.  Under data parallelism (DDP, FSDP, FSDP2, HSDP) every rank
  holds the same shapes except where a dimension does not divide by the
  world: torch.chunk gives the last rank the short (or empty) piece, and
  FSDP2 pads every shard to the same size; so rank 0 stands for ranks 0 to
  W-2 and the last rank for itself.
  After the run the started ranks' device meshes (init_device_mesh, noted
  by gpumem/sim/world_rank.py) are read: a mesh over the whole job with a
  dimension named cp, context, pp or pipe gets one sentence in the report
  naming a list that starts a rank at each place along it (auto_advice).
Limitations: auto chooses before the script runs: tensor-parallel groups
  that split unevenly elsewhere than at the last rank, context-parallel
  ranks (whose peaks differ by their place in the ring: 4 ranks of
  tests/sim/test_world_exact.py's cp job peak at four different figures)
  and pipeline stages (which differ by stage, and cannot run yet: Note
  [Objects from peers] in gpumem/sim/world_rank.py) are not started
  unless listed; the report's sentence names the list for the last two
  when the mesh names them so, and meshes built otherwise than with
  init_device_mesh are not seen.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Optional

__all__ = ["WorldError", "MAX_WORLD", "parse_ranks", "parse_nnodes", "stands_for",
           "rank_env", "launch_command", "ranks_text", "main"]

MAX_WORLD = 65536
MAX_STARTED = 64   # started ranks at once: each is a process with its own simulated GPU
STOP_GRACE = 10.0


class WorldError(ValueError):
    """A bad --nnodes or --ranks: one line for the user."""


def parse_nnodes(text: Optional[str]) -> Optional[int]:
    """--nnodes: a whole number from 1 up, or None."""
    if text is None:
        return None
    t = text.strip()
    if not re.fullmatch(r"[0-9]+", t) or int(t) < 1:
        raise WorldError(f"--nnodes must be a whole number from 1 up, not {text!r}; "
                         "nothing was run")
    return int(t)


def parse_ranks(text: str, world: int) -> list[int]:
    """--ranks LIST (``0,8,63``, ranges ``0-3``) or ``auto`` for a world of
    ``world`` ranks: the sorted ranks to start."""
    t = text.strip().lower()
    if t == "auto":
        return sorted({0, world - 1})
    out: set[int] = set()
    for part in t.split(","):
        m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        if not m:
            raise WorldError(f"--ranks takes a list of ranks such as 0,8,63 (or ranges such "
                             f"as 0-3), or auto, not {text!r}; nothing was run")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo > hi or hi >= world:
            raise WorldError(f"--ranks {text}: the job has ranks 0 to {world - 1} "
                             "(--nnodes x --nproc-per-node); nothing was run")
        out.update(range(lo, hi + 1))
    if len(out) > MAX_STARTED:
        raise WorldError(f"--ranks {text} starts {len(out)} ranks; at most {MAX_STARTED} are "
                         "started at once (each is a process); nothing was run")
    return sorted(out)


def ranks_text(ranks: list[int]) -> str:
    """``0-6, 9``: a sorted list of ranks with runs folded."""
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(parts)


def stands_for(ranks: list[int], world: int, auto: bool) -> dict[int, dict[str, Any]]:
    """Started rank -> {"ranks": the job's ranks its row stands for (folded
    text), "count", "why"} (Note [Which ranks stand for which])."""
    if not auto:
        return {r: {"ranks": str(r), "count": 1, "why": "user list"} for r in ranks}
    why = ("auto: data parallel ranks hold equal shapes; only the last rank can hold "
           "a shorter last piece (the device mesh is not read)")
    out = {0: {"ranks": ranks_text(list(range(0, max(world - 1, 1)))),
               "count": max(world - 1, 1), "why": why}}
    if world > 1:
        out[world - 1] = {"ranks": str(world - 1), "count": 1, "why": why}
    return out


# dimension names whose ranks peak differently by their place along it
_ROLE_DIMS = ("cp", "context", "pp", "pipe")


def auto_advice(meshes: list[dict[str, Any]], world: int, started: list[int]) -> Optional[str]:
    """After a --ranks auto run: when a device mesh the started ranks built
    over the whole world has a context- or pipeline-parallel dimension (ranks
    that peak differently by their place along it, which auto does not
    start), the sentence that says so and names a list that covers each
    place; None otherwise (Note [Which ranks stand for which]).  meshes:
    [{"names": [...], "shape": [...]}] as the ranks recorded them."""
    for m in meshes:
        names, shape = list(m.get("names") or []), [int(n) for n in m.get("shape") or []]
        size = 1
        for n in shape:
            size *= n
        if size != world or len(names) != len(shape):
            continue
        for i, (name, n) in enumerate(zip(names, shape)):
            if n < 2 or not any(k in str(name).lower() for k in _ROLE_DIMS):
                continue
            stride = size // _prefix(shape, i + 1)   # row-major: the dims after i
            ranks = sorted({j * stride for j in range(n)} | set(started))
            dims = " x ".join(f"{a} {b}" for a, b in zip(names, shape))
            return (f"the script's device mesh ({dims}) has a {name} dimension of {n}: its "
                    "ranks peak differently by their place along it (context parallel's "
                    "ring, pipeline stages), and --ranks auto does not start a rank at each "
                    f"place; to cover each, run with --ranks {ranks_text(ranks).replace(' ', '')}")
    return None


def _prefix(shape: list[int], k: int) -> int:
    out = 1
    for n in shape[:k]:
        out *= n
    return out


def rank_env(rank: int, nnodes: int, nproc: int) -> dict[str, str]:
    """The variables torchrun gives worker ``rank`` of an nnodes x nproc job
    (torch/distributed/elastic/agent/server/local_elastic_agent.py)."""
    world = nnodes * nproc
    return {"RANK": str(rank), "LOCAL_RANK": str(rank % nproc), "GROUP_RANK": str(rank // nproc),
            "ROLE_RANK": str(rank), "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(nproc),
            "WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": str(nnodes),
            "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "gpumem-simulate", "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                             "1")}


def _script(cmd: list[str]) -> list[str]:
    """script.py ARGS or -m module ARGS from the command after --."""
    from gpumem.sim.torchrun import LaunchError, _launcher_args, script_of
    if _launcher_args(cmd) is not None:
        raise WorldError("under --ranks gpumem starts the ranks itself: give the script "
                         "(script.py ARGS or -m module ARGS), not a torchrun command")
    try:
        return script_of(cmd, "--ranks 0 --nnodes 8 --nproc-per-node 8")
    except LaunchError as e:
        raise WorldError(str(e)) from None


def launch_command(cmd: list[str], nnodes: int, nproc: int, ranks: list[int]) -> list[str]:
    """The command that starts ``ranks`` of an nnodes x nproc job running cmd."""
    return [sys.executable, "-m", "gpumem.sim.world", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc), "--ranks", ",".join(map(str, ranks)),
            "--"] + _script(cmd)


def _run(script: list[str], nnodes: int, nproc: int, ranks: list[int]) -> int:
    if "OMP_NUM_THREADS" not in os.environ and nproc > 1:
        os.environ["OMP_NUM_THREADS"] = "1"   # as torchrun does
    procs = []
    for r in ranks:
        env = dict(os.environ, **rank_env(r, nnodes, nproc))
        procs.append(subprocess.Popen([sys.executable, "-u", "-m", "gpumem.sim.world_rank"]
                                      + script, env=env))
    got: list[int] = []

    def on_signal(signo: int, frame: Any) -> None:
        got.append(signo)
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signo)
                except OSError:
                    pass

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    first = 0
    deadline = None
    while any(p.poll() is None for p in procs):
        time.sleep(0.1)
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if failed and not first:
            first = failed[0]
            on_signal(signal.SIGTERM, None)   # torchrun stops the others when one fails
        if got and deadline is None:
            deadline = time.monotonic() + STOP_GRACE
        if deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            deadline = float("inf")
    if not first:
        first = next((p.returncode for p in procs if p.returncode), 0)
    return 128 - first if first < 0 else first


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpumem.sim.world")
    p.add_argument("--nnodes", required=True)
    p.add_argument("--nproc-per-node", required=True)
    p.add_argument("--ranks", required=True)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    try:
        nnodes = parse_nnodes(a.nnodes)
        nproc = int(a.nproc_per_node)
        world = nnodes * nproc
        if not 1 <= world <= MAX_WORLD:
            raise WorldError(f"the job has {world} ranks; at most {MAX_WORLD}")
        ranks = parse_ranks(a.ranks, world)
        script = _script(cmd)
    except (WorldError, ValueError) as e:
        print(f"gpumem: error: {e}", file=sys.stderr)
        return 2
    return _run(script, nnodes, nproc, ranks)


if __name__ == "__main__":
    sys.exit(main())
