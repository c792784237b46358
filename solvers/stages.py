"""OSP's stage-2 set: which buckets the next step reads one step stale, corrected by the local gradient.

Every solver plans ``osp`` the same way (the registry calls this after it): it
solves the ``overlap`` problem, then moves buckets to stage 2 one at a time.
The rule, greedy on the simulated period:

1. Candidates are the stage-1 buckets whose bytes still fit the budget,
   ``max_stale_fraction`` of all parameter bytes (0 keeps the ``overlap``
   plan exactly).
2. Each candidate is simulated in stage 2 (its collective may end as late as
   its first reader two steps on; its update runs twice per step, the
   committed one and the local-gradient correction), where it was in the
   collective order and moved after every other bucket (it can yield the
   channel to stage 1). The move that shortens the period most is made; ties
   go to the bucket whose gradients are
   smallest relative to their weights, when the graph carries that
   statistic (``meta["grad_to_weight"]``: parameter name -> ``|g| / |w|``,
   the median over the timed steps of ``schedopt profile``), since a stale
   copy of it moves least.
   Each of the largest stage-1 parameters that share a bucket is also tried
   alone, split off into a new stage-2 bucket sent last.
3. Repeat until no candidate shortens the period.

A tied embedding is the typical pick: its gradient is finished last in
backward and read first in the next forward, so in ``overlap`` mode the
forward waits for it every step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from schedopt.errors import SolverError
from schedopt.plan import Bucket, Plan
from schedopt.problem import Problem
from schedopt.simulate import simulated_period

__all__ = ["StageOptions", "choose_stages", "stale_fraction"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StageOptions:
    """The stage choice's tuning (any solver in ``osp`` mode: ``--option 'stages={"split_candidates": 8}'``)."""

    #: Step 2 also tries each of this many largest stage-1 parameters alone in a new stage-2 bucket (a
    #: tied embedding shares its bucket with the layers finished with it; the whole may exceed the budget).
    split_candidates: int = 4

    def __post_init__(self) -> None:
        value = self.split_candidates
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SolverError(f"stages option split_candidates must be an integer of at least 0, got {value!r}")

    @classmethod
    def make(cls, options: "StageOptions | Mapping[str, Any] | None") -> "StageOptions":
        """``options`` as :class:`StageOptions` (None: the defaults); an unknown name raises :class:`SolverError`."""
        if options is None or isinstance(options, StageOptions):
            return options or cls()
        if not isinstance(options, Mapping):
            raise SolverError(f"the stages option must be a mapping such as {{\"split_candidates\": 8}}, got {options!r}")
        try:
            return cls(**options)
        except TypeError:
            raise SolverError(f"stages has no option {', '.join(map(repr, sorted(options)))}; options: "
                              "split_candidates") from None


def stale_fraction(problem: Problem, buckets: tuple[Bucket, ...]) -> float:
    """The share of parameter bytes in stage-2 buckets."""
    params = problem.graph.params
    total = sum(p.nbytes for p in params.values())
    stale = sum(params[n].nbytes for b in buckets if b.stage == 2 for n in b.params)
    return stale / total if total else 0.0


def choose_stages(problem: Problem, plan: Plan, options: StageOptions | None = None) -> Plan:
    """``plan`` (an ``overlap`` plan of ``problem``'s graph) as an ``osp`` plan with the stage-2 set of
    the module's rule; the period never longer than the ``overlap`` plan's."""
    options = options or StageOptions()
    graph = problem.graph
    ratio = graph.meta.get("grad_to_weight") or {}
    budget = problem.max_stale_fraction * sum(p.nbytes for p in graph.params.values()) * (1 + 1e-12)
    buckets = tuple(replace(b, stage=1) for b in plan.buckets)
    current = replace(plan, mode="osp", buckets=buckets, predicted=None)
    best_s = simulated_period(problem, current)
    used = 0
    while True:
        nbytes = [sum(graph.params[n].nbytes for n in b.params) for b in current.buckets]
        trials = []
        for k, bucket in enumerate(current.buckets):
            if bucket.stage == 2 or used + nbytes[k] > budget:
                continue
            stale = max((ratio.get(n, 0.0) for n in bucket.params), default=0.0)
            for last in ((False, True) if k + 1 < len(current.buckets) else (False,)):  # the last: one trial
                trial = _moved(current, k, last=last)
                trials.append((simulated_period(problem, trial), stale, nbytes[k], trial))
        for name in _largest_stage_1(current, graph, options.split_candidates):  # a large parameter alone, its bucket left stage 1
            size = graph.params[name].nbytes
            if used + size <= budget:
                trial = _split_off(current, name)
                trials.append((simulated_period(problem, trial), ratio.get(name, 0.0), size, trial))
        if not trials:
            return current
        t, _, size, trial = min(trials, key=lambda x: x[:3])
        if t >= best_s * (1 - 1e-9):
            return current
        current, best_s, used = trial, t, used + size


def _largest_stage_1(plan: Plan, graph, count: int) -> list[str]:
    names = [n for b in plan.buckets if b.stage == 1 and len(b.params) > 1 for n in b.params]
    return sorted(names, key=lambda n: -graph.params[n].nbytes)[:count]


def _split_off(plan: Plan, name: str) -> Plan:
    """``plan`` with parameter ``name`` out of its bucket (in one piece: its chunks were cut for the whole),
    alone in a stage-2 bucket sent last."""
    buckets = [replace(b, params=tuple(n for n in b.params if n != name), chunks=1) if name in b.params else b
               for b in plan.buckets]
    return replace(plan, buckets=(*buckets, Bucket(params=(name,), stage=2)))


def _moved(plan: Plan, k: int, *, last: bool) -> Plan:
    """``plan`` with bucket ``k`` in stage 2, where it was in the collective order or after every other
    (a stage-2 collective has two steps to finish, so it can yield the channel to stage 1)."""
    buckets = [replace(b, stage=2) if i == k else b for i, b in enumerate(plan.buckets)]
    if last:
        buckets.append(buckets.pop(k))
    return replace(plan, buckets=tuple(buckets))
