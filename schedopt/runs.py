"""Splits of an ordered sequence into runs: the DPs under the sharded bound and the pipelined units.

Positions ``0..P-1`` carry running bytes (each position's and all before it) and, per position, the
compute that a run starting there leaves exposed. A split into n runs ``[s_1 = 0 .. e_1], ...,
[s_n .. e_n = P-1]`` has, per run g, the term ``g·a + moved[e_g] + lead[s_g]``: g collectives, one
each with the intercept ``a``, have moved every byte up to the run's end before the compute from
its start can finish.

- :func:`least_runs`: per n, the least over splits into n runs of the largest term (one side: the
  forward's all-gathers, or the backward's reduce-scatters). Exact.
- :func:`joint_runs`: one split, both sides: the forward's term and the backward's for the same
  runs, the objective ``max(floor_f, max_g X_g) + max(floor_b, max_g Y_g)``. A sum of two maxima is
  not a DP's max, so the backward's largest term is capped at each level ``tau`` of a grid and
  the forward's least found under the cap: a plan whose backward term lies in ``(tau_{k-1},
  tau_k]`` has its forward term at least that least (``tau_k``'s), and the bound adds
  ``tau_{k-1}``. A lower bound within one grid step of the optimum, and the split that reaches
  the optimum within that step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["least_runs", "Sides", "JointRuns", "joint_runs"]

#: levels of the backward cap per unit count in :func:`joint_runs`
STEPS = 64


def least_runs(cost, running: list[tuple[float, float]]) -> Iterator[float]:
    """Per n = 1, 2, ...: the least over splits of ``running`` ((bytes up to here, compute from here), in
    order) into n runs of ``max_g cost(0)·g + (cost(bytes at the end of run g) - cost(0)) + compute
    at the start of run g``. An exact DP, one run count at a time: ``f[e]`` is the least with the
    runs ending at position e. Lazy: the caller stops where more runs cannot help. Nothing to move: 0."""
    if not running:
        yield 0.0
        return
    cum = np.array([b for b, _ in running])
    lead = np.array([c for _, c in running])
    a = cost(0.0)
    moved = np.array([cost(b) for b in cum]) - a  # affine: the bytes' share
    f = a + moved + lead[0]
    yield float(f[-1])
    upper = np.triu(np.ones((len(cum) - 1, len(cum)), dtype=bool), k=1)  # run starts s = 1.. at or before e
    for n in range(2, len(cum) + 1):
        pairs = np.maximum(f[:-1, None], n * a + moved[None, :] + lead[1:, None])
        f = np.where(upper, pairs, np.inf).min(axis=0)
        yield float(f[-1])


@dataclass(frozen=True, slots=True, kw_only=True)
class Sides:
    """The two sides of one sequence of positions (see the module docstring): per side the intercept,
    the bytes' share of the cost up to each position, the exposed compute of a run starting at each
    position, and the side's own compute (a floor under its term)."""

    intercept_f: float
    moved_f: np.ndarray
    lead_f: np.ndarray
    floor_f: float
    intercept_b: float
    moved_b: np.ndarray
    lead_b: np.ndarray
    floor_b: float

    @classmethod
    def of(cls, gather, scatter, running_bytes, *, lead_f, lead_b, floor_f: float, floor_b: float) -> "Sides":
        """The sides of positions with ``running_bytes``, from the two collectives' affine costs (bytes ->
        seconds): the all-gathers' (forward) and the reduce-scatters' (backward)."""
        a_f, a_b = gather(0.0), scatter(0.0)
        return cls(intercept_f=a_f, moved_f=np.array([gather(b) for b in running_bytes]) - a_f,
                   lead_f=np.asarray(lead_f, dtype=float), floor_f=floor_f, intercept_b=a_b,
                   moved_b=np.array([scatter(b) for b in running_bytes]) - a_b,
                   lead_b=np.asarray(lead_b, dtype=float), floor_b=floor_b)

    def value(self, starts: list[int]) -> float:
        """The objective of the split whose runs start at ``starts`` (0 first)."""
        runs = list(enumerate(zip(starts, [s - 1 for s in starts[1:]] + [len(self.lead_f) - 1]), 1))

        def largest(a: float, moved: np.ndarray, lead: np.ndarray) -> float:
            return max(g * a + moved[e] + lead[s] for g, (s, e) in runs)

        return (max(self.floor_f, largest(self.intercept_f, self.moved_f, self.lead_f))
                + max(self.floor_b, largest(self.intercept_b, self.moved_b, self.lead_b)))


@dataclass(frozen=True, slots=True)
class JointRuns:
    """Per unit count n: a lower bound on every split into at most n runs, the best split found with at
    most n runs (its run starts) and its objective."""

    bound: float
    starts: tuple[int, ...]
    value: float


def joint_runs(sides: Sides, *, splits: bool = False, steps: int = STEPS) -> Iterator[JointRuns]:
    """Per n = 1, 2, ... up to the number of positions (lazy), :class:`JointRuns` (module docstring); the
    splits only where asked (``splits``: the level whose cap and forward term add up least, per n)."""
    s = sides
    size = len(s.lead_f)
    low = max(s.floor_b, s.intercept_b + s.moved_b[-1] + s.lead_b.min())  # no split's backward term is less
    high = max(low, s.intercept_b * size + s.moved_b[-1] + s.lead_b.max())  # nor more
    taus = np.linspace(low, high, steps)
    below = np.concatenate(([taus[0]], taus[:-1]))  # the least backward term of a plan counted at each level
    f = np.where(s.intercept_b + s.moved_b + s.lead_b[0] <= taus[:, None], s.intercept_f + s.moved_f + s.lead_f[0],
                 np.inf)  # (level, run end): the least forward term under the level's cap
    choices: list[np.ndarray] = []  # per n >= 2: (level, run end) -> the last run's start
    upper = np.triu(np.ones((size - 1, size), dtype=bool), k=1)
    least = np.full(steps, np.inf)  # per level, over the run counts so far
    starts, value = (), np.inf  # the best split found so far
    for n in range(1, size + 1):
        if n > 1:
            x = n * s.intercept_f + s.moved_f[None, :] + s.lead_f[1:, None]  # (run start - 1, run end)
            y = n * s.intercept_b + s.moved_b[None, :] + s.lead_b[1:, None]
            pairs = np.where(upper[None] & (y[None] <= taus[:, None, None]), np.maximum(f[:, :-1, None], x[None]),
                             np.inf)
            if splits:
                choices.append(pairs.argmin(axis=1) + 1)
            f = pairs.min(axis=1)
        least = np.minimum(least, f[:, -1])
        bound = float((np.maximum(s.floor_f, least) + below).min())
        if splits and np.isfinite(f[:, -1]).any():
            level = int(np.argmin(np.maximum(s.floor_f, f[:, -1]) + taus))
            split = _starts(choices, level, size - 1)
            if (found := s.value(split)) < value:
                starts, value = tuple(split), found
        yield JointRuns(bound, starts, value)


def _starts(choices: list[np.ndarray], level: int, end: int) -> list[int]:
    """The run starts of the split ending at ``end`` with ``len(choices) + 1`` runs, back through the DP."""
    starts = []
    for choice in reversed(choices):
        start = int(choice[level, end])
        starts.append(start)
        end = start - 1
    return [0, *reversed(starts)]
