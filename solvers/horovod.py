"""``horovod``: Horovod's tensor fusion (Sergeev and Del Balso, arXiv 1802.05799; Horovod docs).

Order: the autograd engine order.

Buckets: Horovod's background loop wakes every ``HOROVOD_CYCLE_TIME``
(``cycle_time_ms``, 1 ms here) and all-reduces the tensors that became ready
since the last cycle, fused in the order they became ready into buffers of at
most ``HOROVOD_FUSION_THRESHOLD`` bytes (``fusion_threshold_mb``, 128 MiB); a
tensor larger than the threshold goes alone. Only tensors of one dtype are
fused together. The negotiation between ranks is not modelled.
"""

from __future__ import annotations

import math

from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem

from .common import grad_groups, require_positive
from .registry import register

__all__ = ["horovod_buckets", "solve_horovod"]

_MB = 1024 * 1024


def horovod_buckets(
    ready: list[tuple[str, float, int, str]],
    *,
    cycle_s: float,
    threshold_bytes: int,
) -> list[list[str]]:
    """Fuse ``(name, ready_s, nbytes, dtype)`` tensors cycle by cycle, in ready order.

    Example:
        >>> horovod_buckets([("a", 0.1, 10, "f"), ("b", 0.2, 10, "f"), ("c", 1.5, 10, "f")],
        ...                 cycle_s=1.0, threshold_bytes=25)
        [['a', 'b'], ['c']]
    """
    buckets: list[list[str]] = []
    pending = sorted(ready, key=lambda t: t[1])
    i = 0
    while i < len(pending):
        cycle_end = math.ceil(pending[i][1] / cycle_s - 1e-9) * cycle_s  # the wake-up that sees it
        batch = []
        while i < len(pending) and pending[i][1] <= cycle_end + 1e-15:
            batch.append(pending[i])
            i += 1
        open_by_dtype: dict[str, tuple[list[str], int]] = {}
        for name, _, nbytes, dtype in batch:
            names, total = open_by_dtype.get(dtype, ([], 0))
            if names and total + nbytes > threshold_bytes:
                buckets.append(names)
                names, total = [], 0
            names.append(name)
            open_by_dtype[dtype] = (names, total + nbytes)
        buckets.extend(names for names, _ in open_by_dtype.values() if names)
    return buckets


@register("horovod")
def solve_horovod(
    problem: Problem,
    *,
    fusion_threshold_mb: float = 128.0,
    cycle_time_ms: float = 1.0,
    time_limit_s: float | None = None,
    seed: int = 0,
) -> Plan:
    """Return Horovod's schedule: engine order, fused per cycle up to the fusion threshold."""
    require_positive(fusion_threshold_mb=fusion_threshold_mb, cycle_time_ms=cycle_time_ms)
    graph = problem.graph
    order = engine_order(graph)
    ready = [(name, g.ready_s, graph.params[name].nbytes, graph.params[name].dtype)
             for g in grad_groups(graph, order) for name in g.params]
    buckets = horovod_buckets(ready, cycle_s=cycle_time_ms * 1e-3, threshold_bytes=int(fusion_threshold_mb * _MB))
    return Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(
        name="horovod", options={"fusion_threshold_mb": fusion_threshold_mb, "cycle_time_ms": cycle_time_ms}))
