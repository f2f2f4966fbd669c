"""Allocator settings: the PYTORCH_CUDA_ALLOC_CONF syntax, for the keys gpumem supports.

    expandable_segments:True|False
    max_split_size_mb:N                   20 <= N < 2**64 (MiB); stored in bytes
    garbage_collection_threshold:F        0 < F < 1
    roundup_power2_divisions:N            N a power of two up to 2**31, for every interval
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
previous entry; intervals not named keep 0.  torch's other keys
(TORCH_ONLY_KEYS) are checked and left to torch; any other key is refused,
as torch refuses it.

Note [One settings check]
Rationale: a settings string reaches gpumem through install() (the torch
  variables and GPUMEM_ALLOC_CONF, which torch's parser reads), through
  torch._C._accelerator_setAllocatorSettings (and
  torch.cuda.memory._set_allocator_settings over it), and through gpumem
  simulate, gpumem replay --conf and gpumem doctor (this parser).  torch's
  parser lets malformed numbers through (std::stoull reads '-5' as 2**64 - 5
  and '25abc' as 25) and answers others with IndexError: stoull, a bare
  "stoull" or an internal assert; the same string must get the same answer
  everywhere, in one line naming the key and what it takes.
Approach: parse_conf() is the one check, and every entry point calls it
  before torch's parser or gpumem._C sees the string (gpumem.pytorch.installer for
  install() and the setter it patches).  It takes torch 2.14's whole
  syntax: the keys gpumem implements are parsed into the dict, torch's
  other keys (TORCH_ONLY_KEYS) are checked for their kind of value (True or
  False, an integer torch can read, a number torch can read, a backend
  name) and left to torch; any other key is refused, as torch refuses it.
  Where torch takes a value, the value means what it means to torch:
  max_split_size_mb from 20 up to 2**64 - 1 (torch clamps it to
  2**44 - 1 MiB, more than any device; gpumem stores 2**43 - 1 MiB, whose
  bytes fit in 63 bits: the same "no limit" for every request a device can
  make), divisions a power of two (0 to turn an interval off, in a list),
  garbage_collection_threshold strictly between 0 and 1.
Limitations: gpumem refuses what torch reads by accident: a sign ('+25',
  '-5'), characters after a number ('25abc', '20.5', '20:'), digits that
  are not ASCII ('²'), a garbage_collection_threshold torch's std::stod
  cannot read (1e-400 and other subnormal numbers, hex floats); and
  division counts above 2**31, which gpumem stores in 32 bits (torch takes
  any power of two; above 2**54 its own rounding overflows).  A C++ caller
  of c10's setter bypasses the check: the shim then clamps what it cannot
  store (csrc/torch/gm_torch_config.cpp).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ConfError", "parse_conf", "TORCH_ONLY_KEYS", "format_conf", "default_conf",
           "settings_for_snapshot", "snapshot_settings_of", "conf_from_snapshot_settings",
           "parse_uint", "ROUNDUP_INTERVALS", "ROUNDUP_BOUNDARIES_MB", "MAX_SPLIT_MB",
           "MAX_DIVISIONS"]

MiB = 1 << 20
ROUNDUP_INTERVALS = 16
ROUNDUP_BOUNDARIES_MB = tuple(1 << i for i in range(ROUNDUP_INTERVALS))  # 1 .. 32768
_MIN_SPLIT_MB = 20  # kLargeBuffer / 1 MiB: torch requires max_split_size_mb >= 20
MAX_SPLIT_MB = (1 << 43) - 1  # larger values are clamped to it: its bytes fit in 63 bits
MAX_DIVISIONS = 1 << 31       # larger division counts are refused: stored in 32 bits
_MAX_U64 = (1 << 64) - 1      # std::stoull's range
_MIN_NORMAL = 2.2250738585072014e-308  # std::stod reports anything smaller (but 0) out of range

KEYS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
        "roundup_power2_divisions")
_ACCEPTED = ", ".join(KEYS)

#: torch 2.14's allocator keys that gpumem does not implement, with the kind
#: of value torch's parser reads for each: parse_conf checks that kind (so
#: that torch's parser never meets a value it fails on with IndexError or an
#: internal assert) and leaves the key to torch (Note [One settings check]).
TORCH_ONLY_KEYS = {
    "per_process_memory_fraction": "fraction", "backend": "backend",
    "release_lock_on_cudamalloc": "bool", "release_lock_on_hipmalloc": "bool",
    "pinned_use_cuda_host_register": "bool", "pinned_use_hip_host_register": "bool",
    "pinned_use_background_threads": "bool", "pinned_num_register_threads": "uint",
    "pinned_reserve_segment_size_mb": "uint", "pinned_max_round_threshold_mb": "uint",
    "pinned_max_cached_size_mb": "uint", "pinned_free_catch_all": "bool",
    "graph_capture_record_stream_reuse": "bool", "throw_on_cudamalloc_oom": "bool",
    "max_non_split_rounding_mb": "uint", "large_segment_size_mb": "uint",
}


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
    """Split like torch's ConfigTokenizer: ',', ':', '[' and ']' are tokens;
    ASCII white space vanishes (std::isspace), other characters stay."""
    tokens: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf = []
            tokens.append(ch)
        elif ch not in " \t\n\v\f\r":
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
_MS_FORM = (f"max_split_size_mb:N with N an integer number of MiB, at least {_MIN_SPLIT_MB} and "
            f"below 2**64")
_GC_FORM = "garbage_collection_threshold:F with 0 < F < 1"
_DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_RP_FORM = ("roundup_power2_divisions:N with N a power of two up to 2**31, or a list such as "
            "roundup_power2_divisions:[256:1,512:2,>:8] whose keys are power-of-two MiB "
            "sizes (or '>') and whose values are powers of two up to 2**31 or 0")


def _parse_expandable(t: _Tokens) -> bool:
    t.expect(":", "expandable_segments", _ES_FORM)
    v = t.value("expandable_segments", _ES_FORM)
    if v == "True":
        return True
    if v == "False":
        return False
    raise _bad("expandable_segments", v, "Expected 'True' or 'False' (accepted values are True "
               "and False)")


def _parse_max_split(t: _Tokens) -> int:
    t.expect(":", "max_split_size_mb", _MS_FORM)
    v = t.value("max_split_size_mb", _MS_FORM)
    n = parse_uint(v, _MAX_U64)
    if n is None or n < _MIN_SPLIT_MB:
        # torch's own refusal of a small number, in its words, then what it takes
        words = (f"max_split_size_mb too small, must be >= {_MIN_SPLIT_MB}: " if n is not None
                 else "")
        raise _bad("max_split_size_mb", _short(v),
                   words + f"it must be an integer number of MiB, at least {_MIN_SPLIT_MB} "
                   f"and below 2**64, in ASCII digits without a sign (2**43 or more means no "
                   f"limit)")
    return min(n, MAX_SPLIT_MB) * MiB


def parse_decimal(text: str) -> float | None:
    """``text`` as a float if it is an unsigned decimal number in ASCII
    ('0.5', '.5', '5e-1') that torch's std::stod reads without an error
    (0, or finite and at least the smallest normal double), else None.
    float() alone accepts '1_0', 'nan', '０.５' and a leading sign."""
    if not text.isascii() or not _DECIMAL.fullmatch(text):
        return None
    f = float(text)
    if f == 0.0:  # '1e-400' is not 0 to std::stod: it is out of range
        mantissa = text.split("e")[0].split("E")[0]
        return None if mantissa.strip("0.") else f
    return f if _MIN_NORMAL <= f < float("inf") else None


def _parse_gc(t: _Tokens) -> float:
    t.expect(":", "garbage_collection_threshold", _GC_FORM)
    v = t.value("garbage_collection_threshold", _GC_FORM)
    f = parse_decimal(v)
    if f is None or not 0.0 < f < 1.0:
        # torch's own refusal of a number out of range, in its words, then what it takes
        words = "garbage_collect_threshold is invalid: " if f is not None else ""
        raise _bad("garbage_collection_threshold", _short(v),
                   words + "it must be a decimal number greater than 0 and less than 1 (such as 0.6; "
                   "at least 2.2250738585072014e-308, the smallest torch's parser reads)")
    return f


def _parse_roundup(t: _Tokens) -> list[int]:
    key = "roundup_power2_divisions"
    t.expect(":", key, _RP_FORM)
    if t.peek() != "[":
        v = t.value(key, _RP_FORM)
        n = parse_uint(v, MAX_DIVISIONS)
        if n is None or not _is_pow2(n):
            raise _bad(key, _short(v), "it must be a power of two from 1 to 2**31 "
                       "(1, 2, 4, 8, ...) or a bracketed list")
        return [n] * ROUNDUP_INTERVALS
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
        n = parse_uint(v, MAX_DIVISIONS)
        if n is None or not (n == 0 or _is_pow2(n)):
            raise _bad(key, _short(f"{boundary}:{v}"),
                       "each division count must be a power of two from 1 to 2**31, or 0 "
                       "to turn rounding off")
        if boundary == ">":
            for j in range(last_index + 1, ROUNDUP_INTERVALS):
                divs[j] = n
        else:
            b = parse_uint(boundary, _MAX_U64)
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


_TORCH_FORMS = {
    "bool": ("True or False", None),
    "uint": ("an integer from 0 to 2**64 - 1 in ASCII digits", None),
    "fraction": ("a decimal number from 0 to 1", None),
    "backend": ("native or cudaMallocAsync", ("native", "cudaMallocAsync")),
}


def _check_torch_value(t: _Tokens, key: str, kind: str) -> None:
    """Check the value of a key gpumem leaves to torch (TORCH_ONLY_KEYS):
    the kind of value torch's parser reads for it, so that torch answers
    with its own check of the range, never with IndexError or an assert."""
    takes, words = _TORCH_FORMS[kind]
    form = f"{key}:V with V {takes}"
    t.expect(":", key, form)
    v = t.value(key, form)
    if kind == "bool":
        ok = v in ("True", "False")
    elif kind == "uint":
        ok = parse_uint(v, _MAX_U64) is not None
    elif kind == "fraction":
        f = parse_decimal(v)
        ok = f is not None and f <= 1.0
    else:
        ok = v in words
    if not ok:
        # torch's words for a fraction out of range come first (what its parser says)
        words = f"{key} is invalid: " if kind == "fraction" else ""
        raise _bad(key, _short(v), f"{words}it must be {takes}")


_PARSERS = {
    "expandable_segments": ("expandable_segments", _parse_expandable),
    "max_split_size_mb": ("max_split_size", _parse_max_split),
    "garbage_collection_threshold": ("garbage_collection_threshold", _parse_gc),
    "roundup_power2_divisions": ("roundup_power2_divisions", _parse_roundup),
}


def parse_conf(text: str | None) -> dict:
    """Check an allocator settings string and parse it into gpumem's settings dict.

    The one check of every entry point (Note [One settings check]): torch's
    keys that gpumem does not implement are checked and left out of the
    dict.  ``None`` or an empty string gives the defaults.  A later entry
    for the same key replaces an earlier one, as in torch.  Raises
    ConfError, one line naming the key and what it takes.
    """
    conf = default_conf()
    if text is None:
        return conf
    if not isinstance(text, str):
        raise ConfError(f"allocator settings must be a string, not {type(text).__name__}")
    t = _Tokens(text)
    while t.peek() is not None:
        key = t.take()
        if key in ",:[]":  # one ',' after the last entry is fine (below), as for torch
            raise ConfError(f"allocator settings have '{key}' where a key was expected; write "
                            f"key:value entries separated by single ','")
        if key in _PARSERS:
            field, parse = _PARSERS[key]
            conf[field] = parse(t)
        elif key in TORCH_ONLY_KEYS:
            _check_torch_value(t, key, TORCH_ONLY_KEYS[key])
        else:
            raise ConfError(f"unknown allocator setting '{_short(key)}' (torch: \"Unrecognized key "
                            f"'{_short(key)}'\"); gpumem implements "
                            f"{_ACCEPTED}, and leaves torch's other keys (such as "
                            f"per_process_memory_fraction) to torch")
        nxt = t.take()
        if nxt not in (None, ","):
            raise ConfError(f"allocator setting '{key}' is followed by '{_short(nxt)}' where ',' "
                            f"or the end of the string was expected; separate entries with ','")
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
