"""Snapshots: reading, analysing, viewing, diffing and replaying them.

Nothing here needs torch; only replay needs the C extension (imported when a
replay runs).  Bottom to top:
  pickle_scan   bounds a pickle's memo before it is loaded
  unpickle      the one loader: restricted unpickling, schema checks, limits
  origin        whether a file is library code (judged by where it lives)
  sites         allocation sites: interned stacks and their innermost user frame
  timeline      the model of one device built from the trace (DeviceModel)
  summary       gpumem summary and diff: bytes by site, segment totals, steps
  rank_summary  gpumem summary DIR: one row per rank and device
  view          gpumem view: the offline HTML viewer
  replay        gpumem replay: a trace run through gpumem's allocator core
"""
