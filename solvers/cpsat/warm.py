"""Warm starts: every heuristic (for a compiled problem its eager plans too), the exact contiguous
bucketing, and (``overlap``) a bucket search.

The best of them is CP-SAT's hint and the plan returned when CP-SAT finds
nothing better. In ``overlap`` mode the local search of
:mod:`..overlap_search` runs from the best plans of distinct orders: buckets
sent out of ready order, which no heuristic tries, are where most of overlap
mode's gain is. It runs in rounds; after each, the backward order becomes the
*bucket-first* order of the buckets found (:func:`..common.bucket_first_order`)
when that is faster, so gradients the search holds back also let their ops
wait (GPT-2 small, 8 x 100 GbE: 119.2 -> 117.6 ms), and in a compiled problem buckets are then held
back behind the one the forward waits for, their ops with them (:mod:`..deferral`: 117.71 -> 115.84 ms).
Beside them runs the anchor search (:mod:`..anchor_search`): which gradients travel before the one
that bounds the period most on its own, which after, with the exact bucketing of each split (GPT-2
small, 64 x 100 GbE, compiled: 122.05 -> 121.41 ms; 8 x 100 GbE: 115.49 -> 114.30 ms).
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import replace
from typing import Any

from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem
from schedopt.simulate import simulate

from ..anchor_search import anchor_search
from ..bucketing import optimal_contiguous_buckets
from ..caramel import caramel_order
from ..common import bucket_first_order, split_chunks
from ..deferral import defer_behind_anchor
from ..overlap_search import SteadyState, improve_buckets
from ..registry import SOLVERS
from .config import CpsatOptions
from .deadline import Deadline
from .phases import dead_forward, defer_dead_forward

__all__ = ["warm_starts", "run_searches", "search_anchor", "search_buckets"]


def warm_starts(problem: Problem, options: CpsatOptions, deadline: Deadline,
                notes: dict[str, Any] | None = None) -> list[tuple[float, Plan]]:
    """The plans of the heuristics ``options.warm_starts`` names, the exact contiguous bucketing of the engine and Caramel orders (each
    also with :func:`.phases.dead_forward`'s ops deferred) and, in ``overlap`` mode, the local search of
    :mod:`.overlap_search` from the best plans of distinct orders; each with its simulated iteration
    time (every plan is simulated once: at scale that is most of the cost). What went wrong on the way
    (a search stopped, no processes) is written to ``notes``."""
    graph = problem.graph
    seed, notes = options.seed, {} if notes is None else notes
    heuristics = {name: SOLVERS[name](problem, seed=seed, time_limit_s=deadline.share(options.heuristic_share))
                  for name in options.warm_starts}
    scored = [(plan.predicted.iteration_s, plan) for plan in heuristics.values()]
    if problem.reorders:  # the engine's order is one a compiled graph may run: never plan worse than eager
        scored += _engine_order_plans(problem, options, deadline, heuristics)

    def add(order, buckets, name: str) -> None:
        plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name=name))
        scored.append((simulate(problem, plan).iteration_s, plan))

    for k, (t, plan) in enumerate(scored):  # Caramel's chunks as buckets: never slower, and the model has none
        if any(b.chunks > 1 for b in plan.buckets):
            split = replace(plan, buckets=tuple(split_chunks(graph, plan.buckets)), predicted=None,
                            solver=replace(plan.solver, name=f"{plan.solver.name}-split"))
            t_split = simulate(problem, split).iteration_s
            if t_split <= t:
                scored[k] = (t_split, split)
    dead = dead_forward(graph, problem.mode) if problem.reorders else set()
    orders = list(dict.fromkeys((tuple(engine_order(graph)), tuple(caramel_order(problem)))))
    orders += [deferred for order in orders if (deferred := defer_dead_forward(graph, order, dead)) != order]
    for order in orders:
        add(order, optimal_contiguous_buckets(graph, order, problem.cluster)[0], "contiguous-dp")
    _, best = min(scored, key=lambda tp: tp[0])
    buckets = [b.params for b in best.buckets]
    if problem.reorders and (rerun := bucket_first_order(graph, best.order, buckets)) != list(best.order):
        add(rerun, buckets, f"{best.solver.name}-bucket-first")
    if problem.mode != "overlap" or problem.cluster.world_size == 1 or not graph.params:
        return scored
    # the best plan per order, an order and its deferred variant counting as one (distinct starts
    # matter: the search's result depends on the order much more than on the deferral)
    by_order: dict[tuple[str, ...], tuple[float, Plan]] = {}
    for t, plan in scored:
        key = tuple(o for o in plan.order if o not in dead)
        if key not in by_order or t < by_order[key][0]:
            by_order[key] = (t, plan)
    starts = sorted(by_order.values(), key=lambda tp: tp[0])[:options.search_orders]
    scored += _searched(problem, [plan for _, plan in starts], options, deadline, notes)
    return scored


def _searched(problem: Problem, starts: list[Plan], options: CpsatOptions, deadline: Deadline,
              notes: dict[str, Any]) -> list[tuple[float, Plan]]:
    """The plans the searches find from ``starts`` (best first), with their simulated periods.

    One process per start when the workers allow: the search is pure Python and CP-SAT has not
    started yet, so the other core would idle (each start then gets the whole share of the time).
    Each start has its own seed: the search's basin depends on it (Inception, 64 x 100 GbE, seeds
    0-3: 3.96%, 5.71%, 3.56%, 5.15% gap with one seed for both starts; 5.15% -> 4.36% for seed 3).
    The anchor search (:mod:`..anchor_search`) runs from the best start's order in the last lane,
    where it takes ``anchor_search_share`` of the lane's time.
    """
    processes = min(options.num_workers, len(starts))
    lane_s = deadline.share(options.search_share) * processes / len(starts)
    lanes = [[(search_buckets, plan, lane_s)] for plan in starts]
    if options.anchor_search:
        held = options.anchor_search_share * lane_s
        lanes[-1] = [(search_buckets, starts[-1], lane_s - held), (search_anchor, starts[0], held)]
    jobs = [[(search, problem, list(plan.order), [list(b.params) for b in plan.buckets], options.seed + 1000 * k,
              time_s, options) for search, plan, time_s in lane] for k, lane in enumerate(lanes)]
    scored = []
    for lane, results in zip(jobs, run_searches(jobs, processes, options.search_grace_s, notes)):
        for job, found in zip(lane, results):
            name = "anchor-search" if job[0] is search_anchor else "overlap-search"
            scored += [(t, Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name=name)))
                       for order, buckets, t in found]
    return scored


def _engine_order_plans(problem: Problem, options: CpsatOptions, deadline: Deadline,
                        compiled: dict[str, Plan]) -> list[tuple[float, Plan]]:
    """The ``--execution eager`` plans (the engine's order) of the heuristics that reordered for ``problem``,
    stamped and simulated for it.

    A heuristic that kept the engine's order for the compiled problem planned what it plans for
    the eager one, so only those that moved ops (Caramel) are asked again. A guarantee more than a
    fix: it came from ResNet-18 on the testbed link, where cpsat's compiled plan was predicted at
    906.9 ms against Caramel's eager 891.9 (``bench/results/testbed_resnet18_550mbit_compiled.json``),
    but on the synthetic graphs the starts already held an equivalent plan (the same order, its
    chunks as buckets).
    """
    eager = replace(problem, execution="eager")
    engine = tuple(engine_order(problem.graph))
    out = []
    for name, reordered in compiled.items():
        if reordered.order == engine:
            continue
        plan = SOLVERS[name](eager, seed=options.seed, time_limit_s=deadline.share(options.heuristic_share))
        stamped = Plan.for_problem(problem, order=plan.order, buckets=plan.buckets,
                                   solver=SolverInfo(name=f"{name}-eager"))
        out.append((simulate(problem, stamped).iteration_s, stamped))
    return out


def run_searches(lanes: list[list[tuple]], processes: int, grace_s: float,
                 notes: dict[str, Any]) -> list[list[list[tuple[list[str], list[list[str]], float]]]]:
    """Every lane (searches run one after the other, each a function, :func:`search_buckets` or
    :func:`search_anchor`, and its arguments, its time the sixth field) in ``processes`` forked
    processes when more than one; each lane's results, job by job.

    Fork, not spawn: the children need nothing from ``__main__`` (spawn would rerun a script that has
    no main guard). A lane still running ``grace_s`` past its time is killed, never waited for, and
    counts as having found nothing (``notes["search"]`` says so); the other lanes keep what they found.
    Without processes (or when they cannot start) the lanes run here, one after the other, each in
    its share of the time.
    """
    if processes <= 1:
        return [_run_lane(lane) for lane in lanes]
    try:
        pool = multiprocessing.get_context("fork").Pool(processes)
    except OSError as error:
        notes["search"] = f"no search processes ({error}); the starts searched one after the other"
        return [_run_lane([(*job[:5], job[5] / processes, *job[6:]) for job in lane]) for lane in lanes]
    try:
        pending = [pool.apply_async(_run_lane, (lane,)) for lane in lanes]
        waves = -(-len(lanes) // processes)
        end = time.perf_counter() + waves * max(sum(job[5] for job in lane) for lane in lanes) + grace_s
        out = []
        for lane, result in zip(lanes, pending):
            result.wait(max(end - time.perf_counter(), 0.0))
            if result.ready():
                out.append(result.get())  # a search that failed raises its error here
            else:
                notes["search"] = f"a search lane overran its time by {grace_s:g} s and was stopped; nothing kept of it"
                out.append([[] for _ in lane])
        return out
    finally:
        pool.terminate()
        pool.join()


def _run_lane(lane: list[tuple]) -> list[list[tuple[list[str], list[list[str]], float]]]:
    return [job[0](*job[1:]) for job in lane]


def search_anchor(problem: Problem, order: list[str], buckets: list[list[str]], seed: int,
                  time_s: float, options: CpsatOptions) -> list[tuple[list[str], list[list[str]], float]]:
    """:func:`..anchor_search.anchor_search` in ``order``'s units (``buckets`` unused: it starts from
    its own sets); the plan it found with its simulated period, or nothing (nothing either above
    ``options.anchor_search_max_units`` units)."""
    state = SteadyState(problem, order)
    units = len(state.units)
    if units > options.anchor_search_max_units:
        return []
    evaluations = min(options.anchor_search_evaluations, options.anchor_search_evaluations_per_unit * units)
    found = anchor_search(problem, order, max_evaluations=evaluations, time_limit_s=time_s, seed=seed, state=state)
    return [] if found is None else [(found[0], found[1], _period(problem, found[0], found[1]))]


def search_buckets(problem: Problem, order: list[str], buckets: list[list[str]], seed: int,
                   time_s: float, options: CpsatOptions) -> list[tuple[list[str], list[list[str]], float]]:
    """Rounds of :func:`.overlap_search.improve_buckets` from one start, each followed by the
    bucket-first order of what it found (kept when faster) and, in a compiled problem, by
    :func:`..deferral.defer_behind_anchor` (``search_deferral_share`` of the round's time); every
    plan met, with its period."""
    found = []
    deferral = options.search_deferral_share if problem.reorders else 0.0
    for k, share in enumerate(options.search_round_shares):
        state = SteadyState(problem, order)
        evaluations = min(options.search_evaluations, options.search_evaluations_per_unit * len(state.units))
        result, _ = improve_buckets(state, state.ready_order_buckets(buckets),
                                    max_evaluations=max(1, int(share * evaluations)), seed=seed + k,
                                    time_limit_s=(1 - deferral) * share * time_s,
                                    accept_worse=options.search_accept_worse, kick_moves=options.search_kick_moves)
        buckets = state.names(result)
        candidates = [order]
        if problem.reorders and (rerun := bucket_first_order(problem.graph, order, buckets)) != order:
            candidates.append(rerun)
        found += [(candidate, buckets, _period(problem, candidate, buckets)) for candidate in candidates]
        order, _, period = min(found[-len(candidates):], key=lambda f: f[2])
        if deferral > 0:
            held, held_buckets, _ = defer_behind_anchor(problem, order, buckets, time_limit_s=deferral * share * time_s)
            found.append((held, held_buckets, _period(problem, held, held_buckets)))
            if found[-1][2] < period:  # the next round goes on from it
                order, buckets = held, held_buckets
    return found


def _period(problem: Problem, order: list[str], buckets: list[list[str]]) -> float:
    plan = Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="search"))
    return simulate(problem, plan).iteration_s
