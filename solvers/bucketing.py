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
from typing import Sequence

from schedopt.cluster import Cluster
from schedopt.graph import TrainGraph

from .common import grad_groups

__all__ = ["optimal_contiguous_buckets", "segment_dp"]


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
    if not names:
        return [], 0.0
    a, b = cluster.fixed_s, cluster.seconds_per_byte
    if cluster.world_size == 1:
        a = b = 0.0
    dtype_run = [0] * len(names)  # first index of the run of equal dtypes that ends at i
    for i in range(1, len(names)):
        same = graph.params[names[i]].dtype == graph.params[names[i - 1]].dtype
        dtype_run[i] = dtype_run[i - 1] if same else i
    cuts, end = segment_dp(ready, [b * graph.params[name].nbytes for name in names], a, dtype_run)
    return [names[j:i] for j, i in zip(cuts, cuts[1:])], end


def segment_dp(ready: Sequence[float], cost: Sequence[float], call: float,
               first_allowed: Sequence[int] | None = None) -> tuple[list[int], float]:
    """The DP of the module docstring over items sorted by ``ready`` time.

    Item k costs ``cost[k]`` on the channel, a segment ``call`` more; a
    segment ending at item i may start no earlier than item
    ``first_allowed[i]`` (default: any). Returns the segment boundaries
    ``[0, ..., len(ready)]`` and the end of the last segment.
    """
    n = len(ready)
    prefix = [0.0, *accumulate(cost)]
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        last_ready = ready[i - 1]
        for j in range(first_allowed[i - 1] if first_allowed is not None else 0, i):
            end = max(best[j], last_ready) + call + (prefix[i] - prefix[j])
            if end < best[i]:
                best[i], cut[i] = end, j
    bounds = [n]
    while bounds[-1] > 0:
        bounds.append(cut[bounds[-1]])
    return bounds[::-1], best[n]
