"""Overlap mode: which gradients travel before the anchor, which after, searched as one set.

The anchor is the gradient that bounds the period most on its own: the work its closure (the backward
ops it needs) takes, its all-reduce, then everything the next forward does from its first reader on
(GPT-2's tied embedding: finished by the last backward op, read by the first forward op, 24.3 ms on
the wire on 64 x 100 GbE). A plan splits the other gradients into those sent *before* it, which delay
it (their ops run before its own, their bytes queue ahead of it) and those sent *after* it, which
travel in the next forward's shadow and must arrive before their first reader.

For a fixed channel sequence of units, the backward run bucket by bucket
(:func:`.common.bucket_first_order`, in a compiled problem) readies the first ``i`` units after
exactly the work of their closures' union (eager: the engine's order stays, and they are ready when
the last of their ops ends), and the channel is free when the backward starts (every collective ends
before its reader in the forward). The period is then the least ``T`` with

- the compute: backward + forward + updates <= ``T``;
- each bucket ``b``: ``end_b + W(b) <= T``, where ``end_b`` = ``max(end_{b-1}, ready_b) + call +
  bytes_b`` and ``W(b)`` is the forward work from the bucket's first reader to the forward's end plus
  the updates of the units read there or later. A unit read later whose bucket is read earlier has
  its update before, so this ``T`` is at least the simulated period, and more by at most the updates
  (GPT-2 small: the two agree to 0.01 ms).

For a fixed sequence the best contiguous bucketing under a given ``T`` is a DP (the least end of the
last bucket for every prefix: a smaller end never hurts what follows), so ``T`` is found by
bisection. The sequences searched are *canonical*: the units sent before the anchor in the order
their closures ready them, the anchor, the rest by first reader; the search flips one unit from one
side to the other (first improvement, a flip accepted only if the DP is feasible below the current
period), with kicks of a few random flips from the best set found. The plan returned is simulated
again by the caller. GPT-2 small, 64 x 100 GbE, compiled: 121.22 ms in 120 s (the bucket search and
deferral: 122.05 ms in 60 s).
"""

from __future__ import annotations

import random
import time
from typing import Sequence

import numpy as np

from schedopt.problem import Problem

from .common import backward_closure, bucket_first_order
from .overlap_search import SteadyState, Budget

__all__ = ["AnchorSequences", "anchor_search"]

#: Bisection stops when the bracket of ``T`` is this narrow (relative).
_TOL = 1e-7


class AnchorSequences:
    """Periods of channel sequences of units under their bucket-first order (module docstring)."""

    def __init__(self, problem: Problem, order: Sequence[str], state: SteadyState | None = None):
        """``state``: the search's :class:`.overlap_search.SteadyState` of ``order``, if built already."""
        self.graph = graph = problem.graph
        self.state = state = state or SteadyState(problem, order)
        self.order = list(order)
        self.n = len(state.units)
        forward = [o for o in order if graph.ops[o].phase == "forward"]
        backward = [o for o in order if graph.ops[o].phase == "backward"]
        forward_left = np.cumsum([0.0] + [graph.ops[o].duration_s for o in reversed(forward)])[::-1]
        upd = np.array(state.update_s)
        reader = np.array(state.reader)
        # a unit nothing in the forward reads settles at the step's end: its deadline never binds here
        self.tail = np.array([forward_left[r] + upd[reader >= r].sum() if r < len(forward) else -np.inf
                              for r in state.reader])
        self.bytes_s = np.array(state.bytes_s)
        self.call_s = state.fixed_s
        self.update_s = float(upd.sum())
        self.compute_s = sum(graph.ops[o].duration_s for o in forward + backward) + self.update_s
        position = {o: i for i, o in enumerate(backward)}
        self.op_s = np.array([graph.ops[o].duration_s for o in backward])
        self.closure = [np.array(sorted(position[o] for o in backward_closure(graph, names)), dtype=int)
                        for names in state.units] if problem.reorders else []
        # when a unit is ready: its closure's work where the backward runs bucket by bucket, else
        # (eager: the engine's order stays) when its op ends in ``order``
        self.reorders = problem.reorders
        ends = np.cumsum(self.op_s)
        self.release = (np.array([self.op_s[c].sum() for c in self.closure]) if self.reorders else
                        np.array([ends[position[graph.params[names[0]].grad_op]] for names in state.units]))
        self.budget = Budget(10**12, np.inf)  # DPs counted (anchor_search sets a real one)

    def anchor(self) -> int:
        """The unit whose release, all-reduce and forward tail alone take longest."""
        return int(np.argmax(self.release + self.call_s + self.bytes_s + np.maximum(self.tail, 0.0)))

    def canonical(self, anchor: int, before: set[int]) -> list[int]:
        """The units of ``before`` by release, ``anchor``, the rest by first reader."""
        pre = sorted((u for u in before if u != anchor), key=lambda u: (self.release[u], u))
        post = sorted((u for u in range(self.n) if u not in before and u != anchor),
                      key=lambda u: (-self.tail[u], self.release[u], u))
        return pre + [anchor] + post

    def ready(self, seq: Sequence[int]) -> np.ndarray:
        """When the first ``i + 1`` units of ``seq`` are ready, for every ``i``: their closures' work
        (eager: the latest of their ops' ends)."""
        if not self.reorders:
            return np.maximum.accumulate(self.release[list(seq)])
        done = np.zeros(len(self.op_s), dtype=bool)
        out, t = np.empty(len(seq)), 0.0
        for i, u in enumerate(seq):
            new = self.closure[u][~done[self.closure[u]]]
            done[new] = True
            t += self.op_s[new].sum()
            out[i] = t
        return out

    def buckets(self, seq: Sequence[int], ready: np.ndarray, period: float) -> list[list[int]] | None:
        """The contiguous bucketing of ``seq``, one dtype per bucket, whose last bucket ends first with
        every bucket ending ``W`` before ``period``; None if there is none."""
        self.budget.take()
        if self.compute_s > period:
            return None
        n = len(seq)
        size = np.concatenate([[0.0], np.cumsum(self.bytes_s[list(seq)])])
        tail = self.tail[list(seq)]
        dtype = [self.state.dtype[u] for u in seq]
        run = 0  # a bucket holds one dtype: it starts no earlier than the run of dtype[i - 1]
        best = np.full(n + 1, np.inf)
        best[0] = 0.0
        back = np.zeros(n + 1, dtype=int)
        for i in range(1, n + 1):
            if i > 1 and dtype[i - 1] != dtype[i - 2]:
                run = i - 1
            latest = np.maximum.accumulate(tail[:i][::-1])[::-1]  # W of a bucket [j, i): its largest
            end = np.maximum(best[:i], ready[i - 1]) + self.call_s + (size[i] - size[:i])
            end[end + latest > period] = np.inf
            end[:run] = np.inf
            back[i] = j = int(np.argmin(end))
            best[i] = end[j]
        if not np.isfinite(best[n]):
            return None
        cuts, i = [], n
        while i > 0:
            cuts.append((back[i], i))
            i = back[i]
        return [list(seq[a:b]) for a, b in reversed(cuts)]

    def period(self, seq: Sequence[int], below: float = np.inf) -> float:
        """The least feasible period of ``seq`` (bisection); ``inf`` if none is below ``below``, or if
        the budget runs out first."""
        ready = self.ready(seq)
        low = max(self.compute_s, float(ready[-1]))
        high = min(below, low + self.call_s * len(seq) + self.bytes_s.sum() + max(self.tail.max(), 0.0))
        if self.buckets(seq, ready, high) is None:
            return np.inf
        while high - low > _TOL * high:
            if self.budget.spent():
                return np.inf
            mid = (low + high) / 2
            if self.buckets(seq, ready, mid) is None:
                low = mid
            else:
                high = mid
        return high

    def plan(self, seq: Sequence[int], period: float) -> tuple[list[str], list[list[str]]]:
        """The op order and the buckets (parameter names) of ``seq`` at ``period``."""
        buckets = self.buckets(seq, self.ready(seq), period)
        names = self.state.names(buckets)
        return (bucket_first_order(self.graph, self.order, names) if self.reorders else self.order), names


def anchor_search(problem: Problem, order: Sequence[str], *, max_evaluations: int, time_limit_s: float,
                  seed: int = 0, state: SteadyState | None = None) -> tuple[list[str], list[list[str]], float] | None:
    """The best ``(order, buckets, modelled period)`` the flip search reaches (module docstring); None
    if the problem has fewer than two units or the time ran out before any period was found. It stops
    after ``max_evaluations`` DPs, so the result depends on the seed only; ``time_limit_s`` is a
    safety net that cuts it shorter. ``state``: ``order``'s :class:`.overlap_search.SteadyState`, if
    built already."""
    model = AnchorSequences(problem, order, state)
    if model.n < 2:
        return None
    model.budget = Budget(max_evaluations, time.perf_counter() + time_limit_s)
    rng = random.Random(seed)
    anchor = model.anchor()
    others = [u for u in range(model.n) if u != anchor]
    best_set = _start(model, anchor, others)
    best_t = model.period(model.canonical(anchor, best_set))
    current, current_t = set(best_set), best_t
    while not model.budget.spent():
        current, current_t = _descend(model, anchor, others, current, current_t, rng)
        if current_t < best_t:
            best_set, best_t = set(current), current_t
        current = set(best_set)
        for _ in range(rng.randint(2, 5)):
            current ^= {rng.choice(others)}
        current_t = model.period(model.canonical(anchor, current))
    if not np.isfinite(best_t):
        return None
    order_out, buckets = model.plan(model.canonical(anchor, best_set), best_t)
    return order_out, buckets, best_t


def _start(model: AnchorSequences, anchor: int, others: list[int]) -> set[int]:
    """The best of the sets 'every unit whose first reader comes before a point', over ~20 points."""
    by_reader = sorted(others, key=lambda u: -model.tail[u])
    cuts = sorted({round(k * len(by_reader) / 20) for k in range(21)})
    return min((set(by_reader[:k]) for k in cuts), key=lambda s: (model.period(model.canonical(anchor, s)), len(s)))


def _descend(model: AnchorSequences, anchor: int, others: list[int], current: set[int], current_t: float,
             rng: random.Random) -> tuple[set[int], float]:
    improved = True
    while improved and not model.budget.spent():
        improved = False
        for u in rng.sample(others, len(others)):
            if model.budget.spent():
                break
            candidate = current ^ {u}
            seq = model.canonical(anchor, candidate)
            if model.buckets(seq, model.ready(seq), current_t * (1 - 1e-6)) is None:
                continue
            current, current_t, improved = candidate, model.period(seq, below=current_t), True
            break
    return current, current_t

