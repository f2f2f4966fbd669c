"""Allocator settings: the PYTORCH_CUDA_ALLOC_CONF syntax, for the keys gpumem supports.

    expandable_segments:True|False
    max_split_size_mb:N                   N >= 20 (MiB); stored in bytes
    garbage_collection_threshold:F        0 < F < 1
    roundup_power2_divisions:N            N a power of two, for every interval
    roundup_power2_divisions:[256:1,512:2,1024:4,>:8]

Entries are separated by ','; spaces are ignored, as torch's lexer ignores
them.  parse_conf() returns the dict that gpumem._C consumes:

    {'expandable_segments': bool,
     'max_split_size': int bytes, -1 when unlimited,
     'garbage_collection_threshold': float, 0.0 when off,
     'roundup_power2_divisions': 16 ints, 0 when off}

The 16 rounding intervals are the powers of two from 1 MiB to 32 GiB;
interval i holds request sizes in [2**i MiB, 2**(i+1) MiB), and the last
one also every larger size.  The list form follows torch's
AcceleratorAllocatorConfig::parseRoundUpPower2Divisions: a boundary B (MiB,
a power of two) sets interval log2(B) (clamped to 0..15); the first entry
also fills every interval below it; '>' fills every interval after the
previous entry; intervals not named keep 0.  Unlike torch, which ignores
keys it does not know, gpumem rejects every key it does not implement.

Numbers that do not fit what the allocator stores are clamped, as torch
clamps max_split_size_mb: max_split_size_mb to 2**43 - 1 MiB (its bytes fit
in 63 bits; 8 EiB is more than any device has) and division counts to 2**31
(stored in 32 bits; a count above the request size in 512-byte units rounds
like no division at all, so nothing below 1 TiB rounds differently).  Numbers
of 2**64 or more are refused, as torch's parser refuses them.  Integers are
written in ASCII digits: other Unicode digits ('²', '٣') are refused.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConfError", "parse_conf", "format_conf", "default_conf", "settings_for_snapshot",
           "snapshot_settings_of", "conf_from_snapshot_settings", "parse_uint",
           "ROUNDUP_INTERVALS", "ROUNDUP_BOUNDARIES_MB", "MAX_SPLIT_MB", "MAX_DIVISIONS"]

MiB = 1 << 20
ROUNDUP_INTERVALS = 16
ROUNDUP_BOUNDARIES_MB = tuple(1 << i for i in range(ROUNDUP_INTERVALS))  # 1 .. 32768
_MIN_SPLIT_MB = 20  # kLargeBuffer / 1 MiB: torch requires max_split_size_mb >= 20
MAX_SPLIT_MB = (1 << 43) - 1  # larger values are clamped to it: its bytes fit in 63 bits
MAX_DIVISIONS = 1 << 31       # larger division counts are clamped to it: stored in 32 bits

KEYS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
        "roundup_power2_divisions")
_ACCEPTED = ", ".join(KEYS)


class ConfError(ValueError):
    """An allocator settings string gpumem cannot accept."""


def default_conf() -> dict:
    """The settings used when none are given (torch's defaults)."""
    return {
        "expandable_segments": False,
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "roundup_power2_divisions": [0] * ROUNDUP_INTERVALS,
    }


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _lex(text: str) -> list[str]:
    """Split like torch's lexArgs: ',', ':', '[' and ']' are tokens; spaces vanish."""
    tokens: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf = []
            tokens.append(ch)
        elif not ch.isspace():
            buf.append(ch)
    if buf:
        tokens.append("".join(buf))
    return tokens


class _Tokens:
    def __init__(self, text: str) -> None:
        self.toks = _lex(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str | None:
        tok = self.peek()
        if tok is not None:
            self.i += 1
        return tok

    def expect(self, sep: str, key: str, accepted: str) -> None:
        tok = self.take()
        if tok != sep:
            found = "the end of the string" if tok is None else f"'{tok}'"
            raise ConfError(
                f"allocator setting '{key}' expects '{sep}' but found {found}; "
                f"write it as {accepted}"
            )

    def value(self, key: str, accepted: str) -> str:
        tok = self.take()
        if tok is None or tok in ",:[]":
            raise ConfError(f"allocator setting '{key}' has no value; write it as {accepted}")
        return tok


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _bad(key: str, value: str, accepted: str) -> ConfError:
    return ConfError(f"allocator setting '{key}' has bad value '{value}'; {accepted}")


def parse_uint(text: str, maximum: int) -> int | None:
    """``text`` as an integer in [0, maximum] if it is written in ASCII
    digits, else None.  str.isdigit() alone accepts '²' (which int() then
    refuses), and a string of thousands of digits makes int() raise, so
    neither reaches int()."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(maximum)):
        return None
    value = int(digits)
    return value if value <= maximum else None


_ES_FORM = "expandable_segments:True or expandable_segments:False"
_MS_FORM = f"max_split_size_mb:N with N an integer number of MiB, at least {_MIN_SPLIT_MB}"
_GC_FORM = "garbage_collection_threshold:F with 0 < F < 1"
_RP_FORM = ("roundup_power2_divisions:N with N a power of two, or a list such as "
            "roundup_power2_divisions:[256:1,512:2,>:8] whose keys are power-of-two MiB "
            "sizes (or '>') and whose values are powers of two or 0")


def _parse_expandable(t: _Tokens) -> bool:
    t.expect(":", "expandable_segments", _ES_FORM)
    v = t.value("expandable_segments", _ES_FORM)
    if v == "True":
        return True
    if v == "False":
        return False
    raise _bad("expandable_segments", v, "accepted values are True and False")


def _parse_max_split(t: _Tokens) -> int:
    t.expect(":", "max_split_size_mb", _MS_FORM)
    v = t.value("max_split_size_mb", _MS_FORM)
    n = parse_uint(v, (1 << 64) - 1)
    if n is None or n < _MIN_SPLIT_MB:
        raise _bad("max_split_size_mb", _short(v),
                   f"it must be an integer number of MiB, at least {_MIN_SPLIT_MB}")
    return min(n, MAX_SPLIT_MB) * MiB


def _parse_gc(t: _Tokens) -> float:
    t.expect(":", "garbage_collection_threshold", _GC_FORM)
    v = t.value("garbage_collection_threshold", _GC_FORM)
    try:
        f = float(v)
    except ValueError:
        f = float("nan")
    if not 0.0 < f < 1.0:
        raise _bad("garbage_collection_threshold", v,
                   "it must be a number greater than 0 and less than 1")
    return f


def _parse_roundup(t: _Tokens) -> list[int]:
    key = "roundup_power2_divisions"
    t.expect(":", key, _RP_FORM)
    if t.peek() != "[":
        v = t.value(key, _RP_FORM)
        n = parse_uint(v, (1 << 64) - 1)
        if n is None or not _is_pow2(n):
            raise _bad(key, _short(v), "it must be a power of two (1, 2, 4, 8, ...) or a "
                       "bracketed list")
        return [min(n, MAX_DIVISIONS)] * ROUNDUP_INTERVALS
    t.take()  # '['
    divs = [0] * ROUNDUP_INTERVALS
    first = True
    last_index = 0
    while True:
        tok = t.take()
        if tok == "]":
            break
        if tok is None:
            raise ConfError(f"allocator setting '{key}' has a list without its closing ']'; "
                            f"write it as {_RP_FORM}")
        boundary = tok
        t.expect(":", key, _RP_FORM)
        v = t.value(key, _RP_FORM)
        n = parse_uint(v, (1 << 64) - 1)
        if n is None or not (n == 0 or _is_pow2(n)):
            raise _bad(key, _short(f"{boundary}:{v}"),
                       "each division count must be a power of two, or 0 to turn "
                       "rounding off")
        n = min(n, MAX_DIVISIONS)
        if boundary == ">":
            for j in range(last_index + 1, ROUNDUP_INTERVALS):
                divs[j] = n
        else:
            b = parse_uint(boundary, 1 << 64)
            if b is None or not _is_pow2(b):
                raise _bad(key, _short(f"{boundary}:{v}"),
                           "each interval must be a power-of-two size in MiB "
                           "(1, 2, 4, ..., 32768) or '>'")
            index = min(b.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for j in range(index):
                    divs[j] = n
                first = False
            divs[index] = n
            last_index = index
        nxt = t.peek()
        if nxt == ",":
            t.take()
        elif nxt != "]":
            found = "the end of the string" if nxt is None else f"'{nxt}'"
            raise ConfError(f"allocator setting '{key}' expects ',' or ']' in its list but "
                            f"found {found}; write it as {_RP_FORM}")
    return divs


_PARSERS = {
    "expandable_segments": ("expandable_segments", _parse_expandable),
    "max_split_size_mb": ("max_split_size", _parse_max_split),
    "garbage_collection_threshold": ("garbage_collection_threshold", _parse_gc),
    "roundup_power2_divisions": ("roundup_power2_divisions", _parse_roundup),
}


def parse_conf(text: str | None) -> dict:
    """Parse an allocator settings string into gpumem's settings dict.

    ``None`` or an empty string gives the defaults.  A later entry for the
    same key replaces an earlier one, as in torch.  Raises ConfError.
    """
    conf = default_conf()
    if text is None:
        return conf
    if not isinstance(text, str):
        raise ConfError(f"allocator settings must be a string, not {type(text).__name__}")
    t = _Tokens(text)
    while t.peek() is not None:
        key = t.take()
        if key == ",":  # tolerate empty entries such as a trailing comma
            continue
        if key not in _PARSERS:
            raise ConfError(f"unknown allocator setting '{key}'; gpumem accepts {_ACCEPTED}")
        field, parse = _PARSERS[key]
        conf[field] = parse(t)
        nxt = t.take()
        if nxt not in (None, ","):
            raise ConfError(f"allocator setting '{key}' is followed by '{nxt}' where ',' or the "
                            f"end of the string was expected; separate entries with ','")
    return conf


def _checked(conf: dict) -> dict:
    """Validate a settings dict (as parse_conf returns) and return a full copy."""
    if not isinstance(conf, dict):
        raise ConfError(f"allocator settings must be a dict, not {type(conf).__name__}")
    unknown = sorted(set(conf) - set(default_conf()))
    if unknown:
        raise ConfError(f"unknown allocator settings field '{unknown[0]}'; the settings dict "
                        f"has expandable_segments, max_split_size, garbage_collection_threshold "
                        f"and roundup_power2_divisions")
    out = default_conf()
    out.update(conf)
    if not isinstance(out["expandable_segments"], bool):
        raise ConfError("settings field 'expandable_segments' must be True or False")
    ms = out["max_split_size"]
    if (not isinstance(ms, int) or isinstance(ms, bool)
            or (ms != -1 and (ms < _MIN_SPLIT_MB * MiB or ms % MiB or ms > MAX_SPLIT_MB * MiB))):
        raise ConfError(f"settings field 'max_split_size' must be -1 (unlimited) or a whole "
                        f"number of MiB, at least {_MIN_SPLIT_MB} MiB and below 2**43 MiB, in "
                        f"bytes, not {_short(repr(ms))}")
    gc = out["garbage_collection_threshold"]
    if not isinstance(gc, (int, float)) or isinstance(gc, bool) or not (gc == 0 or 0 < gc < 1):
        raise ConfError(f"settings field 'garbage_collection_threshold' must be 0 (off) or "
                        f"between 0 and 1, not {gc!r}")
    out["garbage_collection_threshold"] = float(gc)
    divs = out["roundup_power2_divisions"]
    if (not isinstance(divs, (list, tuple)) or len(divs) != ROUNDUP_INTERVALS
            or not all(isinstance(d, int) and not isinstance(d, bool)
                       and (d == 0 or (_is_pow2(d) and d <= MAX_DIVISIONS)) for d in divs)):
        raise ConfError(f"settings field 'roundup_power2_divisions' must be a list of "
                        f"{ROUNDUP_INTERVALS} powers of two up to 2**31 or zeros, not "
                        f"{_short(repr(divs), 200)}")
    out["roundup_power2_divisions"] = list(divs)
    return out


def _format_roundup(divs: list[int]) -> str | None:
    if not any(divs):
        return None
    if len(set(divs)) == 1:
        return str(divs[0])
    # The trailing run of equal values becomes '>:v'; the leading run becomes
    # the first entry (which also fills every interval below it).
    tail = ROUNDUP_INTERVALS - 1
    while tail > 0 and divs[tail - 1] == divs[tail]:
        tail -= 1
    head = 0
    while head + 1 < tail and divs[head + 1] == divs[0]:
        head += 1
    entries = [f"{ROUNDUP_BOUNDARIES_MB[i]}:{divs[i]}" for i in range(head, tail)]
    if divs[tail] != 0:  # intervals no entry names stay 0, so a zero tail needs no '>'
        entries.append(f">:{divs[tail]}")
    return "[" + ",".join(entries) + "]"


def format_conf(conf: dict) -> str:
    """The canonical settings string for ``conf``; parse_conf(format_conf(c)) == c.

    Only settings that differ from the defaults are written, in a fixed order.
    """
    c = _checked(conf)
    parts = []
    if c["expandable_segments"]:
        parts.append("expandable_segments:True")
    if c["max_split_size"] != -1:
        parts.append(f"max_split_size_mb:{c['max_split_size'] // MiB}")
    if c["garbage_collection_threshold"]:
        parts.append(f"garbage_collection_threshold:{c['garbage_collection_threshold']!r}")
    rp = _format_roundup(c["roundup_power2_divisions"])
    if rp is not None:
        parts.append(f"roundup_power2_divisions:{rp}")
    return ",".join(parts)


def settings_for_snapshot(conf: dict) -> dict[str, Any]:
    """torch's ``allocator_settings`` snapshot dict for ``conf``.

    Keys and value types follow torch's Module.cpp; the settings gpumem does
    not implement (pinned memory, cudaMalloc locking) carry torch's defaults.
    """
    c = _checked(conf)
    return snapshot_settings_of(c, format_conf(c))


def snapshot_settings_of(conf: dict, conf_text: str) -> dict[str, Any]:
    """The ``allocator_settings`` dict for ``conf`` as it is, unchecked, with
    ``conf_text`` as its PYTORCH_CUDA_ALLOC_CONF (settings_for_snapshot checks
    first; gpumem.recording.history reports an Allocator's own settings, which
    need not follow the PYTORCH_CUDA_ALLOC_CONF rules, through this)."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": conf_text,
        "max_split_size": conf["max_split_size"],
        "garbage_collection_threshold": float(conf["garbage_collection_threshold"]),
        "expandable_segments": bool(conf["expandable_segments"]),
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "graph_capture_record_stream_reuse": False,
        "max_round_threshold": -1,
        "max_cached_size": -1,
        "roundup_power2_divisions": {str(1 << i): d
                                     for i, d in enumerate(conf["roundup_power2_divisions"])},
    }


def conf_from_snapshot_settings(settings: Any) -> dict:
    """The settings dict for a snapshot's ``allocator_settings`` (the inverse of
    settings_for_snapshot); fields gpumem does not implement are ignored, and
    a field that is absent or mistyped keeps torch's default.  Raises
    ConfError for values no allocator can run with."""
    out = default_conf()
    if not isinstance(settings, dict):
        return out
    exp = settings.get("expandable_segments")
    if isinstance(exp, bool):
        out["expandable_segments"] = exp
    ms = settings.get("max_split_size")
    if isinstance(ms, int) and not isinstance(ms, bool) and 0 < ms < (1 << 62):
        out["max_split_size"] = ms
    gc = settings.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and not isinstance(gc, bool):
        out["garbage_collection_threshold"] = float(gc)
    divs = settings.get("roundup_power2_divisions")
    if isinstance(divs, dict):
        out["roundup_power2_divisions"] = [divs.get(str(mb), 0) for mb in ROUNDUP_BOUNDARIES_MB]
    return _checked(out)
