"""The ``overlap`` period relaxed around one gradient, the anchor: which others go before it, which after.

The anchor bound (:func:`..bounds.anchor_bound`) delays the anchor's call by the work done before
it and sends the bytes not ready then in later calls; it lets the bytes that *are* ready travel for
free and the late ones be whichever have the least tails. Where one gradient dominates (GPT-2's
tied embedding: finished last, read first) the plans' periods sit above it because of what it lets
go: the first layers' gradients are ready only near the end of the backward and read right at
the start of the next forward, so they either queue before the anchor, after their release, or
ride with it, or follow it with almost no slack. This model keeps exactly that. Take the anchor
a, its call's start S, and split the other parameters into those sent before S (``pre``) and
the rest (``post``, a's own call included):

- ``S`` is at least the work of a's closure and of every pre parameter's closure (one boolean per
  backward op outside a's closure, closed under the parameters that need it);
- the pre parameters go in calls that end by S, each starting no earlier than the release of its
  members (their op's closure alone); with releases and a cost per call, calls that are runs of
  the release order are never worse (Webster and Baker's exchange, in reversed time);
- the post parameters go in calls from S on, each ending by ``T - tail`` for every member; calls
  that are runs of decreasing tail are never worse (the same exchange), a in one of them.

Every plan maps onto a solution no slower (a's bucket and every bucket after it on the channel are
the post calls, the others the pre calls), so ``T`` infeasible here is a bound on every plan.
Parameters whose bytes are under ``min_share`` of a's are left out (fewer parameters only relax
it): GPT-2 small keeps 50 of 148. The model adds linear copies of the two chains' constraints with
one call each (the pre bytes released no earlier than a pre parameter go after its release, the post
bytes with no smaller tail end before ``T`` minus it), which prove what the reified chains alone
take 5x as long for (GPT-2 small, 64 x 100 GbE: ``T <= 119.2 ms`` infeasible in 2.7 s instead of
15; its optimum lies in 119.2-119.43 ms, the anchor bound's 118.31).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import networkx as nx

from .capped import solve_capped

__all__ = ["SplitBound", "in_order", "split_bound"]


@dataclass(frozen=True)
class SplitBound:
    """What the search proved, in ticks, and the CP-SAT status it stopped on ("closed": within 0.02%)."""

    bound: int
    status: str


def split_bound(items: list[tuple[int, int, int, int]], op_ticks: list[int], edges: set[tuple[int, int]],
                call: int, *, floor: int, upper: int, seconds: float, min_share: float, max_items: int,
                num_workers: int = 2, seed: int = 0, closures: bool = True) -> SplitBound:
    """Raise ``floor`` (a bound already known) towards ``upper`` (a known period) for ``seconds``.

    ``items``: per parameter ``(coarse op, release, tail, transfer)`` in ticks
    (:meth:`.overlap.OverlapModel._items`); ``op_ticks``, ``edges``: the coarse backward ops and their
    DAG. Each step asks whether ``T <= low + step`` is feasible (at most halfway to the least target
    left unanswered, or to ``upper``), in a third of the time left: proven infeasible raises ``low``
    and the step by half (the steps start at a 32nd of the range: the answers take longer near the
    optimum, and one asked too high is time lost); a solution lowers the top to its ``T``; no
    answer is never asked again, and the step becomes a third of the way there. Skipped (``floor``
    returned) above ``max_items`` parameters kept. ``closures=False`` (the op order is fixed, and
    ``items`` carry their releases in it: :func:`in_order`): the anchor's call starts after its own
    release, every other op having run by then or not as the order says.
    """
    deadline = time.perf_counter() + seconds
    if not items or floor >= upper:
        return SplitBound(bound=floor, status="closed")
    anchor = max(range(len(items)), key=lambda i: items[i][1] + items[i][2] + items[i][3])
    kept = [i for i, it in enumerate(items) if i == anchor or it[3] >= min_share * items[anchor][3]]
    if len(kept) > max_items:
        return SplitBound(bound=floor, status=f"skipped: {len(kept)} parameters")
    model = _Model([items[i] for i in kept], kept.index(anchor), op_ticks, edges, call,
                   horizon=2 * upper + sum(op_ticks) + 1, closures=closures)
    low, top, status = floor, upper, "UNKNOWN"
    ceiling = top  # the least target asked and left unanswered, or top
    precision = max(upper // 5000, 1)
    step = max((top - low) // 32, precision)
    while ceiling - low > precision and (left := deadline - time.perf_counter()) > 0.1:
        target = min(low + step, low + (ceiling - low) // 2)
        status, found = model.solve(target, left / 3 if left > 3 else left, num_workers, seed)
        if status == "INFEASIBLE":
            low, step = target + 1, step * 3 // 2
        elif found is not None:
            top, step = min(top, found), max(step // 2, precision)
            ceiling = min(ceiling, top)
        else:  # no answer: never ask this high again, ask halfway there
            ceiling, step = target, max((target - low) // 3, precision)
    return SplitBound(bound=low, status="closed" if top - low <= precision else status)


def in_order(items: list[tuple[int, int, int, int]], op_ticks: list[int], chains: list[list[str]],
              order: list[str]) -> list[tuple[int, int, int, int]]:
    """``items`` with each release the end of its coarse op when the ops run in ``order`` (eager: the
    engine's order stays), counted from the first backward op."""
    position = {o: k for k, o in enumerate(order)}
    ranked = sorted(range(len(chains)), key=lambda i: position[chains[i][0]])
    end, clock = [0] * len(chains), 0
    for i in ranked:
        clock += op_ticks[i]
        end[i] = clock
    return [(op, end[op], tail, cost) for op, _, tail, cost in items]


class _Model:
    """The relaxation as one CP-SAT model (module docstring); each :meth:`solve` caps ``T`` anew."""

    def __init__(self, items, anchor: int, op_ticks, edges, call: int, *, horizon: int, closures: bool):
        from ortools.sat.python import cp_model

        op, release, tail, cost = (list(x) for x in zip(*items))
        self.m = m = cp_model.CpModel()
        self.T = m.NewIntVar(0, horizon, "T")
        S = m.NewIntVar(0, horizon, "S")
        n = len(items)
        pre = [m.NewBoolVar(f"pre[{i}]") if i != anchor else m.NewConstant(0) for i in range(n)]
        post = [1 - pre[i] if i != anchor else 1 for i in range(n)]
        if closures:
            self._closures(pre, op, anchor, op_ticks, edges, S)
        else:
            m.Add(S >= release[anchor])
        # pre calls: runs of increasing release, each starting after its last member's release, ending by S
        P = sorted((i for i in range(n) if i != anchor), key=lambda i: (release[i], i))
        close = [m.NewBoolVar(f"close[{i}]") for i in P]
        carried = [m.NewIntVar(0, horizon, f"carried[{i}]") for i in P]  # bytes of the open call so far
        ended = [m.NewIntVar(0, horizon, f"ended[{i}]") for i in P]  # the end of the last closed call
        for k, i in enumerate(P):
            m.AddImplication(close[k], pre[i])
            m.Add(sum(close[k:]) >= 1).OnlyEnforceIf(pre[i])
            m.Add(carried[k] >= cost[i] * pre[i])
            m.Add(ended[k] >= release[i] + call + carried[k]).OnlyEnforceIf(close[k])
            if k:
                m.Add(carried[k] >= carried[k - 1] + cost[i] * pre[i]).OnlyEnforceIf(close[k - 1].Not())
                m.Add(ended[k] >= ended[k - 1])
                m.Add(ended[k] >= ended[k - 1] + call + carried[k]).OnlyEnforceIf(close[k])
            m.Add(S >= sum(cost[j] * pre[j] for j in P[k:]) + (release[i] + call) * pre[i])  # linear copy
        if P:
            m.Add(S >= ended[-1])
        # post calls: runs of decreasing tail from S, each ending by T - tail of its first member
        Q = sorted(range(n), key=lambda i: (-tail[i], i))
        opens = [m.NewBoolVar(f"open[{i}]") for i in Q]
        rest = [m.NewIntVar(0, horizon, f"rest[{i}]") for i in Q]  # bytes of the call after this member
        for k, i in enumerate(Q):
            if i != anchor:
                m.AddImplication(opens[k], pre[i].Not())
                m.Add(sum(opens[:k + 1]) >= 1).OnlyEnforceIf(pre[i].Not())
            else:
                m.Add(sum(opens[:k + 1]) >= 1)
            if k + 1 < n:
                m.Add(rest[k] >= rest[k + 1] + cost[Q[k + 1]] * post[Q[k + 1]]).OnlyEnforceIf(opens[k + 1].Not())
            sent = sum(cost[j] * post[j] for j in Q[:k + 1])
            m.Add(self.T >= S + call * sum(opens[:k + 1]) + sent + rest[k] + tail[i]).OnlyEnforceIf(opens[k])
            m.Add(self.T >= S + call + sent + tail[i] * post[i])  # linear copy

    def _closures(self, pre, op, anchor, op_ticks, edges, S) -> None:
        """``S`` >= the work of a's closure and of every pre parameter's."""
        dag = nx.DiGraph(list(edges))
        dag.add_nodes_from(range(len(op_ticks)))
        done = nx.ancestors(dag, op[anchor]) | {op[anchor]}
        ran: dict[int, object] = {}
        for i, v in enumerate(op):
            if i == anchor:
                continue
            for w in (nx.ancestors(dag, v) | {v}) - done:
                if w not in ran:
                    ran[w] = self.m.NewBoolVar(f"ran[{w}]")
                self.m.AddImplication(pre[i], ran[w])
        self.m.Add(S >= sum(op_ticks[v] for v in done) + sum(op_ticks[w] * b for w, b in ran.items()))

    def solve(self, target: int, seconds: float, num_workers: int, seed: int) -> tuple[str, int | None]:
        """CP-SAT's status name for ``T <= target``, and a solution's ``T`` if it found one."""
        solver, name, found = solve_capped(self.m, self.T, target, seconds, num_workers, seed)
        return name, solver.Value(self.T) if found else None
