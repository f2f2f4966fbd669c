"""What runs in each started rank of a representative-rank run (``gpumem
simulate --nnodes N --nproc-per-node G --ranks LIST``, gpumem/sim/world.py):
the stand-in store, then the script.

    python -m gpumem.sim.world_rank script.py ARGS      (or: -m module ARGS)

The rank has its real RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE and
LOCAL_WORLD_SIZE (set by the launcher), but most of its peers are never
started.  Before the script runs, torch.distributed's env:// and tcp://
rendezvous are pointed at a StandInStore in this process, so that
init_process_group, new_group, DeviceMesh and ProcessGroupNCCL find a store
that answers for the whole world; then the script runs as ``python
script.py`` would run it (runpy, as __main__, with sys.argv set).

Note [The stand-in store]
Rationale: torch.distributed's store is where ranks meet: the store-based
  barrier of new_group (and of init_process_group under
  TORCH_DIST_INIT_BARRIER=1) counts ranks in, ProcessGroupNCCL's rank 0 of
  each group publishes the ncclUniqueId that the others read.  With peers
  absent, a real TCPStore would wait for them forever.  The fake NCCL moves
  no data and needs no peer (simgpu/nccl/nccl_comm.c), so the store is the
  only thing a started rank waits on.
Approach: one store per rank, in the rank's own process (no server, no
  socket): a HashStore holds what this rank sets; a key that only another
  rank would set is answered as if that rank had set it.  wait() treats
  every key as set; check() sees only this rank's keys (ProcessGroupNCCL's
  watchdog checks for a peer's dump signal, which an absent rank never
  raises); get() of a key nobody here set returns NCCL_UNIQUE_ID_BYTES zero
  bytes (what ProcessGroupNCCL reads: an ncclUniqueId, which the fake NCCL
  ignores); add() counts this rank's own additions (the barrier then finds
  its last-worker key "set" by the absent last rank).  A full run's ranks
  exchange no data either, so no memory figure depends on the store.
Limitations: a script that reads values other ranks publish in the store
  itself (store.get of a key it did not set) gets zero bytes; a store passed
  to init_process_group(store=...) is used as given and waits for its
  peers; gloo, MPI and UCC connect to their peers and cannot run with ranks
  absent (creating such a group ends the rank with one line, status 2).

Note [Objects from peers]
Rationale: torch.distributed.recv_object_list receives a size and then
  pickled bytes that only the sending rank holds; the fake NCCL moves no
  data between ranks (simgpu/nccl/nccl_coll.c, Note [NCCL data]), in full
  runs as with ranks absent, so the receiver unpickles whatever its buffer
  held and fails with an unpickling error far from the cause.  torch 2.14's
  pipelining (PipelineStage and its schedules) takes this path: its stages
  vote with send/recv on whether the shapes the user gave suffice, the
  received vote reads 0, and the stages then exchange their shapes with
  recv_object_list.
Approach: under gpumem simulate (every process of the run, gpumem/sim/
  child.py) and in every started rank here, recv_object_list writes one line
  saying so and ends the process with status 2.
Limitations: python -m gpumem.sim with torch's allocator runs no code in
  the ranks, so there the unpickling error stays; broadcast_object_list and
  scatter_object_list on a rank other than the source get meaningless bytes
  in the same way and are not refused.  Moving Send/Recv data between the
  processes of a full run is not enough (tried on 2026-11-28 with a channel
  per communicator in the fake NCCL: the bytes arrived): the size that
  send_object_list sends is the output of torch.cat and the stages' vote a
  product, both kernels, which compute nothing here, so the receiver still
  reads sizes of 0.  Pipeline parallelism needs these exchanges answered in
  Python (from the store) in every rank, under both allocators.
"""

from __future__ import annotations

import os
import runpy
import sys
from datetime import timedelta
from typing import Any

__all__ = ["NCCL_UNIQUE_ID_BYTES", "ENV_WORLD", "PEER_OBJECTS", "refuse_peer_objects", "install",
           "main"]

NCCL_UNIQUE_ID_BYTES = 128      # sizeof(ncclUniqueId): NCCL_UNIQUE_ID_BYTES in nccl.h
ENV_WORLD = "GPUMEM_SIM_WORLD"  # "started/world", e.g. "0,7/8": set by gpumem/sim/world.py
PEER_OBJECTS = ("gpumem simulate: recv_object_list needs objects that another rank sends, and "
                "the simulated GPUs move no data between ranks (torch.distributed.pipelining "
                "exchanges its stages' shapes this way), so pipeline parallelism cannot run "
                "under the simulator yet\n")


def _store_class() -> Any:
    import torch.distributed as dist

    class StandInStore(dist.Store):
        """Note [The stand-in store]: this rank's store, answering for the absent ranks."""

        def __init__(self) -> None:
            super().__init__()
            self._own = dist.HashStore()

        def set(self, key: str, value: Any) -> None:
            self._own.set(key, value)

        def get(self, key: str) -> bytes:
            if self._own.check([key]):
                return self._own.get(key)
            return bytes(NCCL_UNIQUE_ID_BYTES)

        def add(self, key: str, value: int) -> int:
            return self._own.add(key, value)

        def check(self, keys: list) -> bool:
            return self._own.check(keys)   # a flag no absent rank raises (the watchdog's)

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            return self._own.compare_set(key, expected, desired)

        def delete_key(self, key: str) -> bool:
            return self._own.delete_key(key)

        def multi_get(self, keys: list) -> list:
            return [self.get(k) for k in keys]

        def multi_set(self, keys: list, values: list) -> None:
            for k, v in zip(keys, values):
                self._own.set(k, v)

        def append(self, key: str, value: Any) -> None:
            self._own.append(key, value)

        def num_keys(self) -> int:
            return self._own.num_keys()

        def set_timeout(self, timeout: timedelta) -> None:
            self._own.set_timeout(timeout)

        def wait(self, keys: list, timeout: Any = None) -> None:
            return None

        def clone(self) -> "StandInStore":
            return self

    return StandInStore


def refuse_peer_objects() -> None:
    """Note [Objects from peers]: recv_object_list ends the process with one line."""
    import torch.distributed as dist

    def recv_object_list(*args: Any, **kwargs: Any) -> Any:
        # os._exit, not SystemExit: a rank whose NCCL process group is mid-way
        # through a P2P exchange can crash in interpreter shutdown (exit
        # status 139 instead of 2, seen once in a loaded full-suite run)
        sys.stderr.write(PEER_OBJECTS)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(2)

    dist.recv_object_list = recv_object_list
    dist.distributed_c10d.recv_object_list = recv_object_list


_MESHES: list[dict[str, Any]] = []   # the device meshes this process built


def note_meshes() -> None:
    """Keep the shape and dimension names of every device mesh that
    init_device_mesh builds in this process (meshes_built()): after a
    --ranks auto run gpumem simulate reads them (world.auto_advice)."""
    import torch.distributed as dist
    import torch.distributed.device_mesh as dm
    own = dm.init_device_mesh
    if getattr(own, "_gpumem_notes", False):
        return

    def init_device_mesh(*args: Any, **kwargs: Any) -> Any:
        mesh = own(*args, **kwargs)
        try:
            _MESHES.append({"shape": [int(n) for n in mesh.shape],
                            "names": list(mesh.mesh_dim_names or [])})
        except Exception:   # noting is never the script's failure
            pass
        return mesh

    init_device_mesh._gpumem_notes = True   # type: ignore[attr-defined]
    dm.init_device_mesh = init_device_mesh
    if getattr(dist, "init_device_mesh", None) is own:
        dist.init_device_mesh = init_device_mesh


def meshes_built() -> list[dict[str, Any]]:
    return list(_MESHES)


def install() -> None:
    """Point torch.distributed's env:// and tcp:// rendezvous at one StandInStore
    for this process, and refuse the gloo backend and recv_object_list with one
    line each."""
    import torch.distributed as dist
    import importlib
    rdzv = importlib.import_module("torch.distributed.rendezvous")

    refuse_peer_objects()
    store = _store_class()()

    def handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any):
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        yield (store, rank, world)
        raise RuntimeError("gpumem simulate --ranks: no re-rendezvous")

    # torch offers no way to replace a registered handler: the table is private
    for scheme in ("env", "tcp"):
        rdzv._rendezvous_handlers[scheme] = handler
    c10d = dist.distributed_c10d
    helper = c10d._new_process_group_helper

    def new_process_group_helper(group_size: int, group_rank: Any, ranks: Any, backend: Any,
                                 *args: Any, **kwargs: Any) -> Any:
        words = str(backend).lower()
        if "gloo" in words or "mpi" in words or "ucc" in words:
            sys.stderr.write(f"gpumem simulate --ranks: the backend {backend} connects to "
                             "every peer, so it cannot run with ranks absent; use nccl, or run "
                             "all ranks (--nproc-per-node without --ranks)\n")
            raise SystemExit(2)
        return helper(group_size, group_rank, ranks, backend, *args, **kwargs)

    c10d._new_process_group_helper = new_process_group_helper


def main(argv: list) -> None:
    """Run ``script.py ARGS`` or ``-m module ARGS`` as this rank, after install()."""
    install()
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1]] + argv[2:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
