"""Categories of recorded allocations: the table a snapshot carries, worked out
from the event trace and what the torch hooks (gpumem.categories.tagger) noted.

Pure Python, no torch: it takes one device's events, the number of its oldest
event in the ring's numbering (``_C._hist_seq``), the tags noted while
recording, ``(seq, addr, role)``, and the phase changes, ``(seq, phase)``, and
gives each event the category of the allocation it belongs to.

Note [Categories follow the allocation]
Rationale: torch reuses a block as soon as it is freed, so a category keyed by
  address alone would give an activation the gradient's category when
  zero_grad(set_to_none=True) hands the gradient's memory to the next forward.
Approach: a tag made at seq t names the allocation live at its address at t:
  the last ``alloc`` before t that no free has ended.  Events are numbered in
  the ring's numbering, which no clear and no takeover resets, so tags and
  events order exactly even across threads (a tensor is tagged after the
  event that allocated it was pushed).  A tag that finds no live allocation in
  the window names a block allocated before it (a parameter created before
  recording): it is kept for that address until a free there ends it.
  Untagged allocations take their category from the phase they happen in
  and from how long they live (Note [Categories from the phase]).
Limitations: an event the ring failed to store (host memory exhausted)
  shifts the numbering of the events before it; their categories may then be
  wrong.  Allocations outside every phase and never tagged are 'unknown'.

Note [Categories from the phase]
Rationale: what autograd saves for backward is what forward allocated and
  backward still needs; asking autograd (saved-tensors hooks) costs a Python
  call per saved tensor, while the trace already says when each allocation
  is freed.
Approach: an untagged allocation made in forward is an activation if it is
  still alive when the next backward starts (or, with no backward after it,
  at the end of the trace: a snapshot taken in forward), a temporary if it
  is freed before, and unknown if it is still alive when the backward after
  that starts (a backward frees what it needed: this is memory kept from
  step to step, such as cuBLAS's workspace).  One made in an optimizer step
  and still alive when the step ends is optimizer state, a temporary
  otherwise; one made in backward is an autograd detail; any other is
  unknown.  Before these, an untagged allocation still alive at the end of
  the trace whose stack passes through torch's cuBLAS handle pool is a
  workspace (torch keeps one per handle and stream until told to clear
  them).
Limitations: workspaces are found only in stacks with C++ frames
  (stacks='all'); with Python stacks alone, one made in the first recorded
  forward is unknown, or an activation when the trace holds one backward
  only.  Saved tensors kept across backwards (retain_graph=True, pipelined
  schedules that run two forwards before their backwards) are unknown.  A
  forward tensor the user keeps into backward without autograd saving it
  (a logged output) counts as an activation; a forward with no backward at
  all leaves its last outputs as activations.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Optional

__all__ = ["CATEGORIES", "ROLES", "PHASES", "TABLE_KEY", "resolve_device", "block_categories",
           "phase_category"]

#: Every category, in the order the table's indices use (new ones go at the
#: end: a table written before them is a prefix and stays readable).
CATEGORIES = ("parameter", "optimizer_state", "gradient", "activation", "input",
              "temporary", "autograd_detail", "unknown", "workspace")
#: Roles a tag can give, strongest first (a parameter saved for backward is a parameter).
ROLES = ("parameter", "gradient", "optimizer_state", "input", "activation")
_RANK = {r: i for i, r in enumerate(ROLES)}
#: Phases, as noted by the hooks.
PHASES = ("other", "forward", "backward", "optimizer")
#: The snapshot's top-level key (MemoryViz and _memory_viz ignore unknown top-level keys;
#: a per-entry 'category' key would make MemoryViz colour by it).
TABLE_KEY = "gpumem_categories"

_ALLOC_ACTIONS = ("alloc",)
#: torch's cuBLAS handle pool, which allocates each handle's workspace (the
#: C++ frames of a stack recorded with stacks='all').
_WORKSPACE_FRAMES = ("at::cuda::getCurrentCUDABlasHandle", "at::cuda::getCUDABlasLtWorkspace")
_FREE_ACTIONS = ("free_requested", "free_completed")


def phase_category(phase: str, outlives: bool = False) -> str:
    """The category of an untagged allocation made in ``phase``; ``outlives``:
    it is still alive when the phase's work ends (Note [Categories from the
    phase]: the next backward for forward, the step's end for an optimizer)."""
    if phase == "forward":
        return "activation" if outlives else "temporary"
    if phase == "optimizer":
        return "optimizer_state" if outlives else "temporary"
    return "autograd_detail" if phase == "backward" else "unknown"


def _stronger(a: Optional[str], b: str) -> str:
    return b if a is None or _RANK[b] < _RANK[a] else a


def resolve_device(events: list, first_seq: int, tags: Iterable[tuple],
                   phases: Iterable[tuple]) -> tuple[list, list, dict]:
    """Categories and phases of one device's events.

    Returns (cats, phs, pre): cats[i] is the category index of event i when
    it is an alloc, free_requested or free_completed (the allocation's), else
    None; phs[i] the phase index the event happened in; pre maps addresses
    of allocations made before the window (still live at its end, or freed in
    it) to the role their tags gave.
    """
    tags = sorted(tags)
    phases = sorted(phases)
    phase_seqs = [p[0] for p in phases]
    n = len(events)
    role: list[Optional[str]] = [None] * n       # by alloc index
    live: dict[int, int] = {}                    # addr -> alloc index
    pre: dict[int, str] = {}                     # addr -> role (allocated before the window)
    pre_gone: set[int] = set()                   # pre-window blocks freed in the window
    phs: list[int] = [0] * n
    freed: list[Optional[int]] = [None] * n      # by alloc index: seq of its free_requested
    ti = 0
    for i, e in enumerate(events):
        seq = first_seq + i
        while ti < len(tags) and tags[ti][0] <= seq:
            _, addr, r = tags[ti]
            ti += 1
            j = live.get(addr)
            if j is not None:
                role[j] = _stronger(role[j], r)
            elif addr not in pre_gone:
                pre[addr] = _stronger(pre.get(addr), r)
        k = bisect.bisect_right(phase_seqs, seq) - 1
        phs[i] = PHASES.index(phases[k][1]) if k >= 0 else 0
        act = e.get("action")
        if act in _ALLOC_ACTIONS:
            live[e["addr"]] = i
        elif act == "free_requested":
            j = live.pop(e["addr"], None)
            if j is None:
                pre_gone.add(e["addr"])
            else:
                freed[j] = seq
    for _, addr, r in tags[ti:]:   # tags after the last event
        j = live.get(addr)
        if j is not None:
            role[j] = _stronger(role[j], r)
        elif addr not in pre_gone:
            pre[addr] = _stronger(pre.get(addr), r)
    ends = _phase_ends(phases)
    outlives: list[Optional[bool]] = [False] * n
    for i in range(n):
        if role[i] is None and events[i].get("action") in _ALLOC_ACTIONS:
            if freed[i] is None and _workspace(events[i]):
                role[i] = "workspace"
                continue
            outlives[i] = _outlives(first_seq + i, freed[i], PHASES[phs[i]], ends)
    return _fill(events, role, phs, pre, outlives), phs, pre


def _workspace(e: dict) -> bool:
    """Whether the allocation was made by torch's cuBLAS handle pool."""
    for f in e.get("frames") or ():
        name = f.get("name") if isinstance(f, dict) else None
        if isinstance(name, str) and name.startswith(_WORKSPACE_FRAMES):
            return True
    return False


def _phase_ends(phases: list) -> dict:
    """Per phase with an end that matters: the sorted seqs at which it ends
    (forward: every backward start; optimizer: every change away from it)."""
    backward = [s for s, p in phases if p == "backward"]
    step_ends = [s for (_, p), (s, _) in zip(phases, phases[1:]) if p == "optimizer"]
    return {"forward": backward, "optimizer": step_ends}


def _outlives(seq: int, freed: Optional[int], phase: str, ends: dict) -> Optional[bool]:
    """Whether the allocation made at ``seq`` in ``phase`` and freed at
    ``freed`` (None: alive at the end of the trace) is alive when the phase's
    work ends (Note [Categories from the phase]); None for a forward
    allocation still alive when the backward after next starts (not an
    activation of its step)."""
    marks = ends.get(phase)
    if marks is None:
        return False
    k = bisect.bisect_right(marks, seq)
    if k == len(marks):   # the phase's work has not ended in the trace
        return freed is None and phase == "forward"
    if freed is not None and freed < marks[k]:
        return False
    if phase == "forward" and k + 1 < len(marks) and (freed is None or freed >= marks[k + 1]):
        return None
    return True


def _fill(events: list, role: list, phs: list, pre: dict, outlives: list) -> list:
    cats: list[Optional[int]] = [None] * len(events)
    open_: dict[int, int] = {}   # addr -> category of the live allocation
    for i, e in enumerate(events):
        act = e.get("action")
        if act in _ALLOC_ACTIONS:
            c = role[i] or ("unknown" if outlives[i] is None
                            else phase_category(PHASES[phs[i]], outlives[i]))
            cats[i] = open_[e["addr"]] = CATEGORIES.index(c)
        elif act in _FREE_ACTIONS:
            addr = e["addr"]
            c = open_.get(addr)
            if c is None:
                c = CATEGORIES.index(pre.get(addr, "unknown"))
            cats[i] = c
            if act == "free_completed":
                open_.pop(addr, None)
    return cats


def block_categories(segments: list, device_traces: list, cats: list, pres: list) -> list:
    """Per segment, per block: the category index of each active block, else None.

    A block is matched to the last alloc at its address in its device's
    trace that no free_requested has ended; one allocated before the window
    takes its pre-window tags (or 'unknown')."""
    live_by_dev = []
    for d, events in enumerate(device_traces):
        live: dict[int, int] = {}
        for i, e in enumerate(events):
            if e.get("action") in _ALLOC_ACTIONS:
                live[e["addr"]] = cats[d][i]
            elif e.get("action") == "free_requested":
                live.pop(e["addr"], None)
        live_by_dev.append(live)
    unknown = CATEGORIES.index("unknown")
    out = []
    for seg in segments:
        d = seg.get("device", 0)
        live = live_by_dev[d] if d < len(live_by_dev) else {}
        pre = pres[d] if d < len(pres) else {}
        row = []
        for b in seg.get("blocks", []):
            if b.get("state") == "inactive":
                row.append(None)
                continue
            addr = b.get("address")
            c = live.get(addr)
            if c is None:
                c = CATEGORIES.index(pre[addr]) if addr in pre else unknown
            row.append(c)
        out.append(row)
    return out
