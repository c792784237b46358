"""cpsat's last step where ranks vary: its best candidates re-checked on the rank model.

CP-SAT and the warm starts rank plans by the one-rank simulator: every rank alike, each collective
started the moment that one rank issues it. Real ranks differ from step to step, and a collective
starts when the last of them issues it, so a plan that lands a bucket just in time for the next
forward loses more than one with slack. Where ``problem.rank_model`` varies, the plan cpsat found
and the best warm starts of other layouts are each run on the rank model
(:func:`schedopt.ranks.period`) and the one with the shortest period is returned; its ``stats``
say which it was and every period. A sharded plan is re-checked the same way against every warm start
within the budget (the fastest baseline, the greedy units, the pipelined and the least-memory plans).

The proven bound is the one-rank model's, and it holds on the ranks too: a step's clocks are sums and
maxes of op times, so convex and increasing in them, and the ranks' mean clock is symmetric in the
ranks; by Jensen's inequality the expected period with op times varying around their means (rank
speeds averaging 1) is at least the period with every rank at the means, which is the one-rank
simulator's, itself at least the bound. (With interference, compute slowed while the wire is busy,
the argument does not apply as it stands; the property test in ``tests/test_ranks.py`` finds the same
there.) What one rank cannot see, stragglers, :func:`schedopt.rank_bound.rank_lower_bound` bounds:
``stats["rank_bound_s"]``, for every plan in the kept plan's op order. ``stats["rank_gap"]``, the kept
plan's period on the ranks (``stats["rank_period_s"]``) over the larger of the two bounds, bounds how
far it is from the best period on the ranks of the plans the proven bound covers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from schedopt.plan import Plan
from schedopt.problem import Problem
from schedopt.rank_bound import rank_lower_bound
from schedopt.ranks import STABLE, period
from schedopt.simulate import simulate

__all__ = ["RECHECKED", "on_ranks"]

#: how many of the best warm starts (by one-rank time, distinct layouts) are re-checked beside cpsat's plan, at most
RECHECKED = 6


def on_ranks(problem: Problem, plan: Plan, candidates: list[tuple[float, Plan]], *,
             keep: int = RECHECKED) -> Plan:
    """The plan among ``plan`` and the ``keep`` best ``candidates`` ((one-rank time, plan) pairs) whose
    period on ``problem.rank_model`` is shortest (``plan`` on ties), with the re-check in its stats.

    The candidates run in order of their one-rank time, and stop where that time is at or above the
    shortest period found on the ranks (past the rank model's 1% noise): no period on the ranks is
    shorter than the one rank's (the module docstring), so no later candidate can win.
    ``stats["rank_exhaustive"]``: the rule stopped it or no candidate was left, not ``keep``."""
    one_rank_s = simulate(problem, plan).iteration_s
    scored = [(period(problem, plan), 0, one_rank_s, plan)]
    seen, exhaustive = {_layout(plan)}, True
    for t, candidate in sorted(candidates, key=lambda tp: tp[0]):
        if t >= min(scored)[0] * (1 + STABLE):
            break
        if (key := _layout(candidate)) in seen:
            continue
        if len(scored) > keep:
            exhaustive = False
            break
        seen.add(key)
        scored.append((period(problem, candidate), len(scored), t, candidate))
    best_period, k, one_rank_s, best = min(scored)
    record: dict[str, Any] = {
        "rank_model": problem.rank_model.describe(), "rank_choice": best.solver.name if k else "cpsat",
        "rank_periods_s": {("cpsat" if i == 0 else f"{i}:{p.solver.name}"): round(r, 9) for r, i, _, p in scored},
        "rank_exhaustive": exhaustive, "rank_period_s": best_period,
        "rank_bound_s": rank_lower_bound(problem, best.order, problem.rank_model),
    }
    if plan.solver.bound_s:  # the one-rank bound holds on the ranks too (the module docstring)
        record["rank_gap"] = best_period / max(plan.solver.bound_s, record["rank_bound_s"]) - 1
    info = replace(plan.solver, objective_s=one_rank_s if k else plan.solver.objective_s,
                   stats={**plan.solver.stats, **record})
    if k and info.status == "OPTIMAL" and info.gap > 1e-9:  # proven for cpsat's plan, not the one kept instead
        info = replace(info, status="FEASIBLE", stats={**info.stats, "model_status": "OPTIMAL"})
    return replace(best, solver=info, predicted=None if k else plan.predicted)


def _layout(plan: Plan) -> tuple:
    """What makes two plans run alike: the order and the buckets (their parameters, chunks, stages), or
    a sharded plan's units and how its all-gathers are issued."""
    return tuple(plan.order), tuple(plan.buckets), tuple(plan.units), plan.async_unshard
