"""The search ``gpumem fit`` makes: a value N in LO..HI that fits where N+1 does not.

search(lo, hi, probe, capacity) asks probe(value) -> True (fits) or False
(does not), or (fits, need) with need the memory the run took, each value
at most once, and returns a Boundary:
- LO does not fit: nothing in the range fits (largest None, first_no LO);
- HI fits: the whole range fits (largest HI, first_no None);
- else the interval between the largest value seen fitting and the smallest
  seen not fitting shrinks until they are neighbours: largest N, first_no
  N + 1, both probed.  Each step bisects it (about 2 + log2(HI - LO) probes
  in all), unless Note [Guided steps] applies.
A probe that cannot say (the run failed for another reason than memory)
raises Stop; the search ends there and the Boundary names the value and the
reason, with what was known before it.

Limitations: when fitting is not monotone in the value (a script that
changes strategy with the batch size), the answer is still a boundary (N
fits, N + 1 does not, both run) but not necessarily the largest value that
fits; values between probes are never run.

Note [Guided steps]
Rationale: a probe is a whole simulated run (seconds), and memory grows
  about linearly with a batch size or a sequence length, so the measured
  needs say where the boundary is better than the middle does.
Approach: once two values have fitted with different needs and the
  capacity is known, the next value is where the line through the two
  largest of them reaches the capacity, rounded down and kept strictly
  inside the interval.  A guided step that does not halve the interval is a
  strike; after two strikes in a row the next step bisects, so poor guesses
  cost at most three probes per halving of the interval.
Limitations: the need of a run that ran out of memory is cut short, so only
  runs that fitted feed the line; where memory grows faster than linearly
  (attention scores with the sequence length), guesses land high and the
  interval closes from above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

__all__ = ["Boundary", "Stop", "search"]


class Stop(Exception):
    """Raised by a probe that cannot say whether its value fits."""


@dataclass
class Boundary:
    largest: Optional[int] = None      # the largest value known to fit
    first_no: Optional[int] = None     # the smallest value known not to fit
    probes: list[tuple[int, bool]] = field(default_factory=list)   # in the order run
    stopped_at: Optional[int] = None   # the value whose probe raised Stop
    reason: Optional[str] = None       # what it said

    @property
    def complete(self) -> bool:
        return self.stopped_at is None


Answer = Union[bool, tuple[bool, Optional[int]]]


def search(lo: int, hi: int, probe: Callable[[int], Answer],
           capacity: Optional[int] = None) -> Boundary:
    if lo > hi:
        raise ValueError(f"empty range {lo}..{hi}")
    b = Boundary()
    seen: dict[int, bool] = {}
    needs: dict[int, int] = {}           # value -> need, of the values that fitted

    def fits(value: int) -> bool:
        if value not in seen:
            b.stopped_at = value          # until the probe answers
            answer = probe(value)
            ok, need = answer if isinstance(answer, tuple) else (answer, None)
            seen[value] = bool(ok)
            if ok and need is not None:
                needs[value] = need
            b.stopped_at = None
            b.probes.append((value, seen[value]))
        return seen[value]

    try:
        if not fits(lo):
            b.first_no = lo
            return b
        b.largest = lo
        if lo == hi or fits(hi):
            b.largest = hi
            return b
        b.first_no = hi
        strikes = 0
        while b.first_no - b.largest > 1:
            width = b.first_no - b.largest
            guess = _guided(b.largest, b.first_no, needs, capacity) if strikes < 2 else None
            value = (b.largest + b.first_no) // 2 if guess is None else guess
            if fits(value):
                b.largest = value
            else:
                b.first_no = value
            if guess is None:
                strikes = 0
            elif 2 * (b.first_no - b.largest) > width:
                strikes += 1
            else:
                strikes = 0
    except Stop as e:
        b.reason = str(e) or type(e).__name__
    return b


def _guided(good: int, bad: int, needs: dict[int, int], capacity: Optional[int]) -> Optional[int]:
    """Note [Guided steps]: the value strictly between good and bad where the
    line through the two largest fitting values' needs reaches capacity."""
    if capacity is None:
        return None
    points = sorted((v, n) for v, n in needs.items() if v <= good)[-2:]
    if len(points) < 2:
        return None
    (v1, n1), (v2, n2) = points
    if n2 <= n1:
        return None
    at = v2 + (capacity - n2) * (v2 - v1) // (n2 - n1)
    return min(max(at, good + 1), bad - 1)
