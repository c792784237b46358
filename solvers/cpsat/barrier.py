"""The ``barrier`` model: one step, its op order and buckets, ending at the last collective.

Data. The forward ops that lead to backward run first, in the hint's order
(``head``); the others are coarsened (:mod:`.coarse`). Parameters finished
by the same op (and of one dtype) form one *unit*: splitting such a group
over two buckets is never better than sending it whole in the earlier one.

Variables. ``start[i]``/``end[i]`` of coarse op i, inside ``[F, F + sum d]``
(F: the fixed head), so the compute stream never idles, with the domain cut
to ``[F + anc(i), F + sum d - desc(i) - d_i]`` (summed durations of ancestors
and descendants); the buckets of :mod:`.buckets`; ``T``.

Constraints. ``NoOverlap`` of the op intervals and the DAG's precedences;
``T >= F + sum d`` and ``T >= bstart[b] + bdur[b]``.

Cuts that make the bound strong: ``bstart[0] >=`` the earliest any gradient
can exist; ``T >= bstart[0] + sum_b bdur[b]``; ``T >= end[grad op] + A + c_u``
per unit; a tail cut per op w (every byte finished by w or below it leaves
after w ends); the constant ready-time and profile bounds of :mod:`..bounds`.

Objective: minimize ``T``; the iteration is ``T + T_opt``.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np

from schedopt.graph import TrainGraph
from schedopt.problem import Problem

from ..bounds import DEFAULT_BOUNDS, BoundSettings, profile_bound, ready_time_bound, work_profile
from .buckets import BucketVars, unit_buckets
from .coarse import coarsen, masked_sums, reach, ticks

__all__ = ["BarrierModel", "barrier_units"]


class BarrierModel(BucketVars):
    """The CP-SAT model of one barrier-mode problem (see the module docstring)."""

    def __init__(self, problem: Problem, head: list[str], free: list[str], tick_s: float, num_buckets: int,
                 *, profile_wall_s: float, bounds: BoundSettings = DEFAULT_BOUNDS):
        from ortools.sat.python import cp_model

        self._data(problem, head, free, tick_s, num_buckets)
        self.ready_bound = self._ready_bound(profile_wall_s, bounds)
        self.static_bound = max(self.compute_end, self.ready_bound)  # reported if CP-SAT finds nothing
        self.model = cp_model.CpModel()
        self._add_ops()
        horizon = 4 * self.compute_end + self.A * len(self.units) + sum(self.c) + 1
        self.add_buckets(self.model, horizon)
        self.T = self.model.NewIntVar(self.compute_end, horizon, "T")
        self._add_makespan()
        self._add_cuts()
        self.model.Minimize(self.T)

    # ---------------------------------------------------------------- data

    def _data(self, problem: Problem, head: list[str], free: list[str], tick_s: float, num_buckets: int) -> None:
        graph, cluster = problem.graph, problem.cluster
        self.graph, self.tick_s, self.head = graph, tick_s, head
        self.coarse = coarsen(graph, free, keep_order=not problem.reorders)
        chains = self.coarse.chains
        self.dur = [sum(ticks(graph.ops[o].duration_s, tick_s) for o in chain) for chain in chains]
        self.fixed = sum(ticks(graph.ops[o].duration_s, tick_s) for o in head)
        self.compute_end = self.fixed + sum(self.dur)
        self.units = barrier_units(graph)
        self.unit_op = [self.coarse.of[graph.params[u[0]].grad_op] for u in self.units]
        self.A = 0 if cluster.world_size == 1 else ticks(cluster.fixed_s, tick_s)
        self.c = [0 if cluster.world_size == 1 else
                  ticks(cluster.seconds_per_byte * sum(graph.params[n].nbytes for n in u), tick_s)
                  for u in self.units]
        self.B = num_buckets
        n = len(chains)
        dag = nx.DiGraph()
        dag.add_nodes_from(range(n))
        dag.add_edges_from(self.coarse.edges)
        self.ancestors, self.descendants = reach(dag, n), reach(dag.reverse(copy=False), n)
        self.anc, self.desc = masked_sums(self.ancestors, self.dur), masked_sums(self.descendants, self.dur)
        self.own = [0] * n  # the bytes each op finishes
        for u in range(len(self.units)):
            self.own[self.unit_op[u]] += self.c[u]

    def _ready_bound(self, profile_wall_s: float, bounds: BoundSettings) -> int:
        """The constant ready-time and profile bounds (:mod:`..bounds`) on ``T``, in ticks."""
        grad_ops = sorted(set(self.unit_op))
        needed = self.ancestors[grad_ops].any(axis=0)
        needed[grad_ops] = True
        earliest = [self.fixed + self.anc[i] + self.dur[i] for i in self.unit_op]
        profile = work_profile(self.dur, self.coarse.edges, self.own, wall_s=profile_wall_s, settings=bounds)
        all_ready = self.fixed + int(np.asarray(self.dur)[needed].sum())
        return max(ready_time_bound(earliest, self.c, self.A, all_ready=all_ready, settings=bounds),
                   profile_bound(earliest, self.c, self.A, self.fixed, profile, grid=bounds.profile_bound_pieces))

    # ---------------------------------------------------------------- constraints

    def _add_ops(self) -> None:
        """Op intervals on one stream, never idle from the head's end, in DAG order."""
        m, n, total = self.model, len(self.coarse.chains), self.compute_end
        low = [self.fixed + self.anc[i] for i in range(n)]
        self.start = [m.NewIntVar(low[i], total - self.desc[i] - self.dur[i], f"start[{i}]") for i in range(n)]
        self.end = [m.NewIntVar(low[i] + self.dur[i], total - self.desc[i], f"end[{i}]") for i in range(n)]
        m.AddNoOverlap([m.NewIntervalVar(self.start[i], self.dur[i], self.end[i], f"op[{i}]") for i in range(n)])
        for i, j in self.coarse.edges:
            m.Add(self.start[j] >= self.end[i])

    def _add_makespan(self) -> None:
        """``T`` after the ready-time bound and after every bucket."""
        self.model.Add(self.T >= self.ready_bound)
        for b in range(self.B):
            self.model.Add(self.T >= self.bstart[b] + self.bdur[b])

    def _add_cuts(self) -> None:
        """The first bucket after the earliest gradient; every byte after it; per unit; per op's tail."""
        m, U = self.model, len(self.units)
        m.Add(self.bstart[0] >= min(self.fixed + self.anc[i] + self.dur[i] for i in self.unit_op))
        m.Add(self.T >= self.bstart[0] + sum(self.bdur))
        for u in range(U):
            m.Add(self.T >= self.end[self.unit_op[u]] + self.A + self.c[u])
        # every gradient finished by op w or by a descendant of w is ready only after w ends, so all of
        # those bytes (and at least one call) cross the network after end[w]
        after = masked_sums(self.descendants, self.own)
        for w in range(len(self.coarse.chains)):
            if self.own[w] + after[w] > 0:
                m.Add(self.T >= self.end[w] + self.A + self.own[w] + after[w])

    # ---------------------------------------------------------------- hint

    def hint(self, order: list[str], buckets: list[list[str]]) -> dict[Any, int]:
        """The variable values of a plan (its free ops in ``order``), in ticks."""
        position = {o: k for k, o in enumerate(order)}
        chain_order = sorted(range(len(self.coarse.chains)), key=lambda i: position[self.coarse.chains[i][0]])
        values: dict[Any, int] = {}
        t = self.fixed
        ends = [0] * len(self.dur)
        for i in chain_order:
            values[self.start[i]] = t
            t += self.dur[i]
            values[self.end[i]] = ends[i] = t
        bucket_of = unit_buckets(self.units, buckets)
        channel, T = 0, self.compute_end
        for k in range(self.B):
            members = [u for u in range(len(self.units)) if bucket_of[u] == k]
            for u in range(len(self.units)):
                values[self.x[u, k]] = int(bucket_of[u] == k)
            values[self.used[k]] = int(bool(members))
            duration = (self.A + sum(self.c[u] for u in members)) if members else 0
            start = max([channel] + [ends[self.unit_op[u]] for u in members])
            values[self.bstart[k]], values[self.bdur[k]] = start, duration
            channel = start + duration
            T = max(T, channel)
        values[self.T] = T
        return values


def barrier_units(graph: TrainGraph) -> list[list[str]]:
    """The barrier model's units: the parameters one op finishes, by dtype."""
    units: dict[tuple[str, str], list[str]] = {}
    for name, p in graph.params.items():
        units.setdefault((p.grad_op, p.dtype), []).append(name)
    return list(units.values())
