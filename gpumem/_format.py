"""Byte counts as people read them: the package's one byte formatter.

Pure Python and importing nothing of gpumem's, so that the command line and
the simulator's report format sizes without the extension.  Its wording
("1.00 KiB", "1023 B") is the command line's, not c10's (gpumem.format_size,
"1023 bytes", which torch's OOM messages use).
"""

from __future__ import annotations

__all__ = ["format_bytes"]

_WHOLE_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DECIMAL_UNITS = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


def format_bytes(n: int | None, *, whole_units: bool = False) -> str:
    """A byte count in B, KiB, MiB or GiB, whichever keeps it below 1024 (GiB at most).

    None is "-".  whole_units: a count that is a whole number of TiB, GiB,
    MiB or KiB (or of TB, GB, MB or kB) is that number of the unit that
    gives the smallest number, without decimals ("80 GiB", for a device's
    capacity; "80 GB (74.51 GiB)" for 80 * 10**9); other counts are
    formatted as usual.
    """
    if n is None:
        return "-"
    if whole_units:
        whole = [(n // size, k, unit) for k, (unit, size) in enumerate(_WHOLE_UNITS + _DECIMAL_UNITS)
                 if n >= size and n % size == 0]
        if whole:
            count, k, unit = min(whole)
            text = f"{count} {unit}"
            return text if k < len(_WHOLE_UNITS) else f"{text} ({format_bytes(n)})"
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "GiB":
            break
    return f"{value:.2f} {unit}"
