"""``bytescheduler``: priority scheduling with tensor partitioning and a credit window.

ByteScheduler (Peng et al., SOSP 2019) partitions tensors into pieces of at
most ``partition_bytes``, gives layers nearer the input higher priority (the
next forward pass needs them first) and keeps at most ``credit_bytes`` of
communication committed to the engine, so that a higher-priority tensor that
becomes ready can still go ahead of lower-priority ones not yet committed.

Here:

1. Priority of a parameter: the position of its first reader in the forward
   pass (earlier = higher).
2. Simulate the FIFO network: while less than ``credit_bytes`` is committed
   and unfinished, commit the highest-priority ready parameter (all its
   partitions); otherwise wait for a commitment to finish or a gradient to
   become ready.
3. Each parameter is one bucket with ``ceil(bytes / partition_bytes)``
   chunks, in commit order.

Plan format ``schedopt.plan/1`` issues a bucket's chunks back to back, so a
preemption happens at tensor boundaries rather than between partitions.
Defaults: 4 MiB partitions and a 16 MiB credit (the original tunes both
online; these are typical values from its evaluation). Meant for ``overlap``
mode, where the front layers' early arrival pays off.
"""

from __future__ import annotations

import math

from schedopt.orders import engine_order
from schedopt.plan import Bucket, Plan, SolverInfo
from schedopt.problem import Problem

from .common import first_readers, grad_groups, require_positive
from .registry import register

__all__ = ["credit_schedule", "solve_bytescheduler"]

_MB = 1024 * 1024


def credit_schedule(
    ready_s: dict[str, float],
    duration_s: dict[str, float],
    nbytes: dict[str, int],
    priority: dict[str, float],
    *,
    credit_bytes: int,
) -> list[str]:
    """Return the commit order of a credit-limited priority scheduler on a FIFO channel."""
    pending = set(ready_s)
    committed: list[tuple[float, int]] = []  # (finish time, bytes) of work in the channel
    channel_free = 0.0
    t = 0.0
    order: list[str] = []
    while pending:
        committed = [(end, b) for end, b in committed if end > t + 1e-15]
        in_flight = sum(b for _, b in committed)
        released = [n for n in pending if ready_s[n] <= t + 1e-15]
        if released and (in_flight < credit_bytes or not committed):
            job = min(released, key=lambda n: (priority[n], n))
            pending.remove(job)
            order.append(job)
            channel_free = max(channel_free, t, ready_s[job]) + duration_s[job]
            committed.append((channel_free, nbytes[job]))
            continue
        events = [end for end, _ in committed] + [ready_s[n] for n in pending if ready_s[n] > t]
        t = min(events)
    return order


@register("bytescheduler")
def solve_bytescheduler(
    problem: Problem,
    *,
    partition_bytes: int = 4 * _MB,
    credit_bytes: int = 16 * _MB,
    time_limit_s: float | None = None,
    seed: int = 0,
) -> Plan:
    """Return ByteScheduler's schedule: engine order, front-layers-first commits, partitioned tensors."""
    require_positive(partition_bytes=partition_bytes, credit_bytes=credit_bytes)
    graph, cluster = problem.graph, problem.cluster
    order = engine_order(graph)
    ready = {name: g.ready_s for g in grad_groups(graph, order) for name in g.params}
    first_use = first_readers(graph, order)
    chunks = {name: max(1, min(math.ceil(p.nbytes / partition_bytes), p.numel)) for name, p in graph.params.items()}
    duration = {}
    for name, p in graph.params.items():
        sizes = [p.nbytes // chunks[name]] * chunks[name]
        duration[name] = sum(cluster.allreduce_s(s) for s in sizes)
    committed = credit_schedule(ready, duration, {n: p.nbytes for n, p in graph.params.items()}, first_use,
                                credit_bytes=credit_bytes)
    return Plan.for_problem(problem, order=order,
                            buckets=[Bucket(params=(n,), chunks=chunks[n]) for n in committed],
                            solver=SolverInfo(name="bytescheduler", options={
                                "partition_bytes": partition_bytes, "credit_bytes": credit_bytes}))
