"""The candidate buckets both CP-SAT models share: which unit goes where, and when each bucket runs.

``x[u, b]``: unit u travels in candidate bucket b (b < B, in collective
order); ``used[b] >= used[b+1]`` breaks symmetry; ``bstart[b]`` is when bucket
b starts, ``bdur[b] = A·used[b] + sum_u c_u·x[u, b]`` (A: call overhead plus
latency steps; ``c_u``: transfer ticks of the unit). A bucket starts after
each of its gradients is ready and after the previous bucket ends.
"""

from __future__ import annotations

from typing import Any

from schedopt.graph import TrainGraph

from .coarse import Coarse

__all__ = ["BucketVars", "unit_buckets"]


class BucketVars:
    """Candidate buckets shared by both models: assignment, symmetry, FIFO and ready times."""

    units: list[list[str]]
    unit_op: list[int]
    c: list[int]
    A: int
    B: int
    start: list[Any]
    end: list[Any]
    coarse: Coarse
    graph: TrainGraph
    head: list[str]  # ops fixed before every free op, in order

    def add_buckets(self, m, horizon: int) -> None:
        """Variables ``x[u, b]``, ``used[b]``, ``bstart[b]``, ``bdur[b]``; each unit in one bucket, used
        buckets first, FIFO, a bucket after each of its gradients."""
        U, B = len(self.units), self.B
        self.x = {(u, b): m.NewBoolVar(f"x[{u},{b}]") for u in range(U) for b in range(B)}
        self.used = [m.NewBoolVar(f"used[{b}]") for b in range(B)]
        self.bstart = [m.NewIntVar(0, horizon, f"bstart[{b}]") for b in range(B)]
        self.bdur = [m.NewIntVar(0, horizon, f"bdur[{b}]") for b in range(B)]
        for u in range(U):
            m.AddExactlyOne(self.x[u, b] for b in range(B))
        for b in range(B):
            members = [self.x[u, b] for u in range(U)]
            for x in members:
                m.AddImplication(x, self.used[b])
            m.AddBoolOr(members).OnlyEnforceIf(self.used[b])
            m.Add(self.bdur[b] == self.A * self.used[b] + sum(self.c[u] * self.x[u, b] for u in range(U)))
            if b + 1 < B:
                m.AddImplication(self.used[b + 1], self.used[b])
                m.Add(self.bstart[b + 1] >= self.bstart[b] + self.bdur[b])
            for u in range(U):
                m.Add(self.bstart[b] >= self.end[self.unit_op[u]]).OnlyEnforceIf(self.x[u, b])

    def expand(self, solver) -> tuple[list[str], list[list[str]]]:
        """Read a solution: the fixed head, the free ops by start time, the optimizer; then the buckets."""
        rank = getattr(self, "fixed_rank", range(len(self.coarse.chains)))
        chain_order = sorted(range(len(self.coarse.chains)), key=lambda i: (solver.Value(self.start[i]), rank[i]))
        order = self.full_order([o for i in chain_order for o in self.coarse.chains[i]])
        return order, self.read_buckets(solver, order)

    def full_order(self, free: list[str]) -> list[str]:
        """The plan's op order with the free ops in ``free``'s order: the fixed head, them, the optimizer."""
        return self.head + free + [o for o in self.graph.ops if self.graph.ops[o].phase == "optimizer"]

    def in_ready_order(self, names: list[str], order: list[str]) -> list[str]:
        """A bucket's parameters in the order ``order`` readies their gradients."""
        position = {o: k for k, o in enumerate(order)}
        return sorted(names, key=lambda n: position[self.graph.params[n].grad_op])

    def fix_order(self, order: list[str]) -> None:
        """Run the free ops' chains in ``order`` (``eager`` execution: the engine's order is given)."""
        position = {o: k for k, o in enumerate(order)}
        chains = sorted(range(len(self.coarse.chains)), key=lambda i: position[self.coarse.chains[i][0]])
        for a, b in zip(chains, chains[1:]):
            self.model.Add(self.start[b] >= self.end[a])
        self.fixed_rank = {i: k for k, i in enumerate(chains)}

    def read_buckets(self, solver, order: list[str]) -> list[list[str]]:
        """The used buckets of a solution, each in gradient-ready order under ``order``."""
        buckets = []
        for b in range(self.B):
            members = [n for u, unit in enumerate(self.units) if solver.Value(self.x[u, b]) for n in unit]
            if members:
                buckets.append(self.in_ready_order(members, order))
        return buckets


def unit_buckets(units: list[list[str]], buckets: list[list[str]]) -> list[int]:
    """The bucket rank of each unit in a plan's ``buckets``: a unit goes with the earliest bucket
    holding any of its parameters, and ranks count only the buckets some unit goes with."""
    home: dict[str, int] = {}
    for b, bucket in enumerate(buckets):
        for name in bucket:
            home.setdefault(name, b)
    chosen = [min(home[n] for n in unit) for unit in units]
    rank = {b: k for k, b in enumerate(sorted(set(chosen)))}
    return [rank[b] for b in chosen]
