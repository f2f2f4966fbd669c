"""This process's rank, and the per-rank file names that keep ranks apart.

Under torch.distributed (initialised) or with RANK / LOCAL_RANK set,
``_rank<N>`` goes before a file's extension (memory_rank3.pickle), so that
the snapshots of several ranks never overwrite each other.  torch is only
looked up in sys.modules, never imported.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Optional

from gpumem._conf import parse_uint

__all__ = ["current_rank", "rank_path", "rank_of_path"]

_RANK_RE = re.compile(r"(?:^|[_.-])rank([0-9]+)$")


def current_rank() -> Optional[int]:
    """This process's rank: torch.distributed's if initialised, else RANK, else LOCAL_RANK
    (a variable that is not a whole number in ASCII digits is ignored)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:  # a half-torn-down process group: fall back to the environment
            pass
    for var in ("RANK", "LOCAL_RANK"):
        rank = parse_uint(os.environ.get(var, "").strip(), 2**31 - 1)
        if rank is not None:
            return rank
    return None


def rank_path(path: str | os.PathLike[str], rank: Optional[int] = None) -> str:
    """``path`` with ``_rank<N>`` before its extension when a rank is known."""
    path = os.fspath(path)
    if rank is None:
        rank = current_rank()
    if rank is None:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}_rank{rank}{ext}"


def rank_of_path(path: str | os.PathLike[str]) -> Optional[int]:
    """The N of a per-rank file name: ``_rank<N>`` (or a name that is ``rank<N>``)
    before the extension, as rank_path writes it (snapshot_rank3.pickle,
    oom_host_12_1_rank3.pickle); None for a file of no rank."""
    m = _RANK_RE.search(os.path.splitext(os.path.basename(os.fspath(path)))[0])
    return int(m.group(1)) if m else None
