"""How far a ratio from a handful of runs can be trusted.

Launchers are run interleaved, one repetition of each after another, so the runs that share a
repetition number shared the machine's state too: their ratio, run by run, carries less of the
machine's drift than a ratio of two medians does. The interval for the median of those ratios
is the sign test's: two order statistics, no assumption about the spread's shape, so it holds
for the skewed, outlier-prone timings of a shared 2-core machine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Record = Mapping[str, Any]
CONFIDENCE = 0.95


def median_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The narrowest interval between order statistics, symmetric in rank, that holds the median
    of what the values were drawn from with at least `confidence`; None when there are too few
    values for any (fewer than 6 at 95%).

    The k-th smallest value lies below the median unless fewer than k of the n values do, which
    happens with probability P(Binomial(n, 1/2) < k); k is the largest for which that tail, on
    each side, is at most (1 - confidence) / 2.
    """
    ordered = sorted(values)
    n = len(ordered)
    tail = (1.0 - confidence) / 2.0
    k, below = 0, 0.0
    while k < n:
        below += math.comb(n, k) / 2.0**n  # P(exactly k values below the median)
        if below > tail:
            break
        k += 1
    if k == 0:
        return None
    return ordered[k - 1], ordered[n - k]


def paired_ratios(
    records: Iterable[Record], numerator: str, denominator: str, key: str
) -> list[float]:
    """`numerator`'s value over `denominator`'s for every repetition both have (records with a
    positive number under `key`), in repetition order."""
    by_rep: dict[str, dict[int, float]] = {numerator: {}, denominator: {}}
    for record in records:
        value, rep = record.get(key), record.get("rep")
        if (
            record.get("launcher") in by_rep
            and isinstance(rep, int)
            and isinstance(value, (int, float))
            and value > 0
        ):
            by_rep[record["launcher"]][rep] = float(value)
    top, bottom = by_rep[numerator], by_rep[denominator]
    return [top[rep] / bottom[rep] for rep in sorted(top.keys() & bottom.keys())]
