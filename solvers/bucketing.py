"""Exact bucketing for a fixed op order: a dynamic program over contiguous segments.

With the compute order fixed, every gradient has a ready time. Buckets that
are contiguous in ready order are optimal for the end of communication:
moving an earlier-ready gradient into an earlier bucket never makes any
bucket start later. So with the gradients sorted by ready time,

    f(0) = 0
    f(i) = min over j < i of  end(segment j..i-1 sent after f(j))

where ``end`` starts the segment's collective at max(f(j), the segment's last
ready time) and adds ``call + alpha steps + beta·bytes``; ``f(P)`` is the
earliest the last all-reduce can end. A segment whose parameters differ in
dtype is not a bucket. O(P²) with prefix sums.

In ``barrier`` mode the iteration is ``max(backward end, f(P)) + T_opt``, so the
DP is exact for the bucketing of a fixed order; in ``overlap`` mode it is a
strong heuristic (the simulator decides).
"""

from __future__ import annotations

from itertools import accumulate

from schedopt.cluster import Cluster
from schedopt.graph import TrainGraph

from .common import grad_groups

__all__ = ["optimal_contiguous_buckets"]


def optimal_contiguous_buckets(graph: TrainGraph, order: list[str], cluster: Cluster) -> tuple[list[list[str]], float]:
    """Return the buckets minimizing the end of the last all-reduce under ``order``, and that end time.

    Example:
        >>> from schedopt.synthetic import chain
        >>> from schedopt.orders import engine_order
        >>> g = chain(3)
        >>> buckets, end = optimal_contiguous_buckets(g, engine_order(g), Cluster.preset("10gbe", world_size=8))
        >>> sorted(p for b in buckets for p in b) == sorted(g.params)
        True
    """
    names, ready = [], []
    for g in grad_groups(graph, order):
        for name in g.params:
            names.append(name)
            ready.append(g.ready_s)
    n = len(names)
    if n == 0:
        return [], 0.0
    a, b = cluster.fixed_s, cluster.seconds_per_byte
    if cluster.world_size == 1:
        a = b = 0.0
    prefix = [0, *accumulate(graph.params[name].nbytes for name in names)]
    dtype_run = [0] * n  # first index of the run of equal dtypes that ends at i
    for i in range(1, n):
        same = graph.params[names[i]].dtype == graph.params[names[i - 1]].dtype
        dtype_run[i] = dtype_run[i - 1] if same else i
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        last_ready = ready[i - 1]
        for j in range(dtype_run[i - 1], i):
            end = max(best[j], last_ready) + a + b * (prefix[i] - prefix[j])
            if end < best[i]:
                best[i], cut[i] = end, j
    buckets: list[list[str]] = []
    i = n
    while i > 0:
        buckets.append(names[cut[i]:i])
        i = cut[i]
    return buckets[::-1], best[n]
