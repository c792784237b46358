"""``caramel``: the Caramel method (Hashemi et al., arXiv 2004.14020) in three parts.

1. **DAG scheduling** (``compiled`` execution only; an ``eager`` plan keeps
   the autograd engine's order). A list scheduler over backward ops. Among the ready
   ones, an op that finishes gradients runs first, the one with the most
   gradient bytes per second of its own compute first (Smith's ratio rule,
   which minimizes the bytes-weighted sum of gradient ready times on one
   machine); otherwise the op closest (in compute time along the DAG) to
   finishing a gradient runs first. Ties keep the autograd engine order. A
   ratio over whole chains of ops was tried first and rejected: it chases
   a distant large gradient (a tied embedding, whose sum also waits for
   other partial gradients) and delays every layer's gradient on the way. In ``overlap`` mode forward ops are list-scheduled too: among the
   ready ones, the op whose parameters become ready earliest in backward (and
   so are synchronized earliest) runs first, which defers first uses of
   late parameters in models with parallel branches.
2. **Adaptive batching.** Walk the gradients in ready order; merge the next
   gradient into the open bucket while the merged transfer still ends inside
   the window of every member (barrier: by the end of backward; overlap: by
   the member's first use in the next step), given alpha and beta. When it
   does not fit, merge anyway if the next gradient is ready before the open
   bucket would be past its start-up cost (then merging loses nothing); else
   start a new bucket. The window rule keeps the network idle while a bucket
   that "fits" waits for its last member, so the exact contiguous bucketing
   for the same order (:mod:`schedopt.solvers.bucketing`) is computed too,
   and the simulator keeps the faster of the two.
3. **Pipelining.** For each bucket whose gradients become ready at different
   times (largest first, at most 96 trials), split it into 2, 4 or 8 chunks
   when the simulator says the iteration gets shorter (a chunk goes once its
   own gradients are ready, so the front of a bucket starts early). Each
   trial is one simulation (0.4 s at 12,901 ops), so with ``time_limit_s``
   the trials stop at the limit and the best plan so far is returned.
"""

from __future__ import annotations

import time

import networkx as nx

from schedopt.graph import TrainGraph
from schedopt.orders import engine_order
from schedopt.plan import Bucket, Plan, SolverInfo
from schedopt.problem import Problem
from schedopt.simulate import simulate

from .bucketing import optimal_contiguous_buckets
from .common import grad_groups, require_positive
from .registry import register

__all__ = ["caramel_order", "window_buckets", "pipeline", "solve_caramel"]

_EPS = 1e-12


def _gradient_priorities(graph: TrainGraph) -> dict[str, tuple[int, float]]:
    """Rank backward ops: gradient producers by bytes per second, the rest by distance to a gradient."""
    grad_bytes: dict[str, int] = {}
    for p in graph.params.values():
        grad_bytes[p.grad_op] = grad_bytes.get(p.grad_op, 0) + p.nbytes
    backward = [o for o in graph.ops if graph.ops[o].phase == "backward"]
    distance: dict[str, float] = {}
    for v in reversed(list(nx.topological_sort(graph.dag.subgraph(backward)))):
        if v in grad_bytes:
            distance[v] = graph.ops[v].duration_s
        else:
            ahead = [distance[s] for s in graph.dag.successors(v) if s in distance]
            distance[v] = graph.ops[v].duration_s + min(ahead, default=float("inf"))
    return {
        v: (0, -grad_bytes[v] / max(graph.ops[v].duration_s, _EPS)) if v in grad_bytes else (1, distance[v])
        for v in backward
    }


def caramel_order(problem: Problem) -> list[str]:
    """Return Caramel's op order (step 1 of the module docstring); the engine's for ``eager`` execution."""
    graph = problem.graph
    base = engine_order(graph)
    if not problem.reorders:
        return base
    rank = {op_id: i for i, op_id in enumerate(base)}
    priority = _gradient_priorities(graph)
    ready_rank = {name: i for i, name in enumerate(_ready_names(graph, base))}

    def key(op_id: str) -> tuple:
        op = graph.ops[op_id]
        if op.phase == "backward":
            return (1, *priority[op_id], rank[op_id])
        if op.phase == "optimizer":
            return (2, 0, 0, rank[op_id])
        if problem.mode == "overlap":
            sync = max((ready_rank[p] for p in op.reads), default=-1)
            return (0, 0, sync, rank[op_id])
        return (0, 0, 0, rank[op_id])

    return list(nx.lexicographical_topological_sort(graph.dag, key=key))


def _ready_names(graph: TrainGraph, order: list[str]) -> list[str]:
    return [name for g in grad_groups(graph, order) for name in g.params]


def _deadlines(problem: Problem, order: list[str]) -> dict[str, float]:
    """When each gradient is needed: end of backward (barrier) or first use in the next step (overlap)."""
    graph = problem.graph
    t, end_of_compute, first_use = 0.0, 0.0, {}
    for op_id in order:
        op = graph.ops[op_id]
        if op.phase == "optimizer":
            continue
        for name in op.reads:
            first_use.setdefault(name, t)
        t += op.duration_s
    end_of_compute = t
    if problem.mode == "barrier":
        return {name: end_of_compute for name in graph.params}
    step = end_of_compute + graph.totals.optimizer_s
    return {name: step + first_use.get(name, end_of_compute) for name in graph.params}


def window_buckets(problem: Problem, order: list[str]) -> list[list[str]]:
    """Return Caramel's adaptive batching for ``order`` (step 2 of the module docstring)."""
    graph, cluster = problem.graph, problem.cluster
    a, b = cluster.fixed_s, cluster.seconds_per_byte
    deadline = _deadlines(problem, order)
    buckets: list[list[str]] = []
    current: list[str] = []
    current_bytes, start, channel_free, due = 0, 0.0, 0.0, float("inf")
    for g in grad_groups(graph, order):
        for name in g.params:
            nbytes = graph.params[name].nbytes
            if not current:
                current, current_bytes = [name], nbytes
                start, due = max(g.ready_s, channel_free), deadline[name]
                continue
            same_dtype = graph.params[current[0]].dtype == graph.params[name].dtype
            merged_start = max(g.ready_s, channel_free)
            fits = merged_start + a + b * (current_bytes + nbytes) <= min(due, deadline[name])
            free = g.ready_s < start + a  # merging saves a start-up and delays nothing
            if same_dtype and (fits or free):
                current.append(name)
                current_bytes += nbytes
                start, due = merged_start, min(due, deadline[name])
                continue
            channel_free = start + a + b * current_bytes
            buckets.append(current)
            current, current_bytes = [name], nbytes
            start, due = max(g.ready_s, channel_free), deadline[name]
    if current:
        buckets.append(current)
    return buckets


def pipeline(problem: Problem, plan: Plan, *, max_chunks: int = 8, max_trials: int = 96,
             deadline: float | None = None) -> Plan:
    """Return ``plan`` with buckets split into the chunk count (1, 2, 4, ... max) the simulator likes best.

    Only buckets whose gradients become ready at different times can gain;
    they are tried largest first, ``max_trials`` simulations at most (large
    models have hundreds of buckets, and each trial simulates the iteration),
    none started after ``deadline`` (a ``time.perf_counter()`` value).
    """
    graph = problem.graph
    best = plan
    best_s = simulate(problem, plan).iteration_s
    candidates = [k for k, b in enumerate(plan.buckets) if len({graph.params[n].grad_op for n in b.params}) > 1]
    candidates.sort(key=lambda k: -sum(graph.params[n].nbytes for n in plan.buckets[k].params))
    trials = 0
    for k in candidates:
        bucket = plan.buckets[k]
        numel = sum(graph.params[n].numel for n in bucket.params)
        chunks = 2
        while chunks <= min(max_chunks, numel) and trials < max_trials:
            if deadline is not None and time.perf_counter() >= deadline:
                return best
            buckets = list(best.buckets)
            buckets[k] = Bucket(params=bucket.params, chunks=chunks)
            trial = Plan.for_problem(problem, order=best.order, buckets=buckets, solver=best.solver)
            trial_s = simulate(problem, trial).iteration_s
            trials += 1
            if trial_s < best_s * (1 - 1e-9):
                best, best_s = trial, trial_s
            chunks *= 2
    return best


@register("caramel", limits={"max_chunks": 1024})
def solve_caramel(
    problem: Problem,
    *,
    max_chunks: int = 8,
    time_limit_s: float | None = None,
    seed: int = 0,
) -> Plan:
    """Return Caramel's schedule: reordered DAG, window-fitted buckets, pipelined chunks."""
    require_positive(max_chunks=max_chunks)
    if time_limit_s is not None:
        require_positive(time_limit_s=time_limit_s)
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    order = caramel_order(problem)
    info = SolverInfo(name="caramel", options={"max_chunks": max_chunks})
    candidates = [
        Plan.for_problem(problem, order=order, buckets=buckets, solver=info)
        for buckets in (window_buckets(problem, order),
                        optimal_contiguous_buckets(problem.graph, order, problem.cluster)[0])
    ]
    plan = min(candidates, key=lambda c: simulate(problem, c).iteration_s)
    return pipeline(problem, plan, max_chunks=int(max_chunks), deadline=deadline)
