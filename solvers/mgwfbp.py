"""``mgwfbp``: merged-gradient wait-free backpropagation (Shi, Wang, Chu, Li; arXiv 1811.11141).

Order: the autograd engine order.

Buckets: walk the layers (gradient-finishing ops) in the order their
gradients become ready. With all-reduce time ``a + b·S`` (``a``: the
start-up cost, here call overhead plus latency steps), merging the next layer
into the current bucket saves one ``a`` and costs waiting for the next
layer. The published rule merges when the next layer's gradient is ready
before the current bucket's communication would be past its start-up:

    merge  iff  ready(next) < start(current) + a

where ``start(current) = max(ready of its last layer, end of the previous
bucket)``. The merged bucket then starts at ``max(ready(next), end of the
previous bucket)``.
"""

from __future__ import annotations

from schedopt.orders import engine_order
from schedopt.plan import Plan, SolverInfo
from schedopt.problem import Problem

from .common import GradGroup, grad_groups
from .registry import register

__all__ = ["mgwfbp_buckets", "solve_mgwfbp"]


def mgwfbp_buckets(groups: list[GradGroup], *, alpha_s: float, beta_s_per_byte: float,
                   dtypes: dict[str, str] | None = None) -> list[list[str]]:
    """Return MG-WFBP's buckets for gradient groups in ready order (see module docstring)."""
    if not groups:
        return []
    dtypes = dtypes or {}
    buckets: list[list[str]] = []
    current = list(groups[0].params)
    current_bytes = groups[0].nbytes
    channel_free = 0.0
    start = groups[0].ready_s
    for g in groups[1:]:
        same_dtype = {dtypes.get(n, "") for n in (*current, *g.params)}
        if len(same_dtype) <= 1 and g.ready_s < start + alpha_s:
            current += g.params
            current_bytes += g.nbytes
            start = max(g.ready_s, channel_free)
            continue
        channel_free = start + alpha_s + beta_s_per_byte * current_bytes
        buckets.append(current)
        current, current_bytes = list(g.params), g.nbytes
        start = max(g.ready_s, channel_free)
    buckets.append(current)
    return buckets


@register("mgwfbp")
def solve_mgwfbp(problem: Problem, *, time_limit_s: float | None = None, seed: int = 0) -> Plan:
    """Return MG-WFBP's schedule: engine order, layers merged by the start-up-cost rule."""
    graph, cluster = problem.graph, problem.cluster
    order = engine_order(graph)
    buckets = mgwfbp_buckets(grad_groups(graph, order), alpha_s=cluster.fixed_s,
                             beta_s_per_byte=cluster.seconds_per_byte,
                             dtypes={n: p.dtype for n, p in graph.params.items()})
    return Plan.for_problem(problem, order=order, buckets=buckets, solver=SolverInfo(name="mgwfbp"))
