"""``tictac``: TicTac's timing-aware ordering (TAC) adapted to all-reduce.

TicTac (Hashemi, Abdu Jyothi, Campbell; arXiv 1803.03288) orders parameter
transfers so that the computation waiting on them can start as early as
possible. Its TAC heuristic treats a transfer and the computation it unblocks
as a two-stage job, which is Johnson's two-machine flow-shop problem; Johnson's
rule is optimal there:

1. Each parameter is a job with stage 1 = its all-reduce time ``c(p)`` on the
   network and stage 2 = the compute that waits on it, ``d(p)``: the
   duration of the ops of the next step that read p (its forward consumers).
2. Johnson's sequence: jobs with ``c <= d`` first, by increasing ``c``; then
   jobs with ``c > d``, by decreasing ``d``.
3. All-reduce adds release times (a gradient exists only once its grad op
   ran), so the sequence becomes a priority: whenever the network is free, the
   ready gradient earliest in Johnson's sequence goes next.

Order: the autograd engine order. Buckets: one per parameter, in that
dispatch order.
"""

from __future__ import annotations

from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem

from .common import grad_groups
from .registry import register

__all__ = ["johnson_order", "dispatch_by_priority", "solve_tictac"]


def johnson_order(jobs: dict[str, tuple[float, float]]) -> list[str]:
    """Return Johnson's sequence for two-stage jobs ``name -> (stage1, stage2)``.

    Example:
        >>> johnson_order({"A": (1, 3), "B": (2, 1), "C": (3, 4), "D": (4, 2)})
        ['A', 'C', 'D', 'B']
    """
    first = sorted((n for n, (a, b) in jobs.items() if a <= b), key=lambda n: (jobs[n][0], n))
    last = sorted((n for n, (a, b) in jobs.items() if a > b), key=lambda n: (-jobs[n][1], n))
    return first + last


def dispatch_by_priority(
    ready_s: dict[str, float],
    duration_s: dict[str, float],
    rank: dict[str, int],
) -> list[str]:
    """Return the order a free network sends jobs in: among released jobs, the lowest ``rank`` first."""
    pending = sorted(ready_s, key=lambda n: (ready_s[n], rank[n]))
    sent: list[str] = []
    t = 0.0
    while pending:
        released = [n for n in pending if ready_s[n] <= t + 1e-15]
        if not released:
            t = ready_s[pending[0]]
            continue
        job = min(released, key=rank.__getitem__)
        pending.remove(job)
        sent.append(job)
        t += duration_s[job]
    return sent


@register("tictac")
def solve_tictac(problem: Problem, *, time_limit_s: float | None = None, seed: int = 0) -> Plan:
    """Return TicTac's schedule: engine order, one bucket per parameter in Johnson-priority order."""
    graph, cluster = problem.graph, problem.cluster
    order = engine_order(graph)
    ready = {name: g.ready_s for g in grad_groups(graph, order) for name in g.params}
    comm = {name: cluster.allreduce_s(p.nbytes) for name, p in graph.params.items()}
    waiting = {name: 0.0 for name in graph.params}
    for op in graph.ops.values():
        if op.phase == "forward":
            for name in op.reads:
                waiting[name] += op.duration_s
    sequence = johnson_order({name: (comm[name], waiting[name]) for name in graph.params})
    rank = {name: i for i, name in enumerate(sequence)}
    sent = dispatch_by_priority(ready, comm, rank)
    return Plan.for_problem(problem, order=order, buckets=[[n] for n in sent], solver=SolverInfo(name="tictac"))
