"""Overlap mode: hold buckets back behind the one the next forward waits for, and their ops with them.

A large gradient finished late and read early stalls the next forward for its whole all-reduce
(GPT-2's tied embedding: the last backward op finishes it, the first forward op reads it; 21.6 ms
on 8 x 100 GbE). Backward work that does not lead to it can run in that shadow, if its gradients
can travel after it and still arrive before the forward reads them. Under the bucket-first order
(:func:`.common.bucket_first_order`) a bucket sent after the anchor's lets its ops run after the
anchor's op, so the choice is a bucketing. The bucket search scores bucketings under one fixed op
order: it sees what holding a bucket back costs (its bytes queue behind the anchor) but not what it
gains (its ops move into the anchor's shadow) until its round ends. This move scores both.

:func:`defer_behind_anchor` is a best-improvement descent. The anchor is the bucket the simulated
forward waits for longest. A move sends one bucket from before the anchor, or one unit of a bucket
up to the anchor's own, after it, in first-reader order among those already there (a unit alone, or
joining its neighbour there). Each candidate is scored under its own bucket-first
order on the search's engine (:class:`.overlap_search.SteadyState`, about 3 ms on GPT-2 small).
GPT-2 small, 8 x 100 GbE, from the search's local optimum: 117.71 -> 115.84 ms in 12 s.
"""

from __future__ import annotations

import time
from typing import Iterator, Sequence

from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem
from schedopt.simulate import simulate

from .common import bucket_first_order, first_readers
from .overlap_search import SteadyState

__all__ = ["defer_behind_anchor"]


def defer_behind_anchor(problem: Problem, order: Sequence[str], buckets: Sequence[Sequence[str]], *,
                        time_limit_s: float) -> tuple[list[str], list[list[str]], float]:
    """The best ``(order, buckets, period)`` the descent reaches from ``buckets`` (see the module
    docstring) within ``time_limit_s``; ``order`` is the bucket-first order of the buckets returned.
    Without a stalled forward, or no move that helps, the start under its bucket-first order."""
    deadline = time.perf_counter() + time_limit_s
    graph = problem.graph
    first = first_readers(graph, [o for o in order if graph.ops[o].phase == "forward"])
    start = SteadyState(problem, order)
    # the search's units (the parameters one op finishes, by dtype and first reader) move together
    unit = {name: k for k, names in enumerate(start.units) for name in names}
    current = start.names(start.ready_order_buckets(buckets))
    best_order, best_s = _score(problem, order, current)
    while time.perf_counter() < deadline:
        anchor = _longest_wait(problem, best_order, current)
        if anchor is None:
            break
        found = None
        for candidate in _moves(current, anchor, first, unit, start.dtype):
            if time.perf_counter() >= deadline:
                break
            cand_order, cand_s = _score(problem, order, candidate)
            if cand_s < best_s * (1 - 1e-9) and (found is None or cand_s < found[2]):
                found = (candidate, cand_order, cand_s)
        if found is None:
            break
        current, best_order, best_s = found
    return best_order, current, best_s


def _score(problem: Problem, order: Sequence[str], buckets: list[list[str]]) -> tuple[list[str], float]:
    """The bucket-first order of ``buckets`` and their period under it."""
    rerun = bucket_first_order(problem.graph, order, buckets)
    state = SteadyState(problem, rerun)
    return rerun, state.period(state.ready_order_buckets(buckets))


def _longest_wait(problem: Problem, order: list[str], buckets: list[list[str]]) -> int | None:
    """The bucket the next forward waits for longest in the simulated steady state; None if none."""
    plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="deferral"))
    timeline = simulate(problem, plan)
    last = timeline.num_steps - 1
    waits = [(e.duration_s, e.bucket) for e in timeline.events
             if e.category == "wait" and e.step == last and e.bucket is not None and e.duration_s > 0]
    return max(waits)[1] if waits else None


def _moves(buckets: list[list[str]], anchor: int, first: dict[str, int], unit: dict[str, int],
           dtype: list[str]) -> Iterator[list[list[str]]]:
    """Every bucket before ``anchor`` sent after it; then every unit of one, or of the anchor itself
    (unless alone in its bucket), sent after it alone, or joining the held-back bucket sent right
    before or after it by first reader."""
    for k in range(anchor):
        yield _held_back(buckets[:k] + buckets[k + 1:], anchor - 1, buckets[k], first)
    for k in range(anchor + 1):
        keys = list(dict.fromkeys(unit[n] for n in buckets[k]))
        if len(keys) == 1:
            continue
        for key in keys:
            moved = [n for n in buckets[k] if unit[n] == key]
            rest = [b if i != k else [n for n in b if unit[n] != key] for i, b in enumerate(buckets)]
            alone = _held_back(rest, anchor, moved, first)
            yield alone
            at = alone.index(moved)
            for j in (at - 1, at + 1):
                if anchor < j < len(alone) and dtype[unit[alone[j][0]]] == dtype[key]:  # one dtype per bucket
                    joined = [list(b) for b in alone]
                    joined[j] = joined[j] + moved
                    del joined[at]
                    yield joined


def _held_back(buckets: list[list[str]], anchor: int, moved: list[str], first: dict[str, int]) -> list[list[str]]:
    """``buckets`` with ``moved`` sent after ``buckets[anchor]``: behind as many of the buckets already
    there as are read no later than it (their first readers need not be sorted)."""
    key = min(first[n] for n in moved)
    at = anchor + 1 + sum(1 for b in buckets[anchor + 1:] if min(first[n] for n in b) <= key)
    return buckets[:at] + [moved] + buckets[at:]
