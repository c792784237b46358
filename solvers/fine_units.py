"""Plans over the finest units ``fully_shard`` can group (:func:`.fsdp.fine_atoms`: a block's own linear
and norm layers): the two ends of the memory range.

**Pipelined units**, the fastest layout of unsharded units with every all-gather issued at once.

Where the budget lets every unit stay unsharded (the barrier-like case), a unit costs its fixed
collective cost twice (an all-gather in the forward, a reduce-scatter in the backward) and pays
back by letting compute start before the whole model has arrived, and the backward's last
reduce-scatters be small. With every all-gather issued at the step's start and the units kept,
the step is exactly :func:`schedopt.runs.joint_runs`'s objective over the units' split (the
forward ends after the last unit's all-gather and the compute from its first op; the
backward after the reduce-scatters of the units not finished before it), where each unit's last
gradient is its earliest parameter's (a chain). The split is chosen over the finest units
``fully_shard`` can make (:func:`.fsdp.fine_atoms`: a block's own linear and norm layers), so
the first and last units can be a layer rather than a block; the first run goes to the root where
the root has parameters (a tied embedding). The plan is simulated: the simulator is the judge.

**The least memory**: every unit resharded after its forward, nothing prefetched, the fastest of
that with a forward or backward prefetch of one where the budget allows it. Small units hold
little at once: on the benchmark's and the example models this peak is within 0.01% of the
memory floor (:func:`schedopt.shard_sim.memory_floor`), the least any plan can hold.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

import numpy as np

from schedopt.graph import TrainGraph
from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem
from schedopt.runs import Sides, joint_runs
from schedopt.shard_sim import collective_costs, peak_memory
from schedopt.sharding import Geometry, Unit
from schedopt.simulate import simulate

from .fsdp import build_units, coarsen, fine_atoms

__all__ = ["pipelined_plan", "least_memory_plan"]


def pipelined_plan(problem: Problem) -> Plan | None:
    """The pipelined units' plan (module docstring), simulated; None where the graph has no module tree, no
    module outside the root, or the plan peaks over the budget."""
    graph, cluster = problem.graph, problem.cluster
    if graph.modules is None or cluster.world_size == 1 or not (leaves := fine_atoms(graph)):
        return None
    order = engine_order(graph)
    units = _finest(graph, leaves)
    geometry = Geometry(graph, order, units)
    durations = [graph.ops[o].duration_s for o in geometry.compute_ops]
    after = list(accumulate(reversed(durations), initial=0.0))[::-1]  # after[j]: compute from op j on
    backward = geometry.backward_start
    sides = Sides.of(*collective_costs(cluster), np.cumsum(geometry.nbytes, dtype=float),
                     lead_f=[after[s.forward_first] - after[backward] for s in geometry.spans],
                     lead_b=[after[backward] - after[s.backward_last + 1] for s in geometry.spans],
                     floor_f=after[0] - after[backward], floor_b=after[backward])
    best = None
    for n, runs in enumerate(joint_runs(sides, splits=True), 1):
        best = runs
        # the n-th run's two terms alone: no split into more runs can do better
        if n * (sides.intercept_f + sides.intercept_b) + sides.moved_f[-1] + sides.moved_b[-1] >= runs.value:
            break
    assert best is not None and best.starts
    ends = [*best.starts[1:], len(units)]
    rooted = units[0].is_root  # the first run is the root's: its atoms are left to it
    groups = [coarsen(graph, [m for u in units[s:e] for m in u.modules])
              for s, e in zip(best.starts, ends)][1 if rooted else 0:]
    chosen = build_units(graph, groups, reshard=[False] * len(groups), prefetch_forward=len(units))
    plan = Plan.for_problem(problem, order=order, units=chosen,
                            solver=SolverInfo(name="pipelined-units", stats={"model_s": best.value
                                                                            + graph.totals.optimizer_s}))
    budget = problem.memory_budget_bytes
    if budget is not None and peak_memory(graph, plan)[0] > budget:
        return None
    return plan.with_prediction(simulate(problem, plan).prediction())


def least_memory_plan(problem: Problem) -> tuple[Plan | None, float]:
    """(the least-memory plan within the budget, or None; the least peak of the finest units) (module
    docstring); (None, inf) where the graph has no module tree or no module outside the root."""
    graph = problem.graph
    if graph.modules is None or not (leaves := fine_atoms(graph)):
        return None, float("inf")
    budget, order = problem.memory_budget_bytes, engine_order(graph)
    fitting, least = [], float("inf")
    kept = _finest(graph, leaves)
    spans = Geometry(graph, order, kept).spans  # a unit read again after the next one's forward began stays kept
    reshard = [not u.is_root and (k + 1 == len(kept) or spans[k].forward_last <= spans[k + 1].forward_first)
               for k, u in enumerate(kept)]
    for ahead, behind in ((0, 0), (1, 0), (0, 1), (1, 1)):
        units = [replace(u, reshard_after_forward=r, prefetch_forward=min(ahead, k),
                         prefetch_backward=min(behind, len(kept) - 1 - k))
                 for k, (u, r) in enumerate(zip(kept, reshard))]
        plan = Plan.for_problem(problem, order=order, units=units, solver=SolverInfo(name="least-memory"))
        peak = peak_memory(graph, plan)[0]
        least = min(least, peak)
        if budget is None or peak <= budget:
            fitting.append(plan.with_prediction(simulate(problem, plan).prediction()))
    return min(fitting, key=lambda p: p.predicted.iteration_s, default=None), least


def _finest(graph: TrainGraph, leaves: list[str]) -> list[Unit]:
    """A unit per leaf (:func:`.fsdp.fine_atoms`), kept, the root for the rest, in forward order."""
    return build_units(graph, [[m] for m in leaves], reshard=[False] * len(leaves))
