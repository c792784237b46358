"""The ``overlap`` period relaxed to the channel and the backward's closures: a bound and a plan.

The channel bound (:func:`..bounds.channel_bound`) lets every gradient be ready at its own
earliest; the backward, though, runs on one compute stream, so a call that carries many
gradients starts only after all of their ops *and all of their ancestors* have run. This model
keeps exactly that and drops the rest:

- calls ``k = 0..K-1`` go one after another on the channel, ``A`` ticks each (when used) plus the
  transfer of the parameters they carry; each parameter rides in one call (a chunked bucket is
  never faster than its chunks cut into buckets at parameter boundaries: :func:`..common.split_chunks`);
- ``z[v, k]``: backward op v has run by the start of call k. Closed under ancestors and nested
  (what ran by call k ran by call k+1), holding the op of every parameter call k carries; call
  k starts no earlier than the work of its closure (times from the step's first backward op);
- ``T >= end of the call + tail`` for each parameter it carries (the parameter's update and the
  forward from its first reader to the next backward: :meth:`.OverlapModel._items`).

Every plan with the model's forward order and at most K calls gives a solution with ``T`` at most
its period, so what CP-SAT proves is a lower bound on that period. K is the most calls that can beat ``upper`` (any known
period): a plan with more spends ``(K+1)·A`` plus every byte on the channel after the earliest
gradient is ready and before the one read last is needed, ``>= upper`` (:func:`max_calls`).
What it leaves out: the forward and the updates share the compute stream with nothing here but
their own tail. ResNet-50 on 64 x 100 GbE: 960.5k ticks (channel bound) -> 994.8k (the
relaxation's optimum), the plan at 1e6. Its solution, read as a plan (each backward op at the
first call whose closure holds it; the calls as buckets), is a candidate the bucket search had not
found on Inception there: cpsat's plan at 60 s 21.77 -> 21.20 ms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import networkx as nx

from .capped import solve_capped

__all__ = ["Relaxation", "max_calls", "order_of", "relax"]


@dataclass(frozen=True)
class Relaxation:
    """What one solve of the relaxation gave, in ticks."""

    bound: int  #: no plan with the model's forward order is faster (already ``min``-ed with ``upper``)
    #: "closed" (the optimum found within 0.1%), or the CP-SAT status the bisection stopped on
    status: str
    #: the best solution: the items (``OverlapModel.items``) of each used call, in channel order, and
    #: per coarse op the first call whose closure holds it (the number of calls: none); or None
    calls: list[list[int]] | None = None
    level: list[int] | None = None


def max_calls(items: list[tuple[int, int, int, int]], call: int, upper: int) -> int:
    """The most calls a plan faster than ``upper`` ticks can make (each item in one, at most).

    The calls go one after another, the first after the earliest release and the last followed by
    a tail, so ``k`` calls take ``T >= least release + k call + every byte + least tail`` (GPT-2
    small on 64 x 100 GbE: 23 calls, 34 counting the bytes and calls alone)."""
    if not items:
        return 0
    total = sum(item[3] for item in items)
    if call <= 0:
        return len(items)
    least_release, least_tail = min(item[1] for item in items), min(item[2] for item in items)
    return max(0, min(len(items), (upper - least_release - total - least_tail - 1) // call))


def relax(items: list[tuple[int, int, int, int]], op_ticks: list[int], edges: set[tuple[int, int]],
          call: int, upper: int, seconds: float, *, num_workers: int = 2, seed: int = 0,
          floor: int = 0, on_step: Callable[[int], None] | None = None) -> Relaxation:
    """Bisect the relaxation's optimum for ``seconds``. ``items``: per parameter ``(coarse op,
    release, tail, transfer)``; ``op_ticks``, ``edges``: the coarse backward ops and their DAG;
    ``upper``: a known period (the warm start's); ``floor``: a bound already known; ``on_step``
    is called with the bound after each step that raises it.

    Each step asks CP-SAT for a solution with ``T <= mid``: none (proven) raises the bound to
    ``mid + 1``, one lowers the top to its ``T`` and is kept; a step that runs out of time ends the
    search. (Minimizing ``T`` instead proved nothing above the channel bound on Inception in 40 s;
    the bisection proved 959k of the 1e6 ticks in 30.)
    """
    deadline = time.perf_counter() + seconds
    K = max_calls(items, call, upper)
    if K == 0:  # not even the calls' overheads and bytes fit under upper
        return Relaxation(bound=upper, status="closed")
    model = _Model(items, op_ticks, edges, call, K, horizon=2 * upper + sum(op_ticks) + 1)
    low, top, best, status = min(floor, upper), upper, None, "UNKNOWN"
    while top - low > upper // 1000 and (left := deadline - time.perf_counter()) > 0.1:
        mid = (low + top) // 2
        found, status = model.solve(mid, left, num_workers, seed)
        if status == "INFEASIBLE":
            low = mid + 1
            if on_step is not None:
                on_step(low)
        elif found is None:
            break
        else:
            top, best = found.bound, found
    if top - low <= upper // 1000:
        status = "closed"
    if best is None:
        return Relaxation(bound=low, status=status)
    return Relaxation(bound=low, status=status, calls=best.calls, level=best.level)


class _Model:
    """The relaxation as one CP-SAT model; each :meth:`solve` caps ``T`` anew."""

    def __init__(self, items, op_ticks, edges, call: int, K: int, *, horizon: int):
        from ortools.sat.python import cp_model

        self.m = m = cp_model.CpModel()
        self.K = K
        self.x = [[m.NewBoolVar(f"x[{i},{k}]") for k in range(K)] for i in range(len(items))]
        self.z = [[m.NewBoolVar(f"z[{v},{k}]") for k in range(K)] for v in range(len(op_ticks))]
        self.T = m.NewIntVar(0, horizon, "T")
        used = [m.NewBoolVar(f"used[{k}]") for k in range(K)]
        start = [m.NewIntVar(0, horizon, f"start[{k}]") for k in range(K)]
        end = [m.NewIntVar(0, horizon, f"end[{k}]") for k in range(K)]
        x, z = self.x, self.z
        for k in range(1, K):
            m.AddImplication(used[k], used[k - 1])  # used calls first
            m.Add(start[k] >= end[k - 1])
        for row in z:
            for k in range(1, K):
                m.AddImplication(row[k - 1], row[k])  # nested
        for a, b in edges:
            for k in range(K):
                m.AddImplication(z[b][k], z[a][k])  # closed under ancestors
        for i, (op, release, tail, _) in enumerate(items):
            m.AddExactlyOne(x[i])
            for k in range(K):
                m.AddImplication(x[i][k], used[k])
                m.AddImplication(x[i][k], z[op][k])
                m.Add(start[k] >= release * x[i][k])  # linear (no big M): releases and tails are >= 0
                m.Add(self.T >= end[k] + tail * x[i][k])
        for k in range(K):
            m.Add(end[k] == start[k] + call * used[k] + sum(item[3] * x[i][k] for i, item in enumerate(items)))
            m.Add(start[k] >= sum(d * z[v][k] for v, d in enumerate(op_ticks) if d))

    def solve(self, target: int, seconds: float, num_workers: int, seed: int) -> tuple[Relaxation | None, str]:
        """A solution with ``T <= target`` (``bound``: its ``T``), or None; CP-SAT's status name."""
        solver, name, found = solve_capped(self.m, self.T, target, seconds, num_workers, seed)
        if not found:
            return None, name
        K = self.K
        calls = [[i for i, row in enumerate(self.x) if solver.Value(row[k])] for k in range(K)]
        level = [next((k for k in range(K) if solver.Value(row[k])), K) for row in self.z]
        return Relaxation(bound=solver.Value(self.T), status=name, calls=[c for c in calls if c], level=level), name


def order_of(level: list[int], chains: list[list[str]], edges: set[tuple[int, int]],
             position: dict[str, int]) -> list[str]:
    """The backward ops of a solution: chains by the first call whose closure holds them, then as in
    ``position`` (the warm start's order), ancestors first."""
    dag = nx.DiGraph(list(edges))
    dag.add_nodes_from(range(len(chains)))
    ranked = nx.lexicographical_topological_sort(dag, key=lambda v: (level[v], position[chains[v][0]]))
    return [o for v in ranked for o in chains[v]]
