"""Unions of time intervals: how long something was busy, and how much of one thing another covered.

Intervals are ``(start, end)`` pairs, ``start <= end``, in any unit. A union is a sorted list of
disjoint intervals (touching ones merged).

Example:
    >>> busy = union([(0, 2), (1, 3), (5, 6)])
    >>> busy, length(busy)
    ([(0, 3), (5, 6)], 4)
    >>> covered(busy, (2, 5.5))  # of [2, 5.5], [2, 3] and [5, 5.5] are busy
    1.5
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable

__all__ = ["union", "length", "covered", "covered_union", "uncovered", "clip"]

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted disjoint intervals; empty ones dropped."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def length(disjoint: Iterable[Interval]) -> float:
    """The total length of disjoint intervals."""
    return sum(end - start for start, end in disjoint)


def covered(disjoint: list[Interval], interval: Interval) -> float:
    """How much of ``interval`` the union ``disjoint`` (sorted, disjoint) covers."""
    start, end = interval
    if end <= start:
        return 0.0
    k = max(bisect_right(disjoint, (start, float("inf"))) - 1, 0)
    total = 0.0
    while k < len(disjoint) and disjoint[k][0] < end:
        a, b = disjoint[k]
        total += max(0.0, min(b, end) - max(a, start))
        k += 1
    return total


def covered_union(disjoint: list[Interval], other: list[Interval]) -> float:
    """How much of the union ``other`` the union ``disjoint`` covers (both sorted and disjoint)."""
    return sum(covered(disjoint, i) for i in other)


def uncovered(disjoint: list[Interval], interval: Interval) -> list[Interval]:
    """The parts of ``interval`` the union ``disjoint`` (sorted, disjoint) does not cover."""
    start, end = interval
    out, t = [], start
    for a, b in disjoint:
        if b <= t or a >= end:
            continue
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < end:
        out.append((t, end))
    return out


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """``intervals`` cut to ``window``; those outside it dropped."""
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]
