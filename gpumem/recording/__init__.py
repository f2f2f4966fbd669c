"""Recording allocator events and writing snapshots.

Bottom to top:
  history   record_memory_history / snapshot / dump_snapshot (torch's API)
  oom       snapshots at out of memory: the shim's OOM hook, GPUMEM_OOM_SNAPSHOT
  recorder  ``with gpumem.record(path):`` (it installs gpumem in torch, so it
            sits above gpumem.pytorch)
"""
