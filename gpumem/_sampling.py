"""The sampled recording mode: its parameters, and the estimates it supports.

``gpumem.record(..., sample=...)``, ``record_memory_history(..., sample=...)``,
``GPUMEM_RECORD_SAMPLE`` and ``gpumem simulate --sample`` take the same
values (parse_sample): every allocation of at least the threshold records
its stack, smaller ones are sampled by bytes allocated (Note [Sampled
recording] in csrc/history/sample.c), so an allocation of s bytes has its
stack with probability 1 - exp(-s / mean).  Snapshots record the parameters
under SNAPSHOT_KEY, a top-level key torch's viewers ignore, and reports
divide by that probability (weight) so per-site counts and bytes are
unbiased estimates.  Pure Python; imports nothing of gpumem's but _conf's
number parser, so snapshot readers use it without the extension.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from gpumem._conf import parse_uint

__all__ = ["ENV_SAMPLE", "SNAPSHOT_KEY", "DEFAULT_MEAN", "DEFAULT_THRESHOLD", "SampleError",
           "parse_sample", "from_env", "resolve", "snapshot_params", "weight", "describe"]

#: The variable that turns the sampled mode on for recording started without
#: an explicit ``sample=`` (GPUMEM_OOM_SNAPSHOT's included).
ENV_SAMPLE = "GPUMEM_RECORD_SAMPLE"
#: The snapshot's top-level key: {"mean_bytes", "threshold_bytes", "seed"}.
SNAPSHOT_KEY = "gpumem_sampling"
#: Mean sampling interval below the threshold: tcmalloc's heap profiler's
#: default; an allocation of 64 KiB is sampled one time in 32.5, one of
#: 512 KiB in 4.5 (docs/benchmarks.md, "... the mean interval at
#: tcmalloc's 2 MiB").
DEFAULT_MEAN = 2 << 20
#: Always recorded at or above: torch's large-pool boundary (1 MiB).
DEFAULT_THRESHOLD = 1 << 20

_UNIT = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
         "g": 1 << 30, "gib": 1 << 30}
_SIZE = re.compile(r"([0-9]{1,20})([a-z]*)", re.ASCII)
_ON = ("1", "on", "true", "yes")
_OFF = ("", "0", "off", "false", "no", "none")
_FORMS = ("True, a mean interval in bytes (524288, '512KiB'), or "
          "'mean:512KiB,threshold:1MiB,seed:7'")


class SampleError(ValueError):
    """A value of sample= or GPUMEM_RECORD_SAMPLE that is not understood."""


def _bytes(text: str, what: str, source: str) -> int:
    m = _SIZE.fullmatch(text.lower())
    n = parse_uint(m.group(1), 1 << 62) if m and m.group(2) in _UNIT else None
    if not n:
        raise SampleError(f"{source}: bad {what} {text[:40]!r}: use a positive number of bytes "
                          "with an optional unit (B, KiB, MiB, GiB)")
    value = n * _UNIT[m.group(2)]
    if value >= 1 << 62:
        raise SampleError(f"{source}: {what} {text[:40]!r} is too large (below 2**62 bytes)")
    return value


def parse_sample(value: Any, source: str = "sample") -> dict | None:
    """sample= or GPUMEM_RECORD_SAMPLE -> None (every stack recorded) or
    {"mean_bytes", "threshold_bytes", "seed"} (seed None: drawn at start).

    None, False, '' and 'off' are off; True and 'on' are the defaults
    (DEFAULT_MEAN, DEFAULT_THRESHOLD); an int or a size string is the mean
    interval; 'mean:SIZE,threshold:SIZE,seed:N' sets each (any may be left
    out).  Raises SampleError with one line naming what is wrong."""
    if value is None or value is False:
        return None
    out = {"mean_bytes": DEFAULT_MEAN, "threshold_bytes": DEFAULT_THRESHOLD, "seed": None}
    if value is True:
        return out
    if isinstance(value, int):
        if not 0 < value < 1 << 62:
            raise SampleError(f"{source}: the mean interval must be a positive number of bytes "
                              f"below 2**62, not {value}")
        out["mean_bytes"] = value
        return out
    if isinstance(value, dict):  # recording_config()'s form, given back
        for key in ("mean_bytes", "threshold_bytes"):
            v = value.get(key, out[key])
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 1 << 62:
                raise SampleError(f"{source}: {key} must be a positive int below 2**62, not {v!r}")
            out[key] = v
        seed = value.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not 0 <= seed < 1 << 64):
            raise SampleError(f"{source}: seed must be an int in [0, 2**64), not {seed!r}")
        out["seed"] = seed
        return out
    if not isinstance(value, str):
        raise SampleError(f"{source} must be {_FORMS}; not a {type(value).__name__}")
    text = "".join(value.split())
    if text.lower() in _OFF:
        return None
    if text.lower() in _ON:
        return out
    if ":" not in text:
        out["mean_bytes"] = _bytes(text, "mean interval", source)
        return out
    for entry in filter(None, text.split(",")):
        key, _, val = entry.partition(":")
        if key == "mean":
            out["mean_bytes"] = _bytes(val, "mean interval", source)
        elif key == "threshold":
            out["threshold_bytes"] = _bytes(val, "threshold", source)
        elif key == "seed" and parse_uint(val, (1 << 64) - 1) is not None:
            out["seed"] = parse_uint(val, (1 << 64) - 1)
        elif key == "seed":
            raise SampleError(f"{source}: bad seed {val[:40]!r}: use an integer in [0, 2**64)")
        else:
            raise SampleError(f"{source}: unknown entry {entry[:40]!r}; use {_FORMS}")
    return out


def from_env(environ: Any = None) -> dict | None:
    """GPUMEM_RECORD_SAMPLE's parameters, or None when unset or off."""
    environ = os.environ if environ is None else environ
    return parse_sample(environ.get(ENV_SAMPLE), ENV_SAMPLE)


def resolve(sample: Any) -> dict | None:
    """sample= as given, GPUMEM_RECORD_SAMPLE's value when None; a seed is
    drawn for parameters without one, so the snapshot can name it."""
    params = from_env() if sample is None else parse_sample(sample)
    if params is not None and params["seed"] is None:
        params = dict(params, seed=int.from_bytes(os.urandom(8), "little"))
    return params


def snapshot_params(snap: Any) -> dict | None:
    """The sampling parameters a snapshot records, or None (every stack
    recorded, or a key that is not well formed: hostile files read as
    unsampled)."""
    p = snap.get(SNAPSHOT_KEY) if isinstance(snap, dict) else None
    if not isinstance(p, dict):
        return None
    mean, threshold = p.get("mean_bytes"), p.get("threshold_bytes")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 62
             for v in (mean, threshold))
    return {"mean_bytes": mean, "threshold_bytes": threshold, "seed": p.get("seed")} if ok else None


def weight(size: int, params: dict) -> float:
    """How many allocations of ``size`` bytes one recorded with a stack
    stands for: 1 at or above the threshold, else 1 / (1 - exp(-size / mean))."""
    if size >= params["threshold_bytes"]:
        return 1.0
    if size <= 0:
        return 1.0
    return 1.0 / -math.expm1(-size / params["mean_bytes"])


def describe(params: dict) -> str:
    """One line for reports."""
    from gpumem._format import format_bytes
    return (f"sampled recording: every allocation of {format_bytes(params['threshold_bytes'])} "
            f"or more has its stack, smaller ones one per {format_bytes(params['mean_bytes'])} "
            "allocated on average; counts and bytes per site marked ~ are estimates")
